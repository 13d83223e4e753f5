"""SplitConv latency with 1 and 2 intra-op threads, next to onnxruntime's Conv (same run).

For each layer shape and weight pattern: a session per (op, threads), warm-up, then the
median (and quartiles) of --repeat timed runs. Prints a table and writes JSON.

    python benchmarks/bench_split_conv_threads.py [--repeat 30] [--out benchmarks/results/split_conv_threads.json]

"unique%" is the fraction of kernels that stay unique after per-input-channel
deduplication (100% = no sharing at all, SplitConv's worst case).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for tests.ops.models

import redpp_onnx  # noqa: E402
import redpp_onnx._core  # noqa: E402
from redpp_onnx.bench import time_runs  # noqa: E402
from redpp_onnx.ops import packing  # noqa: E402
from tests.ops.models import dense_conv_model, split_conv_model  # noqa: E402

SHAPES = [  # (name, c_in, c_out, k, size, batch)
    ("64x64 k3 32x32 n1", 64, 64, 3, 32, 1),
    ("64x64 k3 32x32 n8", 64, 64, 3, 32, 8),
    ("64x64 k3 8x8 n1", 64, 64, 3, 8, 1),
    ("256x256 k3 14x14 n1", 256, 256, 3, 14, 1),
    ("128x256 k1 28x28 n1", 128, 256, 1, 28, 1),
]
UNIQUE_FRACTIONS = (1.0, 0.25)


def weights(c_in, c_out, k, unique_fraction, rng):
    """Each output picks, per input channel, one of ceil(unique_fraction * c_out) kernels."""
    n_unique = max(1, int(round(unique_fraction * c_out)))
    pool = rng.standard_normal((c_in, n_unique, k, k)) / np.sqrt(c_in * k * k)
    if n_unique == c_out:
        choice = np.tile(np.arange(c_out), (c_in, 1))
    else:
        choice = rng.integers(0, n_unique, size=(c_in, c_out))
    return np.ascontiguousarray(pool[np.arange(c_in)[:, None], choice].transpose(1, 0, 2, 3), dtype=np.float32)


def time_session(sess, x, repeat):
    times = time_runs(sess, {"X": x}, repeat, warmup=3)
    q = statistics.quantiles(times, n=4)
    return {"median_ms": 1e3 * statistics.median(times), "q1_ms": 1e3 * q[0], "q3_ms": 1e3 * q[2]}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "split_conv_threads.json"))
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    rows = []
    header = f"{'layer':22} {'unique%':>7} {'op':9} {'1 thr ms':>9} {'2 thr ms':>9} {'1/2':>5} {'vs Conv(1t)':>11}"
    print(header)
    print("-" * len(header))
    for name, c_in, c_out, k, size, batch in SHAPES:
        x = rng.standard_normal((batch, c_in, size, size)).astype(np.float32)
        pads = [k // 2] * 4
        for frac in UNIQUE_FRACTIONS:
            w = weights(c_in, c_out, k, frac, rng)
            split = packing.pack(w)
            models = {"Conv": dense_conv_model(w, pads=pads), "SplitConv": split_conv_model(split, pads=pads)}
            result = {}
            for op, model in models.items():
                for threads in (1, 2):
                    so = dict(intra_op_num_threads=threads, inter_op_num_threads=1)
                    sess = (redpp_onnx.session(model, **so) if op == "SplitConv" else
                            ort.InferenceSession(model.SerializeToString(), redpp_onnx.session_options(**so),
                                                 providers=["CPUExecutionProvider"]))
                    result[(op, threads)] = time_session(sess, x, args.repeat)
            conv1 = result[("Conv", 1)]["median_ms"]
            for op in ("Conv", "SplitConv"):
                t1, t2 = result[(op, 1)]["median_ms"], result[(op, 2)]["median_ms"]
                print(f"{name:22} {100 * frac:7.0f} {op:9} {t1:9.3f} {t2:9.3f} {t1 / t2:5.2f} {t1 / conv1:11.2f}")
                rows.append({"layer": name, "c_in": c_in, "c_out": c_out, "kernel": k, "size": size,
                             "batch": batch, "unique_fraction": frac,
                             "kernels_kept": int(split.kernels.shape[0]), "op": op,
                             "threads_1": result[(op, 1)], "threads_2": result[(op, 2)],
                             "speedup_2_threads": t1 / t2, "ratio_vs_conv_1_thread": t1 / conv1})
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"onnxruntime": ort.__version__, "repeat": args.repeat, "cpus": os.cpu_count(),
            "machine": platform.machine(), "simd_target": redpp_onnx._core.build_info()["simd_target"]}
    out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    print(f"\nsaved {out}")


if __name__ == "__main__":
    main()
