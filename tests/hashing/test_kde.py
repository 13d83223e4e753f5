"""Tests of the adaptive KDE hashing (redpp_onnx.hashing.kde)."""

import math

import numpy as np
import pytest

from redpp_onnx.hashing import (
    exact_kde_partition,
    hash_tensor,
    kde_partition,
    median_gap,
    suppress_modes,
)
from redpp_onnx.hashing import kde

N = 2000


def _conv_like(rng, shape=(32, 16, 3, 3)):
    """Realistic conv weights: Laplace/normal mixture scaled by 1/sqrt(fan_in), float32."""
    n = int(np.prod(shape))
    sigma = 1.0 / math.sqrt(np.prod(shape[1:]))
    laplace = rng.laplace(0, sigma / math.sqrt(2), n)
    w = np.where(rng.random(n) < 0.7, laplace, rng.normal(0, sigma / 2, n))
    return w.astype(np.float32).reshape(shape)


def _make(name, seed=0):
    rng = np.random.default_rng(seed)
    if name == "normal":
        w = rng.normal(0, 0.05, N)
    elif name == "laplace":
        w = rng.laplace(0, 0.03, N)
    elif name == "bimodal":
        w = np.concatenate([rng.normal(-0.1, 0.02, N // 2), rng.normal(0.12, 0.03, N - N // 2)])
    elif name == "quantized16":
        w = rng.integers(-8, 8, N) * 0.0125
    elif name == "constant":
        w = np.full(N, 0.3)
    elif name == "two_values":
        w = rng.choice([-0.2, 0.7], N)
    elif name == "outliers":  # 0.1 % of the weights at 100 sigma
        w = rng.normal(0, 0.05, N)
        w[rng.choice(N, N // 1000, replace=False)] = rng.choice([-5.0, 5.0], N // 1000)
    elif name == "conv":
        w = _conv_like(rng, (16, 14, 3, 3)).ravel()[:N]
    else:
        raise AssertionError(name)
    return w.astype(np.float32)


DISTRIBUTIONS = [
    "normal", "laplace", "bimodal", "quantized16", "constant", "two_values", "outliers", "conv"
]


def _purity(a, b, weights):
    """Share of the mass of each ``a`` cell that lies in its best-matching ``b`` cell."""
    key = a.astype(np.int64) * (int(b.max()) + 1) + b
    uniq, inv = np.unique(key, return_inverse=True)
    mass = np.bincount(inv, weights)
    best = np.zeros(int(a.max()) + 1)
    np.maximum.at(best, uniq // (int(b.max()) + 1), mass)
    return best.sum() / weights.sum()


def _agreement(p, q):
    """Label-free agreement of two partitions of the same values: the share of weights that
    stay together, in the worse of the two directions (a split or a merged cell both count)."""
    assert np.array_equal(p.values, q.values)
    return min(_purity(p.cells, q.cells, p.counts), _purity(q.cells, p.cells, p.counts))


def _bandwidth(w, factor):
    return median_gap(w) * factor if len(np.unique(w)) > 1 else 0.05 * factor


# --------------------------------------------------------------------------- partition


@pytest.mark.parametrize("name", DISTRIBUTIONS)
@pytest.mark.parametrize("factor", ["paper", "chosen"])
def test_binned_partition_matches_exact_kde(name, factor):
    w = _make(name)
    if factor == "paper":
        bandwidth = _bandwidth(w, 1.0)
    else:
        r = hash_tensor(w)
        bandwidth = r.bandwidth if r.changed else _bandwidth(w, 1.0)
    fast = kde_partition(w, bandwidth)
    exact = exact_kde_partition(w, bandwidth)
    assert fast.grid_size == exact.grid_size
    assert _agreement(fast, exact) >= 0.999


def test_agreement_measure_detects_a_moved_cut():
    w = _make("normal")
    p = kde_partition(w, _bandwidth(w, 5.0))
    big = int(np.argmax(p.sizes))
    starts = p.starts.copy()
    starts[big] += p.sizes[big] // 2  # move the cut into the middle of the largest cell
    moved = kde.Partition(
        p.values, p.counts, starts, p.cuts, p.modes, p.peaks, p.bandwidth, p.grid_size
    )
    assert _agreement(p, moved) < 0.999


def _literal_partition(values, bandwidth):
    """METHOD.md step 1 written out directly: exact KDE on one grid covering
    [min - 4Δ, max + 4Δ] (lattice j·Δ/4); local minima (a flat run, e.g. the underflow to 0
    in a wide gap, counts once, at its middle) cut the values."""
    v, c = np.unique(values.astype(np.float64), return_counts=True)
    h = bandwidth / 4
    grid = np.arange(math.floor(v[0] / h) - 16, math.ceil(v[-1] / h) + 17) * h
    d = np.exp(-0.5 * ((grid[:, None] - v[None, :]) / bandwidth) ** 2) @ c
    run_start = np.flatnonzero(np.concatenate(([True], d[1:] != d[:-1])))
    run_end = np.concatenate((run_start[1:], [len(d)])) - 1
    r = d[run_start]
    inner = np.flatnonzero((r[1:-1] < r[:-2]) & (r[1:-1] < r[2:])) + 1
    cuts = grid[run_start[inner]] + (run_end[inner] - run_start[inner]) * h / 2
    return np.searchsorted(cuts, v, side="right")


@pytest.mark.parametrize("seed", [0, 1])
def test_segmented_grid_matches_literal_method(seed):
    rng = np.random.default_rng(seed)
    w = np.concatenate([rng.laplace(0, 0.05, 400), [1.5, -2.0, 2.3]]).astype(np.float32)
    bandwidth = _bandwidth(w, 3.0)
    fast = kde_partition(w, bandwidth)
    assert len(np.unique(np.diff(fast.values) > 8 * bandwidth)) == 2  # several segments
    literal = _literal_partition(w, bandwidth)
    assert np.array_equal(fast.cells, literal)


def test_partition_structure():
    w = _make("conv")
    p = kde_partition(w, _bandwidth(w, 4.0))
    assert len(p.modes) == len(p.cuts) + 1 == len(p.starts) == len(p.peaks)
    assert np.all(np.diff(p.cuts) > 0) and np.all(np.diff(p.modes) > 0)
    lower = np.concatenate(([-np.inf], p.cuts))
    upper = np.concatenate((p.cuts, [np.inf]))
    assert np.all((p.modes >= lower) & (p.modes <= upper))
    cells = p.cells
    assert np.all((p.values >= lower[cells]) & (p.values < upper[cells]))
    assert np.array_equal(p.cell_of(p.values), cells)
    assert p.counts.sum() == w.size


def test_grid_stays_small_with_huge_outliers():
    rng = np.random.default_rng(3)
    w = rng.normal(0, 0.01, 5000)
    w[:5] = [1e4, -1e4, 3e3, 5e5, -7e5]
    bandwidth = _bandwidth(w, 1.0)
    assert kde._lattice(np.unique(w), bandwidth).size < 40 * len(w)  # checked before computing
    p = kde_partition(w, bandwidth)
    assert p.grid_size < 40 * len(p.values)
    assert set(p.cell_of([1e4, -1e4, 3e3, 5e5, -7e5])).isdisjoint(p.cell_of(w[5:]))


def test_chunked_density_gives_the_same_partition(monkeypatch):
    w = _make("laplace", seed=4)
    bandwidth = _bandwidth(w, 1.0)
    whole = kde_partition(w, bandwidth)
    monkeypatch.setattr(kde, "CHUNK_POINTS", 4 * kde._REACH + 37)
    chunked = kde_partition(w, bandwidth)
    assert whole.grid_size > 50 * kde.CHUNK_POINTS
    assert np.array_equal(whole.starts, chunked.starts)
    np.testing.assert_allclose(whole.modes, chunked.modes, rtol=0, atol=1e-12)


def test_kde_partition_rejects_bad_input():
    with pytest.raises(ValueError):
        kde_partition([0.1, np.nan], 0.1)
    with pytest.raises(ValueError):
        kde_partition([0.1, 0.2], 0.0)
    with pytest.raises(ValueError):
        kde_partition([], 0.1)


def test_suppress_modes_merges_into_higher_neighbours():
    w = _make("conv")
    p = kde_partition(w, _bandwidth(w, 1.0))
    radius = 4 * p.bandwidth
    q = suppress_modes(p, radius)
    assert suppress_modes(p, 0.0) is p
    assert q.n_cells < p.n_cells
    assert np.all(np.diff(q.modes) >= radius)
    # every new cell is a union of old ones and keeps the mode of its highest old cell
    old_group = np.searchsorted(q.starts, p.starts, side="right") - 1
    old_group[p.sizes == 0] = q.cell_of(p.modes[p.sizes == 0])
    for k in range(q.n_cells):
        members = np.flatnonzero(old_group == k)
        assert q.modes[k] == p.modes[members[np.argmax(p.peaks[members])]]
    assert np.array_equal(q.cell_of(q.values), q.cells)


# --------------------------------------------------------------------------- hash_tensor


@pytest.fixture(scope="module")
def conv():
    return _conv_like(np.random.default_rng(7), (64, 32, 3, 3))


@pytest.mark.parametrize("eps", [0.002, 0.01, 0.03, 0.1])
def test_budget_holds(conv, eps):
    r = hash_tensor(conv, weight_error=eps)
    assert r.changed and r.reason is None
    assert r.rel_error <= eps
    assert r.rel_error > 0.5 * eps  # the search does not stop at a needlessly small factor
    reference = conv.astype(np.float64)
    direct = np.linalg.norm(r.hashed - reference) / np.linalg.norm(reference)
    assert math.isclose(r.rel_error, direct, rel_tol=1e-9)
    assert 1.0 <= r.factor and math.isclose(r.bandwidth, r.factor * median_gap(conv), rel_tol=1e-12)


def test_larger_budget_keeps_fewer_values(conv):
    budgets = (0.002, 0.005, 0.01, 0.02, 0.05)
    after = [hash_tensor(conv, weight_error=e).distinct_after for e in budgets]
    assert all(b <= a for a, b in zip(after, after[1:])), after
    assert after[-1] < after[0] / 4


def test_fixed_factor(conv):
    r = hash_tensor(conv, bandwidth_factor=3.0, weight_error=0.0)
    assert r.factor == 3.0 and r.evaluations == 1
    assert math.isclose(r.bandwidth, 3.0 * median_gap(conv), rel_tol=1e-12)
    p = kde_partition(conv, r.bandwidth)
    expected = p.modes.astype(np.float32)[p.cell_of(conv.ravel())]
    assert np.array_equal(r.hashed.ravel(), expected)


def test_paper_factor_removes_fewer_values_than_default(conv):
    paper = hash_tensor(conv, bandwidth_factor=1.0)
    default = hash_tensor(conv)
    assert paper.changed and default.changed
    assert default.distinct_after < paper.distinct_after < paper.distinct_before
    assert default.factor > 1.0


def test_search_result_is_reproducible_with_its_factor(conv):
    r = hash_tensor(conv)
    again = hash_tensor(conv, bandwidth_factor=r.factor)
    assert np.array_equal(r.hashed, again.hashed)
    assert r.evaluations > 1


def test_unchanged_when_no_factor_meets_the_budget(conv):
    r = hash_tensor(conv, weight_error=1e-7)
    assert not r.changed and "f >= 1" in r.reason
    assert np.array_equal(r.hashed, conv) and r.rel_error == 0.0
    assert r.distinct_after == r.distinct_before and r.bound == 0.0
    assert r.bandwidth is None and r.factor is None


def test_single_mode_when_it_meets_the_budget():
    w = (1.0 + 1e-4 * np.random.default_rng(0).normal(size=500)).astype(np.float32)
    r = hash_tensor(w)
    assert r.distinct_after == 1 and r.rel_error <= 0.01


@pytest.mark.parametrize("w", [np.full((4, 5), 0.25), np.array([0.5, -0.5, 0.5, 0.5])])
def test_fewer_than_three_values_left_unchanged(w):
    r = hash_tensor(w)
    assert not r.changed and "fewer than 3" in r.reason
    assert np.array_equal(r.hashed, w.astype(np.float32)) and r.hashed.shape == w.shape
    assert np.array_equal(r.codebook[r.codes], r.hashed)
    assert r.reduction == 0.0


def test_empty_tensor():
    r = hash_tensor(np.zeros((0, 3), np.float32))
    assert not r.changed and r.reason == "empty tensor"
    assert r.hashed.shape == (0, 3) and r.codes.shape == (0, 3)
    assert r.distinct_before == r.distinct_after == 0 and r.reduction == 0.0


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf, 1e300])
def test_non_finite_input_raises(bad):
    w = np.linspace(-1, 1, 50)
    w[7] = bad
    with pytest.raises(ValueError, match="NaN or inf"):
        hash_tensor(w)


def test_invalid_options_raise(conv):
    for kwargs in (dict(weight_error=-0.1), dict(bandwidth_factor=0.0), dict(nms_radius=-1.0)):
        with pytest.raises(ValueError):
            hash_tensor(conv, **kwargs)
    with pytest.raises(TypeError):
        hash_tensor(np.array(["a", "b", "c"]))


def test_float64_input():
    w = np.random.default_rng(1).laplace(0, 0.05, (40, 30))
    r = hash_tensor(w)
    assert r.hashed.dtype == np.float32 and r.codebook.dtype == np.float32
    assert r.distinct_before == len(np.unique(w.astype(np.float32)))
    ref = hash_tensor(w.astype(np.float32))
    assert np.array_equal(r.hashed, ref.hashed)


@pytest.mark.parametrize("shape", [(), (7,), (3, 50), (4, 3, 3, 3), (2, 3, 4, 5, 6)])
def test_shapes_preserved_and_codes_round_trip(shape):
    w = np.random.default_rng(2).normal(0, 0.1, shape).astype(np.float32)
    r = hash_tensor(w)
    assert r.hashed.shape == r.codes.shape == w.shape
    assert r.hashed.dtype == np.float32
    assert np.array_equal(r.codebook[r.codes], r.hashed)
    assert np.all(np.diff(r.codebook) > 0) and len(r.codebook) == r.distinct_after
    assert r.distinct_after == len(np.unique(r.hashed))


def test_codes_dtype(conv):
    small = hash_tensor(conv, weight_error=0.05)
    assert small.distinct_after <= 256 and small.codes.dtype == np.uint8
    medium = hash_tensor(conv, bandwidth_factor=1.0)
    assert 256 < medium.distinct_after <= 65536 and medium.codes.dtype == np.uint16
    assert [kde._code_dtype(n) for n in (1, 256, 257, 65536, 65537)] == [
        np.uint8, np.uint8, np.uint16, np.uint16, np.int32]


def test_result_arrays_are_read_only(conv):
    r = hash_tensor(conv)
    for a in (r.hashed, r.codebook, r.codes):
        with pytest.raises(ValueError):
            a.flat[0] = 0


def test_nms_reduces_modes(conv):
    plain = hash_tensor(conv, bandwidth_factor=2.0)
    tau = 6 * plain.bandwidth
    nms = hash_tensor(conv, bandwidth_factor=2.0, nms_radius=tau)
    assert nms.n_modes < plain.n_modes and nms.distinct_after < plain.distinct_after
    rounding = 2 * np.spacing(np.abs(nms.codebook).max())  # modes are float32 in the codebook
    assert np.all(np.diff(nms.codebook.astype(np.float64)) >= tau - rounding)
    searched = hash_tensor(conv, nms_radius=0.0005)
    assert searched.changed and searched.rel_error <= 0.01
    assert np.all(np.diff(searched.codebook.astype(np.float64)) >= 0.0005 - rounding)
    assert searched.distinct_after < hash_tensor(conv).distinct_after


@pytest.fixture(scope="module")
def off_zero(conv):
    """Conv weights shifted so that no mode falls on the grid point 0 by itself."""
    return conv + np.float32(0.0031)


def test_snap_zero(off_zero):
    plain = hash_tensor(off_zero, bandwidth_factor=5.0)
    assert 0.0 not in plain.codebook
    snapped = hash_tensor(off_zero, bandwidth_factor=5.0, snap_zero=True, weight_error=0.05)
    assert snapped.snapped_zero and 0.0 in snapped.codebook
    moved = snapped.hashed != plain.hashed
    assert np.all(snapped.hashed[moved] == 0.0) and moved.any()
    assert snapped.rel_error <= 0.05
    assert 0.0 not in hash_tensor(off_zero).codebook
    searched = hash_tensor(off_zero, snap_zero=True)
    assert searched.snapped_zero and 0.0 in searched.codebook and searched.rel_error <= 0.01


def test_snap_zero_only_within_budget(off_zero):
    r = hash_tensor(off_zero, bandwidth_factor=5.0, snap_zero=True, weight_error=0.0)
    assert not r.snapped_zero and 0.0 not in r.codebook
    far = (1.0 + 0.1 * np.random.default_rng(0).normal(size=3000)).astype(np.float32)
    r = hash_tensor(far, snap_zero=True)
    assert r.changed and not r.snapped_zero and 0.0 not in r.codebook and r.rel_error <= 0.01


def test_exact_zeros_stay_zero():
    rng = np.random.default_rng(6)
    w = rng.laplace(0, 0.05, 4000)
    w[rng.random(4000) < 0.5] = 0.0
    r = hash_tensor(w.astype(np.float32))
    assert r.changed and 0.0 in r.codebook
    assert np.all(r.hashed[w == 0] == 0.0)


def test_bounds(conv):
    r = hash_tensor(conv)
    expected_b = r.bandwidth / math.sqrt(2 * math.pi) * (math.sqrt(2 / math.pi) + math.sqrt(3))
    assert math.isclose(r.bound_b, expected_b, rel_tol=1e-12)
    assert r.bound == min(r.bound_a, r.bound_b) > 0
    # A, written out: every weight pays the length of the interval it lies in, where the
    # intervals join min(W), the codebook values and max(W)
    w = np.sort(conv.ravel().astype(np.float64))
    points = np.unique(np.concatenate(([w[0]], r.codebook, [w[-1]])))
    k = np.minimum(np.searchsorted(points, w, side="right") - 1, len(points) - 2)
    assert math.isclose(r.bound_a, np.mean(points[k + 1] - points[k]), rel_tol=1e-9)
    err = np.abs(r.hashed.astype(np.float64) - conv)
    assert math.isclose(r.mean_abs_error, err.mean(), rel_tol=1e-9)
    assert r.mean_abs_error <= r.bound_a
