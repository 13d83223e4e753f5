"""``compress`` of a model larger than memory allows: tensor by tensor, never the whole model.

The in-memory path (``compress.py``) holds the model several times over (the input, the work
copy, the output, two onnxruntime sessions for the sensitivities and the verification): its peak
was 12-29x the model's bytes on the ResNet-50-sized graph and 27x on the BERT-sized encoder
(docs/RESULTS.md). :func:`stream_reason` sends a model here when ``RD_PEAK_FACTOR`` times its
bytes exceed the memory limit (the memory available when the command starts, or
``--memory-limit``), or when ``--stream`` asks for it.

Here the graph is read without its external data; each eligible weight is read alone, hashed by
the data-free per-layer rule (KDE hashing within a relative weight error, ``--weight-error``,
0.01 by default: no model run, unlike the rate-distortion hashing's sensitivities), checked
layer-wise (the layer's output on seeded N(0, 1) inputs, with the original and the hashed
weight), written to the output's external data file and dropped; every other tensor is copied
through. float16 / bfloat16 weights are hashed from the histogram of their 16-bit patterns (no
sort of the weights): the same values as the in-memory per-layer rule, bit for bit. With
``workers > 1`` the weights are hashed in a pool of processes, at most ``workers + 1`` tensors in
flight, and written in model order: the output does not depend on the number of workers.

What this path does not do, each said in the report: the rate-distortion hashing, merge and split
(they edit or run the whole graph), codebook storage (hashed weights are written plainly in their
own type: the file keeps its size; codebooks hold every layer's codes in memory), and the
whole-model verification (it loads both models in onnxruntime).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import re
import time
from pathlib import Path
from typing import Callable, Iterator, List, Optional, Tuple

import numpy as np
import onnx
from onnx import numpy_helper

from . import __version__, io, validate
from .analysis.layers import external_data_in, nonfinite_reason, np_dtype, representable, scan_layers
from .errors import RedppError
from .hashing.kde import hash_distinct
from .hashing.workers import imap_ordered
from .report import Report

STREAM_WORKERS = 1
"""Default ``--workers`` of the streaming path: on this project's 2-core machine a second worker made
it slower (1.04 B float16 decoder 22.7 -> 27.7 s, ResNet-50-sized graph 11.7 -> 13.1 s,
benchmarks/bench_large.py): each weight's work is short and bound by memory traffic."""
RD_PEAK_FACTOR = 30
"""Peak memory of the in-memory ``compress`` (rate-distortion hashing, verification) per byte of
model, rounded up from the measured 12-29x (ResNet-50-sized graph) and 27x (BERT-sized encoder)."""
INLINE_BYTES = 1024
"""Tensors smaller than this stay in the model file; larger ones go to the external data file."""
ALIGN = 64
"""Each tensor of the output's external data starts at a multiple of this many bytes."""
CHECK_ROWS = 8
"""Seeded N(0, 1) input rows of the layer-wise check (64 rows of a table)."""
WINDOW = 8
"""Weights in flight per worker (tasks submitted and not yet taken back, in model order): workers
write their tensors in place and send back statistics only, so a long weight at the head of the
line does not leave the other workers idle while the later ones are small (inputs held in the
tasks are references to external data, or tensors of a model that is in memory anyway)."""
INDEX_BLOCK = 1 << 22
"""float16 / bfloat16 weights per block of the histogram and of the table lookup (numpy widens the
16-bit patterns to int64 indices: 32 MB a block instead of 8 bytes a weight)."""
CHECK_OUTPUTS = 1024
"""Outputs of a layer the layer-wise check computes (a seeded sample when the layer has more)."""
CHECK_BLOCK = 1 << 22
"""Weights per block of the layer-wise check (16 MB of float32)."""
COPY_CHUNK = 1 << 24


