"""The merge pass (step 2) on small graphs with deliberately duplicated channels.

Every graph copies some output channels (weight rows, bias, BatchNorm parameters, depthwise
kernels...) so that an exact number of merges MUST happen, and plants near-misses (a channel
equal in one producer of a coupled group but not in the other, equal weights but different BN)
that must NOT merge. With α = 0 the merged model must compute what the input model computes.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import numpy_helper as nh

import redpp_onnx
from redpp_onnx import io
from redpp_onnx.analysis.coupling import GROUP_OP_TYPES, CONSUMER, analyze_coupling
from redpp_onnx.analysis.layers import ConstantTensors
from redpp_onnx.errors import RedppError
from redpp_onnx.passes.editors import REGISTRY, ChannelEdit, fold_along, reduce_along
from redpp_onnx.passes.merge import MergeConfig, MergePass

from ..graphs import GraphBuilder

SPATIAL = 6


# ---------------------------------------------------------------------- graph builders

class DupBuilder(GraphBuilder):
    """GraphBuilder whose layers can copy channels: ``dup=[(src, dst), ...]`` sets channel dst = src."""

    def last(self) -> str:
        return self.nodes[-1].name

    def conv_d(self, x, c_in, c_out, k=3, dup=(), group=1, bias=True, stride=1, tag=None):
        w = self.weights(c_out, c_in // group, k, k)
        b = self.weights(c_out, scale=0.1)
        for src, dst in dup:
            w[dst], b[dst] = w[src], b[src]
        inputs = [x, self.const(w, "W")] + ([self.const(b, "B")] if bias else [])
        y = self.node("Conv", inputs, group=group, pads=[k // 2] * 4, strides=[stride] * 2)
        if tag is not None:
            tag[self.nodes[-1].name] = self.nodes[-1]
        return y

    def bn_d(self, x, c, dup=()):
        vals = [self.rng.uniform(0.5, 1.5, c), self.rng.normal(0, 0.1, c), self.rng.normal(0, 0.1, c),
                self.rng.uniform(0.5, 1.5, c)]
        for v in vals:
            for src, dst in dup:
                v[dst] = v[src]
        return self.node("BatchNormalization", [x] + [self.const(v.astype(np.float32), "bn") for v in vals])

    def head(self, x, c, n_out=5):
        """GAP -> Flatten -> Gemm: the logits (a graph output, so that group is blocked)."""
        return self.gemm(self.node("Flatten", [self.node("GlobalAveragePool", [x])]), c, n_out)


def _act(g: DupBuilder, x, kind: str, c: int, dup=()):
    if kind == "Relu":
        return g.node("Relu", [x])
    if kind == "Clip":  # ReLU6
        return g.node("Clip", [x, g.const(np.float32(0.0)), g.const(np.float32(6.0))])
    if kind == "LeakyRelu":
        return g.node("LeakyRelu", [x], alpha=0.1)
    if kind == "Silu":  # x * Sigmoid(x)
        return g.node("Mul", [x, g.node("Sigmoid", [x])])
    if kind == "PRelu":
        slope = g.rng.uniform(0.05, 0.3, (c, 1, 1)).astype(np.float32)
        for src, dst in dup:
            slope[dst] = slope[src]
        return g.node("PRelu", [x, g.const(slope, "slope")])
    if kind == "ScaleShift":  # per-channel Mul then Add by constants
        s = g.rng.uniform(0.5, 2, (1, c, 1, 1)).astype(np.float32)
        t = g.rng.normal(0, 0.1, (c, 1, 1)).astype(np.float32)
        for src, dst in dup:
            s[0, dst], t[dst] = s[0, src], t[src]
        return g.node("Relu", [g.node("Add", [g.node("Mul", [x, g.const(s, "s")]), g.const(t, "t")])])
    raise ValueError(kind)


def conv_bn_act_conv(act="Relu", k=3, bias=True, seed=0):
    """x -> conv1 (3->8) -> BN -> act -> conv2 (8->6) -> GAP -> Flatten -> Gemm.

    conv1: channel 3 = 0, channels 5 and 6 = 1 (3 merges); channel 7 copies 2's weights but not
    its BN (no merge)."""
    g = DupBuilder(seed)
    dup = [(0, 3), (1, 5), (1, 6)]
    h = g.conv_d("x", 3, 8, k=k, dup=dup + [(2, 7)], bias=bias)
    conv1 = g.last()
    h = _act(g, g.bn_d(h, 8, dup=dup), act, 8, dup=dup)
    h = g.conv_d(h, 8, 6, k=k)
    conv2 = g.last()
    return g.model(["N", 3, SPATIAL, SPATIAL], g.head(h, 6)), {"conv1": conv1, "conv2": conv2, "merged": 3}


def residual_block(projection: bool, seed=1):
    """x -> conv0 (3->8) -> BN -> Relu = t;  t -> conva -> BN -> Relu -> convb -> BN (+ t or
    + BN(convp(t))) -> Relu -> conv (8->6) -> head.

    inner group (conva): 2 merges (3 in all). Identity: the trunk couples conv0 and convb: channel 4 = 0 in
    both (1 merge); 5 = 1 in conv0 only (no merge). Projection: conv0's group is alone (1 merge:
    6 = 2; conva and convp fold), the sum couples convb and convp: 6 = 2 in both (1 merge), 7 = 3 in
    convb only (no merge): 4 in all."""
    g = DupBuilder(seed)
    tag = {}
    if projection:
        t = g.node("Relu", [g.bn_d(g.conv_d("x", 3, 8, dup=[(2, 6)], tag=tag), 8, dup=[(2, 6)])])
        a = g.node("Relu", [g.bn_d(g.conv_d(t, 8, 8, dup=[(0, 3), (1, 2)], tag=tag), 8, dup=[(0, 3), (1, 2)])])
        b = g.bn_d(g.conv_d(a, 8, 8, dup=[(2, 6), (3, 7)], tag=tag), 8, dup=[(2, 6), (3, 7)])
        p = g.bn_d(g.conv_d(t, 8, 8, k=1, dup=[(2, 6)], tag=tag), 8, dup=[(2, 6)])
        s = g.node("Add", [b, p])
    else:
        t = g.node("Relu", [g.bn_d(g.conv_d("x", 3, 8, dup=[(0, 4), (1, 5)], tag=tag), 8, dup=[(0, 4), (1, 5)])])
        a = g.node("Relu", [g.bn_d(g.conv_d(t, 8, 8, dup=[(0, 3), (1, 2)], tag=tag), 8, dup=[(0, 3), (1, 2)])])
        b = g.bn_d(g.conv_d(a, 8, 8, dup=[(0, 4)], tag=tag), 8, dup=[(0, 4)])
        s = g.node("Add", [b, t])
    y = g.conv_d(g.node("Relu", [s]), 8, 6, tag=tag)
    names = list(tag)
    return g.model(["N", 3, SPATIAL, SPATIAL], g.head(y, 6)), {"convs": names, "merged": 4 if projection else 3}


def concat_branches(seed=2):
    """x -> convA (3->6) -> Relu ; x -> convB (3->4) -> Relu ; Concat(axis=1) -> convC (10->5) -> head.

    A: 2 = 0 (1 merge); B: 3 = 1 (1 merge); B's channel 0 equals A's channel 1 (weights, bias): a
    cross-branch pair that must NOT merge (different buckets)."""
    g = DupBuilder(seed)
    a = g.conv_d("x", 3, 6, dup=[(0, 2)])
    wa = ConstantTensorsOf(g)
    b = g.conv_d("x", 3, 4, dup=[(1, 3)])
    # B channel 0 := A channel 1
    g.inits[-2] = nh.from_array(_set_row(nh.to_array(g.inits[-2]), 0, wa["W"][1]), g.inits[-2].name)
    g.inits[-1] = nh.from_array(_set_row(nh.to_array(g.inits[-1]), 0, wa["B"][1]), g.inits[-1].name)
    c = g.node("Concat", [g.node("Relu", [a]), g.node("Relu", [b])], axis=1)
    y = g.conv_d(c, 10, 5)
    return g.model(["N", 3, SPATIAL, SPATIAL], g.head(y, 5)), {"merged": 2}


def ConstantTensorsOf(g):
    """The last conv's weight and bias arrays (by role) in a builder."""
    return {"W": nh.to_array(g.inits[-2]), "B": nh.to_array(g.inits[-1])}


