"""onnxruntime sessions that can run the ai.redpp custom operators (and load --codebook models fast)."""

from __future__ import annotations

import dataclasses
import os
import warnings
from pathlib import Path
from typing import Optional, Union

import onnx
import onnxruntime as ort
from google.protobuf.message import DecodeError

from .errors import RedppError

LOG_SEVERITY = 3
"""onnxruntime's log level for the sessions made here: 3 = errors only (onnxruntime warns about
harmless things, e.g. unused constants). The CLI sets 4 (fatal only): it reports onnxruntime's
errors itself, as one line."""

_LIBRARY_NAME = {"darwin": "libredpp_ops.dylib", "win32": "redpp_ops.dll"}

HALF_COMPUTE_DISABLED = ("NchwcTransformer",)
"""Graph optimizers :func:`session` turns off for a model that computes in float16 / bfloat16
(:func:`half_compute`): onnxruntime on x86-64 (1.32 here; 1.24 and 1.25 in the upstream report)
dereferences a null pointer in its NchwcTransformer when it meets the Casts it inserted around half-precision ops it has no CPU
kernel for (microsoft/onnxruntime#28392): the process dies creating the session (SIGSEGV), e.g.
on a transformer exported after ``model.half()``. That transformer rewrites only float32 Convs and
pools (and the ops between them) into the NCHWc layout: a graph computing in half precision loses
nothing without it; a float32 Conv inside such a graph runs in the plain layout."""

DISABLE_KEY = "optimization.disable_specified_optimizers"
"""onnxruntime's session config entry (``kOrtSessionOptionsDisableSpecifiedOptimizers``): a
comma-separated list of graph optimizers not to run."""
_HALF = (onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16)


def get_library_path() -> str:
    """Absolute path of the custom-op library (``RegisterCustomOps`` entry point).

    Python: ``SessionOptions.register_custom_ops_library(path)``. C++:
    ``Ort::SessionOptions::RegisterCustomOpsLibrary(ORT_TSTR(path))``. C:
    ``OrtApi::RegisterCustomOpsLibrary_V2(options, path)``. Needs onnxruntime >= 1.29.
    """
    import sys

    name = _LIBRARY_NAME.get(sys.platform, "libredpp_ops.so")
    path = Path(__file__).resolve().parent / name
    if not path.is_file():
        raise FileNotFoundError(
            f"the redpp-onnx custom-op library is not built ({path} is missing); "
            "reinstall the package with 'pip install .' (or 'pip install -e .')")
    return str(path)


def session_options(**options) -> ort.SessionOptions:
    """``SessionOptions`` with the custom-op library registered and ``options`` applied.

    Every keyword must be an attribute of ``onnxruntime.SessionOptions``
    (``intra_op_num_threads``, ``graph_optimization_level``, ``log_severity_level``...). Logging
    defaults to errors only (``log_severity_level=3``); pass ``log_severity_level=1`` for warnings.
    """
    so = ort.SessionOptions()
    so.log_severity_level = LOG_SEVERITY
    for key, value in options.items():
        if key.startswith("_") or not hasattr(so, key):
            raise TypeError(f"unknown onnxruntime session option {key!r}")
        setattr(so, key, value)
    so.register_custom_ops_library(get_library_path())
    return so


def half_compute(model: onnx.ModelProto) -> bool:
    """Whether the graph computes in float16 / bfloat16: a graph input or output of that type, or a
    Cast to it of a tensor that is not a constant (weights stored in half precision and cast to
    float32, or codebooks decoding to half-precision weights, are constants: they do not count)."""
    g = model.graph
    if any(v.type.tensor_type.elem_type in _HALF for v in list(g.input) + list(g.output)):
        return True
    const = {t.name for t in g.initializer} | {t.values.name for t in g.sparse_initializer}
    const -= {v.name for v in g.input}
    for n in g.node:
        ins = [x for x in n.input if x]
        if n.op_type == "Cast" and any(a.name == "to" and a.i in _HALF for a in n.attribute) and \
                not all(x in const for x in ins):
            return True
        if n.op_type == "Constant" or (ins and all(x in const for x in ins)):
            const.update(n.output)
    return False


