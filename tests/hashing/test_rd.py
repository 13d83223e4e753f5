"""Tests of rate-distortion hashing (redpp_onnx.hashing.rd) and the baselines it is compared with
(redpp_onnx.hashing.baselines): small synthetic weights and tiny models built with onnx.helper."""

import math

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from redpp_onnx.analysis.layers import ConstantTensors
from redpp_onnx.hashing import baselines as B
from redpp_onnx.hashing import hash_tensor, kde
from redpp_onnx.hashing import rd
from tests.graphs import GraphBuilder


def _tiny(seed=0):
    """x[N,3,8,8] -> Conv 3x3 (16) -> BN -> Relu -> Conv 3x3 (32) -> BN -> Relu -> GAP -> Gemm(10)."""
    g = GraphBuilder(seed)
    h = g.node("Relu", [g.bn(g.conv("x", 3, 16, bias=False), 16)])
    h = g.node("Relu", [g.bn(g.conv(h, 16, 32, bias=False), 32)])
    h = g.node("Flatten", [g.node("GlobalAveragePool", [h])])
    return g.model(["N", 3, 8, 8], g.gemm(h, 32, 10))


def _run(model, x):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    s = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return s.run(None, {s.get_inputs()[0].name: x})[0]


@pytest.fixture(scope="module")
def tiny():
    return _tiny()


@pytest.fixture(scope="module")
def plan(tiny):
    return rd.prepare(tiny, min_codebook_weights=0, responses=None)


# --------------------------------------------------------------------------- accounting

def test_stored_bits_hand_count():
    codes = np.array([0, 0, 1, 2])
    b = B.stored_bits(codes, None, 3, 48)
    assert b.fixed_codes == 4 * 2 and b.table == 48
    assert math.isclose(b.entropy_codes, 4 * 1.5)  # p = 1/2, 1/4, 1/4
    assert math.isclose(b.entropy, 48 + 6) and b.fixed == 56
    # two codebooks: entropy and widths per codebook
    codes = np.array([0, 1, 0, 1, 5, 5, 5, 5])
    groups = np.array([0, 0, 0, 0, 1, 1, 1, 1])
    b = B.stored_bits(codes, groups, [2, 1], 10)
    assert b.fixed_codes == 4 * 1 + 4 * 0
    assert math.isclose(b.entropy_codes, 4.0)  # 1 bit each in group 0, nothing in group 1
    assert math.isclose(b.per_weight()["entropy"], (10 + 4) / 8)


def test_rd_bits_equal_hand_count(tiny):
    """One codebook per tensor: 16 bits per value + 32 for the step, plus n·H of the codes."""
    out, info = rd.rd_hash(tiny, 0.2, granularities=("tensor",), min_codebook_weights=0)
    consts = ConstantTensors(out)
    for layer in info.layers:
        assert layer.granularity in ("tensor", "unchanged")
        w = consts.array(layer.weight)
        vals, counts = np.unique(w, return_counts=True)
        p = counts / w.size
        if layer.granularity == "tensor":
            assert layer.values_kept == len(vals)
            assert math.isclose(layer.bits.table, 16 * len(vals) + 32)
            assert math.isclose(layer.bits.entropy_codes, -w.size * float(np.sum(p * np.log2(p))), rel_tol=1e-9)
            assert layer.bits.fixed_codes == w.size * math.ceil(math.log2(len(vals)))


def test_baseline_bits():
    rng = np.random.default_rng(0)
    w = rng.normal(size=(4, 8, 3, 3)).astype(np.float32)
    q = B.uniform(w, 4, axis=0)
    assert q.table_bits == 4 * 32 and q.bits.fixed_codes == w.size * 4  # alphabet 15 -> 4 bits
    q = B.uniform(w, 3, symmetric=False)
    assert q.table_bits == 32 + 3 and q.bits.fixed_codes == w.size * 3
    q = B.kmeans(w, 8, axis=0)
    assert q.table_bits == 32 * int(q.alphabet.sum()) and q.alphabet.max() <= 8
    h = B.fp16(w)
    assert B.method_bits(h).fixed == 16 * w.size and B.method_bits(h).entropy <= 16 * w.size


# --------------------------------------------------------------------------- baselines

def test_uniform_levels_and_zero():
    rng = np.random.default_rng(1)
    w = rng.laplace(0, 0.1, (16, 64)).astype(np.float32)
    w[3, :] = 0.0  # an all-zero channel stays zero
    for sym in (True, False):
        q = B.uniform(w, 5, symmetric=sym, axis=0)
        assert np.all(q.values[3] == 0)
        for r in range(16):
            assert len(np.unique(q.values[r])) <= (31 if sym else 32)
        assert np.all(np.abs(q.values - w) <= np.abs(w).max(axis=1, keepdims=True) / 15 * 1.0001 + 1e-12)
    q = B.uniform(w, 8)
    assert q.rel_error(w) < 0.02


