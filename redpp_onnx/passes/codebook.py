"""Compact storage of hashed tensors: codebooks plus class/offset codes, standard ONNX ops only.

A hashed tensor has few distinct values. It is stored as its **codebook** (the distinct values,
most frequent first) and one **code** per weight (the rank of its value in the codebook), and
rebuilt in the graph by standard ops whose inputs are all constants, so that onnxruntime folds
them into the plain tensor when the session starts: the file shrinks, the computation is the
plain hashed model's, bit for bit.

Codes: a class and an offset
----------------------------
The ranks ``0 .. M-1`` are cut into at most ``2^w`` consecutive **classes**; class ``c`` holds
``2^o_c`` ranks from ``base_c`` on. A weight is stored as its class (a ``w``-bit field in the
*main* stream) and its offset in the class (an ``o_c``-bit field in the *suffix* stream, fields
laid end to end, none for ``o_c = 0``). This is a two-part prefix code: frequent values get
short classes, rare ones wide classes. Hashed weights are roughly normal, so a few central
values are most of the weights: on the shared models a layout costs 7.27-7.38 bits per weight
where fixed-length codes need 9, within 0.15 bit of the codes' entropy. A planner
(:func:`plan_layout`, dynamic programming over the rank histogram) picks ``w`` (1, 2 or 4: class
fields never straddle a byte) and the ``o_c``; uniform codes get plain uint8 / uint16 fields.

Decoding, for all weights at once (``W, B, P``: per-class tables of ``o_c``, ``base_c``,
``2^o_c``; ``s``: the suffix stream's bytes):

    cls  = (byte[:, None] / 2^(w·k)) % 2^w          # k < 8/w: the class fields of each byte
    off  = CumSum(Gather(W, cls), exclusive=1)      # where each suffix field starts
    win  = s[j] + 256 s[j+1] + 65536 s[j+2]         # the suffix's 3-byte windows, built once
    code = (win[off/8] / 2^(off%8)) % Gather(P, cls) + Gather(B, cls)

onnxruntime keeps every intermediate tensor of constant folding until it ends: loading costs
78-107 bytes of memory per stored weight for a moment (benchmarks/bench_load.py). Written into a
``ModelProto``, the decoders come with a map (``metadata_props["redpp.codebook"]``, see
:func:`write_codebooks` and ``redpp_onnx/storage.py``) from which ``redpp_onnx.session`` decodes
the weights itself, in C++, and loads the model with about 1.35x the fp32 model's peak memory
and 1.2-1.6x its time.

Banks
-----
Stored tensors share decoders (**banks**): a bank's codes are concatenated, decoded once and
``Split`` per tensor, and its tensors' rank histograms are pooled for the planner. Tensors whose
histograms differ much (a peaked one and a flat one) get banks of their own when the layouts they
save pay for the extra decoder (:func:`banks`); a bank holds at most ``BANK_WEIGHTS`` weights so
that bit offsets stay within int32.

Codebooks: lattice values
-------------------------
The hash pass puts every mode on the grid ``j·h`` with ``h`` a float32 number (``j`` integer or
half-integer, :func:`redpp_onnx.hashing.kde.grid_step`), so the value is exactly the float32
product ``float32(2j) × float32(h/2)``. Such a codebook is stored as int16 ``2j`` (all of them
in one tensor, cast and split once) and one ``Mul`` by ``h/2``: half the bytes of float32, and
exact, which :func:`lattice_codes` checks value by value; any other codebook (merged weights,
the int8 baseline) is stored as float32.

One codebook per group of output channels
-----------------------------------------
A tensor hashed per output channel has few values per channel but many per tensor: it can be
stored with one codebook per channel (or per group of consecutive channels, along the first or
the last axis), its codes being ranks within the weight's group. A tensor hashed per group of
channels that are not consecutive (:mod:`redpp_onnx.hashing.rd`: channels sorted by RMS and cut
into groups) is stored with one codebook per such group and a **channel map** (a uint8 group id
per channel, uint16 beyond 256 groups). :func:`tensor_codes` picks, per tensor, the form that
takes the fewest bits (codes, tables, group counts, units and map, and the grouped decoder's
nodes). The decoder adds each channel's codebook start (that of its group: ``channel // size``,
or the map's entry) to the codes (viewed as ``outer × channels × inner``), gathers, and
multiplies by the group's lattice unit if it has one.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import onnx
from onnx import helper, numpy_helper

try:  # CPython's own SHA-256: hashlib loads OpenSSL, 3.7 MiB of memory for every fast-path load
    from _sha2 import sha256 as _sha256  # Python >= 3.12
except ImportError:
    try:
        from _sha256 import sha256 as _sha256  # Python <= 3.11
    except ImportError:
        from hashlib import sha256 as _sha256

MIN_OPSET = 11  # Range, CumSum(exclusive)
MAX_FIELD_BITS = 16  # a 24-bit window covers a field of up to 16 bits at any bit offset
MAX_CLASS_BITS = 4  # class fields of 1, 2 or 4 bits: at most 16 classes
BANK_WEIGHTS = 1 << 26  # x 16 suffix bits < 2^31: bit offsets fit int32
LATTICE_DTYPE = np.int16

__all__ = ["MIN_OPSET", "METADATA_KEY", "Layout", "Groups", "TensorCodes", "pack", "pack_fields", "unpack",
           "rank_codes", "lattice_codes", "plan_layout", "encode", "decode", "stored_bits", "rank_histogram",
           "banks", "write_codebooks", "tensor_codes", "checksum", "decoder_digest", "set_metadata",
           "refusal", "opset_version"]


# --------------------------------------------------------------------------- bit streams

def pack_fields(fields: np.ndarray, widths) -> np.ndarray:
    """Fields (``fields[i] < 2^widths[i]``; ``widths`` an int or an array) laid end to end,
    little-endian bit order, as ``total // 8 + 3`` bytes (``total``: the bits of all fields) with
    zero padding. The decoder reads the 3 bytes from the byte of a field's start bit ``p``; the
    largest ``p`` is ``total``, for an empty field (width 0) after all the data, so this is
    ``ceil(total / 8) + 2`` bytes, and one more when ``total`` is a multiple of 8."""
    f = np.asarray(fields, np.int64).ravel()
    w = np.broadcast_to(np.asarray(widths, np.int64), f.shape)
    if f.size and (int(w.max()) > MAX_FIELD_BITS or np.any(f >> w)):
        raise ValueError(f"a field does not fit its width (<= {MAX_FIELD_BITS} bits)")
    offsets = np.cumsum(w) - w
    total = int(w.sum())
    bits = np.zeros(total, np.uint8)
    for j in range(int(w.max()) if f.size else 0):
        has = w > j
        bits[offsets[has] + j] = (f[has] >> j) & 1
    data = np.packbits(bits, bitorder="little")
    return np.concatenate([data, np.zeros(total // 8 + 3 - data.size, np.uint8)])


def pack(codes: np.ndarray, bits: int) -> np.ndarray:
    """Fixed-width fields: :func:`pack_fields` with one width."""
    return pack_fields(codes, int(bits))


def unpack(packed: np.ndarray, bits, count: int) -> np.ndarray:
    """numpy mirror of the ONNX field reader (``bits``: an int or per-field widths)."""
    w = np.broadcast_to(np.asarray(bits, np.int64), (count,))
    pos = np.cumsum(w) - w
    s = packed.astype(np.int64)
    word = s[pos // 8] + 256 * s[pos // 8 + 1] + 65536 * s[pos // 8 + 2]
    return (word >> (pos % 8)) % (1 << w)


# --------------------------------------------------------------------------- codes and layouts

def rank_codes(values: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """``(codebook, codes)``: the distinct float32 values, most frequent first (ties: smaller
    value first), and the rank of every weight's value (flat int64). Values are told apart by
    their bits: -0.0 and 0.0 (and NaNs of different payloads) are distinct values, so that
    ``codebook[codes]`` is the tensor bit for bit."""
    bits, inv, counts = np.unique(np.ascontiguousarray(values, np.float32).ravel().view(np.uint32),
                                  return_inverse=True, return_counts=True)
    v = bits.view(np.float32)
    order = np.lexsort((bits, v, -counts))
    rank = np.empty_like(order)
    rank[order] = np.arange(order.size)
    return v[order], rank[inv.ravel()].astype(np.int64)


def lattice_codes(codebook: np.ndarray, unit: Optional[float]) -> Optional[np.ndarray]:
    """Integers ``k`` (int16) with ``float32(k) * float32(unit) == codebook`` exactly (the same
    bits: a -0.0 is not on the lattice), or None."""
    if unit is None or not np.isfinite(unit) or unit <= 0:
        return None
    u32 = np.float32(unit)
    if float(u32) != unit:
        return None
    k = np.rint(codebook.astype(np.float64) / float(u32))
    info = np.iinfo(LATTICE_DTYPE)
    if k.size and (k.min() < info.min or k.max() > info.max):
        return None
    k = k.astype(LATTICE_DTYPE)
    if not np.array_equal((k.astype(np.float32) * u32).view(np.uint32),
                          np.ascontiguousarray(codebook, np.float32).view(np.uint32)):  # -0.0 too
        return None
    return k


@dataclasses.dataclass(frozen=True)
class Layout:
    """``width`` bits of class per weight; class ``c`` has ``2^classes[c]`` ranks."""

    width: int
    classes: Tuple[int, ...]

    def __post_init__(self):
        if not 1 <= len(self.classes) <= (1 << self.width) or not all(0 <= o <= MAX_FIELD_BITS for o in self.classes):
            raise ValueError(f"invalid layout: {len(self.classes)} classes for {self.width}-bit class fields")

    @property
    def bases(self) -> np.ndarray:
        sizes = np.left_shift(1, np.asarray(self.classes, np.int64))
        return np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)

    @property
    def capacity(self) -> int:
        return int(sum(1 << o for o in self.classes))

    @property
    def direct(self) -> bool:
        """Plain fixed-length codes: no suffix."""
        return not any(self.classes)


def encode(codes: np.ndarray, layout: Layout) -> Tuple[np.ndarray, np.ndarray]:
    """``(classes, offsets)`` of ``codes`` (each below ``layout.capacity``)."""
    c = np.asarray(codes, np.int64).ravel()
    if c.size and int(c.max()) >= layout.capacity:
        raise ValueError(f"a code does not fit the layout ({layout.capacity} values)")
    cls = np.searchsorted(layout.bases, c, side="right") - 1
    return cls, c - layout.bases[cls]


def decode(classes: np.ndarray, offsets: np.ndarray, layout: Layout) -> np.ndarray:
    """numpy mirror of the ONNX decoding (inverse of :func:`encode`)."""
    return layout.bases[classes] + offsets


def stored_bits(codes: np.ndarray, layout: Layout) -> int:
    """Bits the codes take: a class field each, plus their offset fields."""
    cls, _ = encode(codes, layout)
    return int(len(cls) * layout.width + np.asarray(layout.classes, np.int64)[cls].sum())


def rank_histogram(codes: np.ndarray, n_values: int) -> np.ndarray:
    return np.bincount(np.asarray(codes).ravel(), minlength=n_values).astype(np.int64)


def plan_layout(hist: np.ndarray) -> Tuple[int, Layout]:
    """``(bits, layout)``: the layout storing codes with rank histogram ``hist`` (counts of rank
    0, 1, ...) in the fewest bits; plain uint8 / uint16 codes on ties and when nothing does
    better.

    Class fields are ``w = 1, 2 or 4`` bits (they never straddle a byte, which keeps the decoder
    small; 8-bit classes would gain < 0.06 bit on the shared models). ``f[e][s]``: fewest
    suffix bits for ranks ``>= s`` in at most ``e`` classes, where a class of ``2^o`` ranks from
    ``s`` costs ``o`` bits per weight it holds; a layout of width ``w`` costs ``N·w + f[2^w][0]``."""
    hist = np.asarray(hist, np.int64)
    m = max(len(hist), 1)
    n = int(hist.sum())
    if m > (1 << MAX_FIELD_BITS):
        raise ValueError(f"{m} values need more than {MAX_FIELD_BITS} bits")
    flat = 8 if m <= 256 else 16
    best = (n * flat, Layout(flat, (0,) * m))
    if m <= 2:
        return (n, Layout(1, (0,) * m)) if n else best
    cum = np.concatenate([[0], np.cumsum(hist)])
    s = np.arange(m + 1)
    inf = np.iinfo(np.int64).max // 4
    f = np.where(s >= m, 0, inf).astype(np.int64)
    choices = []  # per number of classes e: the width o chosen at every start s
    for e in range(1, (1 << MAX_CLASS_BITS) + 1):
        g = np.full(m + 1, inf, np.int64)
        arg = np.zeros(m + 1, np.int64)
        for o in range(0, MAX_FIELD_BITS + 1):
            end = np.minimum(s + (1 << o), m)
            cand = (cum[end] - cum[s]) * o + f[end]
            better = cand < g
            g[better], arg[better] = cand[better], o
            if (1 << o) >= m:
                break
        g[m] = 0
        f = g
        choices.append(arg)
        if e in (2, 4, 16):
            cand = (n * (e.bit_length() - 1) + int(f[0]), Layout(e.bit_length() - 1, _walk(choices, m)))
            if (cand[0], not cand[1].direct) < (best[0], not best[1].direct):  # ties: no suffix
                best = cand
    return best


def _walk(choices: List[np.ndarray], m: int) -> Tuple[int, ...]:
    """The class widths chosen from rank 0 with ``len(choices)`` classes (trailing empty ones
    dropped)."""
    out, start = [], 0
    for arg in reversed(choices):
        if start >= m:
            break
        o = int(arg[start])
        out.append(o)
        start += 1 << o
    return tuple(out)


# --------------------------------------------------------------------------- per-group codebooks

GROUP_SIZES = (1, 2, 4, 8, 16, 32, 64)
"""Channels per codebook tried for the grouped form (1: one codebook per output channel)."""
GROUP_GRAPH_BITS = 8 * 384
"""What the grouped form's decoder adds to the file beyond its tables and one codebook's decoder
(nodes and small constants: 256-527 bytes measured, more with groups of channels and units;
``tests/passes/test_codebook.py`` checks the figure); counted in the choice."""


@dataclasses.dataclass(frozen=True)
class Groups:
    """One codebook per group of slices along ``axis``. The tensor is seen as ``outer × channels ×
    inner`` (``channels = shape[axis]``); weight ``i`` is in channel ``(i // inner) % channels``
    and group ``channel_map[channel]``, or ``channel // size`` when ``channel_map`` is None (groups
    of ``size`` consecutive channels). ``counts[g]``: values in group ``g``'s codebook (the
    codebooks are laid end to end, each most frequent first); ``units``: float32 lattice unit per
    group (the values are ``float32(k) × units[g]``), or None.

    ``channel_map``: any channel -> group map (int, ``channels`` entries, every id below
    ``len(counts)``), e.g. channels sorted by RMS and cut into groups
    (:mod:`redpp_onnx.hashing.rd`); ``size`` is then the largest group's channel count (for
    reports: the decoder reads the map)."""

    axis: int
    outer: int
    channels: int
    inner: int
    size: int
    counts: np.ndarray
    units: Optional[np.ndarray] = None
    channel_map: Optional[np.ndarray] = None

    @property
    def n_groups(self) -> int:
        if self.channel_map is not None:
            return int(self.counts.size)
        return -(-self.channels // self.size)

    @property
    def offsets(self) -> np.ndarray:
        """Where each group's codebook starts in the concatenated table."""
        return np.concatenate([[0], np.cumsum(self.counts)[:-1]]).astype(np.int64)

    @property
    def count_dtype(self):
        """The stored dtype of ``counts``: the smallest of uint8, uint16, int32 that holds them."""
        top = int(self.counts.max())
        return np.uint8 if top <= 0xFF else np.uint16 if top <= 0xFFFF else np.int32

    @property
    def map_dtype(self):
        """The stored dtype of ``channel_map``: uint8 for up to 256 groups, uint16 for up to
        65536, else int32."""
        n = self.n_groups
        return np.uint8 if n <= 0x100 else np.uint16 if n <= 0x10000 else np.int32

    def group_of(self) -> np.ndarray:
        """Group of every channel (int64, ``channels`` entries)."""
        if self.channel_map is not None:
            return np.asarray(self.channel_map, np.int64)
        return np.arange(self.channels, dtype=np.int64) // self.size

    def channel_of(self) -> np.ndarray:
        """Channel of every weight (flat order)."""
        per = np.repeat(np.arange(self.channels, dtype=np.int64), self.inner)
        return np.tile(per, self.outer) if self.outer > 1 else per

    def side_bits(self) -> int:
        """Bits of the group tables: the counts, the units and the channel map."""
        bits = self.n_groups * (8 * np.dtype(self.count_dtype).itemsize + (32 if self.units is not None else 0))
        if self.channel_map is not None:
            bits += self.channels * 8 * np.dtype(self.map_dtype).itemsize
        return bits


