"""MAC counts follow the shapes given with --input-shape through the graph; a shape that stays
unknown gives MACs None ("unknown" in the tables), never a count made as if a dimension were 1."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from onnx import numpy_helper as nh

from redpp_onnx.analysis import layers as layers_mod
from redpp_onnx.analysis.layers import input_shapes, scan_layers, static_shapes
from redpp_onnx.cli import main

D, VOCAB, SEQ = 8, 20, 64


def _model(nodes, inputs, outputs, inits) -> onnx.ModelProto:
    g = helper.make_graph(nodes, "g", inputs, outputs, [nh.from_array(a, n) for n, a in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(m)
    return m


def transformer_ffn(d: int = D) -> onnx.ModelProto:
    """ids [batch, seq] -> Gather (embedding) -> MatMul [d, 4d] -> Relu -> MatMul [4d, d]."""
    rng = np.random.default_rng(0)
    inits = {"emb": rng.standard_normal((VOCAB, d)).astype(np.float32),
             "W1": (rng.standard_normal((d, 4 * d)) / np.sqrt(d)).astype(np.float32),
             "W2": (rng.standard_normal((4 * d, d)) / np.sqrt(4 * d)).astype(np.float32)}
    nodes = [helper.make_node("Gather", ["emb", "x"], ["e"], name="embed"),
             helper.make_node("MatMul", ["e", "W1"], ["h"], name="fc1"),
             helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("MatMul", ["r", "W2"], ["y"], name="fc2")]
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.INT64, ["batch", "seq"])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", d])], inits)


def three_d_linear(d: int = D, n: int = 12) -> onnx.ModelProto:
    """x [B, S, d]: a MatMul on the 3-D tensor; a Gemm on it flattened to [B*S, d] and reshaped
    back (how torch.export lowers nn.Linear); a MatMul on its seq-first transpose [S, B, d] (how
    nn.MultiheadAttention projects)."""
    rng = np.random.default_rng(1)
    inits = {"Wm": rng.standard_normal((d, n)).astype(np.float32),
             "Wg": rng.standard_normal((n, d)).astype(np.float32),   # transB=1: [out, in]
             "bg": rng.standard_normal(n).astype(np.float32),
             "Wt": rng.standard_normal((d, n)).astype(np.float32),
             "flat": np.array([-1, d], np.int64), "n": np.array([n], np.int64)}
    nodes = [helper.make_node("MatMul", ["x", "Wm"], ["ym"], name="matmul3d"),
             helper.make_node("Reshape", ["x", "flat"], ["x2"], name="flatten"),
             helper.make_node("Gemm", ["x2", "Wg", "bg"], ["g2"], name="gemm", transB=1),
             helper.make_node("Shape", ["x"], ["xs"], name="shape", start=0, end=2),
             helper.make_node("Concat", ["xs", "n"], ["gs"], name="concat", axis=0),
             helper.make_node("Reshape", ["g2", "gs"], ["yg"], name="unflatten"),
             helper.make_node("Transpose", ["x"], ["xt"], name="seq_first", perm=[1, 0, 2]),
             helper.make_node("MatMul", ["xt", "Wt"], ["yt"], name="matmul_seq_first"),
             helper.make_node("Transpose", ["yt"], ["ytt"], name="batch_first", perm=[1, 0, 2]),
             helper.make_node("Add", ["ym", "yg"], ["s"], name="add1"),
             helper.make_node("Add", ["s", "ytt"], ["y"], name="add2")]
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", "S", d])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["B", "S", n])], inits)


def _macs(model, shapes=None) -> dict:
    with input_shapes(shapes):
        return {l.node: l.macs for l in scan_layers(model).layers}


# --------------------------------------------------------------------------- the layer scan

def test_matmul_macs_follow_the_given_sequence_length():
    macs = _macs(transformer_ffn(), {"x": (1, SEQ)})
    assert macs == {"fc1": SEQ * D * 4 * D, "fc2": SEQ * 4 * D * D}


def test_macs_are_per_sample_whatever_batch_is_given():
    assert _macs(transformer_ffn(), {"x": (3, SEQ)}) == {"fc1": SEQ * D * 4 * D, "fc2": SEQ * 4 * D * D}


def test_macs_of_a_dynamic_sequence_are_unknown_not_one_row():
    assert _macs(transformer_ffn()) == {"fc1": None, "fc2": None}


@pytest.mark.parametrize("batch", [1, 2])
def test_gemm_and_matmul_on_3d_activations_count_every_position(batch):
    n, s = 12, 16
    macs = _macs(three_d_linear(n=n), {"x": (batch, s, D)})
    assert macs == {"matmul3d": s * D * n, "gemm": s * D * n, "matmul_seq_first": s * D * n}


def test_gemm_and_matmul_on_3d_activations_without_shapes_are_unknown():
    assert set(_macs(three_d_linear()).values()) == {None}


def test_a_gemm_after_flatten_is_one_row_per_sample():
    """A CNN head: [N, C] -> Gemm, one row per sample at any batch given."""
    from ..graphs import conv_bn_relu_gemm

    model = conv_bn_relu_gemm(c=8)
    gemm = next(l.node for l in scan_layers(model).layers if l.op_type == "Gemm")
    for shapes in (None, {"x": (4, 3, 8, 8)}):
        assert _macs(model, shapes)[gemm] == 8 * 10


def test_shapes_of_the_first_inference_survive_a_failing_data_propagation(monkeypatch):
    real = onnx.shape_inference.infer_shapes

    def infer(m, *args, **kwargs):
        if kwargs.get("data_prop"):
            raise RuntimeError("data propagation failed")
        return real(m, *args, **kwargs)

    monkeypatch.setattr(layers_mod.onnx.shape_inference, "infer_shapes", infer)
    with input_shapes({"x": (1, SEQ)}):
        assert static_shapes(transformer_ffn())["h"] == (1, SEQ, 4 * D)


# --------------------------------------------------------------------------- the commands

def _save(tmp_path, model):
    path = tmp_path / "t.onnx"
    onnx.save(model, str(path))
    return path


def _summary_row(table: str, label: str) -> list:
    row = next(line for line in table.splitlines() if line.startswith(label))
    return row[len(label):].split()


def test_compress_reports_the_macs_at_the_given_shape(tmp_path, capsys):
    src, rep = _save(tmp_path, transformer_ffn()), tmp_path / "r.json"
    assert main(["compress", str(src), "-o", str(tmp_path / "o.onnx"), "--report", str(rep), "--no-verify",
                 "--input-shape", f"x=1,{SEQ}"]) == 0
    report = json.loads(rep.read_text())
    total = 2 * SEQ * D * 4 * D
    assert report["model"]["macs_before"] == report["model"]["macs_after"] == total
    assert [l["macs"] for l in report["layers"] if l["eligible"]] == [0, total // 2, total // 2]  # the table: a lookup
    assert _summary_row(capsys.readouterr().out, "MACs (eligible, 1 sample)")[:2] == [f"{total:,}"] * 2


def test_compress_says_unknown_when_a_dynamic_dim_is_not_given(tmp_path, capsys):
    src, rep = _save(tmp_path, transformer_ffn()), tmp_path / "r.json"
    assert main(["compress", str(src), "-o", str(tmp_path / "o.onnx"), "--report", str(rep), "--no-verify"]) == 0
    report = json.loads(rep.read_text())
    assert report["model"]["macs_before"] is None and report["model"]["macs_after"] is None
    assert [l["macs"] for l in report["layers"] if l["eligible"]] == [0, None, None]  # a lookup: 0 at any shape
    table = capsys.readouterr().out
    assert _summary_row(table, "MACs (eligible, 1 sample)")[:2] == ["unknown", "unknown"]
    assert "--input-shape" in table


def test_analyze_reports_the_macs(tmp_path, capsys):
    src = _save(tmp_path, transformer_ffn())
    assert main(["analyze", str(src), "--json", "--input-shape", f"x=1,{SEQ}"]) == 0
    layers = json.loads(capsys.readouterr().out)["layers"]
    assert [l["macs"] for l in layers] == [SEQ * D * 4 * D, SEQ * 4 * D * D]
    assert main(["analyze", str(src), "--input-shape", f"x=1,{SEQ}"]) == 0
    assert f"{2 * SEQ * D * 4 * D:,}" in next(l for l in capsys.readouterr().out.splitlines() if "MACs" in l)
    assert main(["analyze", str(src), "--json"]) == 0
    assert [l["macs"] for l in json.loads(capsys.readouterr().out)["layers"]] == [None, None]
    assert main(["analyze", str(src)]) == 0
    line = next(l for l in capsys.readouterr().out.splitlines() if "MACs" in l)
    assert "unknown" in line and "--input-shape" in line



def _computed_pad_model(computed: bool) -> onnx.ModelProto:
    """x [N, 8, 8, 8] -> Pad (4 zero channels before and after) -> Conv 16 -> 16, 3x3. With ``computed``
    the pads come from constants through ConstantOfShape, Concat, Reshape and Cast, as in the TorchScript
    exporter's F.pad: shape inference alone does not see them, so the Conv's input shape and MACs stay
    unknown unless the pads are evaluated."""
    rng = np.random.default_rng(0)
    inits = {"w": rng.standard_normal((16, 16, 3, 3)).astype(np.float32)}
    if computed:
        inits.update(half=np.array([0, 4], np.float32), n_zeros=np.array([2], np.int64), shape=np.array([8], np.int64))
        nodes = [helper.make_node("ConstantOfShape", ["n_zeros"], ["zeros"], value=nh.from_array(np.zeros(1, np.float32))),
                 helper.make_node("Concat", ["half", "zeros", "half", "zeros"], ["cat"], axis=0),
                 helper.make_node("Reshape", ["cat", "shape"], ["flat"]),
                 helper.make_node("Cast", ["flat"], ["pads"], to=TensorProto.INT64)]
    else:
        inits["pads"] = np.array([0, 4, 0, 0, 0, 4, 0, 0], np.int64)
        nodes = []
    nodes += [helper.make_node("Pad", ["x", "pads"], ["p"]),
              helper.make_node("Conv", ["p", "w"], ["y"], pads=[1, 1, 1, 1])]
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8, 8, 8])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 16, 8, 8])], inits)


def test_pads_computed_from_constants_give_the_macs_after_them():
    conv_macs = 16 * 16 * 9 * 8 * 8
    assert [l.macs for l in scan_layers(_computed_pad_model(False)).layers] == [conv_macs]
    model = _computed_pad_model(True)
    before = model.SerializeToString()
    assert static_shapes(model)["p"] == (1, 16, 8, 8)
    assert [l.macs for l in scan_layers(model).layers] == [conv_macs]
    assert model.SerializeToString() == before  # an analysis: the graph is not changed


def test_pads_that_cannot_be_evaluated_leave_the_macs_unknown(monkeypatch):
    monkeypatch.setattr(layers_mod, "computed_arguments", lambda model: {})
    assert [l.macs for l in scan_layers(_computed_pad_model(True)).layers] == [None]
