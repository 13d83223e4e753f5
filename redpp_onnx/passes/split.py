"""Step 3: input-wise splitting (METHOD.md step 3): Conv -> ``ai.redpp::SplitConv``.

For every eligible Conv (group 1, 1-D or 2-D, constant float32 weight): per input channel, the
non-zero kernels are deduplicated (``ops.packing.pack``); the Conv is replaced by a SplitConv that
computes each unique product once. A BatchNormalization that directly follows is folded into
SplitConv's post-summation affine (``scale = γ/√(var+ε)``, ``shift = β − mean·scale``: exact, and
it does not break the sharing), and a following Relu or Clip (constant bounds) into its
activation, when the tensors in between have no other consumer and are not graph outputs.

Which layers are rewritten (``mode``): ``all`` every eligible one (maximum pruning, as the paper
counts it); ``none`` none (the report still counts what splitting would remove); ``auto`` only
those predicted to be at least as fast as onnxruntime's Conv (``split_cost.py``), or, with
``tune``, measured so at conversion time. Every decision and its reason is in the report.

``portable``: instead of SplitConv, the same computation with standard ONNX ops (see
:func:`_emit_portable`), for runtimes without our library. Its selection matrix is dense once the
session has built it, so a layer is emitted in that form only where it stores and computes no
more than the dense Conv (:func:`portable_cost`, :meth:`PortableCost.refusal`); the report rows
of portable layers count what the emitted graph really stores and computes.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..analysis.layers import ConstantTensors, node_names, scan_layers, static_shapes
from ..ops import onnx_schema, packing
from . import split_cost
from .relax import relax_kernels


@dataclasses.dataclass(frozen=True)
class SplitConfig:
    mode: str = "auto"         # auto | all | none
    portable: bool = False     # standard ONNX ops instead of SplitConv
    tune: bool = False         # auto: measure each layer instead of predicting
    fuse: bool = True          # fold a following BatchNormalization / Relu / Clip
    tolerance: float = 0.0     # relaxed split: budget on ‖W'−W‖/‖W‖ per layer (0 = exact)

    def __post_init__(self):
        from ..errors import RedppError

        if self.mode not in ("auto", "all", "none"):
            raise RedppError(f"--split must be auto, all or none, got {self.mode!r}")
        if not (0 <= self.tolerance < 1):
            raise RedppError(f"--split-tolerance must be in [0, 1), got {self.tolerance!r}")


@dataclasses.dataclass
class LayerSplit:
    """What splitting did (or would do) to one Conv layer."""

    name: str
    weight: str
    shape: tuple
    params_before: int               # float weights of the dense kernel
    params_after: int                # float weights of the unique kernels
    kernels_total: int               # C_in * C_out
    kernels_unique: int              # K = sum_c k_c
    kernels_zero: int                # idx == -1
    index_bytes: int                 # idx (int8/16/32) + offsets (int64)
    macs_dense: Optional[int]        # C_out*C_in*kh*kw*H'W'
    products: Optional[int]          # sum_c k_c*kh*kw*H'W' multiply-adds
    additions: Optional[int]         # nnz(idx)*H'W'
    predicted_ratio: Optional[float] = None   # SplitConv / Conv time (cost model or measured)
    relaxed_error: float = 0.0       # relaxed split: ‖W'−W‖/‖W‖ reached (0: exact)
    decision: str = "kept"           # split | kept
    fused: list = dataclasses.field(default_factory=list)
    reasons: list = dataclasses.field(default_factory=list)
    portable: Optional[dict] = None  # --portable: PortableCost of the standard-op form (as a dict)

    @property
    def params_removed(self) -> int:
        return self.params_before - self.params_after


@dataclasses.dataclass
class SplitPassResult:
    model: onnx.ModelProto
    layers: list                     # LayerSplit per eligible Conv
    refused: list                    # Refusal per Conv that is not eligible


def _attr(node, name, default=None):
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def _explicit_pads(node, x_shape, kernel_shape, strides, dilations) -> Optional[list]:
    """Conv's pads, resolving auto_pad (needs the static input shape); None if impossible."""
    auto_pad = _attr(node, "auto_pad", b"NOTSET")
    auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad
    nd = len(kernel_shape)
    if auto_pad in ("NOTSET", ""):
        return list(_attr(node, "pads", [0] * (2 * nd)))
    if auto_pad == "VALID":
        return [0] * (2 * nd)
    if x_shape is None:
        return None
    begins, ends = [], []
    for a in range(nd):
        size = x_shape[2 + a]
        out = -(-size // strides[a])
        total = max(0, (out - 1) * strides[a] + dilations[a] * (kernel_shape[a] - 1) + 1 - size)
        small, big = total // 2, total - total // 2
        begins.append(small if auto_pad == "SAME_UPPER" else big)
        ends.append(big if auto_pad == "SAME_UPPER" else small)
    return begins + ends


class SplitPass:
    """``SplitPass(config).run(model)`` -> :class:`SplitPassResult` (a new model; input untouched)."""

    def __init__(self, config: SplitConfig = SplitConfig(), *,
                 progress: Optional[Callable[[int, int, str], None]] = None):
        self.config = config
        self.progress = progress

    def run(self, model: onnx.ModelProto) -> SplitPassResult:
        scan = scan_layers(model)
        shapes = static_shapes(model)
        out = onnx.ModelProto()
        out.CopyFrom(model)
        consts = ConstantTensors(out)
        names = node_names(out)
        index_of = {names[i]: i for i in range(len(out.graph.node))}
        consumers = _consumers(out)
        graph_outputs = {o.name for o in out.graph.output}
        conv_layers = [l for l in scan.layers if l.op_type == "Conv"]
        rows, plans = [], []
        for k, layer in enumerate(conv_layers):
            if self.progress:
                self.progress(k, len(conv_layers), layer.node)
            node = out.graph.node[index_of[layer.node]]
            w = consts.floats(layer.weight)
            row, plan = self._plan(layer, node, w, shapes, consts, consumers, graph_outputs, out)
            rows.append(row)
            if plan is not None:
                plans.append(plan)
        if self.progress:
            self.progress(len(conv_layers), len(conv_layers), "")
        if plans:
            _apply(out, plans, portable=self.config.portable)
        for layer in scan.layers:
            if layer.op_type in ("Gemm", "MatMul"):
                rows.append(_count_dense(layer, consts.array(layer.weight)))
        return SplitPassResult(out, rows, list(scan.refused))

    def _plan(self, layer, node, w, shapes, consts, consumers, graph_outputs, model):
        dtype = consts.proto(layer.weight).data_type
        relaxed = relax_kernels(w, self.config.tolerance)
        w = relaxed.weight
        split = packing.pack(w)
        c_out, c_in = w.shape[:2]
        kshape = tuple(w.shape[2:])
        taps = int(np.prod(kshape))
        x_shape = shapes.get(node.input[0])
        y_shape = shapes.get(node.output[0])
        pixels = int(np.prod(y_shape[2:])) if y_shape else None
        nnz = int(np.sum(split.idx >= 0))
        row = LayerSplit(
            layer.node, layer.weight, tuple(w.shape), int(w.size), int(split.kernels.size),
            c_in * c_out, int(split.kernels.shape[0]), c_in * c_out - nnz,
            int(split.idx.nbytes + split.offsets.nbytes),
            int(w.size) * pixels if pixels else None,
            int(split.kernels.shape[0]) * taps * pixels if pixels else None,
            nnz * pixels if pixels else None)
        row.relaxed_error = relaxed.rel_error
        cost = None
        if self.config.portable and self.config.mode != "none" and len(kshape) in (1, 2):
            # What the standard-op form stores and computes replaces the SplitConv counts.
            cost = portable_cost(split, pixels)
            row.portable = dataclasses.asdict(cost)
            row.params_after = cost.stored_floats
            row.index_bytes = cost.index_bytes
            row.products = cost.macs
            row.additions = 0 if cost.macs is not None else None  # the selection Conv's MACs add
        if len(kshape) not in (1, 2):
            row.reasons.append(f"{len(kshape)}-D convolution: SplitConv handles 1-D and 2-D")
            return row, None
        if dtype != onnx.TensorProto.FLOAT:
            row.reasons.append(f"{onnx.TensorProto.DataType.Name(dtype)} weights: SplitConv computes in float32")
            return row, None
        if len(node.input) > 2 and node.input[2] and node.input[2] not in consts:
            row.reasons.append(f"kept as Conv: its bias {node.input[2]} is computed, not a constant")
            return row, None
        nd = len(kshape)
        strides = list(_attr(node, "strides", [1] * nd))
        dilations = list(_attr(node, "dilations", [1] * nd))
        pads = _explicit_pads(node, x_shape, kshape, strides, dilations)
        if pads is None:
            row.reasons.append("auto_pad SAME needs a static input shape to resolve the pads")
            return row, None
        mode = self.config.mode
        if mode == "none":
            row.reasons.append("--split none: counted, not rewritten")
            return row, None
        if mode == "auto":
            if self.config.tune:
                ratio = split_cost.measure_ratio(split, w, x_shape, strides, pads, dilations)
                source = "measured"
            else:
                ratio = split_cost.predict_ratio(split, kshape, pixels)
                source = "predicted"
            row.predicted_ratio = ratio
            if ratio is None or ratio > split_cost.SPLIT_IF_RATIO_AT_MOST:
                row.reasons.append(
                    f"kept as Conv: SplitConv {source} {ratio:.2f}x the time of onnxruntime's Conv "
                    f"({row.kernels_unique} of {row.kernels_total} kernels unique, {row.kernels_zero} zero)"
                    if ratio is not None else "kept as Conv: no timing for this shape")
                return row, None
        if cost is not None:
            refusal = cost.refusal(_default_opset(model))
            if refusal:
                row.reasons.append(refusal)
                return row, None
        fusion = _fusion(node, consumers, graph_outputs, consts, model, c_out) if self.config.fuse else _Fusion()
        if cost is not None:
            row.reasons.append(cost.describe())
        row.decision = "split"
        row.fused = fusion.describe()
        bias = consts.array(node.input[2]) if len(node.input) > 2 and node.input[2] else None
        return row, _Plan(node, split, bias, strides, pads, dilations, fusion, layer.weight)


def _count_dense(layer, w: np.ndarray) -> LayerSplit:
    """What splitting a Gemm/MatMul would prune (counted, not emitted: on a CPU the additions stay
    and a gain is unlikely, METHOD.md step 3). Its "kernels" are scalars: per input feature, the
    distinct non-zero weights over the outputs."""
    wt = w.T if (layer.op_type == "Gemm" and layer.trans_b) else w   # [in, out]
    n_in, n_out = wt.shape
    kept = zero = 0
    for row in wt:
        nz = row[row != 0]
        zero += n_out - nz.size
        kept += np.unique(nz).size
    return LayerSplit(layer.node, layer.weight, tuple(w.shape), int(w.size), kept, int(w.size), kept, zero,
                      0, layer.macs, kept, (int(w.size) - zero), decision="counted",
                      reasons=["Gemm/MatMul: split counted, not emitted (additions remain: no CPU gain)"])


@dataclasses.dataclass
class _Fusion:
    bn: Optional[onnx.NodeProto] = None
    scale: Optional[np.ndarray] = None
    shift: Optional[np.ndarray] = None
    act: Optional[onnx.NodeProto] = None
    activation: str = ""
    clip: tuple = (None, None)
    output: Optional[str] = None      # the tensor the SplitConv now produces

    def describe(self) -> list:
        return [n.op_type for n in (self.bn, self.act) if n is not None]


@dataclasses.dataclass
class _Plan:
    node: onnx.NodeProto
    split: packing.SplitWeights
    bias: Optional[np.ndarray]
    strides: list
    pads: list
    dilations: list
    fusion: _Fusion
    weight: str


def _consumers(model) -> dict:
    users = {}
    for node in model.graph.node:
        for name in node.input:
            users.setdefault(name, []).append(node)
    return users


def _sole_consumer(name, consumers, graph_outputs):
    users = consumers.get(name, [])
    if len(users) != 1 or name in graph_outputs:
        return None
    return users[0]


def _fusion(node, consumers, graph_outputs, consts, model, c_out: int) -> _Fusion:
    """The BatchNormalization and activation that can be folded after ``node`` (exactly)."""
    f = _Fusion(output=node.output[0])
    nxt = _sole_consumer(node.output[0], consumers, graph_outputs)
    if (nxt is not None and nxt.op_type == "BatchNormalization" and len(nxt.output) == 1
            and all(name in consts for name in nxt.input[1:5]) and nxt.input[0] == node.output[0]
            and not _attr(nxt, "training_mode", 0) and _attr(nxt, "spatial", 1)
            and all(consts.array(n).shape == (c_out,) for n in nxt.input[1:5])):
        gamma, beta, mean, var = (consts.array(n).astype(np.float64) for n in nxt.input[1:5])
        eps = float(_attr(nxt, "epsilon", 1e-5))
        scale = gamma / np.sqrt(var + eps)
        f.bn, f.scale, f.shift = nxt, scale.astype(np.float32), (beta - mean * scale).astype(np.float32)
        f.output = nxt.output[0]
        nxt = _sole_consumer(nxt.output[0], consumers, graph_outputs)
    if nxt is not None and nxt.input and nxt.input[0] == f.output:
        if nxt.op_type == "Relu":
            f.act, f.activation, f.output = nxt, "Relu", nxt.output[0]
        elif nxt.op_type == "Clip" and len(nxt.input) == 1:  # Clip-6 (opset < 11): bounds are attributes
            lo, hi = _attr(nxt, "min"), _attr(nxt, "max")
            f.act, f.activation, f.output = nxt, "Clip", nxt.output[0]
            f.clip = (None if lo is None else float(lo), None if hi is None else float(hi))
        elif nxt.op_type == "Clip":
            lo = consts.array(nxt.input[1]) if len(nxt.input) > 1 and nxt.input[1] in consts else None
            hi = consts.array(nxt.input[2]) if len(nxt.input) > 2 and nxt.input[2] in consts else None
            complete = all(i == "" or i in consts for i in nxt.input[1:])
            if complete and (lo is None or lo.size == 1) and (hi is None or hi.size == 1):
                f.act, f.activation, f.output = nxt, "Clip", nxt.output[0]
                f.clip = (None if lo is None else float(lo), None if hi is None else float(hi))
    return f


def _apply(model: onnx.ModelProto, plans: list, portable: bool) -> None:
    graph = model.graph
    removed = set()
    new_nodes = {}
    for p in plans:
        base = p.weight
        inits = {"kernels": p.split.kernels, "offsets": p.split.offsets, "idx": p.split.idx}
        if portable:
            nodes, tensors = _emit_portable(p, base, _default_opset(model))
        else:
            tensors = [numpy_helper.from_array(v, f"{base}__split_{k}") for k, v in inits.items()]
            inputs = ["", "", "", "", "", "", ""]
            inputs[0] = p.node.input[0]
            inputs[1:4] = [t.name for t in tensors]
            if p.bias is not None:
                inputs[4] = p.node.input[2]
            if p.fusion.scale is not None:
                tensors += [numpy_helper.from_array(p.fusion.scale, f"{base}__split_scale"),
                            numpy_helper.from_array(p.fusion.shift, f"{base}__split_shift")]
                inputs[5], inputs[6] = tensors[-2].name, tensors[-1].name
            while inputs[-1] == "":
                inputs.pop()
            lo, hi = p.fusion.clip
            nodes = [onnx_schema.make_node(inputs, [p.fusion.output], name=(p.node.name or base) + "__split",
                                           strides=p.strides, pads=p.pads, dilations=p.dilations,
                                           activation=p.fusion.activation, clip_min=lo, clip_max=hi)]
        graph.initializer.extend(tensors)
        new_nodes[id(p.node)] = nodes
        for n in (p.fusion.bn, p.fusion.act):
            if n is not None:
                removed.add(id(n))
    kept = []
    for node in graph.node:
        if id(node) in new_nodes:
            kept.extend(new_nodes[id(node)])
        elif id(node) not in removed:
            kept.append(node)
    del graph.node[:]
    graph.node.extend(kept)
    _drop_unused_initializers(model)
    if not portable and not any(o.domain == onnx_schema.schema.DOMAIN for o in model.opset_import):
        model.opset_import.append(onnx_schema.opset_import())


def _drop_unused_initializers(model: onnx.ModelProto) -> None:
    """Remove initializers nothing uses any more (and their entries in old-style graph inputs)."""
    used = {name for node in model.graph.node for name in node.input} | {o.name for o in model.graph.output}
    dropped = {t.name for t in model.graph.initializer if t.name not in used}
    keep = [t for t in model.graph.initializer if t.name not in dropped]
    del model.graph.initializer[:]
    model.graph.initializer.extend(keep)
    inputs = [i for i in model.graph.input if i.name not in dropped]
    del model.graph.input[:]
    model.graph.input.extend(inputs)


def _default_opset(model: onnx.ModelProto) -> Optional[int]:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)


