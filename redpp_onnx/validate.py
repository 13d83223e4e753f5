"""The input model is checked before any pass runs, so that a problem of the INPUT is reported as
such (one line, exit 2) and "redpp-onnx produced an invalid model ... please report it" only ever
means a bug of ours.

* :func:`check_input_model`: onnx.checker on the input. What exporters commonly get wrong and
  onnxruntime accepts anyway is repaired on the working copy, and each repair is said in the
  report: a missing ``ir_version``; IR < 4 (written as IR 4: the passes add initializers that IR 3
  would want listed as graph inputs); ``value_info`` hints that the checker rejects (they are dropped: shape inference recomputes
  them). Anything else the checker rejects is refused with its message.
* :func:`check_tensor_data`: every initializer holds as many values as its shape says (a
  truncated external data file is caught here, not as a reshape error deep in a pass).
* :func:`check_runtime`: onnxruntime can create a session for the input; the output is verified
  against it in onnxruntime, so an input that cannot run cannot be verified (``--no-verify``
  skips this check and the verification).
"""

from __future__ import annotations

from typing import List, Tuple

import numpy as np
import onnx
from onnx import helper

from .errors import RedppError


def _checker_message(err: Exception) -> str:
    text = " ".join(str(err).split())
    return text.split("==>")[0].strip()[:300]


def check_input_model(model: onnx.ModelProto) -> Tuple[onnx.ModelProto, List[str]]:
    """``(model to work on, notes)``: ``model`` itself when the checker accepts it, else a repaired
    copy (notes say what was repaired); raises :class:`RedppError` when it cannot be repaired."""
    _check_unique_names(model)
    notes = []
    if 0 < model.ir_version < 4:  # the passes add initializers; IR < 4 wants each listed as an input
        copy = onnx.ModelProto()
        copy.CopyFrom(model)
        notes.append(f"the input model has IR version {model.ir_version}; it is treated (and written) as IR 4, "
                     "which lets the compressed model's new constants be initializers only")
        copy.ir_version = 4
        model = copy
    try:
        onnx.checker.check_model(model)
        return _without_contradicted_shapes(model, notes), notes
    except (onnx.checker.ValidationError, ValueError, TypeError) as err:
        first = _checker_message(err)
    fixed = onnx.ModelProto()
    fixed.CopyFrom(model)
    if fixed.ir_version <= 0:
        from .io import runtime_ir_version

        fixed.ir_version = runtime_ir_version(fixed)
        notes.append(f"the input model had no ir_version; it is treated (and written) as IR {fixed.ir_version}")
    try:
        onnx.checker.check_model(fixed)
    except (onnx.checker.ValidationError, ValueError, TypeError):
        if len(fixed.graph.value_info):
            notes.append(f"{len(fixed.graph.value_info)} value_info entries (shape hints) the checker rejects "
                         "were dropped")
            del fixed.graph.value_info[:]
    try:
        onnx.checker.check_model(fixed)
    except (onnx.checker.ValidationError, ValueError, TypeError):
        raise RedppError(f"the input model is not valid ONNX (onnx.checker: {first}); fix the export, or check "
                         "it with python -c \"import onnx; onnx.checker.check_model('MODEL.onnx')\"") from None
    return _without_contradicted_shapes(fixed, notes), notes


def _without_contradicted_shapes(model: onnx.ModelProto, notes: List[str]) -> onnx.ModelProto:
    """``model``, or a copy without its ``value_info`` when those shape hints contradict the shapes the
    graph itself gives (strict shape inference fails with them and passes without them; noted).
    onnxruntime loads such a model, but a pass that rewrites a node near a wrong hint can make it
    unloadable (found by the fuzzer: a Conv's output stated [1, 5, 7] for [N, 32, T])."""
    if not len(model.graph.value_info):
        return model

    def consistent(m) -> bool:
        try:
            onnx.shape_inference.infer_shapes(m, strict_mode=True)
            return True
        except Exception:  # noqa: BLE001 -- onnx raises several kinds; any failure counts as not consistent
            return False

    if consistent(model):
        return model
    bare = onnx.ModelProto()
    bare.CopyFrom(model)
    del bare.graph.value_info[:]
    if not consistent(bare):
        return model  # something else fails shape inference (e.g. a custom op): the hints are not the cause
    notes.append(f"{len(model.graph.value_info)} value_info entries (shape hints) contradict the shapes the graph "
                 "gives (strict shape inference); they were dropped")
    return bare


