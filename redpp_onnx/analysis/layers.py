"""Eligible layers of a model (METHOD.md "Layouts"), their weights and their MACs.

Pure: reads a ``ModelProto``, never changes it. Eligible: ``Conv`` with ``group == 1`` (grouped
and depthwise convs only when asked), ``Gemm``, and ``MatMul`` whose second input is a constant
(an initializer or a ``Constant`` node). Every other candidate gets a reason.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from collections import defaultdict
from typing import Optional

import numpy as np
import onnx
from onnx import numpy_helper

FLOAT_TYPES = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16}
"""Weight element types the passes handle: they compute in float32 (or wider) and write every
value back in the tensor's own type (:func:`tensor_like`), rounded to nearest."""


def np_dtype(data_type: int) -> np.dtype:
    """numpy's dtype of an ONNX element type (bfloat16: ``ml_dtypes.bfloat16``, onnx's own)."""
    return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(data_type))


def representable(values: np.ndarray, data_type: int) -> np.ndarray:
    """``values`` rounded to the nearest number of ``data_type`` (a float type), as float32."""
    a = np.asarray(values, np.float32)
    if data_type == onnx.TensorProto.FLOAT:
        return a
    return a.astype(np_dtype(data_type)).astype(np.float32)


def tensor_like(proto: onnx.TensorProto, values: np.ndarray, name: Optional[str] = None) -> onnx.TensorProto:
    """A tensor named ``name`` (default: ``proto``'s) holding ``values`` in ``proto``'s element
    type (rounded to nearest when it is float16 / bfloat16), shaped like ``values``."""
    a = np.asarray(values)
    if proto.data_type in FLOAT_TYPES:
        a = np.asarray(a, np.float32).astype(np_dtype(proto.data_type))
    return numpy_helper.from_array(a, proto.name if name is None else name)


@dataclasses.dataclass(frozen=True)
class Layer:
    """One eligible layer. ``weight`` names the tensor (initializer or Constant output)."""

    node: str            # node name (made unique if the model has none)
    op_type: str         # Conv | Gemm | MatMul
    weight: str
    weight_shape: tuple
    group: int = 1
    trans_b: bool = False  # Gemm only
    bias: Optional[str] = None
    macs: Optional[int] = None  # multiply-adds for one sample (see scan_layers); None if unknown

    @property
    def params(self) -> int:
        return int(np.prod(self.weight_shape))


@dataclasses.dataclass(frozen=True)
class Refusal:
    node: str
    op_type: str
    reason: str


@dataclasses.dataclass(frozen=True)
class LayerScan:
    layers: tuple[Layer, ...]
    refused: tuple[Refusal, ...]

    @property
    def macs(self) -> Optional[int]:
        """The eligible layers' MACs per sample in all; None when one is unknown or there is none."""
        macs = [l.macs for l in self.layers]
        return sum(macs) if macs and None not in macs else None


_EXTERNAL_BASE: list = []  # (folder, check values) of the models whose external data is read on demand


@contextlib.contextmanager
def external_data_in(folder, check_values: bool = True):
    """Within the block, constants stored outside the model (not loaded) are read from ``folder``
    when a pass asks for their values, one at a time (``redpp_onnx/stream.py``). With
    ``check_values=False`` :func:`scan_layers` does not read such weights to check them (finite
    values): the caller checks each as it reads it."""
    _EXTERNAL_BASE.append((str(folder), check_values))
    try:
        yield
    finally:
        _EXTERNAL_BASE.pop()


class ConstantTensors:
    """The model's constant tensors: initializers and ``Constant`` node values, by name."""

    def __init__(self, model: onnx.ModelProto):
        self._graph = model.graph
        self._init = {t.name: t for t in model.graph.initializer}
        self._const = {}
        for node in model.graph.node:
            if node.op_type == "Constant" and len(node.output) == 1:
                for attr in node.attribute:
                    if attr.name == "value" and attr.type == onnx.AttributeProto.TENSOR:
                        self._const[node.output[0]] = attr.t

    def proto(self, name: str) -> Optional[onnx.TensorProto]:
        return self._init.get(name) or self._const.get(name)

    def __contains__(self, name: str) -> bool:
        return name in self._init or name in self._const

    def array(self, name: str) -> np.ndarray:
        proto = self.proto(name)
        if proto is None:
            raise KeyError(f"{name!r} is not a constant of the model (an initializer or a Constant node)")
        if _EXTERNAL_BASE and proto.data_location == onnx.TensorProto.EXTERNAL:
            from ..io import read_external

            return read_external(proto, _EXTERNAL_BASE[-1][0])  # read, never attached to the proto
        return numpy_helper.to_array(proto)

    def floats(self, name: str) -> np.ndarray:
        """:meth:`array`, with float16 / bfloat16 widened to float32 (what the passes compute in)."""
        a = self.array(name)
        return a.astype(np.float32) if a.dtype.name in ("float16", "bfloat16") else a


