"""Tiny ONNX models for the SplitConv tests: a SplitConv node and its dense equivalent."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper
from onnx import numpy_helper as nh

from redpp_onnx.ops import onnx_schema
from redpp_onnx.ops.packing import SplitWeights

IR_VERSION = 8  # onnxruntime 1.31 loads IR <= 13; opset 17 needs IR >= 8
OPSET = 17


def _model(nodes, inputs, outputs, inits, custom=False) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, inits)
    opsets = [helper.make_opsetid("", OPSET)] + ([onnx_schema.opset_import()] if custom else [])
    return helper.make_model(graph, opset_imports=opsets, ir_version=IR_VERSION)


def split_conv_model(split: SplitWeights, *, bias=None, scale=None, shift=None, x_shape=None,
                     y_shape=None, raw_inits=None, **attrs) -> onnx.ModelProto:
    """X -> SplitConv -> Y with the weights as initializers.

    ``raw_inits`` replaces the initializers by name (to feed malformed tensors), e.g.
    ``{"idx": np.array(..., np.int64)}``.
    """
    tensors = {"kernels": split.kernels, "offsets": split.offsets, "idx": split.idx,
               "B": bias, "scale": scale, "shift": shift}
    tensors.update(raw_inits or {})
    names = ["X"] + [n if tensors[n] is not None else "" for n in ("kernels", "offsets", "idx", "B", "scale", "shift")]
    while names[-1] == "":
        names.pop()
    inits = [nh.from_array(np.asarray(v), n) for n, v in tensors.items() if v is not None]
    node = onnx_schema.make_node(names, ["Y"], **attrs)
    return _model([node], [helper.make_tensor_value_info("X", TensorProto.FLOAT, x_shape)],
                  [helper.make_tensor_value_info("Y", TensorProto.FLOAT, y_shape)], inits, custom=True)


def dense_conv_model(weight, *, bias=None, scale=None, shift=None, activation="", clip_min=None,
                     clip_max=None, **attrs) -> onnx.ModelProto:
    """The stock-op equivalent: Conv -> Mul(scale) -> Add(shift) -> Relu | Clip."""
    nd = weight.ndim - 2
    inits = [nh.from_array(weight, "W")]
    conv_inputs = ["X", "W"]
    if bias is not None:
        inits.append(nh.from_array(bias, "B"))
        conv_inputs.append("B")
    nodes = [helper.make_node("Conv", conv_inputs, ["Z0"], **attrs)]
    cur = "Z0"
    per_channel = (-1,) + (1,) * nd
    for name, op, value in (("scale", "Mul", scale), ("shift", "Add", shift)):
        if value is not None:
            inits.append(nh.from_array(value.reshape(per_channel), name))
            nodes.append(helper.make_node(op, [cur, name], [cur + name]))
            cur = cur + name
    if activation == "Relu":
        nodes.append(helper.make_node("Relu", [cur], ["Zr"]))
        cur = "Zr"
    elif activation == "Clip":
        lo = np.array(-np.inf if clip_min is None else clip_min, np.float32)
        hi = np.array(np.inf if clip_max is None else clip_max, np.float32)
        inits += [nh.from_array(lo, "lo"), nh.from_array(hi, "hi")]
        nodes.append(helper.make_node("Clip", [cur, "lo", "hi"], ["Zc"]))
        cur = "Zc"
    nodes.append(helper.make_node("Identity", [cur], ["Y"]))
    return _model(nodes, [helper.make_tensor_value_info("X", TensorProto.FLOAT, None)],
                  [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)], inits)


def run_stock(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    """onnxruntime's own kernels, graph optimizations off (no fusion changes the reference)."""
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, {"X": x})[0]


def rel_err(actual: np.ndarray, expected: np.ndarray) -> float:
    """max |actual - expected| / max |expected| (relative to the output's scale)."""
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    scale = float(np.max(np.abs(expected))) if expected.size else 0.0
    diff = float(np.max(np.abs(actual.astype(np.float64) - expected))) if expected.size else 0.0
    return diff / scale if scale > 0 else diff