def available_memory() -> int:
    """Bytes of memory available to this process now (``MemAvailable``; else total physical memory)."""
    try:
        with open("/proc/meminfo") as f:
            m = re.search(r"MemAvailable:\s+(\d+) kB", f.read())
        if m:
            return int(m.group(1)) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text: str) -> int:
    """``"24G"``, ``"500M"``, ``"1.5G"``, ``"123456"`` (bytes; K/M/G/T are powers of 1024)."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([KMGT]?)i?B?\s*", str(text), re.IGNORECASE)
    if not m or float(m.group(1)) <= 0:
        raise RedppError(f"--memory-limit: expected a size such as 8G or 500M, got {text!r}")
    return int(float(m.group(1)) * _UNITS[m.group(2).upper()])


def _gb(n: float) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB"


def stream_reason(model_bytes: int, *, forced: bool = False, memory_limit: Optional[int] = None) -> Optional[str]:
    """Why this model goes through the streaming path (None: the in-memory path fits).

    The rule: the in-memory path's peak, estimated as ``RD_PEAK_FACTOR`` x the model's bytes (file
    plus external data), must fit in ``memory_limit`` (default: the memory available now)."""
    if forced:
        return "--stream asked for the streaming path"
    limit = memory_limit if memory_limit is not None else available_memory()
    need = RD_PEAK_FACTOR * model_bytes
    if need <= limit:
        return None
    source = "--memory-limit" if memory_limit is not None else "the memory available"
    return (f"the model has {_gb(model_bytes)}; the in-memory path (rate-distortion hashing runs the whole model in "
            f"onnxruntime for its sensitivities, the verification runs it twice) peaks at up to {RD_PEAK_FACTOR}x "
            f"that ({_gb(need)}), more than {source} ({_gb(limit)})")


# --------------------------------------------------------------------------- one tensor

def _half_floats(bits: np.ndarray, data_type: int) -> np.ndarray:
    """float32 values of float16 / bfloat16 bit patterns (uint16)."""
    if data_type == onnx.TensorProto.FLOAT16:
        return bits.view(np.float16).astype(np.float32)
    return (bits.astype(np.uint32) << 16).view(np.float32)


def _half_bits(values: np.ndarray, data_type: int) -> np.ndarray:
    """uint16 patterns of float32 ``values`` rounded to nearest float16 / bfloat16."""
    return np.asarray(values, np.float32).astype(np_dtype(data_type)).view(np.uint16)


def hash_array(w: np.ndarray, data_type: int, options: dict) -> Tuple[np.ndarray, dict]:
    """``(hashed, stats)``: ``w`` (as stored: float32, float16, bfloat16) hashed by the per-layer rule
    (``options``: ``eps``, ``bandwidth_factor``, ``tau``, ``snap_zero`` of :func:`hash_distinct`),
    in its own type; ``stats``: distinct values before and after, relative error, bandwidth...
    The values are :func:`redpp_onnx.hashing.hash_tensor`'s (then rounded to the type)."""
    if data_type == onnx.TensorProto.FLOAT:
        w32 = np.asarray(w, np.float32)
        v32, inv, counts = np.unique(w32.ravel(), return_inverse=True, return_counts=True)
    else:  # 16-bit patterns: a histogram, not a sort
        bits = np.ascontiguousarray(w).view(np.uint16).ravel()
        hist = _histogram16(bits)
        present = np.flatnonzero(hist)
        v32, inv_present = np.unique(_half_floats(present.astype(np.uint16), data_type), return_inverse=True)
        counts = np.bincount(inv_present, weights=hist[present]).astype(np.int64)
    stats = {"distinct_before": int(len(v32)), "distinct_after": int(len(v32)), "rel_error": 0.0}
    finite = np.isfinite(v32)
    if not finite.all():  # the in-memory path refuses such a layer with this reason (analysis/layers.py)
        stats.update(method="unchanged", reason=nonfinite_reason(int(counts[~finite].sum())))
        return w, stats
    found = hash_distinct(v32, counts, **options) if w.size else None
    if found is None or found.reason is not None:
        stats.update(method="unchanged", reason=found.reason if found else "empty tensor")
        return w, stats
    v, c = v32.astype(np.float64), counts.astype(np.float64)
    err = v - found.values.astype(np.float64)
    sq_norm = float(np.dot(c, v * v))
    codebook = np.unique(found.values)
    details = found.details(codebook, v, c)
    kept = np.unique(representable(found.values, data_type))  # the values its own type keeps
    stats.update(method="kde", distinct_after=int(kept.size),
                 rel_error=math.sqrt(float(np.dot(c, err * err)) / sq_norm) if sq_norm > 0 else 0.0,
                 bandwidth=details["bandwidth"], factor=details["factor"], modes=details["n_modes"],
                 u_l=details["bound"])
    if data_type == onnx.TensorProto.FLOAT:
        return found.values[inv].reshape(w.shape), stats
    lut = np.arange(1 << 16, dtype=np.uint16)
    lut[present] = _half_bits(found.values[inv_present], data_type)
    return _lookup16(lut, bits).view(w.dtype).reshape(w.shape), stats