def iter_nodes_deep(graph: onnx.GraphProto):
    """Every node of ``graph`` and of its subgraphs (If / Loop / Scan bodies), depth first."""
    for node in graph.node:
        yield node
        for a in node.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                yield from iter_nodes_deep(a.g)
            elif a.type == onnx.AttributeProto.GRAPHS:
                for g in a.graphs:
                    yield from iter_nodes_deep(g)


def node_names(model: onnx.ModelProto) -> list[str]:
    """A unique display name per node (its name, else ``op_type_index``)."""
    seen = defaultdict(int)
    names = []
    for i, node in enumerate(model.graph.node):
        name = node.name or f"{node.op_type}_{i}"
        seen[name] += 1
        names.append(name if seen[name] == 1 else f"{name}#{seen[name]}")
    return names


def _attr(node: onnx.NodeProto, name: str, default):
    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default


LARGE_CONSTANT = 4096
"""Constant-only computations with an output larger than this (elements) are cut off before
shape inference with data propagation (see :func:`static_shapes`)."""


_INPUT_SHAPES: contextvars.ContextVar = contextvars.ContextVar("redpp_input_shapes", default={})


@contextlib.contextmanager
def input_shapes(shapes: Optional[dict]):
    """Within the block, :func:`static_shapes` gives the named graph inputs these shapes (the
    user's ``--input-shape``): the analyses then know sizes the model leaves dynamic."""
    token = _INPUT_SHAPES.set(dict(shapes or {}))
    try:
        yield
    finally:
        _INPUT_SHAPES.reset(token)


def check_input_shapes(model: onnx.ModelProto, shapes: Optional[dict]) -> None:
    """Raise a :class:`RedppError` when ``shapes`` (``--input-shape``) do not fit the model's inputs."""
    from ..errors import RedppError

    inputs = {vi.name: vi for vi in model.graph.input} if shapes else {}
    for name, shape in (shapes or {}).items():
        if not shape or not all(isinstance(d, int) and d >= 1 for d in shape):
            raise RedppError(f"--input-shape {name}: dimensions must be whole numbers >= 1, got {shape!r}")
        if name not in inputs:
            raise RedppError(f"--input-shape {name}: the model has no input of that name "
                             f"(inputs: {', '.join(i.name for i in model.graph.input)})")
        dims = inputs[name].type.tensor_type.shape.dim
        if len(dims) != len(shape):
            raise RedppError(f"--input-shape {name}: {len(shape)} dimensions given, the input has {len(dims)}")
        fixed = [(k, d.dim_value, v) for k, (d, v) in enumerate(zip(dims, shape))
                 if d.HasField("dim_value") and d.dim_value != v]
        if fixed:
            k, want, got = fixed[0]
            raise RedppError(f"--input-shape {name}: axis {k} is fixed to {want} in the model, got {got}")


