"""The only module that reads or writes model files.

Loading gives one-line errors for a missing, unreadable, non-ONNX or truncated file. Saving is
atomic (a temporary file in the destination folder, then a rename) and always sets the IR
version explicitly: the input's when onnxruntime can load it, else the smallest one that the
model's opsets allow (onnx 1.23 writes IR 14 by default; onnxruntime 1.31 loads at most 13).
"""

from __future__ import annotations

import os
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
    model = load_graph(path)
    p = Path(path)
    try:
        onnx.external_data_helper.load_external_data_for_model(model, str(p.parent))
    except (OSError, ValueError, onnx.checker.ValidationError) as err:
        raise RedppError(f"{p}: its external data cannot be read ({' '.join(str(err).split())})") from None
    return model


def load_graph(path: PathLike) -> onnx.ModelProto:
    """Read an ONNX file without its external data (tensors stored outside keep their
    references: :func:`read_external` reads one when it is needed)."""
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
    return model


def external_entry(tensor: onnx.TensorProto) -> dict:
    """``location``, ``offset`` (int), ``length`` (int or None) of a tensor stored outside the model."""
    info = {e.key: e.value for e in tensor.external_data}
    return {"location": info.get("location", ""), "offset": int(info.get("offset") or 0),
            "length": int(info["length"]) if info.get("length") else None}


def external_file(tensor: onnx.TensorProto, folder: PathLike) -> Path:
    """The file holding ``tensor``'s data, inside ``folder`` (a location that leaves it is refused)."""
    location = external_entry(tensor)["location"]
    base = Path(folder).resolve()
    path = (base / location).resolve()
    if not location or Path(location).is_absolute() or base not in path.parents:
        raise RedppError(f"tensor {tensor.name}: external data location {location!r} is not a file beside the model")
    return path


def read_external(tensor: onnx.TensorProto, folder: PathLike):
    """The values of ``tensor`` (stored outside the model, in ``folder``) as a numpy array, read
    without attaching them to the proto (the streaming path keeps one tensor in memory at a time)."""
    import numpy as np

    dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type))
    count = 1
    for d in tensor.dims:
        count *= int(d)
    entry = external_entry(tensor)
    path = external_file(tensor, folder)
    if entry["length"] is not None and entry["length"] != count * dtype.itemsize:
        raise RedppError(f"tensor {tensor.name}: its external data has {entry['length']} bytes for "
                         f"{count} values of {dtype.name}")
    try:
        with open(path, "rb") as f:
            f.seek(entry["offset"])
            data = np.fromfile(f, dtype=dtype, count=count)
    except OSError as err:
        raise RedppError(f"{path}: cannot read the external data of {tensor.name} ({err.strerror or err})") from None
    if data.size != count:
        raise RedppError(f"{path}: the external data of {tensor.name} is truncated ({data.size} of {count} values)")
    return data.reshape(tuple(int(d) for d in tensor.dims))


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

    ``force``: overwrite an existing file. ``source``: the input file, never overwritten. With
    ``external`` (or for models over ~1.8 GB) the tensors go to one external data file
    ``<name>.data`` beside the model; both appear together or not at all (``files.Outputs``).
    """
    from .files import Outputs

    out = Path(path)
    external = external or model.ByteSize() > EXTERNAL_DATA_THRESHOLD
    plan = Outputs(force=force)
    plan.read("input model", source)
    plan.write("output model", out)
    if external:
        plan.write("output's external data", data_path(out))
    plan.check()
    sizes = []
    plan.commit([(out, lambda staged: _write_sized(model, staged, external, sizes))])
    return sizes[0]


def data_path(out: PathLike) -> Path:
    """Where the external data of a model written to ``out`` goes."""
    return Path(out).with_name(Path(out).name + ".data")


def _write_sized(model, staged: Path, external: bool, sizes: list) -> list:
    files = write_model(model, staged, external=external)
    sizes.append(sum(f.stat().st_size for f in files))
    return files


def write_model(model: onnx.ModelProto, path: PathLike, *, external: bool = False) -> list:
    """Write ``model`` (not modified) to ``path`` (not atomic: see ``files.Outputs``), with the IR
    version onnxruntime loads; with ``external``, tensors over 1 KB go to ``<name>.data`` beside
    it. Returns the files written."""
    out = Path(path)
    if not external:
        with open(out, "wb") as f:
            f.write(serialize(model))
        os.chmod(out, _default_mode())
        return [out]
    copy = onnx.ModelProto()
    copy.CopyFrom(model)  # onnx.save_model rewrites the tensors it externalises
    copy.ir_version = runtime_ir_version(model)
    data = data_path(out)
    onnx.save_model(copy, str(out), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=data.name, size_threshold=1024)
    files = [out] + ([data] if data.exists() else [])
    for f in files:
        os.chmod(f, _default_mode())
    return files


def _default_mode() -> int:
    """0666 less the process umask: the mode a file created by ``open()`` gets."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask
