"""Unary-class rank codes (prototype, benchmarks/_unary_code.py): the planner against brute
force, numpy round trips, and the standard-ops decoder in onnxruntime (opsets 11, 13, 17), all
decoded codes compared with the input exactly over seeded random histograms."""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper

from redpp_onnx.passes import codebook as cb
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import _unary_code as u  # noqa: E402


def _hist_cases(seed=0):
    """(label, codes, n_ranks): geometric, peaked, flat histograms; tiny and large n; 1..4096
    ranks; a rank count not a power of two; codes missing the top ranks."""
    rng = np.random.default_rng(seed)
    cases = []

    def draw(label, p, n):
        p = np.asarray(p, np.float64)
        cases.append((label, rng.choice(p.size, n, p=p / p.sum()), p.size))

    for n in (1, 2, 3, 7, 8, 9, 17, 64, 1000):
        draw(f"geo n={n}", 0.6 ** np.arange(20), n)
    for p0 in (0.3, 0.5, 0.8, 0.95):
        for m in (2, 3, 33, 256):
            p = np.full(m, (1 - p0) / max(m - 1, 1))
            p[0] = p0
            draw(f"peaked p0={p0} m={m}", p, int(rng.integers(1, 3000)))
    for m in (1, 2, 5, 200, 256, 4096):
        draw(f"flat m={m}", np.ones(m), int(rng.integers(1, 5000)))
    draw("geo q=0.9 m=4096", 0.9 ** np.arange(4096) + 1e-6, 20000)
    draw("|normal| n=100000", np.exp(-0.5 * (np.arange(300) / 20.0) ** 2), 100000)
    for i in range(12):
        m = int(rng.integers(1, 4097))
        draw(f"random m={m}", rng.random(m) ** int(rng.integers(1, 8)) + 1e-9, int(rng.integers(1, 4000)))
    return cases


CASES = _hist_cases()


def _all_layouts(m, k_max=16, o_max=4):
    """Every unary layout covering ``m`` ranks (classes of <= 2^o_max ranks)."""
    def rec(start, prefix):
        if start >= m:
            yield tuple(prefix)
            return
        if len(prefix) == k_max:
            return
        for o in range(o_max + 1):
            yield from rec(start + (1 << o), prefix + [o])
    yield from rec(0, [])


def test_planner_is_optimal_against_brute_force():
    rng = np.random.default_rng(1)
    for trial in range(150):
        m = int(rng.integers(1, 9))
        h = rng.integers(0, 50, m) * (rng.random(m) < 0.8)
        level = int(rng.choice([0, 0, 7, 60]))
        bits, layout = u.plan_unary(h, level_bits=level)
        assert bits == u.unary_bits(h, layout)
        brute = min(u.unary_bits(h, u.UnaryLayout(lay)) + level * (len(lay) - 1) for lay in _all_layouts(m))
        assert bits + level * (len(layout) - 1) == brute, (h, level, layout)


def test_planner_max_classes_and_ties():
    h = np.ones(256, np.int64) * 10
    bits, layout = u.plan_unary(h)
    assert (bits, tuple(layout)) == (256 * 10 * 8, (8,))  # ties: fewest classes
    h = np.array([1000, 10, 10, 10])
    b2, l2 = u.plan_unary(h, max_classes=2)
    assert len(l2) <= 2 and b2 >= u.plan_unary(h)[0]
    b1, l1 = u.plan_unary(h, max_classes=1)
    assert tuple(l1) == (2,) and b1 == 2 * h.sum()
    with pytest.raises(ValueError):
        u.plan_unary(np.ones(1 << 17), max_classes=1)
    # geometric 1/2: the unary code is the optimal prefix code, entropy exactly
    h = 2 ** np.arange(12)[::-1]
    p = h / h.sum()
    bits, _ = u.plan_unary(h)
    assert bits == int(round(-(h * np.log2(p)).sum()))


def test_best_layout_is_the_cheaper():
    for label, codes, m in CASES:
        h = np.bincount(codes, minlength=m)
        bits, kind, layout = u.best_layout(h)
        fb, _ = cb.plan_layout(h)
        ub, _ = u.plan_unary(h)
        assert bits == min(fb, ub), label
        assert kind == ("unary" if ub < fb else "fixed"), label
        if kind == "fixed":
            assert bits == cb.stored_bits(codes, layout) if codes.size else True


