"""Accuracy and output drift of ONNX models on labelled image sets or on named model inputs.

Two steps::

    from redpp_onnx.evaluate import load_dataset, evaluate

    data = load_dataset("shared/bench/cifar10_test_exact1017.npz")      # preprocessing picked
    result = evaluate("compressed.onnx", data, reference="original.onnx")
    print(result.top1, result.agreement, result.outputs, result.to_dict())

Any model, e.g. a transformer with ``input_ids``/``attention_mask``/``token_type_ids``:
:func:`load_inputs` reads an ``.npz`` whose keys are the model's input names (plus optional
integer ``labels`` or ``y``), checked against the model; :func:`evaluate` then compares every
output with the reference's (cosine similarity per sample, pooled relative L2) and gives top-1
only when there are labels. :func:`load_data` picks between the two readers as ``redpp-onnx eval``
does. Float data must be finite (NaN/Inf is refused, naming the array and the first sample).

:func:`load_dataset` reads an ``.npz`` file in one of these layouts:

* **CIFAR** -- ``images`` uint8 ``(N, H, W, 3)`` NHWC RGB and ``labels``. Preset
  ``"cifar"``: ``x = (images / 255 - [0.485, 0.456, 0.406]) / [0.229, 0.224, 0.225]``,
  then NHWC -> NCHW (the ImageNet statistics that akamaster's CIFAR ResNets were trained
  with). ``"auto"`` picks it for uint8 ``(N, 32, 32, 3)`` arrays.
* **ImageNet JPEG** -- ``jpeg_bytes`` uint8 (concatenated JPEG files), ``offsets``
  int ``(N + 1,)`` (image ``i`` is ``jpeg_bytes[offsets[i]:offsets[i + 1]]``) and
  ``labels``. Preset ``"imagenet"``: decode with Pillow to RGB uint8, then
  ``x = (x - 127) / 128`` (EfficientNet-Lite's TF preprocessing), NHWC -> NCHW; no resize
  or crop (the stored JPEGs are already the network's input size). ``"auto"`` picks it
  whenever ``jpeg_bytes``/``offsets`` are present. Needs Pillow
  (``pip install pillow`` or the ``redpp-onnx[eval]`` extra).
* **raw** -- ``x`` (or ``images``/``inputs``) float, already preprocessed, NCHW (or
  ``layout="NHWC"``), plus ``y`` (or ``labels``); used as is. Or uint8 images (array or
  JPEG) with explicit per-channel ``mean``/``std``: ``x = (images / 255 - mean) / std``.

These are exactly the preprocessings documented in ``shared/bench/PROVENANCE.md``; the
normalisation is computed in float64 and rounded once to float32.

Images are held as their compact stored form (uint8 pixels or JPEG bytes) and converted to
float32 NCHW one batch at a time, so a 1,000-image 224x224 set never needs its 602 MB of
float32 input in memory at once. :func:`evaluate` streams its statistics too: it keeps no
logits beyond the current batch.
"""

from __future__ import annotations

import io
import os
import time
import zipfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Optional, Sequence, Tuple, Union

import numpy as np
import onnx

from .runtime import session as _make_session

__all__ = [
    "CIFAR_MEAN",
    "CIFAR_STD",
    "Dataset",
    "EvalResult",
    "InputSpec",
    "NamedInputs",
    "cosines",
    "evaluate",
    "input_specs",
    "load_data",
    "load_dataset",
    "load_inputs",
]

#: Channel statistics of the CIFAR preset (ImageNet's, as akamaster's ``trainer.py`` uses).
CIFAR_MEAN = (0.485, 0.456, 0.406)
CIFAR_STD = (0.229, 0.224, 0.225)

_PRESETS = ("auto", "cifar", "imagenet", "raw")
_IMAGE_KEYS = ("x", "images", "inputs")
_LABEL_KEYS = ("y", "labels")
_PILLOW_HINT = "pip install pillow (or the extra: pip install 'redpp-onnx[eval]')"

ProgressCallback = Callable[[int, int], None]


# --------------------------------------------------------------------------- dataset

@dataclass(frozen=True)
class Dataset:
    """A labelled image set whose float32 NCHW inputs are produced lazily, per batch.

    ``inputs(start, stop)`` returns the preprocessed samples ``start:stop`` as a
    C-contiguous float32 array of shape ``(stop - start, *sample_shape)``; only that slice
    is decoded/normalised. Iterate with :meth:`batches`.
    """

    name: str
    inputs: Callable[[int, int], np.ndarray] = field(repr=False)
    labels: np.ndarray = field(repr=False)
    preprocessing: str
    sample_shape: Tuple[int, ...]
    source: str = ""

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def batches(self, batch_size: int = 256) -> Iterator[Tuple[np.ndarray, np.ndarray]]:
        """Yield ``(x, y)``: float32 NCHW inputs and int64 labels, ``batch_size`` at a time."""
        if int(batch_size) < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        n = len(self)
        for start in range(0, n, int(batch_size)):
            stop = min(n, start + int(batch_size))
            yield self.inputs(start, stop), self.labels[start:stop]

    def materialize(self) -> np.ndarray:
        """All inputs as one float32 array (mind the memory for large sets)."""
        return self.inputs(0, len(self))


def _require_pillow(path: Path):
    try:
        from PIL import Image  # noqa: F401
    except ImportError:
        raise ValueError(f"{path}: decoding its JPEG images needs Pillow, which is not "
                         f"installed; {_PILLOW_HINT}") from None
    return Image


class _ArrayPixels:
    """uint8 (or float) images held in memory; ``get(a, b)`` returns NHWC or NCHW slices."""

    def __init__(self, array: np.ndarray):
        self.array = array

    def __len__(self):
        return self.array.shape[0]

    def get(self, start: int, stop: int) -> np.ndarray:
        return self.array[start:stop]


