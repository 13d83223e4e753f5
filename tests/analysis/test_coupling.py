"""Channel-coupling analysis: groups, buckets, offsets, roles and refusals (pure: never mutates)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from redpp_onnx.analysis.coupling import (
    CONSUMER,
    PASS,
    PER_CHANNEL,
    PRODUCER,
    ParamRef,
    TensorChannels,
    analyze_coupling,
)

from ..passes.test_merge import (
    SPATIAL,
    DupBuilder,
    concat_branches,
    conv_bn_act_conv,
    conv_flatten_linear,
    inverted_residual,
    option_a_shortcut,
    residual_block,
    split_branches,
    squeeze_excitation,
)

SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "bench"


def _analyze(model):
    before = model.SerializeToString()
    coupling = analyze_coupling(model)
    assert model.SerializeToString() == before
    return coupling


def _roles(group):
    return [(op.op_type, op.role) for op in group.ops]


def test_chain_roles_and_parameters():
    model, info = conv_bn_act_conv("PRelu")
    c = _analyze(model)
    g = c.groups[0]
    assert _roles(g) == [("Conv", PRODUCER), ("BatchNormalization", PER_CHANNEL), ("PRelu", PER_CHANNEL),
                         ("Conv", CONSUMER)]
    conv1, bn, prelu, conv2 = g.ops
    assert [p.input for p in conv1.params] == [1, 2] and all(p.axis == 0 for p in conv1.params)
    assert [p.input for p in bn.params] == [1, 2, 3, 4]
    assert prelu.params == (ParamRef(1, model.graph.node[2].input[1], 0),)  # slope (8, 1, 1): axis 0
    assert conv2.params[0].axis == 1
    assert len(g.buckets) == 1 and g.buckets[0].reasons == () and len(g.classes) == 8
    assert not g.blocked and g.reasons == ()
    # the head: its Gemm output is the graph output
    assert c.groups[-1].reasons == (f"channel feeds the graph output {model.graph.output[0].name}",)


def test_residual_add_couples_the_producers():
    model, info = residual_block(False)
    c = _analyze(model)
    conv0, conva, convb, conv_out = info["convs"]
    trunk = [g for g in c.groups if any(op.name == conv0 for op in g.producers)][0]
    assert sorted(op.name for op in trunk.producers) == sorted([conv0, convb])
    assert sorted(op.name for op in trunk.consumers) == sorted([conva, conv_out])
    assert ("Add", PASS) in _roles(trunk)
    assert len(trunk.buckets) == 1 and len(trunk.classes) == 8


def test_concat_links_groups_with_offsets():
    model, _ = concat_branches()
    c = _analyze(model)
    concat = [n for n in model.graph.node if n.op_type == "Concat"][0]
    a, b = concat.input
    assert c.layout[concat.output[0]] == c.layout[a] + c.layout[b]
    g = c.group_of(a)
    assert g is c.group_of(b) and len(g.producers) == 2
    assert [len(bk.classes) for bk in g.buckets] == [6, 4]
    assert set(g.buckets[0].classes) == set(c.layout[a])


def test_split_cuts_the_channel_list():
    model, _ = split_branches()
    c = _analyze(model)
    split = [n for n in model.graph.node if n.op_type == "Split"][0]
    src = c.layout[split.input[0]]
    assert c.layout[split.output[0]] == src[:5] and c.layout[split.output[1]] == src[5:]
    assert [len(bk.classes) for bk in c.group_of(split.input[0]).buckets] == [5, 3]


@pytest.mark.parametrize("flatten", ["Flatten", "Reshape"])
def test_flatten_maps_a_channel_to_hw_features(flatten):
    model, info = conv_flatten_linear("gemm", flatten)
    c = _analyze(model)
    node = [n for n in model.graph.node if n.op_type == flatten][0]
    assert c.channels[node.output[0]] == TensorChannels(axis=1, rank=2, inner=SPATIAL * SPATIAL)
    (consumer,) = c.groups[0].consumers
    assert consumer.op_type == "Gemm" and consumer.inner == SPATIAL * SPATIAL and consumer.params[0].axis == 0


def test_depthwise_is_a_per_channel_op_of_the_expand_group():
    model, info = inverted_residual()
    c = _analyze(model)
    dw = [g for g in c.groups for op in g.ops if op.name == info["depthwise"]]
    (g,) = dw
    (op,) = [op for op in g.ops if op.name == info["depthwise"]]
    assert op.role == PER_CHANNEL and [(p.input, p.axis) for p in op.params] == [(1, 0), (2, 0)]
    assert [o.op_type for o in g.producers] == ["Conv"] and len(g.classes) == 16
    assert _roles(g).count(("Clip", PASS)) == 2


def test_squeeze_excitation_gate_is_a_producer_of_the_trunk():
    model, _ = squeeze_excitation()
    c = _analyze(model)
    convs = [n.name for n in model.graph.node if n.op_type == "Conv"]
    conv0, s1, s2, conv_out = convs
    trunk = c.group_of([n for n in model.graph.node if n.op_type == "Mul"][0].output[0])
    assert sorted(op.name for op in trunk.producers) == sorted([conv0, s2])
    assert sorted(op.name for op in trunk.consumers) == sorted([s1, conv_out])
    assert ("Sigmoid", PASS) in _roles(trunk) and ("GlobalAveragePool", PASS) in _roles(trunk)
    assert len(trunk.buckets) == 1 and not trunk.blocked


def test_channel_pad_creates_constant_channels():
    model, _ = option_a_shortcut()
    c = _analyze(model)
    pad = [n for n in model.graph.node if n.op_type == "Pad"][0]
    out, src = c.layout[pad.output[0]], c.layout[pad.input[0]]
    assert out[2:6] == src and not set(out[:2] + out[6:]) & set(src)
    g = c.group_of(pad.output[0])
    sizes = sorted(len(b.classes) for b in g.buckets)
    assert sizes == [4, 4]  # the padded classes (with convb) and the shortcut's classes


@pytest.mark.parametrize("kind,reason", [
    ("output", "channel feeds the graph output"),
    ("softmax", "output feeds Softmax over channels"),
    ("shared", "weight shared by two layers"),
    ("reshape", "Reshape that mixes channels"),
    ("flatten2", "Reshape that mixes channels"),
    ("unsupported", "unsupported op TopK on the path"),
    ("channel_slice", "Slice Slice"),
    ("reflect_pad", "on the channel axis"),
    ("grouped", "grouped Conv (group=2, 4 outputs for 4 channels) is not supported"),
    ("concat_untracked", "an input whose channels are not tracked"),
    ("graph_input", "(a graph input): a tensor whose channels are not tracked"),
    ("subgraph", "is used inside a subgraph (If/Loop/Scan)"),
])
def test_refusals_block_the_group_with_their_reason(kind, reason):
    g = DupBuilder(40)
    h = g.node("Relu", [g.conv_d("x", 3, 4)])
    if kind == "output":
        y = h
    elif kind == "softmax":
        y = g.node("Softmax", [h], axis=1)
    elif kind == "shared":
        g.inits.append(onnx.numpy_helper.from_array(g.weights(4, 4, 1, 1), "S"))
        y = g.node("Conv", [g.node("Conv", [h, "S"]), "S"])
    elif kind == "reshape":
        y = g.node("Reshape", [h, g.const(np.array([0, 2, -1], np.int64), "s")])
    elif kind == "flatten2":
        y = g.node("Flatten", [h], axis=2)
    elif kind == "unsupported":
        y = g.node("TopK", [h, g.const(np.array([2], np.int64), "k")], n_out=2, axis=1)[0]
    elif kind == "channel_slice":
        y = g.node("Slice", [h, g.const(np.array([1], np.int64), "a"), g.const(np.array([3], np.int64), "b"),
                             g.const(np.array([1], np.int64), "c")])
    elif kind == "reflect_pad":
        y = g.node("Pad", [h, g.const(np.array([0, 1, 0, 0, 0, 1, 0, 0], np.int64), "p")], mode="reflect")
    elif kind == "grouped":
        y = g.conv_d(h, 4, 4, group=2)
    elif kind == "concat_untracked":
        y = g.node("Concat", [h, "x"], axis=1)
    elif kind == "subgraph":  # an If branch reads h from the outer scope
        branches = {
            key: onnx.helper.make_graph([onnx.helper.make_node("Identity", [h], [f"{key}_out"])], key, [],
                                        [onnx.helper.make_tensor_value_info(f"{key}_out", onnx.TensorProto.FLOAT,
                                                                            None)])
            for key in ("then", "else")}
        y = g.node("If", [g.const(np.array(True), "cond")], then_branch=branches["then"],
                   else_branch=branches["else"])
    else:
        h = g.conv_d("x", 3, 3)
        y = g.node("Mul", [h, "x"])
    model = g.model(["N", 3, SPATIAL, SPATIAL], g.node("Identity", [y]))
    c = _analyze(model)
    g0 = c.group_of(h)
    assert g0.blocked and any(reason in r for r in g0.reasons), g0.reasons
    assert all(b.reasons for b in g0.buckets)


def test_tensor_shared_by_a_blocked_and_a_free_branch_blocks_only_its_classes():
    """Concat(A, B) is fine, but B alone also feeds the graph output: only B's classes are blocked."""
    g = DupBuilder(41)
    a = g.node("Relu", [g.conv_d("x", 3, 4)])
    b = g.node("Relu", [g.conv_d("x", 3, 2)])
    y = g.conv_d(g.node("Concat", [a, b], axis=1), 6, 3)
    graph = onnx.helper.make_graph(g.nodes, "g", [onnx.helper.make_tensor_value_info("x", 1, ["N", 3, 6, 6])],
                                   [onnx.helper.make_tensor_value_info(y, 1, None),
                                    onnx.helper.make_tensor_value_info(b, 1, None)], g.inits)
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)], ir_version=8)
    c = _analyze(model)
    grp = c.group_of(a)
    assert [(len(bk.classes), bool(bk.reasons)) for bk in grp.buckets] == [(4, False), (2, True)]
    assert grp.buckets[1].reasons == (f"channel feeds the graph output {b}",)


@pytest.mark.skipif(not SHARED.is_dir(), reason=f"shared data not found at {SHARED}")
def test_resnet20_groups():
    model = onnx.load(str(SHARED / "cifar10_resnet20.onnx"))
    c = _analyze(model)
    trunk = c.groups[0]
    assert len(trunk.producers) == 1 + 9  # the stem conv and every block's second conv (option-A shortcuts)
    assert [len(b.classes) for b in trunk.buckets] == [16, 16, 32] and not trunk.reasons
    inner = [g for g in c.groups[1:-1]]
    assert len(inner) == 9 and all(len(g.producers) == 1 and len(g.consumers) == 1 for g in inner)
    assert c.groups[-1].reasons == ("channel feeds the graph output logits",)
