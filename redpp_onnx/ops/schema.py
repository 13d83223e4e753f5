"""The ``ai.redpp::SplitConv`` contract: the one place that defines it.

Everything else reads this module: the numpy reference (``ops/reference.py``), the ONNX
schema registration (``ops/onnx_schema.py``), the tests, and the C++ kernel, whose header
``split_conv_contract.h`` is generated from this file at build time by ``setup.py``
(see :func:`render_cpp_header`). This module is imported by ``setup.py`` before any
dependency is installed, so it must import nothing beyond the standard library.

Semantics (METHOD.md, step 3). Input-wise splitting of a convolution with weights
``W[o, c, kh, kw]``: for every input channel ``c`` the non-zero kernels ``{W[o, c] : o}``
are deduplicated into ``U_c`` (``k_c`` unique kernels) and an index
``idx[c, o] in {-1, 0 .. k_c - 1}`` (``-1``: the kernel is all zero). Then::

    P[c, u] = conv(X[c], U_c[u])                      (computed once per unique kernel)
    Z[o]    = B[o] + sum_{c : idx[c, o] >= 0} P[c, idx[c, o]]
    Y[o]    = act(scale[o] * Z[o] + shift[o])

which equals the dense ``Conv(X, W, B)`` followed by the per-output affine and activation,
up to float summation order. ``conv`` is ONNX's Conv for one input and one output channel
(cross-correlation) with the node's ``strides``, ``pads`` and ``dilations``.

Storage: the unique kernels of all input channels are stacked channel by channel in
``kernels[K, *kernel_shape]``; channel ``c`` owns rows ``offsets[c] .. offsets[c+1] - 1``,
(``idx`` is int8, int16 or int32: the narrowest that holds the largest ``k_c - 1``),
so ``k_c = offsets[c+1] - offsets[c]`` and ``K = offsets[C_in]``. 2-D (``X[N, C, H, W]``,
``kernels[K, kh, kw]``) and 1-D (``X[N, C, L]``, ``kernels[K, kl]``) are supported.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

DOMAIN = "ai.redpp"
OP_TYPE = "SplitConv"
VERSION = 1


@dataclasses.dataclass(frozen=True)
class Input:
    name: str
    dtype: str  # numpy dtype name(s), "|"-separated when several are allowed
    optional: bool
    doc: str

    @property
    def dtypes(self) -> tuple:
        return tuple(self.dtype.split("|"))


@dataclasses.dataclass(frozen=True)
class Attribute:
    name: str
    kind: str  # "ints" | "string" | "float"
    default: object
    doc: str


INPUTS: tuple[Input, ...] = (
    Input("X", "float32", False, "input [N, C_in, H, W] (2-D) or [N, C_in, L] (1-D)"),
    Input("kernels", "float32", False,
          "unique non-zero kernels of every input channel, stacked channel by channel: "
          "[K, kh, kw] (2-D) or [K, kl] (1-D)"),
    Input("offsets", "int64", False,
          "[C_in + 1], non-decreasing, offsets[0] = 0, offsets[C_in] = K: channel c owns "
          "kernels[offsets[c]:offsets[c+1]]"),
    Input("idx", "int8|int16|int32", False,
          "[C_in, C_out]: idx[c, o] = -1 (zero kernel) or the index of W[o, c] among "
          "channel c's kernels, in 0 .. k_c - 1; the narrowest type that holds max k_c - 1"),
    Input("B", "float32", True, "optional bias [C_out], added before the affine"),
    Input("scale", "float32", True, "optional per-output scale [C_out] of the post affine"),
    Input("shift", "float32", True, "optional per-output shift [C_out] of the post affine"),
)
OUTPUTS: tuple[tuple[str, str, str], ...] = (
    ("Y", "float32", "output [N, C_out, H', W'] (2-D) or [N, C_out, L'] (1-D)"),
)

ACTIVATIONS: tuple[str, ...] = ("", "Relu", "Clip")  # code = position in this tuple

ATTRIBUTES: tuple[Attribute, ...] = (
    Attribute("strides", "ints", None, "stride per spatial axis, each >= 1; default 1"),
    Attribute("pads", "ints", None,
              "[x1_begin, x2_begin, ..., x1_end, x2_end] as ONNX Conv, each >= 0; default 0"),
    Attribute("dilations", "ints", None, "dilation per spatial axis, each >= 1; default 1"),
    Attribute("activation", "string", "",
              "fused activation applied last: '' (none), 'Relu', or 'Clip'"),
    Attribute("clip_min", "float", float("-inf"), "lower bound when activation is 'Clip'"),
    Attribute("clip_max", "float", float("inf"), "upper bound when activation is 'Clip'"),
)

ATTRIBUTE_KINDS: tuple[str, ...] = ("ints", "string", "float")
"""Every attribute has exactly its declared kind (ONNX AttributeProto type INTS, STRING, FLOAT):
a node whose attribute has another type (float strides, an int activation...) is refused, never
read as the default. An ``ints`` attribute that is given is a non-empty list (empty lists are
refused; omit the attribute for the default)."""

REFUSED_ATTRIBUTES: tuple[str, ...] = ("auto_pad", "group", "kernel_shape")
"""Conv attributes that SplitConv does not have: a node that carries one is refused (ignoring it
would compute something else than the Conv it was copied from; writers resolve ``auto_pad`` into
``pads``, and SplitConv is group 1 with the kernel shape of ``kernels``)."""

INT64_MAX = 2 ** 63 - 1
"""Geometry limits: the output-size arithmetic of every axis, ``in + pad_begin + pad_end`` and
``dilation * (kernel - 1) + 1``, and the output's element count (and byte size) must fit in
int64; a node or input for which they do not is refused with a message that names the
attribute (never a wrapped-around shape)."""

INPUT_INDEX = {inp.name: i for i, inp in enumerate(INPUTS)}
ATTRIBUTE_BY_NAME = {a.name: a for a in ATTRIBUTES}


@dataclasses.dataclass(frozen=True)
class ConvGeometry:
    """Strides, pads and dilations resolved for ``ndim`` spatial axes."""

    strides: tuple[int, ...]
    pads: tuple[int, ...]  # begins then ends, ONNX order
    dilations: tuple[int, ...]

    @classmethod
    def resolve(cls, ndim: int, strides=None, pads=None, dilations=None) -> "ConvGeometry":
        strides = tuple(int(s) for s in (strides if strides is not None else [1] * ndim))
        pads = tuple(int(p) for p in (pads if pads is not None else [0] * (2 * ndim)))
        dilations = tuple(int(d) for d in (dilations if dilations is not None else [1] * ndim))
        if len(strides) != ndim or len(dilations) != ndim or len(pads) != 2 * ndim:
            raise ValueError(
                f"SplitConv: strides/dilations need {ndim} values and pads {2 * ndim}, got "
                f"strides={list(strides)}, pads={list(pads)}, dilations={list(dilations)}")
        if min(strides) < 1 or min(dilations) < 1 or min(pads) < 0:
            raise ValueError("SplitConv: strides and dilations must be >= 1 and pads >= 0")
        if max(strides + pads + dilations) > INT64_MAX:
            raise ValueError("SplitConv: strides, pads and dilations must fit in int64")
        if any(pads[a] + pads[a + ndim] > INT64_MAX for a in range(ndim)):
            raise ValueError(f"SplitConv: pads {list(pads)}: begin + end overflows int64")
        return cls(strides, pads, dilations)

    def output_size(self, in_size, kernel_shape) -> tuple[int, ...]:
        """ONNX Conv output size (floor mode) per spatial axis; may be <= 0 for bad input."""
        nd = len(self.strides)
        return tuple(
            (in_size[a] + self.pads[a] + self.pads[a + nd] - self.dilations[a] * (kernel_shape[a] - 1) - 1)
            // self.strides[a] + 1
            for a in range(nd))


def output_shape(x_shape, kernel_shape, c_out: int, geometry: ConvGeometry) -> tuple:
    """Output shape of SplitConv; ``x_shape[0]`` may be symbolic (kept as is)."""
    spatial = geometry.output_size(tuple(x_shape[2:]), tuple(kernel_shape))
    return (x_shape[0], c_out) + spatial


def activation_code(name: Optional[str]) -> int:
    name = name or ""
    if name not in ACTIVATIONS:
        raise ValueError(f"SplitConv: activation must be one of {ACTIVATIONS}, got {name!r}")
    return ACTIVATIONS.index(name)


def render_cpp_header() -> str:
    """The C++ view of this contract (written to ``split_conv_contract.h`` at build time)."""
    ctype = {"float32": "ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT",
             "int64": "ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64",
             "int32": "ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32",
             "int16": "ONNX_TENSOR_ELEMENT_DATA_TYPE_INT16",
             "int8": "ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8"}
    lines = [
        "// Generated by setup.py from redpp_onnx/ops/schema.py. Do not edit.",
        "#pragma once",
        "#include <cstddef>",
        '#include "onnxruntime_c_api.h"',
        "namespace redpp { namespace contract {",
        f'constexpr const char* kDomain = "{DOMAIN}";',
        f'constexpr const char* kOpType = "{OP_TYPE}";',
        f"constexpr int kVersion = {VERSION};",
        f"constexpr size_t kNumInputs = {len(INPUTS)};",
        f"constexpr size_t kNumOutputs = {len(OUTPUTS)};",
    ]
    for i, inp in enumerate(INPUTS):
        lines.append(f"constexpr size_t kInput_{inp.name} = {i};")
    lines.append("// element types (UNDEFINED: several allowed, see kInputElemTypes) and optionality, in order")
    lines.append("constexpr int kInputElemType[] = {"
                 + ", ".join(f"(int){ctype[i.dtypes[0]]}" if len(i.dtypes) == 1 else
                             "(int)ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED" for i in INPUTS) + "};")
    width = max(len(i.dtypes) for i in INPUTS)
    lines.append(f"constexpr int kMaxInputTypes = {width};")
    lines.append("// allowed element types per input (padded with UNDEFINED)")
    lines.append("constexpr int kInputElemTypes[][kMaxInputTypes] = {"
                 + ", ".join("{" + ", ".join([f"(int){ctype[t]}" for t in i.dtypes]
                                             + ["(int)ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED"]
                                             * (width - len(i.dtypes))) + "}" for i in INPUTS) + "};")
    lines.append("constexpr bool kInputOptional[] = {"
                 + ", ".join("true" if i.optional else "false" for i in INPUTS) + "};")
    lines.append('constexpr const char* kInputName[] = {'
                 + ", ".join(f'"{i.name}"' for i in INPUTS) + "};")
    for a in ATTRIBUTES:
        lines.append(f'constexpr const char* kAttr_{a.name} = "{a.name}";')
    assert all(a.kind in ATTRIBUTE_KINDS for a in ATTRIBUTES)
    lines.append(f"constexpr size_t kNumAttrs = {len(ATTRIBUTES)};")
    lines.append("constexpr const char* kAttrName[] = {" + ", ".join(f'"{a.name}"' for a in ATTRIBUTES) + "};")
    lines.append("// the one AttributeProto type each attribute may have: \"ints\", \"string\" or \"float\"")
    lines.append("constexpr const char* kAttrKind[] = {" + ", ".join(f'"{a.kind}"' for a in ATTRIBUTES) + "};")
    lines.append("// Conv attributes a SplitConv node must not carry")
    lines.append(f"constexpr size_t kNumRefusedAttrs = {len(REFUSED_ATTRIBUTES)};")
    lines.append("constexpr const char* kRefusedAttrName[] = {"
                 + ", ".join(f'"{n}"' for n in REFUSED_ATTRIBUTES) + "};")
    for code, act in enumerate(ACTIVATIONS):
        lines.append(f"constexpr int kActivation_{act or 'None'} = {code};")
    lines.append('constexpr const char* kActivationName[] = {'
                 + ", ".join(f'"{a}"' for a in ACTIVATIONS) + "};")
    lines.append(f"constexpr int kNumActivations = {len(ACTIVATIONS)};")
    lines.append("}}  // namespace redpp::contract")
    return "\n".join(lines) + "\n"
