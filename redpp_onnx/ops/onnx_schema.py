"""``ai.redpp::SplitConv`` known to onnx: schema registration, shape inference, node builder.

After :func:`register` (done when ``redpp_onnx`` is imported), ``onnx.checker.check_model(m,
full_check=True)`` accepts models with SplitConv and ``onnx.shape_inference`` gives its output
its type and shape.
"""

from __future__ import annotations

from typing import Optional, Sequence

import onnx
from onnx import TensorProto, helper
from onnx.defs import OpSchema

from . import schema

_ONNX_TYPE = {"float32": "tensor(float)", "int64": "tensor(int64)", "int32": "tensor(int32)",
              "int16": "tensor(int16)", "int8": "tensor(int8)"}
_ATTR_TYPE = {"ints": OpSchema.AttrType.INTS, "string": OpSchema.AttrType.STRING,
              "float": OpSchema.AttrType.FLOAT}


def _dims(type_proto) -> Optional[list]:
    if type_proto is None or not type_proto.HasField("tensor_type"):
        return None
    tt = type_proto.tensor_type
    if not tt.HasField("shape"):
        return None
    return list(tt.shape.dim)


def _infer(ctx) -> None:
    """Output: float, [N, C_out, *spatial]; a dimension that cannot be known stays unknown."""
    out = onnx.TypeProto()
    out.tensor_type.elem_type = TensorProto.FLOAT
    x = _dims(ctx.get_input_type(schema.INPUT_INDEX["X"]))
    k = _dims(ctx.get_input_type(schema.INPUT_INDEX["kernels"]))
    idx = _dims(ctx.get_input_type(schema.INPUT_INDEX["idx"]))
    if x is not None:
        nd = len(x) - 2
        dims = out.tensor_type.shape.dim
        dims.add().CopyFrom(x[0])
        c_out = dims.add()
        if idx is not None and len(idx) == 2 and idx[1].HasField("dim_value"):
            c_out.dim_value = idx[1].dim_value

        def ints(name):
            attr = ctx.get_attribute(name)
            if attr is not None and attr.type != onnx.AttributeProto.INTS:
                raise onnx.shape_inference.InferenceError(
                    f"SplitConv: attribute {name!r} must be of type ints, got "
                    f"{onnx.AttributeProto.AttributeType.Name(attr.type).lower()}")
            return list(attr.ints) if attr is not None else None

        try:
            geometry = schema.ConvGeometry.resolve(nd, ints("strides"), ints("pads"), ints("dilations"))
        except ValueError as err:
            raise onnx.shape_inference.InferenceError(str(err)) from None
        known = (k is not None and len(k) == nd + 1
                 and all(d.HasField("dim_value") for d in x[2:] + k[1:]))
        sizes = (geometry.output_size([d.dim_value for d in x[2:]], [d.dim_value for d in k[1:]])
                 if known else [None] * nd)
        for size in sizes:
            d = dims.add()
            if size is not None:
                if size < 1:
                    raise onnx.shape_inference.InferenceError(
                        "SplitConv: the dilated kernel is larger than the padded input")
                if size > schema.INT64_MAX:
                    raise onnx.shape_inference.InferenceError(
                        f"SplitConv: output size {size} does not fit int64 (pads {geometry.pads})")
                d.dim_value = size
    ctx.set_output_type(0, out)


def build_schema() -> OpSchema:
    Param = OpSchema.FormalParameter
    Option = OpSchema.FormalParameterOption
    inputs = []
    constraints = []
    for inp in schema.INPUTS:
        tname = f"T_{inp.name}"
        inputs.append(Param(inp.name, tname, inp.doc,
                            param_option=Option.Optional if inp.optional else Option.Single))
        constraints.append((tname, [_ONNX_TYPE[t] for t in inp.dtypes], f"type of {inp.name}"))
    outputs = [Param(name, "T_" + name, doc) for name, _, doc in schema.OUTPUTS]
    constraints += [("T_" + name, [_ONNX_TYPE[dtype]], "output type") for name, dtype, _ in schema.OUTPUTS]
    attributes = []
    for a in schema.ATTRIBUTES:
        if a.default is None:
            attributes.append(OpSchema.Attribute(a.name, _ATTR_TYPE[a.kind], a.doc, required=False))
        else:
            attributes.append(OpSchema.Attribute(a.name, helper.make_attribute(a.name, a.default), a.doc))
    op = OpSchema(schema.OP_TYPE, schema.DOMAIN, schema.VERSION, doc=schema.__doc__ or "",
                  inputs=inputs, outputs=outputs, type_constraints=constraints, attributes=attributes)
    op.set_type_and_shape_inference_function(_infer)
    return op


def register() -> None:
    """Make onnx (checker, shape inference) know SplitConv. Idempotent."""
    try:
        onnx.defs.get_schema(schema.OP_TYPE, schema.VERSION, schema.DOMAIN)
        return
    except onnx.defs.SchemaError:
        pass
    onnx.defs.register_schema(build_schema())


def make_node(inputs: Sequence[str], outputs: Sequence[str], *, name: Optional[str] = None,
              strides=None, pads=None, dilations=None, activation: str = "",
              clip_min: Optional[float] = None, clip_max: Optional[float] = None) -> onnx.NodeProto:
    """A SplitConv node. ``inputs`` in contract order; '' (or a short list) omits optional ones."""
    if len(inputs) < 4 or len(inputs) > len(schema.INPUTS) or not all(inputs[:4]):
        raise ValueError(f"SplitConv needs X, kernels, offsets, idx, then optional "
                         f"B, scale, shift; got {list(inputs)}")
    schema.activation_code(activation)
    attrs = {}
    for key, value in (("strides", strides), ("pads", pads), ("dilations", dilations)):
        if value is not None:
            attrs[key] = [int(v) for v in value]
    if activation:
        attrs["activation"] = activation
    if activation == "Clip":
        if clip_min is not None:
            attrs["clip_min"] = float(clip_min)
        if clip_max is not None:
            attrs["clip_max"] = float(clip_max)
    return helper.make_node(schema.OP_TYPE, list(inputs), list(outputs), name=name,
                            domain=schema.DOMAIN, **attrs)


def opset_import() -> onnx.OperatorSetIdProto:
    return helper.make_opsetid(schema.DOMAIN, schema.VERSION)
