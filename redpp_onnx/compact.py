"""The compact storage form (``compress --storage compact``): hashed weights entropy-coded to within
a few hundredths of a bit of their entropy, decoded by redpp-onnx when the model is loaded.

The standard-ops form (``redpp_onnx/passes/codebook.py``) must be decodable by standard ONNX
operators, which rules out entropy coding: its two-part prefix codes and its decoder subgraph
cost 0.5-1.1 bits per weight above the entropy of the codes (docs/HASHING.md). This form stores
the same codebooks and rank codes (:class:`~redpp_onnx.passes.codebook.TensorCodes`) with a static
rANS code (``csrc/rans.h``) per tensor, and one ``ai.redpp::Decode`` node per weight in place of
the decoders. Only redpp-onnx reads it: :func:`redpp_onnx.session` (and ``eval``/``bench``)
decode the weights in C++ and hand them to onnxruntime, :func:`redpp_onnx.storage.materialize`
(``redpp-onnx expand``) writes the plain model for other runtimes. Plain onnxruntime refuses the
file (it has no kernel for ``ai.redpp::Decode``): that is the price of the last bits.

The file: ``metadata_props["redpp.compact"]`` = ``{"version": 1, "blob": NAME, "sha256": HEX}`` (the
blob's digest: a damaged blob is refused before it is read); the uint8
initializer NAME holds ``b"RPC1"``, a little-endian uint32 ``h``, ``h`` bytes of zlib'd JSON
header, a uint32 ``k``, ``k`` bytes of zlib'd tables, then the streams (32-bit words). Header::

    {"version": 1,
     "tables": [[DTYPE, COUNT], ...],          # table "t<i>": COUNT values of DTYPE, end to end
     "tensors": {NAME: {the entry of the redpp.codebook map (redpp_onnx/storage.py), with "bank"
                        the tensor's index and "start" 0, plus
                        "stream": [offset, bytes], "scale_bits": S, "freqs": "t<i>",
                        "models": "tensor" | "groups"}}}

``models``: one frequency table for the tensor (the ranks of all its codebooks pooled), or one
per group of channels (``groups.counts[g]`` frequencies each, end to end); frequencies sum to
``2^S``. Each node ``ai.redpp::Decode(NAME) -> weight`` names its entry by its output.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .ops.schema import DOMAIN
from .passes.codebook import RANS_MODEL_ENTRY_BITS, TensorCodes, checksum
from .passes.codebook import set_metadata as codebook_metadata

__all__ = ["METADATA_KEY", "OP_TYPE", "MODEL_ENTRY_BITS", "scale_bits", "normalize", "plan_models", "write",
           "is_compact", "decode"]

METADATA_KEY = "redpp.compact"
VERSION = 1
OP_TYPE = "Decode"
MAGIC = b"RPC1"
DECODE_THREADS = 4
"""Tensors decoded at once (the machine's cores, at most this many)."""
MAX_HEADER_BYTES = 1 << 28
"""Decompressed header or tables larger than this are refused (a damaged or hostile file)."""
MODEL_ENTRY_BITS = RANS_MODEL_ENTRY_BITS
"""What one frequency of a model costs in the file, for choosing between one model per tensor and
one per group (and the forms in ``tensor_codes(coder="rans")``)."""


# --------------------------------------------------------------------------- models

def scale_bits(alphabet: int) -> int:
    """Precision of a model's frequencies, 2^S: S = 16 for alphabets of up to 1,024 symbols (the
    decoder then finds a symbol by one table lookup; rounding the frequencies costs < 0.01 bit a
    symbol on the shared models), else the alphabet's bits + 6, at most 26."""
    k = int(alphabet)
    return 16 if k <= 1024 else int(min(26, k.bit_length() + 6))


def normalize(hist: np.ndarray, s: int) -> np.ndarray:
    """Frequencies (int64) summing to ``2^s`` proportional to ``hist``; every non-zero count keeps
    at least 1, a zero count gets 0. ``hist`` must have a non-zero count and at most ``2^s``."""
    hist = np.asarray(hist, np.int64)
    total = int(hist.sum())
    target = 1 << s
    if total <= 0 or np.count_nonzero(hist) > target:
        raise ValueError("normalize: an empty histogram or more symbols than 2^s")
    f = (hist * target) // total
    f[(hist > 0) & (f == 0)] = 1
    diff = target - int(f.sum())
    order = np.argsort(-hist, kind="stable")
    i = 0
    while diff != 0:  # rounding: add to the most frequent, take from those that stay >= 1
        k = order[i % order.size]
        if diff > 0:
            f[k] += diff
            diff = 0
        elif f[k] > 1:
            take = min(-diff, int(f[k]) - 1)
            f[k] -= take
            diff += take
        i += 1
    return f


def _coded_bits(hist: np.ndarray, freqs: np.ndarray, s: int) -> float:
    nz = hist > 0
    return float(np.sum(hist[nz] * (s - np.log2(freqs[nz]))))


def plan_models(t: TensorCodes) -> Tuple[str, List[np.ndarray], int, float]:
    """``(models, freqs per model, S, bits)``: one model for the tensor or, for a grouped tensor,
    one per group, whichever codes it in fewer bits (the coded bits plus ``MODEL_ENTRY_BITS`` a
    frequency); ties keep one model."""
    codes = t.codes
    n_ranks = t.n_ranks
    s = scale_bits(n_ranks)
    hist = np.bincount(codes, minlength=n_ranks)
    f = normalize(hist, s)
    best = ("tensor", [f], s, _coded_bits(hist, f, s) + MODEL_ENTRY_BITS * f.size)
    g = t.groups
    if g is not None and g.n_groups > 1:
        group = g.group_of()[g.channel_of()]
        counts = np.asarray(g.counts, np.int64)
        key = np.bincount(group * n_ranks + codes, minlength=g.n_groups * n_ranks).reshape(g.n_groups, n_ranks)
        freqs, bits = [], 0.0
        for j in range(g.n_groups):
            h = key[j, :counts[j]]
            fj = normalize(h, s)
            freqs.append(fj)
            bits += _coded_bits(h, fj, s) + MODEL_ENTRY_BITS * fj.size
        if bits < best[3]:
            best = ("groups", freqs, s, bits)
    return best


# --------------------------------------------------------------------------- writing

class _Tables:
    def __init__(self):
        self.arrays: List[np.ndarray] = []

    def add(self, a) -> str:
        self.arrays.append(np.ascontiguousarray(a))
        return f"t{len(self.arrays) - 1}"


def _smallest_uint(a: np.ndarray) -> np.ndarray:
    top = int(a.max()) if a.size else 0
    return a.astype(np.uint8 if top <= 0xFF else np.uint16 if top <= 0xFFFF else np.uint32)


def _layout(t: TensorCodes) -> Tuple[int, int, int, np.ndarray]:
    """``(outer, channels, inner, group of every channel)`` of the stream's channel view."""
    g = t.groups
    if g is None:
        return 1, 1, int(t.codes.size), np.zeros(1, np.int64)
    return g.outer, g.channels, g.inner, g.group_of()


def write(model: onnx.ModelProto, tensors: Sequence[TensorCodes]) -> Dict[str, float]:
    """Add the compact form of ``tensors`` to ``model`` (one blob initializer, one
    ``ai.redpp::Decode`` node per tensor, the metadata entry); the caller removes the plain
    tensors. Returns each tensor's stream bits per weight (its rANS words and its models'
    frequencies)."""
    from . import _core

    graph = model.graph
    taken = {t.name for t in graph.initializer} | {o for n in graph.node for o in n.output} | {i.name for i in graph.input}
    blob_name = "redpp_compact"
    while blob_name in taken:
        blob_name += "_"
    tables = _Tables()
    entries: Dict[str, dict] = {}
    streams: List[np.ndarray] = []
    pos = 0
    bits: Dict[str, float] = {}
    for i, t in enumerate(tensors):
        g = t.groups
        if t.lattice is not None:
            unit = None if g is not None and g.units is not None else float(np.float32(t.unit)).hex()
            book = {"init": tables.add(t.lattice), "offset": 0, "size": int(t.lattice.size), "unit": unit}
        else:
            book = {"init": tables.add(t.codebook.astype(np.float32)), "offset": 0, "size": int(t.codebook.size),
                    "unit": None}
        groups = None
        if g is not None:
            groups = {"axis": g.axis, "outer": g.outer, "channels": g.channels, "inner": g.inner, "size": g.size,
                      "counts": tables.add(np.asarray(g.counts).astype(g.count_dtype)),
                      "units": tables.add(g.units.astype(np.float32)) if g.units is not None else None,
                      "map": (tables.add(np.asarray(g.channel_map).astype(g.map_dtype))
                              if g.channel_map is not None else None)}
        models, freqs, s, _ = plan_models(t)
        flat = np.concatenate(freqs)
        starts = np.concatenate([[0], np.cumsum([f.size for f in freqs])]).astype(np.int64)
        outer, channels, inner, group_of = _layout(t)
        channel_model = (group_of if models == "groups" else np.zeros(channels, np.int64)).astype(np.int32)
        stream = _core.rans_encode(t.codes.astype(np.uint16), flat.astype(np.uint32), starts, s, outer, channels,
                                   inner, channel_model)
        entries[t.name] = {"bank": i, "start": 0, "count": int(t.codes.size), "shape": [int(d) for d in t.shape],
                           "dtype": "float32", "book": book, "groups": groups,
                           "checksum": f"{checksum(t.values()):032x}", "stream": [pos, int(stream.size)],
                           "scale_bits": s, "freqs": tables.add(_smallest_uint(flat)), "models": models}
        streams.append(stream)
        pos += int(stream.size)
        bits[t.name] = (8 * stream.size + MODEL_ENTRY_BITS * flat.size) / max(t.codes.size, 1)
    header = {"version": VERSION, "tables": [[a.dtype.str, int(a.size)] for a in tables.arrays], "tensors": entries}
    zh = zlib.compress(json.dumps(header, separators=(",", ":")).encode(), 9)
    zt = zlib.compress(b"".join(a.astype(a.dtype.newbyteorder("<")).tobytes() for a in tables.arrays), 9)
    blob = b"".join([MAGIC, struct.pack("<I", len(zh)), zh, struct.pack("<I", len(zt)), zt]
                    + [s.tobytes() for s in streams])
    graph.initializer.append(numpy_helper.from_array(np.frombuffer(blob, np.uint8).copy(), blob_name))
    nodes = [helper.make_node(OP_TYPE, [blob_name], [t.name], domain=DOMAIN) for t in tensors]
    for node in reversed(nodes):
        graph.node.insert(0, node)
    if not any(o.domain == DOMAIN for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(DOMAIN, 1))
    set_metadata(model, json.dumps({"version": VERSION, "blob": blob_name, "sha256": hashlib.sha256(blob).hexdigest()},
                                   separators=(",", ":")))
    return bits


def set_metadata(model: onnx.ModelProto, value: Optional[str]) -> None:
    """Set (or with None remove) the compact form's metadata entry."""
    codebook_metadata(model, value, METADATA_KEY)


# --------------------------------------------------------------------------- reading

def metadata(model: onnx.ModelProto) -> Optional[str]:
    for p in model.metadata_props:
        if p.key == METADATA_KEY:
            return p.value
    return None


def is_compact(model: onnx.ModelProto) -> bool:
    """The model has the compact form's metadata or ``ai.redpp::Decode`` nodes."""
    return metadata(model) is not None or any(n.op_type == OP_TYPE and n.domain == DOMAIN for n in model.graph.node)


def _inflate(data: bytes, what: str) -> bytes:
    from .storage import StorageError

    d = zlib.decompressobj()
    try:
        out = d.decompress(data, MAX_HEADER_BYTES)
    except zlib.error as err:
        raise StorageError(f"the compact form's {what} is damaged ({err})") from None
    if d.unconsumed_tail or not d.eof:
        raise StorageError(f"the compact form's {what} is damaged or larger than {MAX_HEADER_BYTES} bytes")
    return out


def _split_blob(blob: bytes) -> Tuple[dict, bytes, memoryview]:
    from .storage import StorageError

    if blob[:4] != MAGIC or len(blob) < 12:
        raise StorageError("the compact form's blob does not start with its magic bytes")
    (h,) = struct.unpack_from("<I", blob, 4)
    if 8 + h + 4 > len(blob):
        raise StorageError("the compact form's blob is truncated (header)")
    try:
        header = json.loads(_inflate(blob[8:8 + h], "header"))
    except (ValueError, UnicodeDecodeError) as err:
        raise StorageError(f"the compact form's header is not JSON ({err})") from None
    (k,) = struct.unpack_from("<I", blob, 8 + h)
    start = 12 + h
    if start + k > len(blob):
        raise StorageError("the compact form's blob is truncated (tables)")
    tables = _inflate(blob[start:start + k], "tables")
    if not isinstance(header, dict) or header.get("version") != VERSION or not isinstance(header.get("tensors"), dict) \
            or not isinstance(header.get("tables"), list):
        raise StorageError(f"the compact form's header is not version {VERSION}")
    return header, tables, memoryview(blob)[start + k:]


def _table_inits(header: dict, raw: bytes) -> Dict[str, onnx.TensorProto]:
    from .storage import StorageError

    inits, pos = {}, 0
    for i, spec in enumerate(header["tables"]):
        try:
            dtype, count = np.dtype(spec[0]), int(spec[1])
        except (TypeError, ValueError, IndexError):
            raise StorageError(f"the compact form's table {i} is malformed") from None
        if dtype.str not in ("<i2", "<f4", "|u1", "<u2", "<u4", "<i4") or count < 0 \
                or pos + count * dtype.itemsize > len(raw):
            raise StorageError(f"the compact form's table {i} ({spec!r}) does not fit its tables")
        a = np.frombuffer(raw, dtype, count, pos)
        pos += count * dtype.itemsize
        inits[f"t{i}"] = numpy_helper.from_array(a.astype(dtype.newbyteorder("=")), f"t{i}")
    if pos != len(raw):
        raise StorageError("the compact form's tables have bytes left over")
    return inits


def decode(model: onnx.ModelProto):
    """Decode every weight of a compact-form model: a :class:`redpp_onnx.storage.Decoded` (the
    graph without its Decode nodes and blob, the weights as arrays). Raises
    :class:`~redpp_onnx.storage.StorageError` (the reason) when anything does not match; ``model``
    is not changed."""
    from . import _core
    from .storage import Decoded, StorageError, _integer, _job, _without_decoders

    t0 = time.perf_counter()
    text = metadata(model)
    if text is None:
        raise StorageError(f"the model has no {METADATA_KEY!r} metadata")
    try:
        meta = json.loads(text)
        blob_name = meta["blob"]
        if meta.get("version") != VERSION or not isinstance(blob_name, str):
            raise ValueError(f"version {meta.get('version')!r}")
    except (ValueError, KeyError, TypeError) as err:
        raise StorageError(f"the {METADATA_KEY!r} metadata is malformed ({err})") from None
    graph = model.graph
    blob_init = next((t for t in graph.initializer if t.name == blob_name), None)
    if blob_init is None or blob_init.data_type != onnx.TensorProto.UINT8 or len(blob_init.dims) != 1 \
            or blob_init.data_location == onnx.TensorProto.EXTERNAL:
        raise StorageError(f"the compact form's blob {blob_name!r} is not a uint8 initializer of the model")
    blob = numpy_helper.to_array(blob_init).tobytes()
    if hashlib.sha256(blob).hexdigest() != meta.get("sha256"):
        raise StorageError("the compact form's blob is not as written (its SHA-256 differs)")
    header, raw_tables, streams = _split_blob(blob)
    entries = header["tensors"]
    nodes = [k for k, n in enumerate(graph.node) if n.op_type == OP_TYPE and n.domain == DOMAIN]
    outputs = [graph.node[k].output[0] if len(graph.node[k].output) == 1 else None for k in nodes]
    if any(list(graph.node[k].input) != [blob_name] for k in nodes) or sorted(map(str, outputs)) != sorted(entries):
        raise StorageError("the Decode nodes of the graph are not the ones of the compact form's header")
    inits = _table_inits(header, raw_tables)
    constants = set(inits)
    weights: Dict[str, np.ndarray] = {}
    try:
        bank_counts = [int(e.get("count", 0)) if isinstance(e, dict) else 0 for e in entries.values()]
    except (TypeError, ValueError):
        raise StorageError("the compact form's header has a count that is not an integer") from None
    jobs = []
    for index, (name, entry) in enumerate(entries.items()):
        if not isinstance(entry, dict):
            raise StorageError(f"{name!r}: not an object")
        try:
            if _integer(entry, "bank") != index or _integer(entry, "start") != 0:
                raise StorageError(f"{name!r}: not the header's tensor {index}")
            out, job, _, extra = _job(name, entry, inits, constants, bank_counts)
            offset, size = entry["stream"]
            offset, size = int(offset), int(size)
            if offset < 0 or size < 0 or offset + size > len(streams) or size % 4:
                raise StorageError(f"{name!r}: stream {offset}:{offset + size} of {len(streams)} bytes")
            s = _integer(entry, "scale_bits", 1)
            freqs = numpy_helper.to_array(inits[entry["freqs"]]) if entry.get("freqs") in inits else None
            if freqs is None or freqs.ndim != 1:
                raise StorageError(f"{name!r}: no frequency table")
            _, _, table, outer, channels, inner, channel_base, channel_unit = job
            group_of, channel_count = extra
            if entry.get("models") == "groups" and entry.get("groups") is not None:
                sizes = numpy_helper.to_array(inits[entry["groups"]["counts"]]).astype(np.int64)
                channel_model = group_of.astype(np.int32)
            elif entry.get("models") == "tensor":
                sizes = np.asarray([int(channel_count.max()) if channel_count.size else 0], np.int64)
                channel_model = np.zeros(channels, np.int32)
            else:
                raise StorageError(f"{name!r}: models {entry.get('models')!r}")
            if int(sizes.sum()) != freqs.size:
                raise StorageError(f"{name!r}: {freqs.size} frequencies for models of {int(sizes.sum())} symbols")
            starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
            expected = int(str(entry.get("checksum")), 16)
            args = (np.frombuffer(streams[offset:offset + size], np.uint8), freqs.astype(np.uint32), starts, s, outer,
                    channels, inner, channel_model, out.reshape(-1), table, channel_base,
                    channel_count.astype(np.int32), channel_unit)
        except StorageError:
            raise
        except (TypeError, ValueError, KeyError, OverflowError, IndexError) as err:
            raise StorageError(f"{name!r}: {err}") from None
        jobs.append((name, args, expected, out))

    def run(job):
        name, args, expected, _ = job
        try:
            return _core.rans_decode(*args) == expected, None
        except ValueError as err:
            return False, f"{name!r}: {err}"

    t1 = time.perf_counter()
    # the C++ decoder releases the GIL: tensors decode in parallel, each in its own output array
    with ThreadPoolExecutor(max_workers=max(1, min(DECODE_THREADS, os.cpu_count() or 1))) as pool:
        results = list(pool.map(run, jobs))
    in_decoder = time.perf_counter() - t1
    for (name, _, _, out), (ok, err) in zip(jobs, results):
        if err is not None:
            raise StorageError(err)
        if not ok:
            raise StorageError(f"{name!r}: the decoded values do not have the checksum the header was written with")
        weights[name] = out
    small = _without_decoders(model, nodes, {blob_name}, weights)
    return Decoded(small, weights, time.perf_counter() - t0, in_decoder)
