"""Malformed SplitConv nodes give an onnxruntime error with a clear message, in-process.

Each case must fail at session creation or at run time with an onnxruntime exception whose
message names the problem; the process survives (a crash or an out-of-bounds read would
take pytest down or show under a sanitizer), and a valid model still runs afterwards.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import AttributeProto, TensorProto, helper
from onnxruntime.capi.onnxruntime_pybind11_state import Fail, InvalidArgument, InvalidGraph, RuntimeException

import redpp_onnx
from redpp_onnx.ops import packing

from .models import split_conv_model

ORT_ERRORS = (Fail, InvalidArgument, InvalidGraph, RuntimeException)
I64_MAX, I64_MIN = 2 ** 63 - 1, -2 ** 63
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
    # issue 10: values whose output-size arithmetic overflows int64 (wrong shapes of zeros before)
    "pads_int64_max_all": (dict(pads=[I64_MAX] * 4), X, "SplitConv: pads"),
    "pads_int64_max_begin": (dict(pads=[I64_MAX, 0, 0, 0]), X, "SplitConv: pads"),
    "pads_int64_max_end": (dict(pads=[0, 0, 0, I64_MAX]), X, "SplitConv: pads"),
    "pads_sum_overflows": (dict(pads=[2 ** 62, 0, 2 ** 62, 0]), X, "SplitConv: pads"),
    "pads_plus_input_overflows": (dict(pads=[2 ** 62, 0, 2 ** 62 - 1, 0]), X, "SplitConv: pads"),
    "pads_int64_min": (dict(pads=[I64_MIN, 0, 0, 0]), X, "SplitConv: pads"),
    "pads_huge_output": (dict(pads=[2 ** 40] * 4), X, "more elements than int64 can count (X [1, 3, 8, 8], "
                         "kernel [3, 3], strides [], pads [1099511627776"),
    "strides_negative": (dict(strides=[1, -I64_MAX]), X, "SplitConv: strides"),
    "dilations_zero": (dict(dilations=[0, 1]), X, "SplitConv: dilations"),
    "dilations_int64_max": (dict(dilations=[I64_MAX, 1]), X, "SplitConv: dilations"),
    "dilations_times_kernel_overflows": (dict(dilations=[2 ** 62, 1], pads=[2 ** 61, 0, 2 ** 61, 0]), X,
                                         "SplitConv: dilations"),
    # issue 10: attributes of the wrong type (silently ignored before)
    "strides_floats": (dict(raw_attrs={"strides": [2.0, 2.0]}), X, "attribute 'strides' must be of type ints"),
    "strides_int": (dict(raw_attrs={"strides": 2}), X, "attribute 'strides' must be of type ints"),
    "pads_string": (dict(raw_attrs={"pads": "1"}), X, "attribute 'pads' must be of type ints"),
    "pads_floats": (dict(raw_attrs={"pads": [1.0, 1.0, 1.0, 1.0]}), X, "attribute 'pads' must be of type ints"),
    "pads_empty": (dict(raw_attrs={"pads": helper.make_attribute("pads", [], attr_type=AttributeProto.INTS)}), X,
                   "attribute 'pads' must be of type ints"),
    "dilations_float": (dict(raw_attrs={"dilations": 2.0}), X, "attribute 'dilations' must be of type ints"),
    "activation_int": (dict(raw_attrs={"activation": 1}), X, "attribute 'activation' must be of type string"),
    "activation_strings": (dict(raw_attrs={"activation": ["Relu"]}), X,
                           "attribute 'activation' must be of type string"),
    "clip_min_string": (dict(activation="Clip", raw_attrs={"clip_min": "0"}), X,
                        "attribute 'clip_min' must be of type float"),
    "clip_max_int": (dict(activation="Clip", raw_attrs={"clip_max": 6}), X,
                     "attribute 'clip_max' must be of type float"),
    "clip_max_floats": (dict(activation="Clip", raw_attrs={"clip_max": [6.0]}), X,
                        "attribute 'clip_max' must be of type float"),
    # Conv attributes SplitConv does not have (honouring or ignoring them would change the result)
    "conv_auto_pad": (dict(raw_attrs={"auto_pad": "SAME_UPPER"}), X, "attribute 'auto_pad' is not a SplitConv"),
    "conv_group": (dict(raw_attrs={"group": 3}), X, "attribute 'group' is not a SplitConv"),
    "conv_kernel_shape": (dict(raw_attrs={"kernel_shape": [3, 3]}), X, "attribute 'kernel_shape' is not a SplitConv"),
}


def build(kwargs):
    kwargs = dict(kwargs)
    raw_attrs = kwargs.pop("raw_attrs", None)
    model = split_conv_model(GOOD, **kwargs)
    for key, value in (raw_attrs or {}).items():  # bypass make_node's own validation
        attr = value if isinstance(value, AttributeProto) else helper.make_attribute(key, value)
        model.graph.node[0].attribute.append(attr)
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


def _empty_kernels_model(kernel_dims, **attrs):
    """No kernel at all (K = 0, every idx -1) but kernels of huge spatial dims: only the
    geometry's arithmetic sees them (the tensor has no element)."""
    c_in, c_out = GOOD.idx.shape
    model = split_conv_model(GOOD, raw_inits={"offsets": np.zeros(c_in + 1, np.int64),
                                              "idx": np.full((c_in, c_out), -1, np.int8)}, **attrs)
    inits = model.graph.initializer
    k = next(i for i, t in enumerate(inits) if t.name == "kernels")
    inits[k].CopyFrom(helper.make_tensor("kernels", TensorProto.FLOAT, [0] + list(kernel_dims), []))
    return model


@pytest.mark.parametrize("kernel_dims,attrs,fragment", [
    ((2 ** 32, 2 ** 32), {}, "kernel size overflows int64"),  # kh * kw
    ((2 ** 62, 1), dict(dilations=[4, 1], pads=[2 ** 61, 0, 2 ** 61, 0]), "SplitConv: dilations"),  # d * (k - 1)
    ((I64_MAX, 1), dict(pads=[I64_MAX, 0, 0, 0]), "SplitConv: pads"),  # aborted the process before
])
def test_kernel_shape_arithmetic_that_overflows_is_an_error(kernel_dims, attrs, fragment):
    with pytest.raises(ORT_ERRORS) as info:
        redpp_onnx.session(_empty_kernels_model(kernel_dims, **attrs)).run(None, {"X": X})
    assert fragment in str(info.value), str(info.value)


@pytest.mark.parametrize("strides,pads", [([I64_MAX, I64_MAX], [2, 2, 2, 2]), ([2 ** 62, 1], [2, 1, 0, 1]),
                                          ([1, I64_MAX - 1], [0, 5, 0, 5])])
def test_huge_strides_are_valid_and_exact(strides, pads):
    """A stride larger than the padded input is legal: one output pixel per axis (no overflow in
    the column bounds, no read outside X)."""
    from redpp_onnx.ops import reference

    kwargs = dict(strides=strides, pads=pads)
    y = redpp_onnx.session(split_conv_model(GOOD, **kwargs)).run(None, {"X": X})[0]
    expected = reference.split_conv(X, GOOD.kernels, GOOD.offsets, GOOD.idx, **kwargs)
    assert y.shape == expected.shape
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-5)
