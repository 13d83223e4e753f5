"""Layout rewrite: a zero channel padding becomes a 1x1 Conv, so onnxruntime's NCHWc chain holds.

onnxruntime's CPU provider runs Conv, pooling, Add and the activations in a blocked channel layout
(NCHWc: 8 channels per vector with AVX2, 16 with AVX-512) as long as every op of a chain can take
it. ``Pad`` cannot. The "option A" shortcut of the CIFAR ResNets (``x[:, :, ::2, ::2]`` padded with
zero channels up to the next stage's width; PyramidNet pads channels the same way) is a strided
``Slice`` and a channel ``Pad``: at every such shortcut the layout goes back to NCHW, and since the
residual sum of each later block reads it, every block of the stage then reorders its output to NCHW,
adds and activates there, and reorders back. Measured on ResNet-56 here (onnxruntime 1.32, AVX-512):
18 of its 27 residual Adds and Relus ran outside the fused Conv, with 36 reorders.

The rewrite is exact: the padding, and the strided Slices before it that start at 0 and run to
the end of the spatial axes, are one ``Conv`` with a 1x1 kernel, the Slices' steps as strides, and
a 0/1 weight that puts input channel ``i`` at output ``before + i`` (each output is one input
times 1 plus zeros). It adds ``C_in × C_out`` MACs per output pixel, so it is done only while

* the tensor is float32 (the Conv of another type has no NCHWc kernel), 4-D, with known channels;
* both channel counts are multiples of :data:`CHANNEL_ALIGN` (else onnxruntime keeps the Conv in
  NCHW and nothing is gained);
* the MACs added over the whole graph stay within :data:`MAX_ADDED_SHARE` of the model's MACs.

Pads computed from constants (the TorchScript exporter's ``F.pad``) are evaluated first
(:func:`redpp_onnx.analysis.layers.computed_arguments`). Every candidate that is not rewritten gets its
reason in the report. The edit uses onnx-graphsurgeon (find the producers, swap the node, drop what
became dead), then the graph goes back into a copy of the input model (the model-level fields, opsets
and metadata kept as they were).
"""

from __future__ import annotations

import dataclasses
from typing import List, Optional

import numpy as np
import onnx

CHANNEL_ALIGN = 8
"""Channel counts the rewrite needs (onnxruntime's smallest NCHWc block, AVX2)."""
MAX_ADDED_SHARE = 0.01
"""MACs the rewrites may add, as a share of the model's eligible MACs."""
INT_BIG = 1 << 30  # a Slice end at least this large runs to the end of its axis


@dataclasses.dataclass
class LayoutRow:
    name: str                          # the Pad node
    channels_in: Optional[int] = None
    channels_out: Optional[int] = None
    strides: tuple = (1, 1)
    slices: int = 0                    # strided Slices folded into the Conv
    macs_added: int = 0                # per sample
    rewritten: bool = False
    reason: str = ""


@dataclasses.dataclass
class LayoutResult:
    model: onnx.ModelProto
    rows: List[LayoutRow]

    @property
    def rewritten(self) -> int:
        return sum(r.rewritten for r in self.rows)

    @property
    def macs_added(self) -> int:
        return sum(r.macs_added for r in self.rows if r.rewritten)

    def to_dict(self) -> dict:
        return {"rewritten": self.rewritten, "macs_added": self.macs_added,
                "candidates": [dataclasses.asdict(r) for r in self.rows]}


def _has_candidates(graph: onnx.GraphProto) -> bool:
    for node in graph.node:
        if node.op_type == "Pad" and node.domain in ("", "ai.onnx"):
            mode = next((a.s for a in node.attribute if a.name == "mode"), b"constant")
            if mode == b"constant":
                return True
    return False


def _values(t, folded: dict) -> Optional[np.ndarray]:
    """The value of a graph-surgeon tensor when it is constant: an initializer, a ``Constant`` node's
    output, or computed from constants (``folded``, :func:`~redpp_onnx.analysis.layers.computed_arguments`)."""
    import onnx_graphsurgeon as gs

    if t.name in folded:
        return folded[t.name]
    if isinstance(t, gs.Constant):
        return np.asarray(t.values)
    if len(t.inputs) == 1 and t.inputs[0].op == "Constant" and "value" in t.inputs[0].attrs:
        v = t.inputs[0].attrs["value"]
        return np.asarray(v.values if isinstance(v, gs.Constant) else v)
    return None


