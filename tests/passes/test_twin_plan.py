"""The twin-measured reduction plan (``redpp_onnx/passes/twin_plan.py``): the backward elimination
against a brute-force least squares, a channel that is a sum of two others goes first (the
closed-form one-partner cost cannot see it), the allocation against a brute-force search, and when
the plan applies or falls back (with its reason in the notes)."""

from __future__ import annotations

import itertools

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from redpp_onnx.passes import reduce as R
from redpp_onnx.passes import refit as RF
from redpp_onnx.passes import twin_plan as TP

from ..graphs import GraphBuilder

SIZE = 8


def _run(model, x):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return np.asarray(sess.run(None, {"x": x})[0], np.float64)


def _rel(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(a))


def _moments(x, y):
    return (x.T @ x, x.T @ y, x.sum(0), y.sum(0), len(x))


def _residual(mom, keep, gain, lam):
    """Brute force: the weighted residual energy per row of the least squares on features ``keep``."""
    cxx, cxy, _, _ = RF.covariances(mom)
    cxy = cxy * gain[None, :]
    c = cxx[np.ix_(keep, keep)]
    w = np.linalg.solve(c + lam * np.eye(len(keep)), cxy[keep])
    return -float(np.sum(cxy[keep] * w))  # the residual, up to the constant output energy


def test_backward_elimination_matches_brute_force_least_squares():
    rng = np.random.default_rng(0)
    taps, ch, outs, n = 3, 6, 4, 4000
    x = rng.standard_normal((n, ch * taps)) @ rng.standard_normal((ch * taps, ch * taps)) * 0.5
    y = x @ rng.standard_normal((ch * taps, outs)) + 0.3 * rng.standard_normal((n, outs))
    mom = _moments(x, y)
    gain = np.array([1.0, 2.0, 0.5, 1.5])
    order, costs = TP.elimination_order(mom, list(range(ch)), taps, gain, limit=4)
    cxx, cxy, _, _ = RF.covariances(mom)
    lam = RF.RIDGE * float(np.mean(np.diag(cxx)))
    total = float(np.sum((cxy * gain) * (np.linalg.solve(cxx + lam * np.eye(ch * taps), cxy * gain))))
    feats = lambda chans: np.array([c * taps + t for c in chans for t in range(taps)])  # noqa: E731
    alive = list(range(ch))
    base = _residual(mom, feats(alive), gain, lam)
    for step, (c, cost) in enumerate(zip(order, costs)):
        rises = {k: _residual(mom, feats([a for a in alive if a != k]), gain, lam) - base for k in alive}
        assert c == min(rises, key=rises.get), step  # the cheapest channel, by brute force
        assert cost == pytest.approx(rises[c] / total, rel=1e-6, abs=1e-12)
        alive.remove(c)
        base += rises[c]
    assert len(order) == 4 and len(set(order)) == 4


def _sum_of_two(seed=1, c=6, small=4, sum_of=(0, 1), sum_idx=5):
    """x -> Conv(3 -> c) -> Conv(c -> 5, 3x3), no activation: filter ``sum_idx`` is 3 x (f0 + f1)
    (a large channel any refit rebuilds from two others), filter ``small`` is a unique one at 0.5x (the closed-form cost, one partner at most, prunes it)."""
    g = GraphBuilder(seed)
    w = g.weights(c, 3, 3, 3)
    w[small] *= 0.5
    w[sum_idx] = 3.0 * (w[sum_of[0]] + w[sum_of[1]])
    h = g.node("Conv", ["x", g.const(w, "W")], pads=[1] * 4)
    y = g.node("Conv", [h, g.const(g.weights(5, c, 3, 3), "W2"), g.const(g.weights(5, scale=0.1), "B2")], pads=[1] * 4)
    return g.model(["N", 3, SIZE, SIZE], y)