def _set_row(arr, k, row):
    arr = arr.copy()
    arr[k] = row
    return arr


def split_branches(seed=3):
    """x -> conv (3->8) -> BN -> Split([5, 3]) -> convP (5->4), convQ (3->4) -> Add -> head.

    first part: 2 = 0 (1 merge); second part: 7 = 5 (1 merge); 6 = 1 across the split: no merge."""
    g = DupBuilder(seed)
    dup = [(0, 2), (5, 7), (1, 6)]
    h = g.bn_d(g.conv_d("x", 3, 8, dup=dup), 8, dup=dup)
    p, q = g.node("Split", [h, g.const(np.array([5, 3], np.int64), "split")], n_out=2, axis=1)
    y = g.node("Add", [g.conv_d(p, 5, 4), g.conv_d(q, 3, 4)])
    return g.model(["N", 3, SPATIAL, SPATIAL], g.head(y, 4)), {"merged": 2}


def conv_flatten_linear(consumer="gemm_t", flatten="Flatten", seed=4):
    """x -> conv (3->6) -> Relu -> Flatten/Reshape -> Gemm/MatMul (6*6*6 -> 5): 2 merges (4 = 0, 5 = 1)."""
    g = DupBuilder(seed)
    h = g.node("Relu", [g.conv_d("x", 3, 6, dup=[(0, 4), (1, 5)])])
    feats = 6 * SPATIAL * SPATIAL
    if flatten == "Flatten":
        f = g.node("Flatten", [h])
    else:
        f = g.node("Reshape", [h, g.const(np.array([-1, feats], np.int64), "shape")])
    if consumer == "matmul":
        y = g.node("Add", [g.node("MatMul", [f, g.const(g.weights(feats, 5), "M")]), g.const(g.weights(5), "b")])
    else:
        y = g.gemm(f, feats, 5, trans_b=consumer == "gemm_t")
    return g.model(["N", 3, SPATIAL, SPATIAL], y), {"merged": 2, "features": feats}