def static_shapes(model: onnx.ModelProto, batch: int = 1) -> dict[str, tuple]:
    """Shapes of every tensor when the graph inputs' symbolic dims are fixed: the shapes given
    with :func:`input_shapes`, else the batch axis (axis 0) to ``batch``; other symbolic dims
    stay unknown, and so do the shapes that depend on them (a layer's MACs are then None, not
    counted at a made-up size). {} when inference fails. Works on a copy.

    onnx's data propagation copies the values of integer tensors computed from constants into
    shape protos (tens of bytes per element): a codebook decoder (``--codebook``) with millions
    of codes took gigabytes. So shapes are inferred twice: first without data propagation (cheap,
    every shape a constant-only computation needs is in its inputs' dims and small values), then
    with it, on a copy where every constant-only node with an output larger than
    ``LARGE_CONSTANT`` elements is replaced by graph inputs of the shapes found first. Pad and Slice
    arguments the graph computes from constants are evaluated first (:func:`computed_arguments`)."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    folded = computed_arguments(m)
    if folded:  # shape inference reads a Pad's pads or a Slice's bounds only from a constant
        keep = [n for n in m.graph.node if not (len(n.output) == 1 and n.output[0] in folded)]
        del m.graph.node[:]
        m.graph.node.extend(keep)
        m.graph.initializer.extend(numpy_helper.from_array(v, k) for k, v in folded.items())
    for inp, fixed in _data_inputs(m, batch):
        dims = inp.type.tensor_type.shape.dim
        for d, v in zip(dims, fixed):
            if v is not None and not d.HasField("dim_value"):
                d.Clear()
                d.dim_value = v
    try:
        inferred = onnx.shape_inference.infer_shapes(m)
        first = _shapes_of(inferred)
        _cut_large_constants(m, first, {vi.name: vi.type.tensor_type.elem_type for vi in inferred.graph.value_info})
    except Exception:  # noqa: BLE001 - shapes are an optional refinement (MACs, timings)
        return {}
    try:  # data propagation has failed on models the plain inference handles: keep what that found
        return {**first, **_shapes_of(onnx.shape_inference.infer_shapes(m, data_prop=True))}
    except Exception:  # noqa: BLE001
        return first


def _data_inputs(model: onnx.ModelProto, batch: int):
    """(input, dims) for each graph input that is a tensor with a shape and not an initializer:
    its dims as :func:`static_shapes` fixes them (the given shape, else axis 0 at ``batch`` when
    the model leaves it dynamic; None for a dim that stays unknown)."""
    initializers = {t.name for t in model.graph.initializer}
    given = _INPUT_SHAPES.get()
    for inp in model.graph.input:
        tt = inp.type.tensor_type if inp.type.HasField("tensor_type") else None
        if inp.name in initializers or tt is None or not tt.HasField("shape"):
            continue
        dims = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
        if inp.name in given and len(given[inp.name]) == len(dims):
            dims = [int(v) for v in given[inp.name]]
        elif dims and dims[0] is None:
            dims[0] = batch
        yield inp, dims


def sample_batch(model: onnx.ModelProto, batch: int = 1) -> Optional[int]:
    """How many samples the shapes of :func:`static_shapes` are for: axis 0 of the graph inputs
    of rank >= 2 (those the model leaves dynamic there, else all), 1 without such inputs; None
    when they disagree (no batch to divide the MACs by)."""
    found = {}
    for inp, dims in _data_inputs(model, batch):
        if len(dims) >= 2:
            dynamic = not inp.type.tensor_type.shape.dim[0].HasField("dim_value")
            found.setdefault(dynamic, set()).add(dims[0])
    sizes = found.get(True) or found.get(False) or {1}
    return next(iter(sizes)) if len(sizes) == 1 else None


def _per_sample_rows(out: Optional[tuple], batch: Optional[int]) -> Optional[int]:
    """Rows a Gemm/MatMul computes for one sample: the positions of its output (every axis but
    the last: batch, sequence, heads, ... in whatever order the exporter put them) divided by the
    batch. None when the shape or the batch is unknown, or the positions are not per sample."""
    if out is None or not batch:
        return None
    positions = int(np.prod(out[:-1], dtype=np.int64))
    return positions // batch if positions % batch == 0 else None


def _shapes_of(m: onnx.ModelProto) -> dict[str, tuple]:
    shapes = {}
    for vi in list(m.graph.value_info) + list(m.graph.output) + list(m.graph.input):
        tt = vi.type.tensor_type
        if tt.HasField("shape") and all(d.HasField("dim_value") for d in tt.shape.dim):
            shapes[vi.name] = tuple(d.dim_value for d in tt.shape.dim)
    return shapes


NOT_FOLDABLE = {"RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli", "Dropout"}
"""Ops not evaluated ahead of time even when their inputs are constants."""


def constant_only_nodes(graph: onnx.GraphProto) -> list:
    """Indices of the graph's nodes (``Constant`` nodes aside) that compute only from constants,
    in order: standard-domain, deterministic, no subgraph, every input an initializer, a
    ``Constant`` output or the output of such a node."""
    constant = {t.name for t in graph.initializer}
    constant |= {o for n in graph.node if n.op_type == "Constant" for o in n.output}
    found = []
    for k, node in enumerate(graph.node):
        if (node.op_type != "Constant" and node.domain in ("", "ai.onnx") and node.op_type not in NOT_FOLDABLE
                and node.input and all(not i or i in constant for i in node.input)
                and not any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
                            for a in node.attribute)):
            found.append(k)
            constant.update(o for o in node.output if o)
    return found


MAX_FOLD_NODES = 64
"""Constant-only nodes evaluated at most to learn one argument of a Pad or a Slice (the TorchScript
exporter computes a Pad's pads); their constant inputs and the value hold at most ``LARGE_CONSTANT``
elements."""


def computed_arguments(model: onnx.ModelProto) -> dict:
    """``{tensor: value}`` of the Pads' and Slices' arguments (all inputs but the data) that the graph
    computes from constants alone (e.g. ConstantOfShape, Concat, Reshape, Transpose, Slice, Cast of
    constants), each evaluated with onnx's reference evaluator on its own few nodes; what cannot be
    evaluated is left out. Shape inference reads these arguments only from constants: without their
    values every shape after such a Pad is unknown (:func:`static_shapes` gives them)."""
    from onnx.reference import ReferenceEvaluator

    graph = model.graph
    folded = {graph.node[k].output[0]: k for k in constant_only_nodes(graph) if len(graph.node[k].output) == 1}
    producer = {o: n for n in graph.node for o in n.output}
    inits = {t.name: t for t in graph.initializer}
    order = {id(n): k for k, n in enumerate(graph.node)}
    out = {}
    for node in graph.node:
        if node.op_type not in ("Pad", "Slice") or node.domain not in ("", "ai.onnx"):
            continue
        for name in [i for i in node.input[1:] if i in folded and i not in out]:
            nodes, todo, seen = [], [name], set()
            while todo and len(nodes) <= MAX_FOLD_NODES:
                t = todo.pop()
                if t in seen or t in inits or t not in producer:
                    continue
                seen.add(t)
                nodes.append(producer[t])
                todo.extend(i for i in producer[t].input if i)
            if len(nodes) > MAX_FOLD_NODES:
                continue
            nodes.sort(key=lambda n: order[id(n)])
            needed = {i for n in nodes for i in n.input}
            if sum(int(np.prod(inits[i].dims, dtype=np.int64)) for i in needed if i in inits) > LARGE_CONSTANT:
                continue
            sub = onnx.helper.make_graph(nodes, "pads", [], [onnx.helper.make_tensor_value_info(name, 0, None)],
                                         [inits[i] for i in needed if i in inits])
            try:
                sub_model = onnx.helper.make_model(sub, opset_imports=list(model.opset_import),
                                                   ir_version=model.ir_version)
                value = np.asarray(ReferenceEvaluator(sub_model).run(None, {})[0])
            except Exception:  # noqa: BLE001 - not evaluable: the shapes after it stay unknown
                continue
            if value.size <= LARGE_CONSTANT:
                out[name] = value
    return out


def _cut_large_constants(m: onnx.ModelProto, shapes: dict[str, tuple], types: dict[str, int]) -> None:
    """Replace (in place) the main graph's constant-only nodes with a large output by inputs."""
    graph = m.graph
    cut_nodes, cut = set(), []
    for k in constant_only_nodes(graph):
        outs = [o for o in graph.node[k].output if o]
        if all(o in shapes and o in types for o in outs) and \
                any(int(np.prod(shapes[o], dtype=np.int64)) > LARGE_CONSTANT for o in outs):
            cut_nodes.add(k)
            cut.extend(onnx.helper.make_tensor_value_info(o, types[o], shapes[o]) for o in outs)
    keep = [n for k, n in enumerate(graph.node) if k not in cut_nodes]
    if cut:
        del graph.node[:]
        graph.node.extend(keep)
        graph.input.extend(cut)


def scan_layers(model: onnx.ModelProto, *, include_grouped: bool = False, tables: bool = False) -> LayerScan:
    """Eligible layers and the reasons the other Conv/Gemm/MatMul nodes are not. ``tables``: also
    embedding tables (``Gather`` along axis 0 of a 2-D float constant by computed indices; layer
    ``op_type`` "Gather", ``macs`` 0: a lookup), which only hashing and storage handle.

    MACs are for one sample at the shapes of :func:`static_shapes` (the ``--input-shape`` sizes
    followed through the graph): a Conv's output positions per sample times ``C_in/group·kh·kw``;
    a Gemm's or MatMul's output rows (every output axis but the last, divided by the batch of
    :func:`sample_batch`) times its weight's size. None where the output shape is unknown (a
    dynamic dimension not given), never counted as if that dimension were 1."""
    consts = ConstantTensors(model)
    names = node_names(model)
    shapes = static_shapes(model)
    batch = sample_batch(model)
    consumers = defaultdict(list)
    for i, node in enumerate(model.graph.node):
        for j, inp in enumerate(node.input):
            consumers[inp].append((i, j))
    in_subgraphs = {name for node in model.graph.node for a in node.attribute
                    for g in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs))
                    for sub in iter_nodes_deep(g) for name in sub.input}
    layers, refused = [], []
    for i, node in enumerate(model.graph.node):
        if node.domain not in ("", "ai.onnx"):
            continue
        if tables and node.op_type == "Gather":
            _table(i, node, names, consts, consumers, in_subgraphs, layers, refused)
            continue
        if node.op_type not in ("Conv", "Gemm", "MatMul"):
            continue
        name = names[i]

        def refuse(reason):
            refused.append(Refusal(name, node.op_type, reason))

        if len(node.input) < 2 or node.input[1] not in consts:
            refuse("weight is not a constant (an initializer or a Constant node)")
            continue
        weight = node.input[1]
        proto = consts.proto(weight)
        if proto.data_type not in FLOAT_TYPES:
            refuse(f"weight has type {onnx.TensorProto.DataType.Name(proto.data_type)}; "
                   "only float32, float16 and bfloat16 weights are handled")
            continue
        bad = (_weight_problem(consts, weight, node.op_type) or _bias_problem(consts, node)
               or _conv_attribute_problem(node, consts.proto(weight))
               or _reuse_problem(weight, i, consumers, names, in_subgraphs, "weight"))
        if bad:
            refuse(bad)
            continue
        shape = tuple(proto.dims)
        out = shapes.get(node.output[0])
        if node.op_type == "Conv":
            group = int(_attr(node, "group", 1))
            if group != 1 and not include_grouped:
                kind = "depthwise" if group == shape[0] and shape[1] == 1 else "grouped"
                refuse(f"{kind} Conv (group={group}) skipped: the paper found that hashing it harms accuracy "
                       "(docs/HASHING.md); use --include-depthwise")
                continue
            macs = int(np.prod(out[1:]) * np.prod(shape[1:])) if out else None
            bias = node.input[2] if len(node.input) > 2 and node.input[2] else None
            layers.append(Layer(name, "Conv", weight, shape, group=group, bias=bias, macs=macs))
        elif node.op_type == "Gemm":
            if len(shape) != 2:
                refuse(f"Gemm weight has rank {len(shape)}")
                continue
            if int(_attr(node, "transA", 0)):
                refuse("Gemm with transA=1 is not handled")
                continue
            trans_b = bool(_attr(node, "transB", 0))
            bias = node.input[2] if len(node.input) > 2 and node.input[2] else None
            rows = _per_sample_rows(out, batch)
            layers.append(Layer(name, "Gemm", weight, shape, trans_b=trans_b, bias=bias,
                                macs=rows * int(np.prod(shape)) if rows is not None else None))
        else:  # MatMul
            if len(shape) != 2:
                refuse(f"MatMul weight has rank {len(shape)} (only 2-D weights [in, out])")
                continue
            rows = _per_sample_rows(out, batch)
            layers.append(Layer(name, "MatMul", weight, shape,
                                macs=rows * int(np.prod(shape)) if rows is not None else None))
    return LayerScan(tuple(layers), tuple(refused))


