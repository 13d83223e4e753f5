"""The SplitConv contract: one source (schema.py) seen identically by onnx, numpy and C++."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

import redpp_onnx
from redpp_onnx import _core
from redpp_onnx.ops import onnx_schema, packing, reference, schema

from .models import split_conv_model

RNG = np.random.default_rng(11)


def test_compiled_contract_matches_schema_py():
    compiled = _core.contract()
    assert compiled["domain"] == schema.DOMAIN == "ai.redpp"
    assert compiled["op_type"] == schema.OP_TYPE == "SplitConv"
    assert compiled["version"] == schema.VERSION == 1
    onnx_code = {"float32": TensorProto.FLOAT, "int64": TensorProto.INT64, "int32": TensorProto.INT32,
                 "int16": TensorProto.INT16, "int8": TensorProto.INT8}
    assert compiled["inputs"] == [(i.name, [onnx_code[t] for t in i.dtypes], i.optional) for i in schema.INPUTS]
    assert tuple(compiled["activations"]) == schema.ACTIVATIONS
    assert compiled["attributes"] == [(a.name, a.kind) for a in schema.ATTRIBUTES]
    assert tuple(compiled["refused_attributes"]) == schema.REFUSED_ATTRIBUTES
    assert _core.build_info()["ort_api_version"] >= 29


def test_onnx_knows_the_schema():
    op = onnx.defs.get_schema(schema.OP_TYPE, schema.VERSION, schema.DOMAIN)
    assert [i.name for i in op.inputs] == [i.name for i in schema.INPUTS]
    assert set(op.attributes) == {a.name for a in schema.ATTRIBUTES}
    onnx_schema.register()  # idempotent


def _weights(c_out=6, c_in=4, k=(3, 3)):
    w = RNG.standard_normal((c_out, c_in) + k).astype(np.float32)
    w[3] = w[0]
    return packing.pack(w)


@pytest.mark.parametrize("x_shape,attrs,expected", [
    (["N", 4, 11, 9], dict(strides=[2, 1], pads=[1, 0, 2, 1], dilations=[1, 2]), ["N", 6, 6, 6]),
    ([2, 4, 8, 8], {}, [2, 6, 6, 6]),
    (["batch", 4, 17], dict(strides=[3], pads=[2, 0]), ["batch", 6, 6]),
])
def test_checker_and_shape_inference(x_shape, attrs, expected):
    split = _weights(k=(3,) * (len(x_shape) - 2))
    model = split_conv_model(split, bias=np.zeros(6, np.float32), x_shape=x_shape,
                             y_shape=["n", 6] + ["s"] * (len(x_shape) - 2), **attrs)
    onnx.checker.check_model(model, full_check=True)
    # drop the declared output shape: inference alone must find it
    model.graph.output[0].CopyFrom(helper.make_tensor_value_info("Y", TensorProto.FLOAT, None))
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    dims = inferred.graph.output[0].type.tensor_type.shape.dim
    assert [d.dim_param or d.dim_value for d in dims] == expected


def test_shape_inference_rejects_kernel_larger_than_input():
    model = split_conv_model(_weights(k=(5, 5)), x_shape=[1, 4, 3, 3], y_shape=None)
    with pytest.raises(onnx.shape_inference.InferenceError, match="larger than the padded input"):
        onnx.shape_inference.infer_shapes(model, strict_mode=True)


@pytest.mark.parametrize("attrs", [dict(pads=[2 ** 63 - 1] * 2), dict(pads=[2 ** 62, 2 ** 62 - 8]),
                                   dict(dilations=[2 ** 62]), dict(strides=[2.0])])
def test_shape_inference_refuses_geometry_beyond_int64(attrs):
    """An output size that does not fit int64 (or a float stride) is an InferenceError, never a
    wrapped-around or silently defaulted dimension."""
    model = split_conv_model(_weights(k=(3,)), x_shape=[1, 4, 17], y_shape=None)
    node = model.graph.node[0]
    for key, value in attrs.items():
        node.attribute.append(helper.make_attribute(key, value))
    with pytest.raises(onnx.shape_inference.InferenceError):
        onnx.shape_inference.infer_shapes(model, strict_mode=True)


def test_reference_evaluator_runs_split_conv():
    split = _weights()
    attrs = dict(strides=[1, 2], pads=[0, 1, 1, 0], activation="Relu")
    model = split_conv_model(split, bias=RNG.standard_normal(6).astype(np.float32), **attrs)
    x = RNG.standard_normal((2, 4, 9, 7)).astype(np.float32)
    y_eval = ReferenceEvaluator(model, new_ops=[reference.SplitConv]).run(None, {"X": x})[0]
    y_ort = redpp_onnx.session(model).run(None, {"X": x})[0]
    assert y_eval.shape == y_ort.shape == (2, 6, 8, 3)  # W: (7 + 1 + 0 - 3) // 2 + 1
    np.testing.assert_allclose(y_eval, y_ort, rtol=1e-5, atol=1e-5)
    assert (y_ort >= 0).all() and (y_ort == 0).any()  # the fused Relu acted


def test_pack_dedups_per_input_channel_and_round_trips():
    w = np.zeros((5, 3, 2, 2), np.float32)
    a, b = RNG.standard_normal((2, 2, 2)).astype(np.float32)
    w[:, 0] = a  # channel 0: one unique kernel used by all five outputs
    w[0, 1], w[1, 1], w[2, 1] = a, b, a  # channel 1: two unique, two zero kernels
    split = packing.pack(w)
    assert split.kernels_per_channel.tolist() == [1, 2, 0]
    assert split.kernels.shape == (3, 2, 2) and split.offsets.tolist() == [0, 1, 3, 3]
    assert (split.idx[0] == 0).all() and (split.idx[2] == -1).all()
    assert split.idx[1, 3] == -1 and split.idx[1, 0] == split.idx[1, 2] != split.idx[1, 1]
    assert np.array_equal(packing.unpack(split), w)


def test_session_rejects_unknown_option():
    with pytest.raises(TypeError, match="unknown onnxruntime session option"):
        redpp_onnx.session(split_conv_model(_weights()), intra_op_num_thread=1)


def test_every_index_type_gives_the_same_result():
    split = _weights(c_out=40)
    assert split.idx.dtype == np.int8  # the packer picks the narrowest type
    x = RNG.standard_normal((2, 4, 9, 9)).astype(np.float32)
    outputs = []
    for dtype in (np.int8, np.int16, np.int32):
        model = split_conv_model(split, raw_inits={"idx": split.idx.astype(dtype)}, pads=[1, 1, 1, 1],
                                 x_shape=[2, 4, 9, 9], y_shape=[2, 40, 9, 9])
        onnx.checker.check_model(model, full_check=True)
        outputs.append(redpp_onnx.session(model).run(None, {"X": x})[0])
    assert np.array_equal(outputs[0], outputs[1]) and np.array_equal(outputs[0], outputs[2])
    with pytest.raises(Exception, match="idx"):
        redpp_onnx.session(split_conv_model(split, raw_inits={"idx": split.idx.astype(np.int64)})).run(
            None, {"X": x})


def test_index_dtype_boundaries():
    assert packing.index_dtype(0) == np.int8 and packing.index_dtype(128) == np.int8
    assert packing.index_dtype(129) == np.int16 and packing.index_dtype(32768) == np.int16
    assert packing.index_dtype(32769) == np.int32
