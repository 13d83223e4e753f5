"""Accuracy of every model in shared/bench on its data, checked against PROVENANCE.md.

    python benchmarks/eval_shared.py [--shared ../shared/bench] [--out benchmarks/results/eval_shared.json]
    python benchmarks/eval_shared.py --model X.onnx --data D.npz [--ref R.onnx] [--out result.json]

Full run: each ``*.onnx`` in the folder is evaluated on every ``*.npz`` whose sample shape
fits its input (both CIFAR sets for the ResNets), with ``redpp_onnx.evaluate``. The
expected top-1/top-5 come from the "Measured accuracy" table of the folder's
PROVENANCE.md; the exit status is 1 if any measured number differs from it (compared at
the table's 2 decimals, i.e. the exact count of correct samples), or if a row of the
table could not be measured. Rows without a PROVENANCE entry are reported, not checked.

Ad-hoc run (``--model``/``--data``): one evaluation, optionally against a reference
model (agreement and logit drift); prints the result, writes JSON only with ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from redpp_onnx.evaluate import evaluate, load_dataset

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_SHARED = ROOT.parent / "shared" / "bench"
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "eval_shared.json"
ROW = re.compile(r"^\|\s*`?([\w.-]+\.onnx)`?\s*\|\s*`?([\w.-]+\.npz)`?\s*\|\s*([\d,]+)\s*\|"
                 r"\s*\**([\d.]+)\s*%\**\s*\|\s*\**([\d.]+)\s*%\**\s*\|")


def batch_size_for(sample_shape) -> int:
    """256 for small images; 32 for large ones (faster and ~6x less memory at 224x224)."""
    return 256 if int(np.prod(sample_shape)) <= 3 * 64 * 64 else 32


def parse_provenance(path: Path) -> dict:
    """{(model, data): (n, top1 %, top5 %)} from the "Measured accuracy" table."""
    rows = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        m = ROW.match(line.strip())
        if m:
            rows[(m.group(1), m.group(2))] = (int(m.group(3).replace(",", "")),
                                              float(m.group(4)), float(m.group(5)))
    return rows


def input_sample_shape(model_path: Path):
    """The first graph input's per-sample shape (ints; None for symbolic dims)."""
    model = onnx.load(str(model_path), load_external_data=False)
    init = {t.name for t in model.graph.initializer}
    inp = next(i for i in model.graph.input if i.name not in init)
    dims = inp.type.tensor_type.shape.dim[1:]
    return tuple(d.dim_value if d.HasField("dim_value") else None for d in dims)


def fits(model_shape, sample_shape) -> bool:
    return len(model_shape) == len(sample_shape) and all(
        m is None or m == s for m, s in zip(model_shape, sample_shape))


def meta() -> dict:
    try:
        import PIL
        pillow = PIL.__version__
    except ImportError:
        pillow = None
    return {"onnxruntime": ort.__version__, "numpy": np.__version__, "onnx": onnx.__version__,
            "pillow": pillow, "python": platform.python_version(), "cpus": os.cpu_count(),
            "machine": platform.machine()}


def progress_printer(label: str):
    def report(done: int, total: int) -> None:
        print(f"\r  {label}: {done}/{total}", end="" if done < total else "\n",
              file=sys.stderr, flush=True)
    return report