def conv_gap_gemm(seed=5):
    """x -> conv (3->6) -> BN -> Relu -> GAP -> Flatten -> Gemm: 2 merges (3 = 0, 5 = 0)."""
    g = DupBuilder(seed)
    dup = [(0, 3), (0, 5)]
    h = g.node("Relu", [g.bn_d(g.conv_d("x", 3, 6, dup=dup), 6, dup=dup)])
    return g.model(["N", 3, SPATIAL, SPATIAL], g.head(h, 6)), {"merged": 2}


def inverted_residual(seed=6):
    """MobileNet-style: conv0 (3->8) -> BN = t; t -> 1x1 expand (8->16) -> BN -> ReLU6 -> depthwise
    3x3 -> BN -> ReLU6 -> 1x1 project (16->8) -> BN; + t -> conv (8->6) -> head.

    expand group: 5 = 0, 9 = 2, 11 = 2 (expand rows, BN, depthwise kernel and bias, BN): 3 merges;
    7 = 3 in expand and its BN but not in the depthwise kernel: no merge.
    trunk (conv0 and project): 6 = 1 in both: 1 merge."""
    g = DupBuilder(seed)
    dup = [(0, 5), (2, 9), (2, 11)]
    t = g.bn_d(g.conv_d("x", 3, 8, dup=[(1, 6)]), 8, dup=[(1, 6)])
    e = _act(g, g.bn_d(g.conv_d(t, 8, 16, k=1, dup=dup + [(3, 7)]), 16, dup=dup + [(3, 7)]), "Clip", 16)
    d = _act(g, g.bn_d(g.conv_d(e, 16, 16, k=3, group=16, dup=dup), 16, dup=dup), "Clip", 16)
    dw = [n.name for n in g.nodes if n.op_type == "Conv"][-1]
    p = g.bn_d(g.conv_d(d, 16, 8, k=1, dup=[(1, 6)]), 8, dup=[(1, 6)])
    y = g.conv_d(g.node("Add", [p, t]), 8, 6)
    return g.model(["N", 3, SPATIAL, SPATIAL], g.head(y, 6)), {"merged": 4, "depthwise": dw}


def squeeze_excitation(seed=7, silu=False):
    """t = Relu(BN(conv0 (3->8))); SE: GAP(t) -> s1 (8->4, 1x1) -> Relu -> s2 (4->8, 1x1) -> Sigmoid;
    Mul(t, gate) -> conv (8->6) -> head.

    The gate couples the trunk with s2's outputs: 3 = 0 in conv0/BN and s2: 1 merge; 4 = 1 in
    conv0/BN only: no merge. s1: 2 = 0: 1 merge (s2 folds). Total 2."""
    g = DupBuilder(seed)
    trunk_dup = [(0, 3), (1, 4)]
    t = g.bn_d(g.conv_d("x", 3, 8, dup=trunk_dup), 8, dup=trunk_dup)
    t = _act(g, t, "Silu" if silu else "Relu", 8)
    s = g.node("Relu", [g.conv_d(g.node("GlobalAveragePool", [t]), 8, 4, k=1, dup=[(0, 2)])])
    gate = g.node("Sigmoid", [g.conv_d(s, 4, 8, k=1, dup=[(0, 3)])])
    y = g.conv_d(g.node("Mul", [t, gate]), 8, 6)
    return g.model(["N", 3, SPATIAL, SPATIAL], g.head(y, 6)), {"merged": 2}


def option_a_shortcut(seed=8):
    """CIFAR ResNet option-A shortcut: t (4 ch) -> conva (4->8, stride 2) -> BN -> Relu -> convb
    (8->8) -> BN; + Pad(Slice(t, ::2), 2 zero channels before and after) -> Relu -> conv -> head.

    conva: 5 = 4 (1 merge). The padded classes 0, 1, 6, 7 hold conv_b + 0: 7 = 0 in convb/BN (1
    merge, Pad becomes 2 before / 1 after); 3 = 2 in convb/BN only (t's conv0 differs): no merge."""
    g = DupBuilder(seed)
    t = g.node("Relu", [g.bn_d(g.conv_d("x", 3, 4), 4)])
    a = g.node("Relu", [g.bn_d(g.conv_d(t, 4, 8, stride=2, dup=[(4, 5)]), 8, dup=[(4, 5)])])
    dup = [(0, 7), (2, 3)]
    b = g.bn_d(g.conv_d(a, 8, 8, dup=dup), 8, dup=dup)
    sl = g.node("Slice", [t, g.const(np.array([0, 0], np.int64), "st"), g.const(np.array([2**62, 2**62], np.int64), "en"),
                          g.const(np.array([2, 3], np.int64), "ax"), g.const(np.array([2, 2], np.int64), "sp")])
    pad = g.node("Pad", [sl, g.const(np.array([0, 2, 0, 0, 0, 2, 0, 0], np.int64), "pads")])
    y = g.conv_d(g.node("Relu", [g.node("Add", [b, pad])]), 8, 6)
    return g.model(["N", 3, 8, 8], g.head(y, 6)), {"merged": 2}


GRAPHS = {
    "conv_bn_relu_conv": lambda: conv_bn_act_conv(),
    "residual_identity": lambda: residual_block(False),
    "residual_projection": lambda: residual_block(True),
    "concat": concat_branches,
    "split": split_branches,
    "conv_flatten_gemm": lambda: conv_flatten_linear("gemm_t"),
    "conv_gap_gemm": conv_gap_gemm,
    "inverted_residual_depthwise": inverted_residual,
    "squeeze_excitation": squeeze_excitation,
    "squeeze_excitation_silu": lambda: squeeze_excitation(silu=True),
    "option_a_shortcut": option_a_shortcut,
}


