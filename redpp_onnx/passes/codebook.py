"""Compact storage of a hashed tensor: a float codebook plus bit-packed codes, standard ONNX ops.

A tensor with ``M`` distinct values is stored as ``codebook[M]`` (float32) and its codes packed
at ``b = max(1, ceil(log2 M))`` bits each into a uint8 stream (little-endian bit order: code
``i`` occupies stream bits ``i*b .. i*b+b-1``). The graph rebuilds the tensor with standard ops
only (Range, Div, Mod, Gather, Mul, Add, Cast, Reshape; opset >= 11), all on constants, so
onnxruntime folds them into the plain tensor when the session starts:

    pos   = Range(0, N*b, b)                  # first stream bit of each code
    byte  = pos / 8;  shift = pos % 8
    word  = s[byte] + 256*s[byte+1] + 65536*s[byte+2]   # 24 bits cover b <= 16 from any shift
    code  = (word / 2^shift) % 2^b
    W     = Reshape(Gather(codebook, code), shape)

With ``b == 8`` the codes are stored as plain uint8 and only Cast + Gather remain.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import helper, numpy_helper

MAX_BITS = 16
MIN_OPSET = 11


def bits_for(n_values: int) -> int:
    return max(1, math.ceil(math.log2(max(n_values, 2))))


def pack(codes: np.ndarray, bits: int) -> np.ndarray:
    """The codes' low ``bits`` bits, concatenated, as bytes (plus 2 zero bytes of padding)."""
    c = np.asarray(codes, dtype=np.uint32).reshape(-1)
    if c.size and int(c.max()) >= (1 << bits):
        raise ValueError(f"a code does not fit in {bits} bits")
    stream = ((c[:, None] >> np.arange(bits, dtype=np.uint32)) & 1).astype(np.uint8).reshape(-1)
    return np.concatenate([np.packbits(stream, bitorder="little"), np.zeros(2, np.uint8)])


def unpack(packed: np.ndarray, bits: int, count: int) -> np.ndarray:
    """numpy mirror of the ONNX decoding (for tests)."""
    pos = np.arange(count, dtype=np.int64) * bits
    s = packed.astype(np.int64)
    word = s[pos // 8] + 256 * s[pos // 8 + 1] + 65536 * s[pos // 8 + 2]
    return (word >> (pos % 8)) % (1 << bits)


def opset_version(model: onnx.ModelProto) -> int:
    for o in model.opset_import:
        if o.domain in ("", "ai.onnx"):
            return o.version
    return 0


_SHARED = {"zero": np.array(0, np.int32), "one": np.array(1, np.int32), "two": np.array(2, np.int32),
           "eight": np.array(8, np.int32), "k256": np.array(256, np.int32),
           "k65536": np.array(65536, np.int32), "pow2": (1 << np.arange(8)).astype(np.int32)}


class CodebookWriter:
    """Adds codebook decoders to one graph; the constants all decoders use are added once, and
    tensor names are short (``rcb<k>_...``), so that a decoder costs little beyond its codes."""

    def __init__(self, graph: onnx.GraphProto):
        self.graph = graph
        taken = {t.name for t in graph.initializer} | {o for n in graph.node for o in n.output}
        self._prefix = "rcb"
        while any(name.startswith(self._prefix) for name in taken):
            self._prefix += "_"
        self._count = 0
        self._shared_added = False

    def _shared(self, key: str) -> str:
        if not self._shared_added:
            self.graph.initializer.extend(numpy_helper.from_array(v, f"{self._prefix}_{k}")
                                          for k, v in _SHARED.items())
            self._shared_added = True
        return f"{self._prefix}_{key}"

    def add(self, name: str, codebook: np.ndarray, codes: np.ndarray) -> int:
        """Nodes whose output ``name`` is ``codebook[codes]``; returns bits per code. They go first
        in the node list (their inputs are constants: the order stays topological)."""
        p = f"{self._prefix}{self._count}"
        self._count += 1
        bits = bits_for(codebook.size)
        inits = [numpy_helper.from_array(codebook.astype(np.float32), f"{p}_v")]
        if bits <= 8 and (bits == 8 or codes.size < 64):  # byte codes: nothing to unpack
            inits.append(numpy_helper.from_array(np.ascontiguousarray(codes.astype(np.uint8)), f"{p}_c"))
            nodes = [helper.make_node("Cast", [f"{p}_c"], [f"{p}_i"], to=onnx.TensorProto.INT32),
                     helper.make_node("Gather", [f"{p}_v", f"{p}_i"], [name], axis=0)]
            bits = 8
        else:
            sh = self._shared
            inits += [numpy_helper.from_array(pack(codes, bits), f"{p}_s"),
                      numpy_helper.from_array(np.array(codes.size * bits, np.int32), f"{p}_n"),
                      numpy_helper.from_array(np.array(bits, np.int32), f"{p}_b"),
                      numpy_helper.from_array(np.array(1 << bits, np.int32), f"{p}_m"),
                      numpy_helper.from_array(np.asarray(codes.shape, np.int64), f"{p}_shape")]
            t = lambda k: f"{p}{k}"  # noqa: E731  (intermediate tensors)
            nodes = [
                helper.make_node("Cast", [f"{p}_s"], [t("s")], to=onnx.TensorProto.INT32),
                helper.make_node("Range", [sh("zero"), f"{p}_n", f"{p}_b"], [t("p")]),
                helper.make_node("Div", [t("p"), sh("eight")], [t("y0")]),
                helper.make_node("Mod", [t("p"), sh("eight")], [t("r")]),
                helper.make_node("Add", [t("y0"), sh("one")], [t("y1")]),
                helper.make_node("Add", [t("y0"), sh("two")], [t("y2")]),
                helper.make_node("Gather", [t("s"), t("y0")], [t("g0")], axis=0),
                helper.make_node("Gather", [t("s"), t("y1")], [t("g1")], axis=0),
                helper.make_node("Gather", [t("s"), t("y2")], [t("g2")], axis=0),
                helper.make_node("Mul", [t("g1"), sh("k256")], [t("h1")]),
                helper.make_node("Mul", [t("g2"), sh("k65536")], [t("h2")]),
                helper.make_node("Add", [t("g0"), t("h1")], [t("w1")]),
                helper.make_node("Add", [t("w1"), t("h2")], [t("w")]),
                helper.make_node("Gather", [sh("pow2"), t("r")], [t("d")], axis=0),
                helper.make_node("Div", [t("w"), t("d")], [t("q")]),
                helper.make_node("Mod", [t("q"), f"{p}_m"], [t("c")]),
                helper.make_node("Gather", [f"{p}_v", t("c")], [t("f")], axis=0),
                helper.make_node("Reshape", [t("f"), f"{p}_shape"], [name]),
            ]
        self.graph.initializer.extend(inits)
        for node in reversed(nodes):
            self.graph.node.insert(0, node)
        return bits
