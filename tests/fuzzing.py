"""A fuzzing harness for the ``redpp-onnx`` command line (issue 10).

Seeded mutants of the demo model (``models/digits_cnn.onnx``) and of the exported models of
``tests/zoo/`` (their external ``.data`` files too) are run through ``compress`` (a rotating set
of option variants) and, for a fraction of them, through ``analyze``, ``eval`` and ``bench``.
Each run is a forked child of a parent that has imported the package and its heavy dependencies
once (python + onnx + onnxruntime start-up is about 1 s: too slow for hundreds of runs), with a
time limit. A run is judged on what a user sees and what is left on disk:

- no traceback (an exception escaping ``main`` is printed by the child and counted), no death by
  a signal, no hang (the time limit);
- a non-zero exit prints exactly one line on stderr, ``redpp-onnx: error: ...``, with exit status
  2 (3 for the verification gate); a message saying "please report it" is a bug of ours;
- exit 0 wrote the expected output(s) and onnxruntime loads the model (with the custom-op
  library) unless ``--no-verify`` was given; ``--json`` and ``--report`` give valid JSON;
- nothing else is in the output folder (nothing at all on failure, except the ``--report`` of the
  verification gate), nothing in the child's ``TMPDIR``, and the input model and its external
  data are byte-identical afterwards.

Failures are grouped by a signature (exception type + innermost ``redpp_onnx`` frame, or what
identifies the other classes) so that a fixer sees the distinct bugs, each with one mutant and
argv that reproduce it (``python -m tests.fuzzing show --seed S --index I --dest DIR`` writes
the mutant again and runs it in-process).

The parent never creates an onnxruntime session (thread pools and fork do not mix): the check
that a written model loads runs in the child, after ``main`` returns. ``run_fuzz`` should be
called from a fresh process (``python -m tests.fuzzing run``; ``tests/test_fuzz.py`` and
``benchmarks/fuzz_cli.py`` do that), not from one that has already run models.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import random
import re
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Optional

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "models" / "digits_cnn.onnx"
DIGITS_DATA = ROOT / "models" / "digits_test.npz"
ZOO = ROOT / "tests" / "zoo"

# Cost weights of the base models: the small ones are mutated more often (many cheap runs).
BASE_WEIGHTS = {"digits_cnn.onnx": 6, "conv1d_dynamo.onnx": 3, "conv1d_ts.onnx": 3, "tied_dynamo.onnx": 3,
                "tied_ts.onnx": 3, "lstm_dynamo.onnx": 2, "lstm_ts.onnx": 2, "mlp_dynamo.onnx": 2, "mlp_ts.onnx": 2,
                "unetish_dynamo.onnx": 2, "unetish_ts.onnx": 2, "mobilenetv2ish_dynamo.onnx": 1,
                "mobilenetv2ish_ts.onnx": 1, "encoder_dynamo.onnx": 1, "encoder_ts.onnx": 1}

# compress option variants, rotated over the compress runs ("report.json" lands in the output folder)
COMPRESS_VARIANTS = [
    ("default", []),
    ("split-all", ["--split", "all"]),
    ("portable", ["--split", "all", "--portable"]),
    ("codebook", ["--codebook"]),
    ("steps-hash", ["--steps", "hash"]),
    ("alpha", ["--alpha", "0.3"]),
    ("json", ["--json"]),
    ("report", ["--report", "report.json"]),
    ("gate", ["--max-rel-l2", "0.05", "--report", "report.json", "-q"]),
    ("no-verify", ["--no-verify", "--codebook", "--split", "all", "-q"]),
]
OUTPUT = "out.onnx"
REPORT = "report.json"

# outcome classes: the first three are fine, the others are failures (in priority order: a run
# with several problems is counted under the first)
OK, USER_ERROR, GATE = "ok", "user error (2)", "gate (3)"
FAILURES = ("crash", "hang", "traceback", "internal bug", "bad exit", "unloadable output", "bad report",
            "input changed", "leftover")
CLASSES = (OK, USER_ERROR, GATE) + FAILURES


# --------------------------------------------------------------------------------------- mutants

@dataclasses.dataclass
class Mutant:
    """Files (relative name -> bytes, or None for a folder) of a mutated model, and what was done."""

    base: str
    model_name: str
    files: dict
    mutations: list

    @property
    def description(self) -> str:
        return f"{self.base}: " + "; ".join(self.mutations)

    def write(self, folder: Path) -> Path:
        folder.mkdir(parents=True, exist_ok=True)
        for name, data in self.files.items():
            if data is None:
                (folder / name).mkdir(exist_ok=True)
            else:
                (folder / name).write_bytes(bytes(data))
        return folder / self.model_name


class NotApplicable(Exception):
    """This mutation does not apply to this model (e.g. no external data)."""


@dataclasses.dataclass
class Ctx:
    rng: random.Random
    model: object          # onnx.ModelProto (proto stage)
    files: dict            # name -> bytearray
    model_name: str

    @property
    def data_names(self) -> list:
        return sorted(n for n, d in self.files.items() if n != self.model_name and d is not None)


_BASES: dict = {}


def base_models() -> list:
    return [DEMO] + sorted(ZOO.glob("*.onnx"))


def _base(path: Path):
    """(model file bytes, {data file name: bytes}) of a base model, read once."""
    if path not in _BASES:
        import onnx

        model = onnx.load(str(path), load_external_data=False)
        names = {e.value for t in model.graph.initializer for e in t.external_data if e.key == "location"}
        _BASES[path] = (path.read_bytes(), {n: (path.parent / n).read_bytes() for n in sorted(names)})
    return _BASES[path]


def make_mutant(seed: int, index: int) -> Mutant:
    """The mutant number ``index`` of ``seed``: the same files and description every time."""
    import onnx

    rng = random.Random(f"redpp-fuzz/{seed}/{index}")
    bases = base_models()
    base = rng.choices(bases, weights=[BASE_WEIGHTS.get(p.name, 1) for p in bases])[0]
    model_bytes, data = _base(base)
    for attempt in range(50):
        files = {base.name: bytearray(model_bytes)}
        files.update({n: bytearray(b) for n, b in data.items()})
        ctx = Ctx(rng, onnx.ModelProto.FromString(model_bytes), files, base.name)
        count = 1 if rng.random() < 0.75 else 2
        chosen = [_pick_mutation(rng, bool(data)) for _ in range(count)]
        chosen.sort(key=lambda m: m[1] != "proto")  # proto edits first, then bytes of files
        done = []
        try:
            for name, stage, fn in chosen:
                if stage != "proto" and ctx.model is not None:
                    files[base.name] = bytearray(ctx.model.SerializeToString())
                    ctx.model = None
                done.append(f"{name}({fn(ctx)})")
        except Exception:  # noqa: BLE001 - NotApplicable, or an earlier mutation made this one impossible
            continue
        if ctx.model is not None:
            files[base.name] = bytearray(ctx.model.SerializeToString())
        return Mutant(base.name, base.name, {k: (bytes(v) if v is not None else None) for k, v in files.items()},
                      done)
    raise RuntimeError(f"no mutation applies to {base.name}")


def _pick_mutation(rng: random.Random, external: bool):
    table = [m for m in MUTATIONS if external or not m[3]]
    name, stage, fn, _, weight = rng.choices(table, weights=[m[4] for m in table])[0]
    return name, stage, fn


# ---------------------------------------------------------------- helpers on tensors and nodes

LAYER_OPS = ("Conv", "Gemm", "MatMul", "ConvTranspose", "BatchNormalization")


def _onnx():
    import onnx

    return onnx


def _choice(rng, seq):
    seq = list(seq)
    if not seq:
        raise NotApplicable
    return rng.choice(seq)


def _weight_names(model) -> set:
    return {n.input[i] for n in model.graph.node if n.op_type in LAYER_OPS
            for i in range(1, len(n.input)) if n.input[i]}


def _pick_init(ctx: Ctx, float_only: bool = False, weight_bias: float = 0.75):
    """An initializer, preferably the weight of a Conv/Gemm/MatMul."""
    onnx = _onnx()
    inits = list(ctx.model.graph.initializer)
    if float_only:
        inits = [t for t in inits if t.data_type == onnx.TensorProto.FLOAT]
    weights = _weight_names(ctx.model)
    preferred = [t for t in inits if t.name in weights]
    if preferred and ctx.rng.random() < weight_bias:
        return ctx.rng.choice(preferred)
    return _choice(ctx.rng, inits)


def _ext(t) -> dict:
    return {e.key: e.value for e in t.external_data}


def _get_array(ctx: Ctx, t):
    import numpy as np
    from onnx import helper, numpy_helper

    if t.data_location == _onnx().TensorProto.EXTERNAL:
        info = _ext(t)
        buf = ctx.files.get(info.get("location"))
        if buf is None:
            raise NotApplicable
        off = int(info.get("offset", 0))
        length = int(info.get("length", len(buf) - off))
        arr = np.frombuffer(bytes(buf[off:off + length]), helper.tensor_dtype_to_np_dtype(t.data_type))
        return arr.reshape(tuple(t.dims)).copy()
    return numpy_helper.to_array(t).copy()


def _set_array(ctx: Ctx, t, arr, keep_external: bool = True) -> None:
    from onnx import numpy_helper

    if t.data_location == _onnx().TensorProto.EXTERNAL and keep_external:
        info = _ext(t)
        buf = ctx.files[info["location"]]
        off = int(info.get("offset", 0))
        length = int(info.get("length", len(buf) - off))
        raw = arr.tobytes()
        if len(raw) == length:
            buf[off:off + length] = raw
            return
    new = numpy_helper.from_array(arr, t.name)
    t.CopyFrom(new)


def _pick_node(ctx: Ctx, ops=None, layer_bias: float = 0.6):
    nodes = list(ctx.model.graph.node)
    if ops is not None:
        return _choice(ctx.rng, [n for n in nodes if n.op_type in ops])
    layers = [n for n in nodes if n.op_type in LAYER_OPS]
    if layers and ctx.rng.random() < layer_bias:
        return ctx.rng.choice(layers)
    return _choice(ctx.rng, nodes)


def _graph_inputs(model) -> list:
    inits = {t.name for t in model.graph.initializer}
    return [i for i in model.graph.input if i.name not in inits]


def _dim_value(rng, d: int) -> int:
    return rng.choice([0, 1, d + 1, max(d - 1, 0), 2 * d + 1, 3, -1, 2 ** 31, 2 ** 40])


DTYPES = {"FLOAT16": 10, "DOUBLE": 11, "INT64": 7, "INT32": 6, "INT8": 3, "UINT8": 2, "BFLOAT16": 16, "BOOL": 9,
          "STRING": 8, "UNDEFINED": 0, "99": 99, "COMPLEX64": 14, "FLOAT8E4M3FN": 17, "UINT64": 13}


# --------------------------------------------------------------------------- proto mutations

def m_init_dims(ctx: Ctx) -> str:
    """An initializer's dims changed without its data."""
    t = _pick_init(ctx)
    dims, rng = list(t.dims), ctx.rng
    kind = rng.choice(["set", "set", "set", "drop", "add", "scalar"])
    if kind == "set" and dims:
        i = rng.randrange(len(dims))
        old, dims[i] = dims[i], _dim_value(rng, dims[i])
        what = f"dim {i}: {old} -> {dims[i]}"
    elif kind == "drop" and dims:
        i = rng.randrange(len(dims))
        dims.pop(i)
        what = f"dim {i} dropped"
    elif kind == "add":
        i = rng.randrange(len(dims) + 1)
        dims.insert(i, rng.choice([1, 2]))
        what = f"dim {dims[i]} inserted at {i}"
    else:
        dims = []
        what = "made a scalar"
    del t.dims[:]
    t.dims.extend(dims)
    return f"initializer {t.name!r} {what}"