class _JpegPixels:
    """Concatenated JPEG files, decoded (RGB uint8 NHWC) only for the requested slice."""

    def __init__(self, path: Path, data: np.ndarray, offsets: np.ndarray, image_module):
        self.path = path
        self.data = data
        self.offsets = offsets
        self.Image = image_module
        self.shape = None  # (H, W, 3) of image 0, set by decode(0)
        self.shape = self.decode(0).shape

    def __len__(self):
        return self.offsets.shape[0] - 1

    def decode(self, i: int) -> np.ndarray:
        blob = self.data[int(self.offsets[i]):int(self.offsets[i + 1])].tobytes()
        try:
            with self.Image.open(io.BytesIO(blob)) as im:
                pixels = np.asarray(im.convert("RGB"), dtype=np.uint8)
        except Exception as exc:  # PIL raises UnidentifiedImageError, OSError, SyntaxError
            raise ValueError(f"{self.path}: image {i} (bytes {int(self.offsets[i])}:"
                             f"{int(self.offsets[i + 1])}) is not a decodable JPEG: {exc}") from None
        if self.shape is not None and pixels.shape != self.shape:
            raise ValueError(f"{self.path}: image {i} decodes to {pixels.shape[1]}x"
                             f"{pixels.shape[0]}, but image 0 is {self.shape[1]}x{self.shape[0]}; "
                             "all images must have the same size (no resize is applied)")
        return pixels

    def get(self, start: int, stop: int) -> np.ndarray:
        out = np.empty((stop - start,) + self.shape, dtype=np.uint8)
        for k, i in enumerate(range(start, stop)):
            out[k] = self.decode(i)
        return out


class _Pipeline:
    """Picklable ``inputs(start, stop)``: fetch pixels, normalise, transpose to NCHW."""

    def __init__(self, pixels, layout: str, scale: float, mean, std):
        self.pixels = pixels
        self.layout = layout  # layout of what pixels.get returns
        # x = (raw / scale - mean) / std in float64, rounded once to float32;
        # mean is None: raw floats are used as they are.
        self.scale = scale
        self.mean = None if mean is None else np.asarray(mean, dtype=np.float64)
        self.std = None if std is None else np.asarray(std, dtype=np.float64)

    def __call__(self, start: int, stop: int) -> np.ndarray:
        raw = self.pixels.get(int(start), int(stop))
        if self.layout == "NHWC":
            raw = raw.transpose(0, 3, 1, 2)
        if self.mean is None:  # already preprocessed floats
            return np.ascontiguousarray(raw, dtype=np.float32)
        x = raw.astype(np.float64)
        if self.scale != 1.0:
            x /= self.scale
        x -= self.mean.reshape(1, -1, 1, 1)
        x /= self.std.reshape(1, -1, 1, 1)
        return np.ascontiguousarray(x, dtype=np.float32)


def _channel_stats(path: Path, what: str, value, channels: int) -> np.ndarray:
    arr = np.atleast_1d(np.asarray(value, dtype=np.float64))
    if arr.ndim != 1 or arr.size not in (1, channels):
        raise ValueError(f"{path}: {what} must be a scalar or a list of {channels} per-channel "
                         f"values, got {np.asarray(value).tolist()}")
    if what == "std" and np.any(arr == 0):
        raise ValueError(f"{path}: std must not contain zeros, got {arr.tolist()}")
    return np.broadcast_to(arr, (channels,)).copy()


def _open_npz(path: Path):
    if not path.exists():
        raise ValueError(f"{path}: no such file")
    if path.is_dir():
        raise ValueError(f"{path}: is a directory, not an npz file")
    if not zipfile.is_zipfile(path):
        raise ValueError(f"{path}: not an npz archive (expected a file written by numpy.savez)")
    try:
        return np.load(path, allow_pickle=False)
    except Exception as exc:
        raise ValueError(f"{path}: cannot be read as an npz archive: {exc}") from None


def _check_finite(path: Path, key: str, array: np.ndarray) -> None:
    """Float data must be finite: NaN/Inf would only come back as NaN outputs and meaningless figures."""
    if array.dtype.kind not in "fc" or array.size == 0:
        return
    finite = np.isfinite(array)
    if finite.all():
        return
    bad = ~finite
    first = int(np.argmax(bad.reshape(bad.shape[0], -1).any(axis=1))) if array.ndim else 0
    raise ValueError(f"{path}: {key!r} holds {int(bad.sum())} NaN/Inf value(s) (the first in sample {first}); "
                     "remove or fix those samples")


def _read(path: Path, npz, key: str) -> np.ndarray:
    try:
        return npz[key]
    except ValueError as exc:  # object arrays need pickle, which we never enable
        raise ValueError(f"{path}: array {key!r} cannot be loaded without pickle ({exc})") from None


