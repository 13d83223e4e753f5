"""onnxruntime sessions that can run the ai.redpp custom operators."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Union

import onnx
import onnxruntime as ort

LOG_SEVERITY = 3
"""onnxruntime's log level for the sessions made here: 3 = errors only (onnxruntime warns about
harmless things, e.g. unused constants). The CLI sets 4 (fatal only): it reports onnxruntime's
errors itself, as one line."""

_LIBRARY_NAME = {"darwin": "libredpp_ops.dylib", "win32": "redpp_ops.dll"}


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


def session(model: Union[str, os.PathLike, bytes, onnx.ModelProto], providers=None,
            **options) -> ort.InferenceSession:
    """An ``onnxruntime.InferenceSession`` for ``model`` that can run ai.redpp operators.

    ``model``: a path, serialized bytes or a ``ModelProto``. ``options``: ``SessionOptions``
    attributes, e.g. ``intra_op_num_threads=2`` (SplitConv uses onnxruntime's intra-op pool).
    """
    so = session_options(**options)
    if isinstance(model, onnx.ModelProto):
        model = model.SerializeToString()
    elif isinstance(model, os.PathLike):
        model = os.fspath(model)
    return ort.InferenceSession(model, sess_options=so,
                                providers=providers or ["CPUExecutionProvider"])


def _ort_errors() -> tuple:
    from onnxruntime.capi import onnxruntime_pybind11_state as state

    return tuple(v for v in vars(state).values() if isinstance(v, type) and issubclass(v, Exception))


ORT_ERRORS = _ort_errors()
"""The exception types onnxruntime's Python binding raises (its own classes, not Python's)."""