def _reuse_problem(weight: str, i: int, consumers, names, in_subgraphs, what: str) -> Optional[str]:
    """Why node ``i`` cannot have constant ``weight`` rewritten for itself alone (read inside a
    subgraph, or by other nodes), or None. ``what``: "weight" or "table", for the message."""
    if weight in in_subgraphs:
        return f"{what} is also read inside a subgraph (If / Loop / Scan body), which is left untouched"
    users = consumers[weight]
    if len(users) > 1:
        return f"{what} {weight} is shared with {', '.join(names[k] for k, _ in users if k != i)}"
    return None


def _table(i, node, names, consts, consumers, in_subgraphs, layers, refused) -> None:
    """An embedding table read by Gather node ``i``: appended to ``layers`` or, with its reason, to
    ``refused``; a Gather of anything else (shapes, constant indices) is not a candidate."""
    if len(node.input) < 2 or node.input[0] not in consts or node.input[1] in consts:
        return
    proto = consts.proto(node.input[0])
    if proto.data_type not in FLOAT_TYPES or len(proto.dims) != 2:
        return
    table = node.input[0]
    if int(_attr(node, "axis", 0)) not in (0, -2):
        bad = "Gather along the table's second axis (not a row lookup)"
    else:
        bad = _weight_problem(consts, table, "Gather") or _reuse_problem(table, i, consumers, names, in_subgraphs,
                                                                        "table")
        if bad and bad.startswith(f"table {table} is shared"):
            bad += " (tied embeddings)"
    if bad:
        refused.append(Refusal(names[i], "Gather", bad))
    else:
        layers.append(Layer(names[i], "Gather", table, tuple(proto.dims), macs=0))


