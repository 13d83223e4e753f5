"""Prototype (not wired in): rank codes whose class is coded by binary decisions (unary class).

:mod:`redpp_onnx.passes.codebook` codes a weight's rank as a fixed-width class field (1, 2 or 4
bits) plus an offset field. When the ranks' entropy is low (peaked histograms) the fixed class
field costs up to a bit per weight above the entropy. Here the classes are the same (class ``c``:
``2^o_c`` consecutive ranks from ``base_c``, at most 16 classes) but the class is coded by binary
decisions, one bit stream per level:

* ``S_0``: one bit per weight, 1 when the weight is in class 0;
* ``S_k``: one bit per weight not in classes ``0 .. k-1``, 1 when it is in class ``k``;
* the last class (``K - 1``) is implied: no stream ``S_{K-1}``.

Class ``c`` costs ``c + 1`` bits (the last one ``c``) plus ``o_c`` offset bits; the offsets are
the suffix stream of :func:`codebook.pack_fields` (``o_c`` bits, fields end to end). Streams are
``K - 1`` little-endian packed bit streams plus the suffix.

Standard-ops decoding, all weights at once (every input a constant: onnxruntime folds it):

    reach_0 = 1
    pos_k   = CumSum(reach_k, exclusive)                 # the weight's bit in S_k, if it reaches k
    bit_k   = (S_k[pos_k / 8] / 2^(pos_k % 8)) % 2       # S_k padded: pos_k <= len, always in range
    reach_{k+1} = reach_k - reach_k * bit_k
    class   = Σ_{k >= 1} reach_k
    code    = suffix field (as codebook: CumSum of Gather(W, class)) + Gather(B, class)

Every level's tensors span all ``n`` weights: folding keeps about 39 bytes per weight per level
(plus the suffix decoder's ~70), against 70-107 for the whole fixed-class decoder.
:func:`build_decoder_compact` narrows each level to the weights that reach it (``TopK`` on a key,
sizes known when writing, since ``Compress`` / ``NonZero`` are not folded by onnxruntime) and
puts the classes back with one ``ScatterElements``: about ``Σ n_k`` entries instead of
``(K-1)·n``, but more nodes. A level costs ~400 bytes of nodes in the file: ``plan_unary(...,
level_bits=LEVEL_BITS)`` weighs that. Measurements: ``benchmarks/proto_unary.py``.
"""

from __future__ import annotations

from typing import List, Sequence, Tuple, Union

import numpy as np
import onnx
from onnx import helper

from redpp_onnx.passes import codebook as cb

MAX_CLASSES = 1 << cb.MAX_CLASS_BITS  # 16
INF = np.iinfo(np.int64).max // 4

__all__ = ["UnaryLayout", "LEVEL_BITS", "plan_unary", "best_layout", "unary_bits", "encode_unary", "decode_unary",
           "build_decoder", "reach_counts", "build_decoder_compact", "decoder_model", "node_bytes"]


class UnaryLayout(tuple):
    """The class widths ``o_c`` (a tuple of ints): class ``c`` has ``2^o_c`` ranks."""

    def __new__(cls, classes: Sequence[int]):
        classes = tuple(int(o) for o in classes)
        if not 1 <= len(classes) <= MAX_CLASSES or not all(0 <= o <= cb.MAX_FIELD_BITS for o in classes):
            raise ValueError(f"invalid unary layout {classes}")
        return super().__new__(cls, classes)

    @property
    def classes(self) -> Tuple[int, ...]:
        return tuple(self)

    @property
    def bases(self) -> np.ndarray:
        sizes = np.left_shift(1, np.asarray(self, np.int64))
        return np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)

    @property
    def capacity(self) -> int:
        return int(sum(1 << o for o in self))

    def class_bits(self) -> np.ndarray:
        """Decision bits of each class: ``c + 1``, the last ``c``."""
        k = len(self)
        b = np.arange(1, k + 1, dtype=np.int64)
        b[-1] = k - 1
        return b