def test_a_channel_that_is_a_sum_of_two_others_goes_first_and_the_refit_rebuilds_it():
    model = _sum_of_two()
    config = dict(alpha=1 / 6, strategy="uniform", multiple=1)
    twin_plan = R.reduce_channels(model, R.ReduceConfig(**config))
    cost_plan = R.reduce_channels(model, R.ReduceConfig(plan="cost", **config))
    for res in (twin_plan, cost_plan):
        assert sum(r.pruned + r.merged for r in res.layers) == 1
    assert any("plan measured on the synthetic twin: channels of 1 of 1 group" in n for n in twin_plan.notes)
    kept = [onnx.numpy_helper.to_array(t) for t in twin_plan.model.graph.initializer if tuple(t.dims) == (5, 3, 3, 3)]
    assert len(kept) == 1  # the producer lost a filter: 5 of 6 left
    x = np.random.default_rng(7).standard_normal((16, 3, SIZE, SIZE)).astype(np.float32)
    ref = _run(model, x)
    err_twin, err_cost = _rel(ref, _run(twin_plan.model, x)), _rel(ref, _run(cost_plan.model, x))
    assert err_twin < 1e-2 and err_cost > 10 * err_twin  # on inputs neither was fitted on
    # the twin plan removed one of f0, f1, f5 (each the combination of the other two); the small unique f4 stayed
    w0 = onnx.numpy_helper.to_array(next(t for t in model.graph.initializer if tuple(t.dims) == (6, 3, 3, 3)))
    left = {i for i in range(6) for row in kept[0] if np.array_equal(row, w0[i])}
    assert len(left) == 5 and 4 in left and ({0, 1, 5} - left)


def test_the_allocation_finds_the_brute_force_optimum_on_convex_tables():
    rng = np.random.default_rng(3)
    n_groups, table = 4, {}
    for k in range(n_groups):
        macs = float(rng.integers(1, 5))
        slope = np.cumsum(rng.uniform(0.1, 1.0, 4))  # increasing marginal drift: convex
        for r in range(1, 5):
            table[(k, r)] = (float(np.sum(slope[:r])) * macs, r * macs)
    choices = [[0] + [r for (kk, r) in table if kk == k] for k in range(n_groups)]

    def value(counts):
        d = sum(table[(k, r)][0] for k, r in enumerate(counts) if r)
        m = sum(table[(k, r)][1] for k, r in enumerate(counts) if r)
        return d, m

    total = value([4] * n_groups)[1]
    for share in (0.2, 0.45, 0.7):
        counts, got = TP.allocate(n_groups, table, share * total)
        d, m = value(counts)
        assert m == pytest.approx(got) and m >= share * total
        best = min(value(c)[0] for c in itertools.product(*choices) if value(c)[1] >= m)
        assert d == pytest.approx(best)  # nothing removes as many MACs for less drift


def test_options_are_valid_counts_at_most_max_options_the_largest_kept():
    opts = TP.options(64, 32, 8)
    assert opts == [8, 16, 24, 32]
    many = TP.options(1152, 576, 8)
    assert len(many) <= TP.MAX_OPTIONS and many[-1] == 576 and all((1152 - r) % 8 == 0 for r in many)


def _depthwise(seed=2, c=8):
    g = GraphBuilder(seed)
    h = g.node("Relu", [g.bn(g.conv("x", 3, c, bias=False), c)])
    h = g.node("Relu", [g.bn(g.conv(h, c, c, group=c, bias=False), c)])
    return g.model(["N", 3, SIZE, SIZE], g.conv(h, c, 4, k=1, pads=[0] * 4))


def _direct(seed=2, c=16):
    g = GraphBuilder(seed)
    h = g.node("Relu", [g.bn(g.conv("x", 3, c, bias=False), c)])
    h = g.node("Relu", [g.bn(g.conv(h, c, c, bias=False), c)])
    return g.model(["N", 3, SIZE, SIZE], g.conv(h, c, 4))


def test_target_macs_measures_the_plan_on_a_direct_model_and_falls_back_through_a_depthwise_conv():
    res = R.reduce_channels(_direct(), R.ReduceConfig(target_macs=0.8, multiple=1))
    assert res.macs_removed >= 0.2
    assert any("plan measured on the synthetic twin" in n and "options measured one group at a time" in n
               for n in res.notes)
    assert sum(r.merged for r in res.layers) == 0 and sum(r.pruned for r in res.layers) > 0
    dw = R.reduce_channels(_depthwise(), R.ReduceConfig(target_macs=0.9, multiple=1))
    assert any(n.startswith("closed-form plan (twin-measured plan not used") and "per-channel op" in n
               for n in dw.notes)
    off = R.reduce_channels(_direct(), R.ReduceConfig(target_macs=0.8, multiple=1, plan="cost"))
    assert not any("measured on the synthetic twin" in n for n in off.notes)
    with pytest.raises(Exception, match="plan must be"):
        R.ReduceConfig(plan="magic")


def test_the_twin_plan_reads_no_data_and_is_deterministic():
    a = R.reduce_channels(_direct(), R.ReduceConfig(target_macs=0.8, multiple=1))
    b = R.reduce_channels(_direct(), R.ReduceConfig(target_macs=0.8, multiple=1))
    assert a.model.SerializeToString() == b.model.SerializeToString()
