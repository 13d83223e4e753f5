"""Accuracy and logit-drift evaluation of ONNX classifiers on labelled image sets.

Two steps::

    from redpp_onnx.evaluate import load_dataset, evaluate

    data = load_dataset("shared/bench/cifar10_test_exact1017.npz")      # preprocessing picked
    result = evaluate("compressed.onnx", data, reference="original.onnx")
    print(result.top1, result.agreement, result.to_dict())

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
    "evaluate",
    "load_dataset",
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


# --------------------------------------------------------------------------- evaluation

@dataclass(frozen=True)
class EvalResult:
    """Accuracy of ``model`` (and, with a reference, its drift from the reference).

    Fractions are in [0, 1]. ``*_correct`` are the integer counts behind them. Logit
    statistics use the model's first output, one L2 norm per sample: ``mean_logit_norm``
    is E_x ||f~(x)|| (the evaluated model), ``reference_mean_logit_norm`` E_x ||f(x)||,
    ``mean_logit_diff_norm`` E_x ||f~(x) - f(x)||, ``mean_rel_l2_logit_diff``
    E_x ||f~(x) - f(x)|| / ||f(x)||, ``max_abs_logit_diff`` max |f~ - f| over all samples
    and classes, ``agreement`` the fraction of samples whose argmax is the same.
    ``batch_size_used``: the batch actually run (1 when the model's batch axis is fixed to
    1 or it failed on larger batches; see ``notes``).
    """

    model: str
    dataset: str
    n: int
    num_classes: int
    top1: float
    top5: float
    top1_correct: int
    top5_correct: int
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

    def to_dict(self) -> dict:
        """Plain JSON-serialisable dict (every field; ``None`` where there is no reference)."""
        d = asdict(self)
        d["notes"] = list(self.notes)
        return d


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
    """One session; runs a float32 batch in chunks its batch axis accepts."""

    def __init__(self, model, label: str, batch_size: int, ort_options: dict):
        if hasattr(model, "run") and hasattr(model, "get_inputs"):  # an InferenceSession
            self.sess = model
        else:
            if isinstance(model, (str, os.PathLike)) and not Path(model).is_file():
                raise ValueError(f"{os.fspath(model)}: no such model file")
            self.sess = _make_session(model, **ort_options)
        self.label = label
        inp = self.sess.get_inputs()[0]
        self.input_name = inp.name
        self.output_name = self.sess.get_outputs()[0].name
        self.dtype = _ORT_DTYPES.get(inp.type)
        if self.dtype is None:
            raise ValueError(f"{label}: first input {inp.name!r} has type {inp.type}; "
                             "a float image input is expected")
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

    def check_sample_shape(self, sample_shape, dataset_name):
        want = self.shape[1:]
        ok = len(want) == len(sample_shape) and all(
            not isinstance(w, int) or w <= 0 or w == s for w, s in zip(want, sample_shape))
        if not ok:
            pretty = ["N" if not isinstance(d, int) else d for d in self.shape]
            raise ValueError(f"{self.label}: input {self.input_name!r} expects shape {pretty}, "
                             f"but data set {dataset_name!r} gives samples of shape "
                             f"{list(sample_shape)}")

    def _run(self, x: np.ndarray) -> np.ndarray:
        y = self.sess.run([self.output_name], {self.input_name: x})[0]
        y = np.asarray(y)
        if y.ndim < 1 or y.shape[0] != x.shape[0]:
            raise _BatchShapeError(f"{self.label}: first output {self.output_name!r} has shape "
                             f"{list(y.shape)} for a batch of {x.shape[0]}")
        return y.reshape(y.shape[0], -1).astype(np.float64)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        x = x.astype(self.dtype, copy=False)
        n = x.shape[0]
        if not self.tried_batches and n > 1:
            # First multi-sample batch: a graph may declare a dynamic batch axis yet only work
            # with 1 (hard-coded Reshape etc.): it fails, or its output loses the batch axis.
            # Then fall back to single samples, if those work.
            self.tried_batches = True
            try:
                return self._run(x)
            except Exception as exc:  # onnxruntime raises its own exception classes
                try:
                    out = self._run(x[:1])
                except Exception:
                    raise exc from None
                first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
                self.notes.append(f"{self.label}: failed on a batch of {n} ({first_line[:160]}); "
                                  "ran one sample at a time")
                self.batch = 1
                rest = [self._run(x[i:i + 1]) for i in range(1, n)]
                return np.concatenate([out] + rest, axis=0)
        if self.batch >= n and (self.fixed is None or self.fixed == n):
            return self._run(x)
        outs = []
        for start in range(0, n, self.batch):
            chunk = x[start:start + self.batch]
            k = chunk.shape[0]
            if self.fixed is not None and k < self.fixed:  # pad the last chunk, drop extras
                pad = np.zeros((self.fixed - k,) + chunk.shape[1:], dtype=chunk.dtype)
                chunk = np.concatenate([chunk, pad], axis=0)
            outs.append(self._run(chunk)[:k])
        return np.concatenate(outs, axis=0)


class _Accuracy:
    def __init__(self):
        self.top1 = 0
        self.top5 = 0
        self.norm_sum = 0.0

    def update(self, logits: np.ndarray, labels: np.ndarray) -> np.ndarray:
        k = min(5, logits.shape[1])
        # stable sort of -logits: ties go to the lower class index, as in argmax
        order = np.argsort(-logits, axis=1, kind="stable")[:, :k]
        hits = order == labels[:, None]
        self.top1 += int(hits[:, 0].sum())
        self.top5 += int(hits.any(axis=1).sum())
        self.norm_sum += float(np.linalg.norm(logits, axis=1).sum())
        return order[:, 0]


def evaluate(model, dataset: Dataset, *, batch_size: int = 256, reference=None,
             progress: Optional[ProgressCallback] = None, **ort_options) -> EvalResult:
    """Top-1/top-5 accuracy of ``model`` on ``dataset``; with ``reference``, logit drift too.

    ``model``/``reference``: a path, serialized bytes, an ``onnx.ModelProto`` or an existing
    ``onnxruntime.InferenceSession``; sessions are created with :func:`redpp_onnx.session`
    (so ``ai.redpp`` custom ops run) and ``ort_options`` (``providers=``, or
    ``SessionOptions`` attributes such as ``intra_op_num_threads=2``). The first input
    receives the batch, the first output is taken as the logits (flattened per sample).
    Both models see the very same batches. ``progress(done, total)`` is called after each
    batch. Models with a fixed batch axis are run at that size (the last chunk
    zero-padded); a model with a dynamic axis that fails on multi-sample batches is
    re-run one sample at a time; ``batch_size_used`` and ``notes`` say so.
    """
    if not isinstance(dataset, Dataset):
        raise TypeError(f"dataset must be a redpp_onnx.evaluate.Dataset, got {type(dataset).__name__}")
    if int(batch_size) < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    t0 = time.perf_counter()
    runner = _Runner(model, _describe(model), batch_size, ort_options)
    runner.check_sample_shape(dataset.sample_shape, dataset.name)
    ref = None
    if reference is not None:
        ref = _Runner(reference, "reference " + _describe(reference), batch_size, ort_options)
        ref.check_sample_shape(dataset.sample_shape, dataset.name)

    acc, ref_acc = _Accuracy(), _Accuracy()
    agree = 0
    max_abs = 0.0
    diff_norm_sum = 0.0
    rel_sum = 0.0
    num_classes = None
    n_total = len(dataset)
    done = 0
    label_max = int(dataset.labels.max())
    for x, y in dataset.batches(batch_size):
        logits = runner(x)
        if num_classes is None:
            num_classes = logits.shape[1]
            if label_max >= num_classes:
                raise ValueError(f"{runner.label}: outputs {num_classes} classes, but the labels "
                                 f"of {dataset.name!r} go up to {label_max}")
        top = acc.update(logits, y)
        if ref is not None:
            ref_logits = ref(x)
            if ref_logits.shape != logits.shape:
                raise ValueError(f"{ref.label}: outputs {ref_logits.shape[1]} values per sample, "
                                 f"the model {logits.shape[1]}")
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
        done += x.shape[0]
        if progress is not None:
            progress(done, n_total)

    n = done
    notes = tuple(runner.notes + (ref.notes if ref is not None else []))
    kwargs = dict(
        model=runner.label, dataset=dataset.name, n=n, num_classes=int(num_classes),
        top1=acc.top1 / n, top5=acc.top5 / n, top1_correct=acc.top1, top5_correct=acc.top5,
        mean_logit_norm=acc.norm_sum / n, batch_size_used=runner.batch,
        seconds=time.perf_counter() - t0, notes=notes)
    if ref is not None:
        kwargs.update(
            reference=ref.label[len("reference "):], reference_top1=ref_acc.top1 / n,
            reference_top5=ref_acc.top5 / n, reference_top1_correct=ref_acc.top1,
            reference_top5_correct=ref_acc.top5, reference_mean_logit_norm=ref_acc.norm_sum / n,
            reference_batch_size_used=ref.batch, agreement=agree / n, max_abs_logit_diff=max_abs,
            mean_rel_l2_logit_diff=rel_sum / n, mean_logit_diff_norm=diff_norm_sum / n)
    return EvalResult(**kwargs)