# ---------------------------------------------------------------------- helpers

def outputs(model, seed=0, batch=3):
    x = np.random.default_rng(seed).standard_normal((batch,) + tuple(
        d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim[1:])).astype(np.float32)
    return redpp_onnx.session(io.serialize(model)).run(None, {model.graph.input[0].name: x})[0]


def rel_l2(a_model, b_model, seeds=(0, 1, 2)) -> float:
    worst = 0.0
    for s in seeds:
        a, b = outputs(a_model, s).astype(np.float64), outputs(b_model, s).astype(np.float64)
        worst = max(worst, float(np.linalg.norm(a - b) / np.linalg.norm(a)))
    return worst


def merge(model, config=MergeConfig()):
    before = model.SerializeToString()
    result = MergePass(config).run(model)
    assert model.SerializeToString() == before  # the input is never modified
    onnx.checker.check_model(result.model, full_check=True)
    return result


# ---------------------------------------------------------------------- α = 0: exact merges

@pytest.mark.parametrize("name", list(GRAPHS))
def test_alpha0_merges_exactly_the_planted_duplicates_and_keeps_the_function(name):
    model, info = GRAPHS[name]()
    result = merge(model)
    assert result.channels_removed == info["merged"] == sum(g.merged for g in result.groups)
    assert not result.function_changed and "unchanged" in result.notes[0]
    assert result.params_after < result.params_before
    assert result.pruning_ratio == pytest.approx(1 - result.params_after / result.params_before)
    assert rel_l2(model, result.model) <= 1e-5
    # the weights really shrank: the result's stats match its tensors
    consts = ConstantTensors(result.model)
    by_name = {n.name: n for n in result.model.graph.node}
    for row in result.layers:
        w = consts.array(by_name[row.name].input[1])
        assert w.size == row.params_after


@pytest.mark.parametrize("act", ["Relu", "Clip", "LeakyRelu", "Silu", "PRelu", "ScaleShift"])
@pytest.mark.parametrize("k,bias", [(1, False), (3, True)])
def test_conv_bn_act_conv_per_channel_ops(act, k, bias):
    model, info = conv_bn_act_conv(act, k=k, bias=bias)
    result = merge(model)
    assert result.channels_removed == 3
    rows = {r.name: r for r in result.layers}
    c1, c2 = rows[info["conv1"]], rows[info["conv2"]]
    assert (c1.channels_before, c1.channels_after, c1.merged_out) == (8, 5, 3)
    assert (c2.inputs_before, c2.inputs_after, c2.folded_in) == (8, 5, 3)
    assert c1.params_removed == 3 * 3 * k * k and c2.params_removed == 6 * 3 * k * k
    # BN, bias, slope, scale/shift lost their 3 channels too
    per_channel = {"Relu": 0, "Clip": 0, "LeakyRelu": 0, "Silu": 0, "PRelu": 1, "ScaleShift": 2}[act]
    assert result.other_params_removed == 3 * (4 + per_channel + (1 if bias else 0))
    assert rel_l2(model, result.model) <= 1e-5


def test_equal_weights_with_different_batchnorm_do_not_merge():
    g = DupBuilder(11)
    h = g.node("Relu", [g.bn_d(g.conv_d("x", 3, 6, dup=[(0, 1)]), 6)])  # BN not copied
    model = g.model(["N", 3, SPATIAL, SPATIAL], g.head(h, 6))
    result = merge(model)
    assert result.channels_removed == 0
    row = [r for r in result.layers if r.op_type == "Conv"][0]
    assert row.reasons == ["no two channels have equal signatures (α^l = 0: exact equality)"]
    assert "removed no channel" in result.notes[0]


def test_residual_merge_needs_every_producer_to_agree():
    model, info = residual_block(False)
    result = merge(model)
    conv0, conva, convb, conv_out = info["convs"]
    rows = {r.name: r for r in result.layers}
    assert rows[conv0].group == rows[convb].group  # coupled by the residual Add
    assert rows[conv0].merged_out == rows[convb].merged_out == 1  # 4 = 0 in both; 5 = 1 in conv0 only
    assert rows[conva].merged_out == 2 and rows[conva].folded_in == 1
    assert rows[conv_out].folded_in == 1 and rows[convb].folded_in == 2
    trunk = [g for g in result.groups if g.id == rows[conv0].group][0]
    assert sorted(trunk.producers) == sorted([conv0, convb]) and sorted(trunk.consumers) == sorted([conva, conv_out])


def test_residual_projection_shortcut():
    model, info = residual_block(True)
    result = merge(model)
    conv0, conva, convb, convp, conv_out = info["convs"]
    rows = {r.name: r for r in result.layers}
    assert rows[convb].group == rows[convp].group != rows[conv0].group
    assert [rows[n].merged_out for n in (conv0, conva, convb, convp)] == [1, 2, 1, 1]
    assert rows[conva].folded_in == rows[convp].folded_in == 1  # both read conv0's group


def test_concat_keeps_branches_apart():
    model, _ = concat_branches()
    result = merge(model)
    convs = [r for r in result.layers if r.op_type == "Conv"]
    assert [r.merged_out for r in convs] == [1, 1, 0]
    assert convs[0].group == convs[1].group and convs[2].folded_in == 2
    assert [(b.channels, b.merged) for b in result.groups[convs[0].group].buckets] == [(6, 1), (4, 1)]