def _spatial_slice(node, shapes, folded) -> Optional[tuple]:
    """``(strides over H and W)`` of a Slice that keeps every ``step``-th pixel of the spatial axes
    from the first to the last, else None."""
    x = node.inputs[0]
    shape = shapes.get(x.name)
    if not shape or len(shape) != 4:
        return None
    args = [_values(node.inputs[k], folded) if len(node.inputs) > k and node.inputs[k].name else None
            for k in range(5)]
    starts, ends, axes, steps = args[1], args[2], args[3], args[4]
    if starts is None or ends is None or (len(node.inputs) > 3 and node.inputs[3].name and axes is None) or (
            len(node.inputs) > 4 and node.inputs[4].name and steps is None):
        return None
    starts, ends = starts.ravel(), ends.ravel()
    axes = np.arange(len(starts)) if axes is None else axes.ravel()
    steps = np.ones(len(starts), np.int64) if steps is None else steps.ravel()
    strides = [1, 1]
    for a, s, e, st in zip(axes, starts, ends, steps):
        a = int(a) + 4 if a < 0 else int(a)
        dim = shape[a]
        if a not in (2, 3) or int(s) != 0 or int(st) < 1 or not (
                int(e) >= INT_BIG or (isinstance(dim, int) and int(e) >= dim)):
            return None
        strides[a - 2] *= int(st)
    return tuple(strides)


