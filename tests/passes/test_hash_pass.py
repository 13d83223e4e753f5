"""The hash pass on small graphs: what changes, what is refused and why (codebook storage:
test_codebook.py)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper
from onnx import numpy_helper as nh

import redpp_onnx
from redpp_onnx.analysis.layers import ConstantTensors, scan_layers
from redpp_onnx.compress import compress
from redpp_onnx.config import CompressConfig, HashConfig
from redpp_onnx.passes.hash import HashPass

from ..graphs import GraphBuilder, conv_bn_relu_gemm


def _inits(model):
    return {t.name: nh.to_array(t) for t in model.graph.initializer}


def _run(model, x):
    return redpp_onnx.session(model.SerializeToString()).run(None, {"x": x})[0]


def test_hash_changes_eligible_weights_only():
    model = conv_bn_relu_gemm()
    result = HashPass(HashConfig(weight_error=0.02)).run(model)
    before, after = _inits(model), _inits(result.model)
    changed = sorted(n for n in before if not np.array_equal(before[n], after[n]))
    eligible = {l.weight for l in scan_layers(model).layers}
    assert len(eligible) == 2 and set(changed) == eligible  # the conv and the Gemm weights; no bias, no BN
    assert [r.op_type for r in result.refused] == ["Conv"] and "depthwise" in result.refused[0].reason
    for row in result.layers:
        assert row.method == "kde" and row.distinct_after < row.distinct_before
        assert row.rel_error <= 0.02 + 1e-6 and row.u_l > 0
        w = after[row.weight]
        assert len(np.unique(w)) == row.distinct_after
        assert np.linalg.norm(w - before[row.weight]) / np.linalg.norm(before[row.weight]) <= 0.02 + 1e-6
    assert len(model.graph.initializer) == len(result.model.graph.initializer)  # the input is not modified
    assert _inits(model).keys() == before.keys() and all(np.array_equal(_inits(model)[k], before[k]) for k in before)


def test_layer_the_budget_cannot_hash_is_left_unchanged_with_its_reason():
    result = HashPass(HashConfig(weight_error=0.02)).run(conv_bn_relu_gemm(c=8))  # Gemm 8 -> 10: 80 weights
    gemm = [r for r in result.layers if r.op_type == "Gemm"][0]
    assert gemm.method == "unchanged" and gemm.distinct_after == gemm.distinct_before
    assert "no bandwidth factor f >= 1 keeps the relative error within 0.02" in gemm.reasons[0]
    w = [t for t in result.model.graph.initializer if t.name == gemm.weight][0]
    assert np.array_equal(nh.to_array(w), ConstantTensors(conv_bn_relu_gemm(c=8)).array(gemm.weight))


def test_include_depthwise_hashes_it_too():
    result = HashPass(HashConfig(include_depthwise=True)).run(conv_bn_relu_gemm(c=16))
    assert len(result.layers) == 3 and not result.refused


def test_model_with_every_layer_refused_is_unchanged_and_says_why():
    g = GraphBuilder(1)
    h = g.conv("x", 4, 4, group=4)                        # depthwise: skipped by default
    w = g.weights(4, 4)
    g.inits.append(nh.from_array(w, "shared"))
    a = g.node("MatMul", [g.node("Flatten", [g.node("GlobalAveragePool", [h])]), "shared"])
    y = g.node("MatMul", [a, "shared"])                    # a weight shared by two MatMuls
    model = g.model(["N", 4, 6, 6], y)
    out, report = compress(model, CompressConfig())
    assert out.SerializeToString() == model.SerializeToString() or _inits(out).keys() == _inits(model).keys()
    assert all(np.array_equal(_inits(out)[k], _inits(model)[k]) for k in _inits(model))
    refused = [l for l in report.layers if not l["eligible"]]
    assert len(refused) == 3 and report.model["eligible_layers"] == 0 and report.model["changed_layers"] == 0
    reasons = " | ".join(r for l in refused for r in l["reasons"])
    assert "depthwise" in reasons and reasons.count("shared with") == 2
    assert report.notes[0] == "no layer was changed: the output computes exactly what the input does"
    assert report.verify["max_abs_diff"] <= 1e-6  # onnxruntime's own fusions only


@pytest.mark.parametrize("method", ["kde", "rd"])
def test_constant_node_weight_is_hashed(method):
    g = GraphBuilder(2)
    w = g.weights(64, 32)
    const_out = "wc"
    g.nodes.append(helper.make_node("Constant", [], [const_out], value=nh.from_array(w, "wv")))
    y = g.node("MatMul", ["x", const_out])
    model = g.model(["N", 64], y)
    result = HashPass(HashConfig(method=method)).run(model)
    assert len(result.layers) == 1 and result.layers[0].method == method
    hashed = ConstantTensors(result.model).array(const_out)
    assert len(np.unique(hashed)) == result.layers[0].distinct_after < len(np.unique(w))


def test_uniform_int8_baseline():
    result = HashPass(HashConfig(uniform_int8=True)).run(conv_bn_relu_gemm())
    assert all(r.method == "uniform-int8" and r.distinct_after <= 255 for r in result.layers)
