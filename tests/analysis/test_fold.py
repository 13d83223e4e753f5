"""Constant folding for the analyses: a --codebook model's weights (and other computed constant
weights) read as constants, the model given unchanged."""

from __future__ import annotations

import numpy as np
from onnx import numpy_helper as nh

import redpp_onnx
from redpp_onnx.analysis.fold import fold_constants
from redpp_onnx.analysis.layers import scan_layers
from redpp_onnx.analysis.theory import analyze
from redpp_onnx.compress import compress
from redpp_onnx.config import CompressConfig, HashConfig

from ..graphs import GraphBuilder, conv_bn_relu_gemm


def _hashed_and_packed():
    model = conv_bn_relu_gemm(c=64)  # big enough layers for codebooks to pay
    cfg = HashConfig(weight_error=0.01)
    hashed, _ = compress(model, CompressConfig(steps=("hash",), hash=cfg, verify=False, codebook=False))
    packed, _ = compress(model, CompressConfig(steps=("hash",), hash=cfg, codebook=True, verify=False))
    return hashed, packed


def test_codebook_model_folds_to_the_plain_hashed_model():
    hashed, packed = _hashed_and_packed()
    before = packed.SerializeToString()
    folded = fold_constants(packed)
    assert packed.SerializeToString() == before  # never changes the model given
    assert [n.op_type for n in folded.graph.node] == [n.op_type for n in hashed.graph.node]
    plain = {t.name: nh.to_array(t) for t in hashed.graph.initializer}
    for t in folded.graph.initializer:
        assert np.array_equal(nh.to_array(t), plain[t.name]), t.name
    assert len(folded.graph.initializer) == len(hashed.graph.initializer)
    assert len(scan_layers(packed).layers) < len(scan_layers(folded).layers) == len(scan_layers(hashed).layers)
    x = np.random.default_rng(0).standard_normal((2, 3, 8, 8)).astype(np.float32)
    run = lambda m: redpp_onnx.session(m).run(None, {"x": x})[0]  # noqa: E731
    assert np.array_equal(run(folded), run(packed))


def test_nothing_to_fold_returns_the_model_itself():
    model = conv_bn_relu_gemm()
    assert fold_constants(model) is model


def test_a_computed_weight_is_folded_and_random_ops_are_not():
    g = GraphBuilder(1)
    w = g.node("Div", [g.const(g.weights(8, 3, 3, 3), "W"), g.const(np.float32(2.0), "two")])
    noise = g.node("RandomNormalLike", [g.const(np.zeros((1, 8, 1, 1), np.float32), "z")])
    y = g.node("Add", [g.node("Conv", ["x", w], pads=[1, 1, 1, 1]), noise])
    model = g.model(["N", 3, 8, 8], y)
    folded = fold_constants(model)
    assert [n.op_type for n in folded.graph.node] == ["RandomNormalLike", "Conv", "Add"]
    weight = next(t for t in folded.graph.initializer if t.name == w)
    original = {t.name: nh.to_array(t) for t in model.graph.initializer}
    assert np.array_equal(nh.to_array(weight), original["W1"] / np.float32(2.0))
    assert len(scan_layers(folded).layers) == 1


def test_analyze_reads_a_codebook_model_like_the_plain_one():
    hashed, packed = _hashed_and_packed()
    a, b = analyze(hashed).to_dict(), analyze(packed).to_dict()
    assert a["model"]["U"] == b["model"]["U"] and a["model"]["E_norm"] == b["model"]["E_norm"]
    assert [l["u_l"] for l in a["layers"]] == [l["u_l"] for l in b["layers"]] and len(a["layers"]) > 0