def unary_bits(hist: np.ndarray, layout: UnaryLayout) -> int:
    """Exact bits (streams and suffix, no padding) of codes with rank histogram ``hist``."""
    hist = np.asarray(hist, np.int64)
    if hist.size > layout.capacity and hist[layout.capacity:].any():
        raise ValueError("a rank does not fit the layout")
    cls = np.searchsorted(layout.bases, np.arange(hist.size), side="right") - 1
    per = layout.class_bits() + np.asarray(layout, np.int64)
    return int((hist * per[cls]).sum())


LEVEL_BITS = 8 * 400
"""What a decoder level (its ~11 nodes and a stream's padding) adds to the file, measured: about
400 bytes (``benchmarks/proto_unary.py``); pass it as ``level_bits`` to weigh levels against bits."""


def plan_unary(hist: np.ndarray, max_classes: int = MAX_CLASSES, level_bits: int = 0) -> Tuple[int, UnaryLayout]:
    """``(bits, layout)``: the unary-class layout of at most ``max_classes`` classes storing codes
    of rank histogram ``hist`` in the fewest bits (exact count, no padding). Dynamic programming:
    ``g_c[s]``: fewest bits for ranks ``>= s`` when the next class is number ``c``; a class of
    ``2^o`` ranks from ``s`` costs ``c + 1 + o`` bits per weight, or ``c + o`` when it reaches the
    last rank (it is the last class). ``level_bits``: charged per decoder level (class but the
    last) in the choice, not in the bits returned (the code bits). Ties: fewer classes (fewer
    decoder levels), then narrower first classes. Raises ValueError when no layout of
    ``max_classes`` classes holds the ranks."""
    hist = np.asarray(hist, np.int64)
    k_max = int(max_classes)
    if not 1 <= k_max <= MAX_CLASSES:
        raise ValueError(f"max_classes {max_classes} not in 1..{MAX_CLASSES}")
    m = max(len(hist), 1)
    if m > (1 << cb.MAX_FIELD_BITS) * k_max:
        raise ValueError(f"{m} ranks do not fit {k_max} classes of <= {cb.MAX_FIELD_BITS} bits")
    cum = np.concatenate([[0], np.cumsum(hist)]) if hist.size else np.zeros(m + 1, np.int64)
    s = np.arange(m + 1)
    scale = MAX_CLASSES + 1  # cost key: bits * scale + classes (ties: fewer classes)
    g = np.full((k_max + 1, m + 1), INF, np.int64)
    arg = np.zeros((k_max, m + 1), np.int64)
    for c in range(k_max - 1, -1, -1):
        best = np.full(m + 1, INF, np.int64)
        choice = np.zeros(m + 1, np.int64)
        for o in range(cb.MAX_FIELD_BITS + 1):
            end = s + (1 << o)
            last = end >= m
            endc = np.minimum(end, m)
            count = cum[endc] - cum[s]
            nxt = g[c + 1][endc]
            cand = np.where(last, count * (c + o) * scale + 1,
                            np.where(nxt >= INF, INF, (count * (c + 1 + o) + int(level_bits)) * scale + 1 + nxt))
            better = cand < best  # strict: the narrower class on full ties
            best[better], choice[better] = cand[better], o
            if (1 << o) >= m:
                break
        best[m] = INF  # no class starts past the last rank
        g[c], arg[c] = best, choice
    if g[0][0] >= INF:
        raise ValueError("no layout")
    out, start, c = [], 0, 0
    while True:
        o = int(arg[c][start])
        out.append(o)
        start += 1 << o
        c += 1
        if start >= m:
            break
    layout = UnaryLayout(out)
    bits = unary_bits(hist, layout)
    assert int(g[0][0]) // scale == bits + int(level_bits) * (len(layout) - 1), (bits, layout)
    return bits, layout