def load_dataset(path: Union[str, os.PathLike], *, preprocess: str = "auto",
                 mean: Optional[Sequence[float]] = None, std: Optional[Sequence[float]] = None,
                 layout: Optional[str] = None, limit: Optional[int] = None) -> Dataset:
    """Read a labelled image set from an ``.npz`` file (layouts: see the module docstring).

    ``preprocess``: ``"auto"`` (by the keys present and the image size), ``"cifar"``,
    ``"imagenet"`` or ``"raw"``. ``mean``/``std``: per-channel statistics for uint8 images
    (``x = (images / 255 - mean) / std``); giving them selects ``"raw"`` under ``"auto"``
    and is an error with the fixed presets. ``layout``: ``"NHWC"`` or ``"NCHW"`` of the
    stored array (default: NHWC for uint8 images, NCHW for float inputs; JPEGs are always
    NHWC). ``limit``: keep only the first ``limit`` samples.

    Raises ``ValueError`` (one line, naming the file) for a missing or unreadable file,
    missing keys, a label/image count mismatch, an unusable option, or a missing Pillow
    when JPEGs must be decoded.
    """
    path = Path(path)
    if preprocess not in _PRESETS:
        raise ValueError(f"{path}: preprocess must be one of {', '.join(map(repr, _PRESETS))}, "
                         f"got {preprocess!r}")
    if layout is not None and layout not in ("NHWC", "NCHW"):
        raise ValueError(f"{path}: layout must be 'NHWC' or 'NCHW', got {layout!r}")
    if (mean is None) != (std is None):
        raise ValueError(f"{path}: give both mean= and std=, or neither")
    if mean is not None and preprocess in ("cifar", "imagenet"):
        raise ValueError(f"{path}: the {preprocess!r} preset has fixed statistics; use "
                         "preprocess='raw' to pass mean= and std=")
    if limit is not None and (not isinstance(limit, (int, np.integer)) or limit < 1):
        raise ValueError(f"{path}: limit must be a positive integer, got {limit!r}")

    with _open_npz(path) as npz:
        keys = list(npz.files)
        label_key = next((k for k in _LABEL_KEYS if k in keys), None)
        is_jpeg = "jpeg_bytes" in keys or "offsets" in keys
        image_key = None if is_jpeg else next((k for k in _IMAGE_KEYS if k in keys), None)
        missing = []
        if is_jpeg:
            missing += [k for k in ("jpeg_bytes", "offsets") if k not in keys]
        elif image_key is None:
            missing.append("x (or images / inputs)")
        if label_key is None:
            missing.append("y (or labels)")
        if missing:
            raise ValueError(
                f"{path}: missing key(s) {', '.join(missing)}; found {sorted(keys)}; expected "
                "images+labels (CIFAR), jpeg_bytes+offsets+labels (ImageNet) or x+y (raw)")
        labels = _read(path, npz, label_key)
        if is_jpeg:
            data = _read(path, npz, "jpeg_bytes")
            offsets = _read(path, npz, "offsets")
            images = None
        else:
            images = _read(path, npz, image_key)

    # ---- labels
    if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(f"{path}: {label_key!r} must be a 1-D integer array, got "
                         f"{labels.dtype} {labels.shape}")
    labels = labels.astype(np.int64)
    if labels.size and labels.min() < 0:
        raise ValueError(f"{path}: {label_key!r} contains negative class indices")

    # ---- pixel source
    if is_jpeg:
        if data.ndim != 1 or data.dtype != np.uint8:
            raise ValueError(f"{path}: 'jpeg_bytes' must be a 1-D uint8 array, got "
                             f"{data.dtype} {data.shape}")
        if (offsets.ndim != 1 or not np.issubdtype(offsets.dtype, np.integer)
                or offsets.size < 1 or offsets[0] != 0 or offsets[-1] != data.size
                or np.any(np.diff(offsets) <= 0)):
            raise ValueError(f"{path}: 'offsets' must be increasing integers from 0 to "
                             f"len(jpeg_bytes) = {data.size}")
        count, what = offsets.size - 1, "'offsets' describes"
        if layout == "NCHW":
            raise ValueError(f"{path}: JPEG images decode to NHWC; layout='NCHW' does not apply")
        stored_layout, dtype_kind = "NHWC", "uint8"
    else:
        count, what = images.shape[0] if images.ndim else 0, f"{image_key!r} holds"
        if images.ndim != 4:
            raise ValueError(f"{path}: {image_key!r} must be a 4-D image array, got shape "
                             f"{images.shape}")
        if images.dtype == np.uint8:
            dtype_kind = "uint8"
        elif np.issubdtype(images.dtype, np.floating):
            dtype_kind = "float"
        else:
            raise ValueError(f"{path}: {image_key!r} must be uint8 images or float inputs, "
                             f"got {images.dtype}")
        stored_layout = layout or ("NHWC" if dtype_kind == "uint8" else "NCHW")
    if count != labels.size:
        raise ValueError(f"{path}: {what} {count} images but {label_key!r} has "
                         f"{labels.size} labels")

    # ---- preset
    kind = preprocess
    if kind == "auto":
        if mean is not None:
            kind = "raw"
        elif is_jpeg:
            kind = "imagenet"
        elif dtype_kind == "float":
            kind = "raw"
        elif images.shape[1:] == (32, 32, 3) and layout in (None, "NHWC"):
            kind = "cifar"
        else:
            raise ValueError(
                f"{path}: cannot guess the preprocessing of uint8 images of shape "
                f"{images.shape[1:]}; pass preprocess='cifar' or 'imagenet', or "
                "preprocess='raw' with mean=, std= (and layout=)")

    if limit is not None:
        n_keep = min(int(limit), labels.size)
        labels = labels[:n_keep]
        if is_jpeg:
            offsets = offsets[:n_keep + 1]
            data = data[:int(offsets[-1])]
        else:
            images = images[:n_keep]
    if labels.size == 0:
        raise ValueError(f"{path}: the data set is empty")
    if not is_jpeg and dtype_kind == "float":
        _check_finite(path, image_key, images)

    if is_jpeg:
        pixels = _JpegPixels(path, data, np.asarray(offsets, dtype=np.int64),
                             _require_pillow(path))
        h, w, c = pixels.shape
    else:
        if dtype_kind == "float" and kind in ("cifar", "imagenet"):
            raise ValueError(f"{path}: the {kind!r} preset needs uint8 images, but "
                             f"{image_key!r} is {images.dtype}; use preprocess='raw'")
        pixels = _ArrayPixels(images)
        if stored_layout == "NHWC":
            _, h, w, c = images.shape
        else:
            _, c, h, w = images.shape
    sample_shape = (int(c), int(h), int(w))
    to_nchw = "NHWC -> NCHW" if stored_layout == "NHWC" else "already NCHW"
    origin = "JPEG decoded with Pillow to RGB uint8" if is_jpeg else \
        f"{images.dtype} {stored_layout} array {image_key!r}"

    if kind == "cifar":
        if c != 3:
            raise ValueError(f"{path}: the 'cifar' preset needs 3-channel RGB images, got {c} "
                             f"channels (layout {stored_layout})")
        m, s, scale = np.array(CIFAR_MEAN), np.array(CIFAR_STD), 255.0
        desc = (f"cifar: {origin}; x = (x / 255 - {list(CIFAR_MEAN)}) / {list(CIFAR_STD)}; "
                f"{to_nchw}")
    elif kind == "imagenet":
        if c != 3:
            raise ValueError(f"{path}: the 'imagenet' preset needs 3-channel RGB images, got "
                             f"{c} channels")
        m, s, scale = np.full(3, 127.0), np.full(3, 128.0), 1.0
        desc = f"imagenet: {origin}; x = (x - 127) / 128 (EfficientNet-Lite); {to_nchw}"
    else:  # raw
        if dtype_kind == "float":
            if mean is not None:
                raise ValueError(f"{path}: mean/std apply to uint8 images only; float "
                                 f"{image_key!r} is used as it is")
            m = s = None
            scale = 1.0
            desc = f"raw: {origin} used as is (float32); {to_nchw}"
        else:
            if mean is None:
                raise ValueError(f"{path}: uint8 images need mean= and std= with "
                                 "preprocess='raw' (x = (x / 255 - mean) / std; "
                                 "mean=0, std=1 for plain x / 255)")
            m = _channel_stats(path, "mean", mean, c)
            s = _channel_stats(path, "std", std, c)
            scale = 255.0
            desc = (f"raw: {origin}; x = (x / 255 - {m.tolist()}) / {s.tolist()}; {to_nchw}")

    pipeline = _Pipeline(pixels, stored_layout, scale, m, s)
    return Dataset(name=path.stem, inputs=pipeline, labels=labels, preprocessing=desc,
                   sample_shape=sample_shape, source=str(path))


