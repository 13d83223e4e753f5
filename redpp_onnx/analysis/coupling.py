"""Channel-coupling groups (METHOD.md step 2): which output channels must be edited together.

Pure: reads a ``ModelProto``, never changes it.

Vocabulary
----------
*Atoms* are born at **producers** -- eligible layers (``scan_layers``: Conv ``group == 1``, Gemm,
MatMul with a constant weight) whose output channels define them -- one atom per output channel,
and at a ``Pad`` on the channel axis (one constant atom per padded channel, the option-A
shortcut of the CIFAR ResNets). Every tracked tensor carries the list of atoms of its channel
axis. Ops on the path move these lists:

* channel-transparent ops (activations, pools, Identity, Dropout, spatial Pad/Slice, Resize,
  Flatten/Reshape/Squeeze/Unsqueeze/Transpose that keep each channel apart) keep them;
* per-channel ops (BatchNormalization, InstanceNormalization, PRelu with per-channel slope,
  Add/Sub/Mul/Div/Pow by a per-channel constant, depthwise Conv) keep them and add per-channel
  parameters;
* Add/Sub/Mul/Div/Pow between two tracked tensors (residuals, squeeze-excitation gates,
  x*Sigmoid(x)) *unite* the atoms position by position; Concat along the channel axis
  concatenates the lists (each input occupies an offset range of the output); Split along the
  channel axis cuts them.

After the walk, united atoms form a **channel class**: one channel that must be kept or deleted
everywhere at once. A class *appears* in a set of tensors (its membership). Two classes can be
merged only when they appear in exactly the same tensors (then every tensor that loses one keeps
the other, and every consumer can fold one input channel into the other), so the classes of a
group are partitioned into **buckets** of equal membership. A **group** is a connected set of
tensors that share classes (a residual stage, a Concat and its branches...); it is what the
report shows.

**Consumers** read a tracked tensor linearly along its channel axis: Conv ``group == 1`` (weight
axis 1), Gemm (axis 1 of B when ``transB``, else axis 0) and MatMul (weight axis 0), directly or
after a Flatten/Reshape (channel ``c`` of ``[C, H, W]`` is features ``c*H*W ... (c+1)*H*W-1``:
``inner = H*W``).

Anything the analysis cannot prove safe **blocks** every class of the tensor concerned, with a
reason: the tensor is a graph output, it feeds an unsupported op, a Softmax over channels, a
Reshape that mixes channels, a layer whose weight is shared, a computed (untracked) tensor with
per-channel values...
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from typing import Optional

import numpy as np
import onnx

from .layers import ConstantTensors, LayerScan, node_names, scan_layers, static_shapes, iter_nodes_deep

PRODUCER = "producer"        # output channels define the group's channels (eligible layer)
PER_CHANNEL = "per_channel"  # keeps each channel apart and has per-channel parameters
PASS = "pass"                # keeps channels apart (or moves them: Concat, Split, Pad...), no weights
CONSUMER = "consumer"        # reads the channels linearly (weights along an input axis)
ROLES = (PRODUCER, PER_CHANNEL, PASS, CONSUMER)

#: Elementwise ops that act on every channel alike (transparent).
TRANSPARENT_UNARY = frozenset({
    "Relu", "LeakyRelu", "Clip", "Sigmoid", "HardSigmoid", "HardSwish", "Tanh", "Gelu", "Elu",
    "Selu", "Softplus", "Softsign", "Celu", "Mish", "Identity", "Dropout", "Neg", "Abs",
    "Softmax", "LogSoftmax", "Hardmax",  # only over a non-channel axis
    "Erf", "Exp", "Log", "Sqrt", "Reciprocal", "Sign", "Floor", "Ceil", "Round", "Sin", "Cos",
})
POOL_OPS = frozenset({"MaxPool", "AveragePool", "LpPool", "GlobalAveragePool", "GlobalMaxPool",
                      "GlobalLpPool"})
BINARY_OPS = frozenset({"Add", "Sub", "Mul", "Div", "Pow"})
SHAPE_OPS = frozenset({"Flatten", "Reshape", "Squeeze", "Unsqueeze", "Transpose", "Slice", "Pad",
                       "Resize", "Upsample", "Concat", "Split"})

#: Every op type the analysis can put in a group, by role (the editor registry must cover them).
GROUP_OP_TYPES = {
    PRODUCER: frozenset({"Conv", "Gemm", "MatMul"}),
    CONSUMER: frozenset({"Conv", "Gemm", "MatMul"}),
    PER_CHANNEL: frozenset({"BatchNormalization", "InstanceNormalization", "PRelu", "Conv"}) | BINARY_OPS,
    PASS: TRANSPARENT_UNARY | POOL_OPS | SHAPE_OPS | BINARY_OPS | {"PRelu"},
}


@dataclasses.dataclass(frozen=True)
class ParamRef:
    """A constant input of a node that holds one slice per channel along ``axis``."""

    input: int     # index in node.input
    name: str      # the tensor's name (initializer or Constant output)
    axis: int      # its channel axis (in the constant's own dimensions)


@dataclasses.dataclass(frozen=True)
class GroupOp:
    """One node's part in a group.

    ``tensor``: for producers, per-channel and pass ops the group tensor whose channel layout
    the op's edit follows (its output; the *input* for Split); for consumers the input it reads.
    ``axis``/``rank``/``inner``: that tensor's channel axis, rank and features per channel.
    ``params``: per-channel constants (producers and per-channel ops: output channels;
    consumers: the weight's input-channel axis).
    """

    node: int
    name: str
    op_type: str
    role: str
    tensor: str
    axis: int
    rank: int
    inner: int = 1
    params: tuple = ()


@dataclasses.dataclass(frozen=True)
class ChannelBucket:
    """Classes of a group that appear in exactly the same tensors (mergeable with each other)."""

    classes: tuple            # class ids, ascending
    tensors: tuple            # the tensors they appear in
    reasons: tuple = ()       # non-empty: blocked


@dataclasses.dataclass(frozen=True)
class ChannelGroup:
    id: int
    tensors: tuple
    classes: tuple
    buckets: tuple
    ops: tuple                # GroupOp, in node order
    reasons: tuple = ()       # every block reason met in the group (deduplicated)

    def ops_with(self, role: str) -> tuple:
        return tuple(op for op in self.ops if op.role == role)

    @property
    def producers(self) -> tuple:
        return self.ops_with(PRODUCER)

    @property
    def consumers(self) -> tuple:
        return self.ops_with(CONSUMER)

    @property
    def blocked(self) -> bool:
        return all(b.reasons for b in self.buckets)


@dataclasses.dataclass(frozen=True)
class TensorChannels:
    axis: int
    rank: int
    inner: int = 1


@dataclasses.dataclass(frozen=True)
class Coupling:
    """Result of :func:`analyze_coupling`."""

    groups: tuple
    layout: dict              # tensor -> tuple of class ids (one per channel position)
    channels: dict            # tensor -> TensorChannels
    scan: LayerScan
    names: tuple              # display name per node index

    def positions(self, tensor: str) -> dict:
        """class id -> position in ``tensor``."""
        return {c: p for p, c in enumerate(self.layout[tensor])}

    def group_of(self, tensor: str) -> Optional[ChannelGroup]:
        for g in self.groups:
            if tensor in g.tensors:
                return g
        return None


class _UnionFind:
    def __init__(self):
        self.parent: list = []

    def make(self, n: int) -> np.ndarray:
        start = len(self.parent)
        self.parent.extend(range(start, start + n))
        return np.arange(start, start + n, dtype=np.int64)

    def find(self, x: int) -> int:
        p = self.parent
        root = x
        while p[root] != root:
            root = p[root]
        while p[x] != root:
            p[x], x = root, p[x]
        return root

    def union(self, a: int, b: int) -> None:
        ra, rb = self.find(int(a)), self.find(int(b))
        if ra != rb:  # the smaller id is the root: class id = its earliest atom
            lo, hi = min(ra, rb), max(ra, rb)
            self.parent[hi] = lo


@dataclasses.dataclass
class _Info:
    atoms: np.ndarray
    axis: int
    rank: int
    inner: int = 1

    @property
    def size(self) -> int:
        return len(self.atoms)


def _attr(node, name, default=None):
    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default


def _opset(model: onnx.ModelProto) -> int:
    for o in model.opset_import:
        if o.domain in ("", "ai.onnx"):
            return int(o.version)
    return 1


class _Analyzer:
    def __init__(self, model: onnx.ModelProto):
        self.model = model
        self.graph = model.graph
        self.opset = _opset(model)
        self.consts = ConstantTensors(model)
        self.names = node_names(model)
        self.scan = scan_layers(model)
        self._shapes = None
        by_name = {n: i for i, n in enumerate(self.names)}
        self.eligible = {by_name[l.node]: l for l in self.scan.layers}
        self.refusal = {by_name[r.node]: r.reason for r in self.scan.refused}
        self.users = defaultdict(list)
        for i, node in enumerate(self.graph.node):
            for k, t in enumerate(node.input):
                if t:
                    self.users[t].append((i, k))
        self.uf = _UnionFind()
        self.info: dict = {}
        self.ops: list = []
        self.blocks: list = []   # (tensor, reason)

    # ------------------------------------------------------------------ helpers
    @property
    def shapes(self) -> dict:
        if self._shapes is None:
            self._shapes = static_shapes(self.model)
        return self._shapes

    def block(self, tensor: str, reason: str) -> None:
        self.blocks.append((tensor, reason))

    def block_all(self, ins, reason: str) -> None:
        for _, t in ins:
            self.block(t, reason)

    def add(self, i, role, tensor, info: _Info, params=(), inner=None):
        node = self.graph.node[i]
        self.ops.append(GroupOp(i, self.names[i], node.op_type, role, tensor, info.axis, info.rank,
                                info.inner if inner is None else inner, tuple(params)))

    def emit(self, i, node, role, out: _Info, params=()):
        """Record the channel info of ``node``'s first output and its role in the group."""
        self.info[node.output[0]] = out
        self.add(i, role, node.output[0], out, params)

    def const(self, name: str) -> Optional[np.ndarray]:
        if name and name in self.consts:
            return self.consts.array(name)
        return None

    def used(self, tensor: str) -> bool:
        return bool(tensor) and (bool(self.users.get(tensor)) or
                                 any(o.name == tensor for o in self.graph.output))

    def _aligned_channel_dim(self, shape, info: _Info):
        """(axis of the channel in ``shape`` broadcast against the tracked tensor, its size);
        axis None when ``shape`` has no channel dimension; raises ValueError on a bad rank."""
        shape = tuple(shape)
        if len(shape) > info.rank:
            raise ValueError(f"rank {len(shape)} > {info.rank}")
        ax = info.axis - (info.rank - len(shape))
        if ax < 0:
            return None, 1
        return ax, shape[ax]

    # ------------------------------------------------------------------ walk
    def run(self) -> Coupling:
        for i, node in enumerate(self.graph.node):
            ins = [(k, t) for k, t in enumerate(node.input) if t and t in self.info]
            name, op = self.names[i], node.op_type
            if i in self.eligible:
                self._eligible(i, node, ins)
                continue
            if not ins:
                continue
            if node.domain not in ("", "ai.onnx"):
                self.block_all(ins, f"output feeds {node.domain}::{op} {name}: unsupported op on the path")
                continue
            if op in TRANSPARENT_UNARY or op in POOL_OPS:
                self._transparent(i, node, ins)
            elif op in BINARY_OPS:
                self._binary(i, node, ins)
            else:
                handler = getattr(self, "_op_" + op, None)
                if handler is None:
                    self.block_all(ins, f"output feeds {op} {name}: unsupported op {op} on the path")
                else:
                    handler(i, node, ins)
        for out in self.graph.output:
            if out.name in self.info:
                self.block(out.name, f"channel feeds the graph output {out.name}")
        for t in self._subgraph_refs():
            if t in self.info:
                self.block(t, f"{t} is used inside a subgraph (If/Loop/Scan)")
        return self._resolve()

    def _subgraph_refs(self) -> set:
        """Tensors read by nodes inside subgraphs (If / Loop / Scan bodies)."""
        refs = set()
        for node in self.graph.node:
            for a in node.attribute:
                bodies = [a.g] if a.type == onnx.AttributeProto.GRAPH else (
                    list(a.graphs) if a.type == onnx.AttributeProto.GRAPHS else [])
                for body in bodies:
                    refs.update(x for n in iter_nodes_deep(body) for x in n.input if x)
        return refs

    # ------------------------------------------------------------------ eligible layers
    def _eligible(self, i, node, ins):
        layer = self.eligible[i]
        name, op = self.names[i], node.op_type
        w = layer.weight_shape
        for k, t in ins:
            info = self.info[t]
            if k != 0:
                self.block(t, f"used as input {k} of {op} {name} (only input 0 is read linearly)")
                continue
            if op == "Conv":
                ok = info.axis == 1 and info.inner == 1 and info.rank == len(w) and info.size == w[1]
                params = (ParamRef(1, layer.weight, 1),)
            elif op == "Gemm":
                n_in = w[1] if layer.trans_b else w[0]
                ok = info.rank == 2 and info.axis == 1 and info.size * info.inner == n_in
                params = (ParamRef(1, layer.weight, 1 if layer.trans_b else 0),)
            else:  # MatMul
                ok = info.axis == info.rank - 1 and info.size * info.inner == w[0]
                params = (ParamRef(1, layer.weight, 0),)
            if ok:
                self.add(i, CONSUMER, t, info, params)
            else:
                self.block(t, f"{op} {name} does not read the channels along its input axis "
                              f"(channel axis {info.axis} of a rank-{info.rank} tensor, "
                              f"{info.size} channels x {info.inner} features)")
        out = node.output[0]
        if op == "Conv":
            n, axis, rank = w[0], 1, len(w)
            params = [ParamRef(1, layer.weight, 0)]
            if layer.bias:
                params.append(ParamRef(2, layer.bias, 0))
        elif op == "Gemm":
            n, axis, rank = (w[0] if layer.trans_b else w[1]), 1, 2
            params = [ParamRef(1, layer.weight, 0 if layer.trans_b else 1)]
        else:
            n = w[1]
            a_shape = self.shapes.get(node.input[0])
            rank = self.info[node.input[0]].rank if node.input[0] in self.info else (
                len(a_shape) if a_shape else None)
            if rank is None or rank < 2:
                return  # output not tracked: no group (the layer's row says so)
            axis = rank - 1
            params = [ParamRef(1, layer.weight, 1)]
        info = _Info(self.uf.make(n), axis, rank)
        self.info[out] = info
        bias_reason = None
        if op == "Conv" and layer.bias and self.const(layer.bias) is None:
            params.pop()  # not a constant: nothing to read or edit
            bias_reason = f"Conv {name} adds a computed bias ({layer.bias})"
        if op == "Gemm" and len(node.input) > 2 and node.input[2]:
            c = self.const(node.input[2])
            if c is None:
                bias_reason = f"Gemm {name} adds a computed tensor C ({node.input[2]})"
            elif c.ndim >= 1 and c.shape[-1] == n and n > 1:
                params.append(ParamRef(2, node.input[2], c.ndim - 1))
            elif c.ndim >= 1 and c.shape[-1] != 1:
                bias_reason = f"Gemm {name} bias C of shape {list(c.shape)} does not broadcast per channel"
        self.add(i, PRODUCER, out, info, params)
        if bias_reason:
            self.block(out, bias_reason)

    # ------------------------------------------------------------------ transparent ops
    def _transparent(self, i, node, ins):
        name, op = self.names[i], node.op_type
        if any(k != 0 for k, _ in ins):
            self.block_all(ins, f"used as a parameter input of {op} {name}")
            return
        info = self.info[node.input[0]]
        if op in ("Softmax", "LogSoftmax", "Hardmax"):
            default = 1 if self.opset < 13 else -1
            ax = int(_attr(node, "axis", default))
            ax = ax + info.rank if ax < 0 else ax
            mixes = (ax <= info.axis) if self.opset < 13 else (ax == info.axis)
            if mixes:
                self.block(node.input[0], f"output feeds {op} over channels ({name})")
                return
        if op in POOL_OPS and (info.axis != 1 or info.inner != 1 or info.rank < 3):
            self.block(node.input[0], f"{op} {name} pools a tensor whose channels are not on axis 1")
            return
        if op == "MaxPool" and len(node.output) > 1 and self.used(node.output[1]):
            self.block(node.input[0], f"MaxPool {name} indices are used")
            return
        if op == "Dropout" and len(node.output) > 1 and self.used(node.output[1]):
            self.block(node.input[0], f"Dropout {name} mask is used")
            return
        self._same_channels(i, node, info)

    # ------------------------------------------------------------------ elementwise binary
    def _binary(self, i, node, ins):
        name, op = self.names[i], node.op_type
        if len(node.input) != 2:
            self.block_all(ins, f"{op} {name} has {len(node.input)} inputs")
            return
        if len(ins) == 2:
            (_, ta), (_, tb) = ins
            a, b = self.info[ta], self.info[tb]
            if (a.rank, a.axis, a.inner, a.size) != (b.rank, b.axis, b.inner, b.size):
                self.block_all(ins, f"{op} {name} joins tensors whose channels do not line up "
                                    f"({a.size} on axis {a.axis} vs {b.size} on axis {b.axis})")
                return
            for x, y in zip(a.atoms, b.atoms):
                self.uf.union(x, y)
            out = _Info(a.atoms, a.axis, a.rank, a.inner)
            self.emit(i, node, PASS, out)
            return
        (k, t), = ins
        info = self.info[t]
        other = node.input[1 - k]
        value = self.const(other)
        shape = value.shape if value is not None else self.shapes.get(other)
        what = "a constant" if value is not None else f"{other}"
        if shape is None:
            self.block(t, f"{op} {name} with {other}, a computed tensor of unknown shape")
            return
        try:
            ax, dim = self._aligned_channel_dim(shape, info)
        except ValueError:
            self.block(t, f"{op} {name} with {what} of rank {len(shape)} broadcasts the tensor to a higher rank")
            return
        params = ()
        if ax is not None and dim != 1:
            if value is None:
                src = "a graph input" if any(x.name == other for x in self.graph.input) else "computed"
                self.block(t, f"{op} {name} with {other} ({src}): a tensor whose channels are not tracked")
                return
            if info.inner != 1 or dim != info.size:
                self.block(t, f"{op} {name} with a constant of shape {list(shape)} that does not match "
                              f"the {info.size} channels")
                return
            params = (ParamRef(1 - k, other, ax),)
        self._same_channels(i, node, info, params)

    def _same_channels(self, i, node, info, params=()):
        """The output has the input's channels: a per-channel op when it has parameters, else a pass."""
        self.emit(i, node, PER_CHANNEL if params else PASS, _Info(info.atoms, info.axis, info.rank, info.inner),
                  params)

    # ------------------------------------------------------------------ per-channel ops
    def _op_BatchNormalization(self, i, node, ins):
        name = self.names[i]
        if any(k != 0 for k, _ in ins):
            self.block_all(ins, f"used as a parameter of BatchNormalization {name}")
            return
        info = self.info[node.input[0]]
        if info.axis != 1 or info.inner != 1:
            self.block(node.input[0], f"BatchNormalization {name} normalises axis 1, not the channel axis")
            return
        params = []
        for k in range(1, 5):
            v = self.const(node.input[k] if k < len(node.input) else "")
            if v is None or v.shape != (info.size,):
                self.block(node.input[0], f"BatchNormalization {name} has computed or mis-shaped parameters")
                return
            params.append(ParamRef(k, node.input[k], 0))
        if any(self.used(o) for o in node.output[1:]):
            self.block(node.input[0], f"BatchNormalization {name} in training mode (statistics outputs used)")
            return
        out = _Info(info.atoms, info.axis, info.rank)
        self.emit(i, node, PER_CHANNEL, out, params)

    def _op_InstanceNormalization(self, i, node, ins):
        """Normalises each channel over its own spatial extent: per-channel scale and B."""
        name = self.names[i]
        if any(k != 0 for k, _ in ins):
            self.block_all(ins, f"used as a parameter of InstanceNormalization {name}")
            return
        info = self.info[node.input[0]]
        scale, bias = (self.const(node.input[k]) if len(node.input) > k else None for k in (1, 2))
        if info.axis != 1 or info.inner != 1 or scale is None or bias is None \
                or scale.shape != (info.size,) or bias.shape != (info.size,):
            self.block(node.input[0], f"InstanceNormalization {name} with computed parameters or channels "
                                      "not on axis 1")
            return
        out = _Info(info.atoms, info.axis, info.rank)
        self.emit(i, node, PER_CHANNEL, out, (ParamRef(1, node.input[1], 0), ParamRef(2, node.input[2], 0)))

    def _op_PRelu(self, i, node, ins):
        name = self.names[i]
        if any(k != 0 for k, _ in ins):
            self.block_all(ins, f"used as the slope of PRelu {name}")
            return
        info = self.info[node.input[0]]
        slope = self.const(node.input[1])
        if slope is None:
            self.block(node.input[0], f"PRelu {name} has a computed slope")
            return
        try:
            ax, dim = self._aligned_channel_dim(slope.shape, info)
        except ValueError:
            self.block(node.input[0], f"PRelu {name} slope has a higher rank than its input")
            return
        params = ()
        if ax is not None and dim != 1:
            if dim != info.size or info.inner != 1:
                self.block(node.input[0], f"PRelu {name} slope of shape {list(slope.shape)} is not per channel")
                return
            params = (ParamRef(1, node.input[1], ax),)
        self._same_channels(i, node, info, params)

    def _op_Conv(self, i, node, ins):
        """A Conv that is not an eligible layer: a depthwise conv is a per-channel op."""
        name = self.names[i]
        if any(k != 0 for k, _ in ins):
            self.block_all(ins, f"used as a weight of Conv {name}")
            return
        info = self.info[node.input[0]]
        group = int(_attr(node, "group", 1))
        w = self.const(node.input[1])
        if w is None or w.dtype != np.float32:
            self.block(node.input[0], f"Conv {name} cannot be edited: "
                                      f"{self.refusal.get(i, 'its weight is not a float32 constant')}")
            return
        bias = node.input[2] if len(node.input) > 2 and node.input[2] else None
        if bias and self.const(bias) is None:
            self.block(node.input[0], f"Conv {name} has a computed bias")
            return
        if not (group == info.size == w.shape[0] and w.shape[1] == 1 and info.axis == 1 and info.inner == 1):
            if group != 1:
                reason = (f"grouped Conv (group={group}, {w.shape[0]} outputs for {info.size} channels) "
                          "is not supported on a channel path")
            else:
                reason = self.refusal.get(i, "not an eligible layer")
                if "shared" in reason:
                    reason = f"weight shared by two layers: {reason}"
            self.block(node.input[0], f"output feeds Conv {name}, which cannot be edited ({reason})")
            return
        params = [ParamRef(1, node.input[1], 0)] + ([ParamRef(2, bias, 0)] if bias else [])
        out = _Info(info.atoms, info.axis, info.rank)
        self.emit(i, node, PER_CHANNEL, out, params)

    def _not_eligible(self, i, node, ins):
        name, op = self.names[i], node.op_type
        reason = self.refusal.get(i, "not an eligible layer")
        if "shared" in reason:
            reason = f"weight shared by two layers: {reason}"
        self.block_all(ins, f"output feeds {op} {name}, which cannot be edited ({reason})")

    _op_Gemm = _not_eligible
    _op_MatMul = _not_eligible

    # ------------------------------------------------------------------ shape ops
    def _data_input(self, i, node, ins):
        """(name, data tensor, its channel info) of a node whose channels arrive through its
        input 0 only; None once blocked (see :meth:`_only_data`)."""
        if not self._only_data(i, node, ins):
            return None
        return self.names[i], node.input[0], self.info[node.input[0]]

    def _only_data(self, i, node, ins) -> bool:
        if any(k != 0 for k, _ in ins):
            self.block_all(ins, f"used as a shape/parameter input of {node.op_type} {self.names[i]}")
            return False
        return True

    def _op_Flatten(self, i, node, ins):
        got = self._data_input(i, node, ins)
        if got is None:
            return
        name, t, info = got
        f = int(_attr(node, "axis", 1))
        f = f + info.rank if f < 0 else f
        shape = self.shapes.get(t)
        if shape is None or len(shape) != info.rank:
            self.block(t, f"Flatten {name}: input shape unknown (needed to map channels to features)")
            return
        if not (1 <= f <= info.axis and all(d == 1 for d in shape[f:info.axis])):
            self.block(t, f"Flatten {name} (axis={f}) mixes channels with the batch axis: Reshape that mixes channels")
            return
        inner = info.inner * int(np.prod(shape[info.axis + 1:], dtype=np.int64))
        out = _Info(info.atoms, 1, 2, inner)
        self.emit(i, node, PASS, out)

    def _op_Reshape(self, i, node, ins):
        got = self._data_input(i, node, ins)
        if got is None:
            return
        name, t, info = got
        if self.const(node.input[1]) is None:
            self.block(t, f"Reshape {name} with a computed shape")
            return
        s_in, s_out = self.shapes.get(t), self.shapes.get(node.output[0])
        if s_in is None or s_out is None:
            self.block(t, f"Reshape {name}: shapes unknown (needed to prove it keeps channels apart)")
            return
        a = info.axis
        inner = None
        if tuple(s_out[:a + 1]) == tuple(s_in[:a + 1]):
            # the dims up to the channel axis are kept: each channel's elements stay one block
            if info.inner == 1:
                inner = 1
            elif all(d == 1 for d in s_out[a + 1:]):
                inner = info.inner
        elif (len(s_out) == a + 1 and tuple(s_out[:a]) == tuple(s_in[:a])
              and s_out[a] == int(np.prod(s_in[a:], dtype=np.int64))):
            # flattening the dims after the channel axis into it: channel c -> features c*K ... (c+1)*K-1
            inner = info.inner * int(np.prod(s_in[a + 1:], dtype=np.int64))
        if inner is not None:
            out = _Info(info.atoms, a, len(s_out), inner)
            self.emit(i, node, PASS, out)
            return
        self.block(t, f"Reshape {name} {list(s_in)} -> {list(s_out)}: Reshape that mixes channels")

    def _axes(self, node, attr_name="axes", input_index=1):
        if self.opset >= 13 and len(node.input) > input_index and node.input[input_index]:
            v = self.const(node.input[input_index])
            return None if v is None else [int(x) for x in np.ravel(v)]
        a = _attr(node, attr_name)
        return [] if a is None else [int(x) for x in a]

    def _data_and_axes(self, i, node, ins):
        """(name, data tensor, its info, axes) of a Squeeze/Unsqueeze, or None once blocked."""
        got = self._data_input(i, node, ins)
        if got is None:
            return None
        name, t, info = got
        axes = self._axes(node)
        if axes is None:
            self.block(t, f"{node.op_type} {name} with computed axes")
            return None
        return name, t, info, axes

    def _op_Squeeze(self, i, node, ins):
        got = self._data_and_axes(i, node, ins)
        if got is None:
            return
        name, t, info, axes = got
        if not axes:
            shape = self.shapes.get(t)
            if shape is None:
                self.block(t, f"Squeeze {name}: input shape unknown")
                return
            axes = [k for k, d in enumerate(shape) if d == 1]
        axes = sorted({a + info.rank if a < 0 else a for a in axes})
        if info.axis in axes:
            self.block(t, f"Squeeze {name} removes the channel axis")
            return
        if info.inner != 1 and any(a > info.axis for a in axes):
            self.block(t, f"Squeeze {name} on flattened features")
            return
        out = _Info(info.atoms, info.axis - sum(a < info.axis for a in axes), info.rank - len(axes), info.inner)
        self.emit(i, node, PASS, out)

    def _op_Unsqueeze(self, i, node, ins):
        got = self._data_and_axes(i, node, ins)
        if got is None:
            return
        name, t, info, axes = got
        rank = info.rank + len(axes)
        axes = {a + rank if a < 0 else a for a in axes}
        kept = [p for p in range(rank) if p not in axes]
        new_axis = kept[info.axis]
        if info.inner != 1 and new_axis != rank - 1 and any(a > new_axis for a in axes):
            self.block(t, f"Unsqueeze {name} on flattened features")
            return
        out = _Info(info.atoms, new_axis, rank, info.inner)
        self.emit(i, node, PASS, out)

    def _op_Transpose(self, i, node, ins):
        name = self.names[i]
        t = node.input[0]
        info = self.info[t]
        perm = _attr(node, "perm") or list(range(info.rank))[::-1]
        if info.inner != 1:
            self.block(t, f"Transpose {name} of flattened features")
            return
        out = _Info(info.atoms, list(perm).index(info.axis), info.rank)
        self.emit(i, node, PASS, out)

    def _op_Slice(self, i, node, ins):
        got = self._data_input(i, node, ins)
        if got is None:
            return
        name, t, info = got
        if self.opset < 10:
            starts, ends = _attr(node, "starts"), _attr(node, "ends")
            axes = _attr(node, "axes") or list(range(len(starts)))
            steps = [1] * len(starts)
        else:
            vals = [self.const(node.input[k]) if len(node.input) > k and node.input[k] else None
                    for k in range(1, 5)]
            if vals[0] is None or vals[1] is None or (len(node.input) > 3 and node.input[3] and vals[2] is None) \
                    or (len(node.input) > 4 and node.input[4] and vals[3] is None):
                self.block(t, f"Slice {name} with computed bounds")
                return
            starts, ends = vals[0].tolist(), vals[1].tolist()
            axes = vals[2].tolist() if vals[2] is not None else list(range(len(starts)))
            steps = vals[3].tolist() if vals[3] is not None else [1] * len(starts)
        n = info.size * info.inner
        for s, e, a, st in zip(starts, ends, axes, steps):
            a = a + info.rank if a < 0 else a
            if a == info.axis:
                s = s + n if s < 0 else s
                e = e + n if e < 0 else e
                if not (st == 1 and s <= 0 and e >= n):
                    self.block(t, f"Slice {name} on the channel axis (unsupported)")
                    return
        self._same_channels(i, node, info)

    def _op_Pad(self, i, node, ins):
        got = self._data_input(i, node, ins)
        if got is None:
            return
        name, t, info = got
        if self.opset < 11:
            pads, axes = _attr(node, "pads"), None
        else:
            pads = self.const(node.input[1]) if len(node.input) > 1 else None
            if pads is None:
                self.block(t, f"Pad {name} with computed pads")
                return
            pads = [int(x) for x in pads]
            # the pad value's number does not matter (padded channels are alike whatever it is),
            # only that it is a constant
            if len(node.input) > 2 and node.input[2] and self.const(node.input[2]) is None:
                self.block(t, f"Pad {name} with a computed pad value")
                return
            axes = None
            if len(node.input) > 3 and node.input[3]:
                v = self.const(node.input[3])
                if v is None:
                    self.block(t, f"Pad {name} with computed axes")
                    return
                axes = [int(x) for x in np.ravel(v)]
        axes = list(range(info.rank)) if axes is None else [a + info.rank if a < 0 else a for a in axes]
        before = after = 0
        if info.axis in axes:
            k = axes.index(info.axis)
            before, after = pads[k], pads[k + len(axes)]
        mode = _attr(node, "mode", b"constant")
        mode = mode.decode() if isinstance(mode, bytes) else mode
        if before or after:
            if before < 0 or after < 0:
                self.block(t, f"Pad {name} crops channels (negative pads on the channel axis)")
                return
            if mode != "constant" or info.inner != 1:
                self.block(t, f"Pad {name} ({mode}) on the channel axis")
                return
            # every padded channel holds the same constant: the padded classes are alike
            atoms = np.concatenate([self.uf.make(before), info.atoms, self.uf.make(after)])
        else:
            atoms = info.atoms
        out = _Info(atoms, info.axis, info.rank, info.inner)
        self.emit(i, node, PASS, out)

    def _op_Resize(self, i, node, ins):
        got = self._data_input(i, node, ins)
        if got is None:
            return
        name, t, info = got
        if info.inner != 1:
            self.block(t, f"{node.op_type} {name} of flattened features")
            return
        axes = _attr(node, "axes")
        axes = list(range(info.rank)) if axes is None else [a + info.rank if a < 0 else a for a in axes]
        if node.op_type == "Upsample" and self.opset < 9:
            scales, sizes = _attr(node, "scales"), None
        else:
            k_scales = 1 if node.op_type == "Upsample" or self.opset < 11 else 2  # Resize-10: X, scales
            scales = sizes = None
            if len(node.input) > k_scales and node.input[k_scales]:
                scales = self.const(node.input[k_scales])
                if scales is None:
                    self.block(t, f"{node.op_type} {name} with computed scales")
                    return
                scales = None if scales.size == 0 else scales.tolist()
            if node.op_type == "Resize" and len(node.input) > 3 and node.input[3]:
                sizes = self.const(node.input[3])
                if sizes is None:
                    self.block(t, f"Resize {name} with computed sizes")
                    return
                sizes = sizes.tolist()
        if info.axis in axes:
            k = axes.index(info.axis)
            if scales is not None and scales[k] != 1.0:
                self.block(t, f"{node.op_type} {name} rescales the channel axis")
                return
            if sizes is not None and sizes[k] != info.size:
                self.block(t, f"{node.op_type} {name} resizes the channel axis")
                return
        out = _Info(info.atoms, info.axis, info.rank)
        self.emit(i, node, PASS, out)

    _op_Upsample = _op_Resize

    def _op_Concat(self, i, node, ins):
        name = self.names[i]
        missing = [t for t in node.input if t and t not in self.info]
        if missing:
            self.block_all(ins, f"Concat {name} with {missing[0]}, an input whose channels are not tracked")
            return
        infos = [self.info[t] for t in node.input]
        first = infos[0]
        if any((x.rank, x.axis, x.inner) != (first.rank, first.axis, 1) for x in infos):
            self.block_all(ins, f"Concat {name} of tensors whose channel axes differ")
            return
        axis = int(_attr(node, "axis", 0))
        axis = axis + first.rank if axis < 0 else axis
        if axis == first.axis:
            atoms = np.concatenate([x.atoms for x in infos])
        else:
            if any(x.size != first.size for x in infos):
                self.block_all(ins, f"Concat {name} along axis {axis} of tensors with different channel counts")
                return
            for x in infos[1:]:
                for p, q in zip(first.atoms, x.atoms):
                    self.uf.union(p, q)
            atoms = first.atoms
        out = _Info(atoms, first.axis, first.rank)
        self.emit(i, node, PASS, out)

    def _op_Split(self, i, node, ins):
        got = self._data_input(i, node, ins)
        if got is None:
            return
        name, t, info = got
        axis = int(_attr(node, "axis", 0))
        axis = axis + info.rank if axis < 0 else axis
        n_out = len(node.output)
        if axis != info.axis:
            for o in node.output:
                self.info[o] = _Info(info.atoms, info.axis, info.rank, info.inner)
            self.add(i, PASS, t, info)
            return
        if info.inner != 1:
            self.block(t, f"Split {name} of flattened features")
            return
        if self.opset >= 13:
            sizes = None
            if len(node.input) > 1 and node.input[1]:
                v = self.const(node.input[1])
                if v is None:
                    self.block(t, f"Split {name} with computed sizes")
                    return
                sizes = [int(x) for x in v]
        else:
            sizes = _attr(node, "split")
            sizes = None if sizes is None else [int(x) for x in sizes]
        if sizes is None:
            n = int(_attr(node, "num_outputs", n_out))
            step = -(-info.size // n)
            sizes = [min(step, info.size - k * step) for k in range(n)]
        if sum(sizes) != info.size or len(sizes) != n_out:
            self.block(t, f"Split {name} sizes {sizes} do not match the {info.size} channels")
            return
        start = 0
        for o, s in zip(node.output, sizes):
            self.info[o] = _Info(info.atoms[start:start + s], info.axis, info.rank)
            start += s
        self.add(i, PASS, t, info)

    # ------------------------------------------------------------------ classes and groups
    def _resolve(self) -> Coupling:
        find = self.uf.find
        layout = {t: tuple(find(int(a)) for a in info.atoms) for t, info in self.info.items()}
        for t, cls in layout.items():
            if len(set(cls)) < len(cls):
                self.block(t, f"channels of {t} are coupled with each other (the same channel twice, "
                              "e.g. a Concat of a tensor with itself)")
        # groups: classes linked by co-occurrence in a tensor
        guf = _UnionFind()
        guf.parent = {}

        def gfind(x):
            p = guf.parent
            p.setdefault(x, x)
            root = x
            while p[root] != root:
                root = p[root]
            while p[x] != root:
                p[x], x = root, p[x]
            return root

        for cls in layout.values():
            if cls:
                r0 = gfind(cls[0])
                for c in cls[1:]:
                    r = gfind(c)
                    if r != r0:
                        lo, hi = min(r, r0), max(r, r0)
                        guf.parent[hi] = lo
                        r0 = lo
        membership = defaultdict(list)   # class -> tensors (creation order)
        for t, cls in layout.items():
            for c in dict.fromkeys(cls):
                membership[c].append(t)
        blocked = defaultdict(list)       # class -> reasons
        for t, reason in self.blocks:
            for c in layout.get(t, ()):
                if reason not in blocked[c]:
                    blocked[c].append(reason)
        by_group = defaultdict(list)
        for c in sorted(membership):
            by_group[gfind(c)].append(c)
        tensors_of = defaultdict(list)
        for t, cls in layout.items():
            if cls:
                tensors_of[gfind(cls[0])].append(t)
        ops_of = defaultdict(list)
        for op in self.ops:
            cls = layout.get(op.tensor)
            if cls:
                ops_of[gfind(cls[0])].append(op)
        groups = []
        for gid, root in enumerate(sorted(by_group)):
            buckets = defaultdict(list)
            for c in by_group[root]:
                buckets[tuple(membership[c])].append(c)
            bl = tuple(ChannelBucket(tuple(cs), key, tuple(blocked.get(cs[0], ())))
                       for key, cs in buckets.items())
            reasons = tuple(dict.fromkeys(r for c in by_group[root] for r in blocked.get(c, ())))
            groups.append(ChannelGroup(gid, tuple(tensors_of[root]), tuple(by_group[root]), bl,
                                       tuple(sorted(ops_of[root], key=lambda o: (o.node, ROLES.index(o.role)))),
                                       reasons))
        channels = {t: TensorChannels(info.axis, info.rank, info.inner) for t, info in self.info.items()}
        return Coupling(tuple(groups), layout, channels, self.scan, tuple(self.names))


def analyze_coupling(model: onnx.ModelProto) -> Coupling:
    """The channel groups of ``model`` (see the module docstring). Pure."""
    return _Analyzer(model).run()
