"""Patterns of exported models that once broke compress (found by exporting torch models with
both exporters), and the verification gate for pipelines."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import redpp_onnx
from redpp_onnx.analysis.fold import resolve_constant_identities
from redpp_onnx.cli import main
from redpp_onnx.compress import compress
from redpp_onnx.config import CompressConfig, HashConfig
from redpp_onnx.passes.split import SplitConfig

from .graphs import GraphBuilder, conv_bn_relu_gemm

VARIANTS = {"default": CompressConfig(),
            "split all": CompressConfig(split=SplitConfig(mode="all")),
            "portable": CompressConfig(split=SplitConfig(mode="all", portable=True)),
            "codebook": CompressConfig(codebook=True)}


def _dedup_model():
    """The TorchScript exporter's deduplication: equal initializers (here the zero biases of
    two Convs, one weight) become one tensor read through Identity nodes."""
    g = GraphBuilder(2)
    zero = g.const(np.zeros(16, np.float32), "zero")
    b1, b2 = g.node("Identity", [zero]), g.node("Identity", [zero])
    w1 = g.node("Identity", [g.const(g.weights(16, 3, 3, 3), "W")])
    h = g.node("Relu", [g.node("Conv", ["x", w1, b1], pads=[1, 1, 1, 1])])
    h = g.node("Relu", [g.node("Conv", [h, g.const(g.weights(16, 16, 3, 3), "W"), b2], pads=[1, 1, 1, 1])])
    y = g.gemm(g.node("Flatten", [g.node("GlobalAveragePool", [h])]), 16, 10)
    return g.model(["N", 3, 8, 8], y)


def test_identity_aliases_of_constants_are_read_directly():
    model = _dedup_model()
    resolved, n = resolve_constant_identities(model)
    assert n == 3 and sum(x.op_type == "Identity" for x in resolved.graph.node) == 0
    assert resolve_constant_identities(resolved) == (resolved, 0)
    x = np.random.default_rng(0).standard_normal((2, 3, 8, 8)).astype(np.float32)
    run = lambda m: redpp_onnx.session(m).run(None, {"x": x})[0]  # noqa: E731
    assert np.array_equal(run(model), run(resolved))


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_deduplicated_constants_compress_and_verify(variant):
    out, report = compress(_dedup_model(), VARIANTS[variant])
    assert report.verify["max_rel_l2"] < 0.2  # the default spends a predicted 0.1 (measured 0.14 here)
    assert report.model["eligible_layers"] == 3 and report.model["changed_layers"] >= 2  # both convs
    assert any("3 Identity node(s) that only renamed a constant" in n for n in report.notes)
    onnx.checker.check_model(out)


def _computed_bias_model():
    """A Conv whose bias is a second graph input (computed, not a constant)."""
    g = GraphBuilder(3)
    h = g.node("Relu", [g.node("Conv", ["x", g.const(g.weights(16, 3, 3, 3), "W"), "b"], pads=[1, 1, 1, 1])])
    h = g.node("Relu", [g.conv(h, 16, 16)])
    y = g.gemm(g.node("Flatten", [g.node("GlobalAveragePool", [h])]), 16, 10)
    graph = helper.make_graph(g.nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8]),
                                             helper.make_tensor_value_info("b", TensorProto.FLOAT, [16])],
                              [helper.make_tensor_value_info(y, TensorProto.FLOAT, ["N", 10])], g.inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_a_computed_conv_bias_is_kept_with_a_reason(variant):
    out, report = compress(_computed_bias_model(), VARIANTS[variant])
    assert report.verify["max_rel_l2"] < 0.1
    first = next(l for l in report.layers if l.get("weight") == "W1")
    if variant in ("split all", "portable"):
        assert first["split"]["decision"] == "kept" and any("is computed" in r for r in first["reasons"])
        assert sum(n.op_type == "Conv" for n in out.graph.node) >= 1
    assert any("adds a computed bias" in str(g) for g in report.merge_groups or [])


def test_verification_gate_fails_without_writing_the_model(tmp_path, capsys):
    src, out, rep = tmp_path / "in.onnx", tmp_path / "out.onnx", tmp_path / "r.json"
    onnx.save(conv_bn_relu_gemm(c=16), str(src))
    args = ["compress", str(src), "-o", str(out), "--report", str(rep), "-q", "--steps", "hash", "--weight-error", "0.5"]
    assert main(args + ["--max-rel-l2", "0.05"]) == 3
    err = capsys.readouterr().err.strip()
    assert err.startswith("redpp-onnx: error: max relative L2") and "was not written" in err and "\n" not in err
    assert not out.exists() and json.loads(rep.read_text())["verify"]["max_rel_l2"] > 0.05
    assert main(args) == 0 and out.exists()  # no gate: written, with a warning in the report
    assert any(n.startswith("WARNING: the outputs differ") for n in json.loads(rep.read_text())["notes"])
    out.unlink()
    assert main(["compress", str(src), "-o", str(out), "-q", "--max-rel-l2", "0.05"]) == 0 and out.exists()
    assert main(["compress", str(src), "-o", str(out), "-q", "--force", "--no-verify", "--max-rel-l2", "0.1"]) == 2


def test_codebook_that_would_grow_the_file_is_not_written():
    """One small layer (320 weights, 35 values): the decoder costs more than its codes save."""
    g = GraphBuilder(4)
    y = g.gemm("x", 20, 16)
    model = g.model(["N", 20], y)
    cfg = HashConfig(weight_error=0.05)
    plain, _ = compress(model, CompressConfig(steps=("hash",), hash=cfg, verify=False))
    packed, report = compress(model, CompressConfig(steps=("hash",), hash=cfg, codebook=True, verify=False))
    assert report.model["codebook_layers"] == 0 and packed.ByteSize() == plain.ByteSize()
    row = next(l for l in report.layers if l.get("eligible"))
    assert row["method"] == "kde" and any("would make the file" in r for r in row["reasons"])


# --------------------------------------------------------------------------- dynamic input sizes

def _dynamic_hw_model(path=None):
    g = GraphBuilder(5)
    h = g.node("Relu", [g.conv("x", 3, 16)])
    h = g.node("Relu", [g.conv(h, 16, 16)])
    y = g.gemm(g.node("Flatten", [g.node("GlobalAveragePool", [h])]), 16, 10)
    model = g.model(["N", 3, "H", "W"], y)
    if path is not None:
        onnx.save(model, str(path))
    return model


def test_static_shapes_leave_dynamic_sizes_unknown_unless_given():
    from redpp_onnx.analysis.layers import input_shapes, scan_layers, static_shapes

    model = _dynamic_hw_model()
    conv_out = model.graph.node[0].output[0]
    assert conv_out not in static_shapes(model)  # not counted at a made-up 1x1 size
    assert all(l.macs is None for l in scan_layers(model).layers if l.op_type == "Conv")
    with input_shapes({"x": (1, 3, 8, 8)}):
        assert static_shapes(model)[conv_out] == (1, 16, 8, 8)
        macs = [l.macs for l in scan_layers(model).layers]
    assert macs[:2] == [16 * 3 * 9 * 64, 16 * 16 * 9 * 64]


def test_dynamic_sizes_are_verified_at_a_guess_and_said_so(tmp_path):
    src, out, rep = tmp_path / "in.onnx", tmp_path / "out.onnx", tmp_path / "r.json"
    _dynamic_hw_model(src)
    assert main(["compress", str(src), "-o", str(out), "--report", str(rep), "-q"]) == 0
    report = json.loads(rep.read_text())
    assert report["verify"]["input_shapes"] == {"x": [2, 3, 64, 64]} and report["verify"]["guessed_dims"] == ["x"]
    assert report["model"]["macs_before"] is None
    assert any("--input-shape" in n and "were guessed (64" in n for n in report["notes"])
    assert main(["compress", str(src), "-o", str(out), "--report", str(rep), "-q", "--force",
                 "--input-shape", "x=1,3,8,8"]) == 0
    report = json.loads(rep.read_text())
    assert report["verify"]["input_shapes"] == {"x": [1, 3, 8, 8]} and report["verify"]["guessed_dims"] == []
    assert report["model"]["macs_before"] == (16 * 3 * 9 + 16 * 16 * 9) * 64 + 160
    assert not any("--input-shape" in n for n in report["notes"])
    # NAME= may be left out for a single-input model
    assert main(["compress", str(src), "-o", str(out), "-q", "--force", "--input-shape", "1,3,8,8"]) == 0


@pytest.mark.parametrize("spec,fragment", [("y=1,3,8,8", "no input of that name"),
                                           ("x=1,3,8", "3 dimensions given, the input has 4"),
                                           ("x=1,4,8,8", "axis 1 is fixed to 3"),
                                           ("x=1,3,a,8", "expected NAME=D0,D1"),
                                           ("x=1,3,0,8", "whole numbers >= 1")])
def test_bad_input_shapes_are_user_errors(spec, fragment, tmp_path, capsys):
    src, out = tmp_path / "in.onnx", tmp_path / "out.onnx"
    _dynamic_hw_model(src)
    for args in (["compress", str(src), "-o", str(out), "-q"], ["analyze", str(src)]):
        assert main(args + ["--input-shape", spec]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("redpp-onnx: error:") and fragment in err and "\n" not in err and not out.exists()


def test_a_guess_the_model_rejects_skips_verification_with_the_hint():
    """A dynamic axis the graph then reshapes to a fixed size (a traced export): the guessed 64
    does not run; compress still succeeds, and the report says how to verify."""
    g = GraphBuilder(6)
    h = g.node("Reshape", ["x", g.const(np.array([-1, 12 * 8], np.int64), "shape")])
    y = g.gemm(h, 96, 4)
    model = g.model(["N", "T", 8], y)
    out, report = compress(model, CompressConfig())
    skipped = report.verify["skipped"]
    assert "does not run on the verification inputs x [2, 64, 8]" in skipped and "--input-shape" in skipped
    _, report = compress(model, CompressConfig(input_shapes={"x": (2, 12, 8)}))
    assert report.verify["max_rel_l2"] < 0.1
