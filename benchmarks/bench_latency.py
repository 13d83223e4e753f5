"""End-to-end latency in onnxruntime: the original model vs what `compress` emits.

For every model in ../shared/bench: the default output (`--steps` default, `--split auto`) and the
`--split all` output, each timed against the original in the same process, next to an A/A control
(the original against itself, measured the same way: the benchmark's own noise), at batch 1 and 32,
with 1 and 2 intra-op threads. Runs are pooled over several session pairs created in both orders
(--session-pairs; from one session pair to the next, the model against itself reads 0.94-1.12 at
batch 1 / 2 threads on this machine), runs alternate original / emitted
in alternating order (so drift, background load and cache state hit both alike); the median of
--repeat runs each, and the ratio
emitted / original, and the median over i of the ratio of the i-th runs (adjacent in time, so a
slow episode of the machine affects both members of a pair: the robust estimate on a shared VM).

    python benchmarks/bench_latency.py [--repeat 15] [--out benchmarks/results/latency.json]

With ``--target-macs F [F ...]`` (and usually ``--models`` and ``--out``) it times instead, against
the original and next to the A/A control: the exact layout rewrite alone (``passes/layout.py``:
zero channel paddings as 1x1 Convs; skipped when the model has none), and per target the output
of ``compress --target-macs F --steps merge`` (the channel reduction with the refit: what
bench_reduce measures top-1 of), the same with ``--no-layout``, and ``compress --target-macs F``
(then the default hashing and storage); ``--top1`` adds each output's top-1 on the model's exact
data. The models of the run replace theirs in the output file: e.g.
``python benchmarks/bench_latency.py --models cifar10_resnet56.onnx --target-macs 0.65 0.85 --top1
--out benchmarks/results/latency_reduce.json``.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _common import shared_parser, write_json  # noqa: E402  (benchmarks/)

import onnxruntime  # noqa: E402

from redpp_onnx import io, session  # noqa: E402
from redpp_onnx.bench import timed_pair  # noqa: E402
from redpp_onnx.compress import compress  # noqa: E402
from redpp_onnx.config import CompressConfig, MergeConfig  # noqa: E402
from redpp_onnx.analysis.layers import scan_layers  # noqa: E402
from redpp_onnx.passes import layout  # noqa: E402
from redpp_onnx.passes.split import SplitConfig  # noqa: E402

MODELS = ("cifar10_resnet20.onnx", "cifar10_resnet56.onnx", "imagenet_efficientnet_lite0.onnx")
LIMIT = 1.02  # issue 5: the default output's median at most 1.02x the original's


def main(argv=None):
    ap = shared_parser(__doc__, "latency.json")
    ap.add_argument("--repeat", type=int, default=40, help="runs per model and configuration (pooled)")
    ap.add_argument("--session-pairs", type=int, default=8,
                    help="session pairs per configuration for the default output (half in each creation order)")
    ap.add_argument("--models", nargs="*", default=list(MODELS))
    ap.add_argument("--target-macs", nargs="*", type=float, default=None,
                    help="time compress --target-macs F outputs instead of the default / split all ones")
    ap.add_argument("--channel-multiple", nargs="*", type=int, default=[8],
                    help="with --target-macs: kept channel counts multiples of each N given (8: AVX2's NCHWc block, "
                         "16: AVX-512's)")
    ap.add_argument("--top1", action="store_true",
                    help="also the top-1 of every timed output on the model's exact data (bench_rd.MODELS, cached)")
    ap.add_argument("--cache", default="/tmp/rd_cache", help="evaluation cache of --top1 (shared with bench_rd.py)")
    args = ap.parse_args(argv)
    default_steps = CompressConfig().steps
    variants = {"A/A control": None,  # the original against itself: the measurement's own noise
                "default": CompressConfig(verify=False),
                "split all": CompressConfig(steps=tuple(dict.fromkeys(default_steps + ("split",))),
                                            split=SplitConfig(mode="all"), verify=False)}
    if args.target_macs:
        # the exact layout rewrite alone, then per target: the channel reduction alone (what
        # bench_reduce measures top-1 of), the same without the layout rewrite, and the default
        # steps (hashing and codebooks too)
        variants = {"A/A control": None, "layout only": "layout"}
        for f in args.target_macs:
            for n in args.channel_multiple:
                label = f"target-macs {f:g}" + ("" if n == 8 else f" (multiples of {n})")
                merge = MergeConfig(target_macs=f, channel_multiple=n)
                variants[label + ", reduction only"] = CompressConfig(steps=("merge",), merge=merge, verify=False)
                variants[label + ", reduction only, --no-layout"] = CompressConfig(steps=("merge",), merge=merge,
                                                                                   verify=False, layout=False)
                variants[label] = CompressConfig(merge=merge, verify=False)
    rows = []
    print(f"default steps: {','.join(default_steps)}; onnxruntime {onnxruntime.__version__}")
    print(f"{'model':34} {'variant':10} {'batch':>5} {'thr':>3} {'orig ms':>9} {'emitted ms':>10} {'ratio':>6} "
          f"{'paired':>6}")
    for name in args.models:
        original = io.load_model(Path(args.shared) / name)
        shape = [d.dim_value for d in original.graph.input[0].type.tensor_type.shape.dim[1:]]
        ev = _evaluator(Path(args.shared), name, Path(args.cache)) if args.top1 else None
        laid_out = layout.rewrite(original, scan_layers(original).macs)
        for variant, cfg in variants.items():
            if not laid_out.rewritten and (cfg == "layout" or variant.endswith("--no-layout")):
                print(f"{name} {variant}: skipped (no channel padding to rewrite: same as the original / "
                      "the reduction only)")
                continue
            if cfg == "layout":
                emitted, report = laid_out.model, None
            else:
                emitted, report = (original, None) if cfg is None else compress(original, cfg)
            top1 = ev.model_result(emitted)["top1"] if ev is not None else None
            if top1 is not None:
                print(f"{name} {variant}: top-1 {100 * top1:.2f} (original {100 * ev.ref_top1:.2f}, exact data)")
            for batch in (1, 32):
                x = np.random.default_rng(0).standard_normal([batch] + shape).astype(np.float32)
                for threads in (1, 2):
                    opts = dict(intra_op_num_threads=threads, inter_op_num_threads=1)
                    feed = {original.graph.input[0].name: x}
                    # Several session pairs, created in both orders: on this machine the model
                    # against itself (A/A) reads 0.94-1.12 at batch 1 / 2 threads from one session
                    # pair to the next (thread-pool placement), so runs are pooled over pairs.
                    pairs = args.session_pairs if variant != "split all" else 2
                    ta, tb = [], []
                    for order in [k % 2 for k in range(pairs)]:
                        pair = [io.serialize(original), io.serialize(emitted)][::1 if order == 0 else -1]
                        s1, s2 = (session(m, **opts) for m in pair)
                        a, b = (s1, s2) if order == 0 else (s2, s1)
                        _, _, ra, rb = timed_pair(a, b, feed, max(args.repeat // pairs, 5))
                        ta += ra
                        tb += rb
                        del s1, s2, a, b
                    ma, mb = statistics.median(ta), statistics.median(tb)
                    # runs i of both models are adjacent in time: their ratio cancels slow episodes
                    # of the machine that a ratio of medians does not
                    paired = statistics.median(tb_i / ta_i for ta_i, tb_i in zip(ta, tb))
                    row = {"model": name, "variant": variant, "batch": batch, "threads": threads,
                           "original_ms": 1e3 * ma, "emitted_ms": 1e3 * mb, "ratio": mb / ma,
                           "paired_ratio": paired,
                           "original_runs_ms": [1e3 * t for t in ta], "emitted_runs_ms": [1e3 * t for t in tb],
                           "split_layers": report.model.get("split_layers") if report else 0,
                           "pruning_ratio": report.model["pruning_ratio"] if report else 0.0,
                           "macs_before": report.model.get("macs_before") if report else None,
                           "macs_after": report.model.get("macs_after") if report else None,
                           "top1": top1, "original_top1": ev.ref_top1 if ev is not None else None}
                    rows.append(row)
                    flag = "" if variant != "default" or row["ratio"] <= LIMIT else "  > 1.02x"
                    print(f"{name:34} {variant:10} {batch:>5} {threads:>3} {row['original_ms']:9.2f} "
                          f"{row['emitted_ms']:10.2f} {row['ratio']:6.3f} {paired:6.3f}{flag}", flush=True)
    for variant in variants:
        sel = [r for r in rows if r["variant"] == variant]
        if not sel or variant == "split all":
            continue
        print(f"{variant}: ratio of medians {min(r['ratio'] for r in sel):.3f} .. {max(r['ratio'] for r in sel):.3f}, "
              f"median paired ratio {min(r['paired_ratio'] for r in sel):.3f} .. "
              f"{max(r['paired_ratio'] for r in sel):.3f} (limit for the default output {LIMIT})")
    meta = {"onnxruntime": onnxruntime.__version__, "repeat": args.repeat, "session_pairs": args.session_pairs,
            "default_steps": list(default_steps), "limit": LIMIT, "layout": CompressConfig().layout}
    # this run's models replace theirs in the file
    command = "python benchmarks/bench_latency.py " + " ".join(sys.argv[1:] if argv is None else argv)
    old = json.loads(Path(args.out).read_text()) if Path(args.out).exists() else {}
    rows = [r for r in old.get("rows", []) if r["model"] not in args.models] + rows
    meta["commands"] = {m: c for m, c in old.get("meta", {}).get("commands", {}).items() if m not in args.models}
    meta["commands"].update({m: command for m in args.models})
    write_json(args.out, {"meta": meta, "rows": rows})


def _evaluator(shared: Path, name: str, cache: Path):
    from bench_rd import MODELS, Evaluator

    for model_file, data_file, _, batch in MODELS.values():
        if model_file == name:
            return Evaluator(shared / model_file, shared / data_file, cache, batch)
    return None


if __name__ == "__main__":
    main()