def half_compute_note(model: onnx.ModelProto) -> list:
    """The report's note for a model that computes in half precision (none for others)."""
    if not half_compute(model):
        return []
    names = ",".join(HALF_COMPUTE_DISABLED)
    return [f"the model computes in half precision: onnxruntime's {names} crashes the process creating a session of "
            "such graphs on x86-64 (SIGSEGV; microsoft/onnxruntime#28392), so redpp-onnx's sessions run without it; "
            f"serve it with redpp_onnx.session(), or set the session config entry {DISABLE_KEY}={names} "
            "(it rewrites only float32 Convs and pools into the NCHWc layout)"]


def _disabled_optimizers(src) -> Optional[list]:
    """:data:`HALF_COMPUTE_DISABLED` for a half-precision graph, else None (``src``: a path, bytes
    or a ``ModelProto``; a path or bytes is read without its external data)."""
    try:
        if isinstance(src, onnx.ModelProto):
            model = src
        elif isinstance(src, (bytes, bytearray)):
            model = onnx.load_model_from_string(bytes(src))
        else:
            model = onnx.load(src, load_external_data=False)
    except (OSError, ValueError, DecodeError):
        return None  # onnxruntime says what is wrong with it
    return list(HALF_COMPUTE_DISABLED) if half_compute(model) else None


def _disable(so: ort.SessionOptions, names: Optional[list]) -> None:
    """Turn the graph optimizers ``names`` off in ``so`` (the documented config entry, kept when a
    session is re-created)."""
    if names:
        so.add_session_config_entry(DISABLE_KEY, ",".join(names))


def session(model: Union[str, os.PathLike, bytes, onnx.ModelProto], providers=None, *,
            decode_codebooks: bool = True, **options) -> ort.InferenceSession:
    """An ``onnxruntime.InferenceSession`` for ``model`` that can run ai.redpp operators.

    ``model``: a path, serialized bytes or a ``ModelProto``. ``options``: ``SessionOptions``
    attributes, e.g. ``intra_op_num_threads=2`` (SplitConv uses onnxruntime's intra-op pool).

    A ``--codebook`` model with its ``redpp.codebook`` map is loaded by the fast path
    (``redpp_onnx/storage.py``): the weights are decoded here, in C++, and handed to onnxruntime,
    which then loads it with about 1.35x the peak memory and 1.2-1.6x the time of the fp32
    model instead of folding the decoders (5-7x and 7-19x, docs/HASHING.md "Storage"). A map that does not match the model is refused with a
    :class:`CodebookWarning` and the standard-ops form is loaded (same outputs, slower). With
    ``decode_codebooks=False`` onnxruntime always folds the decoders itself. The session's
    ``redpp_load`` attribute says which form was loaded (:class:`LoadInfo`). A model that computes
    in half precision gets :data:`HALF_COMPUTE_DISABLED` turned off (an onnxruntime crash otherwise).
    """
    src = os.fspath(model) if isinstance(model, os.PathLike) else model
    reason = None
    if decode_codebooks:
        fast, reason = _decoded_session(src, providers, options)
        if fast is not None:
            return fast
    so = session_options(**options)
    _disable(so, _disabled_optimizers(src))
    if isinstance(src, onnx.ModelProto):
        src = src.SerializeToString()
    sess = ort.InferenceSession(src, sess_options=so, providers=providers or ["CPUExecutionProvider"])
    sess.redpp_load = LoadInfo("onnxruntime", reason=reason)
    return sess


class CompactError(RedppError):
    """A compact-form model (``--storage compact``) whose weights do not decode: it cannot be
    loaded (the file is damaged or was edited)."""


class CodebookWarning(UserWarning):
    """A ``--codebook`` model's map was refused: its standard-ops form is loaded instead."""