def _weight_problem(consts: "ConstantTensors", weight: str, op_type: str) -> Optional[str]:
    """Why a float weight cannot be hashed (empty, wrong rank, unreadable, not finite), or None."""
    proto = consts.proto(weight)
    shape = tuple(proto.dims)
    if op_type == "Conv" and len(shape) < 3:
        return f"Conv weight has rank {len(shape)} (expected [C_out, C_in/group, k...])"
    if any(d <= 0 for d in shape):
        return f"weight is empty (shape {list(shape)})"
    if _EXTERNAL_BASE and not _EXTERNAL_BASE[-1][1] and proto.data_location == onnx.TensorProto.EXTERNAL:
        return None  # read and checked by the caller (streaming)
    try:
        w = consts.array(weight)
    except (ValueError, KeyError, TypeError) as err:
        return f"weight cannot be read ({' '.join(str(err).split())[:120]})"
    if w.shape != shape:
        return f"weight data has {w.size} values for shape {list(shape)}"
    finite = np.isfinite(w)
    if not finite.all():
        return nonfinite_reason(int(w.size - finite.sum()))
    return None


def nonfinite_reason(n: int) -> str:
    """Why a weight with ``n`` NaN / Inf values is left as it is."""
    return f"weight has {n} NaN/Inf value(s): left as it is (the model's outputs are probably not finite either)"