# --------------------------------------------------------------------------- named model inputs

_NP_OF_ORT = {"tensor(float)": np.float32, "tensor(double)": np.float64, "tensor(float16)": np.float16,
              "tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(int16)": np.int16,
              "tensor(int8)": np.int8, "tensor(uint64)": np.uint64, "tensor(uint32)": np.uint32,
              "tensor(uint16)": np.uint16, "tensor(uint8)": np.uint8, "tensor(bool)": np.bool_}


@dataclass(frozen=True)
class InputSpec:
    """One model input: its name, numpy dtype (None: a type this module does not feed) and shape,
    each dimension an int or, when dynamic, its symbolic name (or None)."""

    name: str
    dtype: Optional[np.dtype]
    shape: Tuple[Union[int, str, None], ...]

    def pretty_shape(self) -> list:
        return [d if isinstance(d, int) else (d or "?") for d in self.shape]


def input_specs(model) -> list:
    """The inputs a model must be fed (graph inputs that are not initializers), in order.

    ``model``: a path, serialized bytes, an ``onnx.ModelProto`` or an onnxruntime session.
    """
    if hasattr(model, "get_inputs"):
        return [InputSpec(i.name, np.dtype(_NP_OF_ORT[i.type]) if i.type in _NP_OF_ORT else None,
                          tuple(d if isinstance(d, int) and d > 0 else (d if isinstance(d, str) else None)
                                for d in (i.shape or ())))
                for i in model.get_inputs()]
    if isinstance(model, (str, os.PathLike)):
        if not Path(model).is_file():
            raise ValueError(f"{os.fspath(model)}: no such model file")
        try:
            model = onnx.load(os.fspath(model), load_external_data=False)
        except Exception as exc:  # noqa: BLE001 - protobuf raises several types
            raise ValueError(f"{os.fspath(model)}: not a readable ONNX model ({exc})") from None
    elif isinstance(model, (bytes, bytearray)):
        model = onnx.load_from_string(bytes(model))
    initializers = {t.name for t in model.graph.initializer}
    specs = []
    for vi in model.graph.input:
        if vi.name in initializers:
            continue
        tt = vi.type.tensor_type
        try:
            dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type))
        except Exception:  # noqa: BLE001 - unknown or non-tensor type
            dtype = None
        shape = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tt.shape.dim)
        specs.append(InputSpec(vi.name, dtype, shape))
    return specs


@dataclass(frozen=True)
class NamedInputs:
    """Model inputs by name, all with the same number of samples on their first axis, plus optional
    labels. Made by :func:`load_inputs`; iterate with :meth:`batches`."""

    name: str
    arrays: dict = field(repr=False)           # input name -> array (N, ...), cast to the input's dtype
    labels: Optional[np.ndarray] = field(repr=False, default=None)  # int64 (N,) or None
    source: str = ""

    def __len__(self) -> int:
        return int(next(iter(self.arrays.values())).shape[0])

    def batches(self, batch_size: int = 256) -> Iterator[Tuple[dict, Optional[np.ndarray]]]:
        """Yield ``(feeds, labels)``: a dict of input slices and the labels (or None)."""
        if int(batch_size) < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        n = len(self)
        for start in range(0, n, int(batch_size)):
            stop = min(n, start + int(batch_size))
            yield ({k: v[start:stop] for k, v in self.arrays.items()},
                   None if self.labels is None else self.labels[start:stop])

    def describe(self) -> dict:
        """Per input: dtype, shape (samples first) and the range of its values."""
        out = {}
        for k, v in self.arrays.items():
            lo, hi = (v.min().item(), v.max().item()) if v.size else (None, None)
            out[k] = {"dtype": str(v.dtype), "shape": list(v.shape), "distribution": "user data",
                      "range": [lo, hi]}
        return out


def _kind(dtype) -> str:
    """'float', 'int' or 'bool' (numpy kinds f, iu, b)."""
    k = np.dtype(dtype).kind
    return "float" if k == "f" else "int" if k in "iu" else "bool" if k == "b" else k