def test_split_sizes_are_rewritten():
    model, _ = split_branches()
    result = merge(model)
    split = [n for n in result.model.graph.node if n.op_type == "Split"][0]
    assert ConstantTensors(result.model).array(split.input[1]).tolist() == [4, 2]


@pytest.mark.parametrize("consumer", ["gemm_t", "gemm", "matmul"])
@pytest.mark.parametrize("flatten", ["Flatten", "Reshape"])
def test_flatten_consumer_folds_blocks_of_hw_features(consumer, flatten):
    model, info = conv_flatten_linear(consumer, flatten)
    result = merge(model)
    assert result.channels_removed == 2
    lin = [r for r in result.layers if r.op_type != "Conv"][0]
    hw = SPATIAL * SPATIAL
    assert (lin.inputs_before, lin.inputs_after) == (6, 4) and lin.params_removed == 2 * hw * 5
    if flatten == "Reshape":
        reshape = [n for n in result.model.graph.node if n.op_type == "Reshape"][0]
        assert ConstantTensors(result.model).array(reshape.input[1]).tolist() == [-1, 4 * hw]
    assert rel_l2(model, result.model) <= 1e-5


def test_depthwise_channel_goes_with_its_group():
    model, info = inverted_residual()
    result = merge(model)
    dw = [n for n in result.model.graph.node if n.name == info["depthwise"]][0]
    assert onnx.helper.get_attribute_value(dw.attribute[[a.name for a in dw.attribute].index("group")]) == 13
    assert list(ConstantTensors(result.model).proto(dw.input[1]).dims) == [13, 1, 3, 3]
    rows = [r for r in result.layers if r.op_type == "Conv"]
    assert [r.merged_out for r in rows] == [1, 3, 1, 0]  # conv0, expand, project, last conv


def test_squeeze_excitation_gate_couples_trunk_and_gate():
    model, _ = squeeze_excitation()
    result = merge(model)
    conv0, s1, s2, conv_out = [r for r in result.layers if r.op_type == "Conv"]
    assert conv0.group == s2.group and conv0.merged_out == s2.merged_out == 1
    assert s1.merged_out == 1 and s1.inputs_after == 7 and s2.inputs_after == 3
    assert conv_out.inputs_after == 7


def test_option_a_shortcut_shrinks_the_zero_padding():
    model, _ = option_a_shortcut()
    result = merge(model)
    pad = [n for n in result.model.graph.node if n.op_type == "Pad"][0]
    assert ConstantTensors(result.model).array(pad.input[1]).tolist() == [0, 2, 0, 0, 0, 1, 0, 0]
    assert rel_l2(model, result.model) <= 1e-5


def test_weights_from_constant_nodes_and_shared_bn_parameters_are_copied_on_write():
    g = DupBuilder(12)
    dup = [(0, 2)]
    h = g.conv_d("x", 3, 4, dup=dup)
    # BN parameters shared by two BN nodes on different groups: editing one must not touch the other
    params = [g.const(v.astype(np.float32), "bn") for v in (np.ones(4), np.zeros(4), np.zeros(4), np.ones(4))]
    a = g.node("BatchNormalization", [h] + params)
    b = g.node("BatchNormalization", [g.conv_d("x", 3, 4)] + params)
    w = g.weights(8, 5)
    g.nodes.append(onnx.helper.make_node("Constant", [], ["wc"], value=nh.from_array(w, "wv")))
    f = g.node("Flatten", [g.node("GlobalAveragePool", [g.node("Concat", [a, b], axis=1)])])
    y = g.node("MatMul", [f, "wc"])
    model = g.model(["N", 3, SPATIAL, SPATIAL], y)
    result = merge(model)
    assert result.channels_removed == 1
    bns = [n for n in result.model.graph.node if n.op_type == "BatchNormalization"]
    consts = ConstantTensors(result.model)
    assert [consts.array(bns[0].input[1]).shape, consts.array(bns[1].input[1]).shape] == [(3,), (4,)]
    assert consts.array("wc").shape == (7, 5)
    assert rel_l2(model, result.model) <= 1e-5


# ---------------------------------------------------------------------- refusals

def test_channel_feeding_the_graph_output_is_refused():
    g = DupBuilder(13)
    dup = [(0, 1)]
    y = g.node("Relu", [g.bn_d(g.conv_d("x", 3, 6, dup=dup), 6, dup=dup)])
    model = g.model(["N", 3, SPATIAL, SPATIAL], y)
    result = merge(model)
    assert result.channels_removed == 0
    assert result.groups[0].reasons == [f"channel feeds the graph output {y}"]
    assert result.layers[0].reasons == [f"channel feeds the graph output {y}"]
    assert result.model.SerializeToString() == model.SerializeToString()


@pytest.mark.parametrize("axis,merged", [(1, 0), (-1, 1), (2, 1)])
def test_softmax_over_channels_is_refused(axis, merged):
    g = DupBuilder(14)
    h = g.conv_d("x", 3, 6, dup=[(0, 1)])
    sm = g.node("Softmax", [h], axis=axis)
    name = g.last()
    model = g.model(["N", 3, SPATIAL, SPATIAL], g.conv_d(sm, 6, 4))
    result = merge(model)
    assert result.channels_removed == merged
    if not merged:
        assert f"output feeds Softmax over channels ({name})" in result.layers[0].reasons
    else:
        assert rel_l2(model, result.model) <= 1e-5


