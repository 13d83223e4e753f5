"""The layout rewrite (passes/layout.py): zero channel paddings as exact 1x1 Convs."""

from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from redpp_onnx.compress import compress
from redpp_onnx.config import CompressConfig
from redpp_onnx.passes import layout
from tests.graphs import IR_VERSION, OPSET

BIG = 1 << 40  # a MAC total the rewrite's budget never limits


def shortcut_block(c=16, size=8, pad=(8, 8), value=0.0, starts=(0, 0), steps=(2, 2), dtype=TensorProto.FLOAT,
                   pad_axis=1, seed=0, stem=1):
    """``stem`` Conv-Relu, then the option-A residual block of the CIFAR ResNets: a strided Conv on one
    branch, ``x[:, :, ::2, ::2]`` padded with zero channels on the other, Add, Relu."""
    rng = np.random.default_rng(seed)
    np_dtype = helper.tensor_dtype_to_np_dtype(dtype)
    c_out = c + sum(pad) if pad_axis == 1 else c
    inits = [
        numpy_helper.from_array(rng.standard_normal((c, c, 3, 3)).astype(np_dtype) * 0.2, f"w0_{k}") for k in range(stem)
    ] + [
        numpy_helper.from_array(rng.standard_normal((c_out, c, 3, 3)).astype(np_dtype) * 0.2, "w1"),
        numpy_helper.from_array(np.array([starts[0]], np.int64), "s_h"),
        numpy_helper.from_array(np.array([starts[1]], np.int64), "s_w"),
        numpy_helper.from_array(np.array([1 << 62], np.int64), "end"),
        numpy_helper.from_array(np.array([2], np.int64), "ax_h"),
        numpy_helper.from_array(np.array([3], np.int64), "ax_w"),
        numpy_helper.from_array(np.array([steps[0]], np.int64), "st_h"),
        numpy_helper.from_array(np.array([steps[1]], np.int64), "st_w"),
        numpy_helper.from_array(np.array([value], np_dtype), "value"),
    ]
    pads = np.zeros(8, np.int64)
    pads[pad_axis], pads[4 + pad_axis] = pad
    nodes = []
    for k in range(stem):
        nodes += [helper.make_node("Conv", ["x" if k == 0 else f"r{k - 1}", f"w0_{k}"], [f"a{k}"], pads=[1, 1, 1, 1]),
                  helper.make_node("Relu", [f"a{k}"], ["r" if k == stem - 1 else f"r{k}"])]
    nodes += [
        helper.make_node("Conv", ["r", "w1"], ["main"], pads=[1, 1, 1, 1], strides=list(steps)),
        helper.make_node("Slice", ["r", "s_h", "end", "ax_h", "st_h"], ["sl_h"]),
        helper.make_node("Slice", ["sl_h", "s_w", "end", "ax_w", "st_w"], ["sl_w"]),
        helper.make_node("Constant", [], ["pads"], value=numpy_helper.from_array(pads, "pads")),
        helper.make_node("Pad", ["sl_w", "pads", "value"], ["short"]),
        helper.make_node("Add", ["main", "short"], ["s"]),
        helper.make_node("Relu", ["s"], ["y"]),
    ]
    graph = helper.make_graph(nodes, "shortcut", [helper.make_tensor_value_info("x", dtype, ["N", c, size, size])],
                              [helper.make_tensor_value_info("y", dtype, ["N", c_out, size // steps[0], size // steps[1]])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = IR_VERSION
    return model


def run(model, x, optimize=False):
    so = ort.SessionOptions()
    so.log_severity_level = 3
    if not optimize:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(
        None, {"x": x})[0]


def ops(model):
    return Counter(n.op_type for n in model.graph.node)


def test_option_a_shortcut_becomes_one_exact_strided_conv():
    model = shortcut_block()
    model.metadata_props.add(key="owner", value="kept")
    before = model.SerializeToString()
    res = layout.rewrite(model, BIG)
    assert model.SerializeToString() == before  # the input is never modified
    assert res.rewritten == 1
    row = res.rows[0]
    assert (row.channels_in, row.channels_out, row.strides, row.slices) == (16, 32, (2, 2), 2)
    assert row.macs_added == 16 * 32 * 4 * 4 == res.macs_added
    diff = ops(res.model) - ops(model), ops(model) - ops(res.model)
    assert diff == (Counter({"Conv": 1}), Counter({"Pad": 1, "Slice": 2, "Constant": 1}))
    onnx.checker.check_model(res.model)
    assert [(p.key, p.value) for p in res.model.metadata_props] == [("owner", "kept")]
    assert (res.model.ir_version, res.model.opset_import) == (model.ir_version, model.opset_import)
    x = np.random.default_rng(1).standard_normal((3, 16, 8, 8)).astype(np.float32)
    np.testing.assert_array_equal(run(res.model, x), run(model, x))  # x * 1 + zeros: exact
    # onnxruntime's optimized graphs sum in another order: float32 rounding only
    np.testing.assert_allclose(run(res.model, x, optimize=True), run(model, x, optimize=True), rtol=1e-5, atol=1e-5)


def test_odd_spatial_size_and_asymmetric_padding_are_exact():
    model = shortcut_block(size=7, pad=(0, 16), c=16)
    res = layout.rewrite(model, BIG)
    assert res.rewritten == 1 and res.rows[0].channels_out == 32
    x = np.random.default_rng(2).standard_normal((2, 16, 7, 7)).astype(np.float32)
    np.testing.assert_array_equal(run(res.model, x), run(model, x))


def test_slice_not_from_the_first_pixel_stays_a_slice():
    model = shortcut_block(starts=(1, 0))  # x[:, :, 1::2, ::2]: only the second Slice folds
    res = layout.rewrite(model, BIG)
    assert res.rewritten == 1 and res.rows[0].slices == 1 and res.rows[0].strides == (1, 2)
    assert ops(model)["Slice"] - ops(res.model)["Slice"] == 1
    x = np.random.default_rng(3).standard_normal((2, 16, 8, 8)).astype(np.float32)
    np.testing.assert_array_equal(run(res.model, x), run(model, x))


@pytest.mark.parametrize("kwargs, reason", [
    (dict(value=1.0), "not a zero padding of the channel axis"),
    (dict(pad=(2, 2)), "not multiples of 8"),
    (dict(dtype=TensorProto.DOUBLE), "not a float32 tensor"),
])
def test_refusals_carry_their_reason_and_leave_the_model_alone(kwargs, reason):
    model = shortcut_block(**kwargs)
    res = layout.rewrite(model, BIG)
    assert res.rewritten == 0 and res.model is model
    assert len(res.rows) == 1 and reason in res.rows[0].reason


def test_the_mac_budget_is_one_percent_of_the_model():
    model = shortcut_block()
    need = 16 * 32 * 4 * 4
    assert layout.rewrite(model, int(need / layout.MAX_ADDED_SHARE)).rewritten == 1
    res = layout.rewrite(model, int(need / layout.MAX_ADDED_SHARE) - 1000)
    assert res.rewritten == 0 and "adds 8,192 MACs" in res.rows[0].reason


def test_spatial_padding_is_not_a_candidate():
    res = layout.rewrite(shortcut_block(pad=(1, 1), pad_axis=2, steps=(1, 1)), BIG)
    assert res.rows == [] and res.rewritten == 0


def test_no_pad_no_work():
    model = shortcut_block()
    model.graph.node.remove(next(n for n in model.graph.node if n.op_type == "Pad"))
    assert layout.rewrite(model, BIG).rows == []


@pytest.mark.parametrize("enabled", [True, False])
def test_compress_reports_the_rewrite_and_counts_its_macs(enabled):
    model = shortcut_block(stem=6)  # the 1x1 Conv adds 0.85 % of the MACs (at most 1 %)
    out, report = compress(model, CompressConfig(steps=("hash",), codebook=False, layout=enabled))
    if not enabled:
        assert "layout" not in report.model and ops(out)["Pad"] == 1
        return
    lay = report.model["layout"]
    assert lay["rewritten"] == 1 and lay["macs_added"] == 8192
    assert ops(out)["Pad"] == 0 and ops(out)["Conv"] == 8
    assert any(n.startswith("layout: 1 zero channel padding") for n in report.notes)
    # the added Conv's MACs are in the after count: the hashing keeps every channel
    assert report.model["macs_after"] == report.model["macs_before"] + 8192
    assert report.verify["max_rel_l2"] < 0.1


def test_a_graph_the_editor_cannot_read_is_left_as_it_is(monkeypatch):
    import onnx_graphsurgeon as gs

    def broken(model):
        raise ValueError("unsupported\nsecond line")

    monkeypatch.setattr(gs, "import_onnx", broken)
    model = shortcut_block()
    res = layout.rewrite(model, BIG)
    assert res.model is model and res.rewritten == 0
    assert res.rows[0].reason == "onnx-graphsurgeon cannot read the graph: unsupported"


def test_a_tensor_whose_type_inference_cannot_reach_is_not_rewritten():
    model = shortcut_block()
    relu = next(n for n in model.graph.node if n.output[0] == "r")
    relu.op_type, relu.domain = "Mystery", "ai.example"  # an op onnx knows nothing of
    model.opset_import.append(helper.make_opsetid("ai.example", 1))
    res = layout.rewrite(model, BIG)
    assert res.rewritten == 0 and res.model is model
    assert res.rows[0].reason.startswith("element type unknown")


def test_pads_computed_from_constants_are_evaluated():
    """The TorchScript exporter computes F.pad's pads (ConstantOfShape, Concat, Reshape, ...): a Concat of
    constants stands for that here; shape inference alone does not see through it."""
    model = shortcut_block()
    const = next(n for n in model.graph.node if n.op_type == "Constant" and n.output[0] == "pads")
    pads = numpy_helper.to_array(const.attribute[0].t)
    model.graph.node.remove(const)
    model.graph.initializer.extend([numpy_helper.from_array(pads[:4], "pads_a"),
                                    numpy_helper.from_array(pads[4:], "pads_b")])
    model.graph.node.insert(0, helper.make_node("Concat", ["pads_a", "pads_b"], ["pads"], axis=0))
    res = layout.rewrite(model, BIG)
    assert res.rewritten == 1 and res.rows[0].channels_out == 32
    assert ops(model) - ops(res.model) == Counter({"Pad": 1, "Slice": 2, "Concat": 1})
    x = np.random.default_rng(4).standard_normal((2, 16, 8, 8)).astype(np.float32)
    np.testing.assert_array_equal(run(res.model, x), run(model, x))


def test_unknown_model_macs_refuse_with_their_reason():
    res = layout.rewrite(shortcut_block(), None)
    assert res.rewritten == 0 and "MACs are unknown" in res.rows[0].reason