def load_inputs(path: Union[str, os.PathLike], model, *, limit: Optional[int] = None) -> NamedInputs:
    """Read an ``.npz`` whose keys are ``model``'s input names (plus optional integer labels under
    ``labels`` or ``y``), checked against the model: every input present and no other key, ranks and
    fixed dimensions as declared (the first axis counts samples), dtype kinds as declared (floats for
    float inputs, integers within the type's range for integer inputs, booleans for bool inputs; then
    cast to the declared type), finite floats, the same sample count everywhere.

    ``model``: what :func:`input_specs` takes. Raises ``ValueError`` (one line, naming the file).
    """
    path = Path(path)
    specs = input_specs(model)
    if limit is not None and (not isinstance(limit, (int, np.integer)) or limit < 1):
        raise ValueError(f"{path}: limit must be a positive integer, got {limit!r}")
    names = [s.name for s in specs]
    with _open_npz(path) as npz:
        keys = list(npz.files)
        label_key = next((k for k in ("labels", "y") if k in keys and k not in names), None)
        missing = [n for n in names if n not in keys]
        expected = f"its keys must be the model's input names ({', '.join(names)}) plus optional labels (or y)"
        if missing:
            raise ValueError(f"{path}: missing input(s) {', '.join(missing)}; found {sorted(keys)}; {expected}")
        unknown = [k for k in keys if k not in names and k != label_key]
        if unknown:
            raise ValueError(f"{path}: unknown key(s) {', '.join(unknown)}: not inputs of the model; {expected}")
        arrays = {n: _read(path, npz, n) for n in names}
        labels = _read(path, npz, label_key) if label_key else None

    count, first = None, None
    for spec in specs:
        a = arrays[spec.name]
        if spec.dtype is None:
            raise ValueError(f"{path}: {spec.name}: the model's input type is not one this tool can feed")
        fits = a.ndim == len(spec.shape) and a.ndim >= 1 and all(
            not isinstance(d, int) or d == s for d, s in zip(spec.shape[1:], a.shape[1:]))
        if not fits:
            raise ValueError(f"{path}: {spec.name}: shape {list(a.shape)} does not fit the model's "
                             f"{spec.pretty_shape()} (the first axis counts samples)")
        if _kind(a.dtype) != _kind(spec.dtype):
            article = "an" if str(spec.dtype)[0] in "aeiou" else "a"
            raise ValueError(f"{path}: {spec.name}: {a.dtype} data for {article} {spec.dtype} input (floats for "
                             "float inputs, integers for integer inputs, booleans for bool inputs)")
        if count is None:
            count, first = a.shape[0], spec.name
        elif a.shape[0] != count:
            raise ValueError(f"{path}: {spec.name} has {a.shape[0]} samples, {first} has {count} samples")
    if labels is not None:
        if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
            raise ValueError(f"{path}: {label_key!r} must be a 1-D integer array, got {labels.dtype} {labels.shape}")
        if labels.size != count:
            raise ValueError(f"{path}: {label_key!r} has {labels.size} labels for {count} samples")
        if labels.size and labels.min() < 0:
            raise ValueError(f"{path}: {label_key!r} contains negative class indices")
        labels = labels.astype(np.int64)
    if limit is not None:
        arrays = {k: v[:int(limit)] for k, v in arrays.items()}
        labels = None if labels is None else labels[:int(limit)]
        count = min(count, int(limit))
    if count == 0:
        raise ValueError(f"{path}: the data set is empty")
    for spec in specs:
        a = arrays[spec.name]
        _check_finite(path, spec.name, a)
        if _kind(spec.dtype) == "int" and a.size:
            info = np.iinfo(spec.dtype)
            if a.min() < info.min or a.max() > info.max:
                raise ValueError(f"{path}: {spec.name}: values {a.min()}..{a.max()} do not fit {spec.dtype}")
        arrays[spec.name] = np.ascontiguousarray(a, dtype=spec.dtype)
    return NamedInputs(name=path.stem, arrays=arrays, labels=labels, source=str(path))


def _npz_dtypes(path: Path) -> dict:
    """key -> dtype of an npz's arrays, from their headers (the data is not read); {} if unreadable."""
    out = {}
    try:
        with zipfile.ZipFile(path) as z:
            for info in z.infolist():
                if not info.filename.endswith(".npy"):
                    continue
                with z.open(info) as f:
                    version = np.lib.format.read_magic(f)
                    header = (np.lib.format.read_array_header_1_0(f) if version == (1, 0)
                              else np.lib.format.read_array_header_2_0(f))
                out[info.filename[:-4]] = np.dtype(header[2])
    except Exception:  # noqa: BLE001 - the loaders report a bad file properly
        return {}
    return out


def load_data(path: Union[str, os.PathLike], model, *, preprocess: str = "auto",
              mean: Optional[Sequence[float]] = None, std: Optional[Sequence[float]] = None,
              layout: Optional[str] = None, limit: Optional[int] = None):
    """The data ``redpp-onnx eval`` reads: a :class:`NamedInputs` when the npz's keys are ``model``'s
    input names (each array of the input's kind, and no image option given), or when the model has
    several inputs or a non-float one; else a labelled image :class:`Dataset` (:func:`load_dataset`)."""
    path = Path(path)
    specs = input_specs(model)
    image_options = preprocess in ("cifar", "imagenet") or mean is not None or std is not None or layout
    if not image_options and path.is_file() and zipfile.is_zipfile(path):
        dtypes = _npz_dtypes(path)
        if all(s.name in dtypes and s.dtype is not None and _kind(dtypes[s.name]) == _kind(s.dtype)
               for s in specs):
            return load_inputs(path, model, limit=limit)
    if len(specs) != 1 or specs[0].dtype is None or _kind(specs[0].dtype) != "float":
        return load_inputs(path, model, limit=limit)
    return load_dataset(path, preprocess=preprocess, mean=mean, std=std, layout=layout, limit=limit)


# --------------------------------------------------------------------------- evaluation

