"""Small ONNX graphs built in code for the pass and CLI tests (IR and opset set explicitly)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper
from onnx import numpy_helper as nh

IR_VERSION = 8
OPSET = 17


class GraphBuilder:
    """Collects nodes and initializers; ``model()`` returns a checked ModelProto."""

    def __init__(self, seed: int = 0):
        self.rng = np.random.default_rng(seed)
        self.nodes, self.inits = [], []
        self._n = 0

    def name(self, prefix: str) -> str:
        self._n += 1
        return f"{prefix}{self._n}"

    def const(self, array: np.ndarray, prefix: str = "c") -> str:
        name = self.name(prefix)
        self.inits.append(nh.from_array(np.asarray(array), name))
        return name

    def node(self, op: str, inputs, n_out: int = 1, **attrs):
        outs = [self.name(op.lower() + "_out") for _ in range(n_out)]
        self.nodes.append(helper.make_node(op, list(inputs), outs, name=self.name(op), **attrs))
        return outs[0] if n_out == 1 else outs

    def weights(self, *shape, scale=None):
        fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else shape[0]
        return (self.rng.standard_normal(shape) * (scale or 1 / np.sqrt(fan_in))).astype(np.float32)

    def conv(self, x, c_in, c_out, k=3, group=1, bias=True, pads=None, **attrs):
        w = self.const(self.weights(c_out, c_in // group, k, k), "W")
        inputs = [x, w] + ([self.const(self.weights(c_out, scale=0.1), "B")] if bias else [])
        return self.node("Conv", inputs, group=group, pads=pads if pads is not None else [k // 2] * 4, **attrs)

    def bn(self, x, c):
        vals = [self.rng.uniform(0.5, 1.5, c), self.rng.normal(0, 0.1, c), self.rng.normal(0, 0.1, c),
                self.rng.uniform(0.5, 1.5, c)]
        return self.node("BatchNormalization", [x] + [self.const(v.astype(np.float32), "bn") for v in vals])

    def gemm(self, x, n_in, n_out, trans_b=True):
        w = self.weights(n_out, n_in) if trans_b else self.weights(n_in, n_out)
        return self.node("Gemm", [x, self.const(w, "G"), self.const(self.weights(n_out, scale=0.1), "GB")],
                         transB=int(trans_b))

    def model(self, x_shape, y, x_name="x", check=True) -> onnx.ModelProto:
        graph = helper.make_graph(
            self.nodes, "g", [helper.make_tensor_value_info(x_name, TensorProto.FLOAT, x_shape)],
            [helper.make_tensor_value_info(y, TensorProto.FLOAT, None)], self.inits)
        m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION)
        m = onnx.shape_inference.infer_shapes(m)  # declares the output's shape
        del m.graph.value_info[:]
        if check:
            onnx.checker.check_model(m)
        return m


def conv_bn_relu_gemm(seed=0, c=32, size=8) -> onnx.ModelProto:
    """x -> Conv -> BN -> Relu -> depthwise Conv -> Relu -> GlobalAveragePool -> Flatten -> Gemm."""
    g = GraphBuilder(seed)
    h = g.node("Relu", [g.bn(g.conv("x", 3, c, bias=False), c)])
    h = g.node("Relu", [g.conv(h, c, c, group=c)])
    h = g.node("Flatten", [g.node("GlobalAveragePool", [h])])
    return g.model(["N", 3, size, size], g.gemm(h, c, 10))
