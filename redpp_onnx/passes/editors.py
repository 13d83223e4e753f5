"""Per-op channel editors: the only code that changes a graph when channels are merged.

One registry, :data:`REGISTRY`, maps an op type to its :class:`Editor`:

* ``out(ctx, op, edit)``: the op's channels shrink (producers: weight rows and bias; per-channel
  ops: their per-channel parameters; Pad/Split/Reshape/Resize: their channel counts; a depthwise
  Conv: kernel, bias and ``group``). Transparent ops have nothing to edit and say so.
* ``fold(ctx, op, edit)``: a consumer folds merged input channels: the weights of every input
  channel of a cluster are summed into the kept one and the others are deleted (a block of
  ``inner`` features per channel after a Flatten/Reshape).

An edit is a :class:`ChannelEdit`: for every channel position kept, the old positions it stands
for (its cluster; the first is the kept one). With ``exact`` the cluster's channels are equal
(α = 0) and the kept channel's own parameters are taken as they are; otherwise (α > 0) they are
replaced by the cluster's mean (the barycenter, METHOD.md).

Constants are never changed in place when another node uses them too: :class:`EditContext`
gives an edited copy its own name (copy-on-write) and drops the originals nobody uses any more.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Callable, Optional

import numpy as np
import onnx

from ..analysis.layers import iter_nodes_deep
from onnx import helper, numpy_helper

from ..analysis.coupling import CONSUMER, GroupOp, _opset


@dataclasses.dataclass(frozen=True)
class ChannelEdit:
    """How a tensor's channel positions change: ``keep[i]`` = old positions of new channel ``i``."""

    n_old: int
    keep: tuple                 # tuple of tuples of old positions (first = the kept one)
    exact: tuple                # per new channel: the cluster's channels are equal
    scales: Optional[tuple] = None  # per new channel, a factor per old position: consumers fold
    #                                 Σ s_m W[:, m] (passes/reduce.py: a channel ≈ s × its partner)

    @property
    def n_new(self) -> int:
        return len(self.keep)

    @property
    def kept(self) -> list:
        return [k[0] for k in self.keep]

    @property
    def changed(self) -> bool:
        return self.n_new != self.n_old


def reduce_along(arr: np.ndarray, axis: int, edit: ChannelEdit) -> np.ndarray:
    """Output-channel edit of a per-channel parameter: keep one slice per cluster (its own when
    exact, the mean of the cluster's slices otherwise)."""
    moved = np.moveaxis(arr, axis, 0)
    if moved.shape[0] != edit.n_old:
        raise ValueError(f"parameter has {moved.shape[0]} channels along axis {axis}, expected {edit.n_old}")
    out = moved[edit.kept].copy()
    for i, (cluster, exact) in enumerate(zip(edit.keep, edit.exact)):
        if len(cluster) > 1 and not exact:
            out[i] = moved[list(cluster)].astype(np.float64).mean(axis=0).astype(arr.dtype)
    return np.moveaxis(out, 0, axis)


def fold_along(arr: np.ndarray, axis: int, edit: ChannelEdit, inner: int = 1) -> np.ndarray:
    """Input-channel edit of a consumer weight: the slices (blocks of ``inner``) of a cluster are
    summed into the kept one (in float64, rounded once), the others are deleted."""
    moved = np.moveaxis(arr, axis, 0)
    if moved.shape[0] != edit.n_old * inner:
        raise ValueError(f"weight has {moved.shape[0]} inputs along axis {axis}, expected "
                         f"{edit.n_old} channels x {inner}")
    blocks = moved.reshape((edit.n_old, inner) + moved.shape[1:])
    out = blocks[edit.kept].copy()
    for i, cluster in enumerate(edit.keep):
        if len(cluster) > 1:
            parts = blocks[list(cluster)].astype(np.float64)
            if edit.scales is not None:
                parts = parts * np.asarray(edit.scales[i], np.float64).reshape((-1,) + (1,) * (parts.ndim - 1))
            out[i] = parts.sum(axis=0).astype(arr.dtype)
    out = out.reshape((edit.n_new * inner,) + moved.shape[1:])
    return np.moveaxis(out, 0, axis)