def _bias_problem(consts: "ConstantTensors", node: onnx.NodeProto) -> Optional[str]:
    """Why a Conv's constant bias does not fit its weight (the passes read one value per channel)."""
    if node.op_type != "Conv" or len(node.input) < 3 or not node.input[2] or node.input[2] not in consts:
        return None
    bias, weight = consts.proto(node.input[2]), consts.proto(node.input[1])
    if list(bias.dims) != [weight.dims[0]]:
        return f"bias has shape {list(bias.dims)}, not [{weight.dims[0]}] (one value per output channel)"
    return None


def _conv_attribute_problem(node: onnx.NodeProto, weight: onnx.TensorProto) -> Optional[str]:
    """Why a Conv's attributes do not fit its weight (the passes rebuild the node from them)."""
    if node.op_type != "Conv":
        return None
    spatial = len(weight.dims) - 2
    attrs = {a.name: a for a in node.attribute}
    expected = {"strides": spatial, "dilations": spatial, "pads": 2 * spatial, "kernel_shape": spatial}
    for name, n in expected.items():
        if name not in attrs:
            continue
        a = attrs[name]
        if a.type != onnx.AttributeProto.INTS or len(a.ints) != n:
            return f"attribute {name} has {len(a.ints)} integer value(s); {n} expected for {spatial} spatial dims"
        low = 0 if name == "pads" else 1
        if any(v < low for v in a.ints):
            return f"attribute {name} has a value below {low}: {list(a.ints)}"
    if "kernel_shape" in attrs and list(attrs["kernel_shape"].ints) != list(weight.dims[2:]):
        return f"kernel_shape {list(attrs['kernel_shape'].ints)} differs from the weight's {list(weight.dims[2:])}"
    if "group" in attrs and (attrs["group"].type != onnx.AttributeProto.INT or attrs["group"].i < 1):
        return "attribute group is not a positive integer"
    return None