def _check_unique_names(model: onnx.ModelProto) -> None:
    graph = model.graph
    for vi in list(graph.input) + list(graph.output):
        dims = vi.type.tensor_type.shape.dim if vi.type.HasField("tensor_type") else []
        if any(d.HasField("dim_value") and d.dim_value < 0 for d in dims):
            shape = [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in dims]
            raise RedppError(f"the input model is not valid ONNX: {vi.name!r} is declared with a negative dimension "
                             f"{shape} (a dynamic dimension has a name or no value)")
    for what, names in (("graph input", [i.name for i in graph.input]),
                        ("initializer", [t.name for t in graph.initializer]),
                        ("graph output", [o.name for o in graph.output])):
        seen = set()
        for name in names:
            if name in seen:
                raise RedppError(f"the input model is not valid ONNX: {what} name {name!r} is defined twice")
            seen.add(name)


def check_tensor_data(model: onnx.ModelProto) -> None:
    """Every initializer's data matches its shape (raises RedppError naming the first that does not)."""
    for t in model.graph.initializer:
        if t.data_location == onnx.TensorProto.EXTERNAL:
            continue  # not loaded: the loader reports it
        if any(d < 0 for d in t.dims):
            raise RedppError(f"the input model is not valid ONNX: initializer {t.name!r} has a negative dimension "
                             f"{list(t.dims)}")
        n = int(np.prod(t.dims, dtype=np.int64)) if len(t.dims) else 1
        if t.HasField("raw_data") and t.data_type != onnx.TensorProto.STRING:
            try:
                itemsize = np.dtype(helper.tensor_dtype_to_np_dtype(t.data_type)).itemsize
            except (KeyError, TypeError, ValueError):
                continue  # a type numpy has no dtype for: onnxruntime judges it
            bits = {onnx.TensorProto.INT4: 4, onnx.TensorProto.UINT4: 4}.get(t.data_type)
            expected = (n * bits + 7) // 8 if bits else n * itemsize
            if len(t.raw_data) != expected:
                raise RedppError(f"the input model's initializer {t.name!r} has {len(t.raw_data):,} bytes of data "
                                 f"for shape {list(t.dims)} ({expected:,} expected): truncated or corrupt "
                                 "(external data file shorter than the model says?)")
        else:
            stored = _stored_values(t)
            if stored is not None and stored != n:
                raise RedppError(f"the input model's initializer {t.name!r} has {stored:,} values for shape "
                                 f"{list(t.dims)} ({n:,} expected)")


def _stored_values(t: onnx.TensorProto):
    """How many values a tensor stores in its typed fields (None: packed, not counted here)."""
    if t.data_type in (onnx.TensorProto.INT4, onnx.TensorProto.UINT4):
        return None
    for field in ("float_data", "int32_data", "int64_data", "double_data", "uint64_data", "string_data"):
        n = len(getattr(t, field))
        if n:
            return n // 2 if t.data_type in (onnx.TensorProto.COMPLEX64, onnx.TensorProto.COMPLEX128) else n
    return 0


def check_runtime(model: onnx.ModelProto) -> None:
    """onnxruntime can load ``model`` (raises RedppError with its reason otherwise)."""
    from . import io
    from .runtime import ORT_ERRORS, session
    from .verify import ort_message

    try:  # with onnxruntime's default optimizations, as a user runs it (they check declared shapes)
        session(io.serialize(model))
    except ORT_ERRORS as err:
        raise RedppError(f"onnxruntime cannot load the input model: {ort_message(err)}; the output is verified "
                         "in onnxruntime, so this model cannot be verified (--no-verify compresses it anyway)") \
            from None