def test_kmeans_deterministic_and_tables():
    rng = np.random.default_rng(2)
    w = rng.standard_t(4, (8, 200)).astype(np.float32)
    a, b = B.kmeans(w, 16, axis=0), B.kmeans(w, 16, axis=0)
    assert np.array_equal(a.values, b.values) and np.array_equal(a.codes, b.codes)
    for r in range(8):
        assert len(np.unique(a.values[r])) == a.alphabet[r] <= 16
    # the "best" start is never worse than either start alone
    for init in ("quantile", "kmeans++"):
        assert a.rel_error(w) <= B.kmeans(w, 16, axis=0, init=init).rel_error(w) + 1e-12
    t = B.kmeans(w, 8)
    assert t.groups is None and len(np.unique(t.values)) <= 8


# --------------------------------------------------------------------------- rd hashing

def test_batched_partitions_equal_single():
    rng = np.random.default_rng(3)
    items = []
    for k in range(40):
        n = int(rng.integers(20, 900))
        x = [rng.laplace(0, 0.05, n), rng.normal(1, 0.1, n), np.round(rng.normal(0, 1, n), 1)][k % 3]
        v, c = np.unique(x.astype(np.float32).astype(np.float64), return_counts=True)
        if len(v) < 3:
            continue
        items.append((v, c.astype(np.float64), float(np.median(np.diff(v))) * float(2 ** rng.uniform(0, 6))))
    for (v, c, bw), part in zip(items, rd._partitions(items)):
        ref = kde._partition(v, c, bw, kde._binned_density)
        assert np.array_equal(part.starts, ref.starts)
        assert np.array_equal(part.modes, ref.modes)


def test_candidates_match_hash_tensor():
    rng = np.random.default_rng(4)
    rows = rng.laplace(0, 0.05, (4, 300)).astype(np.float32)
    book = rd._Codebook(rows, np.ones(4), np.ones(300), False)
    for f in (2.0, 8.0, 32.0):
        for c in (0.0, rd.NMS_BANDWIDTHS):
            row = book.rows[book.evaluate(f, c)]
            r = hash_tensor(rows, bandwidth_factor=f, nms_radius=c * book.base * f)
            assert row[6] == r.distinct_after
            assert math.isclose(row[5], float(np.sum((r.hashed.astype(np.float64) - rows) ** 2)), rel_tol=1e-9)


def test_per_channel_keeps_modes_within_each_channel(tiny):
    out, info = rd.rd_hash(tiny, 0.3, granularities=("channel",), min_codebook_weights=0)
    consts = ConstantTensors(out)
    checked = 0
    for layer in info.layers:
        if layer.granularity != "channel":
            continue
        view = next(v for v in rd.layer_views(tiny) if v.weight == layer.weight)
        rows = B.channel_rows(consts.array(layer.weight), view.axis)
        for grp, f, c in zip(layer.groups, layer.factors, layer.nms):
            assert len(grp) == 1
            ch = grp[0]
            if f == 0:
                assert np.array_equal(rows[ch], view.rows[ch])
                continue
            own = view.rows[ch]
            base = float(np.median(np.diff(np.unique(own).astype(np.float64))))
            ref = hash_tensor(own, bandwidth_factor=f, nms_radius=c * base * f)
            assert np.array_equal(rows[ch], ref.hashed)  # this channel's own KDE modes
            checked += 1
    assert checked > 0


def test_allocation_monotone_in_budget(tiny, plan):
    bits, preds = [], []
    for budget in (0.02, 0.05, 0.1, 0.2, 0.4):
        _, info = rd.rd_hash(tiny, budget, plan=plan)
        bits.append(info.bits_per_weight["entropy"])
        preds.append(info.predicted_error)
        assert info.predicted_error <= budget * (1 + 1e-9)
    assert all(a >= b - 1e-9 for a, b in zip(bits, bits[1:])), bits
    assert bits[0] > bits[-1]
    _, info = rd.rd_hash(tiny, target_bits=4.0, plan=plan)
    assert info.bits_per_weight["entropy"] <= 4.0 + 1e-9


def test_deterministic(tiny):
    out1, info1 = rd.rd_hash(tiny, 0.15, min_codebook_weights=0)
    out2, info2 = rd.rd_hash(tiny, 0.15, min_codebook_weights=0)
    assert out1.SerializeToString() == out2.SerializeToString()
    d1, d2 = info1.to_dict(), info2.to_dict()
    d1.pop("seconds"), d2.pop("seconds")
    assert d1 == d2


def test_plan_reuse_gives_fresh_result(tiny, plan):
    """A result does not depend on the budgets tried before with the same plan."""
    _, a = rd.rd_hash(tiny, 0.1, plan=plan)
    rd.rd_hash(tiny, 0.3, plan=plan)
    _, b = rd.rd_hash(tiny, 0.1, plan=plan)
    assert [l.factors for l in a.layers] == [l.factors for l in b.layers]