def best_layout(hist: np.ndarray, level_bits: int = 0, fixed_bits: int = 0
                ) -> Tuple[int, str, Union[cb.Layout, UnaryLayout]]:
    """``(bits, kind, layout)``: the cheaper of :func:`plan_unary` (``"unary"``) and
    :func:`codebook.plan_layout` (``"fixed"``; ties: fixed), code bits plus ``level_bits`` per
    unary level against ``fixed_bits`` (what the fixed decoder costs beyond a 1-class unary one);
    ``bits``: the chosen code bits."""
    fb, fl = cb.plan_layout(hist)
    ub, ul = plan_unary(hist, level_bits=level_bits)
    return (ub, "unary", ul) if ub + level_bits * (len(ul) - 1) < fb + fixed_bits else (fb, "fixed", fl)


# --------------------------------------------------------------------------- numpy codec

def _classes(codes: np.ndarray, layout: UnaryLayout) -> Tuple[np.ndarray, np.ndarray]:
    c = np.asarray(codes, np.int64).ravel()
    if c.size and (int(c.max()) >= layout.capacity or int(c.min()) < 0):
        raise ValueError(f"a code does not fit the layout ({layout.capacity} values)")
    cls = np.searchsorted(layout.bases, c, side="right") - 1
    return cls, c - layout.bases[cls]


def encode_unary(codes: np.ndarray, layout: UnaryLayout) -> List[np.ndarray]:
    """``[S_0, ..., S_{K-2}, suffix]``: the decision streams (bits packed little-endian, plus one
    zero byte so that the decoder's position one past the last bit stays in range) and the
    suffix stream (:func:`codebook.pack_fields`)."""
    cls, off = _classes(codes, layout)
    streams = []
    for k in range(len(layout) - 1):
        reach = cls >= k
        bits = (cls[reach] == k).astype(np.uint8)
        streams.append(np.concatenate([np.packbits(bits, bitorder="little"), np.zeros(1, np.uint8)]))
    widths = np.asarray(layout, np.int64)[cls]
    streams.append(cb.pack_fields(off, widths))
    return streams


def decode_unary(streams: Sequence[np.ndarray], layout: UnaryLayout, n: int) -> np.ndarray:
    """Inverse of :func:`encode_unary` (int64 codes)."""
    k_levels = len(layout) - 1
    if len(streams) != k_levels + 1:
        raise ValueError(f"{len(streams)} streams for {len(layout)} classes")
    cls = np.full(n, k_levels, np.int64)
    idx = np.arange(n)
    for k in range(k_levels):
        bits = np.unpackbits(np.asarray(streams[k], np.uint8), bitorder="little")[: idx.size].astype(bool)
        if bits.size != idx.size:
            raise ValueError(f"stream {k} is too short")
        cls[idx[bits]] = k
        idx = idx[~bits]
    widths = np.asarray(layout, np.int64)[cls]
    off = cb.unpack(np.asarray(streams[-1], np.uint8), widths, n) if n else np.zeros(0, np.int64)
    return layout.bases[cls] + off


# --------------------------------------------------------------------------- ONNX decoder

