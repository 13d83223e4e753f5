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
about 95 bytes of memory per stored weight for a moment (docs/RESULTS.md).

Banks
-----
All stored tensors share one decoder (a **bank**): their codes are concatenated, decoded once
and ``Split`` per tensor, and their rank histograms are pooled for the planner. A bank holds at
most ``BANK_WEIGHTS`` weights so that bit offsets stay within int32; more weights make more
banks.

Codebooks: lattice values
-------------------------
The hash pass puts every mode on the grid ``j·h`` with ``h`` a float32 number (``j`` integer or
half-integer, :func:`redpp_onnx.hashing.kde.grid_step`), so the value is exactly the float32
product ``float32(2j) × float32(h/2)``. Such a codebook is stored as int16 ``2j`` (all of them
in one tensor, cast and split once) and one ``Mul`` by ``h/2``: half the bytes of float32, and
exact, which :func:`lattice_codes` checks value by value; any other codebook (merged weights,
the int8 baseline) is stored as float32.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import onnx
from onnx import helper, numpy_helper

MIN_OPSET = 11  # Range, CumSum(exclusive)
MAX_FIELD_BITS = 16  # a 24-bit window covers a field of up to 16 bits at any bit offset
MAX_CLASS_BITS = 4  # class fields of 1, 2 or 4 bits: at most 16 classes
BANK_WEIGHTS = 1 << 26  # x 16 suffix bits < 2^31: bit offsets fit int32
LATTICE_DTYPE = np.int16

