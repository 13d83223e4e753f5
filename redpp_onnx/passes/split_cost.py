"""Is SplitConv faster than onnxruntime's Conv for this layer? A calibrated model, or a measurement.

Predicted ratio SplitConv / Conv time: a linear function of :func:`features`: ``u = K/(C_in·C_out)``
(the share of products kept), ``z = nnz(idx)/(C_in·C_out)`` (the share of additions kept),
``64/C_out`` (the gathering of each input channel is shared by fewer outputs), the waste of the
last, partly filled 64-pixel tile, and ``64/pixels`` (fixed cost per call); one set of
coefficients for 1x1 kernels and one for larger ones, fitted by least squares on the grid of
``benchmarks/calibrate_split_cost.py`` (which writes ``split_cost.json``: the numbers, the
machine and the fit's error). A layer is split when the ratio is at most
``SPLIT_IF_RATIO_AT_MOST``: about one rms error of the fit below 1, so that "auto" is not slower.

``measure_ratio`` (``--tune``) times both ops on the layer's own shapes instead (batch 1, one
thread, median of repeated runs).
"""

from __future__ import annotations

import functools
import json
import statistics
import time
from importlib import resources
from typing import Optional

import numpy as np

SPLIT_IF_RATIO_AT_MOST = 0.8
TILE = 64  # output pixels per SplitConv task (csrc/split_conv.h kTile)
CALIBRATION_FILE = "split_cost.json"


@functools.lru_cache(maxsize=1)
def calibration() -> dict:
    """The fitted coefficients shipped with the package ({} if the file is missing)."""
    try:
        text = resources.files(__package__).joinpath(CALIBRATION_FILE).read_text()
    except (FileNotFoundError, OSError):
        return {}
    return json.loads(text)


def features(split, pixels: int) -> list:
    """[1, u, z, 64/C_out, tile waste, 64/pixels] for a layer with ``pixels`` output pixels."""
    total = split.idx.size
    u = split.kernels.shape[0] / total
    z = float(np.sum(split.idx >= 0)) / total
    fill = pixels / (np.ceil(pixels / TILE) * TILE)
    return [1.0, u, z, 64.0 / split.c_out, 1.0 / fill - 1.0, 64.0 / pixels]


def predict_ratio(split, kernel_shape, pixels: Optional[int]) -> Optional[float]:
    """Predicted SplitConv / Conv time (batch 1, one thread); None when it cannot be predicted."""
    cal = calibration().get("coefficients", {})
    key = "1x1" if int(np.prod(kernel_shape)) == 1 else "kxk"
    if key not in cal or split.idx.size == 0 or not pixels:
        return None
    return float(np.dot(cal[key], features(split, pixels)))


def time_ratio(weight: np.ndarray, split, x_shape, strides, pads, dilations, *, repeat: int = 15,
               threads: int = 1) -> tuple:
    """(SplitConv median s, Conv median s) on a random input of ``x_shape`` (batch 1)."""
    from ..runtime import session
    from ._timing_models import conv_model, split_conv_model

    x = np.random.default_rng(0).standard_normal((1,) + tuple(x_shape[1:])).astype(np.float32)
    geometry = dict(strides=list(strides), pads=list(pads), dilations=list(dilations))
    medians = []
    for model in (split_conv_model(split, **geometry), conv_model(weight, **geometry)):
        sess = session(model, intra_op_num_threads=threads, inter_op_num_threads=1)
        for _ in range(3):
            sess.run(None, {"X": x})
        times = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            sess.run(None, {"X": x})
            times.append(time.perf_counter() - t0)
        medians.append(statistics.median(times))
    return medians[0], medians[1]


def measure_ratio(split, weight, x_shape, strides, pads, dilations) -> Optional[float]:
    if x_shape is None:
        return None
    t_split, t_conv = time_ratio(weight, split, x_shape, strides, pads, dilations)
    return t_split / t_conv