def build_decoder(b: "cb._Builder", streams: Sequence[np.ndarray], layout: UnaryLayout, n: int) -> str:
    """Nodes (added to the builder) whose output is the int32 codes of ``n`` weights from their
    :func:`encode_unary` streams (as uint8 initializers). Standard ops of opset 11 on."""
    i32 = onnx.TensorProto.INT32
    k_levels = len(layout) - 1
    widths = np.asarray(layout, np.int64)
    table = lambda a: b.const(np.asarray(a, np.int32), np.int32)  # noqa: E731
    eight, two, zero = b.const(8, np.int32), b.const(2, np.int32), b.const(0, np.int32)
    pow2 = b.const(1 << np.arange(8), np.int32)
    cls = None
    if k_levels:
        reach = None  # reach_0: every weight; S_0's positions are 0 .. n-1
        for k in range(k_levels):
            s = b.op("Cast", [b.init(streams[k])], to=i32)
            if reach is None:
                pos = b.op("Range", [zero, b.const(n, np.int32), b.const(1, np.int32)])
            else:
                pos = b.op("CumSum", [reach, zero], exclusive=1)
            byte = b.op("Gather", [s, b.op("Div", [pos, eight])], axis=0)
            shift = b.op("Gather", [pow2, b.op("Mod", [pos, eight])], axis=0)
            bit = b.op("Mod", [b.op("Div", [byte, shift]), two])
            # reach_{k+1} = reach_k AND NOT bit
            reach = b.op("Sub", [b.const(1, np.int32), bit]) if reach is None else \
                b.op("Sub", [reach, b.op("Mul", [reach, bit])])
            cls = reach if cls is None else b.op("Add", [cls, reach])
    if not widths.any():  # no suffix: the class is the code (classes of one rank)
        return cls if cls is not None else b.op("Mul", [b.op("Range", [zero, b.const(n, np.int32),
                                                                         b.const(1, np.int32)]), zero])
    if cls is None:  # one class: a plain fixed-width suffix
        starts = b.op("Range", [zero, b.const(n * int(widths[0]), np.int32), b.const(int(widths[0]), np.int32)])
        suffix, _ = cb._suffix_fields(b, streams[-1], starts, b.const(1 << int(widths[0]), np.int32))
        return suffix
    starts = b.op("CumSum", [b.op("Gather", [table(widths), cls], axis=0), zero], exclusive=1)
    suffix, _ = cb._suffix_fields(b, streams[-1], starts, b.op("Gather", [table(1 << widths), cls], axis=0))
    return b.op("Add", [suffix, b.op("Gather", [table(layout.bases), cls], axis=0)])


def reach_counts(codes: np.ndarray, layout: UnaryLayout) -> List[int]:
    """``n_k``: the weights that reach level ``k`` (bits of ``S_k``), ``k = 0 .. K-1``."""
    cls, _ = _classes(codes, layout)
    return [int((cls >= k).sum()) for k in range(len(layout))]