PORTABLE_MIN_OPSET = 9
"""The portable form's newest op is OneHot (opset 9); Clip takes its bounds as inputs from 11 on."""


def _portable_layout(split: packing.SplitWeights):
    """``k`` (unique kernels per input channel, zero-padded to the largest ``k_c``, at least 1)
    and the selection index ``sel[o, c] = idx[c, o]``, or ``k`` for a zero kernel (OneHot maps an
    index outside ``[-k, k-1]`` to a row of zeros), in the narrowest integer type that holds ``k``."""
    k = max(int(split.kernels_per_channel.max()) if split.kernels_per_channel.size else 0, 1)
    dtype = np.int8 if k <= np.iinfo(np.int8).max else np.int16 if k <= np.iinfo(np.int16).max else np.int32
    idx = split.idx.T.astype(np.int64)
    return k, np.where(idx < 0, k, idx).astype(dtype)


@dataclasses.dataclass(frozen=True)
class PortableCost:
    """What the standard-op form of one layer (:func:`_emit_portable`) stores and computes.

    ``k`` unique kernels per input channel (zero-padded to the largest ``k_c``): the grouped Conv
    holds ``kernel_floats = C_in·k·taps`` weights and computes ``macs_grouped = kernel_floats·H'W'``;
    the selection matrix, built when the session starts, holds ``selection_floats = C_out·C_in·k``
    floats (``selection_bytes``; the file stores only its index, ``index_bytes``) and the 1x1
    selection Conv computes ``macs_selection = selection_floats·H'W'``. ``dense_floats`` and
    ``macs_dense`` are the Conv it replaces. MACs are None when the output size is not static.
    """

    k: int
    kernel_floats: int
    selection_floats: int
    selection_bytes: int
    index_bytes: int
    dense_floats: int
    macs_grouped: Optional[int]
    macs_selection: Optional[int]
    macs_dense: Optional[int]

    @property
    def stored_floats(self) -> int:
        return self.kernel_floats + self.selection_floats

    @property
    def macs(self) -> Optional[int]:
        return None if self.macs_grouped is None else self.macs_grouped + self.macs_selection

    def refusal(self, opset: Optional[int]) -> str:
        """Why this layer stays a Conv under ``--portable`` ('' when it is emitted). The rule:

        * the model's opset must be >= 9 (OneHot builds the selection matrix);
        * stored floats, the grouped kernels plus the selection matrix as materialised when the
          session starts, must not exceed the dense Conv's weights: ``C_in·k·taps + C_out·C_in·k
          <= C_out·C_in·taps``;
        * MACs of the emitted pair must not exceed the dense Conv's: ``(C_in·k·taps +
          C_out·C_in·k)·H'W' <= C_out·C_in·taps·H'W'`` (the same inequality when ``H'W'`` is
          known: both Convs produce ``H'W'`` pixels).

        So a layer is emitted only where ``k·(taps + C_out) <= C_out·taps``: never for 1x1
        kernels, and for 3x3 only with at most 8 unique kernels per input channel.
        """
        if opset is not None and opset < PORTABLE_MIN_OPSET:
            return (f"kept as Conv: --portable needs opset >= {PORTABLE_MIN_OPSET} (OneHot builds the selection "
                    f"matrix) and this model imports opset {opset}")
        why = []
        if self.stored_floats > self.dense_floats:
            why.append(f"store {self.stored_floats:,} floats (grouped kernels {self.kernel_floats:,}, k = {self.k} "
                       f"per input channel, + selection matrix {self.selection_floats:,} = "
                       f"{self.selection_bytes:,} bytes built at session start) > {self.dense_floats:,} dense weights")
        if self.macs is not None and self.macs_dense is not None and self.macs > self.macs_dense:
            why.append(f"compute {self.macs:,} MACs (grouped Conv {self.macs_grouped:,} + selection Conv "
                       f"{self.macs_selection:,}) > {self.macs_dense:,} of the dense Conv")
        return "kept as Conv: --portable would " + " and ".join(why) if why else ""

    def describe(self) -> str:
        macs = (f"; computes {self.macs:,} MACs (grouped Conv {self.macs_grouped:,} + selection Conv "
                f"{self.macs_selection:,}) vs {self.macs_dense:,} dense" if self.macs is not None else "")
        return (f"portable: stores {self.stored_floats:,} floats (grouped kernels {self.kernel_floats:,}, k = {self.k} "
                f"per input channel, + selection matrix {self.selection_floats:,} = {self.selection_bytes:,} bytes "
                f"built at session start from a {self.index_bytes:,}-byte index) vs {self.dense_floats:,} dense "
                f"weights{macs}")


