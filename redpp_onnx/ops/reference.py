"""Numpy reference of ``ai.redpp::SplitConv``: the oracle the C++ kernel is tested against.

It follows the contract in ``schema.py`` literally (one product per unique kernel, then the
index map), accumulating in float64. Use it directly (:func:`split_conv`) or through
``onnx.reference.ReferenceEvaluator(model, new_ops=[SplitConv])``.
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view
from onnx.reference.op_run import OpRun

from . import schema


def _conv_one_channel(xc: np.ndarray, kernels: np.ndarray, geometry: schema.ConvGeometry) -> np.ndarray:
    """``xc[N, *S]`` cross-correlated with every ``kernels[k, *ks]``: ``[N, k, *S']`` (float64)."""
    nd = xc.ndim - 1
    ks = kernels.shape[1:]
    pads = geometry.pads
    xp = np.pad(xc.astype(np.float64), [(0, 0)] + [(pads[a], pads[a + nd]) for a in range(nd)])
    span = [geometry.dilations[a] * (ks[a] - 1) + 1 for a in range(nd)]
    win = sliding_window_view(xp, span, axis=tuple(range(1, nd + 1)))  # [N, *valid, *span]
    win = win[(slice(None),)
              + tuple(slice(None, None, s) for s in geometry.strides)
              + tuple(slice(None, None, d) for d in geometry.dilations)]
    out = win.shape[1:1 + nd]
    assert out == geometry.output_size(xc.shape[1:], ks)
    taps = int(np.prod(ks))
    patches = win.reshape(win.shape[0], int(np.prod(out)), taps)
    prod = np.einsum("npt,ut->nup", patches, kernels.reshape(-1, taps).astype(np.float64))
    return prod.reshape((xc.shape[0], kernels.shape[0]) + out)


def split_conv(X, kernels, offsets, idx, B=None, scale=None, shift=None, *, strides=None,
               pads=None, dilations=None, activation="", clip_min=float("-inf"),
               clip_max=float("inf")) -> np.ndarray:
    """``Y = act(scale * (B + sum_c P[c, idx[c, :]]) + shift)``; see ``schema.py``."""
    X = np.asarray(X)
    nd = X.ndim - 2
    if nd not in (1, 2) or kernels.ndim != nd + 1:
        raise ValueError(f"SplitConv: X rank {X.ndim} / kernels rank {kernels.ndim} not supported")
    geometry = schema.ConvGeometry.resolve(nd, strides, pads, dilations)
    c_in, c_out = idx.shape
    if X.shape[1] != c_in or offsets.shape != (c_in + 1,) or offsets[-1] != kernels.shape[0]:
        raise ValueError("SplitConv: X, offsets, idx and kernels disagree on C_in / K")
    out_spatial = geometry.output_size(X.shape[2:], kernels.shape[1:])
    z = np.zeros((X.shape[0], c_out) + out_spatial, dtype=np.float64)
    for c in range(c_in):
        lo, hi = int(offsets[c]), int(offsets[c + 1])
        used = np.flatnonzero(idx[c] >= 0)
        if used.size == 0:
            continue
        if idx[c].max() >= hi - lo or idx[c].min() < -1:
            raise ValueError(f"SplitConv: idx of input channel {c} out of range")
        products = _conv_one_channel(X[:, c], kernels[lo:hi], geometry)  # once per kernel
        z[:, used] += products[:, idx[c, used]]
    bshape = (1, c_out) + (1,) * nd
    if B is not None:
        z += np.asarray(B, np.float64).reshape(bshape)
    if scale is not None:
        z *= np.asarray(scale, np.float64).reshape(bshape)
    if shift is not None:
        z += np.asarray(shift, np.float64).reshape(bshape)
    code = schema.activation_code(activation)
    if schema.ACTIVATIONS[code] == "Relu":
        z = np.maximum(z, 0.0)
    elif schema.ACTIVATIONS[code] == "Clip":
        z = np.clip(z, clip_min, clip_max)
    return z.astype(np.float32)


class SplitConv(OpRun):
    """``onnx.reference`` implementation: ``ReferenceEvaluator(m, new_ops=[SplitConv])``."""

    op_domain = schema.DOMAIN

    def _run(self, X, kernels, offsets, idx, B=None, scale=None, shift=None, strides=None,
             pads=None, dilations=None, activation=None, clip_min=None, clip_max=None):
        return (split_conv(
            X, kernels, offsets, idx, B, scale, shift, strides=strides, pads=pads,
            dilations=dilations, activation=activation or "",
            clip_min=float("-inf") if clip_min is None else clip_min,
            clip_max=float("inf") if clip_max is None else clip_max),)
