"""The split pass on tiny graphs: node counts, fusion, decisions, and equality with the input model."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper as nh

import redpp_onnx
from redpp_onnx import io
from redpp_onnx.passes.split import SplitConfig, SplitPass

from ..graphs import GraphBuilder

TOL = 1e-5


def _ops(model):
    return [n.op_type for n in model.graph.node]


def _run(model, x, plain=False):
    data = io.serialize(model)
    if plain:  # stock onnxruntime, no custom-op library
        return ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    return redpp_onnx.session(data).run(None, {"x": x})[0]


def _rel(a, b):
    return float(np.linalg.norm(a.astype(np.float64) - b) / np.linalg.norm(b))


def _shared_kernels(g, name, zero_share=0.3):
    """Give the Conv weight ``name`` repeated kernels (3 per input channel) and zero kernels."""
    t = next(i for i in g.inits if i.name == name)
    w = nh.to_array(t).copy()
    c_out, c_in = w.shape[:2]
    pool = g.rng.standard_normal((c_in, 3) + w.shape[2:]).astype(np.float32) / np.sqrt(w[0].size)
    w = pool[np.arange(c_in)[None, :], g.rng.integers(0, 3, (c_out, c_in))]
    w[g.rng.random((c_out, c_in)) < zero_share] = 0.0
    t.CopyFrom(nh.from_array(np.ascontiguousarray(w, np.float32), name))
    return w


def conv_bn_act(act="Relu", k=3, strides=(1, 1), pads=(1, 1, 1, 1), dilations=(1, 1), bias=True, shared=True,
                seed=0):
    """x -> Conv -> BN -> act -> Conv -> GAP -> Flatten -> Gemm."""
    g = GraphBuilder(seed)
    h = g.conv("x", 8, 16, k=k, bias=bias, pads=list(pads), strides=list(strides), dilations=list(dilations))
    if shared:
        _shared_kernels(g, g.nodes[-1].input[1])
    h = g.bn(h, 16)
    if act == "Relu":
        h = g.node("Relu", [h])
    elif act == "Clip":
        h = g.node("Clip", [h, g.const(np.array(0, np.float32)), g.const(np.array(6, np.float32))])
    h = g.conv(h, 16, 16)
    if shared:
        _shared_kernels(g, g.nodes[-1].input[1], zero_share=0.0)
    y = g.gemm(g.node("Flatten", [g.node("GlobalAveragePool", [h])]), 16, 10)
    return g.model(["N", 8, 11, 13], y)


X = np.random.default_rng(0).standard_normal((2, 8, 11, 13)).astype(np.float32)


@pytest.mark.parametrize("act", ["Relu", "Clip", ""])
def test_split_all_fuses_bn_and_activation_and_matches(act):
    model = conv_bn_act(act)
    result = SplitPass(SplitConfig(mode="all")).run(model)
    ops = _ops(result.model)
    assert ops.count("SplitConv") == 2 and "Conv" not in ops
    assert "BatchNormalization" not in ops  # folded into the first SplitConv's affine
    assert ops.count("Relu") == 0 and ops.count("Clip") == 0  # fused
    assert len(ops) == len(_ops(model)) - 1 - (1 if act else 0)  # Conv -> SplitConv 1:1; BN, act gone
    first = result.layers[0]
    assert first.decision == "split" and first.fused == ["BatchNormalization"] + ([act] if act else [])
    assert first.kernels_unique <= 3 * 8 and first.kernels_zero > 0 and first.params_after < first.params_before
    onnx.checker.check_model(result.model, full_check=True)
    assert _rel(_run(result.model, X), _run(model, X)) <= TOL


@pytest.mark.parametrize("geometry", [dict(k=3, strides=(2, 2), pads=(0, 1, 2, 1)),
                                      dict(k=5, strides=(1, 2), pads=(2, 2, 2, 2), dilations=(2, 1)),
                                      dict(k=1, pads=(0, 0, 0, 0)), dict(k=3, bias=False)])
def test_split_with_strides_pads_dilations(geometry):
    model = conv_bn_act(**geometry)
    result = SplitPass(SplitConfig(mode="all")).run(model)
    assert _ops(result.model).count("SplitConv") == 2
    assert _rel(_run(result.model, X), _run(model, X)) <= TOL


def test_no_duplicates_at_all_still_exact_but_nothing_pruned():
    model = conv_bn_act(shared=False)
    result = SplitPass(SplitConfig(mode="all")).run(model)
    assert all(l.params_after == l.params_before and l.kernels_zero == 0 for l in result.layers)
    assert _rel(_run(result.model, X), _run(model, X)) <= TOL


def test_auto_keeps_layers_that_would_be_slower_and_says_why():
    model = conv_bn_act(shared=False)  # no sharing: SplitConv cannot win
    result = SplitPass(SplitConfig(mode="auto")).run(model)
    assert _ops(result.model) == _ops(model)
    convs = [l for l in result.layers if l.decision != "counted"]
    assert len(convs) == 2
    for layer in convs:
        assert layer.decision == "kept" and layer.predicted_ratio > 0.8
        assert "kept as Conv: SplitConv predicted" in layer.reasons[0]


def test_none_counts_without_rewriting():
    model = conv_bn_act()
    result = SplitPass(SplitConfig(mode="none")).run(model)
    assert _ops(result.model) == _ops(model)
    assert result.layers[0].params_after < result.layers[0].params_before  # what splitting would remove
    assert model.SerializeToString() == conv_bn_act().SerializeToString()  # input untouched


@pytest.mark.parametrize("act", ["Relu", "Clip"])
def test_portable_runs_in_plain_onnxruntime_and_matches(act):
    model = conv_bn_act(act)
    result = SplitPass(SplitConfig(mode="all", portable=True)).run(model)
    ops = _ops(result.model)
    assert "SplitConv" not in ops and ops.count("ScatterND") == 2
    assert not any(o.domain == "ai.redpp" for o in result.model.opset_import)
    onnx.checker.check_model(result.model, full_check=True)
    y = _run(result.model, X, plain=True)
    assert _rel(y, _run(model, X)) <= TOL


def test_fusion_stops_at_a_tensor_with_two_consumers():
    g = GraphBuilder(5)
    h = g.conv("x", 8, 16)
    _shared_kernels(g, g.nodes[-1].input[1])
    b = g.bn(h, 16)
    r = g.node("Relu", [b])
    y = g.node("Add", [r, b])  # the BN output is used twice: only the BN can be folded
    model = g.model(["N", 8, 11, 13], y)
    result = SplitPass(SplitConfig(mode="all")).run(model)
    assert result.layers[0].fused == ["BatchNormalization"]
    assert "Relu" in _ops(result.model)
    assert _rel(_run(result.model, X), _run(model, X)) <= TOL


def test_gemm_is_counted_not_emitted():
    g = GraphBuilder(7)
    h = g.node("Flatten", [g.node("GlobalAveragePool", ["x"])])
    y = g.gemm(h, 8, 6)
    t = next(i for i in g.inits if i.name == g.nodes[-1].input[1])
    w = nh.to_array(t).copy()          # [out=6, in=8] with transB
    w[:, 0] = 0.5                      # input feature 0: one distinct value for all 6 outputs
    w[:3, 1] = 0.0                     # input feature 1: 3 zeros
    t.CopyFrom(nh.from_array(w, t.name))
    model = g.model(["N", 8, 4, 4], y)
    result = SplitPass(SplitConfig(mode="all")).run(model)
    (row,) = result.layers
    assert row.decision == "counted" and _ops(result.model) == _ops(model)
    assert row.kernels_zero == 3 and row.params_after == 48 - 5 - 3  # 5 repeats of 0.5, 3 zeros
    assert "not emitted" in row.reasons[0]


@pytest.mark.parametrize("tolerance", [0.05, 0.2])
def test_relaxed_split_stays_within_budget_and_prunes_more(tolerance):
    model = conv_bn_act(shared=False)
    exact = SplitPass(SplitConfig(mode="all")).run(model)
    relaxed = SplitPass(SplitConfig(mode="all", tolerance=tolerance)).run(model)
    convs = [l for l in relaxed.layers if l.decision == "split"]
    assert all(0 < l.relaxed_error <= tolerance + 1e-9 for l in convs)
    removed = lambda r: sum(l.params_removed for l in r.layers if l.decision == "split")  # noqa: E731
    assert removed(relaxed) > removed(exact) == 0
    y_relaxed, y = _run(relaxed.model, X), _run(model, X)
    assert _rel(y_relaxed, y) > 1e-4  # the function changes (the report says so)
    # the SplitConv computes exactly the Conv of the relaxed weights
    from redpp_onnx.passes.relax import relax_kernels
    from redpp_onnx.analysis.layers import ConstantTensors
    dense = onnx.ModelProto()
    dense.CopyFrom(model)
    consts = ConstantTensors(dense)
    for layer in convs:
        w = relax_kernels(consts.array(layer.weight), tolerance).weight
        consts.proto(layer.weight).CopyFrom(nh.from_array(w, layer.weight))
    assert _rel(y_relaxed, _run(dense, X)) <= TOL


def test_portable_with_many_channels_and_narrow_index_maps():
    """64 input channels x 3 kernels: column numbers past 127 with int8 index maps."""
    g = GraphBuilder(9)
    h = g.conv("x", 8, 64)
    h = g.conv(h, 64, 32)
    _shared_kernels(g, g.nodes[-1].input[1])
    y = g.gemm(g.node("Flatten", [g.node("GlobalAveragePool", [h])]), 32, 10)
    model = g.model(["N", 8, 11, 13], y)
    result = SplitPass(SplitConfig(mode="all", portable=True)).run(model)
    assert result.layers[1].kernels_unique > 128 // 3
    assert _rel(_run(result.model, X, plain=True), _run(model, X)) <= TOL
