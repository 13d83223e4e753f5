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
    assert "SplitConv" not in ops and ops.count("OneHot") == 2 and "ScatterND" not in ops
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


# --portable (issue 10, item 8): what the standard-op form stores and computes, and where it is refused

def _portable_model(opset=17, act="Relu", seed=11):
    """x -> Conv 3x3 (8->16, 3 kernels per input channel: worth emitting) -> BN -> act
    -> Conv 1x1 (16->16, 3 values per input channel: the selection matrix outweighs it)
    -> Conv 3x3 (16->16, no sharing) -> GAP -> Flatten -> Gemm, at the given opset."""
    from onnx import TensorProto, helper

    g = GraphBuilder(seed)
    h = g.conv("x", 8, 16)
    _shared_kernels(g, g.nodes[-1].input[1])
    h = g.bn(h, 16)
    if act == "Relu":
        h = g.node("Relu", [h])
    elif opset < 11:  # Clip-6: bounds are attributes
        h = g.node("Clip", [h], min=0.0, max=1.5)
    else:
        h = g.node("Clip", [h, g.const(np.array(0, np.float32)), g.const(np.array(1.5, np.float32))])
    h = g.conv(h, 16, 16, k=1)
    _shared_kernels(g, g.nodes[-1].input[1], zero_share=0.0)
    h = g.conv(h, 16, 16)
    y = g.gemm(g.node("Flatten", [g.node("GlobalAveragePool", [h])]), 16, 10)
    graph = helper.make_graph(g.nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8, 11, 13])],
                              [helper.make_tensor_value_info(y, TensorProto.FLOAT, ["N", 10])], g.inits)
    model = onnx.helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=7)
    onnx.checker.check_model(model, full_check=True)
    return model


def _convs(result):
    return [l for l in result.layers if l.decision != "counted"]


def test_portable_refuses_layers_whose_selection_outweighs_the_dense_conv():
    model = _portable_model()
    result = SplitPass(SplitConfig(mode="all", portable=True)).run(model)
    first, pointwise, dense = _convs(result)
    assert [l.decision for l in (first, pointwise, dense)] == ["split", "kept", "kept"]
    for layer in (pointwise, dense):  # the reason and its numbers, in the row; the layer stays a Conv
        (reason,) = [r for r in layer.reasons if r.startswith("kept as Conv: --portable")]
        cost = layer.portable
        assert f"store {cost['kernel_floats'] + cost['selection_floats']:,} floats" in reason
        assert f"selection matrix {cost['selection_floats']:,} = {cost['selection_bytes']:,} bytes" in reason
        assert f"> {layer.params_before:,} dense weights" in reason and "MACs" in reason
    assert pointwise.portable["k"] == 3 and dense.portable["k"] == 16
    ops = _ops(result.model)
    assert ops.count("Conv") == 2 + 2 and ops.count("OneHot") == 1 and "ScatterND" not in ops
    onnx.checker.check_model(result.model, full_check=True)
    assert _rel(_run(result.model, X, plain=True), _run(model, X, plain=True)) <= TOL


def test_portable_rows_count_what_the_emitted_graph_stores_and_computes():
    model = _portable_model()
    result = SplitPass(SplitConfig(mode="all", portable=True)).run(model)
    row = _convs(result)[0]
    c_out, c_in, taps, pixels = 16, 8, 9, 11 * 13
    k = row.portable["k"]
    assert k == 3
    kernel_floats, selection_floats = c_in * k * taps, c_out * c_in * k
    assert row.params_after == kernel_floats + selection_floats < row.params_before == c_out * c_in * taps
    assert row.products == (kernel_floats + selection_floats) * pixels and row.additions == 0
    assert row.portable["selection_bytes"] == 4 * selection_floats
    assert row.portable["macs_selection"] == selection_floats * pixels
    # the emitted tensors are those counted: the grouped kernels, and an index whose OneHot is C_out x C_in x k
    inits = {t.name: nh.to_array(t) for t in result.model.graph.initializer}
    base = f"{row.weight}__portable"
    assert inits[f"{base}_kernels"].size == kernel_floats
    assert inits[f"{base}_index"].shape == (c_out, c_in) and inits[f"{base}_depth"].tolist() == [k]
    assert row.index_bytes >= inits[f"{base}_index"].nbytes
    assert any(r.startswith("portable: stores") for r in row.reasons)


def test_portable_report_rows_carry_the_portable_numbers():
    from redpp_onnx.compress import compress
    from redpp_onnx.config import CompressConfig

    _, report = compress(_portable_model(), CompressConfig(steps=("split",), split=SplitConfig(mode="all", portable=True)))
    rows = [l for l in report.layers if l.get("split", {}).get("decision") in ("split", "kept")]
    assert [l["split"]["decision"] for l in rows] == ["split", "kept", "kept"]
    assert rows[0]["split"]["params_after"] == 8 * 3 * 9 + 16 * 8 * 3
    assert all(any(r.startswith("kept as Conv: --portable would store") for r in l["reasons"]) for l in rows[1:])
    assert report.model["params_after"] == report.model["params_before"] - (16 * 8 * 9 - (8 * 3 * 9 + 16 * 8 * 3))


@pytest.mark.parametrize("opset", [9, 10, 13])
@pytest.mark.parametrize("act", ["Relu", "Clip"])
def test_portable_runs_at_opsets_before_11(opset, act):
    """The selection matrix is built with OneHot (opset 9), the Clip with the opset's own form."""
    model = _portable_model(opset, act)
    result = SplitPass(SplitConfig(mode="all", portable=True)).run(model)
    assert [l.decision for l in _convs(result)] == ["split", "kept", "kept"]
    assert result.layers[0].fused == ["BatchNormalization", act]
    assert result.model.opset_import[0].version == opset
    onnx.checker.check_model(result.model, full_check=True)
    assert _rel(_run(result.model, X, plain=True), _run(model, X, plain=True)) <= TOL


def test_portable_below_opset_9_keeps_every_conv_with_the_reason():
    model = _portable_model(8)
    result = SplitPass(SplitConfig(mode="all", portable=True)).run(model)
    assert all(l.decision == "kept" for l in _convs(result)) and _ops(result.model) == _ops(model)
    assert all("--portable needs opset >= 9" in " ".join(l.reasons) and "opset 8" in " ".join(l.reasons)
               for l in _convs(result))


def test_clip_with_attribute_bounds_is_fused_with_its_bounds():
    """Clip-6 (opset < 11) carries min/max as attributes: SplitConv's fused activation keeps them."""
    model = _portable_model(10, "Clip")
    result = SplitPass(SplitConfig(mode="all")).run(model)
    assert result.layers[0].fused == ["BatchNormalization", "Clip"]
    node = next(n for n in result.model.graph.node if n.op_type == "SplitConv")
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    assert attrs["clip_min"] == 0.0 and attrs["clip_max"] == 1.5
    assert _rel(_run(result.model, X), _run(model, X, plain=True)) <= TOL


def test_portable_index_widens_past_127_kernels_per_channel():
    """The index stores k for a zero kernel: k = 128 no longer fits int8."""
    from redpp_onnx.ops import packing
    from redpp_onnx.passes.split import _portable_layout, portable_cost

    w = np.arange(129, dtype=np.float32).reshape(129, 1, 1, 1)  # 129 outputs, 1 input channel:
    # a zero kernel (output 0) and 128 unique non-zero ones
    split = packing.pack(w)
    k, sel = _portable_layout(split)
    assert k == 128 and sel.dtype == np.int16 and sel[0, 0] == k and sel.max() == k
    assert portable_cost(split, None).macs is None