# --------------------------------------------------------------------------- tensors and banks

@dataclasses.dataclass
class TensorCodes:
    """One tensor to store: its codebook (rank order), codes and, if exact, lattice integers.

    ``groups`` None: one codebook for the tensor, ``codebook[codes]`` is the tensor. Otherwise
    ``codebook`` holds the groups' codebooks end to end and ``codes`` are ranks within the
    weight's group (:class:`Groups`). ``lattice``: int16 ``k`` with ``codebook == float32(k) ×
    unit`` (``unit``: one float32 number) or ``× groups.units[group]``; None: float32 table."""

    name: str
    shape: Tuple[int, ...]
    codebook: np.ndarray            # float32, most frequent first (per group when grouped)
    codes: np.ndarray               # int64, flat
    lattice: Optional[np.ndarray]   # int16 k with float32(k) * unit == codebook, or None
    unit: Optional[float]
    groups: Optional[Groups] = None

    @property
    def n_ranks(self) -> int:
        """Codes are below this: the largest codebook's size."""
        return int(self.groups.counts.max()) if self.groups is not None else int(self.codebook.size)

    @property
    def form(self) -> str:
        """``"tensor"`` (one codebook) or ``"groups"`` (one per group of output channels)."""
        return "tensor" if self.groups is None else "groups"

    def codebook_bytes(self) -> int:
        """Bytes of the tables: codebook values, plus the groups' counts, units and channel map."""
        table = self.codebook.size * (2 if self.lattice is not None else 4)
        return table + (self.groups.side_bits() // 8 if self.groups is not None else 0)

    def table_bits(self) -> int:
        return 8 * self.codebook_bytes() + (GROUP_GRAPH_BITS if self.groups is not None else 0)

    def values(self) -> np.ndarray:
        """The stored tensor, rebuilt in numpy (float32, ``shape``)."""
        index = self.codes
        if self.groups is not None:
            g = self.groups
            index = index + g.offsets[g.group_of()[g.channel_of()]]
        return self.codebook[index].reshape(self.shape)


def tensor_codes(name: str, values: np.ndarray, unit, *, forms: Sequence[str] = ("tensor", "groups"),
                 unit_axis: int = 0, channel_groups=None, coder: str = "prefix") -> TensorCodes:
    """:class:`TensorCodes` of a tensor's current values, in the form that stores them in the
    fewest bits: one codebook for the tensor, or one per group of 1, 2, 4 ... 64 consecutive
    slices along the first or the last axis (output channels of Conv, Gemm, MatMul weights), or
    one per group of ``channel_groups``. The count is exact for the tables (the channel map
    included) and the codes under the tensor's own best layout (the bank pools histograms, which
    moves all forms alike); the grouped forms also pay ``GROUP_GRAPH_BITS``. Ties keep one
    codebook, then consecutive groups.

    ``unit``: the lattice hint: one float32 number, None, or one unit per slice along
    ``unit_axis`` (per-channel hashing: each channel's modes on its own grid).

    ``channel_groups``: None, or one group id (any integers) per slice along ``unit_axis``: the
    channels hashed with one codebook (e.g. sorted by RMS and cut into groups, in any order).
    That grouping along ``unit_axis`` is then one more candidate (int16 tables times a unit per
    group when the per-slice ``unit`` is the same within each group; else int16 tables times
    ``unit`` when it is one number, or float32 tables); a grouping into runs of consecutive
    channels (all of one size but the last) is that consecutive form, without a map.
    ``forms``: ``"tensor"``, ``"groups"`` (consecutive groups, and the ``channel_groups``
    grouping when given), ``"map"`` (the ``channel_groups`` grouping alone). Raises ValueError
    when ``channel_groups`` does not have one integer id per slice.

    ``coder``: the cost the forms are compared by: ``"prefix"`` (the standard-ops form's codes
    and decoders) or ``"rans"`` (the compact form: entropy plus models, tables, no decoders)."""
    if coder not in CODERS:
        raise ValueError(f"coder {coder!r}: one of {', '.join(CODERS)}")
    values = np.ascontiguousarray(values, np.float32)
    slice_units = None
    if unit is not None and np.ndim(unit) == 1:
        slice_units = np.asarray(unit, np.float64)
        unit = None
        if slice_units.size and np.all(slice_units == slice_units[0]):  # one grid after all
            unit, slice_units = float(slice_units[0]), None
    channel_map = None
    if channel_groups is not None and values.ndim >= 1:
        channel_map = _canonical_map(channel_groups, values.shape[unit_axis % values.ndim])
    codebook, codes = rank_codes(values)
    lattice = lattice_codes(codebook, unit)
    best = TensorCodes(name, tuple(values.shape), codebook, codes, lattice, unit)
    if "tensor" not in forms:
        best = None
    mapped = channel_map is not None and ("groups" in forms or "map" in forms)
    if ("groups" in forms or mapped) and values.ndim >= 2 and codebook.size <= (1 << MAX_FIELD_BITS):
        bound = None
        if best is not None:
            bound = (best.table_bits() + _code_bits(codes, codebook.size) if coder == "prefix"
                     else 8 * best.codebook_bytes() + _code_bits(codes, codebook.size, "rans"))
        if "groups" in forms:
            for axis in sorted({0, values.ndim - 1}):
                units = slice_units if slice_units is not None and axis == unit_axis % values.ndim else None
                cand = _grouped(name, values.shape, codebook, codes, lattice, unit, axis, units, bound, coder=coder)
                if cand is not None:
                    best, bound = cand
        if mapped:
            cand = _grouped(name, values.shape, codebook, codes, lattice, unit, unit_axis % values.ndim,
                            slice_units, bound, channel_map, coder=coder)
            if cand is not None:
                best, bound = cand
    if best is None:
        raise ValueError(f"{name}: no form of {tuple(forms)} applies to shape {values.shape}")
    return best


def _canonical_map(ids, channels: int) -> Tuple[int, Optional[np.ndarray]]:
    """``(size, map)`` of a channel -> group id assignment: the groups numbered by their first
    channel (``map``, int64), and ``size`` their largest channel count; ``(size, None)`` when the
    groups are runs of ``size`` consecutive channels (the last maybe shorter)."""
    a = np.asarray(ids)
    if a.ndim != 1 or a.size != channels or channels == 0:
        raise ValueError(f"channel_groups: {a.size} group ids of shape {a.shape} for {channels} channels")
    if a.dtype.kind not in "iu":
        if a.dtype.kind != "f" or not np.all(np.isfinite(a)) or not np.all(a == np.rint(a)):
            raise ValueError(f"channel_groups: ids of type {a.dtype} are not integers")
        a = a.astype(np.int64)
    _, first, inv = np.unique(a, return_index=True, return_inverse=True)
    rank = np.empty(first.size, np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(first.size)
    canon = rank[inv.ravel()]
    per = np.bincount(canon)
    if np.array_equal(canon, np.arange(channels, dtype=np.int64) // int(per[0])):
        return int(per[0]), None
    return int(per.max()), canon


RANS_MODEL_ENTRY_BITS = 16
"""The compact form (``redpp_onnx/compact.py``): what one frequency of an rANS model costs in the
file (uint16 or uint32 frequencies, zlib'd with the other tables: 9-16 bits measured)."""
CODERS = ("prefix", "rans")


def _entropy_bits(hist: np.ndarray) -> float:
    h = np.asarray(hist, np.float64)
    h = h[h > 0]
    return float(np.sum(h * np.log2(h.sum() / h))) if h.size else 0.0


def _code_bits(codes: np.ndarray, n_values: int, coder: str = "prefix") -> float:
    hist = rank_histogram(codes, n_values)
    if coder == "rans":
        return _entropy_bits(hist) + RANS_MODEL_ENTRY_BITS * hist.size
    return plan_layout(hist)[0]


def _grouped(name, shape, book, codes, lattice, unit, axis, slice_units, bound, channel_map=None, coder="prefix"):
    """``(TensorCodes, bits)`` of the grouped form along ``axis`` whose group size stores the
    tensor in the fewest bits, when fewer than ``bound`` (None: any); else None. A group size
    whose lower bound (the codes' conditional entropy given the group, which no prefix code of
    the pooled ranks beats, plus 16 bits an entry) is not below ``bound`` is not planned.
    ``channel_map``: a ``(size, map)`` of :func:`_canonical_map`, the one grouping tried instead
    of the consecutive sizes. ``coder="rans"``: the compact form's cost instead (the codes'
    entropy, pooled or given the group, whichever is smaller with its models' frequencies; no
    decoder graph)."""
    graph_bits = GROUP_GRAPH_BITS if coder == "prefix" else 0
    n, m = codes.size, book.size
    outer, channels = int(np.prod(shape[:axis], dtype=np.int64)), int(shape[axis])
    inner = int(np.prod(shape[axis + 1:], dtype=np.int64))
    if channels < 2 or n == 0:
        return None
    probe = Groups(axis, outer, channels, inner, 1, np.ones(1, np.int64))
    key = probe.channel_of() * m + codes
    if channels * m <= (1 << 24):  # (channel, value) pairs and their weights
        counts = np.bincount(key, minlength=channels * m)
        pairs = np.flatnonzero(counts)
        counts = counts[pairs]
    else:
        pairs, counts = np.unique(key, return_counts=True)
    pair_channel, pair_value = pairs // m, pairs % m
    book_bits = book.view(np.uint32).astype(np.int64)
    if channel_map is None:
        candidates = [(size, None) for size in GROUP_SIZES if size < channels or size == 1]
    else:
        candidates = [channel_map]
    best = None
    for size, cmap in candidates:
        if cmap is None:
            channel_group, n_groups = np.arange(channels, dtype=np.int64) // size, -(-channels // size)
            first = np.arange(0, channels, size)
        else:
            channel_group, n_groups = cmap, int(cmap.max()) + 1
            first = np.unique(cmap, return_index=True)[1]  # every group's first channel
        group_units = None
        if slice_units is not None:
            group_units = slice_units[first].astype(np.float32)
            if not np.array_equal(group_units.astype(np.float64)[channel_group], slice_units):
                if cmap is None:
                    continue  # the channels of a group do not share a grid
                group_units = None  # the one grouping asked for: float32 tables
        group = channel_group[pair_channel]
        if size > 1 or cmap is not None:  # pairs of (group, value)
            gkey = group * m + pair_value
            if n_groups * m <= (1 << 24):
                dense = np.bincount(gkey, weights=counts, minlength=n_groups * m)
                ukeys = np.flatnonzero(dense)
                gcounts = dense[ukeys].astype(np.int64)
                index = np.zeros(n_groups * m, np.int64)
                index[ukeys] = np.arange(ukeys.size)
                inv = index[gkey]
            else:
                ukeys, inv = np.unique(gkey, return_inverse=True)
                gcounts = np.bincount(inv.ravel(), weights=counts).astype(np.int64)
            ggroup, gvalue = ukeys // m, ukeys % m
        else:
            inv, gcounts, ggroup, gvalue = None, counts, group, pair_value
        if bound is not None or coder == "rans":
            totals = np.bincount(ggroup, weights=gcounts, minlength=n_groups)
            entropy = float(np.sum(gcounts * np.log2(totals[ggroup] / gcounts)))
            if bound is not None and (entropy + 16 * gcounts.size + graph_bits) * (1 - 1e-9) >= bound:
                continue
        order = np.lexsort((book_bits[gvalue], book[gvalue], -gcounts, ggroup))  # per group, most frequent first
        sizes = np.bincount(ggroup, minlength=n_groups).astype(np.int64)
        starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
        rank_sorted = np.arange(order.size) - starts[ggroup[order]]
        table = book[gvalue[order]]
        k, table_unit = None, None
        if group_units is not None:
            gu = group_units[ggroup[order]]
            k = _lattice_per_entry(table, gu)
            if k is None:
                group_units = None
        elif lattice is not None:
            k, table_unit = lattice[gvalue[order]], unit
        groups = Groups(axis, outer, channels, inner, size, sizes, group_units if k is not None else None, cmap)
        hist = np.bincount(rank_sorted, weights=gcounts[order], minlength=int(sizes.max())).astype(np.int64)
        t = TensorCodes(name, tuple(shape), table, np.empty(0, np.int64), k, table_unit, groups)
        if coder == "rans":
            bits = min(entropy + RANS_MODEL_ENTRY_BITS * gcounts.size,
                       _entropy_bits(hist) + RANS_MODEL_ENTRY_BITS * hist.size) + 8 * t.codebook_bytes()
        else:
            bits = plan_layout(hist)[0] + t.table_bits()
        if bound is None or bits < bound:
            bound = bits
            rank = np.empty(order.size, np.int64)
            rank[order] = rank_sorted
            best = (t, rank, inv)
    if best is None:
        return None
    t, rank, inv = best
    pair_of = np.searchsorted(pairs, key)  # pairs are sorted keys
    group_pair = inv.ravel()[pair_of] if inv is not None else pair_of
    t.codes = rank[group_pair]
    return t, bound


def _lattice_per_entry(table: np.ndarray, units: np.ndarray) -> Optional[np.ndarray]:
    """int16 ``k`` with ``float32(k) * units == table`` bit for bit (entry by entry), or None."""
    if units.size and (not np.all(np.isfinite(units)) or np.any(units <= 0)):
        return None
    k = np.rint(table.astype(np.float64) / units.astype(np.float64))
    info = np.iinfo(LATTICE_DTYPE)
    if k.size and (not np.all(np.isfinite(k)) or k.min() < info.min or k.max() > info.max):
        return None
    k = k.astype(LATTICE_DTYPE)
    if not np.array_equal((k.astype(np.float32) * units).view(np.uint32), table.view(np.uint32)):
        return None
    return k


def refusal(t: TensorCodes, plain_bytes: float = 4.0) -> Optional[str]:
    """Why ``t`` is better stored plainly (``plain_bytes`` per weight: 4 for float32, 2 for
    float16), or None. The estimate of the stored size is an upper bound: fixed-length codes, the
    tables and a few dozen bytes of graph."""
    if t.codes.size > BANK_WEIGHTS:
        return f"more than {BANK_WEIGHTS} weights, too many for one codebook decoder"
    if t.n_ranks > (1 << MAX_FIELD_BITS):
        return f"more than {1 << MAX_FIELD_BITS} distinct values"
    bits = max(1, math.ceil(math.log2(max(t.n_ranks, 2))))
    if t.codes.size * bits / 8 + t.table_bits() / 8 + 64 >= plain_bytes * t.codes.size:
        return f"{t.codebook.size} values for {t.codes.size} weights: a codebook would not shrink it"
    return None


BANK_COST_BITS = 7200
"""What one more bank adds to a file beyond its codes: its decoder's nodes and small constants and
its entry in the map, about 900 bytes (measured: two tiny tensors in two banks instead of one)."""


def banks(tensors: Sequence[TensorCodes]) -> List[List[int]]:
    """Indices of the tensors of each bank: tensors whose rank histograms differ (a peaked one,
    where most weights take the first value, and a flat one) code better with a layout each. The
    tensors are ordered by the entropy of their ranks; starting from one bank per tensor, the
    adjacent pair of banks whose merge saves the most bits (pooled layout + ``BANK_COST_BITS`` per
    bank) is merged while a merge saves any, and no bank exceeds ``BANK_WEIGHTS`` weights. On
    ResNet-56 hashed per channel group this stores the codes in 0.2-0.3 fewer bits per weight
    than one pooled layout."""
    if not tensors:
        return []
    hists = [rank_histogram(t.codes, t.n_ranks) for t in tensors]

    def entropy(h):
        p = h[h > 0] / max(h.sum(), 1)
        return float(-(p * np.log2(p)).sum())

    order = sorted(range(len(tensors)), key=lambda i: (entropy(hists[i]), i))
    segs = [[i] for i in order]
    sizes = [tensors[i].codes.size for i in order]
    pooled = [hists[i] for i in order]

    def cost(h):
        return plan_layout(h)[0] + BANK_COST_BITS

    def merged(a, b):
        h = np.zeros(max(a.size, b.size), np.int64)
        h[:a.size] += a
        h[:b.size] += b
        return h

    costs = [cost(h) for h in pooled]
    gains = [None] * max(len(segs) - 1, 0)

    def gain(k):
        if sizes[k] + sizes[k + 1] > BANK_WEIGHTS:
            return None
        h = merged(pooled[k], pooled[k + 1])
        return costs[k] + costs[k + 1] - cost(h), h

    for k in range(len(gains)):
        gains[k] = gain(k)
    while gains:
        best = max((k for k in range(len(gains)) if gains[k] is not None), key=lambda k: gains[k][0], default=None)
        if best is None or gains[best][0] <= 0:
            break
        saved, h = gains[best]
        segs[best:best + 2] = [segs[best] + segs[best + 1]]
        sizes[best:best + 2] = [sizes[best] + sizes[best + 1]]
        pooled[best:best + 2] = [h]
        costs[best:best + 2] = [costs[best] + costs[best + 1] - saved]
        del gains[best]
        if best < len(gains):
            gains[best] = gain(best)
        if best > 0:
            gains[best - 1] = gain(best - 1)
    return [sorted(seg) for seg in segs]


# --------------------------------------------------------------------------- checksum

_CHECKSUM_CHUNK = 1 << 20
_MASK64 = (1 << 64) - 1


def checksum(values: np.ndarray) -> int:
    """Order-sensitive 128-bit checksum of float32 values, the one the metadata stores and the C++
    decoder (``redpp_onnx._core.decode_bank``) computes as it decodes: with ``b_i`` the 32 bits of
    value ``i`` of ``n``, ``s1 = Σ b_i`` and ``s2 = Σ (n - i) b_i`` (the sum of the running sums,
    Fletcher's construction), both modulo 2^64; returns ``s2 · 2^64 + s1``. Two adds per value
    as the decoder writes it; it detects any change of one value, any shift or swap of values
    and a wrong table, short of a deliberate forgery (not what it is for)."""
    bits = np.ascontiguousarray(values, np.float32).reshape(-1).view(np.uint32)
    n = bits.size
    s1 = s2 = 0
    with np.errstate(over="ignore"):
        for s in range(0, n, _CHECKSUM_CHUNK):
            b = bits[s:s + _CHECKSUM_CHUNK].astype(np.uint64)
            s1 += int(b.sum(dtype=np.uint64))
            s2 += int((np.arange(n - s, n - s - b.size, -1, dtype=np.uint64) * b).sum(dtype=np.uint64))
    return ((s2 & _MASK64) << 64) | (s1 & _MASK64)


# --------------------------------------------------------------------------- the graph

METADATA_KEY = "redpp.codebook"
"""The ``model.metadata_props`` key of the codebook map (``redpp_onnx/storage.py`` reads it)."""
METADATA_VERSION = 1
DIGEST_BYTES = 4096
"""Decoder constants up to this size go into the metadata's digest byte for byte; larger ones
(streams, codebooks) by type and shape: the decoded values' checksums cover their bytes."""


def opset_version(model: onnx.ModelProto) -> int:
    for o in model.opset_import:
        if o.domain in ("", "ai.onnx"):
            return o.version
    return 0


class _Builder:
    """Nodes and initializers of the decoders, with short unique names (``<prefix><n>``)."""

    def __init__(self, graph: onnx.GraphProto, opset: int):
        taken = {t.name for t in graph.initializer} | {o for n in graph.node for o in n.output}
        taken |= {i.name for i in graph.input}
        self.prefix = "rcb"
        while any(name.startswith(self.prefix) for name in taken):
            self.prefix += "_"
        self.opset = opset
        self.nodes: List[onnx.NodeProto] = []
        self.inits: List[onnx.TensorProto] = []
        self.banks: List[dict] = []  # per bank decoded by _decode_bank: what the metadata says of it
        self._n = 0
        self._consts: Dict[Tuple[str, bytes], str] = {}

    def name(self) -> str:
        self._n += 1
        return f"{self.prefix}{self._n}"

    def init(self, array: np.ndarray) -> str:
        name = self.name()
        self.inits.append(numpy_helper.from_array(np.array(array, order="C"), name))
        return name

    def const(self, value, dtype) -> str:
        """A shared constant."""
        a = np.asarray(value, dtype)
        key = (a.dtype.str + str(a.shape), a.tobytes())
        if key not in self._consts:
            self._consts[key] = self.init(a)
        return self._consts[key]

    def op(self, op_type: str, inputs: Sequence[str], outputs: Optional[Sequence[str]] = None,
           **attrs) -> str:
        outputs = list(outputs) if outputs is not None else [self.name()]
        self.nodes.append(helper.make_node(op_type, list(inputs), outputs, **attrs))
        return outputs[0]

    def split(self, x: str, sizes: Sequence[int], outputs: Sequence[str]) -> None:
        if len(sizes) == 1:  # (a single part is the whole tensor)
            self.op("Identity", [x], outputs)
        elif self.opset >= 13:
            self.op("Split", [x, self.init(np.asarray(sizes, np.int64))], outputs, axis=0)
        else:
            self.op("Split", [x], outputs, axis=0, split=[int(v) for v in sizes])


def _suffix_fields(b: _Builder, stream: np.ndarray, offsets: str, modulus: str) -> Tuple[str, str]:
    """``(fields, stream initializer)``: int32 fields of ``stream`` (from :func:`pack_fields`)
    starting at bit ``offsets``. The 3-byte windows are built once over the stream (smaller than
    the fields' count), so that a field costs one Gather of its window, a shift and a mask. There
    is a window at every byte ``0 .. total // 8``: every start bit ``0 .. total`` has one, an
    empty field's at the very end included (it reads the zero padding and its modulus 1 makes it
    0)."""
    init = b.init(stream)
    s = b.op("Cast", [init], to=onnx.TensorProto.INT32)
    n = stream.size - 2  # total // 8 + 1 windows
    window = [b.op("Slice", [s, b.const([k], np.int64), b.const([n + k], np.int64)]) for k in range(3)]
    words = b.op("Add", [b.op("Add", [window[0], b.op("Mul", [window[1], b.const(256, np.int32)])]),
                         b.op("Mul", [window[2], b.const(65536, np.int32)])])
    eight = b.const(8, np.int32)
    word = b.op("Gather", [words, b.op("Div", [offsets, eight])], axis=0)
    shift = b.op("Gather", [b.const(1 << np.arange(8), np.int32), b.op("Mod", [offsets, eight])], axis=0)
    return b.op("Mod", [b.op("Div", [word, shift]), modulus]), init


def _main_fields(b: _Builder, fields: np.ndarray, width: int) -> Tuple[str, str]:
    """``(fields, stream initializer)``: int32 tensor of fixed-width ``fields``: uint8 / uint16
    for widths 8 / 16; widths 1, 2, 4 pack ``8 / width`` fields in a byte (``fields.size`` a
    multiple of 8) and are split apart by one broadcast Div and Mod."""
    if width in (8, 16):
        init = b.init(fields.astype(np.uint8 if width == 8 else np.uint16))
        return b.op("Cast", [init], to=onnx.TensorProto.INT32), init
    per_byte = 8 // width
    if width not in (1, 2, 4) or fields.size % per_byte:
        raise ValueError(f"class fields of {width} bits for {fields.size} weights")
    init = b.init(pack(fields, width)[: fields.size // per_byte])  # whole bytes: the padding dropped
    column = b.op("Reshape", [b.op("Cast", [init], to=onnx.TensorProto.INT32), b.const([-1, 1], np.int64)])
    split = b.op("Div", [column, b.const(1 << (width * np.arange(per_byte)), np.int32)])
    return b.op("Reshape", [b.op("Mod", [split, b.const(1 << width, np.int32)]), b.const([-1], np.int64)]), init


def _decode_bank(b: _Builder, cls: np.ndarray, off: np.ndarray, layout: Layout) -> str:
    """int32 tensor of the bank's concatenated codes, from their :func:`encode` (``cls.size`` a
    multiple of 8). What the metadata says of the bank goes to ``b.banks``."""
    main, main_init = _main_fields(b, cls, layout.width)
    bank = {"main": main_init, "width": layout.width, "suffix": None, "count": int(cls.size),
            "classes": [] if layout.direct else [int(o) for o in layout.classes]}  # direct: the code is the field
    b.banks.append(bank)
    if layout.direct:
        return main
    widths = np.asarray(layout.classes, np.int64)
    table = lambda a: b.const(np.asarray(a, np.int32), np.int32)  # noqa: E731
    starts = b.op("CumSum", [b.op("Gather", [table(widths), main], axis=0), b.const(0, np.int32)], exclusive=1)
    suffix, bank["suffix"] = _suffix_fields(b, pack_fields(off, widths[cls]), starts,
                                            b.op("Gather", [table(1 << widths), main], axis=0))
    return b.op("Add", [suffix, b.op("Gather", [table(layout.bases), main], axis=0)])


def _gather_groups(b: _Builder, t: TensorCodes, book: str, part: str, out: str, units: Optional[str]) -> dict:
    """``out`` = the grouped tensor ``t`` from its codes ``part`` and its concatenated codebook
    ``book``: the codes viewed as ``outer × channels × inner`` plus each channel's codebook start
    (an exclusive CumSum of the stored counts, gathered by each channel's group: its stored map,
    or ``channel // size``), gathered, times each channel's unit if any."""
    g = t.groups
    counts = b.init(g.counts.astype(g.count_dtype))
    starts = b.op("CumSum", [b.op("Cast", [counts], to=onnx.TensorProto.INT32), b.const(0, np.int32)], exclusive=1)
    group_of, channel_map = None, None
    if g.channel_map is not None:
        channel_map = b.init(np.asarray(g.channel_map).astype(g.map_dtype))
        group_of = b.op("Cast", [channel_map], to=onnx.TensorProto.INT32)
    elif g.size > 1:
        group_of = b.op("Div", [b.op("Range", [b.const(0, np.int32), b.const(g.channels, np.int32),
                                                b.const(1, np.int32)]), b.const(g.size, np.int32)])
    if group_of is not None:
        starts = b.op("Gather", [starts, group_of], axis=0)
    column = b.const([g.channels, 1], np.int64)
    index = b.op("Add", [b.op("Reshape", [part, b.const([g.outer, g.channels, g.inner], np.int64)]),
                         b.op("Reshape", [starts, column])])
    values = b.op("Gather", [book, index], axis=0)
    if units is not None:
        per_channel = b.op("Gather", [units, group_of], axis=0) if group_of is not None else units
        values = b.op("Mul", [values, b.op("Reshape", [per_channel, column])])
    b.op("Reshape", [values, b.init(np.asarray(t.shape, np.int64))], [out])
    return {"axis": g.axis, "outer": g.outer, "channels": g.channels, "inner": g.inner, "size": g.size,
            "counts": counts, "units": units, "map": channel_map}


def write_codebooks(target, tensors: Sequence[TensorCodes], opset: int) -> Dict[str, Tuple[float, Layout]]:
    """Add decoders whose outputs are the ``tensors`` (by name) to ``target``'s graph; the caller
    removes the plain tensors. ``target``: a ``ModelProto`` (the codebook map then goes to its
    ``metadata_props["redpp.codebook"]``, see :func:`metadata`) or a ``GraphProto`` (no map).
    Returns each tensor's stored code bits per weight and its bank's layout."""
    if not tensors:
        return {}
    model = target if isinstance(target, onnx.ModelProto) else None
    graph = model.graph if model is not None else target
    b = _Builder(graph, opset)
    result: Dict[str, Tuple[float, Layout]] = {}
    entries: Dict[str, dict] = {}
    lattice = [t for t in tensors if t.lattice is not None]
    books: Dict[str, str] = {}
    units: Dict[str, str] = {}
    if lattice:  # one int16 tensor, cast and split once
        k_init = b.init(np.concatenate([t.lattice for t in lattice]))
        ks = b.op("Cast", [k_init], to=onnx.TensorProto.FLOAT)
        outs = [b.name() for _ in lattice]
        b.split(ks, [t.lattice.size for t in lattice], outs)
        start = 0
        for t, k in zip(lattice, outs):
            if t.groups is not None and t.groups.units is not None:  # multiplied per channel after the gather
                books[t.name] = k
                units[t.name] = b.init(t.groups.units.astype(np.float32))
                unit = None
            else:
                books[t.name] = b.op("Mul", [k, b.const(t.unit, np.float32)])
                unit = float(np.float32(t.unit)).hex()
            entries[t.name] = {"book": {"init": k_init, "offset": start, "size": int(t.lattice.size), "unit": unit}}
            start += t.lattice.size
    for t in tensors:
        if t.name not in books:
            books[t.name] = b.init(t.codebook.astype(np.float32))
            entries[t.name] = {"book": {"init": books[t.name], "offset": 0, "size": int(t.codebook.size),
                                        "unit": None}}
    for members in banks(tensors):
        group = [tensors[i] for i in members]
        hist = np.zeros(max(t.n_ranks for t in group), np.int64)
        for t in group:
            hist[: t.n_ranks] += rank_histogram(t.codes, t.n_ranks)
        _, layout = plan_layout(hist)
        codes = np.concatenate([t.codes for t in group])
        pad = -codes.size % 8  # whole bytes of class fields; the padding is split off and unused
        cls, off = encode(np.concatenate([codes, np.zeros(pad, np.int64)]), layout)
        x = _decode_bank(b, cls, off, layout)
        parts = [b.name() for _ in group]
        b.split(x, [t.codes.size for t in group] + ([pad] if pad else []), parts + ([b.name()] if pad else []))
        field_bits = layout.width + np.asarray(layout.classes, np.int64)[cls]  # per weight
        ends = np.cumsum([t.codes.size for t in group])
        for t, part, end in zip(group, parts, ends):
            result[t.name] = (float(field_bits[end - t.codes.size:end].sum()) / max(t.codes.size, 1), layout)
            entry = entries[t.name]
            entry.update(bank=len(b.banks) - 1, start=int(end - t.codes.size), count=int(t.codes.size),
                         shape=[int(d) for d in t.shape], dtype="float32", groups=None)
            if t.groups is not None:
                entry["groups"] = _gather_groups(b, t, books[t.name], part, t.name, units.get(t.name))
            elif len(t.shape) == 1:
                b.op("Gather", [books[t.name], part], [t.name], axis=0)
            else:
                flat = b.op("Gather", [books[t.name], part], axis=0)
                b.op("Reshape", [flat, b.init(np.asarray(t.shape, np.int64))], [t.name])
            if model is not None:
                entry["checksum"] = f"{checksum(t.values()):032x}"
    graph.initializer.extend(b.inits)
    for node in reversed(b.nodes):  # constants only: first in the node list keeps it topological
        graph.node.insert(0, node)
    if model is not None:
        meta = {"version": METADATA_VERSION, "banks": b.banks, "tensors": entries}
        meta["digest"] = decoder_digest(b.nodes, {t.name: t for t in b.inits}, meta)
        set_metadata(model, json.dumps(meta, separators=(",", ":")))
    return result


# --------------------------------------------------------------------------- the metadata

def set_metadata(model: onnx.ModelProto, value: Optional[str], key: str = METADATA_KEY) -> None:
    """Set (or with None remove) ``model.metadata_props[key]``."""
    keep = [p for p in model.metadata_props if p.key != key]
    del model.metadata_props[:]
    model.metadata_props.extend(keep)
    if value is not None:
        model.metadata_props.add(key=key, value=value)


def decoder_digest(nodes: Sequence[onnx.NodeProto], inits: Dict[str, onnx.TensorProto], meta: dict) -> str:
    """SHA-256 of the decoder subgraph and of the map: every node (type, inputs, outputs,
    attributes; in any order, names of nodes ignored), the constants it reads (those up to
    ``DIGEST_BYTES`` byte for byte, larger ones by name, type and shape) and the map ``meta``
    (its ``digest`` aside). The fast path loads a model only when the digest it computes is the
    one the map was written with: a graph edited after writing, or a map edited or damaged, is
    refused."""
    body = {k: v for k, v in meta.items() if k != "digest"}
    lines = ["map|" + json.dumps(body, sort_keys=True, separators=(",", ":"))]
    for n in nodes:
        attrs = ";".join(f"{a.name}={helper.get_attribute_value(a)!r}"
                         for a in sorted(n.attribute, key=lambda a: a.name))
        lines.append(f"{n.domain}|{n.op_type}|{','.join(n.input)}|{','.join(n.output)}|{attrs}")
    for name in sorted({i for n in nodes for i in n.input if i in inits}):
        t = inits[name]
        line = f"init|{name}|{t.data_type}|{list(t.dims)}"
        if t.data_location != onnx.TensorProto.EXTERNAL:
            itemsize = np.dtype(helper.tensor_dtype_to_np_dtype(t.data_type)).itemsize
            size = int(np.prod(t.dims, dtype=np.int64)) * itemsize
            if size <= DIGEST_BYTES:
                line += "|" + numpy_helper.to_array(t).tobytes().hex()
        lines.append(line)
    return _sha256("\n".join(sorted(lines)).encode()).hexdigest()