def build_decoder_compact(b: "cb._Builder", streams: Sequence[np.ndarray], layout: UnaryLayout, n: int,
                          counts: Sequence[int]) -> str:
    """As :func:`build_decoder`, but each level works on the weights that reach it only: level
    ``k`` holds the indices of its ``n_k`` weights (``counts``, known when writing: the sizes are
    constants, so every node folds; ``Compress`` / ``NonZero`` would not fold in onnxruntime).
    Its bits split them, by one ``TopK`` on ``(1 - bit)·n_k + (n_k - j)`` (the ``n_{k+1}`` that go
    on first, in order, then the stopped ones), into the next level's indices and the stopped
    ones; one ``ScatterElements`` puts the classes back in weight order. Folding keeps about
    ``Σ n_k`` entries per tensor (the decision bits) instead of ``(K - 1)·n``."""
    i32 = onnx.TensorProto.INT32
    k_levels = len(layout) - 1
    if not k_levels:
        return build_decoder(b, streams, layout, n)
    widths = np.asarray(layout, np.int64)
    table = lambda a: b.const(np.asarray(a, np.int32), np.int32)  # noqa: E731
    eight, two, zero, one = (b.const(v, np.int32) for v in (8, 2, 0, 1))
    pow2 = b.const(1 << np.arange(8), np.int32)
    idx = b.op("Range", [zero, b.const(n, np.int32), one])
    positions, values = [], []

    def stopped(ix, k, size):
        positions.append(ix)
        values.append(b.op("Expand", [b.const(k, np.int32), b.const([size], np.int64)]))

    for k in range(k_levels):
        nk, nxt = int(counts[k]), int(counts[k + 1])
        if nk == 0:
            break
        if nxt == nk:  # nobody stops here
            continue
        if nxt == 0:  # everybody stops here
            stopped(idx, k, nk)
            idx = None
            break
        s = b.op("Cast", [b.init(streams[k])], to=i32)
        j = b.op("Range", [zero, b.const(nk, np.int32), one])
        byte = b.op("Gather", [s, b.op("Div", [j, eight])], axis=0)
        bit = b.op("Mod", [b.op("Div", [byte, b.op("Gather", [pow2, b.op("Mod", [j, eight])], axis=0)]), two])
        key = b.op("Sub", [b.op("Mul", [b.op("Sub", [one, bit]), b.const(nk, np.int32)]), j])
        order = b.name()
        b.op("TopK", [key, b.const([nk], np.int64)], [b.name(), order], axis=0)  # int64 indices
        go, stop = b.name(), b.name()
        b.split(order, [nxt, nk - nxt], [go, stop])
        stopped(b.op("Gather", [idx, stop], axis=0), k, nk - nxt)
        idx = b.op("Gather", [idx, go], axis=0)
    if idx is not None:
        stopped(idx, k_levels, int(counts[k_levels]))
    pos = positions[0] if len(positions) == 1 else b.op("Concat", positions, axis=0)
    val = values[0] if len(values) == 1 else b.op("Concat", values, axis=0)
    cls = b.op("ScatterElements", [b.op("Expand", [zero, b.const([n], np.int64)]), pos, val], axis=0)
    if not widths.any():
        return cls
    starts = b.op("CumSum", [b.op("Gather", [table(widths), cls], axis=0), zero], exclusive=1)
    suffix, _ = cb._suffix_fields(b, streams[-1], starts, b.op("Gather", [table(1 << widths), cls], axis=0))
    return b.op("Add", [suffix, b.op("Gather", [table(layout.bases), cls], axis=0)])


def decoder_model(codes: np.ndarray, layout, opset: int, output: str = "codes", compact: bool = False
                  ) -> onnx.ModelProto:
    """A model with no inputs whose output ``output`` (int64) is ``codes`` decoded by standard
    ops: the unary decoder for a :class:`UnaryLayout`, the existing ``codebook`` one for a
    :class:`codebook.Layout` (for comparisons); ``compact``: :func:`build_decoder_compact`."""
    codes = np.asarray(codes, np.int64).ravel()
    graph = helper.make_graph([], "decoder", [], [])
    b = cb._Builder(graph, opset)
    if isinstance(layout, UnaryLayout):
        streams = encode_unary(codes, layout)
        x = build_decoder_compact(b, streams, layout, codes.size, reach_counts(codes, layout)) if compact \
            else build_decoder(b, streams, layout, codes.size)
    else:
        pad = -codes.size % 8
        cls, off = cb.encode(np.concatenate([codes, np.zeros(pad, np.int64)]), layout)
        x = cb._decode_bank(b, cls, off, layout)
        if pad:
            x = b.op("Slice", [x, b.const([0], np.int64), b.const([codes.size], np.int64)])
    b.op("Cast", [x], [output], to=onnx.TensorProto.INT64)
    graph = helper.make_graph(b.nodes, "decoder", [],
                              [helper.make_tensor_value_info(output, onnx.TensorProto.INT64, [codes.size])],
                              b.inits)
    opsets = [helper.make_opsetid("", opset)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=helper.find_min_ir_version_for(opsets))


def node_bytes(model: onnx.ModelProto, stream_names: Sequence[str] = ()) -> Tuple[int, int]:
    """``(nodes, bytes)``: the decoder's node count and the serialized bytes of its nodes plus
    its small constant initializers (those of at most 64 elements: tables, not streams)."""
    g = model.graph
    nb = sum(len(n.SerializeToString()) for n in g.node)
    small = sum(len(t.SerializeToString()) for t in g.initializer
                if t.name not in stream_names and int(np.prod(t.dims)) <= 64)
    return len(g.node), nb + small
