"""Graphs that compute in float16 (a torch model exported after ``model.half()``): onnxruntime's
NchwcTransformer kills the process creating a session of such a graph (microsoft/onnxruntime#28392);
redpp-onnx's sessions turn it off (``runtime.half_compute``), ``compress`` works on it and says so.

The crashing cases run in a child process, so that a regression fails the test instead of killing
pytest."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import onnx
from onnx import TensorProto, helper

from redpp_onnx.runtime import HALF_COMPUTE_DISABLED, half_compute

from .graphs import IR_VERSION, OPSET
from .test_fold_casts import _mlp

ZOO = Path(__file__).resolve().parent / "zoo"
HALF = ZOO / "bertlike_half_ts.onnx"  # tests/zoo/make_zoo.py bertlike_half
FLOAT = ZOO / "bertlike_ts.onnx"      # the same seeded weights in float32


def _child(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)


def _cli(*args) -> subprocess.CompletedProcess:
    return _child("import sys; from redpp_onnx.cli import main; sys.exit(main(" + repr([str(a) for a in args]) + "))")


def test_which_graphs_compute_in_half_precision():
    assert half_compute(onnx.load(str(HALF)))
    assert not half_compute(onnx.load(str(FLOAT)))
    # float16 weights cast to float32 for the compute: constants, not a half-precision compute
    assert not half_compute(_mlp(TensorProto.FLOAT16))
    # float32 input and output, cast to float16 inside (onnxconverter-common's keep_io_types=True)
    nodes = [helper.make_node("Cast", ["x"], ["xh"], to=TensorProto.FLOAT16),
             helper.make_node("Relu", ["xh"], ["rh"]), helper.make_node("Cast", ["rh"], ["y"], to=TensorProto.FLOAT)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION)
    assert half_compute(model)


def test_our_session_runs_the_half_model_and_matches_onnxruntime_without_that_optimizer():
    """In a child: redpp_onnx.session() with its default options against a plain onnxruntime session with
    the optimizer turned off by hand (same outputs, float16 tolerance 0), and the float32 model within
    float16's precision."""
    code = f"""
import numpy as np, onnxruntime as ort, redpp_onnx
ids = np.random.default_rng(0).integers(0, 1000, (4, 16)).astype(np.int64)
ours = redpp_onnx.session({str(HALF)!r}).run(None, {{"x": ids}})[0]
so = ort.SessionOptions(); so.log_severity_level = 3
so.add_session_config_entry("optimization.disable_specified_optimizers", {",".join(HALF_COMPUTE_DISABLED)!r})
plain = ort.InferenceSession({str(HALF)!r}, so, providers=["CPUExecutionProvider"]).run(None, {{"x": ids}})[0]
full = ort.InferenceSession({str(FLOAT)!r}, providers=["CPUExecutionProvider"]).run(None, {{"x": ids}})[0]
assert ours.dtype == np.float16 and np.array_equal(ours, plain)
print(float(np.abs(ours.astype(np.float32) - full).max() / np.abs(full).max()))
"""
    proc = _child(code)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert float(proc.stdout.split()[-1]) < 0.01  # float16 against float32: 3 decimal digits


def test_compress_of_a_half_compute_model_says_what_it_turned_off(tmp_path):
    out, rep = tmp_path / "out.onnx", tmp_path / "r.json"
    proc = _cli("compress", HALF, "-o", out, "--report", rep, "-q")
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(rep.read_text())
    assert any("NchwcTransformer" in n and "#28392" in n for n in report["notes"])
    assert report["verify"]["max_rel_l2"] < 0.045  # the default budget of a features output, measured in float16
    assert report["model"]["changed_layers"] == report["model"]["eligible_layers"] > 0
    assert report["model"]["file_bytes_after"] * 1.8 < report["model"]["file_bytes_before"]  # the float16 file
    model = onnx.load(str(out))
    assert model.graph.output[0].type.tensor_type.elem_type == TensorProto.FLOAT16
    # and a float32 model gets no such note
    out32, rep32 = tmp_path / "out32.onnx", tmp_path / "r32.json"
    proc = _cli("compress", FLOAT, "-o", out32, "--report", rep32, "-q")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert not any("NchwcTransformer" in n for n in json.loads(rep32.read_text())["notes"])
