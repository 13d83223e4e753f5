"""Malformed SplitConv nodes give an onnxruntime error with a clear message, in-process.

Each case must fail at session creation or at run time with an onnxruntime exception whose
message names the problem; the process survives (a crash or an out-of-bounds read would
take pytest down or show under a sanitizer), and a valid model still runs afterwards.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnxruntime.capi.onnxruntime_pybind11_state import Fail, InvalidArgument, InvalidGraph, RuntimeException

import redpp_onnx
from redpp_onnx.ops import packing

from .models import split_conv_model

ORT_ERRORS = (Fail, InvalidArgument, InvalidGraph, RuntimeException)
RNG = np.random.default_rng(3)
WEIGHT = RNG.standard_normal((4, 3, 3, 3)).astype(np.float32)
WEIGHT[1] = WEIGHT[0]
WEIGHT[2, 1] = 0.0
GOOD = packing.pack(WEIGHT)
X = RNG.standard_normal((1, 3, 8, 8)).astype(np.float32)


def idx_with(c, o, value):
    idx = GOOD.idx.copy()
    idx[c, o] = value
    return idx


# name -> (model keyword arguments, input X, a fragment the error message must contain)
CASES = {
    "idx_too_large": (dict(raw_inits={"idx": idx_with(0, 1, 99)}), X, "out of range"),
    "idx_below_minus_one": (dict(raw_inits={"idx": idx_with(2, 3, -2)}), X, "out of range"),
    "idx_wrong_rank": (dict(raw_inits={"idx": GOOD.idx.reshape(-1)}), X, "idx must have shape"),
    "idx_int64": (dict(raw_inits={"idx": GOOD.idx.astype(np.int64)}), X, "idx"),
    "offsets_short": (dict(raw_inits={"offsets": GOOD.offsets[:-1]}), X, "offsets must have shape"),
    "offsets_decreasing": (dict(raw_inits={"offsets": np.array([0, 3, 2, GOOD.offsets[-1]], np.int64)}), X,
                           "non-decreasing"),
    "offsets_not_zero_first": (dict(raw_inits={"offsets": GOOD.offsets + 1}), X, "offsets[0]"),
    "offsets_past_kernels": (dict(raw_inits={"offsets": np.append(GOOD.offsets[:-1], 999).astype(np.int64)}), X,
                             "number of kernels"),
    "offsets_int32": (dict(raw_inits={"offsets": GOOD.offsets.astype(np.int32)}), X, "offsets"),
    "kernels_float64": (dict(raw_inits={"kernels": GOOD.kernels.astype(np.float64)}), X, "kernels"),
    "kernels_wrong_rank": (dict(raw_inits={"kernels": GOOD.kernels.reshape(-1, 9)}), X, "kernels must have rank"),
    "x_rank_2": ({}, X.reshape(3, 64), "X must have rank"),
    "x_rank_5": ({}, X.reshape(1, 3, 8, 8, 1), "X must have rank"),
    "x_wrong_channels": ({}, RNG.standard_normal((1, 5, 8, 8)).astype(np.float32), "C_in"),
    "x_too_small": ({}, RNG.standard_normal((1, 3, 2, 2)).astype(np.float32), "larger than the padded input"),
    "bias_wrong_shape": (dict(bias=np.zeros(5, np.float32)), X, "B must have shape"),
    "scale_wrong_shape": (dict(scale=np.zeros((4, 1), np.float32)), X, "scale must have shape"),
    "strides_zero": (dict(strides=[0, 1]), X, "strides"),
    "pads_negative": (dict(pads=[0, -1, 0, 0]), X, "pads"),
    "pads_wrong_length": (dict(pads=[1, 1]), X, "pads"),
    "dilations_wrong_length": (dict(dilations=[1, 1, 1]), X, "dilations"),
    "unknown_activation": (dict(raw_attrs={"activation": "Tanh"}), X, "activation"),
    "clip_min_above_max": (dict(activation="Clip", clip_min=1.0, clip_max=-1.0), X, "clip_min"),
}


def build(kwargs):
    kwargs = dict(kwargs)
    raw_attrs = kwargs.pop("raw_attrs", None)
    model = split_conv_model(GOOD, **kwargs)
    for key, value in (raw_attrs or {}).items():  # bypass make_node's own validation
        from onnx import helper
        model.graph.node[0].attribute.append(helper.make_attribute(key, value))
    return model


@pytest.mark.parametrize("name", sorted(CASES))
def test_malformed_split_conv_is_an_onnxruntime_error(name):
    kwargs, x, fragment = CASES[name]
    with pytest.raises(ORT_ERRORS) as info:
        redpp_onnx.session(build(kwargs)).run(None, {"X": x})
    assert fragment in str(info.value), str(info.value)


def test_valid_model_still_runs_after_errors():
    for kwargs, x, _ in CASES.values():
        try:
            redpp_onnx.session(build(kwargs)).run(None, {"X": x})
        except ORT_ERRORS:
            pass
    y = redpp_onnx.session(split_conv_model(GOOD)).run(None, {"X": X})[0]
    assert y.shape == (1, 4, 6, 6) and np.isfinite(y).all()


def test_make_node_rejects_bad_calls():
    from redpp_onnx.ops import onnx_schema

    with pytest.raises(ValueError, match="needs X, kernels, offsets, idx"):
        onnx_schema.make_node(["X", "k"], ["Y"])
    with pytest.raises(ValueError, match="activation"):
        onnx_schema.make_node(["X", "k", "o", "i"], ["Y"], activation="Tanh")