def _core16():
    try:
        from . import _core
    except ImportError:  # pragma: no cover - the package is built with it
        return None
    return _core if hasattr(_core, "lookup16") else None


def _histogram16(bits: np.ndarray) -> np.ndarray:
    """Counts of each 16-bit pattern (int64, 65536): in C++, else numpy in blocks (numpy widens the
    patterns to int64 indices)."""
    core = _core16()
    if core is not None:
        return core.histogram16(bits)
    hist = np.zeros(1 << 16, np.int64)
    for i in range(0, bits.size, INDEX_BLOCK):
        hist += np.bincount(bits[i:i + INDEX_BLOCK], minlength=1 << 16)
    return hist


def _lookup16(lut: np.ndarray, bits: np.ndarray) -> np.ndarray:
    """``lut[bits]`` for uint16 patterns (C++, else numpy in blocks)."""
    core = _core16()
    if core is not None:
        return core.lookup16(lut, bits)
    out = np.empty_like(bits)
    for i in range(0, bits.size, INDEX_BLOCK):
        np.take(lut, bits[i:i + INDEX_BLOCK], out=out[i:i + INDEX_BLOCK])
    return out


def layer_check(w: np.ndarray, hashed: np.ndarray, layer: dict, seed: int) -> Optional[float]:
    """Relative L2 error of the layer's output with ``hashed`` instead of ``w`` on seeded inputs:
    ``CHECK_ROWS`` N(0, 1) rows through a MatMul / Gemm / Conv (a Conv as the matrix of its
    unfolded patches; a seeded window of ``CHECK_OUTPUTS`` consecutive outputs when it has more), 64
    random rows of a table (Gather). Computed in float32 over blocks of
    ``CHECK_BLOCK`` weights (the check adds little to the tensor's own memory). None for an
    all-zero output."""
    rng = np.random.default_rng(seed)
    if layer["op_type"] == "Gather":
        rows = rng.integers(0, w.shape[0], 64)
        ref = w[rows].astype(np.float32)
        diff = hashed[rows].astype(np.float32) - ref
    else:
        m = w.reshape(w.shape[0], -1)  # Conv [C_out, ...], Gemm transB [out, in]; MatMul, Gemm [in, out]
        h = hashed.reshape(m.shape)
        rows_in = layer["op_type"] == "MatMul" or (layer["op_type"] == "Gemm" and not layer.get("trans_b"))
        outputs = m.shape[1] if rows_in else m.shape[0]
        if outputs > CHECK_OUTPUTS:  # a seeded window of consecutive outputs (contiguous reads)
            keep = slice(int(rng.integers(0, outputs - CHECK_OUTPUTS + 1)), None)
            keep = slice(keep.start, keep.start + CHECK_OUTPUTS)
            m, h = (m[:, keep], h[:, keep]) if rows_in else (m[keep], h[keep])
        x = rng.standard_normal((CHECK_ROWS, m.shape[0] if rows_in else m.shape[1]), dtype=np.float32)
        out = m.shape[1] if rows_in else m.shape[0]
        ref, diff = np.zeros((CHECK_ROWS, out), np.float32), np.zeros((CHECK_ROWS, out), np.float32)
        step = max(1, CHECK_BLOCK // max(m.shape[1], 1))
        for i in range(0, m.shape[0], step):
            a = m[i:i + step].astype(np.float32)
            d = h[i:i + step].astype(np.float32) - a
            if rows_in:  # y = x @ W: the blocks of W's rows add up
                ref += x[:, i:i + step] @ a
                diff += x[:, i:i + step] @ d
            else:  # y = x @ W.T: each block of W's rows gives its outputs
                ref[:, i:i + step] = x @ a.T
                diff[:, i:i + step] = x @ d.T
    norm = float(np.linalg.norm(ref))
    return float(np.linalg.norm(diff)) / norm if norm > 0 else None


def _task(task: dict) -> Tuple[Optional[np.ndarray], dict]:
    """One eligible weight: read, hashed, checked, and written to its place in the output's external
    data (``task["target"]``: path, offset) when it has one, else returned (runs in a worker
    process or in the caller; only the statistics travel back)."""
    t0 = time.perf_counter()
    w = task["array"]
    if w is None:
        w = io.read_external(task["proto"], task["folder"])
    hashed, stats = hash_array(w, task["data_type"], task["options"])
    stats["output_rel_l2"] = layer_check(w, hashed, task["layer"], task["seed"]) if stats["method"] != "unchanged" \
        else 0.0
    hashed = np.ascontiguousarray(hashed)
    if task["target"] is not None:
        _write_at(task["target"][0], task["target"][1], hashed)
        hashed = None
    stats["seconds"] = time.perf_counter() - t0
    return hashed, stats


# --------------------------------------------------------------------------- the model

@dataclasses.dataclass
class StreamOptions:
    """What the streaming path is asked to do (the CLI builds it from its options)."""

    weight_error: float = 0.01
    bandwidth_factor: Optional[float] = None
    nms_radius: float = 0.0
    snap_zero: bool = False
    include_depthwise: bool = False
    workers: int = 1
    seed: int = 0
    reason: str = ""
    skipped: List[str] = dataclasses.field(default_factory=list)  # what the in-memory path would do, and why not

    def hash_options(self) -> dict:
        return {"eps": self.weight_error, "bandwidth_factor": self.bandwidth_factor, "tau": self.nms_radius,
                "snap_zero": self.snap_zero}


def _size(t: onnx.TensorProto) -> int:
    n = 1
    for d in t.dims:
        n *= int(d)
    return n * np_dtype(t.data_type).itemsize if t.data_type != onnx.TensorProto.STRING else 0


def _set_external(t: onnx.TensorProto, location: str, offset: int, length: int) -> None:
    for field in ("raw_data", "float_data", "int32_data", "int64_data", "double_data", "uint64_data", "string_data"):
        t.ClearField(field)
    del t.external_data[:]
    t.data_location = onnx.TensorProto.EXTERNAL
    for k, v in (("location", location), ("offset", str(offset)), ("length", str(length))):
        t.external_data.add(key=k, value=v)


def _write_at(path, offset: int, a: np.ndarray) -> None:
    """``a``'s bytes (little-endian) at ``offset`` of the existing file ``path``."""
    data = np.ascontiguousarray(a)
    if data.dtype.byteorder == ">":
        data = data.byteswap()
    with open(path, "r+b") as f:
        f.seek(offset)
        data.tofile(f)


def _copy_at(path: Path, offset: int, source: Path, source_offset: int, length: int, name: str) -> None:
    """``length`` bytes of ``source`` from ``source_offset`` to ``offset`` of the existing file ``path``."""
    with open(source, "rb") as src, open(path, "r+b") as dst:
        src.seek(source_offset)
        dst.seek(offset)
        left = length
        while left:
            chunk = src.read(min(COPY_CHUNK, left))
            if not chunk:
                raise RedppError(f"{source}: the external data of {name} is truncated")
            dst.write(chunk)
            left -= len(chunk)


def _layout(inits) -> Tuple[dict, int]:
    """``(offsets, size)``: where each initializer of at least ``INLINE_BYTES`` goes in the output's
    external data (in model order, each aligned to ``ALIGN``), and the file's size. Known before
    any tensor is hashed: workers write their tensors in place, in any order, same bytes."""
    offsets, pos = {}, 0
    for t in inits:
        if t.data_type == onnx.TensorProto.STRING or _size(t) < INLINE_BYTES:
            continue
        pos += -pos % ALIGN
        offsets[t.name] = pos
        pos += _size(t)
    return offsets, pos


def compress_file(src: Path, staged: Path, options: StreamOptions, *, file_bytes_before: int,
                  progress: Optional[Callable[[int, int, str], None]] = None) -> Tuple[List[Path], Report]:
    """Stream ``src`` into ``staged`` (and ``staged.data``, the external data): the files written and
    the report. The caller stages and commits the files (``files.Outputs``): a failure leaves none."""
    t_start = time.perf_counter()
    model = io.load_graph(src)
    folder = src.parent
    validate.check_tensor_data(model)  # the inline tensors; external ones are checked as they are read
    with _cwd(folder):  # onnx.checker finds external data files from the working folder
        model, input_notes = validate.check_input_model(model)
    nodes_before = _op_counts(model)
    with external_data_in(folder, check_values=False):  # each weight is checked as it is hashed
        scan = scan_layers(model, include_grouped=options.include_depthwise, tables=True)
    t_scan = time.perf_counter() - t_start
    by_weight = {l.weight: l for l in scan.layers}
    inits = list(model.graph.initializer)
    constants = {n.output[0]: a.t for n in model.graph.node if n.op_type == "Constant" and len(n.output) == 1
                 for a in n.attribute if a.name == "value" and a.type == onnx.AttributeProto.TENSOR}
    init_of = {t.name: t for t in inits}
    order = [t.name for t in inits if t.name in by_weight] + [w for w in by_weight if w in constants]

    def proto_of(name):
        return constants.get(name) or init_of[name]

    weight_bits = sum(l.params * 8 * np_dtype(proto_of(l.weight).data_type).itemsize for l in scan.layers)
    params = sum(l.params for l in scan.layers)

    data_path = staged.with_name(staged.name + ".data")
    offsets, size = _layout(inits)
    with open(data_path, "wb") as f:
        f.truncate(size)

    def tasks() -> Iterator[dict]:
        for k, name in enumerate(order):
            t, layer = proto_of(name), by_weight[name]
            external = t.data_location == onnx.TensorProto.EXTERNAL
            yield {"array": None if external else numpy_helper.to_array(t), "folder": str(folder),
                   "proto": _reference(t) if external else None, "data_type": t.data_type,
                   "options": options.hash_options(), "seed": options.seed * 1_000_003 + k,
                   "layer": {"op_type": layer.op_type, "trans_b": layer.trans_b},
                   "target": (str(data_path), offsets[name]) if name in offsets and name not in constants else None}

    rows = []
    results = imap_ordered(_task, tasks(), options.workers, window=WINDOW * options.workers)
    try:
        for k, name in enumerate(order):
            if progress:
                progress(k, len(order), by_weight[name].node)
            hashed, stats = next(results)
            t = proto_of(name)
            if hashed is not None:  # a Constant node's value, or a small tensor: in the model file
                t.CopyFrom(_inline(t, hashed))
            else:
                _set_external(t, data_path.name, offsets[name], _size(t))
            rows.append(_row(by_weight[name], stats))
    finally:
        results.close()
    for t in inits:  # everything else, copied through
        if t.name in by_weight:
            continue
        external = t.data_location == onnx.TensorProto.EXTERNAL
        if t.name not in offsets:
            if external:
                t.CopyFrom(_inline(t, io.read_external(t, folder)))
            continue
        if external:
            entry = io.external_entry(t)
            if entry["length"] is not None and entry["length"] != _size(t):
                raise RedppError(f"tensor {t.name}: its external data has {entry['length']} bytes for shape "
                                 f"{list(t.dims)} ({_size(t)} expected)")
            _copy_at(data_path, offsets[t.name], io.external_file(t, folder), entry["offset"], _size(t), t.name)
        else:
            _write_at(data_path, offsets[t.name], numpy_helper.to_array(t))
        _set_external(t, data_path.name, offsets[t.name], _size(t))
    if progress:
        progress(len(order), len(order), "")
    model.ir_version = io.runtime_ir_version(model)
    with open(staged, "wb") as f:
        f.write(model.SerializeToString())
    for p in (staged, data_path):
        os.chmod(p, io._default_mode())
    files = [staged, data_path]
    total = time.perf_counter() - t_start
    report = _report(src, model, scan, rows, options, nodes_before, params, weight_bits, file_bytes_before,
                     sum(p.stat().st_size for p in files), {"load": t_scan, "stream": total - t_scan, "total": total})
    report.notes[:0] = input_notes
    return files, report


@contextlib.contextmanager
def _cwd(folder: Path):
    old = os.getcwd()
    os.chdir(folder)
    try:
        yield
    finally:
        os.chdir(old)


def _reference(t: onnx.TensorProto) -> onnx.TensorProto:
    """A copy of ``t``'s header (name, type, dims, external data entries), for a worker to read it."""
    ref = onnx.TensorProto(name=t.name, data_type=t.data_type, dims=t.dims, data_location=t.data_location)
    ref.external_data.extend(t.external_data)
    return ref


def _inline(t: onnx.TensorProto, values: np.ndarray) -> onnx.TensorProto:
    out = numpy_helper.from_array(np.asarray(values).reshape(tuple(t.dims)), t.name)
    out.doc_string = t.doc_string
    return out


def _row(layer, stats: dict) -> dict:
    reasons = [stats["reason"]] if stats.get("reason") else []
    return {"name": layer.node, "op_type": layer.op_type, "weight": layer.weight, "shape": list(layer.weight_shape),
            "params": layer.params, "macs": layer.macs, "eligible": True,
            "method": stats["method"], "distinct_before": stats["distinct_before"],
            "distinct_after": stats["distinct_after"], "rel_error": stats["rel_error"],
            "bandwidth": stats.get("bandwidth"), "factor": stats.get("factor"), "modes": stats.get("modes"),
            "u_l": stats.get("u_l"), "output_rel_l2": stats["output_rel_l2"], "seconds": stats["seconds"],
            "reasons": reasons, "hash_reasons": list(reasons)}


def _op_counts(model):
    from .compress import _op_counts as counts

    return counts(model)


def _report(src, model, scan, rows, options, nodes_before, params, weight_bits, bytes_before, bytes_after,
            timings: dict) -> Report:
    from .compress import set_file_bits

    d_before = sum(r["distinct_before"] for r in rows)
    d_after = sum(r["distinct_after"] for r in rows)
    summary = {
        "params_before": params, "params_after": params, "pruning_ratio": 0.0,
        "macs_before": None if any(l.macs is None for l in scan.layers) else sum(l.macs for l in scan.layers),
        "split_additions": None, "eligible_layers": len(scan.layers), "refused_layers": len(scan.refused),
        "distinct_values_before": d_before, "distinct_values_after": d_after,
        "distinct_reduction": (1 - d_after / d_before) if d_before else 0.0,
        "changed_layers": sum(1 for r in rows if r["method"] != "unchanged"), "codebook_layers": 0,
        "file_bytes_before": bytes_before, "file_bytes_after": bytes_after,
        "nodes_before": nodes_before, "nodes_after": _op_counts(model), "storage": {"form": "plain"},
        "weight_bits_before": weight_bits / params if params else 32.0,
        "stream": {"reason": options.reason, "workers": options.workers, "hashing": "kde (per layer)",
                   "weight_error": options.weight_error, "skipped": list(options.skipped)},
    }
    summary["macs_after"] = summary["macs_before"]
    set_file_bits(summary)
    checked = [r for r in rows if r["method"] != "unchanged" and r["output_rel_l2"] is not None]
    worst = max(checked, key=lambda r: r["output_rel_l2"], default=None)
    layerwise = {"layers": len(checked), "inputs": f"{CHECK_ROWS} seeded N(0, 1) rows per layer, at most {CHECK_OUTPUTS} outputs (64 random rows "
                 "of a table)", "max_output_rel_l2": worst["output_rel_l2"] if worst else None,
                 "worst_layer": worst["name"] if worst else None}
    found = (f"layer-wise instead: max relative L2 of one layer's output {worst['output_rel_l2']:.3g} ({worst['name']}; "
             f"{layerwise['inputs']}); the errors of the layers add up through the model") if worst else \
        "no layer was changed"
    verify_info = {"skipped": "the whole model is not run: the streaming path holds a few tensors at a time, and "
                              "onnxruntime sessions of the input and the output hold both models (measured: 4.7 GB for the "
                              "2.07 GB float16 decoder of benchmarks/bench_large.py; streamed because "
                              f"{options.reason}); {found}", "layerwise": layerwise}
    refused = [{"name": r.node, "op_type": r.op_type, "reasons": [r.reason], "eligible": False} for r in scan.refused]
    from .runtime import half_compute_note  # not at import: the hashing workers never load onnxruntime

    notes = [f"streamed tensor by tensor: {options.reason}; eligible weights hashed by the data-free per-layer rule "
             f"(KDE, relative weight error within {options.weight_error:g}; no model run), written in their own type "
             "to the output's external data, one tensor at a time"] + list(options.skipped) + half_compute_note(model)
    return Report(tool={"name": "redpp-onnx", "version": __version__},
                  config={"stream": True, **dataclasses.asdict(options)}, model=summary, layers=rows + refused,
                  verify=verify_info, timings=timings, notes=notes, input=str(src))