class EditContext:
    """The model being edited (a copy the pass owns): current values of node inputs, attributes."""

    def __init__(self, model: onnx.ModelProto):
        self.model = model
        self.graph = model.graph
        self.opset = _opset(model)
        self._init = {t.name: t for t in self.graph.initializer}
        self._const_node = {}
        for node in self.graph.node:
            if node.op_type == "Constant" and len(node.output) == 1:
                self._const_node[node.output[0]] = node
        self._current: dict = {}    # (node index, input index) -> np.ndarray
        self._added: dict = {}      # (node index, input position) -> np.ndarray for inputs that did not exist
        self.changed: Counter = Counter()  # original tensor name -> elements removed

    def node(self, i: int) -> onnx.NodeProto:
        return self.graph.node[i]

    def _original(self, name: str) -> np.ndarray:
        if name in self._init:
            return numpy_helper.to_array(self._init[name])
        node = self._const_node.get(name)
        if node is None:
            raise KeyError(f"{name} is not a constant")
        for a in node.attribute:
            if a.name == "value":
                return numpy_helper.to_array(a.t)
        return np.asarray(helper.get_attribute_value(node.attribute[0]))

    def get(self, i: int, k: int) -> np.ndarray:
        key = (i, k)
        if key not in self._current:
            self._current[key] = self._original(self.graph.node[i].input[k])
        return self._current[key]

    def set(self, i: int, k: int, array: np.ndarray) -> None:
        self.get(i, k)
        self._current[(i, k)] = np.asarray(array)

    def append_input(self, i: int, position: int, array: np.ndarray) -> None:
        """Give node ``i`` a constant input at ``position`` (e.g. Split's explicit sizes)."""
        self._added[(i, position)] = np.asarray(array)

    def attr(self, i: int, name: str) -> Optional[object]:
        for a in self.graph.node[i].attribute:
            if a.name == name:
                return helper.get_attribute_value(a)
        return None

    def set_attr(self, i: int, name: str, value) -> None:
        node = self.graph.node[i]
        for k, a in enumerate(node.attribute):
            if a.name == name:
                del node.attribute[k]
                break
        if value is not None:
            node.attribute.append(helper.make_attribute(name, value))

    # ------------------------------------------------------------------ write back
    def _uses(self) -> Counter:
        uses = Counter(x for n in iter_nodes_deep(self.graph) for x in n.input if x)
        uses.update(o.name for o in self.graph.output)
        return uses

    def _fresh(self, base: str, taken: set) -> str:
        k = 1
        while f"{base}__merged{k}" in taken:
            k += 1
        name = f"{base}__merged{k}"
        taken.add(name)
        return name

    def commit(self) -> None:
        """Write every edited value into the model (in place when the constant has this one user,
        else under a new name), then drop the constants nobody uses any more."""
        uses = self._uses()
        taken = set(self._init) | set(self._const_node) | {o for n in self.graph.node for o in n.output} \
            | {x.name for x in self.graph.input}
        replaced = set()
        for (i, k), array in self._current.items():
            node = self.graph.node[i]
            name = node.input[k]
            old = self._original(name)
            if old.dtype != array.dtype and _is_float(old.dtype) and _is_float(array.dtype):
                array = np.asarray(array, np.float32).astype(old.dtype)  # float16 / bfloat16 stay so
            if old.shape == array.shape and np.array_equal(old, array) and old.dtype == array.dtype:
                continue
            self.changed[name] += int(old.size) - int(array.size)
            if uses[name] == 1:
                self._write_in_place(name, array)
            else:
                new = self._fresh(name, taken)
                self.graph.initializer.append(numpy_helper.from_array(array, new))
                node.input[k] = new
                replaced.add(name)
        for (i, position), array in self._added.items():
            node = self.graph.node[i]
            new = self._fresh(f"{node.name or node.op_type}_input{position}", taken)
            self.graph.initializer.append(numpy_helper.from_array(array, new))
            while len(node.input) < position:
                node.input.append("")
            if len(node.input) == position:
                node.input.append(new)
            else:
                node.input[position] = new
        if replaced:
            uses = self._uses()
            dead = {n for n in replaced if uses[n] == 0}
            keep_init = [t for t in self.graph.initializer if t.name not in dead]
            del self.graph.initializer[:]
            self.graph.initializer.extend(keep_init)
            keep_nodes = [n for n in self.graph.node
                          if not (n.op_type == "Constant" and len(n.output) == 1 and n.output[0] in dead)]
            if len(keep_nodes) != len(self.graph.node):
                del self.graph.node[:]
                self.graph.node.extend(keep_nodes)
            keep_inputs = [x for x in self.graph.input if x.name not in dead]
            del self.graph.input[:]
            self.graph.input.extend(keep_inputs)

    def _write_in_place(self, name: str, array: np.ndarray) -> None:
        if name in self._init:
            self._init[name].CopyFrom(numpy_helper.from_array(array, name))
            for vi in self.graph.input:  # old models also list initializers as graph inputs
                if vi.name == name:
                    vi.CopyFrom(helper.make_tensor_value_info(name, vi.type.tensor_type.elem_type, array.shape))
            return
        node = self._const_node[name]
        del node.attribute[:]
        node.attribute.append(helper.make_attribute("value", numpy_helper.from_array(array, name)))


