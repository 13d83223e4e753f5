"""The default rate-distortion budget follows the kind of output (``config.output_kind``): class
scores from a Gemm / MatMul head get 0.1, anything else (pooled features, embeddings, maps) 0.03,
and the report says which and why."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from redpp_onnx.compress import compress
from redpp_onnx.config import (DEFAULT_BUDGET, DEFAULT_FEATURE_BUDGET, CompressConfig, HashConfig,
                               default_budget, output_kind)

from .graphs import IR_VERSION, OPSET


def _model(tail: str):
    """x [N, 16] -> MatMul(W 16x16) -> Relu -> <tail> -> y."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((16, 16)).astype(np.float32), "W"),
             numpy_helper.from_array(rng.standard_normal((16, 8)).astype(np.float32), "H"),
             numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "b"),
             numpy_helper.from_array(rng.standard_normal((8, 16)).astype(np.float32), "G")]
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"]), helper.make_node("Relu", ["h"], ["r"])]
    if tail == "gemm":
        nodes.append(helper.make_node("Gemm", ["r", "G"], ["y"], transB=1))
    elif tail == "matmul_bias_softmax":
        nodes += [helper.make_node("MatMul", ["r", "H"], ["z"]), helper.make_node("Add", ["z", "b"], ["s"]),
                  helper.make_node("Softmax", ["s"], ["y"], axis=-1)]
    elif tail == "reduce_mean":
        nodes.append(helper.make_node("ReduceMean", ["r"], ["y"], axes=[1], keepdims=1))
    elif tail == "normalize":
        nodes.append(helper.make_node("LpNormalization", ["r"], ["y"], axis=-1, p=2))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", "K"])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION)


@pytest.mark.parametrize("tail, kind", [("gemm", "scores"), ("matmul_bias_softmax", "scores"),
                                        ("reduce_mean", "features"), ("normalize", "features")])
def test_output_kind(tail, kind):
    got, why = output_kind(_model(tail))
    assert got == kind, why
    budget, note = default_budget(_model(tail))
    assert budget == (DEFAULT_BUDGET if kind == "scores" else DEFAULT_FEATURE_BUDGET) and f"{budget:g}" in note


def test_an_output_of_rank_three_is_features():
    model = _model("gemm")
    model.graph.output[0].type.tensor_type.shape.dim.add().dim_value = 3
    assert output_kind(model)[0] == "features"


def test_compress_uses_and_reports_the_default_budget_of_its_output():
    for tail, want in (("gemm", DEFAULT_BUDGET), ("normalize", DEFAULT_FEATURE_BUDGET)):
        _, report = compress(_model(tail), CompressConfig(steps=("hash",), verify=False))
        rd = report.to_dict()["model"]["rd"]
        assert rd["budget"] == want
        assert any(f"default budget {want:g}" in n for n in rd["notes"])
    _, report = compress(_model("normalize"), CompressConfig(steps=("hash",), hash=HashConfig(budget=0.2),
                                                             verify=False))
    rd = report.to_dict()["model"]["rd"]
    assert rd["budget"] == 0.2 and not any("default budget" in n for n in rd["notes"])
