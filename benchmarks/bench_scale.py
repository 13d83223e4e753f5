"""The whole `compress` command on a ResNet-50-sized model: time, peak memory, file sizes, load cost.

The model is built here with onnx.helper (no torch): the ResNet-50 graph (Conv + BatchNorm +
Relu bottlenecks with projection shortcuts, MaxPool, GlobalAveragePool, Gemm; 25.6 M
parameters, 102 MB) with the seeded weights of ``bench_hashing.py`` and seeded BatchNorm
statistics. For each variant (default; --codebook) the CLI runs in a fresh process, and the
script records its wall time and peak RSS, the report's timings, the output size, and what
onnxruntime needs to load the output (session creation time, median of RUNS fresh processes,
and peak RSS; ``bench_codebook.load_cost``).

    python benchmarks/bench_scale.py [--out benchmarks/results/scale.json]
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _common import PEAK_RSS_KB_EXPR, run_python, shared_parser, write_json  # noqa: E402  (benchmarks/)
from bench_codebook import load_cost  # noqa: E402
from bench_hashing import STAGES, synthetic_weights  # noqa: E402

from redpp_onnx.io import runtime_ir_version  # noqa: E402

VARIANTS = {"default (hash, merge, split auto)": [], "--codebook": ["--codebook"]}
# runs the CLI and reports the process's own peak RSS (VmHWM) on its last stderr line
CLI = """
import re, sys
from redpp_onnx.cli import main
code = main(sys.argv[1:])
print("VmHWM", """ + PEAK_RSS_KB_EXPR + """, file=sys.stderr)
sys.exit(code)
"""


def resnet50(seed: int = 0) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    nodes, inits = [], []
    count = [0]

    def name(prefix):
        count[0] += 1
        return f"{prefix}_{count[0]}"

    def const(array, prefix):
        n = name(prefix)
        inits.append(numpy_helper.from_array(np.asarray(array, np.float32), n))
        return n

    def node(op, inputs, **attrs):
        out = name(op.lower())
        nodes.append(helper.make_node(op, inputs, [out], name=name(op), **attrs))
        return out

    def conv_bn(x, cin, cout, k, stride=1, relu=True):
        w = const(synthetic_weights((cout, cin, k, k), rng), "W")
        y = node("Conv", [x, w], kernel_shape=[k, k], strides=[stride, stride], pads=[k // 2] * 4)
        bn = [rng.uniform(0.5, 1.5, cout), rng.normal(0, 0.1, cout), rng.normal(0, 0.1, cout),
              rng.uniform(0.5, 1.5, cout)]
        y = node("BatchNormalization", [y] + [const(v, "bn") for v in bn])
        return node("Relu", [y]) if relu else y

    x = conv_bn("x", 3, 64, 7, 2)
    x = node("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    cin = 64
    for s, (blocks, width, cout) in enumerate(STAGES):
        for b in range(blocks):
            stride = 2 if (b == 0 and s > 0) else 1
            y = conv_bn(x, cin, width, 1)
            y = conv_bn(y, width, width, 3, stride)
            y = conv_bn(y, width, cout, 1, relu=False)
            short = conv_bn(x, cin, cout, 1, stride, relu=False) if b == 0 else x
            x = node("Relu", [node("Add", [y, short])])
            cin = cout
    x = node("Flatten", [node("GlobalAveragePool", [x])])
    y = node("Gemm", [x, const(synthetic_weights((1000, 2048), rng), "fc"), const(np.zeros(1000), "fcb")], transB=1)
    graph = helper.make_graph(nodes, "resnet50_synthetic",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 224, 224])],
                              [helper.make_tensor_value_info(y, TensorProto.FLOAT, ["N", 1000])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = runtime_ir_version(model)
    onnx.checker.check_model(model)
    return model


def run_cli(args) -> dict:
    seconds, proc = run_python(CLI, args)
    peak = int(proc.stderr.strip().splitlines()[-1].split()[1])
    return {"wall_s": seconds, "peak_rss_mib": peak / 1024}


def main(argv=None):
    ap = shared_parser(__doc__, "scale.json", shared=False)
    args = ap.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "resnet50.onnx"
        model = resnet50()
        onnx.save(model, str(src))
        params = sum(int(np.prod(t.dims)) for t in model.graph.initializer)
        print(f"synthetic ResNet-50: {params:,} parameters, {src.stat().st_size:,} bytes", flush=True)
        base = load_cost(src)
        for label, extra in VARIANTS.items():
            out, rep = Path(tmp) / "out.onnx", Path(tmp) / "r.json"
            cli = run_cli(["compress", str(src), "-o", str(out), "--report", str(rep), "-q", "--force"] + extra)
            report = json.loads(rep.read_text())
            row = {"variant": label, "params": params, "input_bytes": src.stat().st_size,
                   "output_bytes": out.stat().st_size, "compress": cli, "timings": report["timings"],
                   "max_rel_l2": report["verify"].get("max_rel_l2"), "changed_layers": report["model"]["changed_layers"],
                   "eligible_layers": report["model"]["eligible_layers"], "load_input": base,
                   "load_output": load_cost(out)}
            rows.append(row)
            print(f"{label}: compress {cli['wall_s']:.1f} s, peak {cli['peak_rss_mib']:.0f} MiB; "
                  f"{row['input_bytes']:,} -> {row['output_bytes']:,} bytes; load "
                  f"{base['create_s']:.2f} -> {row['load_output']['create_s']:.2f} s, "
                  f"{base['peak_rss_mib']:.0f} -> {row['load_output']['peak_rss_mib']:.0f} MiB", flush=True)
    write_json(args.out, {"rows": rows})


if __name__ == "__main__":
    main()
