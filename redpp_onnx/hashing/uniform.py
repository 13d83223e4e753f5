"""Baseline: uniform symmetric per-tensor int8 quantize-dequantize (METHOD.md step 1.6).

With ``s = max|W| / 127`` every weight becomes ``s · clip(round(w / s), -127, 127)``.
Symmetric means the zero point is 0 and the levels are ``-127 .. 127``: 255 levels, ``-128``
unused, so that ``+max|W|`` and ``-max|W|`` are both represented exactly and 0 stays 0 (the
usual "narrow range" symmetric int8 weight quantization). The paper's "256 values" counts the
int8 range; with a symmetric scale the 256th level is never produced. Rounding is to nearest,
ties to even (``np.rint``), so the error of every weight is at most ``s / 2`` (plus the float32
rounding of the dequantized value).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .kde import QuantResult, _as_float32, _codebook_result_fields, _unchanged_fields

__all__ = ["UniformResult", "uniform_int8", "INT8_LEVELS"]

INT8_LEVELS = 127
"""Largest quantized level; levels are ``-INT8_LEVELS .. INT8_LEVELS``."""


@dataclass(frozen=True, eq=False)
class UniformResult(QuantResult):
    """Result of :func:`uniform_int8` (fields of :class:`QuantResult` plus ``scale``).

    Attributes:
        scale: ``s = max|W| / 127`` (0 when the tensor was left unchanged); ``codebook`` holds
            the used values among ``s · k``, ``k = -127 .. 127``.
    """

    scale: float


def uniform_int8(w) -> UniformResult:
    """Uniform symmetric per-tensor int8 quantize-dequantize of ``w`` (any shape, float32 out).

    An empty or all-zero tensor is returned unchanged with ``reason`` set.

    Raises:
        ValueError: NaN or inf in ``w``.
        TypeError: a non-numeric ``w``.
    """
    w32 = _as_float32(w)
    if w32.size == 0:
        return UniformResult(**_unchanged_fields(w32, "empty tensor"), scale=0.0)
    v32, inv, counts = np.unique(w32.ravel(), return_inverse=True, return_counts=True)
    v = v32.astype(np.float64)
    peak = float(max(-v[0], v[-1]))
    if peak == 0.0:
        return UniformResult(**_unchanged_fields(w32, "all weights are zero"), scale=0.0)
    scale = peak / INT8_LEVELS
    q = np.clip(np.rint(v / scale), -INT8_LEVELS, INT8_LEVELS)
    hashed_of_unique = (q * scale).astype(np.float32)
    fields = _codebook_result_fields(w32, hashed_of_unique, inv, v, counts.astype(np.float64))
    return UniformResult(**fields, reason=None, scale=scale)