def test_layer_with_a_shared_initializer_is_refused():
    g = DupBuilder(15)
    h = g.node("Relu", [g.conv_d("x", 3, 4, dup=[(0, 1)])])
    g.inits.append(nh.from_array(g.weights(4, 4, 1, 1), "Wshared"))
    h = g.node("Conv", [h, "Wshared"], pads=[0] * 4)
    model = g.model(["N", 3, SPATIAL, SPATIAL], g.node("Conv", [h, "Wshared"], pads=[0] * 4))
    result = merge(model)
    assert result.channels_removed == 0
    (row,) = result.layers  # the two convs that share Wshared are not eligible layers
    assert any(r.startswith("output feeds Conv") and "weight shared by two layers" in r
               and "weight Wshared is shared with" in r for r in row.reasons)
    assert len(result.refused) == 2


@pytest.mark.parametrize("kind,text", [
    ("reshape", "Reshape that mixes channels"),
    ("reduce", "unsupported op ReduceSum on the path"),
    ("input_add", "a tensor whose channels are not tracked"),
])
def test_other_refusals_have_reasons(kind, text):
    g = DupBuilder(16)
    if kind == "reshape":
        h = g.conv_d("x", 3, 6, dup=[(0, 1)])
        y = g.node("Reshape", [h, g.const(np.array([0, 3, -1], np.int64), "shape")])
    elif kind == "reduce":
        h = g.conv_d("x", 3, 6, dup=[(0, 1)])
        y = g.node("ReduceSum", [h, g.const(np.array([1], np.int64), "axes")])
    else:
        x2 = g.node("Relu", [g.node("Add", ["x", "x"])])  # not tracked, 3 channels
        y = g.node("Add", [g.conv_d("x", 3, 3, dup=[(0, 1)]), x2])
    model = g.model(["N", 3, SPATIAL, SPATIAL], g.node("Relu", [y]))
    result = merge(model)
    assert result.channels_removed == 0
    (row,) = result.layers
    assert any(text in r for r in row.reasons)


def test_concat_of_a_tensor_with_itself_is_refused():
    g = DupBuilder(17)
    h = g.node("Relu", [g.conv_d("x", 3, 4, dup=[(0, 1)])])
    c = g.node("Concat", [h, h], axis=1)
    model = g.model(["N", 3, SPATIAL, SPATIAL], g.head(g.conv_d(c, 8, 4), 4))
    result = merge(model)
    assert result.channels_removed == 0
    assert any("coupled with each other" in r for r in result.layers[0].reasons)


# ---------------------------------------------------------------------- α > 0

def test_per_block_alpha_values():
    cfg = MergeConfig(alpha=0.3)
    assert [cfg.alpha_for(l, 9) for l in range(9)] == [0.0] * 3 + [0.3] * 4 + [0.6] * 2
    cfg = MergeConfig(alpha=0.8)
    got = [cfg.alpha_for(l, 9) for l in range(9)]
    assert got[:3] == [pytest.approx(0.6)] * 3 and got[3:7] == [0.8] * 4 and got[7:] == [1.0] * 2
    assert [MergeConfig(alpha=0.3, strategy="uniform").alpha_for(l, 9) for l in range(9)] == [0.3] * 9
    assert MergeConfig().alpha_for(8, 9) == 0.0


@pytest.mark.parametrize("bad", [dict(alpha=-0.1), dict(alpha=1.5), dict(alpha=float("nan")),
                                 dict(strategy="linear"), dict(tolerance=-1.0)])
def test_bad_config_is_a_user_error(bad):
    with pytest.raises(RedppError):
        MergeConfig(**bad)


def deep_chain(seed=20, depth=6, c=12):
    g = DupBuilder(seed)
    h, c_in = "x", 3
    for _ in range(depth):
        h = g.node("Relu", [g.bn_d(g.conv_d(h, c_in, c), c)])
        c_in = c
    return g.model(["N", 3, SPATIAL, SPATIAL], g.head(h, c))


@pytest.mark.parametrize("strategy", ["per_block", "uniform"])
def test_more_alpha_merges_more_and_changes_the_function(strategy):
    model = deep_chain()
    removed, diffs = [], []
    for alpha in (0.0, 0.05, 0.1, 0.2, 0.3, 0.5, 0.7):
        result = merge(model, MergeConfig(alpha=alpha, strategy=strategy))
        removed.append(result.channels_removed)
        diffs.append(rel_l2(model, result.model, seeds=(0,)))
        if result.channels_removed:
            assert result.function_changed and "changes the function" in result.notes[0]
            assert any(not l.exact for l in result.layers if l.merged_out)
    assert removed[0] == 0 and diffs[0] == 0.0
    assert all(a <= b for a, b in zip(removed, removed[1:])) and removed[-1] > removed[1] >= 0
    assert diffs[-1] > 1e-3