@dataclass(frozen=True)
class EvalResult:
    """Accuracy of ``model`` (and, with a reference, its drift from the reference).

    Fractions are in [0, 1]. ``*_correct`` are the integer counts behind them. Accuracy
    (``top1``, ``top5``, ``num_classes``, ``agreement``) needs labels: ``None`` on data without
    them. Logit statistics use the model's first output, one L2 norm per sample:
    ``mean_logit_norm`` is E_x ||f~(x)|| (the evaluated model), ``reference_mean_logit_norm``
    E_x ||f(x)||, ``mean_logit_diff_norm`` E_x ||f~(x) - f(x)||, ``mean_rel_l2_logit_diff``
    E_x ||f~(x) - f(x)|| / ||f(x)||, ``max_abs_logit_diff`` max |f~ - f| over all samples
    and classes, ``agreement`` the fraction of samples whose argmax is the same.
    ``outputs`` (with a reference): per output, each sample's output flattened, ``cosine_mean``
    and ``cosine_min`` of the cosine similarity between model and reference over the samples
    (1 when both are zero, 0 when one is), ``rel_l2`` the relative L2 difference pooled over all
    samples, ||f~ - f|| / ||f||, and ``max_abs_diff``.
    ``batch_size_used``: the batch actually run (1 when the model's batch axis is fixed to
    1 or it failed on larger batches; see ``notes``).
    """

    model: str
    dataset: str
    n: int
    num_classes: Optional[int]
    top1: Optional[float]
    top5: Optional[float]
    top1_correct: Optional[int]
    top5_correct: Optional[int]
    mean_logit_norm: float
    batch_size_used: int
    seconds: float
    reference: Optional[str] = None
    reference_top1: Optional[float] = None
    reference_top5: Optional[float] = None
    reference_top1_correct: Optional[int] = None
    reference_top5_correct: Optional[int] = None
    reference_mean_logit_norm: Optional[float] = None
    reference_batch_size_used: Optional[int] = None
    agreement: Optional[float] = None
    max_abs_logit_diff: Optional[float] = None
    mean_rel_l2_logit_diff: Optional[float] = None
    mean_logit_diff_norm: Optional[float] = None
    notes: Tuple[str, ...] = ()
    outputs: Tuple[dict, ...] = ()

    def to_dict(self) -> dict:
        """Plain JSON-serialisable dict (every field; ``None`` where there is no reference)."""
        d = asdict(self)
        d["notes"] = list(self.notes)
        d["outputs"] = [dict(o) for o in self.outputs]
        return d

    def summary(self, model_name: Optional[str] = None, reference_name: Optional[str] = None) -> str:
        """The lines ``redpp-onnx eval`` prints."""
        name = model_name or self.model
        lines = []
        if self.top1 is not None:
            lines.append(f"{name} on {self.dataset} (n={self.n}): top-1 {100 * self.top1:.2f}% "
                         f"({self.top1_correct}/{self.n}), top-5 {100 * self.top5:.2f}%")
            if self.reference is not None:
                lines.append(f"{reference_name or self.reference} (reference): top-1 {100 * self.reference_top1:.2f}% "
                             f"({self.reference_top1_correct}/{self.n}); agreement {100 * self.agreement:.2f}%, "
                             f"max |logit diff| {self.max_abs_logit_diff:.3g}")
        else:
            lines.append(f"{name} on {self.dataset} (n={self.n}, no labels) against "
                         f"{reference_name or self.reference} (reference):")
        if self.reference is not None:
            for o in self.outputs:
                lines.append(f"  {o['name']}: cosine similarity mean {o['cosine_mean']:.6f}, min "
                             f"{o['cosine_min']:.6f}; relative L2 {o['rel_l2']:.3g}; max |diff| "
                             f"{o['max_abs_diff']:.3g}")
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines) + "\n"


def _describe(model) -> str:
    if isinstance(model, (str, os.PathLike)):
        return os.fspath(model)
    if isinstance(model, onnx.ModelProto):
        return f"<ModelProto {model.graph.name or 'unnamed'}>"
    if isinstance(model, (bytes, bytearray)):
        return f"<serialized model, {len(model)} bytes>"
    return f"<{type(model).__name__}>"


_ORT_DTYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16,
               "tensor(double)": np.float64}


class _BatchShapeError(ValueError):
    """The first output's leading axis is not the batch size."""


