"""``python -m redpp_onnx.selfcheck``: is the installation able to run SplitConv?

Builds a small convolution whose kernels repeat, rewrites it as ``ai.redpp::SplitConv``,
runs both in onnxruntime and compares. Exit status 0 when they agree within 1e-5.
"""

from __future__ import annotations

import sys

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper
from onnx import numpy_helper as nh

from . import _core, get_library_path, session
from .ops import onnx_schema, packing

IR_VERSION = 8


def _model(node, inits, custom):
    graph = helper.make_graph(
        [node], "selfcheck", [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 16, 12, 12])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["N", 32, 12, 12])], inits)
    opsets = [helper.make_opsetid("", 17)] + ([onnx_schema.opset_import()] if custom else [])
    return helper.make_model(graph, opset_imports=opsets, ir_version=IR_VERSION)


def main() -> int:
    rng = np.random.default_rng(0)
    pool = rng.standard_normal((16, 4, 3, 3)).astype(np.float32) / 12
    weight = np.ascontiguousarray(pool[np.arange(16)[:, None], rng.integers(0, 4, (16, 32))].transpose(1, 0, 2, 3))
    bias = rng.standard_normal(32).astype(np.float32)
    split = packing.pack(weight)
    conv = _model(helper.make_node("Conv", ["X", "W", "B"], ["Y"], pads=[1, 1, 1, 1]),
                  [nh.from_array(weight, "W"), nh.from_array(bias, "B")], custom=False)
    inits = [nh.from_array(split.kernels, "kernels"), nh.from_array(split.offsets, "offsets"),
             nh.from_array(split.idx, "idx"), nh.from_array(bias, "B")]
    node = onnx_schema.make_node(["X", "kernels", "offsets", "idx", "B"], ["Y"], pads=[1, 1, 1, 1])
    split_model = _model(node, inits, custom=True)
    onnx.checker.check_model(split_model, full_check=True)
    x = rng.standard_normal((2, 16, 12, 12)).astype(np.float32)
    y_conv = ort.InferenceSession(conv.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"X": x})[0]
    y_split = session(split_model).run(None, {"X": x})[0]
    err = float(np.abs(y_split - y_conv).max() / np.abs(y_conv).max())
    info = _core.build_info()
    print(f"library      {get_library_path()}")
    print(f"onnxruntime  {ort.__version__} (library built for C API {info['ort_api_version']}, "
          f"SIMD {info['simd_target']})")
    print(f"SplitConv    {split.kernels.shape[0]} of {weight.shape[0] * weight.shape[1]} kernels kept; "
          f"max error vs onnxruntime Conv {err:.2e} relative")
    ok = err <= 1e-5
    print("OK" if ok else "FAILED: SplitConv disagrees with Conv")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
