"""The consumer refit on a synthetic twin (``redpp_onnx/passes/refit.py``): im2col against
onnxruntime's Conv, the renormalized forward against the running statistics, the natural-image
noise's moments, an exact recovery when the removed channels are linear combinations of the kept
ones, refusals with reasons, and the whole reduction with and without the refit."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from redpp_onnx.passes import reduce as R
from redpp_onnx.passes import refit as RF

from ..graphs import IR_VERSION, OPSET, GraphBuilder

SIZE = 8


def _run(model, feeds, outputs=None):
    m = onnx.ModelProto()
    m.CopyFrom(model)
    for name in outputs or []:
        m.graph.output.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, None))
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return [np.asarray(a, np.float64) for a in sess.run(outputs or None, feeds)]


def _rel(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(a))


@pytest.mark.parametrize("k, pads, strides, dilations", [
    (3, [1, 1, 1, 1], [1, 1], [1, 1]), (3, [0, 1, 2, 1], [2, 2], [1, 1]), (1, [0, 0, 0, 0], [1, 1], [1, 1]),
    (3, [2, 2, 2, 2], [1, 2], [2, 2])])
def test_patches_times_the_weight_is_onnxruntimes_conv(k, pads, strides, dilations):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 5, 9, 10)).astype(np.float32)
    w = rng.standard_normal((4, 5, k, k)).astype(np.float32)
    node = helper.make_node("Conv", ["x", "w"], ["y"], pads=pads, strides=strides, dilations=dilations)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [onnx.numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION)
    y = _run(model, {"x": x})[0]
    p = RF._patches(x.astype(np.float64), node, w.shape)
    mine = (p @ w.reshape(4, -1).T.astype(np.float64)).reshape(y.shape[0], y.shape[2], y.shape[3], 4)
    np.testing.assert_allclose(np.moveaxis(mine, -1, 1), y, rtol=1e-4, atol=1e-4)


def test_natural_noise_has_unit_variance_correlated_channels_and_a_falling_spectrum():
    x = RF.natural_noise(np.random.default_rng(1), (64, 3, 32, 32)).astype(np.float64)
    np.testing.assert_allclose(x.std(axis=(-2, -1)), 1.0, rtol=1e-5)
    c = np.corrcoef(x.transpose(1, 0, 2, 3).reshape(3, -1))
    off = c[np.triu_indices(3, 1)]
    assert np.all(np.abs(off - RF.IMAGE_CHANNEL_CORRELATION) < 0.08), off
    power = np.abs(np.fft.fft2(x)) ** 2
    assert power[..., 1, 1].mean() > 20 * power[..., 16, 16].mean()  # 1/f: low frequencies dominate


def _bn_model(seed=2, c=6):
    g = GraphBuilder(seed)
    h = g.conv("x", 3, c, bias=False)
    bn_in = h
    h = g.node("Relu", [g.bn(h, c)])
    y = g.conv(h, c, 4)
    return g.model(["N", 3, SIZE, SIZE], y), bn_in


def test_the_renormalized_forward_gives_each_batchnorm_its_running_moments():
    model, bn_in = _bn_model()
    bn = next(n for n in model.graph.node if n.op_type == "BatchNormalization")
    consts = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
    feeds = RF.synthetic_feeds(model, 32)
    ren = RF._renormalized(model)
    k = list(model.graph.node).index(bn)
    z = _run(ren, feeds[0], [f"_redpp_rn{k}_z"])[0]
    np.testing.assert_allclose(z.mean(axis=(0, 2, 3)), consts[bn.input[3]], atol=1e-4)
    np.testing.assert_allclose(z.var(axis=(0, 2, 3)), consts[bn.input[4]], rtol=1e-3)
    # the twin (batch statistics as running statistics) computes that same forward
    stats = RF.bn_batch_stats(model, feeds)
    tw = RF.twin(model, stats)
    a = _run(ren, feeds[0])[0]
    b = _run(tw, feeds[0])[0]
    np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-4)
    assert len(tw.graph.node) == len(model.graph.node)


def _low_rank(seed=3, c=8, rank=4):
    """x -> Conv(3 -> c) whose c filters span only ``rank`` directions -> Conv(c -> 5, 3x3): any
    channel of the first conv is a linear combination of the others (no activation)."""
    g = GraphBuilder(seed)
    base = g.weights(rank, 3, 3, 3)
    mix = g.rng.standard_normal((c, rank))
    w = np.einsum("cr,rikl->cikl", mix, base).astype(np.float32)
    h = g.node("Conv", ["x", g.const(w, "W")], pads=[1] * 4)
    y = g.node("Conv", [h, g.const(g.weights(5, c, 3, 3), "W2"), g.const(g.weights(5, scale=0.1), "B2")], pads=[1] * 4)
    return g.model(["N", 3, SIZE, SIZE], y)


def test_refit_recovers_channels_that_are_combinations_of_the_kept_ones():
    model = _low_rank()
    config = dict(alpha=0.25, strategy="uniform", multiple=1)
    on = R.reduce_channels(model, R.ReduceConfig(**config))
    off = R.reduce_channels(model, R.ReduceConfig(refit=False, **config))
    assert sum(r.pruned + r.merged for r in on.layers) == 2  # a quarter of 8
    assert len(on.refit) == 1 and on.refit[0].refitted and on.refit[0].error_after < 1e-2 < on.refit[0].error_before
    assert any("refit: 1 of 1 consumer" in n for n in on.notes)
    assert on.twin_drift is not None and on.twin_drift < 1e-2 and off.twin_drift is None
    x = np.random.default_rng(9).standard_normal((16, 3, SIZE, SIZE)).astype(np.float32)
    ref = _run(model, {"x": x})[0]
    assert _rel(ref, _run(on.model, {"x": x})[0]) < 1e-2  # on inputs it was not fitted on
    assert _rel(ref, _run(off.model, {"x": x})[0]) > 0.1
    onnx.checker.check_model(on.model)


def test_refit_improves_a_relu_block_and_never_reads_data():
    model, _ = _bn_model(seed=5, c=16)
    on = R.reduce_channels(model, R.ReduceConfig(alpha=0.25, strategy="uniform", multiple=1))
    off = R.reduce_channels(model, R.ReduceConfig(alpha=0.25, strategy="uniform", multiple=1, refit=False))
    assert sum(r.pruned + r.merged for r in on.layers) == 4
    (row,) = on.refit
    assert row.refitted and row.error_after < row.error_before
    assert 0 < on.twin_drift < 1
    assert row.features == (16 - 4) * 9 + 0 and row.rows >= RF.MIN_IMAGES * SIZE * SIZE
    # judged on other synthetic inputs of the same kind than those it was fitted on
    feeds = RF.synthetic_feeds(model, 64, seed=7)
    tw = RF.twin(model, RF.bn_batch_stats(model, feeds))
    del tw  # the twin is for fitting; the measure is on the model itself
    x = feeds[0]
    ref = _run(model, x)[0]
    assert _rel(ref, _run(on.model, x)[0]) < _rel(ref, _run(off.model, x)[0])


def test_consumers_the_refit_cannot_handle_say_why():
    g = GraphBuilder(4)
    h = g.node("Relu", [g.bn(g.conv("x", 3, 16, bias=False), 16)])
    y = g.gemm(g.node("Flatten", [g.node("GlobalAveragePool", [h])]), 16, 5)
    model = g.model(["N", 3, SIZE, SIZE], y)
    res = R.reduce_channels(model, R.ReduceConfig(alpha=0.25, strategy="uniform", multiple=1))
    assert sum(r.pruned + r.merged for r in res.layers) == 4
    (row,) = res.refit
    assert not row.refitted and "Gemm consumer" in row.reason
    assert RF.refittable(helper.make_node("Conv", ["a", "b"], ["c"], group=2)) == "grouped Conv consumer: not refitted"


def test_images_needed_follows_the_rows_per_feature_rule():
    model, _ = _bn_model()
    assert RF.images_needed(model, [(10, SIZE * SIZE)]) == RF.MIN_IMAGES
    assert RF.images_needed(model, [(576, 16)]) == 32 * 576 // 16
    assert RF.images_needed(model, [(10 ** 9, 1)]) == RF.MAX_INPUT_ELEMENTS // (3 * SIZE * SIZE)


def test_too_few_synthetic_rows_per_unknown_is_refused_with_the_reason():
    model, _ = _bn_model(seed=5, c=16)
    res = R.reduce_channels(model, R.ReduceConfig(alpha=0.25, strategy="uniform", multiple=1, refit_images=2))
    (row,) = res.refit
    assert not row.refitted and row.rows == 2 * SIZE * SIZE and "fewer than 32 per unknown" in row.reason
    assert any("refit: 0 of 1 consumer" in n for n in res.notes)
    off = R.reduce_channels(model, R.ReduceConfig(alpha=0.25, strategy="uniform", multiple=1, refit=False))
    x = {"x": np.random.default_rng(3).standard_normal((4, 3, SIZE, SIZE)).astype(np.float32)}
    np.testing.assert_array_equal(_run(res.model, x)[0], _run(off.model, x)[0])  # left as the compensation made it


def test_an_export_with_a_static_batch_gets_synthetic_batches_of_that_size():
    g = GraphBuilder(2)
    y = g.conv(g.node("Relu", [g.bn(g.conv("x", 3, 6, bias=False), 6)]), 6, 4)
    model = g.model([2, 3, SIZE, SIZE], y)
    feeds = RF.synthetic_feeds(model, 10)
    assert len(feeds) == 5 and all(f["x"].shape == (2, 3, SIZE, SIZE) for f in feeds)