def test_barycenter_and_summed_consumer_weights():
    g = DupBuilder(21)
    w = g.weights(4, 3, 3, 3)
    w[1] = w[0] + 0.001  # the closest pair by far
    b = np.zeros(4, np.float32)
    h = g.node("Relu", [g.node("Conv", ["x", g.const(w, "W"), g.const(b, "B")], pads=[1] * 4)])
    w2 = g.weights(5, 4, 1, 1)
    y = g.node("Conv", [h, g.const(w2, "W2")], pads=[0] * 4)
    model = g.model(["N", 3, SPATIAL, SPATIAL], y)  # conv2's group feeds the output: not merged
    # uniform α just above 0: d = the smallest non-zero distance -> exactly the pair (0, 1)
    result = merge(model, MergeConfig(alpha=1e-6, strategy="uniform", rule="percentile"))
    assert result.channels_removed == 1 and result.function_changed
    consts = ConstantTensors(result.model)
    convs = [n for n in result.model.graph.node if n.op_type == "Conv"]
    new_w, new_w2 = consts.array(convs[0].input[1]), consts.array(convs[1].input[1])
    np.testing.assert_allclose(new_w[0], (w[0] + w[1]) / 2, rtol=1e-6)
    np.testing.assert_array_equal(new_w[1:], w[2:])
    np.testing.assert_allclose(new_w2[:, 0], w2[:, 0] + w2[:, 1], rtol=1e-6)
    assert rel_l2(model, result.model) < 1e-2  # close neurons: a small change


def test_tolerance_relaxes_equality():
    g = DupBuilder(22)
    w = g.weights(4, 3, 3, 3)
    w[2] = w[0] + 1e-7
    h = g.node("Relu", [g.node("Conv", ["x", g.const(w, "W")], pads=[1] * 4)])
    model = g.model(["N", 3, SPATIAL, SPATIAL], g.head(h, 4))
    assert merge(model).channels_removed == 0
    result = merge(model, MergeConfig(tolerance=1e-6))
    assert result.channels_removed == 1 and result.function_changed
    assert rel_l2(model, result.model) <= 1e-5


# ---------------------------------------------------------------------- editors

def test_editor_registry_covers_every_op_type_the_analysis_puts_in_a_group():
    for role, ops in GROUP_OP_TYPES.items():
        for op in ops:
            assert op in REGISTRY, f"no channel editor for {op}"
            fn = REGISTRY[op].fold if role == CONSUMER else REGISTRY[op].out
            assert fn is not None, f"{op} as {role} has no editor"


def test_every_op_met_in_the_test_graphs_is_declared_for_its_role():
    seen = set()
    for build in GRAPHS.values():
        for g in analyze_coupling(build()[0]).groups:
            for op in g.ops:
                seen.add((op.role, op.op_type))
                assert op.op_type in GROUP_OP_TYPES[op.role]
    assert {("per_channel", "Conv"), ("pass", "Pad"), ("pass", "Split"), ("pass", "Concat"),
            ("pass", "Mul"), ("consumer", "Gemm"), ("per_channel", "BatchNormalization")} <= seen


def test_reduce_and_fold_helpers():
    arr = np.arange(24, dtype=np.float32).reshape(2, 4, 3)
    edit = ChannelEdit(4, ((0, 2), (1,), (3,)), (False, True, True))
    out = reduce_along(arr, 1, edit)
    assert out.shape == (2, 3, 3)
    np.testing.assert_array_equal(out[:, 0], (arr[:, 0] + arr[:, 2]) / 2)
    np.testing.assert_array_equal(out[:, 1:], arr[:, [1, 3]])
    exact = ChannelEdit(4, ((0, 2), (1,), (3,)), (True, True, True))
    np.testing.assert_array_equal(reduce_along(arr, 1, exact)[:, 0], arr[:, 0])
    w = np.arange(16, dtype=np.float32).reshape(8, 2)  # 4 channels x 2 features, 2 outputs
    folded = fold_along(w, 0, edit, inner=2)
    np.testing.assert_array_equal(folded[:2], w[0:2] + w[4:6])
    np.testing.assert_array_equal(folded[2:], w[[2, 3, 6, 7]])


# ---------------------------------------------------------------------- ops on the path

def _c(g, arr, dtype=np.int64):
    return g.const(np.asarray(arr, dtype), "k")


