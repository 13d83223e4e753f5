"""Channel reduction in transformer MLP blocks (issue 13): LayerNormalization statistics in the moment
walk, mean compensation into a MatMul's bias Add, the MatMul consumer refitted on the synthetic twin,
and the shapes a reduction must not leave stale (the dynamo exporter states initializers' shapes)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from redpp_onnx.analysis.layers import static_shapes
from redpp_onnx.analysis.theory import _ELEMENTWISE, _HERMITE, moment_state
from redpp_onnx.passes import reduce as R

from ..graphs import IR_VERSION, OPSET

ZOO = Path(__file__).resolve().parents[1] / "zoo"


def _mlp_block(d=16, hidden=32, tokens=8, seed=0):
    """ids -> Gather(table) -> LayerNorm -> MatMul(W1) -> Add(b1) -> Relu -> MatMul(W2) -> Add(b2) -> out."""
    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array(rng.standard_normal((50, d)).astype(np.float32), "table"),
             numpy_helper.from_array((1 + 0.3 * rng.standard_normal(d)).astype(np.float32), "g"),
             numpy_helper.from_array((0.2 * rng.standard_normal(d)).astype(np.float32), "beta"),
             numpy_helper.from_array((rng.standard_normal((d, hidden)) / math.sqrt(d)).astype(np.float32), "W1"),
             numpy_helper.from_array((0.3 * rng.standard_normal(hidden)).astype(np.float32), "b1"),
             numpy_helper.from_array((rng.standard_normal((hidden, d)) / math.sqrt(hidden)).astype(np.float32), "W2"),
             numpy_helper.from_array((0.1 * rng.standard_normal(d)).astype(np.float32), "b2")]
    nodes = [helper.make_node("Gather", ["table", "ids"], ["e"]),
             helper.make_node("LayerNormalization", ["e", "g", "beta"], ["ln"], axis=-1),
             helper.make_node("MatMul", ["ln", "W1"], ["h0"]), helper.make_node("Add", ["h0", "b1"], ["h1"]),
             helper.make_node("Relu", ["h1"], ["h"]),
             helper.make_node("MatMul", ["h", "W2"], ["y0"]), helper.make_node("Add", ["y0", "b2"], ["y"])]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("ids", TensorProto.INT64, ["N", tokens])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", tokens, d])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION)


def _run(model, ids):
    s = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return s.run(None, {s.get_inputs()[0].name: ids})[0].astype(np.float64)


def _rel(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(a))


def test_layer_norm_statistics_follow_the_features_on_the_last_axis():
    model = _mlp_block()
    st = moment_state(model)
    arr = {t.name: numpy_helper.to_array(t).astype(np.float64) for t in model.graph.initializer}
    ln = st["ln"]
    assert ln.last and ln.rank == 3
    np.testing.assert_allclose(ln.mean, arr["beta"])            # N(beta_d, g_d^2) per feature
    np.testing.assert_allclose(ln.var, arr["g"] ** 2)
    h1 = st["h1"]
    np.testing.assert_allclose(h1.mean, arr["beta"] @ arr["W1"] + arr["b1"], rtol=1e-12)
    np.testing.assert_allclose(h1.var, arr["g"] ** 2 @ arr["W1"] ** 2, rtol=1e-12)
    assert st["h"].last and st["y"].last and st["y"].mean.size == 16
    # the same walk reads the whole MLP of the exported zoo model, and stops at attention's reshapes
    zoo = moment_state(onnx.load(str(ZOO / "bertlike_dynamo.onnx")))
    assert zoo["gelu"].last and zoo["gelu"].mean.size == 128
    x, wq = _HERMITE
    s = zoo["linear_2"]
    fz = _ELEMENTWISE["Gelu"](s.mean[:, None] + np.sqrt(s.var)[:, None] * x[None, :])
    np.testing.assert_allclose(zoo["gelu"].mean, fz @ wq, rtol=1e-12)
    assert isinstance(zoo.get("view"), str) or "view" not in zoo or not getattr(zoo["view"], "last", False)


def test_compensation_into_the_bias_add_of_a_matmul_is_exact_for_constant_units():
    """8 of 32 hidden units are constant (zero weights, bias 1: Relu(1) = 1); the reduction takes exactly
    those, and their value goes into b2: the output is unchanged (float32), without compensation it moves."""
    model = _mlp_block()
    for t in model.graph.initializer:
        if t.name in ("W1", "b1"):
            a = numpy_helper.to_array(t).copy()
            if t.name == "W1":
                a[:, 3::4] = 0.0
            else:
                a[3::4] = 1.0
            t.CopyFrom(numpy_helper.from_array(a, t.name))
    ids = np.random.default_rng(1).integers(0, 50, (64, 8)).astype(np.int64)
    ref = _run(model, ids)
    errs = {}
    for comp in (True, False):
        res = R.reduce_channels(model, R.ReduceConfig(target_macs=0.875, refit=False, compensate=comp, multiple=8))
        w1 = numpy_helper.to_array(next(t for t in res.model.graph.initializer if t.name == "W1"))
        assert w1.shape == (16, 24) and np.count_nonzero(np.abs(w1).sum(0) == 0) == 0  # the 8 constant ones went
        errs[comp] = _rel(ref, _run(res.model, ids))
    assert errs[True] < 1e-6 < 0.1 < errs[False]


def test_the_matmul_consumer_is_refitted_on_the_twin():
    model = _mlp_block()
    ids = np.random.default_rng(2).integers(0, 50, (64, 8)).astype(np.int64)
    ref = _run(model, ids)
    plain = R.reduce_channels(model, R.ReduceConfig(target_macs=0.875, refit=False, multiple=8))
    fitted = R.reduce_channels(model, R.ReduceConfig(target_macs=0.875, multiple=8))
    assert [r.refitted for r in fitted.refit] == [True]
    assert fitted.refit[0].error_after < fitted.refit[0].error_before
    e_plain, e_fit = _rel(ref, _run(plain.model, ids)), _rel(ref, _run(fitted.model, ids))
    assert e_fit < 0.7 * e_plain
    assert sum(r.channels_before - r.channels_after for r in fitted.layers) == 8


@pytest.mark.parametrize("name", ["mobilenetv2ish_dynamo.onnx", "mlp_dynamo.onnx"])
def test_a_reduced_dynamo_export_keeps_its_static_shapes(name):
    """The dynamo exporter states the shapes of initializers in value_info: left stale by the channel
    edit, they failed shape inference, and every MAC count and synthetic input of the reduced model."""
    model = onnx.load(str(ZOO / name))
    res = R.reduce_channels(model, R.ReduceConfig(target_macs=0.8))
    assert res.macs_after > 0 and res.macs_after < res.macs_before
    shapes = static_shapes(res.model)
    assert shapes and all(shapes.get(o.name) for o in res.model.graph.output)
    onnx.shape_inference.infer_shapes(res.model, strict_mode=True)


def test_a_gated_activation_written_out_is_followed():
    """x * g(x): the TorchScript export's erf GELU (Div, Erf, Add, Mul, Mul) gives the moments of the dynamo
    export's Gelu op (same seeded weights), and a SiLU x * Sigmoid(x) those of numerical integration."""
    from scipy import integrate

    from redpp_onnx.analysis.fold import resolve_constant_identities

    ts, _ = resolve_constant_identities(onnx.load(str(ZOO / "bertlike_ts.onnx")))
    a = moment_state(ts)["/layers.0/Mul_1_output_0"]
    b = moment_state(onnx.load(str(ZOO / "bertlike_dynamo.onnx")))["gelu"]
    np.testing.assert_allclose(a.mean, b.mean, rtol=1e-6)
    np.testing.assert_allclose(a.var, b.var, rtol=1e-6)

    model = _mlp_block()
    for n in model.graph.node:
        if n.op_type == "Relu":  # h = h1 * Sigmoid(h1)
            n.CopyFrom(helper.make_node("Sigmoid", ["h1"], ["sg"]))
    model.graph.node.insert(5, helper.make_node("Mul", ["h1", "sg"], ["h"]))
    st = moment_state(model)
    m, v = st["h1"].mean[0], st["h1"].var[0]
    pdf = lambda z: math.exp(-(z - m) ** 2 / (2 * v)) / math.sqrt(2 * math.pi * v)  # noqa: E731
    silu = lambda z: z / (1 + math.exp(min(-z, 700.0)))  # noqa: E731
    lo, hi = m - 12 * math.sqrt(v), m + 12 * math.sqrt(v)
    m1 = integrate.quad(lambda z: silu(z) * pdf(z), lo, hi)[0]
    m2 = integrate.quad(lambda z: silu(z) ** 2 * pdf(z), lo, hi)[0]
    assert st["h"].last
    np.testing.assert_allclose([st["h"].mean[0], st["h"].var[0]], [m1, m2 - m1 * m1], rtol=1e-6)