def test_gain_correction_undoes_a_pure_scaling():
    """W̃ = W/2 before a BatchNorm: folding α = 2 into γ (and μ/α) gives the original outputs."""
    g = GraphBuilder(5)
    y = g.bn(g.conv("x", 3, 8, bias=False), 8)
    model = g.model(["N", 3, 6, 6], y)
    views = rd.layer_views(model)
    stats = rd.input_stats(model, views)
    half = onnx.ModelProto()
    half.CopyFrom(model)
    consts = ConstantTensors(half)
    w = consts.array(views[0].weight)
    consts.proto(views[0].weight).CopyFrom(numpy_helper.from_array(w / 2, views[0].weight))
    notes = rd.correct(model, half, views, stats)
    assert notes == [""]
    x = np.random.default_rng(0).standard_normal((4, 3, 6, 6)).astype(np.float32)
    np.testing.assert_allclose(_run(half, x), _run(model, x), rtol=1e-4, atol=1e-4)


def test_bias_correction_removes_the_mean_shift():
    """A constant weight offset on a layer fed by ReLU(BN) shifts the mean output; the
    correction puts it back into the following BatchNorm's running mean."""
    g = GraphBuilder(6)
    h = g.node("Relu", [g.bn(g.conv("x", 3, 8, bias=False), 8)])
    y = g.bn(g.conv(h, 8, 8, k=1, bias=False, pads=[0, 0, 0, 0]), 8)
    model = g.model(["N", 3, 6, 6], y)
    views = rd.layer_views(model)
    stats = rd.input_stats(model, views)
    v = views[1]
    shifted = onnx.ModelProto()
    shifted.CopyFrom(model)
    consts = ConstantTensors(shifted)
    consts.proto(v.weight).CopyFrom(numpy_helper.from_array(consts.array(v.weight) + 0.05, v.weight))
    x = np.random.default_rng(0).standard_normal((256, 3, 6, 6)).astype(np.float32)
    before = np.abs((_run(shifted, x) - _run(model, x)).mean(axis=(0, 2, 3))).mean()
    rd.correct(model, shifted, [v], [stats[1]], gain=False)
    after = np.abs((_run(shifted, x) - _run(model, x)).mean(axis=(0, 2, 3))).mean()
    assert after < 0.3 * before


def test_response_curve_shape():
    r = rd.Response(np.array([1.0, 4.0, 16.0]), np.array([2.0, 10.0, 80.0]))
    assert math.isclose(float(r(0.5)), 1.0)          # linear below the first point
    assert math.isclose(float(r(4.0)), 10.0)
    assert float(r(32.0)) > 160.0                    # keeps the last (superlinear) slope
    assert float(r(0.0)) == 0.0


def test_a_one_point_response_stays_linear_above_its_point():
    """The 'bn' and 'params' proxies give one-point (linear) responses; above that point the response was
    flat, so every distortion above D = 1 cost what D = 1 costs."""
    r = rd._linear(2.0)
    np.testing.assert_allclose(r(np.array([0.5, 1.0, 10.0, 1e4])), [1.0, 2.0, 20.0, 2e4], rtol=1e-12)


def _dynamic_sequence_bert() -> onnx.ModelProto:
    from pathlib import Path

    model = onnx.load(str(Path(__file__).resolve().parents[1] / "zoo" / "bertlike_ts.onnx"))
    dim = model.graph.input[0].type.tensor_type.shape.dim[1]
    dim.ClearField("dim_value")
    dim.dim_param = "S"
    return model


def test_the_bn_estimate_keeps_a_table_behind_a_dynamic_sequence():
    """The 'bn' estimate (the fallback for a model the synthetic inputs cannot feed) collapsed the
    embedding table of a BERT-style export to one value (relative weight error 1.0): its flat one-point
    response priced that like a tiny error."""
    from redpp_onnx.analysis.fold import resolve_constant_identities

    model, _ = resolve_constant_identities(_dynamic_sequence_bert())
    _, res = rd.rd_hash(model, 0.03, proxy="bn", workers=1)
    table = next(l for l in res.layers if l.name == "/words/Gather")
    assert table.values_kept > 16 and table.rel_error < 0.1
    assert max(l.rel_error for l in res.layers) < 0.1


def test_a_dynamic_sequence_is_measured_and_verified_at_a_size_that_runs(tmp_path):
    """Its 16-row position table does not run at the guessed 64 tokens: the sensitivity is measured and
    the output verified at the first of 64, 32, 16 ... that runs (said), as a static export would be."""
    import json

    from redpp_onnx.cli import main

    src, out, rep = tmp_path / "dyn.onnx", tmp_path / "out.onnx", tmp_path / "r.json"
    onnx.save(_dynamic_sequence_bert(), str(src))
    assert main(["compress", str(src), "-o", str(out), "--report", str(rep), "-q"]) == 0
    report = json.loads(rep.read_text())
    assert any("sensitivity measured with the dynamic dims of x set to 16" in n for n in report["notes"])
    assert not any("BatchNorm/moment estimate used instead" in n for n in report["notes"])
    table = next(l for l in report["layers"] if l["name"] == "/words/Gather")
    assert table["distinct_after"] > 16 and table["rel_error"] < 0.1
    assert report["verify"]["input_shapes"] == {"x": [2, 16]} and report["verify"]["guessed_dims"] == ["x"]
    assert report["verify"]["max_rel_l2"] < 0.045  # the default budget of a features output is 0.03
