"""Hashing on every shared model: distinct values removed vs accuracy, baselines, ε sweep, file sizes.

For each model in ../shared/bench and each setting (the default ε = 0.01, an ε sweep, the
paper's literal rule f = 1, the uniform int8 baseline) it hashes the model, measures the
share of distinct weight values removed, top-1 on the exact data (CIFAR exact subset, ImageNet
sample) and agreement with the original on the paired set (CIFAR JPEG 10k), and for the
default and ε = 0.02 the --codebook file size. Writes JSON; `render_results.py` turns it into
docs/RESULTS.md.

    python benchmarks/results_hashing.py [--shared ../shared/bench] [--out benchmarks/results/hashing.json]
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _common import shared_parser, write_json  # noqa: E402  (benchmarks/)

from redpp_onnx import io  # noqa: E402
from redpp_onnx.compress import compress  # noqa: E402
from redpp_onnx.config import CompressConfig, HashConfig  # noqa: E402
from redpp_onnx.evaluate import evaluate, load_dataset  # noqa: E402

MODELS = {  # model file -> (exact data, paired data or None, batch size)
    "cifar10_resnet20.onnx": ("cifar10_test_exact1017.npz", "cifar10_test_jpeg10k.npz", 256),
    "cifar10_resnet56.onnx": ("cifar10_test_exact1017.npz", "cifar10_test_jpeg10k.npz", 256),
    "imagenet_efficientnet_lite0.onnx": ("imagenet_sample1000_224_q95.npz", None, 32),
}
SETTINGS = [  # (label, HashConfig, measure the paired set, measure the codebook file)
    ("adaptive ε=0.01 (default)", HashConfig(weight_error=0.01), True, True),
    ("adaptive ε=0.005", HashConfig(weight_error=0.005), False, False),
    ("adaptive ε=0.02", HashConfig(weight_error=0.02), True, True),
    ("adaptive ε=0.05", HashConfig(weight_error=0.05), False, False),
    ("paper literal f=1", HashConfig(bandwidth_factor=1.0), False, False),
    ("uniform int8 (baseline)", HashConfig(uniform_int8=True), True, False),
]


def main(argv=None):
    ap = shared_parser(__doc__, "hashing.json")
    args = ap.parse_args(argv)
    shared = Path(args.shared)
    rows = []
    for model_name, (exact_name, paired_name, batch) in MODELS.items():
        path = shared / model_name
        original = io.load_model(path)
        exact = load_dataset(shared / exact_name)
        paired = load_dataset(shared / paired_name) if paired_name else None
        base = evaluate(original, exact, batch_size=batch)
        print(f"{model_name}: original top-1 {base.top1:.2%} on {exact.name}", flush=True)
        for label, hcfg, do_paired, do_codebook in SETTINGS:
            t0 = time.perf_counter()
            hashed, report = compress(original, CompressConfig(steps=("hash",), hash=hcfg, verify=False))
            seconds = time.perf_counter() - t0
            ev = evaluate(hashed, exact, batch_size=batch, reference=original)
            row = {"model": model_name, "setting": label, "config": report.config["hash"],
                   "distinct_before": report.model["distinct_values_before"],
                   "distinct_after": report.model["distinct_values_after"],
                   "reduction": report.model["distinct_reduction"],
                   "changed_layers": report.model["changed_layers"], "eligible_layers": report.model["eligible_layers"],
                   "hash_seconds": seconds, "data": exact.name, "n": ev.n,
                   "top1_original": ev.reference_top1, "top1": ev.top1, "top1_drop_points": 100 * (ev.reference_top1 - ev.top1),
                   "agreement": ev.agreement, "file_bytes_original": path.stat().st_size}
            if do_paired and paired is not None:
                pe = evaluate(hashed, paired, batch_size=batch, reference=original)
                row.update(paired_data=paired.name, paired_n=pe.n, paired_agreement=pe.agreement,
                           paired_top1=pe.top1, paired_top1_original=pe.reference_top1)
            if do_codebook:
                packed, _ = compress(original, CompressConfig(steps=("hash",), hash=hcfg, codebook=True, verify=False))
                with tempfile.TemporaryDirectory() as tmp:
                    size = io.save_model(packed, Path(tmp) / "m.onnx")
                row.update(codebook_file_bytes=size, codebook_ratio=path.stat().st_size / size)
            rows.append(row)
            extra = f", paired agreement {row['paired_agreement']:.2%}" if "paired_agreement" in row else ""
            extra += f", codebook x{row['codebook_ratio']:.2f}" if "codebook_ratio" in row else ""
            print(f"  {label:28} -{100 * row['reduction']:.2f}% distinct, top-1 {row['top1']:.2%} "
                  f"({-row['top1_drop_points']:+.2f} pt), agreement {row['agreement']:.2%}{extra}, "
                  f"{seconds:.1f} s", flush=True)
    write_json(args.out, {"rows": rows})


if __name__ == "__main__":
    main()