def _is_float(dtype: np.dtype) -> bool:
    return dtype.kind == "f" or dtype.name == "bfloat16"  # ml_dtypes' bfloat16 is not a numpy float kind


# ---------------------------------------------------------------------- editors

Edit = Callable[[EditContext, GroupOp, ChannelEdit], None]


@dataclasses.dataclass(frozen=True)
class Editor:
    out: Optional[Edit] = None     # output channels shrink
    fold: Optional[Edit] = None    # input channels fold (consumers)
    what: str = ""


def _params_out(ctx: EditContext, op: GroupOp, edit: ChannelEdit) -> None:
    for p in op.params:
        ctx.set(op.node, p.input, reduce_along(ctx.get(op.node, p.input), p.axis, edit))


def _params_fold(ctx: EditContext, op: GroupOp, edit: ChannelEdit) -> None:
    for p in op.params:
        ctx.set(op.node, p.input, fold_along(ctx.get(op.node, p.input), p.axis, edit, op.inner))


def _nothing(ctx: EditContext, op: GroupOp, edit: ChannelEdit) -> None:
    """The op keeps channels apart and holds no per-channel state: nothing to edit."""


def _conv_out(ctx, op, edit):
    _params_out(ctx, op, edit)
    group = ctx.attr(op.node, "group")
    if group is not None and int(group) != 1:  # depthwise: one group per channel
        ctx.set_attr(op.node, "group", edit.n_new)


def _pad_out(ctx, op, edit):
    node = ctx.node(op.node)
    if ctx.opset < 11:
        pads = list(ctx.attr(op.node, "pads"))
        axes = list(range(op.rank))
    else:
        pads = [int(x) for x in ctx.get(op.node, 1)]
        axes = list(range(op.rank))
        if len(node.input) > 3 and node.input[3]:
            axes = [int(a) + op.rank if int(a) < 0 else int(a) for a in np.ravel(ctx.get(op.node, 3))]
    if op.axis not in axes:
        return
    k = axes.index(op.axis)
    before, after = pads[k], pads[k + len(axes)]
    if not (before or after):
        return
    kept = edit.kept
    pads[k] = sum(1 for p in kept if p < before)
    pads[k + len(axes)] = sum(1 for p in kept if p >= edit.n_old - after)
    if ctx.opset < 11:
        ctx.set_attr(op.node, "pads", pads)
    else:
        ctx.set(op.node, 1, np.asarray(pads, dtype=ctx.get(op.node, 1).dtype))


