"""The only module that reads or writes model files.

Loading gives one-line errors for a missing, unreadable, non-ONNX or truncated file. Saving is
atomic (a temporary file in the destination folder, then a rename) and always sets the IR
version explicitly: the input's when onnxruntime can load it, else the smallest one that the
model's opsets allow (onnx 1.23 writes IR 14 by default; onnxruntime 1.31 loads at most 13).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Union

import onnx
from google.protobuf.message import DecodeError

from .errors import RedppError

MAX_ORT_IR_VERSION = 13  # the newest IR version onnxruntime >= 1.29 loads (1.31: 13)
EXTERNAL_DATA_THRESHOLD = 1_800_000_000  # protobuf's hard limit is 2 GiB per message

PathLike = Union[str, os.PathLike]


def load_model(path: PathLike) -> onnx.ModelProto:
    """Read an ONNX file (and its external data, if any)."""
    p = Path(path)
    if not p.exists():
        raise RedppError(f"{p}: no such file")
    if p.is_dir():
        raise RedppError(f"{p}: is a folder, not an ONNX file")
    try:
        model = onnx.load(str(p), load_external_data=False)
    except (DecodeError, RuntimeWarning, ValueError) as err:
        raise RedppError(f"{p}: not a readable ONNX model (truncated or not ONNX: {err})") from None
    except OSError as err:
        raise RedppError(f"{p}: cannot read ({err.strerror or err})") from None
    if not model.graph.node and not model.graph.initializer and not model.opset_import:
        raise RedppError(f"{p}: not an ONNX model (no graph, no opset)")
    try:
        onnx.external_data_helper.load_external_data_for_model(model, str(p.parent))
    except (OSError, ValueError) as err:
        raise RedppError(f"{p}: its external data cannot be read ({err})") from None
    return model


def uses_external_data(path: PathLike) -> bool:
    """Whether the ONNX file at ``path`` keeps tensors in external data files."""
    model = onnx.load(str(path), load_external_data=False)
    return any(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer)


def runtime_ir_version(model: onnx.ModelProto) -> int:
    """The IR version to write: the model's own if onnxruntime loads it, else the lowest its opsets allow."""
    if 0 < model.ir_version <= MAX_ORT_IR_VERSION:
        return model.ir_version
    needed = onnx.helper.find_min_ir_version_for(list(model.opset_import), ignore_unknown=True)
    return min(max(needed, 3), MAX_ORT_IR_VERSION)


def serialize(model: onnx.ModelProto) -> bytes:
    """The model's bytes with the IR version onnxruntime loads (``model`` is not modified)."""
    ir = runtime_ir_version(model)
    if model.ir_version == ir:
        return model.SerializeToString()
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    copy.ir_version = ir
    return copy.SerializeToString()


def save_model(model: onnx.ModelProto, path: PathLike, *, force: bool = False,
               source: PathLike | None = None, external: bool = False) -> int:
    """Write ``model`` (not modified) to ``path`` atomically; returns the size in bytes (model
    file plus external data).

    ``force``: overwrite an existing file. ``source``: the input file, never overwritten
    without ``force``. With ``external`` (or for models over ~1.8 GB) the tensors go to one
    external data file ``<name>.data`` beside the model; both files are written in a temporary
    folder beside the destination and renamed, the data first.
    """
    out = Path(path)
    if not out.parent.is_dir():
        raise RedppError(f"{out}: the folder {out.parent} does not exist")
    if source is not None and out.exists() and out.resolve() == Path(source).resolve() and not force:
        raise RedppError(f"{out}: output is the input file; choose another path or pass --force")
    if out.exists() and not force and source is not None:
        raise RedppError(f"{out}: already exists; pass --force to overwrite")
    if external or model.ByteSize() > EXTERNAL_DATA_THRESHOLD:
        return _save_external(model, out)
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent)
    os.close(fd)
    try:
        Path(tmp).write_bytes(serialize(model))
        os.chmod(tmp, _default_mode())  # mkstemp makes it 0600; give what open() would
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return out.stat().st_size


def _default_mode() -> int:
    """0666 less the process umask: the mode a file created by ``open()`` gets."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def _save_external(model: onnx.ModelProto, out: Path) -> int:
    data_name = out.name + ".data"
    copy = onnx.ModelProto()
    copy.CopyFrom(model)  # onnx.save_model rewrites the tensors it externalises
    copy.ir_version = runtime_ir_version(model)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        onnx.save_model(copy, str(staging / out.name), save_as_external_data=True, all_tensors_to_one_file=True,
                        location=data_name, size_threshold=1024)
        data = staging / data_name
        if data.exists():
            os.replace(data, out.parent / data_name)
        os.replace(staging / out.name, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    data_path = out.parent / data_name
    return out.stat().st_size + (data_path.stat().st_size if data_path.exists() else 0)