def portable_cost(split: packing.SplitWeights, pixels: Optional[int]) -> PortableCost:
    """The :class:`PortableCost` of ``split`` with ``pixels`` output pixels per image (None: unknown)."""
    c_in, c_out = split.idx.shape
    taps = int(np.prod(split.kernels.shape[1:]))
    k, sel = _portable_layout(split)
    kernel_floats, selection_floats = c_in * k * taps, c_out * c_in * k
    nd = split.kernels.ndim - 1
    index_bytes = int(sel.nbytes) + 8 + 2 * 4 + 8 * (2 + nd) + 4 * c_out  # index, depth, values, shape, scale
    return PortableCost(
        k, kernel_floats, selection_floats, 4 * selection_floats, index_bytes, c_out * c_in * taps,
        kernel_floats * pixels if pixels else None, selection_floats * pixels if pixels else None,
        c_out * c_in * taps * pixels if pixels else None)


def _emit_portable(p: _Plan, base: str, opset: Optional[int]):
    """SplitConv's computation with standard ops (opset >= 9):

        P = Conv(X, U, group=C_in)    U[c*k + u] = U_c[u] (zero-padded to k = max k_c kernels)
        Y = act(Conv(P, S, B'))       S[o, c*k + idx[c,o]] = scale[o], B' = scale*B + shift

    S is built when the session starts, ``OneHot(sel, k) * scale`` reshaped to a 1x1 kernel, with
    ``sel[o, c] = idx[c, o]`` (``k`` for a zero kernel: a row of zeros), so the file stores the
    kernels and a small integer index, not the dense matrix; onnxruntime folds it into a constant
    of ``C_out·C_in·k`` floats (:class:`PortableCost`). Each unique product is computed once (the
    grouped Conv); the 1x1 Conv does the selection and the sum.
    """
    split, node, fusion = p.split, p.node, p.fusion
    c_in, c_out = split.idx.shape
    kshape = split.kernels.shape[1:]
    k, sel = _portable_layout(split)
    padded = np.zeros((c_in * k, 1) + kshape, np.float32)
    for c in range(c_in):
        lo, hi = int(split.offsets[c]), int(split.offsets[c + 1])
        padded[c * k:c * k + hi - lo, 0] = split.kernels[lo:hi]
    scale = fusion.scale if fusion.scale is not None else np.ones(c_out, np.float32)
    bias = np.zeros(c_out, np.float32) if p.bias is None else p.bias.astype(np.float32)
    bias = (scale * bias + (fusion.shift if fusion.shift is not None else 0)).astype(np.float32)
    n = f"{base}__portable"
    nd = len(kshape)
    tensors = [numpy_helper.from_array(padded, f"{n}_kernels"),
               numpy_helper.from_array(sel, f"{n}_index"),
               numpy_helper.from_array(np.array([k], np.int64), f"{n}_depth"),
               numpy_helper.from_array(np.array([0, 1], np.float32), f"{n}_onoff"),
               numpy_helper.from_array(scale.astype(np.float32).reshape(c_out, 1, 1), f"{n}_scale"),
               numpy_helper.from_array(np.array([c_out, c_in * k] + [1] * nd, np.int64), f"{n}_wshape"),
               numpy_helper.from_array(bias, f"{n}_bias")]
    conv_out = f"{n}_sum" if fusion.activation else fusion.output
    nodes = [
        helper.make_node("Conv", [node.input[0], f"{n}_kernels"], [f"{n}_products"], name=f"{n}_products",
                         group=c_in, strides=p.strides, pads=p.pads, dilations=p.dilations),
        helper.make_node("Cast", [f"{n}_index"], [f"{n}_index64"], to=onnx.TensorProto.INT64),
        helper.make_node("OneHot", [f"{n}_index64", f"{n}_depth", f"{n}_onoff"], [f"{n}_onehot"], axis=-1),
        helper.make_node("Mul", [f"{n}_onehot", f"{n}_scale"], [f"{n}_select3d"]),
        helper.make_node("Reshape", [f"{n}_select3d", f"{n}_wshape"], [f"{n}_select"]),
        helper.make_node("Conv", [f"{n}_products", f"{n}_select", f"{n}_bias"], [conv_out], name=f"{n}_sum"),
    ]
    if fusion.activation == "Relu":
        nodes.append(helper.make_node("Relu", [conv_out], [fusion.output]))
    elif fusion.activation == "Clip" and opset is not None and opset < 11:  # Clip-6: bounds as attributes
        lo, hi = fusion.clip
        bounds = {key: v for key, v in (("min", lo), ("max", hi)) if v is not None}
        nodes.append(helper.make_node("Clip", [conv_out], [fusion.output], **bounds))
    elif fusion.activation == "Clip":
        lo, hi = fusion.clip
        clip_inputs = [conv_out]
        for bound, suffix in ((lo, "lo"), (hi, "hi")):
            if bound is None:
                clip_inputs.append("")
            else:
                tensors.append(numpy_helper.from_array(np.array(bound, np.float32), f"{n}_{suffix}"))
                clip_inputs.append(tensors[-1].name)
        while clip_inputs[-1] == "":
            clip_inputs.pop()
        nodes.append(helper.make_node("Clip", clip_inputs, [fusion.output]))
    return nodes, tensors
