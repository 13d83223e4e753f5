"""The relaxed variants' pruning / accuracy curve (issue 5): split tolerance (and merge α when the
merge step is available), one point per setting, on the shared CIFAR ResNets and EfficientNet-Lite0.

Each point: hash (default ε) then the setting, emitted with `--split all` so that every Conv's
pruning is realised; parameters removed (eligible layers), MACs removed (products), top-1 on the
exact data. Writes benchmarks/results/relaxed.json and docs/relaxed_curve.png (matplotlib).

    python benchmarks/results_relaxed.py [--shared ../shared/bench]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _common import shared_parser, write_json  # noqa: E402  (benchmarks/)

from redpp_onnx import io  # noqa: E402
from redpp_onnx.compress import compress  # noqa: E402
from redpp_onnx.config import AVAILABLE_STEPS, CompressConfig  # noqa: E402
from redpp_onnx.evaluate import evaluate, load_dataset  # noqa: E402
from redpp_onnx.passes.split import SplitConfig  # noqa: E402

MODELS = {"cifar10_resnet20.onnx": ("cifar10_test_exact1017.npz", 256),
          "cifar10_resnet56.onnx": ("cifar10_test_exact1017.npz", 256),
          "imagenet_efficientnet_lite0.onnx": ("imagenet_sample1000_224_q95.npz", 32)}
TOLERANCES = (0.0, 0.02, 0.05, 0.07, 0.1, 0.15)
ALPHAS = (0.001, 0.0025, 0.005)  # larger α collapses accuracy on these weights (benchmarks/results/merge.json)


def settings():
    for tol in TOLERANCES:
        yield f"split tol {tol:g}", dict(steps=("hash", "split"), split=SplitConfig(mode="all", tolerance=tol))
    if "merge" in AVAILABLE_STEPS:
        from redpp_onnx.passes.merge import MergeConfig

        for alpha in ALPHAS:
            yield f"merge α {alpha:g}", dict(steps=("hash", "merge", "split"), split=SplitConfig(mode="all"),
                                            merge=MergeConfig(alpha=alpha))
            yield f"merge α {alpha:g} + split tol 0.05", dict(
                steps=("hash", "merge", "split"), split=SplitConfig(mode="all", tolerance=0.05),
                merge=MergeConfig(alpha=alpha))


def main(argv=None):
    ap = shared_parser(__doc__, "relaxed.json")
    ap.add_argument("--plot", default=str(ROOT / "docs" / "relaxed_curve.png"))
    ap.add_argument("--resume", action="store_true", help="keep the rows already in --out, measure the rest")
    args = ap.parse_args(argv)
    rows = json.loads(Path(args.out).read_text())["rows"] if args.resume and Path(args.out).is_file() else []
    done = {(r["model"], r["setting"]) for r in rows}
    for name, (data_name, batch) in MODELS.items():
        original = io.load_model(Path(args.shared) / name)
        data = load_dataset(Path(args.shared) / data_name)
        for label, kw in settings():
            if (name, label) in done:
                continue
            emitted, report = compress(original, CompressConfig(verify=False, **kw))
            ev = evaluate(emitted, data, batch_size=batch, reference=original)
            m = report.model
            macs_removed = (1 - m["macs_after"] / m["macs_before"]) if m.get("macs_after") else None
            row = {"model": name, "setting": label, "params_removed": m["pruning_ratio"],
                   "macs_removed": macs_removed, "split_additions": m.get("split_additions"),
                   "top1": ev.top1, "top1_original": ev.reference_top1, "agreement": ev.agreement,
                   "drop_points": 100 * (ev.reference_top1 - ev.top1), "n": ev.n}
            rows.append(row)
            print(f"{name:34} {label:32} params -{100 * row['params_removed']:5.2f}%  MACs "
                  f"-{100 * (macs_removed or 0):5.2f}%  top-1 {100 * ev.top1:.2f}% ({-row['drop_points']:+.2f})",
                  flush=True)
    write_json(args.out, {"rows": rows})
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed (pip install 'redpp-onnx[plot]'): no plot")
        return
    fig, axes = plt.subplots(1, len(MODELS), figsize=(5 * len(MODELS), 4))
    for ax, name in zip(axes, MODELS):
        for family, marker in (("split tol", "o"), ("merge α", "s")):
            pts = [r for r in rows if r["model"] == name and r["setting"].startswith(family) and "+" not in r["setting"]]
            if pts:
                ax.plot([100 * r["params_removed"] for r in pts], [100 * r["top1"] for r in pts], marker=marker,
                        label=family)
        combo = [r for r in rows if r["model"] == name and "+" in r["setting"]]
        if combo:
            ax.plot([100 * r["params_removed"] for r in combo], [100 * r["top1"] for r in combo], marker="^",
                    label="merge α + split tol 0.05")
        ax.axhline(100 * rows[[r["model"] for r in rows].index(name)]["top1_original"], color="gray", ls="--",
                   lw=1, label="original")
        ax.set_title(name.replace(".onnx", ""))
        ax.set_xlabel("eligible params removed (%)")
        ax.set_ylabel("top-1 (%)")
        ax.legend(fontsize=8)
    fig.tight_layout()
    Path(args.plot).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.plot, dpi=110)
    print(f"wrote {args.plot}")


if __name__ == "__main__":
    main()