def m_init_reshape(ctx: Ctx) -> str:
    """An initializer given another shape with the same number of elements (consistent data)."""
    import numpy as np

    t = _pick_init(ctx)
    dims = list(t.dims)
    if len(dims) < 1:
        raise NotApplicable
    rng = ctx.rng
    kind = rng.choice(["reverse", "flatten", "rotate", "split"])
    if kind == "reverse":
        new = dims[::-1]
    elif kind == "flatten":
        new = [int(np.prod(dims))]
    elif kind == "rotate":
        new = dims[1:] + dims[:1]
    else:
        new = dims[:1] + [1] + dims[1:]
    if new == dims:
        raise NotApplicable
    del t.dims[:]
    t.dims.extend(new)
    return f"initializer {t.name!r} dims {dims} -> {new}"


def m_init_zero_size(ctx: Ctx) -> str:
    """An initializer with a zero-size dimension (and no data: consistent)."""
    from onnx import numpy_helper

    t = _pick_init(ctx, float_only=True)
    arr = _get_array(ctx, t)
    if arr.ndim == 0:
        raise NotApplicable
    i = ctx.rng.randrange(arr.ndim)
    shape = list(arr.shape)
    shape[i] = 0
    t.CopyFrom(numpy_helper.from_array(arr.reshape(-1)[:0].reshape(shape), t.name))
    return f"initializer {t.name!r} shape {list(arr.shape)} -> {shape} (empty)"


def m_input_zero_dim(ctx: Ctx) -> str:
    """A graph input with a zero-size dimension."""
    vi = _choice(ctx.rng, _graph_inputs(ctx.model))
    dims = vi.type.tensor_type.shape.dim
    if not len(dims):
        raise NotApplicable
    i = ctx.rng.randrange(len(dims))
    dims[i].Clear()
    dims[i].dim_value = 0
    return f"input {vi.name!r} dim {i} -> 0"


def m_init_dtype(ctx: Ctx) -> str:
    """An initializer's data type changed: its bytes kept (inconsistent) or converted."""
    import numpy as np

    t = _pick_init(ctx)
    old = t.data_type
    if ctx.rng.random() < 0.5 and old == _onnx().TensorProto.FLOAT:
        target = ctx.rng.choice([np.float16, np.float64, np.int64, np.int8, np.int32])
        arr = _get_array(ctx, t)
        with np.errstate(all="ignore"):
            _set_array(ctx, t, arr.astype(target), keep_external=False)
        return f"initializer {t.name!r} converted to {np.dtype(target).name}"
    name = ctx.rng.choice(list(DTYPES))
    t.data_type = DTYPES[name]
    return f"initializer {t.name!r} data_type {old} -> {name} (bytes kept)"


SPECIAL = ["nan", "all-nan", "inf", "-inf", "huge", "denormal", "zeros", "constant", "one-nonzero", "1e30-scale",
           "neg-zero", "integers"]


