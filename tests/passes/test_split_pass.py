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
    for layer in result.layers:
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
