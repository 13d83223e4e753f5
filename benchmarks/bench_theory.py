"""The data-free criterion of RED++ on the shared models, next to the paper's Table upper_bound.

    python benchmarks/bench_theory.py [--shared ../shared/bench] [--out benchmarks/results/theory.json]
                                      [--weight-error 0.01] [--limit N]

For ResNet-20 and ResNet-56 (CIFAR-10, ``cifar10_test_exact1017.npz``) and EfficientNet-Lite0
(ImageNet, ``imagenet_sample1000_224_q95.npz``): hash with the default configuration, then
report ``U`` (both readings of the gain term, see ``redpp_onnx/analysis/theory.py``), the
data-free ``E[norm]`` and ``V[norm]``, the measured ``E_X‖f‖`` and ``E_X‖f̃ - f‖``, the
tightness ``(U - E_X‖f̃-f‖)/U``, the ratio ``U/E[norm]`` and the verdict. The paper's own values
are printed beside ours; they were obtained with the paper's weights (and an EfficientNet-B0,
not Lite0), so they are a reference for orders of magnitude, not a target.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from redpp_onnx.analysis.theory import DEFAULT_VARIANT, VARIANTS, analyze  # noqa: E402
from redpp_onnx.config import HashConfig  # noqa: E402

DEFAULT_SHARED = ROOT.parent / "shared" / "bench"
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "theory.json"

MODELS = [  # (label, model file, data file, batch size, the paper's column)
    ("ResNet-20", "cifar10_resnet20.onnx", "cifar10_test_exact1017.npz", 256, "ResNet-20 (CIFAR-10)"),
    ("ResNet-56", "cifar10_resnet56.onnx", "cifar10_test_exact1017.npz", 256, "ResNet-56 (CIFAR-10)"),
    ("EfficientNet-Lite0", "imagenet_efficientnet_lite0.onnx", "imagenet_sample1000_224_q95.npz", 32,
     "EfficientNet-B0 (ImageNet)"),
]
PAPER = {  # Table upper_bound of the paper: U, E[norm], E_X||f||, tightness
    "ResNet-20 (CIFAR-10)": {"U": 3.1, "E_norm": 27, "E_X_f": 33, "tightness": 0.07},
    "ResNet-56 (CIFAR-10)": {"U": 1.7, "E_norm": 26, "E_X_f": 35, "tightness": 0.54},
    "EfficientNet-B0 (ImageNet)": {"U": 0.01, "E_norm": 0.6, "E_X_f": 0.6, "tightness": 0.11},
}


def folded_estimate(model_path: Path, config: HashConfig) -> dict:
    """E[norm] the way a user's torch export would get it: BatchNorm folded into Conv (by
    onnxruntime's basic graph optimizations, saved), then `analyze --input-stats standard`."""
    import tempfile

    import onnxruntime as ort

    with tempfile.TemporaryDirectory() as tmp:
        folded = Path(tmp) / "folded.onnx"
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        so.optimized_model_filepath = str(folded)
        so.log_severity_level = 3
        ort.InferenceSession(str(model_path), so, providers=["CPUExecutionProvider"])
        m = analyze(folded, config, input_stats="standard").to_dict()["model"]
    return {"E_norm": m["E_norm"], "V_norm": m["V_norm"], "U": m["U"], "ratio": m["ratio"],
            "verdict": m["verdict"], "assumptions": m["E_norm_approximations"], "reason": m["E_norm_reason"]}