def m_init_values(ctx: Ctx) -> str:
    """NaN, Inf, huge, denormal, all-zero or constant weights."""
    import numpy as np

    t = _pick_init(ctx, float_only=True, weight_bias=0.9)
    arr = _get_array(ctx, t).astype(np.float32)
    if arr.size == 0:
        raise NotApplicable
    kind = ctx.rng.choice(SPECIAL)
    flat = arr.reshape(-1)
    k = ctx.rng.randrange(flat.size)
    with np.errstate(all="ignore"):
        if kind == "nan":
            flat[k] = np.nan
        elif kind == "all-nan":
            flat[:] = np.nan
        elif kind == "inf":
            flat[k] = np.inf
        elif kind == "-inf":
            flat[:: max(1, flat.size // 7)] = -np.inf
        elif kind == "huge":
            flat[k] = 3.0e38
        elif kind == "denormal":
            flat[:] = 1e-45
        elif kind == "zeros":
            flat[:] = 0
        elif kind == "constant":
            flat[:] = 0.5
        elif kind == "one-nonzero":
            flat[:] = 0
            flat[k] = 1.0
        elif kind == "1e30-scale":
            flat *= np.float32(1e30)
        elif kind == "neg-zero":
            flat[:] = -0.0
        else:
            flat[:] = np.round(flat * 4)
    _set_array(ctx, t, flat.reshape(arr.shape))
    return f"initializer {t.name!r} values: {kind}"


def m_init_duplicate_rows(ctx: Ctx) -> str:
    """Identical output channels / kernels in a weight (valid: exercises merge and split)."""
    import numpy as np

    t = _pick_init(ctx, float_only=True, weight_bias=1.0)
    arr = _get_array(ctx, t)
    if arr.ndim < 1 or arr.shape[0] < 2:
        raise NotApplicable
    rng = ctx.rng
    kind = rng.choice(["rows", "all-rows", "kernels", "zero-rows"])
    if kind == "rows":
        arr[1:1 + rng.randrange(1, arr.shape[0])] = arr[0]
    elif kind == "all-rows":
        arr[:] = arr[0]
    elif kind == "kernels" and arr.ndim >= 3:
        arr[:, 1:] = arr[:, :1]
    else:
        arr[: rng.randrange(1, arr.shape[0] + 1)] = 0
    _set_array(ctx, t, np.ascontiguousarray(arr))
    return f"initializer {t.name!r}: {kind} made identical"


def m_init_drop(ctx: Ctx) -> str:
    t = _pick_init(ctx)
    inits = ctx.model.graph.initializer
    inits.remove(t)
    return f"initializer {t.name!r} dropped"


def m_init_dup(ctx: Ctx) -> str:
    """An initializer twice (same name), the copy maybe different."""
    import numpy as np
    from onnx import numpy_helper

    t = _pick_init(ctx)
    kind = ctx.rng.choice(["same", "zeros", "other-shape"])
    copy = ctx.model.graph.initializer.add()
    copy.CopyFrom(t)
    if kind != "same" and t.data_type == _onnx().TensorProto.FLOAT:
        arr = _get_array(ctx, t)
        new = np.zeros(arr.shape if kind == "zeros" else (3,) + arr.shape[1:], np.float32)
        copy.CopyFrom(numpy_helper.from_array(new, t.name))
    else:
        kind = "same"
    return f"initializer {t.name!r} duplicated ({kind})"


def m_init_to_input(ctx: Ctx) -> str:
    """An initializer also listed as a graph input, or turned into one (a computed weight)."""
    from onnx import helper

    t = _pick_init(ctx)
    vi = helper.make_tensor_value_info(t.name, t.data_type or 1, list(t.dims))
    if ctx.rng.random() < 0.5:
        ctx.model.graph.input.append(vi)
        return f"initializer {t.name!r} also a graph input"
    ctx.model.graph.initializer.remove(t)
    ctx.model.graph.input.append(vi)
    return f"initializer {t.name!r} replaced by a graph input"


def m_init_to_constant(ctx: Ctx) -> str:
    """An initializer given by a Constant node instead (valid), maybe placed after its consumers."""
    from onnx import helper

    t = _pick_init(ctx)
    value = type(t)()
    value.CopyFrom(t)
    if value.data_location == _onnx().TensorProto.EXTERNAL:
        _set_array(ctx, value, _get_array(ctx, t), keep_external=False)
    value.name = ""
    node = helper.make_node("Constant", [], [t.name], value=value, name=f"fuzz_const_{t.name}")
    ctx.model.graph.initializer.remove(t)
    at_end = ctx.rng.random() < 0.3
    nodes = ctx.model.graph.node
    if at_end:
        nodes.append(node)
    else:
        nodes.insert(0, node)
    return f"initializer {t.name!r} -> Constant node ({'last' if at_end else 'first'})"


def m_init_storage(ctx: Ctx) -> str:
    """How a tensor's bytes are stored: typed field, raw and typed both, raw too short or too long."""
    import numpy as np

    t = _pick_init(ctx, float_only=True)
    arr = _get_array(ctx, t).astype(np.float32)
    kind = ctx.rng.choice(["float_data", "both", "raw-short", "raw-long", "internalised"])
    t.data_location = _onnx().TensorProto.DEFAULT
    del t.external_data[:]
    if kind == "float_data":
        t.ClearField("raw_data")
        del t.float_data[:]
        t.float_data.extend(arr.reshape(-1).tolist())
    elif kind == "both":
        t.raw_data = arr.tobytes()
        del t.float_data[:]
        t.float_data.extend(arr.reshape(-1).tolist()[:5] or [1.0])
    elif kind == "raw-short":
        del t.float_data[:]
        t.raw_data = arr.tobytes()[: max(0, arr.nbytes - 4 * ctx.rng.randrange(1, 8))]
    elif kind == "raw-long":
        del t.float_data[:]
        t.raw_data = arr.tobytes() + b"\0" * 4 * ctx.rng.randrange(1, 8)
    else:
        del t.float_data[:]
        t.raw_data = arr.tobytes()
    return f"initializer {t.name!r} storage: {kind}"


def m_sparse_init(ctx: Ctx) -> str:
    """An initializer moved to sparse_initializer."""
    import numpy as np
    from onnx import helper, numpy_helper

    t = _pick_init(ctx, float_only=True)
    arr = _get_array(ctx, t).astype(np.float32)
    flat = arr.reshape(-1)
    idx = np.nonzero(flat)[0].astype(np.int64)
    values = numpy_helper.from_array(flat[idx], t.name)
    indices = numpy_helper.from_array(idx, t.name + "_indices")
    sparse = helper.make_sparse_tensor(values, indices, list(arr.shape))
    ctx.model.graph.initializer.remove(t)
    ctx.model.graph.sparse_initializer.append(sparse)
    return f"initializer {t.name!r} -> sparse_initializer"


def m_input_dims(ctx: Ctx) -> str:
    """A graph input's shape changed (dims, symbolic names, no shape, rank)."""
    vi = _choice(ctx.rng, _graph_inputs(ctx.model))
    tt = vi.type.tensor_type
    rng, dims = ctx.rng, tt.shape.dim
    kind = rng.choice(["value", "value", "param", "no-shape", "drop-dim", "add-dim", "unset"])
    if kind in ("value", "param", "unset", "drop-dim") and not len(dims):
        kind = "add-dim"
    if kind == "value":
        i = rng.randrange(len(dims))
        d = dims[i].dim_value or 2
        dims[i].Clear()
        dims[i].dim_value = _dim_value(rng, d)
        what = f"dim {i} -> {dims[i].dim_value}"
    elif kind == "param":
        i = rng.randrange(len(dims))
        dims[i].Clear()
        dims[i].dim_param = rng.choice(["N", "foo", "H", "batch size"])
        what = f"dim {i} -> {dims[i].dim_param!r}"
    elif kind == "unset":
        i = rng.randrange(len(dims))
        dims[i].Clear()
        what = f"dim {i} unset"
    elif kind == "no-shape":
        tt.ClearField("shape")
        what = "shape removed"
    elif kind == "drop-dim":
        i = rng.randrange(len(dims))
        del dims[i]
        what = f"dim {i} dropped"
    else:
        dims.add().dim_value = rng.choice([1, 2, 5])
        what = "dim appended"
    return f"input {vi.name!r} {what}"


def m_input_dtype(ctx: Ctx) -> str:
    """A graph input's element type changed, or its type made a sequence / left empty."""
    vi = _choice(ctx.rng, _graph_inputs(ctx.model))
    kind = ctx.rng.choice(list(DTYPES) + ["sequence", "no-type"])
    if kind == "sequence":
        elem = type(vi.type)()
        elem.CopyFrom(vi.type)
        vi.type.ClearField("tensor_type")
        vi.type.sequence_type.elem_type.CopyFrom(elem)
    elif kind == "no-type":
        vi.ClearField("type")
    else:
        vi.type.tensor_type.elem_type = DTYPES[kind]
    return f"input {vi.name!r} type -> {kind}"


def m_drop_input(ctx: Ctx) -> str:
    inputs = _graph_inputs(ctx.model)
    if ctx.rng.random() < 0.2:
        for vi in inputs:
            ctx.model.graph.input.remove(vi)
        return "every graph input dropped"
    vi = _choice(ctx.rng, inputs)
    ctx.model.graph.input.remove(vi)
    return f"input {vi.name!r} dropped"


def m_outputs(ctx: Ctx) -> str:
    """Graph outputs dropped, renamed to nothing, duplicated, untyped, or made an initializer/input."""
    g, rng = ctx.model.graph, ctx.rng
    out = _choice(rng, g.output)
    kind = rng.choice(["drop", "dangling", "duplicate", "no-type", "elem-type", "initializer", "input", "no-shape"])
    if kind == "drop":
        g.output.remove(out)
    elif kind == "dangling":
        out.name = "fuzz_nowhere"
    elif kind == "duplicate":
        g.output.add().CopyFrom(out)
    elif kind == "no-type":
        out.ClearField("type")
    elif kind == "elem-type":
        out.type.tensor_type.elem_type = DTYPES[rng.choice(list(DTYPES))]
    elif kind == "no-shape":
        out.type.tensor_type.ClearField("shape")
    elif kind == "initializer":
        t = _pick_init(ctx)
        out.name = t.name
    else:
        out.name = _choice(rng, _graph_inputs(ctx.model)).name
    return f"output {out.name!r}: {kind}"


def _random_attr_value(rng, attr):
    from onnx import AttributeProto

    if attr.type == AttributeProto.INT:
        return "i", rng.choice([0, 1, -1, 2, 3, 7, 2 ** 31, -(2 ** 40)])
    if attr.type == AttributeProto.INTS:
        n = len(attr.ints)
        kind = rng.choice(["values", "length", "empty"])
        if kind == "values":
            return "ints", [rng.choice([0, 1, 2, 3, -1, 100]) for _ in range(n or 1)]
        if kind == "length":
            return "ints", list(attr.ints) + [1] * rng.randrange(1, 3)
        return "ints", []
    if attr.type == AttributeProto.FLOAT:
        return "f", rng.choice([0.0, -1.0, 2.0, float("nan"), float("inf"), 1e-30])
    if attr.type == AttributeProto.FLOATS:
        return "floats", [rng.choice([0.0, float("nan"), 1.0])] * max(1, len(attr.floats))
    if attr.type == AttributeProto.STRING:
        return "s", rng.choice([b"", b"foo", b"SAME_UPPER", b"VALID", b"NOTSET", b"\xff\xfe"])
    return None, None


def m_attr(ctx: Ctx) -> str:
    """A node attribute changed in value or type, dropped, or an unknown one added."""
    from onnx import AttributeProto, helper

    rng = ctx.rng
    nodes = [n for n in ctx.model.graph.node if n.attribute]
    if rng.random() < 0.6:
        nodes = [n for n in nodes if n.op_type in LAYER_OPS] or nodes
    node = _choice(rng, nodes)
    attr = rng.choice(list(node.attribute))
    kind = rng.choice(["value", "value", "value", "drop", "type", "unknown"])
    if kind == "value":
        field, value = _random_attr_value(rng, attr)
        if field is None:
            raise NotApplicable
        new = helper.make_attribute(attr.name, value) if field not in ("ints", "floats") or value else None
        if new is None:
            attr.ClearField(field)
            return f"{node.op_type} {node.name!r} attribute {attr.name} emptied"
        if new.type != attr.type:  # e.g. a list of floats of one element given for ints
            new.type = attr.type
        attr.CopyFrom(new)
        return f"{node.op_type} {node.name!r} attribute {attr.name} -> {value!r}"
    if kind == "drop":
        node.attribute.remove(attr)
        return f"{node.op_type} {node.name!r} attribute {attr.name} dropped"
    if kind == "type":
        new = rng.choice([helper.make_attribute(attr.name, 1.5), helper.make_attribute(attr.name, "x"),
                          helper.make_attribute(attr.name, [1, 2]), helper.make_attribute(attr.name, 3)])
        attr.CopyFrom(new)
        kind = AttributeProto.AttributeType.Name(new.type)
        return f"{node.op_type} {node.name!r} attribute {attr.name} -> type {kind}"
    node.attribute.append(helper.make_attribute(rng.choice(["fuzz", "group", "axis", "transB", "pads"]), 2))
    return f"{node.op_type} {node.name!r} attribute {node.attribute[-1].name}=2 added"


def m_layer_attr(ctx: Ctx) -> str:
    """Targeted attributes of Conv / ConvTranspose / Gemm (group, pads, strides, trans, alpha...)."""
    from onnx import helper

    rng = ctx.rng
    node = _pick_node(ctx, ops=("Conv", "ConvTranspose", "Gemm"))
    attrs = {a.name: a for a in node.attribute}
    if node.op_type == "Gemm":
        name = rng.choice(["transA", "transB", "alpha", "beta"])
        if name.startswith("trans"):
            value = 1 - (attrs[name].i if name in attrs else 0)
        else:
            value = rng.choice([0.0, -1.0, 2.0, float("nan"), float("inf")])
    else:
        name = rng.choice(["group", "group", "pads", "strides", "dilations", "kernel_shape", "auto_pad"])
        k = len(attrs["kernel_shape"].ints) if "kernel_shape" in attrs else 2
        value = {"group": rng.choice([0, -1, 2, 3, 4, 8, 16, 64]),
                 "pads": rng.choice([[1] * k, [0] * (2 * k + 1), [5] * (2 * k), [-1] * (2 * k)]),
                 "strides": rng.choice([[0] * k, [2] * k, [1] * (k + 1), [100] * k]),
                 "dilations": rng.choice([[2] * k, [0] * k, [50] * k]),
                 "kernel_shape": rng.choice([[1] * k, [5] * k, [3] * (k + 1)]),
                 "auto_pad": rng.choice(["SAME_UPPER", "SAME_LOWER", "VALID", "garbage"])}[name]
    if name in attrs:
        node.attribute.remove(attrs[name])
    node.attribute.append(helper.make_attribute(name, value))
    return f"{node.op_type} {node.name!r} {name}={value!r}"


OP_TYPES = ["Conv", "Gemm", "MatMul", "Add", "Relu", "Identity", "BatchNormalization", "ConvTranspose",
            "FuzzOp", "Reshape", "Mul", "SplitConv", "Flatten", "MaxPool", "LSTM", "Sum"]


def m_op_type(ctx: Ctx) -> str:
    """A node's op type or domain changed."""
    node = _pick_node(ctx)
    old = f"{node.domain}::{node.op_type}" if node.domain else node.op_type
    if ctx.rng.random() < 0.25:
        node.domain = ctx.rng.choice(["ai.redpp", "com.microsoft", "fuzz.domain", "ai.onnx.ml"])
    else:
        node.op_type = ctx.rng.choice([o for o in OP_TYPES if o != node.op_type])
    new = f"{node.domain}::{node.op_type}" if node.domain else node.op_type
    return f"node {node.name!r} {old} -> {new}"


def m_edges(ctx: Ctx) -> str:
    """Renamed or dangling edges: an input to nowhere, a renamed output, a self-loop, two producers."""
    rng = ctx.rng
    node = _pick_node(ctx)
    kind = rng.choice(["dangling-input", "rename-output", "self-loop", "two-producers", "empty-input",
                       "input-is-graph-input"])
    if kind in ("dangling-input", "self-loop", "empty-input", "input-is-graph-input") and not len(node.input):
        kind = "rename-output"
    if kind == "dangling-input":
        i = rng.randrange(len(node.input))
        node.input[i] = "fuzz_dangling"
    elif kind == "rename-output":
        node.output[0] = "fuzz_renamed"
    elif kind == "self-loop":
        node.input[rng.randrange(len(node.input))] = node.output[0]
    elif kind == "two-producers":
        other = _choice(rng, [n for n in ctx.model.graph.node if n is not node])
        other.output[0] = node.output[0]
    elif kind == "empty-input":
        node.input[rng.randrange(len(node.input))] = ""
    else:
        node.input[rng.randrange(len(node.input))] = _choice(rng, _graph_inputs(ctx.model)).name
    return f"{node.op_type} {node.name!r}: {kind}"


def m_node_inputs(ctx: Ctx) -> str:
    """A layer's inputs swapped, one dropped, or an extra one appended."""
    rng = ctx.rng
    node = _pick_node(ctx, layer_bias=0.9)
    kind = rng.choice(["swap", "drop-last", "drop-weight", "extra"])
    if kind == "swap" and len(node.input) >= 2:
        node.input[0], node.input[1] = node.input[1], node.input[0]
    elif kind == "drop-weight" and len(node.input) >= 2:
        del node.input[1]
    elif kind in ("drop-last", "swap", "drop-weight") and len(node.input):
        kind = "drop-last"
        del node.input[len(node.input) - 1]
    else:
        kind = "extra"
        node.input.append(node.input[-1] if len(node.input) else "fuzz_extra")
    return f"{node.op_type} {node.name!r} inputs: {kind}"


def m_nodes(ctx: Ctx) -> str:
    """A node dropped or duplicated, the node order broken, or the graph emptied."""
    rng, g = ctx.rng, ctx.model.graph
    kind = rng.choice(["drop", "drop", "duplicate", "reverse", "shuffle", "empty", "drop-layer"])
    if kind == "drop":
        node = _pick_node(ctx, layer_bias=0.3)
        g.node.remove(node)
        return f"node {node.op_type} {node.name!r} dropped"
    if kind == "drop-layer":
        node = _pick_node(ctx, layer_bias=1.0)
        g.node.remove(node)
        return f"layer {node.op_type} {node.name!r} dropped"
    if kind == "duplicate":
        node = _pick_node(ctx)
        g.node.add().CopyFrom(node)
        return f"node {node.op_type} {node.name!r} duplicated"
    nodes = list(g.node)
    if kind == "reverse":
        nodes.reverse()
    elif kind == "shuffle":
        rng.shuffle(nodes)
    else:
        nodes = []
    copies = [type(n)() for n in nodes]
    for c, n in zip(copies, nodes):
        c.CopyFrom(n)
    del g.node[:]
    g.node.extend(copies)
    return f"nodes: {kind}"


def m_opset(ctx: Ctx) -> str:
    """The default opset version changed or removed, duplicated, or another domain added."""
    from onnx import helper

    rng, m = ctx.rng, ctx.model
    kind = rng.choice(["version", "version", "version", "remove", "duplicate", "domain"])
    default = [o for o in m.opset_import if o.domain in ("", "ai.onnx")]
    if kind == "version" and default:
        v = rng.choice([0, 1, 6, 7, 9, 10, 11, 13, 16, 18, 19, 21, 22, 23, 24, 26, 30, 99, -1])
        default[0].version = v
        return f"default opset -> {v}"
    if kind == "remove" and default:
        m.opset_import.remove(default[0])
        return "default opset removed"
    if kind == "duplicate" and default:
        m.opset_import.append(helper.make_opsetid("", rng.choice([11, 13, 17])))
        return "default opset listed twice"
    domain = rng.choice(["ai.redpp", "com.microsoft", "fuzz.domain"])
    m.opset_import.append(helper.make_opsetid(domain, rng.choice([1, 2, 99])))
    return f"opset of {domain} added"


def m_ir(ctx: Ctx) -> str:
    v = ctx.rng.choice([0, 1, 2, 3, 4, 5, 6, 7, 9, 10, 11, 12, 13, 14, 15, 100, -1])
    old = ctx.model.ir_version
    ctx.model.ir_version = v
    return f"ir_version {old} -> {v}"


def m_value_info(ctx: Ctx) -> str:
    """value_info stripped, or a wrong shape / type declared for an intermediate tensor."""
    from onnx import helper

    rng, g = ctx.rng, ctx.model.graph
    kind = rng.choice(["strip", "wrong-shape", "wrong-type"])
    if kind == "strip":
        del g.value_info[:]
        for o in g.output:
            o.type.tensor_type.ClearField("shape")
        return "value_info and output shapes stripped"
    node = _pick_node(ctx)
    name = node.output[0] if len(node.output) else None
    if not name:
        raise NotApplicable
    for vi in list(g.value_info):
        if vi.name == name:
            g.value_info.remove(vi)
    if kind == "wrong-shape":
        g.value_info.append(helper.make_tensor_value_info(name, 1, [rng.choice([1, 3, 0]), 5, 7]))
    else:
        g.value_info.append(helper.make_tensor_value_info(name, rng.choice([7, 10, 11]), None))
    return f"value_info of {name!r}: {kind}"


def m_names(ctx: Ctx) -> str:
    """Node names duplicated or emptied, or a tensor renamed everywhere to an odd name."""
    rng, g = ctx.rng, ctx.model.graph
    kind = rng.choice(["same-node-names", "empty-node-names", "odd-tensor-name"])
    if kind == "same-node-names":
        for n in g.node:
            n.name = "same"
        return "every node named 'same'"
    if kind == "empty-node-names":
        for n in g.node:
            n.name = ""
        return "node names emptied"
    t = _pick_init(ctx)
    new = rng.choice(["../../x", "a b/c", "w\u00e9ight\u2603", "", "x" * 300, "out.onnx", "input"])
    old = t.name
    for n in g.node:
        for i, name in enumerate(n.input):
            if name == old:
                n.input[i] = new
    for vi in g.input:
        if vi.name == old:
            vi.name = new
    t.name = new
    return f"tensor {old!r} renamed {new[:20]!r}"


def m_external_ref(ctx: Ctx) -> str:
    """An external tensor's reference broken: location, offset, length, keys."""
    rng = ctx.rng
    ext = [t for t in ctx.model.graph.initializer if t.data_location == _onnx().TensorProto.EXTERNAL]
    t = _choice(rng, ext)
    info = _ext(t)
    kind = rng.choice(["missing-file", "parent-dir", "absolute", "folder", "model-file", "offset-past-end",
                       "length-past-end", "negative-offset", "not-a-number", "no-location", "no-external-data",
                       "misaligned-offset"])
    size = len(ctx.files.get(info.get("location"), b""))
    values = {"missing-file": ("location", "missing.data"), "parent-dir": ("location", "../outside.data"),
              "absolute": ("location", "/nonexistent/fuzz.data"), "folder": ("location", "."),
              "model-file": ("location", ctx.model_name), "offset-past-end": ("offset", str(size + 4096)),
              "length-past-end": ("length", str(size * 2 + 4)), "negative-offset": ("offset", "-16"),
              "not-a-number": ("length", "abc"), "misaligned-offset": ("offset", str(int(info.get("offset", 0)) + 1))}
    if kind == "no-location":
        for e in list(t.external_data):
            if e.key == "location":
                t.external_data.remove(e)
    elif kind == "no-external-data":
        del t.external_data[:]
    else:
        key, value = values[kind]
        for e in t.external_data:
            if e.key == key:
                e.value = value
                break
        else:
            e = t.external_data.add()
            e.key, e.value = key, value
    return f"external tensor {t.name!r}: {kind}"


# ------------------------------------------------ valid mutations (reach the passes, not the checks)

def _const_weight(ctx: Ctx, node, i: int = 1):
    """The float initializer read by ``node.input[i]``, or NotApplicable."""
    if len(node.input) <= i:
        raise NotApplicable
    for t in ctx.model.graph.initializer:
        if t.name == node.input[i] and t.data_type == _onnx().TensorProto.FLOAT:
            return t
    raise NotApplicable


def v_conv_group(ctx: Ctx) -> str:
    """A Conv made grouped (or depthwise) with a weight sliced to fit: a valid model."""
    import numpy as np

    node = _pick_node(ctx, ops=("Conv",))
    t = _const_weight(ctx, node)
    w = _get_array(ctx, t)
    attrs = {a.name: a for a in node.attribute}
    if w.ndim < 3 or ("group" in attrs and attrs["group"].i != 1):
        raise NotApplicable
    o, c = w.shape[:2]
    groups = [g for g in range(2, min(o, c) + 1) if o % g == 0 and c % g == 0]
    g = _choice(ctx.rng, groups[-1:] + groups[:3])
    _set_array(ctx, t, np.ascontiguousarray(w[:, : c // g]), keep_external=False)
    if "group" in attrs:
        node.attribute.remove(attrs["group"])
    from onnx import helper

    node.attribute.append(helper.make_attribute("group", g))
    return f"Conv {node.name!r} group={g} (weight {list(w.shape)} -> {[o, c // g] + list(w.shape[2:])})"


def v_gemm_trans(ctx: Ctx) -> str:
    """A Gemm's transB flipped and its weight transposed to match: the same function."""
    import numpy as np
    from onnx import helper

    node = _pick_node(ctx, ops=("Gemm",))
    t = _const_weight(ctx, node)
    if sum(n.input.count(t.name) for n in ctx.model.graph.node) != 1:
        raise NotApplicable
    attrs = {a.name: a for a in node.attribute}
    trans = attrs["transB"].i if "transB" in attrs else 0
    _set_array(ctx, t, np.ascontiguousarray(_get_array(ctx, t).T), keep_external=False)
    if "transB" in attrs:
        node.attribute.remove(attrs["transB"])
    node.attribute.append(helper.make_attribute("transB", 1 - trans))
    return f"Gemm {node.name!r} transB {trans} -> {1 - trans}, weight transposed"


def v_gemm_to_matmul(ctx: Ctx) -> str:
    """A Gemm (alpha = beta = 1, transA 0) rewritten as MatMul (+ Add): the same function."""
    import numpy as np
    from onnx import helper

    node = _pick_node(ctx, ops=("Gemm",))
    t = _const_weight(ctx, node)
    attrs = {a.name: a for a in node.attribute}
    if any(attrs[k].f != 1.0 for k in ("alpha", "beta") if k in attrs) or ("transA" in attrs and attrs["transA"].i):
        raise NotApplicable
    if sum(n.input.count(t.name) for n in ctx.model.graph.node) != 1:
        raise NotApplicable
    if "transB" in attrs and attrs["transB"].i:
        _set_array(ctx, t, np.ascontiguousarray(_get_array(ctx, t).T), keep_external=False)
    nodes = ctx.model.graph.node
    at = list(nodes).index(node)
    out = node.output[0]
    new = [helper.make_node("MatMul", [node.input[0], t.name], [out + "_mm" if len(node.input) > 2 else out],
                            name=node.name + "_mm")]
    if len(node.input) > 2 and node.input[2]:
        new.append(helper.make_node("Add", [out + "_mm", node.input[2]], [out], name=node.name + "_add"))
    else:
        new[0].output[0] = out
    nodes.remove(node)
    for k, n in enumerate(new):
        nodes.insert(at + k, n)
    return f"Gemm {node.name!r} -> MatMul" + (" + Add" if len(new) > 1 else "")


def v_drop_bias(ctx: Ctx) -> str:
    """A Conv/Gemm without its (optional) bias."""
    node = _pick_node(ctx, ops=("Conv", "Gemm", "ConvTranspose"))
    if len(node.input) < 3:
        raise NotApplicable
    del node.input[2]
    return f"{node.op_type} {node.name!r} bias input removed"


def v_identity_alias(ctx: Ctx) -> str:
    """A layer's weight read through Identity node(s), as the TorchScript exporter does."""
    from onnx import helper

    node = _pick_node(ctx, ops=("Conv", "Gemm", "MatMul", "ConvTranspose"))
    i = ctx.rng.choice([k for k in range(1, len(node.input)) if node.input[k]] or [0])
    if i == 0:
        raise NotApplicable
    depth = ctx.rng.choice([1, 1, 2])
    src = node.input[i]
    for k in range(depth):
        alias = f"fuzz_alias_{k}_{src}"
        ctx.model.graph.node.insert(0, helper.make_node("Identity", [src], [alias], name=f"fuzz_identity_{k}_{src}"))
        src = alias
    node.input[i] = src
    return f"{node.op_type} {node.name!r} input {i} read through {depth} Identity node(s)"


def v_share_weight(ctx: Ctx) -> str:
    """Two layers with equal weight shapes made to share one initializer (tied weights)."""
    by_shape = {}
    for n in ctx.model.graph.node:
        if n.op_type in ("Conv", "Gemm", "MatMul") and len(n.input) > 1:
            for t in ctx.model.graph.initializer:
                if t.name == n.input[1]:
                    by_shape.setdefault((n.op_type, tuple(t.dims)), []).append(n)
    pairs = [v for v in by_shape.values() if len({n.input[1] for n in v}) > 1]
    nodes = _choice(ctx.rng, pairs)
    a, b = ctx.rng.sample(nodes, 2)
    if a.input[1] == b.input[1]:
        raise NotApplicable
    b.input[1] = a.input[1]
    return f"{b.op_type} {b.name!r} shares the weight of {a.name!r}"


def v_scale_weights(ctx: Ctx) -> str:
    """Every float weight of the layers scaled (tiny, huge, negated)."""
    import numpy as np

    factor = ctx.rng.choice([1e-6, 1e-3, 1e3, 1e6, -1.0])
    names = _weight_names(ctx.model)
    done = 0
    for t in ctx.model.graph.initializer:
        if t.name in names and t.data_type == _onnx().TensorProto.FLOAT:
            _set_array(ctx, t, (_get_array(ctx, t) * np.float32(factor)).astype(np.float32))
            done += 1
    if not done:
        raise NotApplicable
    return f"{done} weights scaled by {factor:g}"


def v_dynamic_input(ctx: Ctx) -> str:
    """Graph input dims made symbolic (or fixed: batch 1/3)."""
    vi = _choice(ctx.rng, _graph_inputs(ctx.model))
    dims = vi.type.tensor_type.shape.dim
    if not len(dims):
        raise NotApplicable
    kind = ctx.rng.choice(["all-symbolic", "batch-fixed", "spatial-symbolic"])
    for i, d in enumerate(dims):
        if kind == "all-symbolic" or (kind == "spatial-symbolic" and i >= 2):
            d.Clear()
            d.dim_param = f"d{i}"
        elif kind == "batch-fixed" and i == 0:
            d.Clear()
            d.dim_value = ctx.rng.choice([1, 3])
    return f"input {vi.name!r}: {kind}"


def v_conv_geometry(ctx: Ctx) -> str:
    """A Conv's strides, dilations or pads changed to other valid values."""
    from onnx import helper

    node = _pick_node(ctx, ops=("Conv",))
    t = _const_weight(ctx, node)
    k = len(t.dims) - 2
    if k < 1:
        raise NotApplicable
    name = ctx.rng.choice(["strides", "dilations", "pads"])
    value = {"strides": [2] * k, "dilations": [2] * k, "pads": [0] * (2 * k)}[name]
    for a in list(node.attribute):
        if a.name in (name, "auto_pad"):
            node.attribute.remove(a)
    node.attribute.append(helper.make_attribute(name, value))
    return f"Conv {node.name!r} {name}={value}"


def v_opset(ctx: Ctx) -> str:
    """The default opset moved to another version the ops exist in."""
    default = [o for o in ctx.model.opset_import if o.domain in ("", "ai.onnx")]
    if not default:
        raise NotApplicable
    old = default[0].version
    default[0].version = ctx.rng.choice([13, 14, 15, 17, 18, 19, 20, 21])
    return f"default opset {old} -> {default[0].version}"


# ---------------------------------------------------------------------------- file mutations

def f_flip_bytes(ctx: Ctx) -> str:
    buf = ctx.files[ctx.model_name]
    k = ctx.rng.choice([1, 1, 2, 4, 8, 32])
    for _ in range(k):
        buf[ctx.rng.randrange(len(buf))] ^= ctx.rng.randrange(1, 256)
    return f"{k} byte(s) of the model file flipped"


def f_truncate(ctx: Ctx) -> str:
    buf = ctx.files[ctx.model_name]
    n = ctx.rng.choice([0, 1, 7, ctx.rng.randrange(len(buf)), len(buf) // 2, len(buf) - 1])
    del buf[n:]
    return f"model file truncated to {n} bytes"


def f_garbage(ctx: Ctx) -> str:
    kind = ctx.rng.choice(["random", "text", "npz", "data-file", "append"])
    buf = ctx.files[ctx.model_name]
    if kind == "random":
        ctx.files[ctx.model_name] = bytearray(ctx.rng.randbytes(ctx.rng.choice([1, 100, 5000])))
    elif kind == "text":
        ctx.files[ctx.model_name] = bytearray(b"this is not an ONNX model\n")
    elif kind == "npz":
        ctx.files[ctx.model_name] = bytearray(DIGITS_DATA.read_bytes()[:20000])
    elif kind == "data-file" and ctx.data_names:
        ctx.files[ctx.model_name] = bytearray(ctx.files[ctx.data_names[0]])
    else:
        kind = "append"
        buf.extend(ctx.rng.randbytes(ctx.rng.choice([1, 16, 1000])))
    return f"model file: {kind}"


def d_data_file(ctx: Ctx) -> str:
    """The external data file truncated, emptied, removed, extended, flipped or made a folder."""
    rng = ctx.rng
    name = _choice(rng, ctx.data_names)
    buf = ctx.files[name]
    kind = rng.choice(["truncate", "truncate", "truncate", "empty", "remove", "extend", "flip", "folder"])
    if kind == "truncate":
        size, n = len(buf), rng.randrange(len(buf))
        del buf[n:]
        return f"{name} truncated to {n} of {size} bytes"
    if kind == "empty":
        del buf[:]
    elif kind == "remove":
        del ctx.files[name]
    elif kind == "extend":
        buf.extend(b"\0" * rng.choice([1, 4, 4096]))
    elif kind == "flip":
        for _ in range(rng.choice([1, 8, 64])):
            buf[rng.randrange(len(buf))] ^= rng.randrange(1, 256)
    else:
        ctx.files[name] = None
    return f"{name}: {kind}"


# (name, stage, function, needs external data, weight)
MUTATIONS = [
    ("init_dims", "proto", m_init_dims, False, 6),
    ("init_reshape", "proto", m_init_reshape, False, 3),
    ("init_zero_size", "proto", m_init_zero_size, False, 3),
    ("input_zero_dim", "proto", m_input_zero_dim, False, 2),
    ("init_dtype", "proto", m_init_dtype, False, 5),
    ("init_values", "proto", m_init_values, False, 6),
    ("init_duplicate_rows", "proto", m_init_duplicate_rows, False, 4),
    ("init_drop", "proto", m_init_drop, False, 4),
    ("init_dup", "proto", m_init_dup, False, 3),
    ("init_to_input", "proto", m_init_to_input, False, 3),
    ("init_to_constant", "proto", m_init_to_constant, False, 3),
    ("init_storage", "proto", m_init_storage, False, 3),
    ("sparse_init", "proto", m_sparse_init, False, 1),
    ("input_dims", "proto", m_input_dims, False, 5),
    ("input_dtype", "proto", m_input_dtype, False, 3),
    ("drop_input", "proto", m_drop_input, False, 2),
    ("outputs", "proto", m_outputs, False, 3),
    ("attr", "proto", m_attr, False, 6),
    ("layer_attr", "proto", m_layer_attr, False, 6),
    ("op_type", "proto", m_op_type, False, 5),
    ("edges", "proto", m_edges, False, 5),
    ("node_inputs", "proto", m_node_inputs, False, 4),
    ("nodes", "proto", m_nodes, False, 4),
    ("opset", "proto", m_opset, False, 4),
    ("ir_version", "proto", m_ir, False, 3),
    ("value_info", "proto", m_value_info, False, 2),
    ("names", "proto", m_names, False, 2),
    ("external_ref", "proto", m_external_ref, True, 4),
    ("conv_group", "proto", v_conv_group, False, 4),
    ("gemm_trans", "proto", v_gemm_trans, False, 3),
    ("gemm_to_matmul", "proto", v_gemm_to_matmul, False, 3),
    ("drop_bias", "proto", v_drop_bias, False, 3),
    ("identity_alias", "proto", v_identity_alias, False, 3),
    ("share_weight", "proto", v_share_weight, False, 2),
    ("scale_weights", "proto", v_scale_weights, False, 3),
    ("dynamic_input", "proto", v_dynamic_input, False, 3),
    ("conv_geometry", "proto", v_conv_geometry, False, 3),
    ("valid_opset", "proto", v_opset, False, 2),
    ("flip_bytes", "file", f_flip_bytes, False, 4),
    ("truncate", "file", f_truncate, False, 3),
    ("garbage", "file", f_garbage, False, 1),
    ("data_file", "file", d_data_file, True, 5),
]


# ------------------------------------------------------------------------------------- jobs

@dataclasses.dataclass
class Job:
    index: int
    mutant: Mutant
    command: str            # compress / analyze / eval / bench
    variant: str
    argv: list              # with "@IN@" for the input folder, "@ROOT@" for the checkout
    check_load: bool        # exit 0 must leave an output onnxruntime loads
    expected: tuple         # files allowed in the output folder on success

    def resolved_argv(self, in_dir: Path) -> list:
        return [a.replace("@IN@", str(in_dir)).replace("@ROOT@", str(ROOT)) for a in self.argv]

    def display_argv(self) -> str:
        return " ".join(_quote(a.replace("@IN@", "IN").replace("@ROOT@/", "")) for a in self.argv)


def _quote(a: str) -> str:
    return a if re.fullmatch(r"[\w./=,:@+-]+", a) else repr(a)


def make_job(seed: int, index: int, other_fraction: float = 0.15) -> Job:
    """The run number ``index`` of ``seed``: its mutant, command and argv."""
    mutant = make_mutant(seed, index)
    rng = random.Random(f"redpp-fuzz/{seed}/{index}/job")
    model = f"@IN@/{mutant.model_name}"
    original = "@ROOT@/" + str((DEMO if mutant.base == DEMO.name else ZOO / mutant.base).relative_to(ROOT))
    if rng.random() < other_fraction:
        command = rng.choice(["analyze", "analyze", "eval", "bench"])
        if command == "analyze":
            extra = rng.choice([[], ["--json"], ["--input-stats", "standard"]])
            return Job(index, mutant, command, " ".join(extra) or "plain", ["analyze", model] + extra, False, ())
        if command == "eval":
            extra = rng.choice([[], ["--ref", original]])
            argv = ["eval", model, "--data", "@ROOT@/models/digits_test.npz", "--limit", "64"] + extra
            return Job(index, mutant, command, "ref" if extra else "plain", argv, False, ())
        pair = rng.choice([[model], [original, model], [model, original]])
        return Job(index, mutant, command, f"{len(pair)} model(s)", ["bench"] + pair + ["--repeat", "2"], False, ())
    name, options = COMPRESS_VARIANTS[index % len(COMPRESS_VARIANTS)]
    expected = (OUTPUT, OUTPUT + ".data") + ((REPORT,) if REPORT in options else ())
    return Job(index, mutant, "compress", name, ["compress", model, "-o", OUTPUT] + options,
               "--no-verify" not in options, expected)


# ---------------------------------------------------------------------------------- running

def _tree(folder: Path) -> dict:
    """{relative path: sha256 (or 'dir')} of everything under ``folder``."""
    out = {}
    for p in sorted(folder.rglob("*")):
        rel = str(p.relative_to(folder))
        if p.is_dir() and not p.is_symlink():
            out[rel + "/"] = "dir"
        else:
            try:
                out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
            except OSError as err:
                out[rel] = f"unreadable: {err}"
    return out


def _inputs_state(job: Job, run_dir: Path) -> dict:
    """Hashes of everything the run reads: the mutant's folder and the checkout files in argv."""
    state = {f"IN/{k}": v for k, v in _tree(run_dir / "in").items()}
    for a in job.argv:
        if a.startswith("@ROOT@/"):
            p = ROOT / a[len("@ROOT@/"):]
            state[a[len("@ROOT@/"):]] = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "missing"
    return state


def _child(job: Job, run_dir: Path, time_limit: float) -> None:
    """In the forked child: run ``main`` in the output folder with fds 1/2 on files; never returns."""
    code = 98
    try:
        import faulthandler
        import io
        import traceback

        meta = run_dir / "meta"
        for fd, name, flags in ((1, "stdout", os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
                                (2, "stderr", os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
                                (0, os.devnull, os.O_RDONLY)):
            f = os.open(meta / name if fd else name, flags, 0o644)
            os.dup2(f, fd)
            os.close(f)
        sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False))
        sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8", line_buffering=True)
        sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding="utf-8",
                                      errors="backslashreplace", line_buffering=True)
        sys.__stdout__, sys.__stderr__ = sys.stdout, sys.stderr
        os.environ["TMPDIR"] = str(run_dir / "tmp")
        os.environ["REDPP_ONNX_DEBUG"] = "1"  # an escaping exception shows its traceback (the signature)
        tempfile.tempdir = None
        signal.signal(signal.SIGINT, signal.default_int_handler)
        faulthandler.enable(file=sys.stderr, all_threads=True)
        faulthandler.dump_traceback_later(max(time_limit - 1.5, 0.5), exit=False, file=sys.stderr)
        os.chdir(run_dir / "out")
        from redpp_onnx.cli import main

        try:
            code = main(job.resolved_argv(run_dir / "in"))
        except SystemExit as err:  # argparse
            code = err.code if isinstance(err.code, int) else (0 if err.code is None else 1)
            if not isinstance(err.code, int) and err.code is not None:
                print(err.code, file=sys.stderr)
        except BaseException:  # noqa: BLE001 - counted by the parent
            traceback.print_exc()
            code = 1
        if not isinstance(code, int):
            print(f"fuzz: main returned {code!r}", file=sys.stderr)
            code = 1
        sys.stdout.flush()
        sys.stderr.flush()
        if code == 0 and job.check_load:
            try:
                import redpp_onnx

                out = run_dir / "out" / OUTPUT
                if out.is_file():
                    redpp_onnx.session(str(out), intra_op_num_threads=1)
                    (meta / "load").write_text("ok")
                else:
                    (meta / "load").write_text("missing")
            except BaseException as err:  # noqa: BLE001
                (meta / "load").write_text(" ".join(f"{type(err).__name__}: {err}".split())[:500])
        faulthandler.cancel_dump_traceback_later()
    except BaseException as err:  # noqa: BLE001 - the harness itself: say so
        try:
            os.write(2, f"fuzz harness error in the child: {err!r}\n".encode())
        except OSError:
            pass
        code = 97
    finally:
        os._exit(code & 0xFF if isinstance(code, int) else 97)


def warm_up() -> None:
    """Import what the children need once, in the parent (never create a session here)."""
    import numpy  # noqa: F401
    import onnx  # noqa: F401
    import onnxruntime  # noqa: F401

    import redpp_onnx  # noqa: F401
    import redpp_onnx.analysis.theory  # noqa: F401
    import redpp_onnx.bench  # noqa: F401
    import redpp_onnx.cli  # noqa: F401
    import redpp_onnx.compress  # noqa: F401
    import redpp_onnx.evaluate  # noqa: F401
    import redpp_onnx.io  # noqa: F401
    import redpp_onnx.verify  # noqa: F401
    redpp_onnx.get_library_path()


@dataclasses.dataclass
class Running:
    job: Job
    pid: int
    run_dir: Path
    start: float
    inputs_before: dict


def run_jobs(jobs, *, workers: int = 2, time_limit: float = 20.0, workdir: Optional[Path] = None,
             progress: Optional[Callable[[int, dict], None]] = None) -> list:
    """Run every job in a forked child, ``workers`` at a time; a list of result dicts."""
    warm_up()
    root = Path(tempfile.mkdtemp(prefix="redpp-fuzz-", dir=workdir))
    results, running, pending = [], [], iter(jobs)
    job = next(pending, None)
    try:
        while job is not None or running:
            while job is not None and len(running) < workers:
                run_dir = root / f"run{job.index}"
                for sub in ("in", "out", "meta", "tmp"):
                    (run_dir / sub).mkdir(parents=True)
                job.mutant.write(run_dir / "in")
                before = _inputs_state(job, run_dir)
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    _child(job, run_dir, time_limit)
                running.append(Running(job, pid, run_dir, time.monotonic(), before))
                job = next(pending, None)  # built while the children run
            time.sleep(0.005)
            for r in list(running):
                pid, status = os.waitpid(r.pid, os.WNOHANG)
                elapsed = time.monotonic() - r.start
                hung = False
                if pid == 0:
                    if elapsed < time_limit:
                        continue
                    os.kill(r.pid, signal.SIGKILL)
                    _, status = os.waitpid(r.pid, 0)
                    hung = True
                running.remove(r)
                res = judge(r.job, r.run_dir, status, hung, elapsed, r.inputs_before)
                results.append(res)
                shutil.rmtree(r.run_dir, ignore_errors=True)
                if progress is not None:
                    progress(len(results), res)
    finally:
        for r in running:
            try:
                os.kill(r.pid, signal.SIGKILL)
                os.waitpid(r.pid, 0)
            except OSError:
                pass
        shutil.rmtree(root, ignore_errors=True)
    return sorted(results, key=lambda r: r["index"])


# ----------------------------------------------------------------------------------- judging

_FRAME = re.compile(r'^\s*File "([^"]+)", line (\d+),? in (\S+)', re.M)


def _frame_name(f: str, func: str) -> str:
    if "/redpp_onnx/" in f:
        return f"{f[f.rindex('/redpp_onnx/') + 1:]}:{func}"
    return f"(no redpp_onnx frame; innermost {Path(f).name}:{func})"


def _redpp_frame(text: str) -> Optional[str]:
    """The innermost redpp_onnx frame of a traceback (most recent call last)."""
    frames = [(f, func) for f, _, func in _FRAME.findall(text) if "/redpp_onnx/" in f]
    return _frame_name(*frames[-1]) if frames else None


def _clean(text: str) -> str:
    """Without terminal colours and onnxruntime's log timestamps."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", text)
    return re.sub(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+ ", "", text, flags=re.M)


def _normalize(text: str, limit: int = 90) -> str:
    """A message without names and numbers, for grouping."""
    text = _clean(text)
    text = re.sub(r"(\w+\.(?:cc|h|cpp)):\d+", r"\1", text)
    text = re.sub(r"\S*/(redpp_onnx/[\w/]+\.py):\d+", r"\1", text)
    text = re.sub(r"'[^']*'|\"[^\"]*\"|`[^`]*`", "'*'", text)
    text = re.sub(r"(?<![\w.])/\S+", "PATH", text)
    text = re.sub(r"\b\d[\d.e+-]*\b", "N", text)
    text = re.sub(r"\s+", " ", text).strip()
    return text[:limit]


def _gist(text: str, limit: int = 45) -> str:
    """The first words of a message, without names: groups e.g. onnx.checker's complaints by kind."""
    text = re.sub(r"\[ONNXRuntimeError\] : \d+ : \w+ : |Load model from \S+ failed: ?", "", _clean(text))
    text = re.sub(r"^(\w+): (?=\S)", r"\1 ", text)  # "InvalidGraph: ..." (the load check's type prefix)
    text = re.sub(r"\([^()]*\)", "(*)", text)
    text = re.sub(r"^Node \(\*\) Op \(\*\) ", "", text.strip())
    text = _normalize(text, 400)
    text = re.sub(r"\b\w+(?:[._]\w+)+\b", "*", text)
    cut = min([i for i in (text.find(c, 20) for c in ":,;=") if i > 0] + [limit])
    return text[:cut].strip()


def parse_traceback(stderr: str) -> tuple:
    """(exception type, message, innermost redpp_onnx frame) of the last traceback in ``stderr``:
    the exception line is the first unindented line after the last frame (its message may go on
    over the following lines, as onnx.checker's do)."""
    start = stderr.rfind("Traceback (most recent call last)")
    last = stderr[start:] if start >= 0 else stderr
    lines = last.splitlines()
    j = max((i for i, l in enumerate(lines) if _FRAME.match(l)), default=0) + 1
    while j < len(lines) and (lines[j].startswith(" ") or not lines[j].strip()):
        j += 1
    head = lines[j] if j < len(lines) else ""
    name, sep, message = head.partition(":")
    if not re.fullmatch(r"[A-Za-z_][\w.]*", name.strip()):
        name, message = "?", head
    message = " ".join([message.strip()] + [l.strip() for l in lines[j + 1:] if l.strip()]).strip()
    frames = _FRAME.findall(last)
    frame = _redpp_frame(last) or _redpp_frame(stderr) or (
        _frame_name(frames[-1][0], frames[-1][2]) if frames else "(no frame)")
    return name.strip().split(".")[-1], message, frame


def _faulthandler_frame(stderr: str) -> str:
    """The innermost redpp_onnx frame of a faulthandler dump (most recent call first)."""
    frames = re.findall(r'File "([^"]+)", line \d+ in (\S+)', stderr)
    for f, func in frames:
        if "/redpp_onnx/" in f:
            return _frame_name(f, func)
    return _frame_name(*frames[0]) if frames else "(no frame)"


def _name_pattern(name: str) -> str:
    """A leftover file's name without its random part (tempfile names)."""
    name = re.sub(r"(?<=tmp)[A-Za-z0-9_]{6,}", "*", name)
    name = re.sub(r"\.[A-Za-z0-9_]{6,}(?=\.tmp)", ".*", name)
    return re.sub(r"\d+", "N", name)


def _last_line(text: str) -> str:
    lines = [l for l in text.splitlines() if l.strip()]
    return lines[-1][:400] if lines else ""


def judge(job: Job, run_dir: Path, status: int, hung: bool, elapsed: float, inputs_before: dict) -> dict:
    """The outcome of one run: class, problems [(class, signature, detail)], and what to show."""
    def read(name):
        p = run_dir / "meta" / name
        return p.read_text(errors="replace") if p.exists() else ""

    stdout, stderr, load = read("stdout"), read("stderr"), read("load")
    problems = []
    code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else None
    sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
    lines = [l for l in stderr.splitlines() if l.strip()]
    if hung:
        frame = _faulthandler_frame(stderr)
        problems.append(("hang", f"hang in {frame}", f"no exit after {elapsed:.0f} s"))
    elif sig is not None:
        name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else str(sig)
        fatal = [l for l in stderr.splitlines() if l.startswith("Fatal Python error")]
        problems.append(("crash", f"{name} in {_faulthandler_frame(stderr)}", (fatal or [_last_line(stderr)])[0]))
    if "Traceback" in stderr and not hung:
        exc_type, message, frame = parse_traceback(stderr)
        if "please report it" in message:  # an error of ours, raised as such (e.g. an invalid output)
            cause = ""
            if "The above exception" in stderr:
                c_type, c_msg, c_frame = parse_traceback(stderr[: stderr.find("The above exception")])
                cause = f" <- {c_type} @ {c_frame}: {_gist(c_msg)}"
            problems.append(("internal bug", f"{exc_type} @ {frame}: {_gist(message.split('(')[0], 60)}{cause}",
                             f"{exc_type}: {message}"[:400]))
        else:
            problems.append(("traceback", f"{exc_type} @ {frame}", f"{exc_type}: {message}"[:400]))
    elif "please report it" in stderr and not hung:
        problems.append(("internal bug", f"message: {_normalize(_last_line(stderr), 70)}", _last_line(stderr)))
    if code not in (None, 0) and not problems:
        ok_line = len(lines) == 1 and lines[0].startswith("redpp-onnx: error:")
        if not ok_line or code not in (2, 3) or (code == 3 and "--max-rel-l2" not in job.argv):
            other = [l for l in lines if not l.startswith("redpp-onnx: error:")]
            what = f"{len(lines)} stderr lines" if not ok_line else "status"
            first = other[0] if other else (lines[0] if lines else "")
            problems.append(("bad exit", f"exit {code} ({what}): {_normalize(first, 60)}",
                             " | ".join(l.strip() for l in _clean(stderr).splitlines() if l.strip())[:400]))
    if code == 0 and not problems:
        if job.command == "compress":
            if not (run_dir / "out" / OUTPUT).is_file():
                problems.append(("unloadable output", "exit 0 without the output file", ""))
            elif job.check_load and load != "ok":
                problems.append(("unloadable output", f"onnxruntime: {_gist(load, 70)}", load))
            if "--json" in job.argv:
                try:
                    json.loads(stdout)
                except ValueError as err:
                    problems.append(("bad report", "--json: stdout is not JSON", str(err)))
        if REPORT in job.argv and (run_dir / "out" / REPORT).exists():
            try:
                json.loads((run_dir / "out" / REPORT).read_text())
            except ValueError as err:
                problems.append(("bad report", "--report: not JSON", str(err)))
        elif REPORT in job.argv and job.command == "compress":
            problems.append(("bad report", "--report: not written", ""))
    # what is left on disk
    left = _tree(run_dir / "out")
    if code == 0:
        allowed = set(job.expected) if job.command == "compress" else set()
        if OUTPUT + ".data" in left and OUTPUT not in left:
            allowed.discard(OUTPUT + ".data")
    elif code == 3:
        allowed = {REPORT} if REPORT in job.argv else set()
    else:
        allowed = set()
    extra = sorted(set(left) - allowed) + sorted("TMPDIR/" + p for p in _tree(run_dir / "tmp"))
    if extra and not hung and sig is None:
        pattern = ", ".join(sorted({_name_pattern(e) for e in extra}))
        problems.append(("leftover", f"leftover after exit {code}: {pattern}", ", ".join(extra)[:400]))
    noise = _normalize(lines[0], 80) if code == 0 and lines and not problems else None
    after = _inputs_state(job, run_dir)
    if after != inputs_before:
        changed = sorted(k for k in set(after) | set(inputs_before) if after.get(k) != inputs_before.get(k))
        problems.append(("input changed", f"input changed: {', '.join(changed)[:80]}", ", ".join(changed)))
    if problems:
        problems.sort(key=lambda p: FAILURES.index(p[0]))
        cls = problems[0][0]
    else:
        cls = OK if code == 0 else (GATE if code == 3 else USER_ERROR)
    return {"index": job.index, "base": job.mutant.base, "mutation": "; ".join(job.mutant.mutations),
            "command": job.command, "variant": job.variant, "argv": job.display_argv(), "exit": code,
            "signal": sig, "hung": hung, "seconds": round(elapsed, 3), "class": cls,
            "problems": [list(p) for p in problems], "last_line": _last_line(stderr),
            "stderr_lines": len(lines), "stderr_on_success": noise}


# ----------------------------------------------------------------------------------- reports

def summarize(results: list, *, seed: int, seconds: float, workers: int, time_limit: float,
              examples: int = 2) -> dict:
    """Counts per class, per command and variant, and the failures grouped by signature."""
    counts = {c: 0 for c in CLASSES}
    problem_counts = {c: 0 for c in FAILURES}
    by_command = {}
    groups, noise = {}, {}
    for r in results:
        counts[r["class"]] += 1
        key = f"{r['command']} {r['variant']}"
        row = by_command.setdefault(key, {"runs": 0, "failures": 0})
        row["runs"] += 1
        row["failures"] += r["class"] in FAILURES
        for cls, sig, detail in r["problems"]:
            problem_counts[cls] += 1
        if r["class"] in FAILURES:
            cls, sig, detail = r["problems"][0]
            g = groups.setdefault((cls, sig), {"class": cls, "signature": sig, "count": 0, "examples": []})
            g["count"] += 1
            if len(g["examples"]) < examples:
                g["examples"].append({"index": r["index"], "base": r["base"], "mutation": r["mutation"],
                                      "argv": r["argv"], "last_line": detail or r["last_line"]})
        if r.get("stderr_on_success"):
            n = noise.setdefault(r["stderr_on_success"], {"line": r["stderr_on_success"], "count": 0,
                                                          "index": r["index"], "argv": r["argv"]})
            n["count"] += 1
    signatures = sorted(groups.values(), key=lambda g: (-g["count"], g["class"], g["signature"]))
    return {"seed": seed, "runs": len(results), "seconds": round(seconds, 1), "workers": workers,
            "time_limit": time_limit, "failures": sum(counts[c] for c in FAILURES), "counts": counts,
            "problem_counts": problem_counts, "by_command": dict(sorted(by_command.items())),
            "signatures": signatures,
            "stderr_on_success": sorted(noise.values(), key=lambda n: -n["count"])}


def format_table(summary: dict, max_signatures: int = 60) -> str:
    s = summary
    out = [f"fuzz: {s['runs']} runs (seed {s['seed']}), {s['seconds']} s, {s['workers']} at a time, "
           f"time limit {s['time_limit']:g} s: {s['failures']} failure(s)", "",
           f"{'outcome':<22}{'runs':>6}   {'problem (a run may have several)':<34}{'runs':>6}"]
    for i, c in enumerate(CLASSES):
        right = f"   {c:<34}{s['problem_counts'][c]:>6}" if c in FAILURES else ""
        out.append(f"{c:<22}{s['counts'][c]:>6}{right}")
    out += ["", f"{'command / variant':<30}{'runs':>6}{'failures':>10}"]
    for key, row in s["by_command"].items():
        out.append(f"{key:<30}{row['runs']:>6}{row['failures']:>10}")
    if s["signatures"]:
        out += ["", f"{len(s['signatures'])} distinct failure signature(s), by count "
                f"(reproduce one: python -m tests.fuzzing show --seed {s['seed']} --index I):"]
        for n, g in enumerate(s["signatures"][:max_signatures], 1):
            ex = g["examples"][0]
            out.append(f"{n:>3}. {g['count']:>4} x {g['class']}: {g['signature']}")
            out.append(f"          e.g. #{ex['index']} {ex['base']}: {ex['mutation']}")
            out.append(f"          argv: {ex['argv']}")
            if ex["last_line"]:
                out.append(f"          -> {ex['last_line'][:300]}")
        if len(s["signatures"]) > max_signatures:
            out.append(f"  ... and {len(s['signatures']) - max_signatures} more")
    if s.get("stderr_on_success"):
        out += ["", "not failures, but exit 0 with something on stderr (first line):"]
        for n in s["stderr_on_success"][:10]:
            out.append(f"  {n['count']:>4} x {n['line']}   (e.g. #{n['index']}: {n['argv']})")
    return "\n".join(out) + "\n"


def run_fuzz(n: int = 300, seed: int = 0, *, workers: int = 2, time_limit: float = 20.0, start: int = 0,
             other_fraction: float = 0.15, verbose: bool = False) -> tuple:
    """Run ``n`` seeded mutants (numbers ``start`` .. ``start + n - 1``); (summary, results)."""
    t0 = time.monotonic()
    jobs = (make_job(seed, i, other_fraction) for i in range(start, start + n))

    def progress(done, res):
        if verbose and (res["class"] in FAILURES or done % 50 == 0):
            print(f"[{done}/{n}] #{res['index']} {res['class']}: {res['argv']} ({res['mutation'][:80]})",
                  file=sys.stderr, flush=True)

    results = run_jobs(jobs, workers=workers, time_limit=time_limit, progress=progress)
    summary = summarize(results, seed=seed, seconds=time.monotonic() - t0, workers=workers,
                        time_limit=time_limit)
    return summary, results


def write_repros(summary: dict, dest: Path) -> Path:
    """One folder per distinct failure signature with its mutant, and a README with argv."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    lines = [f"# redpp-onnx fuzz reproductions (seed {summary['seed']}, {summary['runs']} runs)", "",
             "One folder per distinct failure signature, by count. Run the command in an empty folder",
             "(the output goes to the current folder; REDPP_ONNX_DEBUG=1 shows the traceback of an internal",
             "error), or run `./repro.sh N` (it sets it), or, from the checkout,",
             f"`python -m tests.fuzzing show --seed {summary['seed']} --index I` (writes the mutant again and runs",
             "it in-process, with the full traceback).", ""]
    for n, g in enumerate(summary["signatures"], 1):
        ex = g["examples"][0]
        job = make_job(summary["seed"], ex["index"])
        folder = dest / f"s{n:02d}"
        shutil.rmtree(folder, ignore_errors=True)
        job.mutant.write(folder)
        argv = " ".join(_quote(a) for a in job.resolved_argv(folder))
        lines += [f"## s{n:02d}: {g['count']} x {g['class']}", "", f"signature: `{g['signature']}`", "",
                  f"mutant #{ex['index']}: {ex['base']}: {ex['mutation']}", "",
                  "```", f"cd \"$(mktemp -d)\" && redpp-onnx {argv}", "```", "",
                  "stderr (last line):", "", "```", ex["last_line"][:600], "```", ""]
        (folder / "argv.txt").write_text(argv + "\n")
    (dest / "README.md").write_text("\n".join(lines))
    script = dest / "repro.sh"
    script.write_text("#!/usr/bin/env bash\n"
                      "# usage: repro.sh N  (runs signature N of README.md in a fresh folder)\n"
                      "set -u\n"
                      "d=$(dirname \"$(readlink -f \"$0\")\")\n"
                      "args=$(cat \"$d/s$(printf %02d \"$1\")/argv.txt\")\n"
                      "cd \"$(mktemp -d)\" && echo \"in $(pwd): redpp-onnx $args\"\n"
                      "REDPP_ONNX_DEBUG=1 eval redpp-onnx \"$args\"\n"
                      "echo \"exit status $?\"\n")
    script.chmod(0o755)
    return dest


# -------------------------------------------------------------------------------- self-test

def _fake_main(argv) -> int:
    """Stands in for ``redpp_onnx.cli.main`` in :func:`selftest`: misbehaves as ``argv[-1]`` says."""
    kind, model = argv[-1], Path(argv[1])
    err = "redpp-onnx: error: nope"
    if kind == "ok":
        shutil.copy(model, OUTPUT)
        return 0
    if kind == "user-error":
        print(err, file=sys.stderr)
        return 2
    if kind == "gate":
        Path(REPORT).write_text("{}")
        print(err, file=sys.stderr)
        return 3
    if kind == "traceback":
        raise ValueError("boom")
    if kind == "crash":
        os.kill(os.getpid(), signal.SIGSEGV)
    if kind == "hang":
        time.sleep(60)
    if kind == "internal-bug":
        print("redpp-onnx: internal error: X: y; this is a bug of redpp-onnx, please report it", file=sys.stderr)
        return 1
    if kind == "two-lines":
        print("warning: something\n" + err, file=sys.stderr)
        return 2
    if kind == "unloadable":
        Path(OUTPUT).write_bytes(b"not onnx")
        return 0
    if kind == "bad-json":
        shutil.copy(model, OUTPUT)
        print("{not json")
        return 0
    if kind == "input-changed":
        with open(model, "ab") as f:
            f.write(b"x")
        print(err, file=sys.stderr)
        return 2
    if kind == "leftover":
        Path(".out.onnx.a1b2c3.tmp").write_bytes(b"")
        print(err, file=sys.stderr)
        return 2
    if kind == "tmp-leftover":
        tempfile.mkstemp()
        print(err, file=sys.stderr)
        return 2
    raise AssertionError(kind)


SELFTEST = {"ok": OK, "user-error": USER_ERROR, "gate": GATE, "traceback": "traceback", "crash": "crash",
            "hang": "hang", "internal-bug": "internal bug", "two-lines": "bad exit",
            "unloadable": "unloadable output", "bad-json": "bad report", "input-changed": "input changed",
            "leftover": "leftover", "tmp-leftover": "leftover"}


def selftest(time_limit: float = 3.0) -> list:
    """Run a fake ``main`` that misbehaves in each way; the mismatches between the class expected
    and the class found (empty: the harness sees every kind of failure)."""
    import redpp_onnx.cli as cli

    mutant = Mutant(DEMO.name, DEMO.name, {DEMO.name: DEMO.read_bytes()}, ["none"])
    jobs = []
    for i, kind in enumerate(SELFTEST):
        argv = ["compress", f"@IN@/{DEMO.name}", "-o", OUTPUT]
        argv += ["--json"] if kind == "bad-json" else (["--max-rel-l2", "0.1", "--report", REPORT] if kind == "gate"
                                                      else [])
        jobs.append(Job(i, mutant, "compress", kind, argv + [kind], True, (OUTPUT, REPORT)))
    real = cli.main
    cli.main = _fake_main
    try:
        results = run_jobs(jobs, time_limit=time_limit)
    finally:
        cli.main = real
    wrong = []
    for r, kind in zip(results, SELFTEST):
        if r["class"] != SELFTEST[kind]:
            wrong.append(f"{kind}: expected {SELFTEST[kind]}, got {r['class']} {r['problems']}")
    return wrong


# ------------------------------------------------------------------------------ command line

def _cli(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.fuzzing", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run N seeded mutants, print the table")
    r.add_argument("-n", type=int, default=300)
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--start", type=int, default=0)
    r.add_argument("--workers", type=int, default=2)
    r.add_argument("--time-limit", type=float, default=20.0)
    r.add_argument("--other-fraction", type=float, default=0.15, help="runs of analyze/eval/bench instead of compress")
    r.add_argument("--json-out", help="save the summary (and every run) as JSON here")
    r.add_argument("--repro-dir", help="write one reproduction per failure signature here")
    r.add_argument("-v", "--verbose", action="store_true")
    sub.add_parser("selftest", help="check that the harness sees each kind of failure (a fake main)")
    s = sub.add_parser("show", help="write mutant I again, print its argv and run it in-process")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--index", type=int, required=True)
    s.add_argument("--dest", help="folder for the mutant (default: a new temporary folder)")
    s.add_argument("--no-run", action="store_true")
    args = ap.parse_args(argv)
    if args.cmd == "run":
        summary, results = run_fuzz(args.n, args.seed, workers=args.workers, time_limit=args.time_limit,
                                    start=args.start, other_fraction=args.other_fraction, verbose=args.verbose)
        sys.stdout.write(format_table(summary))
        if args.json_out:
            Path(args.json_out).write_text(json.dumps(dict(summary, results=results), indent=1) + "\n")
        if args.repro_dir:
            print(f"reproductions: {write_repros(summary, Path(args.repro_dir))}")
        return 1 if summary["failures"] else 0
    if args.cmd == "selftest":
        wrong = selftest()
        print("\n".join(wrong) or f"selftest: the {len(SELFTEST)} kinds of outcome are classified as expected")
        return 1 if wrong else 0
    job = make_job(args.seed, args.index)
    dest = Path(args.dest or tempfile.mkdtemp(prefix=f"fuzz{args.index}-"))
    job.mutant.write(dest / "in")
    (dest / "out").mkdir(exist_ok=True)
    argv = job.resolved_argv(dest / "in")
    print(f"mutant #{args.index}: {job.mutant.description}\ncd {dest / 'out'} && redpp-onnx "
          + " ".join(_quote(a) for a in argv), flush=True)
    if args.no_run:
        return 0
    os.chdir(dest / "out")
    os.environ.setdefault("REDPP_ONNX_DEBUG", "1")  # the traceback of an internal error
    from redpp_onnx.cli import main

    code = main(argv)
    print(f"exit status {code}; left in {dest / 'out'}: {sorted(os.listdir(dest / 'out'))}")
    return code


if __name__ == "__main__":
    sys.exit(_cli())
