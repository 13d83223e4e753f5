"""Relaxed split (METHOD.md step 3, our extension; off by default, data-free).

Per input channel ``c``, the non-zero kernels ``{W[o, c]}`` are clustered (average linkage,
Euclidean) and every cluster is replaced by its mean, with one cut distance per layer: the
largest (bisection) whose relative weight error ``‖W'−W‖/‖W‖`` stays within the budget. It
changes the function; the report gives the budget and the error reached.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from scipy.cluster.hierarchy import fcluster, linkage

BISECTION_STEPS = 14


@dataclasses.dataclass(frozen=True)
class Relaxed:
    weight: np.ndarray     # W' (same shape and dtype as W)
    distance: float        # the cut distance used (0: unchanged)
    rel_error: float       # ‖W'−W‖ / ‖W‖


def relax_kernels(weight: np.ndarray, budget: float) -> Relaxed:
    """Cluster each input channel's kernels within ``budget`` of relative weight error."""
    w = np.asarray(weight, np.float32)
    if budget <= 0 or w.ndim < 3:
        return Relaxed(w, 0.0, 0.0)
    c_out, c_in = w.shape[:2]
    flat = w.reshape(c_out, c_in, -1).astype(np.float64)
    norm = float(np.linalg.norm(flat))
    if norm == 0:
        return Relaxed(w, 0.0, 0.0)
    trees = []  # per channel: (rows of its non-zero kernels, linkage matrix)
    for c in range(c_in):
        nz = np.flatnonzero(np.any(flat[:, c] != 0, axis=1))
        if nz.size >= 2:
            trees.append((c, nz, linkage(flat[nz, c], method="average", metric="euclidean")))
    if not trees:
        return Relaxed(w, 0.0, 0.0)

    def apply(distance: float) -> np.ndarray:
        out = flat.copy()
        for c, nz, tree in trees:
            labels = fcluster(tree, distance, criterion="distance")
            if labels.max() == nz.size:
                continue  # every kernel alone
            sums = np.zeros((labels.max() + 1, flat.shape[2]))
            np.add.at(sums, labels, flat[nz, c])
            counts = np.bincount(labels, minlength=labels.max() + 1)[:, None]
            out[nz, c] = (sums / np.maximum(counts, 1))[labels]
        return out

    def error(candidate: np.ndarray) -> float:
        return float(np.linalg.norm(candidate - flat)) / norm

    lo, hi = 0.0, max(float(tree[-1, 2]) for _, _, tree in trees) * (1 + 1e-9)
    best, best_d, best_e = flat, 0.0, 0.0
    full = apply(hi)
    if error(full) <= budget:
        best, best_d, best_e = full, hi, error(full)
    else:
        for _ in range(BISECTION_STEPS):
            mid = 0.5 * (lo + hi)
            candidate = apply(mid)
            e = error(candidate)
            if e <= budget:
                lo, best, best_d, best_e = mid, candidate, mid, e
            else:
                hi = mid
    return Relaxed(best.reshape(w.shape).astype(np.float32), best_d, best_e)