@dataclasses.dataclass(frozen=True)
class LoadInfo:
    """How :func:`session` loaded a model: ``form`` is ``"decoded"`` (the fast path: ``weights``
    decoded by redpp-onnx in ``decode_s`` seconds) or ``"onnxruntime"`` (the file as is: a
    plain model, or a --codebook model whose decoders onnxruntime folds; ``reason`` says why the
    fast path was not taken when the model has a map)."""

    form: str
    weights: int = 0
    decode_s: float = 0.0
    reason: Optional[str] = None


class DecodedSession(ort.InferenceSession):
    """The ``InferenceSession`` of a --codebook model whose weights redpp-onnx decoded: the
    weights were copied by onnxruntime once, before its graph optimizations, and the decoded
    arrays freed. Re-creating the session (``set_providers``) decodes them again."""

    def __init__(self, small: bytes, build_options, providers, info: LoadInfo):
        """``small``: the graph without decoders; ``build_options()``: ``(SessionOptions with the
        decoded weights added, what must stay alive until the session exists)``."""
        so, keep = build_options()
        super().__init__(small, sess_options=so, providers=providers)
        # onnxruntime copied the weights; these options point at arrays freed now: never reuse them
        del so, keep
        self._sess_options_initial = None
        self._redpp_build_options = build_options
        self.redpp_load = info

    def _reset_session(self, providers, provider_options) -> None:
        so, keep = self._redpp_build_options()
        self._sess_options_initial = so
        try:
            super()._reset_session(providers, provider_options)
        finally:
            self._sess_options_initial = None
            del so, keep


def _decoded_session(src, providers, options) -> tuple:
    """``(session, None)``: the fast-path session of a --codebook model with a map, or of a
    compact-form model; ``(None, None)``: neither; ``(None, reason)``: the map was refused (with a
    warning). A compact-form model that does not decode raises :class:`CompactError`: it has no
    other form to load."""
    from . import storage

    form, text = storage.peek_form(src)
    if form is None:
        return None, None
    where = src if isinstance(src, str) else "the model"

    def decoded():
        model = storage.load_model(src)
        return storage.decode(model, None if form == "compact" else text)

    try:
        first = decoded()
    except storage.StaleMap as err:  # a tool folded the decoders and kept the map: load as is
        return None, str(err)
    except (storage.StorageError, OSError, ValueError, DecodeError) as err:
        if form == "compact":
            raise CompactError(f"{where}: the compact-form weights cannot be decoded ({err})") from None
        return _refused(where, str(err))
    small = first.model.SerializeToString()
    disabled = list(HALF_COMPUTE_DISABLED) if half_compute(first.model) else None
    info = LoadInfo("decoded", first.stored_weights, first.seconds)
    state = {"decoded": first}

    def build_options():
        d = state.pop("decoded", None) or decoded()
        so = session_options(**options)
        _disable(so, disabled)
        names = list(d.weights)
        values = [ort.OrtValue.ortvalue_from_numpy(d.weights[n]) for n in names]
        so.add_external_initializers(names, values)
        return so, (d, values)

    del first
    try:
        return DecodedSession(small, build_options, providers or ["CPUExecutionProvider"], info), None
    except ORT_ERRORS as err:
        reason = f"onnxruntime refused the decoded graph ({' '.join(str(err).split())[:300]})"
        if form == "compact":
            raise CompactError(f"{where}: {reason}") from None
        return _refused(where, reason)


def _refused(where, reason: str) -> tuple:
    warnings.warn(f"{where}: the redpp.codebook map was refused ({reason}); loading the standard-ops form "
                  "(same outputs; more memory and time at load)", CodebookWarning, stacklevel=4)
    return None, reason


def _ort_errors() -> tuple:
    from onnxruntime.capi import onnxruntime_pybind11_state as state

    return tuple(v for v in vars(state).values() if isinstance(v, type) and issubclass(v, Exception))


ORT_ERRORS = _ort_errors()
"""The exception types onnxruntime's Python binding raises (its own classes, not Python's)."""
