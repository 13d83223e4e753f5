"""The C++ binning of the KDE (redpp_onnx._core.kde_moments) gives the numpy form's numbers, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

from redpp_onnx.hashing import kde


def _both(fn):
    out = []
    for native in (True, False):
        old = kde.NATIVE
        kde.NATIVE = native
        try:
            out.append(fn())
        finally:
            kde.NATIVE = old
    return out


def test_native_binning_is_built():
    assert kde._native() is not None


@pytest.mark.parametrize("kind", ["laplace", "normal", "pruned", "outliers", "few"])
def test_native_and_numpy_binning_hash_identically(kind):
    rng = np.random.default_rng(7)
    n = 300_000
    w = {"laplace": rng.laplace(0, 0.02, n), "normal": rng.normal(0.1, 1.0, n),
         "pruned": np.where(rng.random(n) < 0.5, 0.0, rng.normal(0, 0.05, n)),
         "outliers": np.concatenate([rng.normal(0, 0.01, n - 10), rng.uniform(-5, 5, 10)]),
         "few": rng.integers(-40, 40, n) * 0.013}[kind].astype(np.float32)
    native, ref = _both(lambda: kde.hash_tensor(w, weight_error=0.01))
    assert native.hashed.tobytes() == ref.hashed.tobytes()
    assert native.factor == ref.factor and native.evaluations == ref.evaluations
    v, c = np.unique(w.astype(np.float64), return_counts=True)
    bandwidth = 0.7 * (native.bandwidth or kde.median_gap(w) * 3)
    p_native, p_ref = _both(lambda: kde.kde_partition(w, bandwidth))
    assert p_native.modes.tobytes() == p_ref.modes.tobytes() and p_native.cuts.tobytes() == p_ref.cuts.tobytes()
    assert len(v) == native.distinct_before and c.sum() == n
