"""SplitConv / Conv time ratio vs the share of kernels removed; fits the split cost model.

For a grid of layer shapes, kernel sizes, shares of unique kernels and of zero kernels, times
SplitConv and onnxruntime's Conv in the same process (batch 1, one thread, median of --repeat
runs), prints the ratio, fits the linear model of ``split_cost.features`` per kernel class
(1x1, larger), prints the break-even share of kernels removed per shape family, and writes the fit to redpp_onnx/passes/split_cost.json (package data) and the
raw rows to benchmarks/results/split_cost.json.

    python benchmarks/calibrate_split_cost.py [--repeat 15] [--quick]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import onnxruntime  # noqa: E402

import redpp_onnx  # noqa: E402
import redpp_onnx._core  # noqa: E402
from redpp_onnx.ops import packing  # noqa: E402
from redpp_onnx.passes import split_cost  # noqa: E402

SHAPES = [  # (c_in, c_out, size)
    (64, 64, 32), (64, 64, 8), (32, 32, 16), (128, 128, 16), (64, 256, 14), (256, 64, 14),
]
KERNELS = (1, 3)
UNIQUE = (1.0, 0.5, 0.25, 0.1, 0.03)
ZERO = (0.0, 0.5)


def layer(c_in, c_out, k, unique, zero, rng):
    """Weights whose per-channel unique share is ``unique`` and zero share ``zero``."""
    n_unique = max(1, int(round(unique * c_out)))
    pool = rng.standard_normal((c_in, n_unique, k, k)) / np.sqrt(c_in * k * k)
    choice = (np.tile(np.arange(c_out) % n_unique, (c_in, 1)) if n_unique == c_out
              else rng.integers(0, n_unique, size=(c_in, c_out)))
    w = pool[np.arange(c_in)[:, None], choice].transpose(1, 0, 2, 3)
    w[(rng.random((c_out, c_in)) < zero)] = 0.0
    return np.ascontiguousarray(w, dtype=np.float32)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--quick", action="store_true", help="first two shapes only")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "split_cost.json"))
    ap.add_argument("--calibration", default=str(ROOT / "redpp_onnx" / "passes" / split_cost.CALIBRATION_FILE))
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    rows = []
    print(f"{'shape':>18} {'k':>2} {'unique':>6} {'zero':>5} {'u':>6} {'z':>6} {'ratio':>6}")
    for c_in, c_out, size in SHAPES[:2] if args.quick else SHAPES:
        for k in KERNELS:
            for zero in ZERO:
                for unique in UNIQUE:
                    w = layer(c_in, c_out, k, unique, zero, rng)
                    split = packing.pack(w)
                    pads = [k // 2] * 4
                    t_split, t_conv = split_cost.time_ratio(w, split, (1, c_in, size, size), [1, 1], pads, [1, 1],
                                                            repeat=args.repeat)
                    f = split_cost.features(split, size * size)
                    u, z = f[1], f[2]
                    rows.append({"c_in": c_in, "c_out": c_out, "size": size, "kernel": k, "unique": unique,
                                 "zero": zero, "u": u, "z": z, "features": f, "split_ms": 1e3 * t_split,
                                 "conv_ms": 1e3 * t_conv, "ratio": t_split / t_conv})
                    print(f"{c_in:>5}x{c_out:<4}@{size:>2}x{size:<3} {k:>2} {unique:6.2f} {zero:5.2f} {u:6.3f} "
                          f"{z:6.3f} {t_split / t_conv:6.2f}", flush=True)
    coefficients, fit = {}, {}
    for key, sel in (("1x1", lambda r: r["kernel"] == 1), ("kxk", lambda r: r["kernel"] > 1)):
        sub = [r for r in rows if sel(r)]
        A = np.array([r["features"] for r in sub])
        y = np.array([r["ratio"] for r in sub])
        coef, *_ = np.linalg.lstsq(A, y, rcond=None)
        pred = A @ coef
        coefficients[key] = [float(c) for c in coef]
        fit[key] = {"rows": len(sub), "max_abs_error": float(np.max(np.abs(pred - y))),
                    "rms_error": float(np.sqrt(np.mean((pred - y) ** 2)))}
        print(f"{key}: rms error {fit[key]['rms_error']:.3f}, max {fit[key]['max_abs_error']:.3f}, "
              f"coefficients {np.round(coef, 3).tolist()}")
    # Measured break-even per shape family (no zero kernels): the largest unique share whose
    # measured ratio is <= 1, i.e. the share of kernels that must be removed.
    print("break-even (measured, no zero kernels): share of kernels removed for SplitConv <= Conv")
    for c_in, c_out, size in sorted({(r["c_in"], r["c_out"], r["size"]) for r in rows}):
        for k in KERNELS:
            fam = sorted((r for r in rows if (r["c_in"], r["c_out"], r["size"], r["kernel"], r["zero"])
                          == (c_in, c_out, size, k, 0.0)), key=lambda r: -r["u"])
            ok = [r for r in fam if r["ratio"] <= 1.0]
            at = f"{100 * (1 - ok[0]['u']):.0f}%" if ok else f"not reached (best {min(r['ratio'] for r in fam):.2f}x)"
            fit.setdefault("break_even", {})[f"{c_in}x{c_out}@{size} k{k}"] = (1 - ok[0]["u"]) if ok else None
            print(f"  {c_in}x{c_out} @{size}x{size} k{k}: {at}")
    meta = {"date": datetime.date.today().isoformat(), "onnxruntime": onnxruntime.__version__,
            "simd_target": redpp_onnx._core.build_info()["simd_target"], "cpus": os.cpu_count(),
            "machine": platform.machine(), "repeat": args.repeat, "threads": 1, "batch": 1}
    Path(args.calibration).write_text(json.dumps({"coefficients": coefficients, "fit": fit, "meta": meta},
                                                 indent=2) + "\n")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"meta": meta, "coefficients": coefficients, "fit": fit, "rows": rows}, indent=2) + "\n")
    print(f"wrote {args.calibration} and {out}")


if __name__ == "__main__":
    main()
