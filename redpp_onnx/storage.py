"""Loading ``--codebook`` models: the weights decoded by redpp-onnx instead of onnxruntime's folding.

A ``--codebook`` model (``redpp_onnx/passes/codebook.py``) is ONE file for two runtimes:

* **standard-ops form**: its hashed weights are rebuilt by standard ONNX ops (decoders) whose
  inputs are all constants; any onnxruntime folds them when a session starts. Folding keeps every
  intermediate tensor until it ends: loading costs 78-107 bytes of peak memory per stored
  weight and seconds on large models (docs/HASHING.md, "Storage").
* **metadata** ``model.metadata_props["redpp.codebook"]``: a JSON map from each stored weight to
  its bank slice, codebook, groups, shape and a checksum of its values. :func:`decode` reads it,
  checks it against the graph, decodes the codes in C++ (``redpp_onnx._core.decode_bank``, the
  same two-part prefix code bit for bit), and returns the graph without its decoders plus the
  weights as numpy arrays; :func:`redpp_onnx.session` hands them to onnxruntime
  (``SessionOptions.add_external_initializers``: onnxruntime copies them once, before its graph
  optimizations) and frees its own copy.

Nothing here ever gives a model another function than its standard-ops form. The fast path is
taken only when the map is well formed, the digest of the map and of the decoder subgraph is
the one written (node types, wiring, attributes and small constants: a map or a graph edited
after writing does not match), every name the map uses is a constant of the decoder, the shapes
are the decoder's, the C++ decoder finds every code within its tables, and every decoded tensor
has the checksum the writer computed from the hashed values. Anything else raises
:class:`StorageError`, and :func:`redpp_onnx.session` loads the standard-ops form instead, with
a warning.

The map (version 1)::

    {"version": 1,
     "banks": [{"main": INIT, "width": 1|2|4|8|16, "classes": [o_c, ...], "suffix": INIT|null,
                "count": N}],      # N codes, a multiple of 8 (padding at the end); classes [] and
                                   # no suffix: fixed-length codes
     "tensors": {NAME: {"bank": i, "start": s, "count": n, "shape": [...], "dtype": "float32",
                        "book": {"init": INIT, "offset": a, "size": m, "unit": HEX|null},
                        "groups": null | {"axis": a, "outer": o, "channels": c, "inner": k,
                                          "size": g, "counts": INIT, "units": INIT|null,
                                          "map": INIT|null},
                        "checksum": HEX32}},
     "digest": SHA256}

``INIT``: the name of an initializer of the decoder. ``book``: ``m`` values from element ``a``
of ``INIT`` (float32, or int16 lattice integers times ``unit``, a float32 number written with
``float.hex``, or times ``groups.units`` per group). ``groups``: one codebook per group of
channels of the ``o × c × k`` view of the tensor, ``counts[j]`` values each: with ``map`` null
(or absent, as in files written before maps existed) groups of ``g`` consecutive channels
(channel ``i`` in group ``i // g``); else channel ``i`` in group ``map[i]`` (``c`` uint8, uint16
or int32 entries below ``len(counts)``, e.g. channels sorted by RMS and cut into groups; ``g``
is then the largest group's channel count, not used to decode).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from typing import Dict, List, Optional, Tuple, Union

import numpy as np
import onnx
from onnx import numpy_helper

from .passes.codebook import METADATA_KEY, METADATA_VERSION, decoder_digest

__all__ = ["METADATA_KEY", "StorageError", "StaleMap", "Decoded", "peek_metadata", "metadata", "decode",
           "materialize", "describe", "load_model", "PLACEHOLDER_LOCATION"]

COMPACT_KEY = "redpp.compact"  # redpp_onnx/compact.py
PLACEHOLDER_LOCATION = "redpp-decoded-weights"
"""External-data location of the decoded weights' placeholders in the graph :func:`decode`
returns: onnxruntime gets their values from ``add_external_initializers`` and never reads it."""

ModelSource = Union[str, os.PathLike, bytes, onnx.ModelProto]


class StorageError(ValueError):
    """The codebook map does not describe this model: load the standard-ops form instead."""


class StaleMap(StorageError):
    """Every weight of the map is a plain initializer of the graph: a tool folded the decoders
    and kept the map. Nothing to decode; the model loads as it is, without a warning."""


@dataclasses.dataclass
class Decoded:
    """A ``--codebook`` model decoded by :func:`decode`."""

    model: onnx.ModelProto            # the graph without decoders; the weights are placeholders
    weights: Dict[str, np.ndarray]    # name -> float32 array, in the graph's shape
    seconds: float                    # checking and decoding (not reading the file, not onnxruntime)
    decoder_seconds: float = 0.0      # of which in the C++ decoder (writing the weights included)

    @property
    def stored_weights(self) -> int:
        return sum(int(a.size) for a in self.weights.values())


# --------------------------------------------------------------------------- finding the map

def metadata(model: onnx.ModelProto) -> Optional[str]:
    """The codebook map of ``model`` (its JSON text), or None."""
    for p in model.metadata_props:
        if p.key == METADATA_KEY:
            return p.value
    return None


def _compact_text(model: onnx.ModelProto) -> Optional[str]:
    for p in model.metadata_props:
        if p.key == COMPACT_KEY:
            return p.value
    return None


def peek_form(source: ModelSource) -> Tuple[Optional[str], Optional[str]]:
    """``(form, text)`` of a model given as a path, bytes or ``ModelProto``, without parsing its
    graph: ``("compact", its metadata)``, ``("map", the codebook map)`` or ``(None, None)``."""
    found = _peek_keys(source)
    if found.get(COMPACT_KEY) is not None:
        return "compact", found[COMPACT_KEY]
    if found.get(METADATA_KEY) is not None:
        return "map", found[METADATA_KEY]
    return None, None


def peek_metadata(source: ModelSource) -> Optional[str]:
    """The codebook map of a model given as a path, bytes or ``ModelProto``, without parsing its
    graph: the top-level fields of the file are walked and the graph is skipped over (a
    ``ModelProto`` field 14 is ``metadata_props``). None when absent or the file is not a
    well-formed protobuf (onnxruntime then says what is wrong with it)."""
    return _peek_keys(source).get(METADATA_KEY)


def _peek_keys(source: ModelSource) -> Dict[str, str]:
    if isinstance(source, onnx.ModelProto):
        return {p.key: p.value for p in source.metadata_props if p.key in (METADATA_KEY, COMPACT_KEY)}
    try:
        if isinstance(source, (bytes, bytearray, memoryview)):
            return _peek(memoryview(source).cast("B"))
        with open(os.fspath(source), "rb") as f:
            return _peek(_FileView(f))
    except (OSError, ValueError, IndexError):
        return {}


class _FileView:
    """Byte access to an open file, reading only what is asked (the graph is sought over)."""

    def __init__(self, f):
        self.f = f
        f.seek(0, os.SEEK_END)
        self.size = f.tell()

    def __len__(self):
        return self.size

    def read(self, pos: int, n: int) -> bytes:
        self.f.seek(pos)
        data = self.f.read(n)
        if len(data) != n:
            raise ValueError("truncated")
        return data


def _peek(buf) -> Dict[str, str]:
    read = buf.read if isinstance(buf, _FileView) else (lambda pos, n: bytes(buf[pos:pos + n]))
    size = len(buf)
    pos, found = 0, {}

    def varint(p):
        value, shift = 0, 0
        while True:
            byte = read(p, 1)[0]
            value |= (byte & 0x7F) << shift
            p += 1
            if byte < 0x80:
                return value, p
            shift += 7
            if shift > 63:
                raise ValueError("bad varint")

    while pos < size:
        key, pos = varint(pos)
        field, wire = key >> 3, key & 7
        if wire == 0:
            _, pos = varint(pos)
        elif wire == 1:
            pos += 8
        elif wire == 5:
            pos += 4
        elif wire == 2:
            length, pos = varint(pos)
            if pos + length > size:
                raise ValueError("truncated")
            if field == 14:  # metadata_props
                entry = onnx.StringStringEntryProto.FromString(read(pos, length))
                if entry.key in (METADATA_KEY, COMPACT_KEY):
                    found[entry.key] = entry.value  # the last one wins, as in protobuf parsing
            pos += length
        else:
            raise ValueError("groups are not used by ONNX")
    if pos != size:
        raise ValueError("truncated")
    return found


def load_model(source: ModelSource) -> onnx.ModelProto:
    """``source`` as a ``ModelProto`` (a path's external data loaded too; a ``ModelProto`` as is)."""
    if isinstance(source, onnx.ModelProto):
        return source
    if isinstance(source, (bytes, bytearray, memoryview)):
        return onnx.ModelProto.FromString(bytes(source))
    return onnx.load(os.fspath(source))


# --------------------------------------------------------------------------- the map against the graph

_STREAM_TYPES = {1: onnx.TensorProto.UINT8, 2: onnx.TensorProto.UINT8, 4: onnx.TensorProto.UINT8,
                 8: onnx.TensorProto.UINT8, 16: onnx.TensorProto.UINT16}
_COUNT_TYPES = (onnx.TensorProto.UINT8, onnx.TensorProto.UINT16, onnx.TensorProto.INT32)
_MAP_TYPES = _COUNT_TYPES


def _parse(text: str) -> dict:
    try:
        meta = json.loads(text)
    except (TypeError, ValueError) as err:
        raise StorageError(f"the map is not JSON ({err})") from None
    if not isinstance(meta, dict) or meta.get("version") != METADATA_VERSION:
        version = meta.get("version") if isinstance(meta, dict) else None
        raise StorageError(f"map version {version!r}, this redpp-onnx reads version {METADATA_VERSION}")
    if not isinstance(meta.get("banks"), list) or not isinstance(meta.get("tensors"), dict) or not meta["tensors"] \
            or not isinstance(meta.get("digest"), str):
        raise StorageError("the map lacks banks, tensors or digest")
    return meta


def _integer(entry: dict, key: str, low: int = 0) -> int:
    v = entry.get(key)
    if not isinstance(v, int) or isinstance(v, bool) or v < low:
        raise StorageError(f"{key!r} is {v!r}, not an integer >= {low}")
    return v


def _decoder_nodes(graph: onnx.GraphProto, names: List[str]) -> Tuple[List[int], set]:
    """``(nodes, constants)``: the indices of the nodes that compute ``names`` from constants
    (the decoder) and the initializers they read. Raises StorageError when a weight is not
    computed, or computed from a graph input, or when a decoder's intermediate tensor is used by
    another node, a subgraph or a graph output."""
    inits = {t.name for t in graph.initializer}
    producer = {}
    for k, node in enumerate(graph.node):
        for o in node.output:
            producer[o] = k
    nodes, constants, todo = set(), set(), list(names)
    for name in names:
        if name not in producer:
            raise StorageError(f"{name!r} is not computed by the graph")
    while todo:
        name = todo.pop()
        if name in producer:
            k = producer[name]
            if k not in nodes:
                nodes.add(k)
                node = graph.node[k]
                subgraphs = (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
                if node.domain not in ("", "ai.onnx") or any(a.type in subgraphs for a in node.attribute):
                    raise StorageError(f"the decoder of {names[0]!r}... has a {node.op_type} node of another kind")
                todo.extend(i for i in node.input if i)
        elif name in inits:
            constants.add(name)
        else:
            raise StorageError(f"the decoder reads {name!r}, which is not a constant")
    internal = {o for k in nodes for o in graph.node[k].output} - set(names)
    used = {i for k, n in enumerate(graph.node) if k not in nodes for i in n.input}
    used |= {o.name for o in graph.output} | _subgraph_names(graph)
    if internal & used or constants & used:
        shared = sorted((internal | constants) & used)[0]
        raise StorageError(f"a tensor of the decoder is also used elsewhere ({shared!r})")
    return sorted(nodes), constants


def _subgraph_names(graph: onnx.GraphProto) -> set:
    """Every name the subgraphs of ``graph``'s nodes read (outer-scope references included)."""
    out = set()
    for node in graph.node:
        for a in node.attribute:
            subs = [a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)
            for g in subs:
                out |= {i for n in g.node for i in n.input} | {o.name for o in g.output} | _subgraph_names(g)
    return out


def _array(t: onnx.TensorProto) -> np.ndarray:
    """An initializer's values, flat (no copy beyond protobuf's own for raw data)."""
    if t.data_location == onnx.TensorProto.EXTERNAL:
        raise StorageError(f"{t.name!r} is in an external file that was not loaded")
    dtype = onnx.helper.tensor_dtype_to_np_dtype(t.data_type)
    if t.HasField("raw_data"):
        a = np.frombuffer(t.raw_data, dtype=np.dtype(dtype).newbyteorder("<"))
        return a if a.dtype.isnative else a.astype(dtype)
    return numpy_helper.to_array(t).reshape(-1)


def _init(inits: Dict[str, onnx.TensorProto], constants: set, name, types, what: str) -> onnx.TensorProto:
    if not isinstance(name, str) or name not in constants:
        raise StorageError(f"{what} {name!r} is not a constant of the decoder")
    t = inits[name]
    if t.data_type not in types:
        raise StorageError(f"{what} {name!r} has data type {t.data_type}, expected one of {types}")
    return t


# --------------------------------------------------------------------------- decoding

def decode(model: onnx.ModelProto, text: Optional[str] = None) -> Decoded:
    """Check the codebook map of ``model`` (``text``: its JSON, read from the model when None)
    against the graph, decode every stored weight and build the graph without decoders. Raises
    :class:`StorageError` (the reason) when anything does not match. ``model`` is not changed."""
    from . import _core

    if text is None and _compact_text(model) is not None:
        from . import compact

        return compact.decode(model)
    t0 = time.perf_counter()
    if text is None:
        text = metadata(model)
        if text is None:
            raise StorageError(f"the model has no {METADATA_KEY!r} metadata")
    meta = _parse(text)
    graph = model.graph
    names = list(meta["tensors"])
    if {t.name for t in graph.initializer} >= set(names):
        raise StaleMap("the map's weights are plain initializers (its decoders were folded)")
    nodes, constants = _decoder_nodes(graph, names)
    inits = {t.name: t for t in graph.initializer}
    digest = decoder_digest([graph.node[k] for k in nodes], inits, meta)
    if digest != meta["digest"]:
        raise StorageError("the map or the decoder subgraph is not as written (digest differs)")
    producer = {o: n for k in nodes for n in [graph.node[k]] for o in n.output}

    banks = []
    for i, bank in enumerate(meta["banks"]):
        if not isinstance(bank, dict):
            raise StorageError(f"bank {i} is not an object")
        width = bank.get("width")
        if width not in _STREAM_TYPES:
            raise StorageError(f"bank {i}: class fields of {width!r} bits")
        classes = bank.get("classes")
        if not isinstance(classes, list) or not all(isinstance(o, int) and not isinstance(o, bool) for o in classes):
            raise StorageError(f"bank {i}: classes {classes!r}")
        main = _array(_init(inits, constants, bank.get("main"), (_STREAM_TYPES[width],), f"bank {i}'s main stream"))
        suffix = None
        if bank.get("suffix") is not None:
            suffix = _array(_init(inits, constants, bank["suffix"], (onnx.TensorProto.UINT8,), f"bank {i}'s suffix"))
        count = _integer(bank, "count")
        capacity = main.size * (8 // width if width < 8 else 1)
        if count > capacity:
            raise StorageError(f"bank {i}: {count} codes, its class stream holds {capacity}")
        banks.append((main, width, classes, suffix, count, []))

    weights: Dict[str, np.ndarray] = {}
    expected: Dict[str, int] = {}
    for name, entry in meta["tensors"].items():
        if not isinstance(entry, dict):
            raise StorageError(f"{name!r}: not an object")
        try:
            weights[name], job, bank, _ = _job(name, entry, inits, constants, [b[4] for b in banks])
            _check_shape(name, producer[name], weights[name].shape, inits, constants)
            expected[name] = int(str(entry.get("checksum")), 16)
        except (TypeError, ValueError, KeyError, OverflowError) as err:
            if isinstance(err, StorageError):
                raise
            raise StorageError(f"{name!r}: malformed entry ({err})") from None
        banks[bank][5].append((name, job))
    in_decoder = 0.0
    for main, width, classes, suffix, count, jobs in banks:
        jobs.sort(key=lambda j: j[1][0])
        t1 = time.perf_counter()
        try:
            sums = _core.decode_bank(main, width, classes, suffix, count, [j for _, j in jobs])
        except ValueError as err:
            raise StorageError(str(err)) from None
        in_decoder += time.perf_counter() - t1
        for (name, _), value in zip(jobs, sums):
            if value != expected[name]:
                raise StorageError(f"{name!r}: the decoded values do not have the checksum the map was written with")
    small = _without_decoders(model, nodes, constants, weights)
    return Decoded(small, weights, time.perf_counter() - t0, in_decoder)


def _check_shape(name: str, node: onnx.NodeProto, shape: tuple, inits, constants) -> None:
    """The map's shape is the one the decoder gives the weight: its last node is a Reshape to
    that constant shape, or a Gather (1-D weights)."""
    if node.op_type == "Reshape" and len(node.input) == 2 and node.input[1] in constants:
        target = _array(inits[node.input[1]])
        if target.size == len(shape) and np.all(target == np.asarray(shape)) and np.all(target >= 0):
            return
    elif node.op_type == "Gather" and len(shape) == 1:
        return
    raise StorageError(f"{name!r}: the decoder does not give it the shape {list(shape)} of the map")


def _job(name: str, entry: dict, inits, constants, bank_counts: List[int]):
    """``(out array, decode_bank job, bank index, (group of every channel, values in every
    channel's codebook))`` of one tensor's entry (``bank_counts``: the codes in each bank)."""
    bank = _integer(entry, "bank")
    if bank >= len(bank_counts):
        raise StorageError(f"{name!r}: bank {bank} of {len(bank_counts)}")
    start, count = _integer(entry, "start"), _integer(entry, "count")
    if start + count > bank_counts[bank]:
        raise StorageError(f"{name!r}: codes {start}:{start + count} of a bank of {bank_counts[bank]}")
    shape = entry.get("shape")
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise StorageError(f"{name!r}: shape {shape!r}")
    if math.prod(shape) != count or entry.get("dtype") != "float32":
        raise StorageError(f"{name!r}: {count} weights for shape {shape} ({entry.get('dtype')!r})")
    book = entry.get("book")
    if not isinstance(book, dict):
        raise StorageError(f"{name!r}: no book")
    b = _init(inits, constants, book.get("init"), (onnx.TensorProto.INT16, onnx.TensorProto.FLOAT), f"{name!r}'s book")
    offset, size = _integer(book, "offset"), _integer(book, "size", 1)
    values = _array(b)
    if offset + size > values.size:
        raise StorageError(f"{name!r}: book slice {offset}:{offset + size} of {values.size} values")
    table = values[offset:offset + size]
    groups = entry.get("groups")
    unit = book.get("unit")
    channel_unit = None
    if b.data_type == onnx.TensorProto.INT16:
        if unit is not None:
            u = np.float32(float.fromhex(unit))
            if float(u) != float.fromhex(unit):
                raise StorageError(f"{name!r}: unit {unit} is not a float32 number")
            table = table.astype(np.float32) * u  # what the decoder's Mul computes
        elif not isinstance(groups, dict) or groups.get("units") is None:
            raise StorageError(f"{name!r}: int16 book without a unit")
        else:
            table = table.astype(np.float32)
    elif unit is not None:
        raise StorageError(f"{name!r}: float32 book with a unit")
    table = np.ascontiguousarray(table, np.float32)
    if groups is None:
        outer, channels, inner = 1, 1, count
        channel_base = np.zeros(1, np.int32)
        group_of, counts = np.zeros(1, np.int64), np.asarray([size], np.int64)
    elif isinstance(groups, dict):
        outer, channels, inner = (_integer(groups, k) for k in ("outer", "channels", "inner"))
        gsize = _integer(groups, "size", 1)
        axis = groups.get("axis")
        if outer * channels * inner != count or not isinstance(axis, int) or not 0 <= axis < len(shape) \
                or shape[axis] != channels or math.prod(shape[:axis]) != outer:
            raise StorageError(f"{name!r}: groups {groups} do not fit shape {shape}")
        counts = _array(_init(inits, constants, groups.get("counts"), _COUNT_TYPES, f"{name!r}'s group counts"))
        if groups.get("map") is None:  # groups of gsize consecutive channels
            n_groups = -(-channels // gsize)
            group_of = np.arange(channels) // gsize
        else:
            group_of = _array(_init(inits, constants, groups["map"], _MAP_TYPES, f"{name!r}'s channel map"))
            n_groups = counts.size
            if group_of.size != channels:
                raise StorageError(f"{name!r}: a channel map of {group_of.size} entries for {channels} channels")
            group_of = group_of.astype(np.int64)
            if channels and (int(group_of.min()) < 0 or int(group_of.max()) >= n_groups):
                raise StorageError(f"{name!r}: the channel map has group ids outside 0..{n_groups - 1}")
        if counts.size != n_groups or int(counts.astype(np.int64).sum()) != size:
            raise StorageError(f"{name!r}: {counts.size} group counts summing to {int(counts.sum())} for "
                               f"{n_groups} groups and {size} values")
        starts = np.concatenate([[0], np.cumsum(counts.astype(np.int64))[:-1]])
        channel_base = starts[group_of].astype(np.int32)
        if groups.get("units") is not None:
            if b.data_type != onnx.TensorProto.INT16 or unit is not None:
                raise StorageError(f"{name!r}: group units need an int16 book without a unit")
            units = _array(_init(inits, constants, groups["units"], (onnx.TensorProto.FLOAT,), f"{name!r}'s units"))
            if units.size != n_groups:
                raise StorageError(f"{name!r}: {units.size} units for {n_groups} groups")
            channel_unit = np.ascontiguousarray(units[group_of], np.float32)
    else:
        raise StorageError(f"{name!r}: groups {groups!r}")
    out = np.empty(shape, np.float32)
    channel_count = counts.astype(np.int64)[group_of]
    return out, (start, out.reshape(-1), table, outer, channels, inner, channel_base, channel_unit), bank, \
        (group_of, channel_count)


def _without_decoders(model: onnx.ModelProto, nodes: List[int], constants: set,
                      weights: Dict[str, np.ndarray]) -> onnx.ModelProto:
    """A new model: ``model`` without the decoder nodes, their constants and the codebook map;
    each decoded weight an initializer whose data is external at ``PLACEHOLDER_LOCATION``
    (nothing of ``model`` is copied but its other nodes and small initializers)."""
    out = onnx.ModelProto()
    _copy_fields(model, out, skip=("graph",),
                 keep={"metadata_props": lambda p: p.key not in (METADATA_KEY, COMPACT_KEY)})
    graph, g = model.graph, out.graph
    gone = set(nodes)
    internal = {o for k in nodes for o in graph.node[k].output} - set(weights)
    _copy_fields(graph, g, skip=("node", "initializer"), keep={"value_info": lambda v: v.name not in internal})
    g.node.extend(n for k, n in enumerate(graph.node) if k not in gone)
    g.initializer.extend(t for t in graph.initializer if t.name not in constants)
    for name, array in weights.items():
        t = g.initializer.add()
        t.name = name
        t.data_type = onnx.TensorProto.FLOAT
        t.dims.extend(array.shape)
        t.data_location = onnx.TensorProto.EXTERNAL
        t.external_data.add(key="location", value=PLACEHOLDER_LOCATION)
        t.external_data.add(key="length", value=str(array.nbytes))
    return out


def _copy_fields(src, dst, *, skip=(), keep=None) -> None:
    """Copy every set field of the message ``src`` into ``dst`` but those in ``skip``; a repeated
    field named in ``keep`` only copies the items its predicate accepts."""
    keep = keep or {}
    for fd, value in src.ListFields():
        if fd.name in skip:
            continue
        if _repeated(fd):
            getattr(dst, fd.name).extend(v for v in value if keep.get(fd.name, lambda _: True)(v))
        elif fd.message_type is not None:
            getattr(dst, fd.name).CopyFrom(value)
        else:
            setattr(dst, fd.name, value)


def _repeated(fd) -> bool:
    flag = getattr(fd, "is_repeated", None)  # protobuf >= 5; older ones have label
    return bool(flag) if flag is not None else fd.label == fd.LABEL_REPEATED


def materialize(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with its decoders replaced by the plain weights (a new model; raises
    StorageError when the map does not match): what onnxruntime's folding would give, as a file
    any tool reads."""
    decoded = decode(model)
    out = decoded.model
    keep = [t for t in out.graph.initializer if t.name not in decoded.weights]
    del out.graph.initializer[:]
    out.graph.initializer.extend(keep)
    out.graph.initializer.extend(numpy_helper.from_array(a, name) for name, a in decoded.weights.items())
    return out


# --------------------------------------------------------------------------- what a file is

LOAD_COST = {"standard_ops_bytes_per_weight": (77, 83), "fast_path_peak_ratio": (1.31, 1.47),
             "fast_path_time_ratio": (1.15, 1.65), "compact_peak_ratio": (1.29, 1.55),
             "compact_time_ratio": (1.17, 2.22)}
"""What loading a --codebook model cost in ``benchmarks/bench_load.py`` (docs/HASHING.md,
"Storage"), on the ResNet-50-sized graph and EfficientNet-Lite0: plain onnxruntime folding the
decoders, extra peak bytes per stored weight; ``redpp_onnx.session``, peak memory and session
time as ratios to the fp32 model, for the map's fast path and for the compact form."""


def describe(source: ModelSource) -> dict:
    """Which storage a model file uses and what loading it costs, as a report would say it:
    ``form`` is ``"plain"`` (no decoders), ``"standard-ops"`` (decoders, no map: files written
    before the map existed, or whose map was removed), ``"standard-ops + map"`` or ``"plain +
    stale map"``; with a map, ``stored_weights``, ``tensors``, ``grouped_tensors`` (one codebook
    per channel group), ``mapped_tensors`` (of those, the ones with a channel -> group map), the
    ``fast_path`` check (``"ok"`` or why not) and ``load`` (what each runtime does, with the costs
    measured by ``benchmarks/bench_load.py``)."""
    from .analysis.layers import constant_only_nodes

    model = load_model(source)
    if _compact_text(model) is not None:
        return _describe_compact(model)
    text = metadata(model)
    if text is None:
        return {"form": "standard-ops" if constant_only_nodes(model.graph) else "plain"}
    info = {"form": "standard-ops + map", "key": METADATA_KEY}
    try:
        meta = _parse(text)
        info["stored_weights"] = sum(int(e.get("count", 0)) for e in meta["tensors"].values())
        info["tensors"] = len(meta["tensors"])
        info["grouped_tensors"] = sum(e.get("groups") is not None for e in meta["tensors"].values())
        info["mapped_tensors"] = sum(isinstance(e.get("groups"), dict) and e["groups"].get("map") is not None
                                     for e in meta["tensors"].values())
        decode(model, text)
        info["fast_path"] = "ok"
    except StaleMap as err:
        info["form"] = "plain + stale map"
        info["fast_path"] = f"not needed: {err}"
    except StorageError as err:
        info["fast_path"] = f"refused: {err}"
    n = info.get("stored_weights", 0)
    lo, hi = LOAD_COST["standard_ops_bytes_per_weight"]
    peak, secs = LOAD_COST["fast_path_peak_ratio"], LOAD_COST["fast_path_time_ratio"]
    info["load"] = {
        "redpp_onnx.session": (f"decodes the weights in C++ and hands them to onnxruntime: measured "
                               f"{peak[0]:g}-{peak[1]:g}x the fp32 model's peak memory and {secs[0]:g}-{secs[1]:g}x "
                               "its session time"
                               if info["fast_path"] == "ok"
                               else "loads the file as plain onnxruntime does (the map is not used)"),
        "onnxruntime": (f"folds the decoders when the session starts: about {n * lo / 2 ** 20:,.0f}-"
                        f"{n * hi / 2 ** 20:,.0f} MiB of peak memory beyond the fp32 model's, seconds on large models"),
    }
    return info



def _describe_compact(model: onnx.ModelProto) -> dict:
    """:func:`describe` of a compact-form model (``redpp_onnx/compact.py``)."""
    info = {"form": "compact", "key": COMPACT_KEY}
    try:
        d = decode(model)
        info["stored_weights"] = d.stored_weights
        info["tensors"] = len(d.weights)
        info["fast_path"] = "ok"
    except StorageError as err:
        info["fast_path"] = f"refused: {err}"
    peak, secs = LOAD_COST["compact_peak_ratio"], LOAD_COST["compact_time_ratio"]
    info["load"] = {
        "redpp_onnx.session": (f"decodes the weights in C++ and hands them to onnxruntime: measured "
                               f"{peak[0]:g}-{peak[1]:g}x the fp32 model's peak memory and {secs[0]:g}-{secs[1]:g}x "
                               "its session time"
                               if info["fast_path"] == "ok" else "cannot load it: the weights do not decode"),
        "onnxruntime": ("cannot load it (no kernel for ai.redpp::Decode): `redpp-onnx expand` writes the plain "
                        "model, or compress with --storage standard"),
    }
    return info