def rewrite(model: onnx.ModelProto, macs_total: Optional[int], *, shapes: Optional[dict] = None,
            types: Optional[dict] = None) -> LayoutResult:
    """Channel-only zero ``Pad`` nodes (and the strided spatial Slices before them) as 1x1 Convs,
    under the rules of the module docstring. The input model is never modified; without a
    candidate it is returned as is."""
    if not _has_candidates(model.graph):
        return LayoutResult(model, [])
    import onnx_graphsurgeon as gs

    from ..analysis.layers import computed_arguments, static_shapes

    folded = computed_arguments(model)
    shapes = static_shapes(model) if shapes is None else shapes
    types = _elem_types(model) if types is None else types
    try:
        g = gs.import_onnx(model)
    except Exception as err:  # noqa: BLE001 - an optional rewrite never stops the job
        return LayoutResult(model, [LayoutRow("(graph)", reason=f"onnx-graphsurgeon cannot read the graph: "
                                              f"{str(err).splitlines()[0] if str(err) else type(err).__name__}")])
    budget = MAX_ADDED_SHARE * macs_total if macs_total else 0.0
    rows, used = [], 0.0
    for node in list(g.nodes):
        if node.op != "Pad" or (node.domain or "") not in ("", "ai.onnx") or node.attrs.get("mode", "constant") not in (
                "constant", b"constant"):
            continue
        x, y = node.inputs[0], node.outputs[0]
        pads = _values(node.inputs[1], folded) if len(node.inputs) > 1 else None
        value = _values(node.inputs[2], folded) if len(node.inputs) > 2 and node.inputs[2].name else np.zeros(1)
        axes = _values(node.inputs[3], folded) if len(node.inputs) > 3 and node.inputs[3].name else None
        if pads is None or (len(node.inputs) > 3 and node.inputs[3].name and axes is None):
            continue  # not known to pad channels: not a candidate
        pads = pads.ravel().astype(np.int64)
        in_shape, out_shape = shapes.get(x.name), shapes.get(y.name)
        rank = len(in_shape) if in_shape else (len(pads) // 2 if axes is None else None)
        if rank is None:
            continue
        axes = np.arange(len(pads) // 2) if axes is None else axes.ravel().astype(np.int64)
        axes = np.where(axes < 0, axes + rank, axes).tolist()
        if 1 not in axes or pads[axes.index(1)] + pads[len(axes) + axes.index(1)] == 0:
            continue  # no channel padding: nothing of this pass
        row = LayoutRow(node.name or y.name)
        rows.append(row)
        before, after = np.zeros(rank, np.int64), np.zeros(rank, np.int64)
        before[axes], after[axes] = pads[:len(axes)], pads[len(axes):]
        other = [k for k in range(rank) if k != 1]
        if types.get(x.name) != onnx.TensorProto.FLOAT:
            row.reason = ("element type unknown (onnx's type inference does not reach it)" if x.name not in types
                          else "not a float32 tensor (onnxruntime's NCHWc Conv is float32 only)")
            continue
        if rank != 4 or not in_shape or len(in_shape) != 4 or not isinstance(in_shape[1], int):
            row.reason = "not a 4-D tensor with a known channel count"
            continue
        if (value is None or np.any(value.ravel() != 0) or np.any(before < 0) or np.any(after < 0)
                or np.any(before[other]) or np.any(after[other])):
            row.reason = "not a zero padding of the channel axis alone"
            continue
        strides, slices, src = (1, 1), 0, x
        while len(src.inputs) == 1 and src.inputs[0].op == "Slice" and len(src.outputs) == 1:
            st = _spatial_slice(src.inputs[0], shapes, folded)
            if st is None:
                break
            strides = (strides[0] * st[0], strides[1] * st[1])
            slices += 1
            src = src.inputs[0].inputs[0]
        c_in = int(in_shape[1])
        c_out = c_in + int(before[1] + after[1])
        row.channels_in, row.channels_out, row.strides, row.slices = c_in, c_out, strides, slices
        if c_in % CHANNEL_ALIGN or c_out % CHANNEL_ALIGN:
            row.reason = f"channels {c_in} -> {c_out} not multiples of {CHANNEL_ALIGN} (NCHWc would not take the Conv)"
            continue
        if not out_shape or not all(isinstance(d, int) for d in out_shape[2:]):
            row.reason = "spatial size unknown (the MACs it adds cannot be bounded)"
            continue
        macs = c_in * c_out * int(out_shape[2]) * int(out_shape[3])
        if not macs_total:
            row.reason = f"the model's MACs are unknown: the {MAX_ADDED_SHARE:.0%} bound on the MACs added cannot be checked"
            continue
        if used + macs > budget:
            row.reason = (f"adds {macs:,} MACs: over {MAX_ADDED_SHARE:.0%} of the model's "
                          f"{macs_total or 0:,} with the others")
            continue
        w = np.zeros((c_out, c_in, 1, 1), np.float32)
        w[int(before[1]) + np.arange(c_in), np.arange(c_in), 0, 0] = 1.0
        weight = gs.Constant(f"{y.name}_redpp_layout_w", w)
        conv = gs.Node("Conv", name=f"{row.name}_redpp_layout", inputs=[src, weight], outputs=[y],
                       attrs={"kernel_shape": [1, 1], "strides": list(strides)})
        node.outputs.clear()
        g.nodes.append(conv)
        used += macs
        row.macs_added, row.rewritten = macs, True
    if not any(r.rewritten for r in rows):
        return LayoutResult(model, rows)
    try:
        g.cleanup(remove_unused_graph_inputs=False).toposort()
        exported = gs.export_onnx(g, do_type_check=False)
    except Exception as err:  # noqa: BLE001
        for r in rows:
            if r.rewritten:
                r.rewritten, r.macs_added = False, 0
                r.reason = f"onnx-graphsurgeon cannot write the graph: {str(err).splitlines()[0] if str(err) else type(err).__name__}"
        return LayoutResult(model, rows)
    out = onnx.ModelProto()
    out.CopyFrom(model)
    out.graph.CopyFrom(exported.graph)
    return LayoutResult(out, rows)


def _elem_types(model: onnx.ModelProto) -> dict:
    """Element type of every tensor onnx's type inference knows (inputs, value_info, outputs, constants)."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    except Exception:  # noqa: BLE001 - any failure: no types, no rewrite
        inferred = model
    g = inferred.graph
    types = {t.name: t.data_type for t in g.initializer}
    for vi in list(g.input) + list(g.value_info) + list(g.output):
        if vi.type.HasField("tensor_type"):
            types[vi.name] = vi.type.tensor_type.elem_type
    return types
