"""Single-layer models (Conv, SplitConv) for timing a layer's two forms."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper
from onnx import numpy_helper as nh

from ..ops import onnx_schema

IR_VERSION = 8


def _model(node, inits, custom: bool) -> onnx.ModelProto:
    graph = helper.make_graph([node], "layer", [helper.make_tensor_value_info("X", TensorProto.FLOAT, None)],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)], inits)
    opsets = [helper.make_opsetid("", 17)] + ([onnx_schema.opset_import()] if custom else [])
    return helper.make_model(graph, opset_imports=opsets, ir_version=IR_VERSION)


def conv_model(weight: np.ndarray, **geometry) -> onnx.ModelProto:
    node = helper.make_node("Conv", ["X", "W"], ["Y"], **geometry)
    return _model(node, [nh.from_array(weight.astype(np.float32), "W")], custom=False)


def split_conv_model(split, **geometry) -> onnx.ModelProto:
    inits = [nh.from_array(split.kernels, "k"), nh.from_array(split.offsets, "o"), nh.from_array(split.idx, "i")]
    return _model(onnx_schema.make_node(["X", "k", "o", "i"], ["Y"], **geometry), inits, custom=True)
