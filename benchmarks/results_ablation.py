"""The paper's ablation table (Table "ablation") reproduced on every shared model (issue 5).

Six columns, as in the paper: (no hash | hash) x (merge α = 0 | merge α*) x (split | no split),
where the paper's α* is "the highest α that preserves the accuracy": here found DATA-DRIVEN by
`--calibrate` on the exact data with a 0.3-point budget. Split is emitted with `--split all`
(every eligible Conv, maximum pruning, as the paper counts it). Per cell: eligible parameters
removed, product MACs removed, file bytes, top-1 on the exact data.

    python benchmarks/results_ablation.py [--shared ../shared/bench] [--out benchmarks/results/ablation.json]
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _common import shared_parser, write_json  # noqa: E402  (benchmarks/)

from redpp_onnx import io  # noqa: E402
from redpp_onnx.compress import compress  # noqa: E402
from redpp_onnx.config import CompressConfig, MergeConfig  # noqa: E402
from redpp_onnx.evaluate import evaluate, load_dataset  # noqa: E402
from redpp_onnx.passes.merge import calibrate  # noqa: E402
from redpp_onnx.passes.hash import HashPass  # noqa: E402
from redpp_onnx.config import HashConfig  # noqa: E402
from redpp_onnx.passes.split import SplitConfig  # noqa: E402

MODELS = {"cifar10_resnet20.onnx": ("cifar10_test_exact1017.npz", 256),
          "cifar10_resnet56.onnx": ("cifar10_test_exact1017.npz", 256),
          "imagenet_efficientnet_lite0.onnx": ("imagenet_sample1000_224_q95.npz", 32)}
PAPER = {  # paper's Table "ablation" (its own weights): the six columns in the order of COLUMNS
    "cifar10_resnet20.onnx": ("ResNet-20", None, None, 25.18, None, 65.26, None),
    "cifar10_resnet56.onnx": ("ResNet-56", None, None, 58.45, None, 85.89, None),
}
COLUMNS = [  # (label, hash, α* (True) or 0, split)
    ("no hash + merge α=0 + split", False, False, True),
    ("no hash + merge α* + split", False, True, True),
    ("hash + merge α=0", True, False, False),
    ("hash + merge α*", True, True, False),
    ("hash + merge α=0 + split", True, False, True),
    ("hash + merge α* + split", True, True, True),
]
MAX_DROP = 0.3


def main(argv=None):
    ap = shared_parser(__doc__, "ablation.json")
    args = ap.parse_args(argv)
    rows = []
    for name, (data_name, batch) in MODELS.items():
        shared = Path(args.shared)
        original = io.load_model(shared / name)
        data = load_dataset(shared / data_name)
        alpha_star = {}
        for hashed in (False, True):  # α* is searched on the model the merge step receives
            base = HashPass(HashConfig()).run(original).model if hashed else original
            cal = calibrate(base, shared / data_name, MAX_DROP, batch_size=batch)
            alpha_star[hashed] = cal.alpha
            print(f"{name}: α* = {cal.alpha:g} ({'hashed' if hashed else 'not hashed'}, DATA-DRIVEN, "
                  f"{len(cal.trials)} trials)", flush=True)
        for label, hashed, use_star, split in COLUMNS:
            steps = (("hash",) if hashed else ()) + ("merge",) + (("split",) if split else ())
            alpha = alpha_star[hashed] if use_star else 0.0
            cfg = CompressConfig(steps=steps, merge=MergeConfig(alpha=alpha), split=SplitConfig(mode="all"),
                                 verify=False)
            emitted, report = compress(original, cfg)
            ev = evaluate(emitted, data, batch_size=batch, reference=original)
            with tempfile.TemporaryDirectory() as tmp:
                size = io.save_model(emitted, Path(tmp) / "m.onnx")
            m = report.model
            row = {"model": name, "column": label, "alpha": alpha, "alpha_data_driven": use_star,
                   "params_removed": m["pruning_ratio"],
                   "macs_removed": (1 - m["macs_after"] / m["macs_before"]) if m.get("macs_after") else None,
                   "file_bytes": size, "file_bytes_original": (shared / name).stat().st_size,
                   "top1": ev.top1, "top1_original": ev.reference_top1,
                   "drop_points": 100 * (ev.reference_top1 - ev.top1)}
            rows.append(row)
            print(f"  {label:30} α={alpha:<8g} params -{100 * row['params_removed']:6.2f}%  MACs "
                  f"-{100 * (row['macs_removed'] or 0):6.2f}%  file {size:>10,}  top-1 {100 * ev.top1:.2f}% "
                  f"({-row['drop_points']:+.2f})", flush=True)
    write_json(args.out, {"rows": rows, "paper": PAPER, "columns": [c[0] for c in COLUMNS],
                               "max_drop_points": MAX_DROP})


if __name__ == "__main__":
    main()
