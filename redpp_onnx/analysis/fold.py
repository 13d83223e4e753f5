"""Constant folding for the analyses: weights computed from constants become plain constants.

A ``--codebook`` model rebuilds its weights with standard ops from stored codes (onnxruntime
folds them when the session starts); so may other exporters' models (a weight-norm ``Div``, a
``DequantizeLinear`` of int8 weights). The analyses read weights as constants, so they first
fold such computations, with onnxruntime itself (graph optimizations off: the kernels that fold
them at session start, nothing else rewritten), on a copy. The model given is never changed.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .layers import constant_only_nodes, iter_nodes_deep, np_dtype

def fold_constants(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with its main graph's constant-only nodes replaced by initializers of their
    values (the same object when there is nothing to fold; a copy otherwise). Tensors whose type
    shape inference cannot tell are left computed."""
    graph = model.graph
    gone = set(constant_only_nodes(graph))
    if not gone:
        return model
    folded = [graph.node[k] for k in sorted(gone)]
    used_elsewhere = {i for k, n in enumerate(graph.node) if k not in gone for i in n.input}
    used_elsewhere |= {o.name for o in graph.output}
    needed = [o for n in folded for o in n.output if o in used_elsewhere]
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except (onnx.shape_inference.InferenceError, ValueError) as err:
        from ..errors import RedppError

        raise RedppError(f"onnx shape inference fails on the input model: {' '.join(str(err).split())[:300]}") \
            from None
    types = {vi.name: vi.type for vi in inferred.graph.value_info}
    needed = [o for o in needed if o in types and types[o].HasField("tensor_type")]
    if not needed:
        return model
    inputs = {i for n in folded for i in n.input}
    sub = helper.make_graph([n for n in graph.node if n.op_type == "Constant" and n.output[0] in inputs] + folded,
                            "constants", [],
                            [helper.make_tensor_value_info(o, types[o].tensor_type.elem_type, None) for o in needed],
                            [t for t in graph.initializer if t.name in inputs])
    sub_model = helper.make_model(sub, opset_imports=list(model.opset_import), ir_version=min(model.ir_version, 10))
    import onnxruntime as ort

    from ..runtime import session

    try:
        values = session(sub_model, graph_optimization_level=ort.GraphOptimizationLevel.ORT_DISABLE_ALL).run(needed, {})
    except Exception:  # noqa: BLE001 - folding only helps the analyses read weights; without it they say why
        return model
    out = onnx.ModelProto()
    out.CopyFrom(model)
    keep = [n for k, n in enumerate(out.graph.node) if k not in gone]
    del out.graph.node[:]
    out.graph.node.extend(keep)
    out.graph.initializer.extend(numpy_helper.from_array(np.asarray(v), name) for name, v in zip(needed, values))
    # initializers only the folded nodes used are dropped
    used = {i for n in out.graph.node for i in n.input} | {o.name for o in out.graph.output}
    kept = [t for t in out.graph.initializer if t.name in used]
    del out.graph.initializer[:]
    out.graph.initializer.extend(kept)
    return out


def resolve_constant_identities(model: onnx.ModelProto) -> tuple:
    """``(model', n)``: ``model`` without its main graph's ``n`` Identity nodes that only rename a
    constant (exporters write them when they deduplicate equal initializers); their consumers,
    in subgraphs too, read the constant directly. ``model'`` is ``model`` itself when ``n == 0``,
    else a copy. An Identity that produces a graph output stays."""
    graph = model.graph
    constant = {t.name for t in graph.initializer}
    constant |= {o for n in graph.node if n.op_type == "Constant" for o in n.output}
    outputs = {o.name for o in graph.output}
    alias = {}
    for node in graph.node:
        if (node.op_type == "Identity" and node.domain in ("", "ai.onnx") and len(node.input) == 1
                and node.output[0] not in outputs):
            source = alias.get(node.input[0], node.input[0])
            if source in constant:
                alias[node.output[0]] = source
    if not alias:
        return model, 0
    out = onnx.ModelProto()
    out.CopyFrom(model)
    keep = [n for n in out.graph.node if not (n.op_type == "Identity" and n.output and n.output[0] in alias)]
    del out.graph.node[:]
    out.graph.node.extend(keep)
    _rename_inputs(out.graph, alias)
    return out, len(alias)


def _rename_inputs(graph: onnx.GraphProto, alias: dict) -> None:
    for node in graph.node:
        for k, name in enumerate(node.input):
            if name in alias:
                node.input[k] = alias[name]
        for a in node.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                _rename_inputs(a.g, alias)
            elif a.type == onnx.AttributeProto.GRAPHS:
                for g in a.graphs:
                    _rename_inputs(g, alias)


HALF_TYPES = (onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16)


def fold_constant_casts(model: onnx.ModelProto) -> tuple:
    """``(model', folded)``: every ``Cast(to=FLOAT)`` of a float16 / bfloat16 initializer in the main
    graph (the "float16 weights, float32 compute" export) replaced by a float32 initializer of the
    Cast's output name holding the widened values (exact), so that the passes see the weights the
    model computes with; the half initializer goes when nothing else reads it. ``folded`` maps each
    new name to the original element type, for :func:`restore_constant_casts`. ``model'`` is
    ``model`` itself when nothing was folded."""
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    outputs = {o.name for o in graph.output}
    gone = [k for k, n in enumerate(graph.node)
            if n.op_type == "Cast" and n.domain in ("", "ai.onnx") and len(n.input) == 1 and n.input[0] in inits
            and inits[n.input[0]].data_type in HALF_TYPES and n.output[0] not in outputs
            and any(a.name == "to" and a.i == onnx.TensorProto.FLOAT for a in n.attribute)
            and inits[n.input[0]].data_location != onnx.TensorProto.EXTERNAL]
    if not gone:
        return model, {}
    out = onnx.ModelProto()
    out.CopyFrom(model)
    g = out.graph
    inits = {t.name: t for t in g.initializer}
    casts = [g.node[k] for k in gone]
    sources = {c.input[0] for c in casts}
    gone = set(gone)
    folded = {}
    for n in casts:
        src = inits[n.input[0]]
        folded[n.output[0]] = src.data_type
        g.initializer.append(numpy_helper.from_array(numpy_helper.to_array(src).astype(np.float32), n.output[0]))
    keep = [n for k, n in enumerate(g.node) if k not in gone]
    del g.node[:]
    g.node.extend(keep)
    read = {x for n in iter_nodes_deep(g) for x in n.input} | {o.name for o in g.output}
    kept = [t for t in g.initializer if t.name not in sources or t.name in read]
    del g.initializer[:]
    g.initializer.extend(kept)
    return out, folded


def restore_constant_casts(model: onnx.ModelProto, folded: dict) -> tuple:
    """``(model', n)``: each name of ``folded`` that is still a plain float32 initializer (not stored
    as a codebook) goes back to its half type behind a ``Cast(to=FLOAT)``, as the input had it (the
    values rounded to that type); ``model`` is changed in place."""
    if not folded:
        return model, 0
    g = model.graph
    casts, n = [], 0
    for t in g.initializer:
        if t.name in folded and t.data_type == onnx.TensorProto.FLOAT:
            name = t.name
            t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t).astype(np_dtype(folded[name])), name + "__half"))
            casts.append(helper.make_node("Cast", [name + "__half"], [name], to=onnx.TensorProto.FLOAT))
            n += 1
    if casts:
        nodes = casts + list(g.node)
        del g.node[:]
        g.node.extend(nodes)
    return model, n