PATHS = {
    "MaxPool": lambda g, h: g.node("MaxPool", [h], kernel_shape=[2, 2], strides=[1, 1], pads=[0, 0, 1, 1]),
    "AveragePool": lambda g, h: g.node("AveragePool", [h], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
    "Pad_spatial": lambda g, h: g.node("Pad", [h, _c(g, [0, 0, 1, 1, 0, 0, 1, 1])]),
    "Resize": lambda g, h: g.node("Resize", [h, "", _c(g, [1, 1, 2, 2], np.float32)], mode="nearest"),
    "Dropout_Identity": lambda g, h: g.node("Identity", [g.node("Dropout", [h])]),
    "activations": lambda g, h: g.node("Selu", [g.node("Elu", [g.node("Softplus", [g.node(
        "Tanh", [g.node("HardSigmoid", [g.node("HardSwish", [h])])])])])]),
    "Slice_spatial": lambda g, h: g.node("Slice", [h, _c(g, [1]), _c(g, [5]), _c(g, [3])]),
    "Slice_full_channels": lambda g, h: g.node("Slice", [h, _c(g, [0]), _c(g, [6]), _c(g, [1])]),
    "Transpose_roundtrip": lambda g, h: g.node("Transpose", [g.node("Transpose", [h], perm=[0, 2, 3, 1])],
                                               perm=[0, 3, 1, 2]),
    "Unsqueeze_Squeeze": lambda g, h: g.node("Squeeze", [g.node("Unsqueeze", [h, _c(g, [2])]), _c(g, [2])]),
    "Reshape_spatial": lambda g, h: g.node("Reshape", [g.node("Reshape", [h, _c(g, [0, 0, -1])]),
                                                       _c(g, [0, 0, SPATIAL, SPATIAL])]),
    "Concat_spatial": lambda g, h: g.node("Concat", [h, g.node("Relu", [h])], axis=2),
    "Gelu_decomposed": lambda g, h: g.node("Mul", [g.node("Mul", [h, _c(g, 0.5, np.float32)]), g.node(
        "Add", [g.node("Erf", [g.node("Div", [h, _c(g, 1.4142135, np.float32)])]), _c(g, 1.0, np.float32)])]),
    "InstanceNormalization": lambda g, h: g.node("InstanceNormalization", [
        h, _c(g, [1, 1.5, 1, 2, 1.5, 3], np.float32), _c(g, [0.1, 0.2, 0.1, 0.3, 0.2, 0.5], np.float32)]),
    "Pow_per_channel": lambda g, h: g.node("Pow", [h, _c(g, np.r_[2, 3, 2, 1, 3, 1].reshape(6, 1, 1), np.float32)]),
    "Add_scalar_and_broadcast": lambda g, h: g.node("Sub", [g.node("Add", [h, _c(g, 0.5, np.float32)]),
                                                           _c(g, np.ones((1, 1, 1, SPATIAL)), np.float32)]),
}


@pytest.mark.parametrize("path", list(PATHS))
def test_channel_transparent_ops_on_the_path(path):
    g = DupBuilder(30)
    h = g.node("Relu", [g.conv_d("x", 3, 6, dup=[(0, 2), (1, 4)])])
    h = PATHS[path](g, h)
    model = g.model(["N", 3, SPATIAL, SPATIAL], g.conv_d(h, 6, 4))
    result = merge(model)
    assert result.channels_removed == 2, result.layers[0].reasons
    assert rel_l2(model, result.model) <= 1e-5


@pytest.mark.parametrize("tail", ["gap_squeeze_gemm", "nhwc_matmul", "gemm_gemm"])
def test_other_consumer_layouts(tail):
    g = DupBuilder(31)
    if tail == "gemm_gemm":  # an MLP: Gemm -> Relu -> Gemm, with Gemm's per-channel bias
        w = g.weights(8, 12)
        b = g.weights(8, scale=0.1)
        w[5], b[5] = w[1], b[1]
        x = g.node("Flatten", ["x"])
        h = g.node("Relu", [g.node("Gemm", [x, g.const(w, "G"), g.const(b, "GB")], transB=1)])
        model = g.model(["N", 12], g.gemm(h, 8, 3))
    else:
        h = g.node("Relu", [g.conv_d("x", 3, 6, dup=[(0, 2)])])
        if tail == "gap_squeeze_gemm":
            y = g.gemm(g.node("Squeeze", [g.node("GlobalAveragePool", [h]), _c(g, [2, 3])]), 6, 4)
        else:  # channels last, read by MatMul over the last axis
            y = g.node("MatMul", [g.node("Transpose", [h], perm=[0, 2, 3, 1]), g.const(g.weights(6, 4), "M")])
        model = g.model(["N", 3, SPATIAL, SPATIAL], y)
    result = merge(model)
    assert result.channels_removed == 1
    assert rel_l2(model, result.model) <= 1e-5


def test_calibrate_is_data_driven_and_keeps_the_drop_within_budget(tmp_path):
    from redpp_onnx.passes.merge import calibrate

    model = deep_chain(seed=23)
    x = np.random.default_rng(5).standard_normal((64, 3, SPATIAL, SPATIAL)).astype(np.float32)
    y = outputs_of(model, x).argmax(axis=1)  # labels = the model's own predictions: top-1 = 100 %
    np.savez(tmp_path / "d.npz", x=x, y=y)
    cal = calibrate(model, tmp_path / "d.npz", max_drop_points=5.0, steps=3, batch_size=32)
    assert cal.data_driven and cal.top1_reference == 1.0 and cal.n == 64
    alphas = [t["alpha"] for t in cal.trials]
    # α = 0, α = 1, then (if 1 fails) ALPHA_MIN and, if that passes, `steps` bisections on log α
    from redpp_onnx.passes.merge import ALPHA_MIN
    assert alphas[:2] == [0.0, 1.0] and len(alphas) in (2, 3, 6)
    if len(alphas) > 2:
        assert alphas[2] == ALPHA_MIN
    chosen = [t for t in cal.trials if t["alpha"] == cal.alpha][0]
    assert chosen["ok"] and 100 * (1.0 - cal.top1) <= 5.0
    assert all(not t["ok"] for t in cal.trials if t["alpha"] > cal.alpha and t["alpha"] != 1.0) or cal.alpha == 1.0
    with pytest.raises(RedppError):
        calibrate(model, tmp_path / "d.npz", max_drop_points=-1)


def outputs_of(model, x):
    return redpp_onnx.session(io.serialize(model)).run(None, {model.graph.input[0].name: x})[0]
