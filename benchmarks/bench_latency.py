"""End-to-end latency in onnxruntime: the original model vs what `compress` emits.

For every model in ../shared/bench: the default output (`--steps` default, `--split auto`) and the
`--split all` output, each timed against the original in the same process, at batch 1 and 32,
with 1 and 2 intra-op threads. Runs alternate original / emitted (so drift and background load
hit both alike); the median of --repeat runs each, and the ratio emitted / original.

    python benchmarks/bench_latency.py [--repeat 15] [--out benchmarks/results/latency.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import onnxruntime  # noqa: E402

from redpp_onnx import io, session  # noqa: E402
from redpp_onnx.compress import compress  # noqa: E402
from redpp_onnx.config import CompressConfig  # noqa: E402
from redpp_onnx.passes.split import SplitConfig  # noqa: E402

MODELS = ("cifar10_resnet20.onnx", "cifar10_resnet56.onnx", "imagenet_efficientnet_lite0.onnx")
LIMIT = 1.02  # issue 5: the default output's median at most 1.02x the original's


def timed_pair(a, b, feed, repeat):
    for sess in (a, b):
        for _ in range(2):
            sess.run(None, feed)
    ta, tb = [], []
    for _ in range(repeat):
        for sess, times in ((a, ta), (b, tb)):
            t0 = time.perf_counter()
            sess.run(None, feed)
            times.append(time.perf_counter() - t0)
    return statistics.median(ta), statistics.median(tb), ta, tb


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shared", default=str(ROOT.parent / "shared" / "bench"))
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "latency.json"))
    args = ap.parse_args(argv)
    default_steps = CompressConfig().steps
    variants = {"default": CompressConfig(verify=False),
                "split all": CompressConfig(steps=tuple(dict.fromkeys(default_steps + ("split",))),
                                            split=SplitConfig(mode="all"), verify=False)}
    rows = []
    print(f"default steps: {','.join(default_steps)}; onnxruntime {onnxruntime.__version__}")
    print(f"{'model':34} {'variant':10} {'batch':>5} {'thr':>3} {'orig ms':>9} {'emitted ms':>10} {'ratio':>6}")
    for name in MODELS:
        original = io.load_model(Path(args.shared) / name)
        shape = [d.dim_value for d in original.graph.input[0].type.tensor_type.shape.dim[1:]]
        for variant, cfg in variants.items():
            emitted, report = compress(original, cfg)
            for batch in (1, 32):
                x = np.random.default_rng(0).standard_normal([batch] + shape).astype(np.float32)
                for threads in (1, 2):
                    opts = dict(intra_op_num_threads=threads, inter_op_num_threads=1)
                    a, b = session(io.serialize(original), **opts), session(io.serialize(emitted), **opts)
                    ma, mb, ta, tb = timed_pair(a, b, {original.graph.input[0].name: x}, args.repeat)
                    row = {"model": name, "variant": variant, "batch": batch, "threads": threads,
                           "original_ms": 1e3 * ma, "emitted_ms": 1e3 * mb, "ratio": mb / ma,
                           "original_runs_ms": [1e3 * t for t in ta], "emitted_runs_ms": [1e3 * t for t in tb],
                           "split_layers": report.model.get("split_layers"),
                           "pruning_ratio": report.model["pruning_ratio"]}
                    rows.append(row)
                    flag = "" if variant != "default" or row["ratio"] <= LIMIT else "  > 1.02x"
                    print(f"{name:34} {variant:10} {batch:>5} {threads:>3} {row['original_ms']:9.2f} "
                          f"{row['emitted_ms']:10.2f} {row['ratio']:6.3f}{flag}", flush=True)
    worst = max(r["ratio"] for r in rows if r["variant"] == "default")
    print(f"default output: worst median ratio {worst:.3f} (limit {LIMIT})")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"meta": {"onnxruntime": onnxruntime.__version__, "repeat": args.repeat,
                                        "default_steps": list(default_steps), "limit": LIMIT},
                               "rows": rows}, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
