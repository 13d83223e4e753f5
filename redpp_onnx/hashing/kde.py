"""Adaptive KDE hashing of one weight tensor (RED++ step 1, as ``METHOD.md`` fixes it).

Pure functions on numpy arrays; no ONNX or graph knowledge.

The method
----------
Let ``v_1 < ... < v_U`` be the distinct values of the tensor ``W`` (``N`` weights) and ``c_i``
their multiplicities. With the bandwidth ``Δ = median(v_{i+1} - v_i) × f`` the Gaussian kernel
density estimate is

    d(ω) = 1 / (N Δ √(2π)) · Σ_i c_i exp(-(ω - v_i)² / (2 Δ²)).

``d`` is evaluated on a regular grid of step ``h = Δ/4`` (rounded to a float32 number, see
:func:`grid_step`); its strict local minima cut the real
line into cells, and every weight becomes the mode (highest grid point) of its cell. Plateaus
(runs of equal density) count as one extremum placed at their middle.

The grid
~~~~~~~~
* **Anchored at zero.** Grid points are the multiples ``j·h`` (``j`` integer), so 0 is a grid
  point: a mass of exact zeros (a pruned layer) has its mode exactly at 0.
* **Segments.** The sorted values are split wherever two consecutive ones are more than
  ``8Δ`` apart. Each segment gets the grid ``[min_s - 4Δ, max_s + 4Δ]`` (rounded outwards to
  the lattice) and the empty gaps between segments get no grid points. Across a gap wider than
  ``8Δ`` each side's density falls below ``e^{-8}`` of a single weight's peak, the exact KDE
  has a minimum in the gap and no weight lies inside it, so where the cut falls in the gap does
  not matter: we place it at the junction of the two grids, laid end to end (``_lattice``).
  With huge outliers and a tiny ``Δ`` this keeps the grid at most ``34·U`` points instead of
  ``range/h``, without coarsening the step.
* **Chunks.** The (concatenated) grid is processed in blocks of ``2^22`` points that overlap
  by the kernel's reach, so memory stays bounded whatever the grid size; the step is never
  coarsened, there is no cap on the number of points.

The density
~~~~~~~~~~~
Binning plus an FFT convolution with the sampled Gaussian kernel, truncated at ``±8Δ``
(``e^{-32} ≈ 1e-14``): ``O(U + S log S)`` for ``S`` grid points instead of the exact sum's
``O(U·S)``. METHOD.md asks for *linear* binning and for the same partition as the exact KDE on
at least 99.9 % of the weights; plain linear binning does not meet the second requirement. Its
error, ``½δ(1-δ)h²·d''``, about 1 % of the density at ``h = Δ/4``, moves or removes shallow
extrema: against the exact KDE (2,000 to 3,000-weight tensors of five distributions, several
seeds, ``f`` from 1 to the chosen one) the worst agreement was 98.6 % at ``h = Δ/4``, 97.8 % at
``Δ/8`` and 99.55 % at ``Δ/16``. Decision: keep the binning-plus-FFT scheme and the step
``Δ/4``, but bin Taylor moments instead of linear weights. Linear binning spreads each value's
count over two grid points so that the 0th and 1st moments are right; here each value adds
``c·δ^m`` (``m = 0..4``) to moment arrays at its nearest grid point, and each moment array is
convolved with the matching derivative of the kernel (see ``_binned_density``): the density
within 2Δ of the data is then exact to a few 1e-6 (relative). Measured the same way, the agreement
is 100 % in every case (also with orders up to 3; up to order 2 it drops to 99.25 %). Cost: 5 binnings and
5 forward FFTs instead of 2 and 1. :func:`exact_kde_partition` evaluates the exact sum on the
same grid (reference for the tests).

The bandwidth factor
~~~~~~~~~~~~~~~~~~~~
With ``bandwidth_factor=None`` (default) ``f`` is the largest factor whose relative error
``‖W̃ - W‖ / ‖W‖`` stays within ``weight_error``, found by bisection on ``log f`` over
``[1, f_max]`` with ``f_max = (v_U - v_1) / median(diff v)`` (the bandwidth equals the range:
one mode). The bisection stops when the bracket is narrower than 1 % in ``f``: with the
evaluation of ``f_max`` that makes ``1 + ceil(log2(ln f_max / ln 1.01))`` KDE evaluations,
about 10 for a 30-weight tensor and 12 for a 2-million-weight one. The error is not exactly
monotone in ``f`` (modes sit on a grid whose step scales with ``f``): the bisection only ever
raises its lower end to a factor that was evaluated and met the budget, and that factor is the
one returned, so the result always meets the budget; it is the largest feasible factor at a
feasibility boundary within 1 %, not necessarily the global maximum. ``f_max`` is tried
first (a tensor whose single mode meets the budget is hashed to that mode), and ``f = 1`` is
tried last if nothing else met the budget; if ``f = 1`` fails too the tensor is returned
unchanged with a ``reason``. Factors below 1 (finer than the paper's literal rule) are never
used.

Options: ``nms_radius`` (non-maximum suppression of close modes, see :func:`suppress_modes`)
and ``snap_zero`` (the cell that contains 0 takes the value 0 when the budget allows; with
the automatic factor the search then looks for the largest ``f`` whose *snapped* hashing meets
the budget, and falls back to the plain search if none does; with a fixed factor the snap is
applied when its error is within ``weight_error``).

Bound
~~~~~
``HashResult`` carries the per-weight bound ``u = min(A, B)`` of ``METHOD.md`` "Theory" (paper
eqs. A, B). Our reading of the paper's ``A``: with ``p_0 = min W < p_1 < ... < p_K = max W``
the codebook values completed by the two ends of the support (the paper writes the extreme
local minima ``m_1^-, m_{|M^-|}^-``, which lie outside the data; using the data's ends makes
the bound tighter and still valid),

    A = Σ_k (p_{k+1} - p_k) · P_N([p_k, p_{k+1}))        (last interval closed)

where ``P_N`` is the empirical distribution of the weights (the paper's ``∫ P_w``). Every
weight lies between the codebook neighbours of its own value, so ``A`` bounds the empirical
``E|w - w̃|`` exactly. ``B = Δ/√(2π)·(√(2/π) + √3)`` is the paper's KDE-based estimate (not a
strict bound). Both are 0 for a tensor left unchanged.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Dict, Iterator, Optional, Tuple

import numpy as np

__all__ = [
    "QuantResult",
    "HashResult",
    "Partition",
    "hash_tensor",
    "kde_partition",
    "exact_kde_partition",
    "suppress_modes",
    "median_gap",
]

STEPS_PER_BANDWIDTH = 4
"""Grid step ``h = Δ / STEPS_PER_BANDWIDTH`` (METHOD.md: at most ``Δ/4``)."""
PAD_BANDWIDTHS = 4
"""The grid of a segment reaches this many bandwidths beyond its extreme values."""
GAP_BANDWIDTHS = 8
"""Consecutive values farther apart than this many bandwidths start a new segment."""
KERNEL_BANDWIDTHS = 8
"""The sampled Gaussian kernel is truncated at ``±KERNEL_BANDWIDTHS·Δ``."""
CHUNK_POINTS = 1 << 22
"""FFT block size (grid points): bounds the memory of the density, whatever its length."""
TAYLOR_ORDER = 4
"""Order ``M`` of the moment (Taylor) expansion used by the binning (see ``_binned_density``)."""
SEARCH_REL_TOL = 0.01
"""The factor search stops when ``f`` is bracketed within this relative width."""

_PAD = PAD_BANDWIDTHS * STEPS_PER_BANDWIDTH  # grid points
_REACH = KERNEL_BANDWIDTHS * STEPS_PER_BANDWIDTH  # kernel half-width in grid points
_SQRT_2PI = math.sqrt(2.0 * math.pi)


# --------------------------------------------------------------------------- results


@dataclass(frozen=True, eq=False)
class QuantResult:
    """A tensor mapped onto a finite codebook (common to KDE hashing and uniform int8).

    Arrays are read-only. ``codebook[codes] == hashed`` holds exactly.

    Attributes:
        hashed: the new tensor, float32, same shape as the input.
        codebook: sorted distinct values of ``hashed`` (float32).
        codes: index of every weight in ``codebook``, same shape as the input; ``uint8`` for
            at most 256 codebook values, ``uint16`` for at most 65,536, else ``int32``.
        distinct_before: number of distinct (float32) values of the input.
        distinct_after: number of distinct values of ``hashed`` (``len(codebook)``).
        rel_error: ``‖hashed - W‖₂ / ‖W‖₂`` (0 when ``W`` is all zero or unchanged).
        mean_abs_error: ``mean |hashed - W|``.
        reason: why the tensor was left unchanged, ``None`` when it was changed.
    """

    hashed: np.ndarray
    codebook: np.ndarray
    codes: np.ndarray
    distinct_before: int
    distinct_after: int
    rel_error: float
    mean_abs_error: float
    reason: Optional[str]

    @property
    def changed(self) -> bool:
        """True unless the tensor was left as it was."""
        return self.reason is None

    @property
    def reduction(self) -> float:
        """``1 - distinct_after / distinct_before`` (0 for an empty tensor)."""
        if self.distinct_before == 0:
            return 0.0
        return 1.0 - self.distinct_after / self.distinct_before


@dataclass(frozen=True, eq=False)
class HashResult(QuantResult):
    """Result of :func:`hash_tensor` (fields of :class:`QuantResult` plus the following).

    Attributes:
        bandwidth: ``Δ`` used (``None`` when unchanged).
        factor: ``f`` with ``Δ = median(diff v) × f`` (``None`` when unchanged).
        n_modes: number of cells (modes) of the partition after NMS; may exceed
            ``distinct_after`` when some cells hold no weight.
        snapped_zero: the cell containing 0 was given the value 0.
        bound_a, bound_b: the paper's per-weight bounds ``A`` and ``B`` (module docstring).
        bound: ``u = min(A, B)``.
        grid_size: number of grid points of the final density evaluation.
        evaluations: number of KDE evaluations made (1 with a fixed factor).
    """

    bandwidth: Optional[float]
    factor: Optional[float]
    n_modes: int
    snapped_zero: bool
    bound_a: float
    bound_b: float
    bound: float
    grid_size: int
    evaluations: int


@dataclass(frozen=True, eq=False)
class Partition:
    """Cells of the KDE of a set of values.

    Attributes:
        values: sorted distinct values (float64).
        counts: multiplicity of each value (float64 holding integers).
        starts: index in ``values`` of the first value of each cell (cells are contiguous;
            a cell may be empty, then its start equals the next one's).
        cuts: the ``n_cells - 1`` cut points (local minima of the density), increasing; a
            value equal to a cut belongs to the cell on its right.
        modes: mode (local maximum of the density) of each cell, increasing.
        peaks: density at each mode.
        bandwidth: ``Δ``.
        grid_size: number of grid points the density was evaluated on.
    """

    values: np.ndarray
    counts: np.ndarray
    starts: np.ndarray
    cuts: np.ndarray
    modes: np.ndarray
    peaks: np.ndarray
    bandwidth: float
    grid_size: int

    @property
    def n_cells(self) -> int:
        """Number of cells (= number of modes)."""
        return len(self.modes)

    @property
    def sizes(self) -> np.ndarray:
        """Number of distinct values in each cell."""
        return np.diff(np.append(self.starts, len(self.values)))

    @property
    def cells(self) -> np.ndarray:
        """Cell index of each value of ``values``."""
        return np.repeat(np.arange(self.n_cells), self.sizes)

    def cell_of(self, x) -> np.ndarray:
        """Cell index of arbitrary values ``x`` (by the cut points)."""
        return np.searchsorted(self.cuts, np.asarray(x, dtype=np.float64), side="right")


# --------------------------------------------------------------------------- grid


@dataclass(frozen=True)
class _Lattice:
    """The concatenated segment grids.

    Grid point ``k`` (``0 <= k < size``) of the concatenation is the lattice point
    ``(k + offset[s]) · step`` where ``s`` is its segment; ``coords`` are the values in that
    concatenated coordinate (``v / step - offset[s]``, non-decreasing).
    """

    step: float
    coords: np.ndarray
    seg_start: np.ndarray
    seg_offset: np.ndarray
    size: int

    def to_values(self, pos: np.ndarray) -> np.ndarray:
        """Map (possibly half-integer) grid positions back to real values."""
        seg = np.searchsorted(self.seg_start, np.floor(pos), side="right") - 1
        return (pos + self.seg_offset[seg]) * self.step


def _lattice(v: np.ndarray, bandwidth: float) -> _Lattice:
    """Split the sorted values ``v`` into segments and lay their grids end to end.

    A segment's grid runs from ``floor(v_first/h) - 16`` to ``ceil(v_last/h) + 16`` (lattice
    indices, ``h = Δ/4``, ``16`` points = ``4Δ``). Laid end to end, the last value of a
    segment and the first of the next are at least 32 points (``8Δ``, the kernel's reach)
    apart, so no value's kernel reaches a value of another segment, and the segment sizes add
    up to at most ``32·U + 2·#segments`` points.
    """
    step = grid_step(bandwidth)
    t = v / step
    breaks = np.flatnonzero(np.diff(v) > GAP_BANDWIDTHS * bandwidth) + 1
    first = np.concatenate(([0], breaks))
    last = np.concatenate((breaks, [len(v)])) - 1
    lo = np.floor(t[first]) - _PAD
    hi = np.ceil(t[last]) + _PAD
    length = (hi - lo + 1).astype(np.int64)
    seg_start = np.concatenate(([0], np.cumsum(length)[:-1]))
    seg_offset = lo - seg_start
    if len(first) == 1:
        t -= seg_offset[0]
        coords = t
    else:
        coords = t - np.repeat(seg_offset, last - first + 1)
    return _Lattice(step, coords, seg_start, seg_offset, int(length.sum()))


def grid_step(bandwidth: float) -> float:
    """The grid step ``h = Δ / STEPS_PER_BANDWIDTH``, rounded to a float32 number.

    With ``h`` a float32 number, every mode ``j·h`` (``j`` integer or half-integer, ``|2j| <
    2^24``) rounded to float32 equals the float32 product ``float32(2j) × float32(h/2)``, so the
    modes can be stored as small integers ``2j`` and rebuilt exactly by one ``Mul`` (the
    ``--codebook`` storage does that). A bandwidth whose step is not a normal float32 keeps the
    unrounded step (its modes are then stored as floats).
    """
    step = bandwidth / STEPS_PER_BANDWIDTH
    step32 = float(np.float32(step))
    return step32 if np.isfinite(step32) and step32 >= np.finfo(np.float32).tiny else step


def _kernels(bandwidth: float, total: float) -> list:
    """Sampled ``s^m/m! · He_m(u) · φ(u) / (N Δ √(2π))`` on ``u = -8 .. 8``, ``m = 0..M``.

    ``u`` is in bandwidths, with the grid step ``s = h/Δ``; ``He_m`` are the probabilists'
    Hermite polynomials (``He_{m+1} = u He_m - m He_{m-1}``), so that
    ``φ(u - δs) = Σ_m (δs)^m/m! · He_m(u) φ(u)``.
    """
    s = 1.0 / STEPS_PER_BANDWIDTH
    u = np.arange(-_REACH, _REACH + 1) * s
    phi = np.exp(-0.5 * u * u) / (total * bandwidth * _SQRT_2PI)
    he_prev, he = np.zeros_like(u), np.ones_like(u)
    kernels = []
    for m in range(TAYLOR_ORDER + 1):
        kernels.append(s**m / math.factorial(m) * he * phi)
        he_prev, he = he, u * he - m * he_prev
    return kernels


def _binned_density(
    lat: _Lattice, v: np.ndarray, counts: np.ndarray, total: float, bandwidth: float
) -> Iterator[Tuple[int, np.ndarray]]:
    """Yield ``(a, d)``: the binned-FFT density on grid points ``a .. a+len(d)-1``.

    Binning with Taylor moments: a value at grid coordinate ``n + δ`` (``n`` the nearest grid
    point, ``|δ| <= 1/2``) adds ``c·δ^m`` to the moment array ``B_m[n]``, ``m = 0..M``; then
    ``d = Σ_m B_m ⊛ k_m`` with the kernels of :func:`_kernels`, the sum taken in the Fourier
    domain (``M+1`` forward FFTs, one inverse). This is the exact Taylor expansion of every
    Gaussian about its nearest grid point, truncated after order ``M``: the relative error
    is about ``(s/2)^{M+1}/(M+1)! · |He_{M+1}|``, a few 1e-6 near the data for ``s = 1/4``,
    ``M = 4``.

    Consecutive blocks overlap by one point, so every difference ``d[k+1] - d[k]`` is seen.
    A block of ``n`` points needs the moments on ``n + 2·reach`` points; the circular FFT
    convolution of that length is exact on the ``n`` central points. ``v`` is unused (same
    signature as :func:`_exact_density`).
    """
    # nearest grid point, counted from the first point of block 0's moment array (= -reach)
    core = _native()
    coords = np.ascontiguousarray(lat.coords, np.float64)
    if core is not None:
        nearest, delta = core.kde_nearest(coords, float(_REACH))
        counts = np.ascontiguousarray(counts, np.float64)
    else:
        shifted = coords + _REACH
        nearest = (shifted + 0.5).astype(np.int64)
        delta = shifted - nearest
    kernels = _kernels(bandwidth, total)
    kernel_fft: Dict[int, list] = {}
    span = CHUNK_POINTS - 2 * _REACH
    size = lat.size
    a = 0
    while True:
        e = min(a + span, size)
        n_bins = e - a + 2 * _REACH
        i0, i1 = np.searchsorted(nearest, [a, a + n_bins])
        nfft = 1 << max(int(n_bins - 1).bit_length(), 7)
        if nfft not in kernel_fft:
            kernel_fft[nfft] = [np.fft.rfft(k, nfft) for k in kernels]
        spectrum = np.zeros(nfft // 2 + 1, dtype=np.complex128)
        if core is not None:  # the same sums in one pass (csrc/module.cc)
            moments = core.kde_moments(nearest, delta, counts, int(i0), int(i1), int(a), int(n_bins), TAYLOR_ORDER)
            for row, kf in zip(moments, kernel_fft[nfft]):
                spectrum += np.fft.rfft(row, nfft) * kf
        else:
            idx = nearest[i0:i1] - a if a else nearest[i0:i1]
            dlt = delta[i0:i1]
            moment = counts[i0:i1]
            for kf in kernel_fft[nfft]:
                spectrum += np.fft.rfft(np.bincount(idx, moment, minlength=n_bins), nfft) * kf
                moment = moment * dlt
        full = np.fft.irfft(spectrum, nfft)
        yield a, full[2 * _REACH : 2 * _REACH + (e - a)]
        if e == size:
            return
        a = e - 1


NATIVE = True
"""Use the C++ binning of ``redpp_onnx._core`` when it is built (same numbers as the numpy form,
several times faster on float32 tensors, whose values are nearly all distinct)."""


def _native():
    if not NATIVE:
        return None
    try:
        from .. import _core
    except ImportError:  # pragma: no cover - the package is built with it
        return None
    return _core if hasattr(_core, "kde_moments") else None


def _exact_density(
    lat: _Lattice, v: np.ndarray, counts: np.ndarray, total: float, bandwidth: float
) -> Iterator[Tuple[int, np.ndarray]]:
    """Yield ``(0, d)``: the exact Gaussian sum on the whole grid, ``O(U·S)`` (reference)."""
    k = np.arange(lat.size, dtype=np.float64)
    x = lat.to_values(k)
    d = np.empty(lat.size)
    block = max(1, (1 << 22) // len(v))
    for s in range(0, lat.size, block):
        r = (x[s : s + block, None] - v[None, :]) / bandwidth
        d[s : s + block] = np.exp(-0.5 * r * r) @ counts
    yield 0, d / (total * bandwidth * _SQRT_2PI)


def _extrema(
    blocks: Iterator[Tuple[int, np.ndarray]], size: int
) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Strict local minima and maxima of a density given in overlapping blocks.

    Works on the signs of the non-zero differences ``d[k+1] - d[k]`` (difference ``k``): a
    sign change ``+ → -`` between differences ``p1 < p2`` is a maximum, ``- → +`` a minimum,
    located at the middle ``(p1 + 1 + p2) / 2`` of the flat run ``d[p1+1 .. p2]``. The density
    is taken as rising before the grid and falling after it, so extrema alternate, the first
    and last ones are maxima and ``#maxima = #minima + 1``.

    Returns ``(minima, maxima, peaks)``: grid positions (float) and the density at maxima.
    """
    prev_p, prev_s = -1, 1.0
    minima, maxima, peaks = [], [], []
    for a, d in blocks:
        e = a + len(d)
        sign = np.sign(np.diff(d))
        nz = np.flatnonzero(sign)
        tail_p = [size - 1] if e == size else []
        tail_s = [-1.0] if e == size else []
        p = np.concatenate(([prev_p], nz + a, tail_p)).astype(np.int64)
        s = np.concatenate(([prev_s], sign[nz], tail_s))
        change = np.flatnonzero(s[1:] != s[:-1])
        p1, p2, rising = p[change], p[change + 1], s[change] > 0
        pos = (p1 + 1 + p2) / 2.0
        maxima.append(pos[rising])
        peaks.append(d[p2[rising] - a])
        minima.append(pos[~rising])
        prev_p, prev_s = int(p[-1]), float(s[-1])
    return np.concatenate(minima), np.concatenate(maxima), np.concatenate(peaks)


def _partition(
    v: np.ndarray,
    counts: np.ndarray,
    bandwidth: float,
    density: Callable[..., Iterator[Tuple[int, np.ndarray]]],
) -> Partition:
    lat = _lattice(v, bandwidth)
    blocks = density(lat, v, counts, float(counts.sum()), bandwidth)
    minima, maxima, peaks = _extrema(blocks, lat.size)
    starts = np.concatenate(([0], np.searchsorted(lat.coords, minima, side="left")))
    return Partition(
        values=v,
        counts=counts,
        starts=starts,
        cuts=lat.to_values(minima),
        modes=lat.to_values(maxima),
        peaks=peaks,
        bandwidth=bandwidth,
        grid_size=lat.size,
    )


def _unique_counts(values) -> Tuple[np.ndarray, np.ndarray]:
    x = np.asarray(values, dtype=np.float64).ravel()
    if x.size == 0:
        raise ValueError("kde_partition needs at least one value")
    if not np.isfinite(x).all():
        raise ValueError("values contain NaN or inf")
    v, c = np.unique(x, return_counts=True)
    return v, c.astype(np.float64)


def _check_positive(name: str, x: float) -> float:
    x = float(x)
    if not (math.isfinite(x) and x > 0):
        raise ValueError(f"{name} must be a positive finite number, got {x}")
    return x


def kde_partition(values, bandwidth: float) -> Partition:
    """Partition of ``values`` by the binned-FFT Gaussian KDE of bandwidth ``bandwidth``.

    ``values`` may have any shape and repeated entries (the KDE counts every entry). This is
    the partition :func:`hash_tensor` uses, before NMS and zero snapping.
    """
    v, c = _unique_counts(values)
    return _partition(v, c, _check_positive("bandwidth", bandwidth), _binned_density)


def exact_kde_partition(values, bandwidth: float) -> Partition:
    """Reference for the tests: like :func:`kde_partition` with the exact KDE.

    The density is the exact Gaussian sum over all values (no binning, no truncation),
    evaluated on the same grid, ``O(U·S)`` time. Not used by the hashing itself.
    """
    v, c = _unique_counts(values)
    return _partition(v, c, _check_positive("bandwidth", bandwidth), _exact_density)


def suppress_modes(part: Partition, radius: float) -> Partition:
    """Non-maximum suppression of modes closer than ``radius``.

    Cells are visited by increasing peak density; a cell whose current neighbour (left or
    right, after the merges made so far) has a higher peak and a mode closer than ``radius``
    is merged into it (into the higher of the two if both qualify) and takes its mode. Merged
    cells stay contiguous, and at the end any two adjacent modes are at least ``radius``
    apart. ``radius <= 0`` returns ``part`` itself. The loop is in Python but only visits
    cells that have a neighbour within ``radius``.
    """
    n = part.n_cells
    close = np.diff(part.modes) < radius
    if radius <= 0 or not close.any():
        return part
    candidate = np.zeros(n, dtype=bool)
    candidate[:-1] |= close
    candidate[1:] |= close
    order = np.argsort(part.peaks, kind="stable")
    rank_arr = np.empty(n, dtype=np.int64)
    rank_arr[order] = np.arange(n)
    rank = rank_arr.tolist()
    modes = part.modes.tolist()
    left = list(range(-1, n - 1))
    right = list(range(1, n + 1))
    parent = list(range(n))
    for k in order[candidate[order]].tolist():
        target = -1
        lk, rk = left[k], right[k]
        if lk >= 0 and rank[lk] > rank[k] and modes[k] - modes[lk] < radius:
            target = lk
        if rk < n and rank[rk] > rank[k] and modes[rk] - modes[k] < radius:
            if target < 0 or rank[rk] > rank[target]:
                target = rk
        if target >= 0:
            parent[k] = target
            if lk >= 0:
                right[lk] = rk
            if rk < n:
                left[rk] = lk
    root = parent[:]
    for k in order[::-1].tolist():  # parents have higher ranks: resolved before children
        root[k] = root[parent[k]]
    root_arr = np.asarray(root)
    new_group = np.concatenate(([True], root_arr[1:] != root_arr[:-1]))
    kept = root_arr[new_group]
    return Partition(
        values=part.values,
        counts=part.counts,
        starts=part.starts[new_group],
        cuts=part.cuts[new_group[1:]],
        modes=part.modes[kept],
        peaks=part.peaks[kept],
        bandwidth=part.bandwidth,
        grid_size=part.grid_size,
    )


# --------------------------------------------------------------------------- hashing


def median_gap(values) -> float:
    """``median(diff(v))`` over the sorted distinct values ``v`` (needs 2 or more)."""
    v = np.unique(np.asarray(values, dtype=np.float64))
    if len(v) < 2:
        raise ValueError("median_gap needs at least 2 distinct values")
    return float(np.median(np.diff(v)))


@dataclass(frozen=True, eq=False)
class _Candidate:
    """One evaluated factor: its partition (after NMS) and its squared errors."""

    factor: float
    part: Partition
    modes32: np.ndarray  # modes rounded to float32 (as float64)
    zero_cell: int  # cell containing 0, -1 when it holds no weight
    sq_plain: float
    sq_snapped: float  # == sq_plain when the zero cell is empty or no snap was asked


def _evaluate(
    v: np.ndarray,
    counts: np.ndarray,
    bandwidth: float,
    factor: float,
    nms_radius: float,
    snap_zero: bool,
) -> _Candidate:
    """Partition, NMS and squared errors (with the float32 modes the result will hold)."""
    part = suppress_modes(_partition(v, counts, bandwidth, _binned_density), nms_radius)
    modes32 = part.modes.astype(np.float32).astype(np.float64)
    sizes = part.sizes
    err = v - np.repeat(modes32, sizes)
    sq_plain = float(np.dot(counts, err * err))
    z = int(np.searchsorted(part.cuts, 0.0, side="right"))
    lo, hi = int(part.starts[z]), int(part.starts[z]) + int(sizes[z])
    if not snap_zero or hi == lo:
        return _Candidate(factor, part, modes32, z if hi > lo else -1, sq_plain, sq_plain)
    err[lo:hi] = v[lo:hi]
    return _Candidate(factor, part, modes32, z, sq_plain, float(np.dot(counts, err * err)))


def _search(
    evaluate: Callable[[float], _Candidate],
    f_max: float,
    feasible: Callable[[_Candidate], bool],
) -> Optional[_Candidate]:
    """Largest evaluated feasible factor by bisection on ``log f`` over ``[1, f_max]``."""
    top = evaluate(f_max)
    if feasible(top):
        return top
    lo, hi = 0.0, math.log(f_max)
    best = None
    while hi - lo > math.log1p(SEARCH_REL_TOL):
        mid = 0.5 * (lo + hi)
        cand = evaluate(math.exp(mid))
        if feasible(cand):
            lo, best = mid, cand
        else:
            hi = mid
    if best is None:
        cand = evaluate(1.0)
        if feasible(cand):
            best = cand
    return best


def _as_float32(w) -> np.ndarray:
    a = np.asarray(w)
    if a.dtype.kind not in "fiub":
        raise TypeError(f"expected a real numeric array, got dtype {a.dtype}")
    with np.errstate(over="ignore"):
        a32 = a.astype(np.float32)
    if not np.isfinite(a32).all():
        raise ValueError("the tensor contains NaN or inf (or values beyond the float32 range)")
    return a32


def _code_dtype(n: int) -> type:
    if n <= 1 << 8:
        return np.uint8
    if n <= 1 << 16:
        return np.uint16
    return np.int32


def _frozen(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False
    return a


def _codebook_result_fields(
    w32: np.ndarray,
    hashed_of_unique: np.ndarray,
    inv: np.ndarray,
    v: np.ndarray,
    counts: np.ndarray,
) -> dict:
    """Common :class:`QuantResult` fields from the float32 value given to each distinct value.

    ``v`` (float64) are the distinct values of ``w32``, ``inv`` maps every weight to its
    distinct value, ``hashed_of_unique`` (float32) is the new value of each distinct value.
    """
    codebook, code_of_unique = np.unique(hashed_of_unique, return_inverse=True)
    codes = code_of_unique.astype(_code_dtype(len(codebook)))[inv].reshape(w32.shape)
    hashed = codebook[codes]
    err = v - codebook[code_of_unique].astype(np.float64)
    sq_norm = float(np.dot(counts, v * v))
    sq_err = float(np.dot(counts, err * err))
    total = float(counts.sum())
    return dict(
        hashed=_frozen(hashed),
        codebook=_frozen(codebook),
        codes=_frozen(codes),
        distinct_before=len(v),
        distinct_after=len(codebook),
        rel_error=math.sqrt(sq_err / sq_norm) if sq_norm > 0 else 0.0,
        mean_abs_error=float(np.dot(counts, np.abs(err))) / total if total else 0.0,
    )


def _unchanged_fields(w32: np.ndarray, reason: str) -> dict:
    """:class:`QuantResult` fields of a tensor left as it is."""
    flat = w32.ravel()
    codebook, inv = np.unique(flat, return_inverse=True)
    codes = inv.astype(_code_dtype(len(codebook))).reshape(w32.shape)
    return dict(
        hashed=_frozen(w32.copy()),
        codebook=_frozen(codebook),
        codes=_frozen(codes),
        distinct_before=len(codebook),
        distinct_after=len(codebook),
        rel_error=0.0,
        mean_abs_error=0.0,
        reason=reason,
    )


def _unchanged(w32: np.ndarray, reason: str, evaluations: int = 0) -> HashResult:
    fields = _unchanged_fields(w32, reason)
    return HashResult(
        **fields,
        bandwidth=None,
        factor=None,
        n_modes=fields["distinct_before"],
        snapped_zero=False,
        bound_a=0.0,
        bound_b=0.0,
        bound=0.0,
        grid_size=0,
        evaluations=evaluations,
    )


def _bound_a(v: np.ndarray, counts: np.ndarray, codebook: np.ndarray) -> float:
    """The paper's bound ``A`` (module docstring) on the empirical ``E|w - w̃|``."""
    p = np.unique(np.concatenate(([v[0]], codebook.astype(np.float64), [v[-1]])))
    if len(p) < 2:
        return 0.0
    k = np.minimum(np.searchsorted(p, v, side="right") - 1, len(p) - 2)
    mass = np.bincount(k, counts, minlength=len(p) - 1) / counts.sum()
    return float(np.dot(np.diff(p), mass))


def hash_tensor(
    w,
    *,
    weight_error: float = 0.01,
    bandwidth_factor: Optional[float] = None,
    nms_radius: float = 0.0,
    snap_zero: bool = False,
) -> HashResult:
    """Adaptive KDE hashing of one tensor (module docstring for the method and choices).

    Args:
        w: the weights, any shape, any real dtype; computed on as float32 (ONNX weights are
            float32; a float64 input is rounded to float32 first and ``distinct_before``
            counts float32 values).
        weight_error: budget ``ε`` on ``‖W̃ - W‖ / ‖W‖``; chooses ``f`` when
            ``bandwidth_factor`` is None, and decides the zero snap in both modes.
        bandwidth_factor: fixed ``f`` (``f = 1`` is the paper's literal rule); ``None``
            chooses ``f`` per tensor (the largest within the budget).
        nms_radius: ``τ``, merge a cell into its higher neighbour when their modes are closer
            than ``τ`` (in weight units; 0 = off). See :func:`suppress_modes`.
        snap_zero: give the value 0 to the cell that contains 0 when the budget allows.

    Returns:
        A :class:`HashResult`. A tensor with fewer than 3 distinct values, an empty tensor, or
        one that no factor ``f >= 1`` can hash within the budget (automatic mode only) is
        returned unchanged with ``reason`` set.

    Raises:
        ValueError: NaN or inf in ``w``, or an invalid option.
        TypeError: a non-numeric ``w``.
    """
    w32 = _as_float32(w)
    eps = float(weight_error)
    if not (math.isfinite(eps) and eps >= 0):
        raise ValueError(f"weight_error must be a finite number >= 0, got {weight_error}")
    if bandwidth_factor is not None:
        bandwidth_factor = _check_positive("bandwidth_factor", bandwidth_factor)
    tau = float(nms_radius)
    if not (math.isfinite(tau) and tau >= 0):
        raise ValueError(f"nms_radius must be a finite number >= 0, got {nms_radius}")

    if w32.size == 0:
        return _unchanged(w32, "empty tensor")
    v32, inv, counts = np.unique(w32.ravel(), return_inverse=True, return_counts=True)
    found = hash_distinct(v32, counts, eps=eps, bandwidth_factor=bandwidth_factor, tau=tau, snap_zero=snap_zero)
    if found.reason is not None:
        return _unchanged(w32, found.reason, evaluations=found.evaluations)
    v = v32.astype(np.float64)
    fields = _codebook_result_fields(w32, found.values, inv, v, counts.astype(np.float64))
    return HashResult(**fields, reason=None, **found.details(fields["codebook"], v, counts.astype(np.float64)))


@dataclass(frozen=True, eq=False)
class DistinctHash:
    """What :func:`hash_distinct` gives each distinct value: ``values`` (float32, one per distinct
    value; None when the tensor is left as it is, ``reason`` then says why), and the choice."""

    values: Optional[np.ndarray]
    reason: Optional[str]
    evaluations: int
    part: Optional[Partition] = None
    factor: Optional[float] = None
    snapped_zero: bool = False

    def details(self, codebook: np.ndarray, v: np.ndarray, counts: np.ndarray) -> dict:
        """The :class:`HashResult` fields beyond :class:`QuantResult`'s (``v`` float64 distinct values)."""
        part = self.part
        bound_a = _bound_a(v, counts, codebook)
        bound_b = part.bandwidth / _SQRT_2PI * (math.sqrt(2.0 / math.pi) + math.sqrt(3.0))
        return dict(bandwidth=part.bandwidth, factor=self.factor, n_modes=part.n_cells, snapped_zero=self.snapped_zero,
                    bound_a=bound_a, bound_b=bound_b, bound=min(bound_a, bound_b), grid_size=part.grid_size,
                    evaluations=self.evaluations)


def hash_distinct(v32: np.ndarray, counts: np.ndarray, *, eps: float, bandwidth_factor: Optional[float] = None,
                  tau: float = 0.0, snap_zero: bool = False) -> DistinctHash:
    """The core of :func:`hash_tensor` on a tensor given by its sorted distinct float32 values
    ``v32`` and their counts (options checked by the caller): the new value of each distinct
    value. Streaming reads float16 / bfloat16 tensors this way, from a histogram of their bit
    patterns, without sorting the weights (``redpp_onnx/stream.py``)."""
    if len(v32) < 3:
        return DistinctHash(None, f"fewer than 3 distinct values ({len(v32)})", 0)
    v = v32.astype(np.float64)
    counts = counts.astype(np.float64)
    sq_norm = float(np.dot(counts, v * v))
    # squared-error budget, less a 1e-12 relative margin so that the error recomputed from the
    # codebook for the result (same numbers, possibly another summation order) stays within it
    limit = eps * eps * sq_norm * (1.0 - 1e-12)
    base = float(np.median(np.diff(v)))

    cache: Dict[float, _Candidate] = {}

    def evaluate(f: float) -> _Candidate:
        if f not in cache:
            cache[f] = _evaluate(v, counts, base * f, f, tau, snap_zero)
        return cache[f]

    snap = False
    if bandwidth_factor is not None:
        chosen = evaluate(bandwidth_factor)
        snap = snap_zero and chosen.zero_cell >= 0 and chosen.sq_snapped <= limit
    else:
        f_max = max(1.0, float(v[-1] - v[0]) / base)
        chosen = None
        if snap_zero:
            chosen = _search(evaluate, f_max, lambda c: c.zero_cell >= 0 and c.sq_snapped <= limit)
            snap = chosen is not None
        if chosen is None:
            chosen = _search(evaluate, f_max, lambda c: c.sq_plain <= limit)
        if chosen is None:
            e1 = math.sqrt(cache[1.0].sq_plain / sq_norm)
            return DistinctHash(None, f"no bandwidth factor f >= 1 keeps the relative error within {eps:g} "
                                      f"(f = 1 gives {e1:.4g})", len(cache))

    part = chosen.part
    cell_values = chosen.modes32.copy()
    if snap:
        cell_values[chosen.zero_cell] = 0.0
    return DistinctHash(np.repeat(cell_values.astype(np.float32), part.sizes), None, len(cache), part,
                        chosen.factor, snap)
