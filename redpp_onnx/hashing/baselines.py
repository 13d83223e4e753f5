"""Data-free baseline quantizers and the stored-bits accounting shared with RD hashing.

Pure numpy; every function is deterministic. Each quantizer maps one weight tensor to a
:class:`Quantized` result: the dequantized tensor (float32, same shape), one integer code per
weight, the codebook (group) each weight belongs to, and the bits of the tables the decoder
needs. :func:`stored_bits` turns codes, groups and tables into the two counts every method
is compared on (``redpp_onnx.hashing.rd`` uses the same function for its own codebooks):

* **fixed**: every code a fixed-length field of ``ceil(log2 K_g)`` bits, ``K_g`` the size of
  its codebook's alphabet (the number of levels of a uniform quantizer, the number of
  entries of a table), plus the tables;
* **entropy**: every codebook's codes at their zeroth-order entropy,
  ``sum_g n_g · H(codes of g)``, plus the tables. The prefix codes of ``passes/codebook.py``
  come within about 0.1 bit per weight of it.

Tables: a float32 scale is 32 bits, an integer zero point the width of the codes, a float32
table entry 32 bits, an fp16 value 16 bits.

Quantizers (``axis`` = the output-channel axis for per-channel variants, ``None`` per tensor):

* :func:`uniform` -- symmetric (``s = max|w| / (2^(b-1) - 1)``, levels ``-(2^(b-1)-1) ..
  2^(b-1)-1``, zero point 0) or asymmetric (range ``[min(w, 0), max(w, 0)]`` over ``2^b - 1``
  steps, an integer zero point so that 0 is exact), round to nearest (ties to even).
* :func:`kmeans` -- 1-D Lloyd iterations on the distinct values (weighted by their counts)
  from a deterministic start: ``"quantile"`` (the K mid-quantiles, default) or
  ``"kmeans++"`` (D² sampling with a seeded generator). Stops when no assignment changes or
  after ``iters`` iterations; empty clusters are dropped (their table entries are not
  counted). Per channel, all rows of a tensor are iterated together.
* :func:`fp16` -- round to float16 and back; fixed 16 bits per weight, no table; its entropy
  count codes the distinct float16 values with a table of them (16 bits each), or stays at 16
  bits when that is less (:func:`method_bits`).
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import numpy as np

__all__ = ["Quantized", "StoredBits", "ZERO_BITS", "stored_bits", "code_entropy", "uniform", "kmeans", "fp16",
           "method_bits", "label", "channel_rows", "from_rows"]

FLOAT32_BITS = 32
FLOAT16_BITS = 16


# --------------------------------------------------------------------------- accounting

@dataclasses.dataclass(frozen=True)
class StoredBits:
    """Stored bits of one tensor (or a sum of tensors: ``+`` adds them).

    ``weights``: number of weights; ``table``: bits of codebooks, scales and zero points;
    ``fixed_codes`` / ``entropy_codes``: bits of the codes as fixed-length fields / at their
    zeroth-order entropy per codebook. ``fixed`` and ``entropy`` include the tables.
    """

    weights: int
    table: float
    fixed_codes: float
    entropy_codes: float

    @property
    def fixed(self) -> float:
        return self.table + self.fixed_codes

    @property
    def entropy(self) -> float:
        return self.table + self.entropy_codes

    def per_weight(self) -> dict:
        n = max(self.weights, 1)
        return {"fixed": self.fixed / n, "entropy": self.entropy / n, "table": self.table / n,
                "fixed_codes": self.fixed_codes / n, "entropy_codes": self.entropy_codes / n}

    def __add__(self, other: "StoredBits") -> "StoredBits":
        return StoredBits(self.weights + other.weights, self.table + other.table,
                          self.fixed_codes + other.fixed_codes, self.entropy_codes + other.entropy_codes)


ZERO_BITS = StoredBits(0, 0.0, 0.0, 0.0)


def code_entropy(codes: np.ndarray) -> float:
    """Zeroth-order entropy (bits per code) of the integer codes (0 for one symbol or none)."""
    c = np.asarray(codes).ravel()
    if c.size == 0:
        return 0.0
    _, counts = np.unique(c, return_counts=True)
    p = counts / c.size
    return float(max(0.0, -(p * np.log2(p)).sum()))


def stored_bits(codes: np.ndarray, groups: Optional[np.ndarray], alphabet, table_bits: float) -> StoredBits:
    """Stored bits of ``codes`` (integers, any shape) split into codebooks by ``groups``.

    ``groups``: the codebook index of every code (same shape; ``None``: one codebook).
    ``alphabet``: the size of each codebook's alphabet (an int for all, or one per codebook,
    indexed by group); its ``ceil(log2)`` is the fixed-length field (0 bits for 1 symbol).
    ``table_bits``: bits of all tables. Codes are told apart within their codebook only.
    """
    c = np.asarray(codes, np.int64).ravel()
    if groups is None:
        g = np.zeros(c.size, np.int64)
    else:
        g = np.asarray(groups, np.int64).ravel()
        if g.shape != c.shape:
            raise ValueError("groups must have the shape of codes")
    n_groups = int(g.max()) + 1 if g.size else 0
    sizes = np.bincount(g, minlength=n_groups)
    alph = np.broadcast_to(np.asarray(alphabet, np.int64), (n_groups,))
    widths = np.ceil(np.log2(np.maximum(alph, 1))).astype(np.int64)
    fixed = float(np.dot(sizes, widths))
    entropy = 0.0
    if c.size:
        key = g * (int(c.max()) + 1 - min(int(c.min()), 0)) + (c - min(int(c.min()), 0))
        _, inv, counts = np.unique(key, return_inverse=True, return_counts=True)
        group_of_symbol = np.zeros(counts.size, np.int64)
        group_of_symbol[inv] = g
        p = counts / sizes[group_of_symbol]
        entropy = float(max(0.0, -(counts * np.log2(p)).sum()))
    return StoredBits(int(c.size), float(table_bits), fixed, entropy)


# --------------------------------------------------------------------------- results

@dataclasses.dataclass(frozen=True, eq=False)
class Quantized:
    """A quantize-dequantize result.

    ``values``: float32, the input's shape. ``codes``: int64, same shape, the code of every
    weight within its codebook. ``groups``: int64 codebook index per weight (``None``: one
    codebook). ``alphabet``: per codebook, the number of symbols a fixed-length code must
    distinguish. ``table_bits``: bits of the tables. ``method`` / ``params``: what produced it.
    """

    method: str
    params: dict
    values: np.ndarray
    codes: np.ndarray
    groups: Optional[np.ndarray]
    alphabet: np.ndarray
    table_bits: float

    @property
    def bits(self) -> StoredBits:
        return stored_bits(self.codes, self.groups, self.alphabet, self.table_bits)

    def rel_error(self, w) -> float:
        w = np.asarray(w, np.float64)
        n = float(np.linalg.norm(w))
        return float(np.linalg.norm(self.values.astype(np.float64) - w) / n) if n > 0 else 0.0


def channel_rows(w: np.ndarray, axis: Optional[int]) -> np.ndarray:
    """``w`` as a 2-D array with one row per slice along ``axis`` (one row when ``None``)."""
    w = np.asarray(w)
    if axis is None:
        return w.reshape(1, -1)
    return np.moveaxis(w, axis, 0).reshape(w.shape[axis], -1)


def from_rows(rows: np.ndarray, shape: tuple, axis: Optional[int]) -> np.ndarray:
    """Inverse of :func:`channel_rows`."""
    if axis is None:
        return rows.reshape(shape)
    moved = (shape[axis],) + tuple(d for k, d in enumerate(shape) if k != axis)
    return np.moveaxis(rows.reshape(moved), 0, axis)


def _row_groups(shape: tuple, axis: Optional[int]) -> Optional[np.ndarray]:
    if axis is None:
        return None
    rows = np.arange(shape[axis]).reshape((shape[axis],) + (1,) * (len(shape) - 1))
    return np.broadcast_to(np.moveaxis(rows, 0, axis), shape).copy()


def _axis(w: np.ndarray, axis: Optional[int]) -> Optional[int]:
    if axis is None:
        return None
    if not -w.ndim <= axis < w.ndim:
        raise ValueError(f"axis {axis} out of range for a tensor of rank {w.ndim}")
    return axis % w.ndim


# --------------------------------------------------------------------------- uniform

def uniform(w, bits: int, *, symmetric: bool = True, axis: Optional[int] = None) -> Quantized:
    """Uniform quantize-dequantize with ``bits`` bits (2..16), per tensor or per slice of ``axis``.

    Symmetric: ``s = max|w| / (2^(b-1) - 1)``, ``q = clip(rint(w / s), ±(2^(b-1) - 1))``,
    table 32 bits (the scale) per codebook, alphabet ``2^b - 1``. Asymmetric: ``lo = min(w, 0)``,
    ``hi = max(w, 0)``, ``s = (hi - lo) / (2^b - 1)``, zero point ``z = clip(rint(-lo / s), 0,
    2^b - 1)``, ``q = clip(rint(w / s) + z, 0, 2^b - 1)``, value ``(q - z)·s``; table 32 + b bits,
    alphabet ``2^b``. An all-zero slice has ``s = 0`` (every value 0).
    """
    if not 2 <= int(bits) <= 16:
        raise ValueError(f"bits must be in 2..16, got {bits}")
    b = int(bits)
    w32 = np.asarray(w, np.float32)
    ax = _axis(w32, axis)
    rows = channel_rows(w32, ax).astype(np.float64)
    if symmetric:
        top = (1 << (b - 1)) - 1
        scale = np.abs(rows).max(axis=1, keepdims=True) / top
        safe = np.where(scale > 0, scale, 1.0)
        q = np.clip(np.rint(rows / safe), -top, top)
        deq = q * scale
        codes = (q + top).astype(np.int64)
        alphabet, per_table = 2 * top + 1, FLOAT32_BITS
    else:
        top = (1 << b) - 1
        lo = np.minimum(rows.min(axis=1, keepdims=True), 0.0)
        hi = np.maximum(rows.max(axis=1, keepdims=True), 0.0)
        scale = (hi - lo) / top
        safe = np.where(scale > 0, scale, 1.0)
        z = np.clip(np.rint(-lo / safe), 0, top)
        q = np.clip(np.rint(rows / safe) + z, 0, top)
        deq = (q - z) * scale
        codes = q.astype(np.int64)
        alphabet, per_table = top + 1, FLOAT32_BITS + b
    values = from_rows(deq.astype(np.float32), w32.shape, ax)
    return Quantized("uniform-" + ("sym" if symmetric else "asym"),
                     {"bits": b, "per": "channel" if ax is not None else "tensor"},
                     values, from_rows(codes, w32.shape, ax), _row_groups(w32.shape, ax),
                     np.full(rows.shape[0], alphabet, np.int64), float(per_table * rows.shape[0]))


# --------------------------------------------------------------------------- k-means

def _quantile_init(v: np.ndarray, c: np.ndarray, k: int) -> np.ndarray:
    """The ``k`` mid-quantiles ``(j + 1/2)/k`` of the weighted distinct values (deduplicated)."""
    cdf = np.cumsum(c) / c.sum()
    idx = np.searchsorted(cdf, (np.arange(k) + 0.5) / k)
    return np.unique(v[np.minimum(idx, len(v) - 1)])


def _kmeanspp_init(v: np.ndarray, c: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """k-means++ (D² sampling, weights = counts) with the given generator."""
    centers = [v[rng.choice(len(v), p=c / c.sum())]]
    d2 = (v - centers[0]) ** 2
    for _ in range(1, k):
        p = c * d2
        if p.sum() <= 0:
            break
        centers.append(v[rng.choice(len(v), p=p / p.sum())])
        d2 = np.minimum(d2, (v - centers[-1]) ** 2)
    return np.unique(np.asarray(centers))


def _lloyd(v: np.ndarray, c: np.ndarray, centers: np.ndarray, iters: int) -> np.ndarray:
    """1-D Lloyd on sorted distinct values ``v`` with counts ``c``; returns sorted centers
    (empty clusters dropped)."""
    assign = None
    for _ in range(iters):
        mids = 0.5 * (centers[1:] + centers[:-1])
        new = np.searchsorted(mids, v, side="left")
        if assign is not None and np.array_equal(new, assign):
            break
        assign = new
        mass = np.bincount(assign, c, minlength=len(centers))
        sums = np.bincount(assign, c * v, minlength=len(centers))
        keep = mass > 0
        centers = sums[keep] / mass[keep]
        if not keep.all():
            assign = None  # indices changed: reassign before testing convergence
    return centers


def _kmeans_row(x: np.ndarray, k: int, init: str, seed: int, iters: int):
    """(values, codes, used entries) of one row."""
    v, inv, c = np.unique(x, return_inverse=True, return_counts=True)
    c = c.astype(np.float64)
    if len(v) <= k:
        centers = v.copy()
    else:
        starts = []
        if init in ("quantile", "best"):
            starts.append(_quantile_init(v, c, k))
        if init in ("kmeans++", "best"):
            starts.append(_kmeanspp_init(v, c, k, np.random.default_rng(seed)))
        best = None
        for start in starts:  # the lowest squared error wins; the first on ties
            cand = _lloyd(v, c, start, iters)
            mids = 0.5 * (cand[1:] + cand[:-1])
            sse = float(np.dot(c, (v - cand[np.searchsorted(mids, v, side="left")]) ** 2))
            if best is None or sse < best[0]:
                best = (sse, cand)
        centers = best[1]
    mids = 0.5 * (centers[1:] + centers[:-1])
    cv = np.searchsorted(mids, v, side="left")
    used, code_of_center = np.unique(cv, return_inverse=True)
    centers32 = centers[used].astype(np.float32)
    return centers32[code_of_center][inv], code_of_center[inv], len(used)


def kmeans(w, k: int, *, axis: Optional[int] = None, init: str = "best", seed: int = 0,
           iters: int = 100) -> Quantized:
    """k-means (1-D Lloyd) quantize-dequantize with ``k`` float32 entries per table.

    Per tensor (``axis=None``) or one table per slice of ``axis`` (per output channel).
    ``init``: ``"quantile"``, ``"kmeans++"`` (seeded with ``seed``; the same seed for every
    row) or ``"best"`` (default: both, the lower squared error kept per row; quantile on ties).
    Table bits: 32 per entry actually used; alphabet: the entries used.
    """
    if int(k) < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if init not in ("quantile", "kmeans++", "best"):
        raise ValueError(f"init must be 'quantile', 'kmeans++' or 'best', got {init!r}")
    w32 = np.asarray(w, np.float32)
    ax = _axis(w32, axis)
    rows = channel_rows(w32, ax).astype(np.float64)
    vals = np.empty(rows.shape, np.float32)
    codes = np.empty(rows.shape, np.int64)
    used = np.empty(rows.shape[0], np.int64)
    for r in range(rows.shape[0]):
        vals[r], codes[r], used[r] = _kmeans_row(rows[r], int(k), init, seed, iters)
    return Quantized("kmeans", {"k": int(k), "per": "channel" if ax is not None else "tensor", "init": init},
                     from_rows(vals, w32.shape, ax), from_rows(codes, w32.shape, ax),
                     _row_groups(w32.shape, ax), used, float(FLOAT32_BITS * used.sum()))


# --------------------------------------------------------------------------- fp16

def fp16(w) -> Quantized:
    """float16 round trip. Fixed: 16 bits per weight, no table (alphabet 2^16). Entropy: the
    distinct float16 values' codes, plus a table of those values (16 bits each)."""
    w32 = np.asarray(w, np.float32)
    h = w32.astype(np.float16)
    bits, codes = np.unique(h.view(np.uint16).ravel(), return_inverse=True)
    return Quantized("fp16", {}, h.astype(np.float32), codes.reshape(w32.shape).astype(np.int64), None,
                     np.asarray([1 << 16]), float(FLOAT16_BITS * len(bits)))


def fp16_bits(q: Quantized) -> StoredBits:
    """fp16's count: fixed codes without a table (the code is the value); entropy with the table
    of distinct values, or the raw 16 bits when that is less (a coder would store them raw)."""
    b = q.bits
    return StoredBits(b.weights, 0.0, b.fixed_codes, min(b.entropy, b.fixed_codes))


def method_bits(q: Quantized) -> StoredBits:
    """The bits of a quantizer's result (fp16's special case included)."""
    return fp16_bits(q) if q.method == "fp16" else q.bits


def label(q: Quantized) -> str:
    """A short label of a result's method and parameters."""
    p = q.params
    if q.method.startswith("uniform"):
        return f"{q.method} {p['per']} {p['bits']}b"
    if q.method == "kmeans":
        return f"kmeans {p['per']} K{p['k']}"
    return q.method