__all__ = ["MIN_OPSET", "Layout", "TensorCodes", "pack", "pack_fields", "unpack", "rank_codes",
           "lattice_codes", "plan_layout", "encode", "decode", "stored_bits", "rank_histogram", "banks",
           "write_codebooks", "tensor_codes",
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


# --------------------------------------------------------------------------- tensors and banks

@dataclasses.dataclass
class TensorCodes:
    """One tensor to store: its codebook (rank order), codes and, if exact, lattice integers."""

    name: str
    shape: Tuple[int, ...]
    codebook: np.ndarray            # float32, most frequent first
    codes: np.ndarray               # int64, flat
    lattice: Optional[np.ndarray]   # int16 k with float32(k) * unit == codebook, or None
    unit: Optional[float]

    def codebook_bytes(self) -> int:
        return self.codebook.size * (2 if self.lattice is not None else 4)


def tensor_codes(name: str, values: np.ndarray, unit: Optional[float]) -> TensorCodes:
    """:class:`TensorCodes` of a tensor's current values (``unit``: the lattice hint, or None)."""
    codebook, codes = rank_codes(values)
    return TensorCodes(name, tuple(values.shape), codebook, codes, lattice_codes(codebook, unit), unit)


def refusal(t: TensorCodes) -> Optional[str]:
    """Why ``t`` is better stored plainly, or None. The estimate of the stored size is an upper
    bound: fixed-length codes, the codebook and a few dozen bytes of graph."""
    if t.codes.size > BANK_WEIGHTS:
        return f"more than {BANK_WEIGHTS} weights, too many for one codebook decoder"
    if t.codebook.size > (1 << MAX_FIELD_BITS):
        return f"more than {1 << MAX_FIELD_BITS} distinct values"
    bits = max(1, math.ceil(math.log2(max(t.codebook.size, 2))))
    if t.codes.size * bits / 8 + t.codebook_bytes() + 64 >= 4.0 * t.codes.size:
        return f"{t.codebook.size} values for {t.codes.size} weights: a codebook would not shrink it"
    return None


def banks(tensors: Sequence[TensorCodes]) -> List[List[int]]:
    """Indices of the tensors of each bank (in order, at most ``BANK_WEIGHTS`` weights each)."""
    out: List[List[int]] = []
    size = 0
    for i, t in enumerate(tensors):
        if not out or size + t.codes.size > BANK_WEIGHTS:
            out.append([])
            size = 0
        out[-1].append(i)
        size += t.codes.size
    return out


# --------------------------------------------------------------------------- the graph

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


def _suffix_fields(b: _Builder, stream: np.ndarray, offsets: str, modulus: str) -> str:
    """int32 fields of ``stream`` (from :func:`pack_fields`) starting at bit ``offsets``. The
    3-byte windows are built once over the stream (smaller than the fields' count), so that a
    field costs one Gather of its window, a shift and a mask. There is a window at every byte
    ``0 .. total // 8``: every start bit ``0 .. total`` has one, an empty field's at the very end
    included (it reads the zero padding and its modulus 1 makes it 0)."""
    s = b.op("Cast", [b.init(stream)], to=onnx.TensorProto.INT32)
    n = stream.size - 2  # total // 8 + 1 windows
    window = [b.op("Slice", [s, b.const([k], np.int64), b.const([n + k], np.int64)]) for k in range(3)]
    words = b.op("Add", [b.op("Add", [window[0], b.op("Mul", [window[1], b.const(256, np.int32)])]),
                         b.op("Mul", [window[2], b.const(65536, np.int32)])])
    eight = b.const(8, np.int32)
    word = b.op("Gather", [words, b.op("Div", [offsets, eight])], axis=0)
    shift = b.op("Gather", [b.const(1 << np.arange(8), np.int32), b.op("Mod", [offsets, eight])], axis=0)
    return b.op("Mod", [b.op("Div", [word, shift]), modulus])


def _main_fields(b: _Builder, fields: np.ndarray, width: int) -> str:
    """int32 tensor of fixed-width ``fields``: uint8 / uint16 for widths 8 / 16; widths 1, 2, 4
    pack ``8 / width`` fields in a byte (``fields.size`` a multiple of 8) and are split apart by
    one broadcast Div and Mod."""
    if width in (8, 16):
        return b.op("Cast", [b.init(fields.astype(np.uint8 if width == 8 else np.uint16))],
                    to=onnx.TensorProto.INT32)
    per_byte = 8 // width
    if width not in (1, 2, 4) or fields.size % per_byte:
        raise ValueError(f"class fields of {width} bits for {fields.size} weights")
    stream = pack(fields, width)[: fields.size // per_byte]  # whole bytes: the padding dropped
    column = b.op("Reshape", [b.op("Cast", [b.init(stream)], to=onnx.TensorProto.INT32),
                              b.const([-1, 1], np.int64)])
    split = b.op("Div", [column, b.const(1 << (width * np.arange(per_byte)), np.int32)])
    return b.op("Reshape", [b.op("Mod", [split, b.const(1 << width, np.int32)]), b.const([-1], np.int64)])


def _decode_bank(b: _Builder, cls: np.ndarray, off: np.ndarray, layout: Layout) -> str:
    """int32 tensor of the bank's concatenated codes, from their :func:`encode` (``cls.size`` a
    multiple of 8)."""
    main = _main_fields(b, cls, layout.width)
    if layout.direct:
        return main
    widths = np.asarray(layout.classes, np.int64)
    table = lambda a: b.const(np.asarray(a, np.int32), np.int32)  # noqa: E731
    starts = b.op("CumSum", [b.op("Gather", [table(widths), main], axis=0), b.const(0, np.int32)], exclusive=1)
    suffix = _suffix_fields(b, pack_fields(off, widths[cls]), starts,
                            b.op("Gather", [table(1 << widths), main], axis=0))
    return b.op("Add", [suffix, b.op("Gather", [table(layout.bases), main], axis=0)])


def write_codebooks(graph: onnx.GraphProto, tensors: Sequence[TensorCodes], opset: int
                    ) -> Dict[str, Tuple[float, Layout]]:
    """Add decoders whose outputs are the ``tensors`` (by name) to ``graph``; the caller removes
    the plain tensors. Returns each tensor's stored code bits per weight and its bank's layout."""
    if not tensors:
        return {}
    b = _Builder(graph, opset)
    result: Dict[str, Tuple[float, Layout]] = {}
    lattice = [t for t in tensors if t.lattice is not None]
    books: Dict[str, str] = {}
    if lattice:  # one int16 tensor, cast and split once
        ks = b.op("Cast", [b.init(np.concatenate([t.lattice for t in lattice]))], to=onnx.TensorProto.FLOAT)
        outs = [b.name() for _ in lattice]
        b.split(ks, [t.lattice.size for t in lattice], outs)
        for t, k in zip(lattice, outs):
            books[t.name] = b.op("Mul", [k, b.const(t.unit, np.float32)])
    for t in tensors:
        if t.name not in books:
            books[t.name] = b.init(t.codebook.astype(np.float32))
    for members in banks(tensors):
        group = [tensors[i] for i in members]
        hist = np.zeros(max(t.codebook.size for t in group), np.int64)
        for t in group:
            hist[: t.codebook.size] += rank_histogram(t.codes, t.codebook.size)
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
            flat = t.name if len(t.shape) == 1 else b.name()
            b.op("Gather", [books[t.name], part], [flat], axis=0)
            if len(t.shape) != 1:
                b.op("Reshape", [flat, b.init(np.asarray(t.shape, np.int64))], [t.name])
    graph.initializer.extend(b.inits)
    for node in reversed(b.nodes):  # constants only: first in the node list keeps it topological
        graph.node.insert(0, node)
    return result
