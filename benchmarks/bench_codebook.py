"""--codebook storage on every shared model: file size, bits per weight, exactness, load cost.

For each model in ../shared/bench and each setting (default ε = 0.01, ε = 0.02, and the default
with depthwise convs hashed too where the model has them) it writes the plainly hashed model and
the --codebook one, and measures: file sizes and the ratio to the fp32 input; stored code bits
per hashed weight against the codes' entropy (the floor for any code of independent values);
how many codebooks went in as int16 lattice integers; that both models give the same outputs bit
for bit (seeded random batch); and what the decoders cost when onnxruntime loads the model
(session creation time, median of RUNS fresh processes, and their peak RSS).

    python benchmarks/bench_codebook.py [--shared ../shared/bench] [--out benchmarks/results/codebook.json]
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _common import PEAK_RSS_KB_EXPR, shared_parser, write_json  # noqa: E402  (benchmarks/)

from redpp_onnx import io, session  # noqa: E402
from redpp_onnx.compress import compress  # noqa: E402
from redpp_onnx.config import CompressConfig, HashConfig  # noqa: E402

MODELS = ["cifar10_resnet20.onnx", "cifar10_resnet56.onnx", "imagenet_efficientnet_lite0.onnx"]
SETTINGS = [("ε=0.01 (default)", HashConfig(weight_error=0.01)),
            ("ε=0.02", HashConfig(weight_error=0.02)),
            ("ε=0.01, depthwise hashed too", HashConfig(weight_error=0.01, include_depthwise=True))]
RUNS = 5
LOAD = """
import re, sys, time
import onnxruntime as ort
so = ort.SessionOptions(); so.log_severity_level = 3
t = time.perf_counter()
ort.InferenceSession(sys.argv[1], so, providers=["CPUExecutionProvider"])
seconds = time.perf_counter() - t
print(seconds, """ + PEAK_RSS_KB_EXPR + """)
"""


def load_cost(path: Path) -> dict:
    """Median session-creation seconds and peak RSS (MiB) over RUNS fresh processes."""
    runs = [subprocess.run([sys.executable, "-c", LOAD, str(path)], check=True, capture_output=True,
                           text=True).stdout.split() for _ in range(RUNS)]
    return {"create_s": statistics.median(float(r[0]) for r in runs),
            "peak_rss_mib": statistics.median(int(r[1]) / 1024 for r in runs), "runs": RUNS}


def code_bits_floor(model: onnx.ModelProto, weights: list) -> tuple:
    """Total bits of the hashed weights' values, tensor by tensor: as fixed-length codes
    (⌈log₂ M⌉ each) and their entropy."""
    consts = {t.name: t for t in model.graph.initializer}
    fixed = entropy = 0.0
    for name in weights:
        _, counts = np.unique(onnx.numpy_helper.to_array(consts[name]), return_counts=True)
        p = counts / counts.sum()
        entropy += float(-(counts * np.log2(p)).sum())
        fixed += counts.sum() * max(1, int(np.ceil(np.log2(max(len(counts), 2)))))
    return fixed, entropy


def outputs_equal(a: Path, b: Path, model: onnx.ModelProto) -> float:
    inp = model.graph.input[0]
    shape = [d.dim_value or 4 for d in inp.type.tensor_type.shape.dim]
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    ya, yb = (session(str(p)).run(None, {inp.name: x})[0] for p in (a, b))
    return float(np.abs(ya - yb).max())


def main(argv=None):
    ap = shared_parser(__doc__, "codebook.json")
    args = ap.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in MODELS:
            src = Path(args.shared) / name
            original = io.load_model(src)
            has_grouped = any(n.op_type == "Conv" and any(a.name == "group" and a.i > 1 for a in n.attribute)
                              for n in original.graph.node)
            for label, hcfg in SETTINGS:
                if hcfg.include_depthwise and not has_grouped:
                    continue
                plain_path, packed_path = Path(tmp) / "plain.onnx", Path(tmp) / "packed.onnx"
                plain, _ = compress(original, CompressConfig(steps=("hash",), hash=hcfg, verify=False))
                packed, report = compress(original, CompressConfig(steps=("hash",), hash=hcfg, codebook=True,
                                                                   verify=False))
                io.save_model(plain, plain_path, force=True)
                io.save_model(packed, packed_path, force=True)
                stored = [l for l in report.layers if l.get("code_bits") is not None]
                weights = sum(l["params"] for l in stored)
                bits = sum(l["code_bits"] * l["params"] for l in stored)
                fixed, entropy = code_bits_floor(plain, [l["weight"] for l in stored])
                row = {"model": name, "setting": label, "input_bytes": src.stat().st_size,
                       "plain_bytes": plain_path.stat().st_size, "codebook_bytes": packed_path.stat().st_size,
                       "ratio": src.stat().st_size / packed_path.stat().st_size,
                       "stored_layers": len(stored), "stored_weights": weights,
                       "bits_per_weight": bits / weights, "fixed_bits_per_weight": fixed / weights,
                       "entropy_bits_per_weight": entropy / weights,
                       "int16_codebook_tensors": sum(l["codebook_type"] == "int16" for l in stored),
                       "max_abs_diff_vs_plain": outputs_equal(plain_path, packed_path, original),
                       "load_plain": load_cost(plain_path), "load_codebook": load_cost(packed_path)}
                rows.append(row)
                print(f"{name} {label}: {row['ratio']:.2f}x smaller ({row['codebook_bytes']:,} bytes), "
                      f"{row['bits_per_weight']:.2f} bits/weight (entropy {row['entropy_bits_per_weight']:.2f}), "
                      f"max |diff| vs plain {row['max_abs_diff_vs_plain']:g}; load "
                      f"{row['load_plain']['create_s']:.2f} -> {row['load_codebook']['create_s']:.2f} s, peak RSS "
                      f"{row['load_plain']['peak_rss_mib']:.0f} -> {row['load_codebook']['peak_rss_mib']:.0f} MiB",
                      flush=True)
    write_json(args.out, {"rows": rows})


if __name__ == "__main__":
    main()
