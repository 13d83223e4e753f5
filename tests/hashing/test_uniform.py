"""Tests of the uniform symmetric int8 baseline (redpp_onnx.hashing.uniform)."""

import numpy as np
import pytest

from redpp_onnx.hashing import uniform_int8


@pytest.fixture(scope="module")
def w():
    rng = np.random.default_rng(0)
    x = rng.laplace(0, 0.05, (64, 32, 3, 3))
    x.flat[17] = -0.9  # the extreme value is negative
    return x.astype(np.float32)


def test_at_most_255_levels(w):
    r = uniform_int8(w)
    assert r.changed and r.distinct_before > 10000
    assert r.distinct_after <= 255 and len(r.codebook) == r.distinct_after
    assert r.codes.dtype == np.uint8
    assert np.array_equal(r.codebook[r.codes], r.hashed)


def test_error_bounded_by_half_a_step(w):
    r = uniform_int8(w)
    assert np.isclose(r.scale, 0.9 / 127, rtol=1e-6)
    err = np.abs(r.hashed.astype(np.float64) - w)
    assert err.max() <= r.scale / 2 + np.spacing(np.float32(0.9))
    rel = np.linalg.norm(r.hashed.astype(np.float64) - w) / np.linalg.norm(w.astype(np.float64))
    assert np.isclose(r.rel_error, rel, rtol=1e-9)
    assert np.isclose(r.mean_abs_error, err.mean(), rtol=1e-9)


def test_symmetric_levels(w):
    r = uniform_int8(w)
    levels = r.codebook.astype(np.float64) / r.scale
    assert np.allclose(levels, np.round(levels), atol=1e-3)
    assert np.round(levels).min() == -127 and np.round(levels).max() <= 127
    assert r.hashed.flat[17] == np.float32(-0.9)
    zeros = np.zeros(5, np.float32)
    r0 = uniform_int8(np.concatenate([w.ravel()[:100], zeros]))
    assert np.all(r0.hashed[-5:] == 0.0)


def test_shape_and_dtype():
    x = np.random.default_rng(1).normal(size=(3, 4, 5))  # float64
    r = uniform_int8(x)
    assert r.hashed.shape == r.codes.shape == (3, 4, 5)
    assert r.hashed.dtype == np.float32
    assert r.distinct_before == len(np.unique(x.astype(np.float32)))


def test_all_zero_and_empty_unchanged():
    r = uniform_int8(np.zeros((2, 3), np.float32))
    assert not r.changed and "zero" in r.reason and r.scale == 0.0
    assert np.array_equal(r.hashed, np.zeros((2, 3), np.float32))
    e = uniform_int8(np.zeros((0,), np.float32))
    assert not e.changed and e.reason == "empty tensor" and e.hashed.shape == (0,)


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_non_finite_raises(bad):
    x = np.ones(10, np.float32)
    x[3] = bad
    with pytest.raises(ValueError, match="NaN or inf"):
        uniform_int8(x)