class _Runner:
    """One session; runs a batch (a dict of input arrays, samples first) in chunks its batch axis
    accepts, and returns every output flattened per sample (float64, ``None`` for an output without
    a batch axis)."""

    def __init__(self, model, label: str, batch_size: int, ort_options: dict):
        if hasattr(model, "run") and hasattr(model, "get_inputs"):  # an InferenceSession
            self.sess = model
        else:
            if isinstance(model, (str, os.PathLike)) and not Path(model).is_file():
                raise ValueError(f"{os.fspath(model)}: no such model file")
            self.sess = _make_session(model, **ort_options)
        self.label = label
        self.specs = input_specs(self.sess)
        inp = self.sess.get_inputs()[0]
        self.input_name = inp.name
        self.output_names = [o.name for o in self.sess.get_outputs()]
        self.output_name = self.output_names[0]
        self.shape = list(inp.shape)
        self.notes = []
        self.fixed = None
        dim0 = self.shape[0] if self.shape else None
        self.batch = int(batch_size)
        if isinstance(dim0, int) and dim0 > 0:
            self.fixed = dim0
            if dim0 != self.batch:
                self.notes.append(f"{label}: batch axis of input {inp.name!r} is fixed to "
                                  f"{dim0}; ran {dim0} sample(s) at a time")
            self.batch = dim0
        self.tried_batches = self.fixed is not None or self.batch == 1
        self.unbatched = set()

    def check_sample_shape(self, sample_shape, dataset_name):
        """For an image data set: one float input of that sample shape."""
        if len(self.specs) != 1:
            raise ValueError(f"{self.label}: has {len(self.specs)} inputs ({', '.join(s.name for s in self.specs)}); "
                             f"data set {dataset_name!r} feeds one: give an npz whose keys are the input names")
        inp = self.sess.get_inputs()[0]
        if _ORT_DTYPES.get(inp.type) is None:
            raise ValueError(f"{self.label}: first input {inp.name!r} has type {inp.type}; "
                             "a float image input is expected")
        want = self.shape[1:]
        ok = len(want) == len(sample_shape) and all(
            not isinstance(w, int) or w <= 0 or w == s for w, s in zip(want, sample_shape))
        if not ok:
            pretty = ["N" if not isinstance(d, int) else d for d in self.shape]
            raise ValueError(f"{self.label}: input {self.input_name!r} expects shape {pretty}, "
                             f"but data set {dataset_name!r} gives samples of shape "
                             f"{list(sample_shape)}")

    def check_inputs(self, data: "NamedInputs"):
        """For named inputs: the same input names (the data was checked against the model it was
        loaded for; a reference must take the same inputs)."""
        want, have = [s.name for s in self.specs], list(data.arrays)
        if sorted(want) != sorted(have):
            raise ValueError(f"{self.label}: takes inputs {', '.join(want)}, but data set {data.name!r} "
                             f"holds {', '.join(have)}")

    def feeds(self, batch) -> dict:
        if isinstance(batch, dict):
            return {s.name: batch[s.name].astype(s.dtype, copy=False) if s.dtype is not None else batch[s.name]
                    for s in self.specs}
        return {self.input_name: batch.astype(_ORT_DTYPES[self.sess.get_inputs()[0].type], copy=False)}

    def _run(self, feeds: dict) -> list:
        n = next(iter(feeds.values())).shape[0]
        ys = self.sess.run(self.output_names, feeds)
        first = np.asarray(ys[0])
        if first.ndim < 1 or first.shape[0] != n:
            raise _BatchShapeError(f"{self.label}: first output {self.output_name!r} has shape "
                                   f"{list(first.shape)} for a batch of {n}")
        outs = []
        for name, y in zip(self.output_names, ys):
            y = np.asarray(y)
            if y.ndim < 1 or y.shape[0] != n:
                self.unbatched.add(name)
                outs.append(None)
            else:
                outs.append(y.reshape(n, -1).astype(np.float64))
        return outs

    @staticmethod
    def _cat(parts: list) -> list:
        return [None if any(p[k] is None for p in parts) else np.concatenate([p[k] for p in parts], axis=0)
                for k in range(len(parts[0]))]

    def __call__(self, batch) -> list:
        try:
            return self._call(batch)
        except (ValueError, TypeError):
            raise
        except Exception as exc:  # noqa: BLE001 - onnxruntime's errors: one line, as a user error
            from .verify import ort_message

            raise ValueError(f"{self.label}: onnxruntime cannot run it on this data: {ort_message(exc)}") from None

    def _call(self, batch) -> list:
        feeds = self.feeds(batch)
        n = next(iter(feeds.values())).shape[0]

        def part(a, b):
            return {k: v[a:b] for k, v in feeds.items()}

        if not self.tried_batches and n > 1:
            # First multi-sample batch: a graph may declare a dynamic batch axis yet only work
            # with 1 (hard-coded Reshape etc.): it fails, or its output loses the batch axis.
            # Then fall back to single samples, if those work.
            self.tried_batches = True
            try:
                return self._run(feeds)
            except Exception as exc:  # onnxruntime raises its own exception classes
                try:
                    out = self._run(part(0, 1))
                except Exception:
                    raise exc from None
                first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
                self.notes.append(f"{self.label}: failed on a batch of {n} ({first_line[:160]}); "
                                  "ran one sample at a time")
                self.batch = 1
                return self._cat([out] + [self._run(part(i, i + 1)) for i in range(1, n)])
        if self.batch >= n and (self.fixed is None or self.fixed == n):
            return self._run(feeds)
        outs = []
        for start in range(0, n, self.batch):
            chunk = part(start, start + self.batch)
            k = next(iter(chunk.values())).shape[0]
            if self.fixed is not None and k < self.fixed:  # pad the last chunk, drop extras
                chunk = {name: np.concatenate([v, np.zeros((self.fixed - k,) + v.shape[1:], dtype=v.dtype)], axis=0)
                         for name, v in chunk.items()}
            outs.append([None if y is None else y[:k] for y in self._run(chunk)])
        return self._cat(outs)


class _Accuracy:
    def __init__(self):
        self.top1 = 0
        self.top5 = 0

    def update(self, logits: np.ndarray, labels: np.ndarray) -> np.ndarray:
        k = min(5, logits.shape[1])
        # stable sort of -logits: ties go to the lower class index, as in argmax
        order = np.argsort(-logits, axis=1, kind="stable")[:, :k]
        hits = order == labels[:, None]
        self.top1 += int(hits[:, 0].sum())
        self.top5 += int(hits.any(axis=1).sum())
        return order[:, 0]