def _split_out(ctx, op, edit):
    node = ctx.node(op.node)
    axis = int(ctx.attr(op.node, "axis") or 0)
    axis = axis + op.rank if axis < 0 else axis
    if axis != op.axis:
        return
    explicit = ctx.opset >= 13 and len(node.input) > 1 and node.input[1]
    if explicit:
        sizes = [int(x) for x in ctx.get(op.node, 1)]
    elif ctx.opset < 13 and ctx.attr(op.node, "split") is not None:
        sizes = [int(x) for x in ctx.attr(op.node, "split")]
    else:
        n = int(ctx.attr(op.node, "num_outputs") or len(node.output))
        step = -(-edit.n_old // n)
        sizes = [min(step, edit.n_old - j * step) for j in range(n)]
    bounds = np.cumsum([0] + sizes)
    kept = np.asarray(edit.kept)
    new = [int(np.sum((kept >= lo) & (kept < hi))) for lo, hi in zip(bounds[:-1], bounds[1:])]
    if ctx.opset >= 13:
        if explicit:
            ctx.set(op.node, 1, np.asarray(new, dtype=np.int64))
        else:
            ctx.append_input(op.node, 1, np.asarray(new, dtype=np.int64))
        ctx.set_attr(op.node, "num_outputs", None)
    else:
        ctx.set_attr(op.node, "split", new)


def _reshape_out(ctx, op, edit):
    shape = ctx.get(op.node, 1).copy()
    if op.axis < len(shape) and shape[op.axis] > 0:
        shape[op.axis] = edit.n_new * op.inner
        ctx.set(op.node, 1, shape)


def _resize_out(ctx, op, edit):
    node = ctx.node(op.node)
    if len(node.input) > 3 and node.input[3]:
        sizes = ctx.get(op.node, 3).copy()
        axes = ctx.attr(op.node, "axes")
        axes = list(range(op.rank)) if axes is None else [a + op.rank if a < 0 else a for a in axes]
        if op.axis in axes:
            sizes[axes.index(op.axis)] = edit.n_new
            ctx.set(op.node, 3, sizes)


_TRANSPARENT = Editor(out=_nothing, what="keeps channels apart; no per-channel state")

#: op type -> Editor. The one place that lists what can be edited (tests check its coverage).
REGISTRY: dict = {
    "Conv": Editor(out=_conv_out, fold=_params_fold,
                   what="W[o] and B[o] (depthwise: kernel, bias and group); consumers: W[:, i]"),
    "Gemm": Editor(out=_params_out, fold=_params_fold, what="B rows/columns (transB honoured) and C"),
    "MatMul": Editor(out=_params_out, fold=_params_fold, what="W[:, o]; consumers: W[i, :]"),
    "BatchNormalization": Editor(out=_params_out, what="scale, B, mean, var"),
    "InstanceNormalization": Editor(out=_params_out, what="scale, B"),
    "Pow": Editor(out=_params_out, what="per-channel exponent or base (none between two tracked tensors)"),
    "PRelu": Editor(out=_params_out, what="per-channel slope"),
    **{op: Editor(out=_params_out, what="per-channel constant (none between two tracked tensors)")
       for op in ("Add", "Sub", "Mul", "Div")},
    "Pad": Editor(out=_pad_out, what="pads before/after on the channel axis"),
    "Split": Editor(out=_split_out, what="split sizes along the channel axis"),
    "Reshape": Editor(out=_reshape_out, what="the channel entry of the target shape"),
    "Resize": Editor(out=_resize_out, what="sizes[channel axis]"),
}
for _op in ("Relu", "LeakyRelu", "Clip", "Sigmoid", "HardSigmoid", "HardSwish", "Tanh", "Gelu", "Elu",
            "Selu", "Softplus", "Softsign", "Celu", "Mish", "Identity", "Dropout", "Neg", "Abs", "Softmax",
            "LogSoftmax", "Hardmax", "MaxPool", "AveragePool", "LpPool", "GlobalAveragePool",
            "GlobalMaxPool", "GlobalLpPool", "Flatten", "Squeeze", "Unsqueeze", "Transpose", "Slice",
            "Concat", "Upsample", "Erf", "Exp", "Log", "Sqrt", "Reciprocal", "Sign", "Floor", "Ceil", "Round",
            "Sin", "Cos"):
    REGISTRY[_op] = _TRANSPARENT


def apply(ctx: EditContext, op: GroupOp, edit: ChannelEdit) -> None:
    """Apply ``edit`` to ``op`` through its registered editor."""
    editor = REGISTRY.get(op.op_type)
    fn = None if editor is None else (editor.fold if op.role == CONSUMER else editor.out)
    if fn is None:
        raise KeyError(f"no channel editor for {op.op_type} as {op.role} ({op.name})")
    fn(ctx, op, edit)
