"""Merging (step 2) on every shared model: pruning ratio vs top-1, after hashing.

For each model in ../shared/bench: hash (ε = 0.01, the default; also ε = 0.02, the setting
METHOD.md quotes) then merge with α = 0 (exact: top-1 must equal the hashed model's); then, on
the two CIFAR ResNets, α in {0.05, 0.1, 0.2, 0.3, 0.5} with the per-block strategy (changes the
function), plus α in {0.001, 0.0025, 0.005, 0.01, 0.02} because the larger values already fall to
chance accuracy (single-linkage components of the α-percentile graph chain whole layers). Pruning ratio = float weights of eligible layers removed / original (METHOD.md "What
counts"). Top-1 on the exact data (CIFAR exact 1,017 images; ImageNet sample at batch 32);
``agreement`` = top-1 agreement with the hashed model. Also a diagnostic that is NOT the merge
criterion: the share of eligible weights in rows equal to another row of the same layer,
weights only (no bias, no BN, no coupling), to compare with METHOD.md's "about 1 %" note.

    python benchmarks/results_merge.py [--shared ../shared/bench] [--out benchmarks/results/merge.json]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _common import shared_parser, write_json  # noqa: E402  (benchmarks/)

from redpp_onnx import io  # noqa: E402
from redpp_onnx.analysis.layers import ConstantTensors, scan_layers  # noqa: E402
from redpp_onnx.config import HashConfig  # noqa: E402
from redpp_onnx.evaluate import evaluate, load_dataset  # noqa: E402
from redpp_onnx.passes.hash import HashPass  # noqa: E402
from redpp_onnx.passes.merge import MergeConfig, MergePass  # noqa: E402

MODELS = {  # model file -> (exact data, batch size, α sweep)
    "cifar10_resnet20.onnx": ("cifar10_test_exact1017.npz", 256, True),
    "cifar10_resnet56.onnx": ("cifar10_test_exact1017.npz", 256, True),
    "imagenet_efficientnet_lite0.onnx": ("imagenet_sample1000_224_q95.npz", 32, False),
}
EPSILONS = (0.01, 0.02)
ALPHAS = (0.05, 0.1, 0.2, 0.3, 0.5)
FINE_ALPHAS = (0.001, 0.0025, 0.005, 0.01, 0.02)  # extra rows: where the curve still holds accuracy
PAPER = {"cifar10_resnet20.onnx": 25.18, "cifar10_resnet56.onnx": 58.45}  # hash + merge α=0, %


def equal_weight_rows_share(model) -> float:
    """Weights in rows equal to another row of the same layer / all eligible weights (diagnostic)."""
    consts = ConstantTensors(model)
    total = removable = 0
    for layer in scan_layers(model).layers:
        w = consts.array(layer.weight)
        rows = w.reshape(w.shape[0], -1) if layer.op_type == "Conv" else (w if layer.trans_b else w.T)
        total += w.size
        removable += (rows.shape[0] - np.unique(rows, axis=0).shape[0]) * rows.shape[1]
    return removable / total if total else 0.0


def main(argv=None):
    ap = shared_parser(__doc__, "merge.json")
    args = ap.parse_args(argv)
    shared = Path(args.shared)
    rows = []
    header = (f"{'model':34} {'setting':40} {'params before':>13} {'after':>9} {'pruning':>8} "
              f"{'top-1':>7} {'hashed':>7} {'orig.':>7} {'agree':>7}  note")
    print(header)
    print("-" * len(header))
    for model_name, (data_name, batch, sweep) in MODELS.items():
        original = io.load_model(shared / model_name)
        data = load_dataset(shared / data_name)
        top1_original = evaluate(original, data, batch_size=batch).top1
        for eps in EPSILONS:
            t0 = time.perf_counter()
            hashed = HashPass(HashConfig(weight_error=eps)).run(original).model
            hash_seconds = time.perf_counter() - t0
            configs = [MergeConfig()] + ([MergeConfig(alpha=a) for a in FINE_ALPHAS + ALPHAS] if sweep and eps == 0.01 else [])
            for cfg in configs:
                t0 = time.perf_counter()
                result = MergePass(cfg).run(hashed)
                merge_seconds = time.perf_counter() - t0
                ev = evaluate(result.model, data, batch_size=batch, reference=hashed)
                setting = f"hash ε={eps:g} + merge α={cfg.alpha:g}" + (f" ({cfg.strategy})" if cfg.alpha else "")
                row = {
                    "model": model_name, "setting": setting, "weight_error": eps, "alpha": cfg.alpha,
                    "strategy": cfg.strategy, "params_before": result.params_before,
                    "params_after": result.params_after, "pruning_ratio": result.pruning_ratio,
                    "channels_removed": result.channels_removed,
                    "other_params_removed": result.other_params_removed,
                    "function_changed": result.function_changed,
                    "top1": ev.top1, "top1_hashed": ev.reference_top1, "top1_original": top1_original,
                    "agreement": ev.agreement, "max_abs_logit_diff": ev.max_abs_logit_diff,
                    "data": data.name, "n": ev.n, "hash_seconds": hash_seconds, "merge_seconds": merge_seconds,
                    "blocked_groups": sum(1 for g in result.groups if g.blocked_channels),
                    "groups": len(result.groups),
                    "paper_pruning_percent_hash_merge0": PAPER.get(model_name) if cfg.alpha == 0 else None,
                }
                if cfg.alpha == 0:
                    row["equal_weight_rows_share_diagnostic"] = equal_weight_rows_share(hashed)
                    row["block_reasons"] = sorted({r for g in result.groups for r in g.reasons
                                                   if not r.startswith("no two channels")})
                rows.append(row)
                note = ""
                if cfg.alpha == 0:
                    note = f"weights-only equal rows {row['equal_weight_rows_share_diagnostic']:.2%}"
                    if model_name in PAPER:
                        note += f"; paper {PAPER[model_name]:.2f}%"
                    if ev.top1 != ev.reference_top1:
                        note += "  !! top-1 differs from the hashed model"
                print(f"{model_name:34} {setting:40} {row['params_before']:13,} {row['params_after']:9,} "
                      f"{row['pruning_ratio']:8.2%} {ev.top1:7.2%} {ev.reference_top1:7.2%} "
                      f"{top1_original:7.2%} {ev.agreement:7.2%}  {note}", flush=True)
    write_json(args.out, {"rows": rows})


if __name__ == "__main__":
    main()