def fmt(x, spec="{:.3g}"):
    return "-" if x is None else spec.format(x)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shared", type=Path, default=DEFAULT_SHARED)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--weight-error", type=float, default=HashConfig().weight_error)
    ap.add_argument("--limit", type=int, default=None, help="evaluate only the first N samples")
    ap.add_argument("--layers", action="store_true", help="also print each model's per-layer table")
    args = ap.parse_args(argv)

    config = HashConfig(weight_error=args.weight_error)
    rows = []
    for label, model_file, data_file, batch, paper_key in MODELS:
        model_path, data_path = args.shared / model_file, args.shared / data_file
        if not model_path.is_file() or not data_path.is_file():
            print(f"skip {label}: {model_path if not model_path.is_file() else data_path} not found")
            continue
        t0 = time.perf_counter()
        report = analyze(model_path, config, data=data_path, batch_size=batch, limit=args.limit)
        seconds = time.perf_counter() - t0
        if args.layers:
            print(f"== {label}\n{report.table()}\n")
        d = report.to_dict()
        m = d["model"]
        meas = m["measured"]
        rows.append({
            "label": label, "model": model_file, "data": data_file, "seconds": seconds,
            "U": m["U"], "U_first_order": m["U_first_order"], "default_variant": m["default_variant"],
            "E_norm": m["E_norm"], "V_norm": m["V_norm"], "E_norm_reason": m["E_norm_reason"],
            "E_X_f": meas["E_X_f"], "E_X_f_hashed": meas["E_X_f_hashed"], "E_X_diff": meas["E_X_diff"],
            "tightness": meas["tightness"], "ratio": m["ratio"], "ratio_by_variant": m["ratio_by_variant"],
            "ratio_conservative": m["ratio_conservative"], "verdict": m["verdict"],
            "measured_diff_over_norm": meas["E_X_diff"] / meas["E_X_f"],
            "top1": meas["top1"], "top1_hashed": meas["top1_hashed"], "agreement": meas["agreement"],
            "n": meas["n"], "paper_column": paper_key, "paper": PAPER[paper_key],
            "report": d,
            "bn_folded_input_stats": folded_estimate(model_path, config),
        })

    cols = ["model", "U[mag]", "U[paper]", "E[norm]", "V[norm]", "E_X|f|", "E_X|f~-f|",
            "tight[mag]", "tight[pap]", "U/E[norm]", "verdict"]
    widths = [22, 10, 11, 8, 8, 8, 10, 11, 11, 10, 26]
    line = " ".join(f"{c:>{w}}" if i else f"{c:<{w}}" for i, (c, w) in enumerate(zip(cols, widths)))
    print(f"weight_error = {config.weight_error}; default U variant: {DEFAULT_VARIANT}")
    print(line)
    print("-" * len(line))
    for r in rows:
        vals = [r["label"], fmt(r["U"]["magnitude"]), fmt(r["U"]["paper"]), fmt(r["E_norm"]), fmt(r["V_norm"]),
                fmt(r["E_X_f"]), fmt(r["E_X_diff"]), fmt(r["tightness"]["magnitude"]),
                fmt(r["tightness"]["paper"]), fmt(r["ratio"]), r["verdict"]]
        print(" ".join(f"{v:>{w}}" if i else f"{v:<{w}}" for i, (v, w) in enumerate(zip(vals, widths))))
        p = r["paper"]
        vals = ["  paper " + r["paper_column"].split(" ")[0], fmt(p["U"]), "", fmt(p["E_norm"]), "", fmt(p["E_X_f"]),
                "", fmt(p["tightness"], "{:.0%}"), "", fmt(p["U"] / p["E_norm"]), ""]
        print(" ".join(f"{v:>{w}}" if i else f"{v:<{w}}" for i, (v, w) in enumerate(zip(vals, widths))))
    print()
    for r in rows:
        print(f"{r['label']}: top-1 {r['top1']:.2%} -> {r['top1_hashed']:.2%} (agreement {r['agreement']:.2%}, "
              f"n={r['n']}), E_X|f~-f|/E_X|f| = {r['measured_diff_over_norm']:.3g}, "
              f"U first order: " + ", ".join(f"{v} {fmt(r['U_first_order'][v])}" for v in VARIANTS)
              + f", {r['seconds']:.1f} s")
        f = r["bn_folded_input_stats"]
        print(f"  BN folded + --input-stats standard: E[norm] {fmt(f['E_norm'])} (measured E_X|f| "
              f"{fmt(r['E_X_f'])}), U {fmt(f['U']['magnitude'])}, verdict {f['verdict']}")

    args.out.parent.mkdir(parents=True, exist_ok=True)
    out = {"weight_error": config.weight_error, "default_variant": DEFAULT_VARIANT, "variants": list(VARIANTS),
           "python": platform.python_version(), "machine": platform.machine(), "rows": rows}
    args.out.write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