def test_numpy_round_trip_and_stream_sizes():
    for label, codes, m in CASES:
        h = np.bincount(codes, minlength=m)
        bits, layout = u.plan_unary(h)
        streams = u.encode_unary(codes, layout)
        assert len(streams) == len(layout)
        assert np.array_equal(u.decode_unary(streams, layout, codes.size), codes), label
        data_bits = sum(8 * (s.size - 1) for s in streams[:-1])
        assert bits - 7 * (len(layout) - 1) <= data_bits + int((np.asarray(layout)[
            np.searchsorted(layout.bases, codes, side="right") - 1]).sum()) <= bits + 7 * len(layout), label


def test_encode_rejects_and_decode_detects_corruption():
    layout = u.UnaryLayout((0, 1, 2))
    with pytest.raises(ValueError):
        u.encode_unary(np.array([0, 7]), layout)  # capacity 7: ranks 0..6
    with pytest.raises(ValueError):
        u.UnaryLayout(())
    codes = np.array([0, 1, 2, 3, 4, 5, 6, 0, 0, 1])
    streams = u.encode_unary(codes, layout)
    with pytest.raises(ValueError):
        u.decode_unary(streams[1:], layout, codes.size)
    bad = [s.copy() for s in streams]
    bad[0][0] ^= 1  # first weight leaves class 0
    assert not np.array_equal(u.decode_unary(bad, layout, codes.size), codes)


def _session(model):
    so = ort.SessionOptions()
    so.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def _merged_model(cases, opset):
    """Every case decoded twice: by build_decoder (outputs 2i) and build_decoder_compact (2i+1)."""
    graph = helper.make_graph([], "cases", [], [])
    b = cb._Builder(graph, opset)
    outputs = []
    for i, (label, codes, m) in enumerate(cases):
        _, layout = u.plan_unary(np.bincount(codes, minlength=m))
        streams = u.encode_unary(codes, layout)
        for j, x in enumerate((u.build_decoder(b, streams, layout, codes.size),
                               u.build_decoder_compact(b, streams, layout, codes.size, u.reach_counts(codes, layout)))):
            b.op("Cast", [x], [f"out{2 * i + j}"], to=onnx.TensorProto.INT64)
            outputs.append(helper.make_tensor_value_info(f"out{2 * i + j}", onnx.TensorProto.INT64, [codes.size]))
    graph = helper.make_graph(b.nodes, "cases", [], outputs, b.inits)
    opsets = [helper.make_opsetid("", opset)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=helper.find_min_ir_version_for(opsets))


@pytest.mark.parametrize("opset", [11, 13, 17])
def test_onnx_decoder_exact(opset):
    model = _merged_model(CASES, opset)
    onnx.checker.check_model(model)
    assert {n.op_type for n in model.graph.node} <= {"Cast", "Range", "CumSum", "Gather", "Div", "Mod", "Sub",
                                                      "Mul", "Add", "Slice", "TopK", "Split", "Identity", "Expand",
                                                      "Concat", "ScatterElements"}
    outs = _session(model).run(None, {})
    for i, (label, codes, _) in enumerate(CASES):
        assert np.array_equal(outs[2 * i], codes), f"opset {opset}: {label}"
        assert np.array_equal(outs[2 * i + 1], codes), f"opset {opset}, compact: {label}"


@pytest.mark.parametrize("compact", [False, True])
def test_onnx_decoder_folds_completely(compact, tmp_path):
    """Every node has constant inputs only and onnxruntime folds them all (Compress or NonZero
    would stay in the graph and run at every inference)."""
    rng = np.random.default_rng(5)
    p = 0.7 ** np.arange(40)
    codes = rng.choice(40, 3000, p=p / p.sum())
    _, layout = u.plan_unary(np.bincount(codes, minlength=40))
    assert len(layout) > 3
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.optimized_model_filepath = str(tmp_path / "opt.onnx")
    ort.InferenceSession(u.decoder_model(codes, layout, 13, compact=compact).SerializeToString(), so,
                         providers=["CPUExecutionProvider"])
    assert len(onnx.load(str(tmp_path / "opt.onnx")).graph.node) == 0


def test_onnx_decoder_counts_levels_and_against_existing():
    """The unary decoder has K - 1 levels of 11 nodes at most; the comparison decoder (the
    existing one, via decoder_model) decodes the same codes."""
    rng = np.random.default_rng(3)
    codes = rng.choice(64, 5000, p=0.8 ** np.arange(64) / (0.8 ** np.arange(64)).sum())
    h = np.bincount(codes, minlength=64)
    _, ul = u.plan_unary(h)
    _, fl = cb.plan_layout(h)
    for layout in (ul, fl):
        m = u.decoder_model(codes, layout, 13)
        assert np.array_equal(_session(m).run(None, {})[0], codes)
    nodes, nbytes = u.node_bytes(u.decoder_model(codes, ul, 13))
    assert nodes <= 11 * (len(ul) - 1) + 20 and nbytes < 600 * len(ul)