class _Similarity:
    """Streaming comparison of one output with the reference's: cosine per sample, pooled relative L2."""

    def __init__(self, name: str):
        self.name = name
        self.n = 0
        self.cos_sum = 0.0
        self.cos_min = 1.0
        self.diff2 = 0.0
        self.ref2 = 0.0
        self.max_abs = 0.0

    def update(self, a: np.ndarray, b: np.ndarray) -> None:
        self.n += a.shape[0]
        cos = cosines(a, b)
        if cos.size:
            self.cos_sum += float(cos.sum())
            self.cos_min = min(self.cos_min, float(cos.min()))
        d = a - b
        self.diff2 += float(np.sum(d * d))
        self.ref2 += float(np.sum(b * b))
        if d.size:
            self.max_abs = max(self.max_abs, float(np.abs(d).max()))

    def to_dict(self) -> dict:
        rel = (self.diff2 / self.ref2) ** 0.5 if self.ref2 > 0 else (0.0 if self.diff2 == 0 else float("inf"))
        return {"name": self.name, "cosine_mean": self.cos_sum / self.n if self.n else 1.0,
                "cosine_min": self.cos_min, "rel_l2": rel, "max_abs_diff": self.max_abs}


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Cosine similarity of the rows of ``a`` and ``b`` (2-D): 1 when both rows are zero, 0 when one
    is; computed as 1 - ||a/|a| - b/|b|||^2 / 2 (exact 1 for equal rows, accurate near 1)."""
    na = np.linalg.norm(a, axis=1, keepdims=True)
    nb = np.linalg.norm(b, axis=1, keepdims=True)
    ua = np.divide(a, na, out=np.zeros_like(a), where=na > 0)
    ub = np.divide(b, nb, out=np.zeros_like(b), where=nb > 0)
    cos = 1.0 - 0.5 * np.sum((ua - ub) ** 2, axis=1)
    both_zero = (na[:, 0] == 0) & (nb[:, 0] == 0)
    one_zero = (na[:, 0] == 0) != (nb[:, 0] == 0)
    cos = np.where(both_zero, 1.0, np.where(one_zero, 0.0, cos))
    return np.clip(cos, -1.0, 1.0)


def evaluate(model, dataset, *, batch_size: int = 256, reference=None,
             progress: Optional[ProgressCallback] = None, **ort_options) -> EvalResult:
    """Top-1/top-5 accuracy of ``model`` on ``dataset``; with ``reference``, output drift too.

    ``dataset``: a labelled image :class:`Dataset` (fed to the model's only input) or
    :class:`NamedInputs` (fed by name; labels optional: without them a ``reference`` is needed, and
    only the outputs are compared). ``model``/``reference``: a path, serialized bytes, an
    ``onnx.ModelProto`` or an existing ``onnxruntime.InferenceSession``; sessions are created with
    :func:`redpp_onnx.session` (so ``ai.redpp`` custom ops run) and ``ort_options``
    (``providers=``, or ``SessionOptions`` attributes such as ``intra_op_num_threads=2``). The
    first output is taken as the logits (flattened per sample); with a reference, every output is
    compared (``EvalResult.outputs``). Both models see the very same batches.
    ``progress(done, total)`` is called after each batch. Models with a fixed batch axis are run at
    that size (the last chunk zero-padded); a model with a dynamic axis that fails on multi-sample
    batches is re-run one sample at a time; ``batch_size_used`` and ``notes`` say so.
    """
    if not isinstance(dataset, (Dataset, NamedInputs)):
        raise TypeError("dataset must be a redpp_onnx.evaluate.Dataset or NamedInputs, got "
                        f"{type(dataset).__name__}")
    if int(batch_size) < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    labelled = dataset.labels is not None
    if not labelled and reference is None:
        raise ValueError(f"{dataset.source or dataset.name}: no labels (key 'labels' or 'y'), so no accuracy to "
                         "measure: give a reference model (--ref) to compare the outputs")
    t0 = time.perf_counter()
    runners = [_Runner(model, _describe(model), batch_size, ort_options)]
    if reference is not None:
        runners.append(_Runner(reference, "reference " + _describe(reference), batch_size, ort_options))
    for r in runners:
        if isinstance(dataset, NamedInputs):
            r.check_inputs(dataset)
        else:
            r.check_sample_shape(dataset.sample_shape, dataset.name)
    runner, ref = runners[0], (runners[1] if reference is not None else None)
    if ref is not None and ref.output_names != runner.output_names:
        raise ValueError(f"{ref.label}: outputs {', '.join(ref.output_names)}, the model "
                         f"{', '.join(runner.output_names)}")

    acc, ref_acc = _Accuracy(), _Accuracy()
    sims = [_Similarity(name) for name in runner.output_names]
    agree = 0
    norm_sum = ref_norm_sum = 0.0
    max_abs = 0.0
    diff_norm_sum = 0.0
    rel_sum = 0.0
    num_classes = None
    n_total = len(dataset)
    done = 0
    label_max = int(dataset.labels.max()) if labelled else None
    for x, y in dataset.batches(batch_size):
        outs = runner(x)
        logits = outs[0]
        norm_sum += float(np.linalg.norm(logits, axis=1).sum())
        if labelled:
            if num_classes is None:
                num_classes = logits.shape[1]
                if label_max >= num_classes:
                    raise ValueError(f"{runner.label}: outputs {num_classes} classes, but the labels "
                                     f"of {dataset.name!r} go up to {label_max}")
            top = acc.update(logits, y)
        if ref is not None:
            ref_outs = ref(x)
            ref_logits = ref_outs[0]
            if ref_logits.shape != logits.shape:
                raise ValueError(f"{ref.label}: outputs {ref_logits.shape[1]} values per sample, "
                                 f"the model {logits.shape[1]}")
            ref_norm_sum += float(np.linalg.norm(ref_logits, axis=1).sum())
            for sim, a, b in zip(sims, outs, ref_outs):
                if a is not None and b is not None and a.shape == b.shape:
                    sim.update(a, b)
            if labelled:
                ref_top = ref_acc.update(ref_logits, y)
                agree += int((top == ref_top).sum())
            diff = logits - ref_logits
            if diff.size:
                max_abs = max(max_abs, float(np.abs(diff).max()))
            dn = np.linalg.norm(diff, axis=1)
            rn = np.linalg.norm(ref_logits, axis=1)
            with np.errstate(divide="ignore", invalid="ignore"):
                rel = np.where(rn > 0, dn / np.where(rn > 0, rn, 1.0),
                               np.where(dn > 0, np.inf, 0.0))
            diff_norm_sum += float(dn.sum())
            rel_sum += float(rel.sum())
        done += next(iter(x.values())).shape[0] if isinstance(x, dict) else x.shape[0]
        if progress is not None:
            progress(done, n_total)

    n = done
    notes = runner.notes + (ref.notes if ref is not None else [])
    skipped = sorted(runner.unbatched | (ref.unbatched if ref is not None else set()))
    if ref is not None and skipped:
        notes.append(f"output(s) {', '.join(skipped)} have no batch axis: not compared")
    kwargs = dict(
        model=runner.label, dataset=dataset.name, n=n, num_classes=int(num_classes) if labelled else None,
        top1=acc.top1 / n if labelled else None, top5=acc.top5 / n if labelled else None,
        top1_correct=acc.top1 if labelled else None, top5_correct=acc.top5 if labelled else None,
        mean_logit_norm=norm_sum / n, batch_size_used=runner.batch,
        seconds=time.perf_counter() - t0, notes=tuple(notes))
    if ref is not None:
        kwargs.update(
            reference=ref.label[len("reference "):], reference_mean_logit_norm=ref_norm_sum / n,
            reference_batch_size_used=ref.batch, max_abs_logit_diff=max_abs,
            mean_rel_l2_logit_diff=rel_sum / n, mean_logit_diff_norm=diff_norm_sum / n,
            outputs=tuple(s.to_dict() for s in sims if s.n))
        if labelled:
            kwargs.update(reference_top1=ref_acc.top1 / n, reference_top5=ref_acc.top5 / n,
                          reference_top1_correct=ref_acc.top1, reference_top5_correct=ref_acc.top5,
                          agreement=agree / n)
    return EvalResult(**kwargs)