def run_all(shared: Path, out: Path) -> int:
    prov_path = shared / "PROVENANCE.md"
    if not prov_path.is_file():
        print(f"error: {prov_path} is missing", file=sys.stderr)
        return 2
    expected = parse_provenance(prov_path)
    if not expected:
        print(f"error: no accuracy rows found in {prov_path}", file=sys.stderr)
        return 2
    datasets = {p.name: load_dataset(p) for p in sorted(shared.glob("*.npz"))}
    rows, failures = [], []
    t_all = time.perf_counter()
    for model_path in sorted(shared.glob("*.onnx")):
        shape = input_sample_shape(model_path)
        for data_name, ds in datasets.items():
            if not fits(shape, ds.sample_shape):
                continue
            r = evaluate(model_path, ds, batch_size=batch_size_for(ds.sample_shape),
                         progress=progress_printer(f"{model_path.name} on {data_name}"))
            key = (model_path.name, data_name)
            top1, top5 = round(100 * r.top1, 2), round(100 * r.top5, 2)
            exp = expected.get(key)
            if exp is None:
                status = "no reference"
            elif (r.n, top1, top5) == exp:
                status = "OK"
            else:
                status = f"MISMATCH (expected n={exp[0]}, {exp[1]:.2f} %, {exp[2]:.2f} %)"
                failures.append(key)
            rows.append({"model": model_path.name, "data": data_name, "n": r.n,
                         "top1_percent": top1, "top5_percent": top5,
                         "expected": None if exp is None else
                         {"n": exp[0], "top1_percent": exp[1], "top5_percent": exp[2]},
                         "status": status, "preprocessing": ds.preprocessing,
                         "result": r.to_dict()})
    for key in expected:
        if not any((row["model"], row["data"]) == key for row in rows):
            failures.append(key)
            rows.append({"model": key[0], "data": key[1], "n": None, "top1_percent": None,
                         "top5_percent": None, "status": "NOT MEASURED (file missing or no fit)",
                         "expected": dict(zip(("n", "top1_percent", "top5_percent"), expected[key]))})

    print(f"{'model':34} {'data':34} {'n':>6} {'top-1 %':>8} {'top-5 %':>8} {'batch':>5} {'s':>6}  check")
    for row in rows:
        res = row.get("result") or {}
        t1 = "-" if row["top1_percent"] is None else f"{row['top1_percent']:.2f}"
        t5 = "-" if row["top5_percent"] is None else f"{row['top5_percent']:.2f}"
        print(f"{row['model']:34} {row['data']:34} {row['n'] or '-':>6} {t1:>8} {t5:>8} "
              f"{res.get('batch_size_used', '-'):>5} {res.get('seconds', 0):6.1f}  {row['status']}")
    total = time.perf_counter() - t_all
    print(f"{len(rows)} rows, {len(failures)} failure(s), {total:.1f} s")

    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"meta": {**meta(), "shared": str(shared), "seconds": total},
                               "rows": rows, "ok": not failures}, indent=2) + "\n")
    print(f"wrote {out}")
    return 1 if failures else 0


def run_one(args) -> int:
    ds = load_dataset(args.data, preprocess=args.preprocess, limit=args.limit)
    batch = args.batch_size or batch_size_for(ds.sample_shape)
    r = evaluate(args.model, ds, batch_size=batch, reference=args.ref,
                 progress=progress_printer(Path(args.model).name))
    print(f"data: {ds.source} (n={len(ds)}; {ds.preprocessing})")
    print(f"model: {r.model}: top-1 {100 * r.top1:.2f} % ({r.top1_correct}/{r.n}), "
          f"top-5 {100 * r.top5:.2f} % ({r.top5_correct}/{r.n}), E|f| {r.mean_logit_norm:.4f}, "
          f"batch {r.batch_size_used}, {r.seconds:.1f} s")
    if r.reference is not None:
        print(f"reference: {r.reference}: top-1 {100 * r.reference_top1:.2f} %, "
              f"top-5 {100 * r.reference_top5:.2f} %, E|f| {r.reference_mean_logit_norm:.4f}")
        print(f"agreement {100 * r.agreement:.2f} %, max|diff| {r.max_abs_logit_diff:.4g}, "
              f"E|f~-f| {r.mean_logit_diff_norm:.4g}, E(|f~-f|/|f|) {r.mean_rel_l2_logit_diff:.4g}")
    for note in r.notes:
        print(f"note: {note}")
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"meta": meta(), "preprocessing": ds.preprocessing,
                                   "result": r.to_dict()}, indent=2) + "\n")
        print(f"wrote {out}")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shared", type=Path, default=DEFAULT_SHARED,
                    help=f"folder with the models, data and PROVENANCE.md (default {DEFAULT_SHARED})")
    ap.add_argument("--out", default=None, help=f"JSON output (full run default: {DEFAULT_OUT})")
    ap.add_argument("--model", help="ad-hoc: model to evaluate")
    ap.add_argument("--data", help="ad-hoc: npz data set")
    ap.add_argument("--ref", help="ad-hoc: reference model (agreement, logit drift)")
    ap.add_argument("--preprocess", default="auto", choices=["auto", "cifar", "imagenet", "raw"])
    ap.add_argument("--limit", type=int, default=None, help="ad-hoc: first N samples only")
    ap.add_argument("--batch-size", type=int, default=None,
                    help="ad-hoc: batch size (default 256, 32 for large images)")
    args = ap.parse_args(argv)
    if args.model or args.data or args.ref:
        if not (args.model and args.data):
            ap.error("--model and --data go together (--ref is optional)")
        try:
            return run_one(args)
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    if not args.shared.is_dir():
        print(f"error: {args.shared} is not a folder", file=sys.stderr)
        return 2
    return run_all(args.shared, Path(args.out) if args.out else DEFAULT_OUT)


if __name__ == "__main__":
    sys.exit(main())
