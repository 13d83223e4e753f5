"""Relaxed merging that prunes (METHOD.md Step 2, revised): fewer channels, data-free.

For every channel group of :mod:`redpp_onnx.analysis.coupling` whose consumers are Conv / Gemm /
MatMul: a producer's channels (the inner channels of residual blocks, expansion channels...), and
with ``coupled`` the channels shared by several producers (residual Adds: a channel goes from
every producer of the group at once, pruned, never merged; experimental, off by default):

* **statistics**: the mean ``m_j`` and variance ``v_j`` of what each consumer reads, from the
  moment walk of ``analyze`` (:mod:`redpp_onnx.analysis.theory`: after a BatchNormalization
  ``N(β_j, γ_j²)``, closed forms through Relu / Clip; without BatchNorm, from standardized graph
  inputs through the layers: one statistics engine for ``analyze``, the cost and the compensation);
* **effective neurons**: ``e_j = a_j · W_j`` with ``a_j = γ_j / sqrt(var_j + ε)`` (the producer's row
  with its BatchNorm folded in; ``a_j = 1`` without one); two channels' correlation is estimated as
  ``ρ = cos(e_j, e_k)`` (inputs taken as isotropic);
* **removing** channel ``j`` costs the consumer-output variance it leaves behind,
  ``‖W_{l+1}[:, j]‖² × v_res``: pruned, ``v_res = v_j``; merged into a kept partner ``k`` with a
  scale ``s`` (consumer column ``k += s · column j``), ``v_res = v_j + s² v_k − 2 s ρ sqrt(v_j v_k)``,
  with ``s = ρ sqrt(v_j / v_k)`` when the activation is positively homogeneous (Relu, none) and no
  other per-channel op (a depthwise conv...) lies on the way, ``s = 1`` for the others (Clip...),
  and no merge at all when a depthwise conv is on the way (pruning only). The relative cost is
  that over the consumers' output variance from the whole group, ``Σ_k ‖W_{l+1}[:, k]‖² v_k``;
* **mean compensation**: what is removed still has a mean, ``d = m_j`` (pruned) or ``m_j − s m_k``
  (merged); ``d × Σ_spatial W_{l+1}[o, j]`` goes into each consumer's bias (a Conv without a bias
  gets one). Zero-padded borders of a consumer Conv see less than the full kernel: approximate
  there (said in the notes);
* **which channels**: per layer, cheapest first, partners kept (a channel merged into is never
  removed later). ``alpha`` with the ``per_block`` strategy removes ``α^l`` of each layer's
  channels (first third of the eligible layers ``max(2α − 1, 0)``, middle ``α``, last third
  ``min(2α, 1)``), ``uniform`` α everywhere; ``target_macs = F`` keeps at most ``F`` of the
  eligible MACs by one global order of the relative costs (``order="cost"``) or of the relative
  cost per MAC saved (``order="cost_per_mac"``, the default) of each layer's next chunk. At most
  ``max_share`` of a layer's channels go, and a layer keeps a multiple of ``multiple`` channels
  (8: onnxruntime's Conv runs channel blocks of 8 on AVX2; ResNet-56 with 20 % of its MACs removed
  in arbitrary counts ran 1.07-1.25x SLOWER than the original).

Data-free: no data is read. It changes the function; the result says by how much it predicts
(the relative costs) and the verification measures it.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
import time
from collections import defaultdict
from typing import Dict, List, Optional, Tuple

import numpy as np
import onnx

from ..analysis.coupling import PER_CHANNEL, PRODUCER, TRANSPARENT_UNARY, analyze_coupling
from ..analysis.layers import ConstantTensors, scan_layers
from ..errors import RedppError
from .editors import ChannelEdit, EditContext, apply
from .refit import bias_add

STRATEGIES = ("per_block", "uniform")
MERGE_MARGIN = 0.5
"""A merge is chosen over pruning only when its predicted residual variance is below this share
of the pruned channel's: the correlation of two channels is estimated with isotropic inputs,
which overstates it (measured: merging at equal predicted cost lost more top-1 than pruning)."""
ORDERS = ("cost", "cost_per_mac")
PLANS = ("auto", "cost")


@dataclasses.dataclass(frozen=True)
class ReduceConfig:
    alpha: float = 0.0                 # share of channels removed per layer (with ``strategy``)
    strategy: str = "per_block"
    target_macs: Optional[float] = None  # keep at most this share of the eligible MACs (overrides alpha)
    order: str = "cost_per_mac"        # global order for target_macs
    merge: bool = True                 # scale-matched merging (False: pruning only)
    sensitivity: str = "none"          # weigh each group's cost by its consumer's measured logit
    #                                    sensitivity (rd.sensitivities: "synthetic", "bn"), or not
    compensate: bool = True            # mean compensation into the consumers' biases
    max_share: float = 0.5             # at most this share of a layer's channels removed
    multiple: int = 8                  # kept channel counts are multiples of this (onnxruntime's NCHWc
    #                                    block on AVX2 is 8: other counts make its Conv slower, measured)
    scale: str = "group"               # cost units: "group" (share of the consumers' output variance from
    #                                    the group) or "bn" (variance after the consumers' BatchNorm, a_o²)
    coupled: bool = False              # EXPERIMENTAL: also residual-coupled groups (a channel from every
    #                                    producer at once, pruned); off: not yet shown to help the curve
    refit: bool = True                 # the consumer Convs refitted by least squares on a synthetic twin
    #                                    (passes/refit.py, data-free); False: mean compensation only
    refit_images: Optional[int] = None # synthetic images for the refit (None: refit.images_needed's rule)
    plan: str = "auto"                 # with refit: "auto" = measured on the twin where it applies
    #                                    (passes/twin_plan.py), "cost" = the closed-form cost only

    def __post_init__(self):
        if not 0 <= float(self.alpha) <= 1:
            raise RedppError(f"alpha must be in [0, 1], got {self.alpha!r}")
        if self.strategy not in STRATEGIES:
            raise RedppError(f"strategy must be one of {', '.join(STRATEGIES)}, got {self.strategy!r}")
        if self.target_macs is not None and not 0 < float(self.target_macs) <= 1:
            raise RedppError(f"--target-macs must be in (0, 1], got {self.target_macs!r}")
        if self.sensitivity not in ("synthetic", "bn", "none"):
            raise RedppError(f"sensitivity must be synthetic, bn or none, got {self.sensitivity!r}")
        if not isinstance(self.multiple, int) or self.multiple < 1:
            raise RedppError(f"multiple must be a positive integer, got {self.multiple!r}")
        if self.scale not in ("group", "bn"):
            raise RedppError(f"scale must be group or bn, got {self.scale!r}")
        if self.plan not in PLANS:
            raise RedppError(f"plan must be one of {', '.join(PLANS)}, got {self.plan!r}")
        if self.order not in ORDERS:
            raise RedppError(f"order must be one of {', '.join(ORDERS)}, got {self.order!r}")

    def alpha_for(self, index: int, n_layers: int) -> float:
        from .merge import layer_share

        return layer_share(self.alpha, self.strategy, index, n_layers)


@dataclasses.dataclass
class LayerReduce:
    """One producer layer's channels (a row of the report)."""

    name: str
    channels_before: int
    channels_after: int = 0
    pruned: int = 0
    merged: int = 0
    share: float = 0.0                 # removed / before
    cost: float = 0.0                  # sum of the relative costs of what was removed
    activation: str = ""
    reasons: list = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class ReduceResult:
    model: onnx.ModelProto
    layers: List[LayerReduce]
    macs_before: int
    macs_after: int
    params_before: int
    params_after: int
    predicted_cost: float              # sum over layers of the relative costs removed
    notes: List[str]
    seconds: float = 0.0
    refit: list = dataclasses.field(default_factory=list)  # refit.RefitRow per consumer
    twin_drift: Optional[float] = None  # predicted relative output drift on the synthetic twin (with refit)

    @property
    def macs_removed(self) -> float:
        return 1 - self.macs_after / self.macs_before if self.macs_before else 0.0


# --------------------------------------------------------------------------- per group

@dataclasses.dataclass
class _Group:
    gid: int
    bucket: int
    producer: str                      # producer node name
    layer_index: int                   # its index among the eligible layers
    classes: tuple
    mean: np.ndarray                   # m_j, v_j: what the first consumer reads (for merges)
    var: np.ndarray
    loss: np.ndarray                   # Σ over consumers c of ‖W_c[:, j]‖² v_{c,j}: pruning j leaves this
    rho: Optional[np.ndarray]          # correlation matrix of the effective neurons (None: no merging)
    homogeneous: bool
    macs_per_channel: float
    activation: str
    consumers: list                    # (GroupOp, its channel positions, spatial sums [channels, outputs])
    producers: tuple = ()              # every producer's node name (several: residual-coupled)
    cstats: list = dataclasses.field(default_factory=list)  # per consumer (mean, var) of what it reads

    @property
    def col(self) -> np.ndarray:
        """``Σ_c ‖W_c[:, j]‖² v_{c,j} / v_j`` (the consumers' column energy when they read alike)."""
        v = np.where(self.var > 0, self.var, 1.0)
        return np.where(self.var > 0, self.loss / v, 0.0)


def _bn_stats(consts: ConstantTensors, graph: onnx.GraphProto, op) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    node = graph.node[op.node]
    gamma, beta, mu, var = (consts.array(node.input[k]).astype(np.float64).ravel() for k in (1, 2, 3, 4))
    eps = next((onnx.helper.get_attribute_value(a) for a in node.attribute if a.name == "epsilon"), 1e-5)
    return gamma, beta, gamma / np.sqrt(var + eps)


def _clip_bounds(consts: ConstantTensors, node: onnx.NodeProto) -> Tuple[float, float]:
    lo, hi = -np.inf, np.inf
    for a in node.attribute:
        if a.name == "min":
            lo = float(a.f)
        elif a.name == "max":
            hi = float(a.f)
    if len(node.input) > 1 and node.input[1]:
        lo = float(consts.array(node.input[1]))
    if len(node.input) > 2 and node.input[2]:
        hi = float(consts.array(node.input[2]))
    return lo, hi


def _consumer_sums(consts: ConstantTensors, graph: onnx.GraphProto, op, channels: int,
                   shapes: dict, model: Optional[onnx.ModelProto] = None) -> Optional[np.ndarray]:
    """``[channels, outputs]``: per input channel of the consumer, the sum of its weights over
    the channel's block (kernel window, or ``inner`` features) for every output, each Conv tap
    weighted by the share of output positions at which it reads inside the input (zero padding:
    the mean over positions of what a constant channel adds); None when the consumer's bias
    cannot take a compensation (a MatMul without a constant bias Add after it: ``refit.bias_add``)."""
    from ..hashing.rd import _tap_fractions

    node = graph.node[op.node]
    p = op.params[0]
    w = consts.array(p.name).astype(np.float64)
    if node.op_type == "Conv":
        frac = _tap_fractions(node, shapes.get(node.input[0]), w.shape)
        if frac is not None:
            w = w * frac
    moved = np.moveaxis(w, p.axis, 0)
    blocks = moved.reshape((channels, op.inner) + moved.shape[1:])
    if node.op_type == "Conv":
        # W: (O, I, k...) -> moved (I, O, k...): sum over the block and the kernel
        return blocks.reshape(channels, op.inner, blocks.shape[2], -1).sum(axis=(1, 3))
    if node.op_type == "Gemm":
        alpha = next((a.f for a in node.attribute if a.name == "alpha"), 1.0)
        return alpha * blocks.reshape(channels, op.inner, -1).sum(axis=1)
    if node.op_type == "MatMul" and w.ndim == 2 and model is not None and bias_add(model, op.node, consts) is not None:
        return blocks.reshape(channels, op.inner, -1).sum(axis=1)
    return None


def _activation(consts, graph, group, after: int) -> Tuple[Optional[str], float, float]:
    """The per-element activation the consumers see (ops of the group after node ``after``):
    ``(name, lo, hi)``; name None for others (no scaled merges then)."""
    acts = [op for op in group.ops if op.op_type in TRANSPARENT_UNARY and op.node > after]
    kinds = {op.op_type for op in acts}
    if not kinds or kinds <= {"Identity", "Dropout"}:
        return "none", -np.inf, np.inf
    if kinds == {"Relu"}:
        return "Relu", 0.0, np.inf
    if kinds == {"Clip"} and len(acts) == 1:
        lo, hi = _clip_bounds(consts, graph.node[acts[0].node])
        return f"Clip({lo:g}, {hi:g})", lo, hi
    return None, 0.0, 0.0


def _output_gain(consts, users, node) -> Optional[np.ndarray]:
    """``a_o = γ_o / sqrt(var_o + ε)`` of the BatchNormalization right after ``node``, or None."""
    after = users.get(node.output[0], [])
    if len(after) != 1 or after[0].op_type != "BatchNormalization":
        return None
    bn = after[0]
    gamma, var = consts.array(bn.input[1]).astype(np.float64).ravel(), consts.array(bn.input[4]).astype(np.float64).ravel()
    eps = next((onnx.helper.get_attribute_value(a) for a in bn.attribute if a.name == "epsilon"), 1e-5)
    return np.abs(gamma) / np.sqrt(var + eps)


def _channel_stats(st, n_ch: int, inner: int) -> Optional[Tuple[np.ndarray, np.ndarray]]:
    """Per-channel (mean, var) of a tensor's moment-walk statistics (``inner`` features per channel
    after a Flatten: their mean and mean variance), None when unknown or not fitting."""
    if not hasattr(st, "mean") or st.mean is None or st.var is None:
        return None
    mean, var = np.asarray(st.mean, np.float64).ravel(), np.asarray(st.var, np.float64).ravel()
    if mean.size == n_ch * inner and inner > 1:
        return mean.reshape(n_ch, inner).mean(axis=1), np.maximum(var.reshape(n_ch, inner).mean(axis=1), 0.0)
    if mean.size != n_ch:
        return None
    return mean, np.maximum(var, 0.0)


def _analyse(model, coupling, consts, layer_index, macs_of, allow_coupled: bool = False,
             bn_scale: bool = False) -> Tuple[List[_Group], Dict[str, List[str]]]:
    from ..analysis.layers import static_shapes
    from ..analysis.theory import moment_state

    graph = model.graph
    shapes = static_shapes(model)
    stats = moment_state(model)
    users = defaultdict(list)
    for n in graph.node:
        for x in n.input:
            users[x].append(n)
    groups, reasons = [], defaultdict(list)
    for g in coupling.groups:
        if not g.producers:
            continue
        pname = g.producers[0].name
        for bi, b in enumerate(g.buckets):
            if b.reasons or len(b.classes) < 2:
                if b.reasons:
                    for p in g.producers:
                        reasons[p.name].append(f"blocked: {b.reasons[0]}")
                continue
            consumers = [c for c in g.consumers if c.tensor in b.tensors]
            producers = [p for p in g.producers if p.tensor in b.tensors]
            if not producers:
                continue
            if not consumers or any(graph.node[c.node].op_type not in ("Conv", "Gemm", "MatMul") for c in consumers):
                reasons[pname].append("consumers other than Conv / Gemm / MatMul")
                continue
            coupled = len(producers) > 1 or len(g.buckets) > 1
            if coupled and not allow_coupled:
                for p in producers:
                    reasons[p.name].append(f"channels coupled with {len(producers) - 1} other producer(s) (residual "
                                           "Add, Concat...): not reduced (ReduceConfig.coupled tries them)")
                continue
            # what each consumer reads: the moment walk's statistics of its input (analysis.theory)
            loss = np.zeros(len(b.classes))
            sums, macs, cstats, missing = [], 0.0, [], None
            for c in consumers:
                cpos = coupling.positions(c.tensor)
                cidx = [cpos[k] for k in b.classes]
                n_ch = len(coupling.layout[c.tensor])
                st = _channel_stats(stats.get(c.tensor), n_ch, c.inner)
                if st is None:
                    missing = c.tensor
                    break
                m_c, v_c = st[0][cidx], st[1][cidx]
                p = c.params[0]
                w = np.moveaxis(consts.array(p.name).astype(np.float64), p.axis, 0)
                if bn_scale:
                    gain = _output_gain(consts, users, graph.node[c.node])
                    if gain is not None and w.ndim >= 2 and w.shape[1] == gain.size:
                        w = w * gain.reshape((1, -1) + (1,) * (w.ndim - 2))
                loss += np.sum(w.reshape((n_ch, -1))[cidx] ** 2, axis=1) * v_c
                s = _consumer_sums(consts, graph, c, n_ch, shapes, model)
                sums.append((c, cidx, None if s is None else s[cidx]))
                cstats.append((m_c, v_c))
                macs += macs_of.get(c.name, 0) / max(n_ch, 1)
            if missing is not None:
                why = stats.get(missing)
                reasons[pname].append(f"no channel statistics for {missing!r}" + (f" ({why})" if isinstance(why, str) else ""))
                continue
            for p in producers:
                macs += macs_of.get(p.name, 0) / max(len(coupling.layout[p.tensor]), 1)
            per_channel = [op for op in g.ops if op.role == PER_CHANNEL and op.tensor in b.tensors]
            bns = [op for op in per_channel if op.op_type == "BatchNormalization"]
            others = [op for op in per_channel if op.op_type != "BatchNormalization"]
            last_bn = max((op.node for op in bns), default=producers[0].node)
            name, _, _ = _activation(consts, graph, g, last_bn)
            name = "other" if name is None else name
            rho = None
            if not coupled and len(bns) <= 1 and not others:  # merging: one producer, its BN folded
                prod = producers[0]
                a = np.ones(len(b.classes))
                if bns:
                    bpos = coupling.positions(bns[0].tensor)
                    a = _bn_stats(consts, graph, bns[0])[2][[bpos[c] for c in b.classes]]
                ppos = coupling.positions(prod.tensor)
                n_prod = len(coupling.layout[prod.tensor])
                pw = consts.array(prod.params[0].name).astype(np.float64)
                rows = np.moveaxis(pw, prod.params[0].axis, 0).reshape(n_prod, -1)[[ppos[c] for c in b.classes]]
                e = rows * a[:, None]
                norm = np.linalg.norm(e, axis=1)
                norm[norm == 0] = 1.0
                u = e / norm[:, None]
                rho = np.clip(u @ u.T, -1.0, 1.0)
            index = min(layer_index[p.name] for p in producers)
            groups.append(_Group(g.id, bi, producers[0].name, index, tuple(b.classes), cstats[0][0], cstats[0][1], loss, rho,
                                 name in ("Relu", "none") and not others, macs, name, sums,
                                 tuple(p.name for p in producers), cstats))
    return groups, reasons


def _options(gr: _Group, j: int, removed: set, allow_merge: bool):
    """``(v_res, partner, scale)`` of the cheapest way to remove channel ``j`` (partner None: prune)."""
    vj = gr.var[j]
    best = (vj, None, 0.0)
    if not allow_merge or gr.rho is None:
        return best
    n = len(gr.classes)
    ks = np.array([k for k in range(n) if k != j and k not in removed], np.int64)
    if ks.size == 0:
        return best
    vk = gr.var[ks]
    r = gr.rho[j, ks]
    with np.errstate(divide="ignore", invalid="ignore"):
        if gr.homogeneous:
            s = np.where((r > 0) & (vk > 0), r * np.sqrt(vj / np.where(vk > 0, vk, 1.0)), 0.0)
        else:
            s = np.ones_like(vk)
        res = vj + s * s * vk - 2 * s * r * np.sqrt(vj * vk)
    res = np.where(s > 0, res, np.inf)
    i = int(np.argmin(res))
    if res[i] < MERGE_MARGIN * best[0]:
        best = (float(max(res[i], 0.0)), int(ks[i]), float(s[i]))
    return best


def plan(model: onnx.ModelProto, config: ReduceConfig, coupling=None, twin=None, notes: Optional[list] = None,
         progress=None):
    """The channels to remove: ``(groups, decisions, reasons, macs_total)`` where ``decisions[g]``
    lists ``(j, partner or None, scale, relative cost)`` per group (indices into its classes).
    With ``twin`` (and ``config.plan`` not "cost"), the twin-measured plan of
    :mod:`redpp_onnx.passes.twin_plan` where it applies (what was used goes into ``notes``)."""
    coupling = coupling or analyze_coupling(model)
    consts = ConstantTensors(model)
    scan = scan_layers(model)
    layer_index = {l.node: k for k, l in enumerate(scan.layers)}
    macs_of = {l.node: l.macs or 0 for l in scan.layers}
    macs_total = sum(macs_of.values())
    groups, reasons = _analyse(model, coupling, consts, layer_index, macs_of, config.coupled, config.scale == "bn")
    n_layers = len(scan.layers)
    decisions: Dict[int, list] = {k: [] for k in range(len(groups))}
    state = [(set(), set()) for _ in groups]  # (removed, partners)
    norm = [float(np.sum(gr.loss)) or 1.0 for gr in groups] if config.scale == "group" else [1.0] * len(groups)
    weight = [1.0] * len(groups)
    if config.sensitivity != "none" and groups:
        slopes = _slopes(model, config.sensitivity)
        for k, gr in enumerate(groups):
            ws = [slopes.get(c.name) for c, _, _ in gr.consumers]
            if all(x is not None for x in ws) and ws:
                weight[k] = float(sum(ws))
        norm = [n / w if w > 0 else n for n, w in zip(norm, weight)]

    def best(k, j):
        gr = groups[k]
        v, partner, s = _options(gr, j, state[k][0], config.merge)
        ratio = v / gr.var[j] if gr.var[j] > 0 else 0.0
        return gr.loss[j] * ratio / norm[k], partner, s

    def take(k, j, partner, s, cost):
        state[k][0].add(j)
        if partner is not None:
            state[k][1].add(partner)
        decisions[k].append((j, partner, s, cost))

    def limit(k):
        return int(math.floor(config.max_share * len(groups[k].classes)))

    def sequence(k):
        """Group ``k``'s channels in the order the per-layer greedy removes them (cheapest first,
        partners kept), up to ``max_share``: any prefix is a valid removal."""
        gr = groups[k]
        heap = [(best(k, j)[0], j) for j in range(len(gr.classes))]
        heapq.heapify(heap)
        while heap and len(state[k][0]) < limit(k):
            c, j = heapq.heappop(heap)
            if j in state[k][0] or j in state[k][1]:
                continue
            c2, partner, s = best(k, j)
            if c2 > c * (1 + 1e-12) + 1e-15:  # its partner went: re-queue at its new cost
                heapq.heappush(heap, (c2, j))
                continue
            take(k, j, partner, s, c2)
        seq = decisions[k]
        decisions[k] = []
        return seq

    def counts(k, n_seq):
        """Removal counts that leave a multiple of ``config.multiple`` channels (0 always)."""
        c = len(groups[k].classes)
        return [r for r in range(1, n_seq + 1) if (c - r) % config.multiple == 0]

    seqs = [sequence(k) for k in range(len(groups))]
    table = None
    from . import twin_plan as TP

    if twin is not None and config.plan != "cost":
        why = TP.unavailable(groups, twin)
        if why is None:
            key = ("twin_plan", config.max_share, config.scale, config.coupled, config.merge)
            if key not in twin.memo:  # one measurement serves every target on this twin
                moments = TP.consumer_moments(twin, [c.node for gr in groups for c, _, _ in gr.consumers])
                twin.memo[key] = (moments,) + TP.sequences(model, groups, seqs, moments, config.max_share)
            moments, seqs, n_elim = twin.memo[key]
            if config.target_macs is not None:
                tkey = key + (config.multiple,)
                if tkey not in twin.memo:
                    tcoupling, tgroups = _regroup(twin.model, config, groups)
                    twin.memo[tkey] = TP.drift_table(twin, tcoupling, tgroups, seqs, reasons, macs_total, moments,
                                                     config.multiple, progress)
                table = twin.memo[tkey]
            if notes is not None:
                notes.append(f"plan measured on the synthetic twin: channels of {n_elim} of {len(groups)} group(s) "
                             "chosen by least-squares backward elimination on the refitted consumer"
                             + (f", counts per group by the logit drift of {len(table)} options measured one group "
                                "at a time (least summed drift for the target)" if table is not None else ""))
        elif notes is not None:
            notes.append(f"closed-form plan (twin-measured plan not used: {why})")
    if table is not None:
        counts_, _ = TP.allocate(len(groups), table, (1.0 - float(config.target_macs)) * macs_total)
        for k in range(len(groups)):
            decisions[k] = seqs[k][:counts_[k]]
    elif config.target_macs is None:
        for k, gr in enumerate(groups):
            want = int(math.floor(config.alpha_for(gr.layer_index, n_layers) * len(gr.classes)))
            ok = [r for r in counts(k, len(seqs[k])) if r <= want]
            decisions[k] = seqs[k][:max(ok)] if ok else []
    else:
        budget = (1.0 - float(config.target_macs)) * macs_total
        removed_macs = 0.0
        taken = [0] * len(groups)
        options = [counts(k, len(seqs[k])) for k in range(len(groups))]

        def chunk(k):
            nxt = [r for r in options[k] if r > taken[k]]
            if not nxt:
                return None
            r = nxt[0]
            cost = sum(d[3] for d in seqs[k][taken[k]:r])
            n = r - taken[k]
            per = groups[k].macs_per_channel
            key = cost / (n * per) if config.order == "cost_per_mac" and per else cost / n
            return (key, k, r)

        heap = [c for c in (chunk(k) for k in range(len(groups))) if c is not None]
        heapq.heapify(heap)
        while heap and removed_macs < budget:
            _, k, r = heapq.heappop(heap)
            removed_macs += (r - taken[k]) * groups[k].macs_per_channel
            taken[k] = r
            c = chunk(k)
            if c is not None:
                heapq.heappush(heap, c)
        for k in range(len(groups)):
            decisions[k] = seqs[k][:taken[k]]
    return groups, decisions, reasons, macs_total


def _slopes(model: onnx.ModelProto, proxy: str) -> Dict[str, float]:
    """Each eligible layer's linear logit sensitivity (``rd.sensitivities``: relative logit energy
    per unit of relative output distortion), by node name; {} when it cannot be measured."""
    from ..hashing import rd

    try:
        views = rd.layer_views(model)
        responses = rd.sensitivities(model, views, proxy)
    except rd.SyntheticInputsUnavailable:
        return {}
    return {v.name: r.slope for v, r in zip(views, responses)}


# --------------------------------------------------------------------------- edits

def reduce_channels(model: onnx.ModelProto, config: ReduceConfig, progress=None, twin=None) -> ReduceResult:
    """Remove channels by :func:`plan`, then (``config.refit``) refit the consumers on a synthetic
    twin (:mod:`redpp_onnx.passes.refit`; ``twin``: one made before for this model, e.g. by
    :func:`refit_twin`); ``model`` is not changed."""
    t0 = time.perf_counter()
    coupling = analyze_coupling(model)
    plan_notes: List[str] = []
    if config.refit and config.plan != "cost" and twin is None:
        from . import refit as RF

        try:
            twin = refit_twin(model, config)
        except RF.RefitUnavailable as err:
            plan_notes.append(f"closed-form plan (no synthetic twin: {err})")

    def step(i, n):
        if progress is not None:
            progress(i, n, "measuring the plan on the synthetic twin")

    groups, decisions, reasons, macs_total = plan(model, config, coupling, twin if config.refit else None, plan_notes,
                                                  step)
    result = apply_plan(model, coupling, groups, decisions, reasons, macs_total, compensate=config.compensate)
    result.notes[:0] = plan_notes
    if config.refit and any(decisions[k] for k in decisions):
        from . import refit as RF

        consumers = [c.node for k, gr in enumerate(groups) if decisions[k] for c, _, _ in gr.consumers]

        def same_edit(twin: onnx.ModelProto) -> onnx.ModelProto:
            return apply_plan(twin, *_regroup(twin, config, groups), decisions, reasons, macs_total,
                              compensate=config.compensate).model

        try:
            rows, notes, drift = RF.refit(model, result.model, same_edit, consumers, twin,
                                          images=config.refit_images,
                                          progress=None if progress is None else
                                          (lambda i, n: progress(i, n, "refitting consumers")))
        except RF.RefitUnavailable as err:
            rows, notes, drift = [], [f"refit skipped: {err} (mean compensation only)"], None
        result.refit = rows
        result.twin_drift = drift
        result.notes.extend(notes)
    result.seconds = time.perf_counter() - t0
    return result


def _groups_of(model: onnx.ModelProto, config: ReduceConfig) -> tuple:
    """``(coupling, groups)``: the reducible channel groups of ``model`` (:func:`_analyse`)."""
    coupling = analyze_coupling(model)
    scan = scan_layers(model)
    groups, _ = _analyse(model, coupling, ConstantTensors(model), {l.node: k for k, l in enumerate(scan.layers)},
                         {l.node: l.macs or 0 for l in scan.layers}, config.coupled, config.scale == "bn")
    return coupling, groups


def refit_twin(model: onnx.ModelProto, config: ReduceConfig = ReduceConfig()):
    """The synthetic twin the refit of any reduction of ``model`` can share (every group's consumers)."""
    from . import refit as RF

    _, groups = _groups_of(model, config)
    return RF.make_twin(model, [c.node for gr in groups for c, _, _ in gr.consumers], config.refit_images)


def _regroup(model: onnx.ModelProto, config: ReduceConfig, groups: List[_Group]) -> tuple:
    """``(coupling, groups)`` of ``model`` (the twin: same graph, other BatchNorm statistics), the
    groups in the same order as ``groups``, so that the same decisions apply to it."""
    coupling, twin_groups = _groups_of(model, config)
    if [(g.gid, g.bucket, g.classes) for g in twin_groups] != [(g.gid, g.bucket, g.classes) for g in groups]:
        raise RuntimeError("the twin's channel groups differ from the model's")
    return coupling, twin_groups


def apply_plan(model: onnx.ModelProto, coupling, groups, decisions, reasons, macs_total, *,
               compensate: bool = True) -> ReduceResult:
    """The model without the channels of ``decisions`` (from :func:`plan`, or any other rule:
    ``decisions[k]`` = ``[(j, partner or None, scale, cost)]`` per group ``k``, indices into the
    group's classes; a partner must not be removed), merged ones folded into their partners'
    consumer columns times their scale, and with ``compensate`` the removed means into the
    consumers' biases. ``model`` is not changed."""
    t0 = time.perf_counter()
    params_before = sum(l.params for l in coupling.scan.layers)
    out = onnx.ModelProto()
    out.CopyFrom(model)
    ctx = EditContext(out)
    edits: Dict[str, ChannelEdit] = {}
    shift: Dict[int, np.ndarray] = {}  # consumer node -> bias shift per output
    uncompensated = set()
    rows = []
    gmap = {gr.gid: [] for gr in groups}
    for k, gr in enumerate(groups):
        gmap[gr.gid].append(k)
    by_group = {g.id: g for g in coupling.groups}
    for k, gr in enumerate(groups):
        dec = decisions[k]
        for name in gr.producers or (gr.producer,):
            rows.append(LayerReduce(name, len(gr.classes), len(gr.classes) - len(dec),
                                    sum(p is None for _, p, _, _ in dec), sum(p is not None for _, p, _, _ in dec),
                                    len(dec) / len(gr.classes), float(sum(c for *_, c in dec)), gr.activation))
        if not dec:
            continue
        g = by_group[gr.gid]
        removed = {j for j, *_ in dec}
        into = defaultdict(list)  # kept j -> [(j', s)]
        for j, partner, s, _ in dec:
            if partner is not None:
                into[partner].append((j, s))
        if compensate:
            for (c, cidx, sums), (m_c, _) in zip(gr.consumers, gr.cstats):
                if sums is None:
                    uncompensated.add(c.name)
                    continue
                d = np.zeros(sums.shape[1])
                for j, partner, s, _ in dec:
                    dm = m_c[j] - (s * m_c[partner] if partner is not None else 0.0)
                    d += dm * sums[j]
                shift[c.node] = shift.get(c.node, 0) + d
        for t in g.tensors:
            pos = coupling.positions(t)
            cls = coupling.layout[t]
            member = {c: i for i, c in enumerate(gr.classes)}
            keep, scales = [], []
            for p, c in enumerate(cls):
                i = member.get(c)
                if i is not None and i in removed:
                    continue
                extra = into.get(i, []) if i is not None else []
                keep.append((p,) + tuple(pos[gr.classes[j]] for j, _ in extra))
                scales.append((1.0,) + tuple(s for _, s in extra))
            edits[t] = ChannelEdit(len(cls), tuple(keep), tuple(True for _ in keep), tuple(scales))
    for g in coupling.groups:
        for op in g.ops:
            if op.tensor in edits:
                apply(ctx, op, edits[op.tensor])
    out_edit = {op.node: edits[op.tensor] for g in coupling.groups for op in g.ops
                if op.role == PRODUCER and op.tensor in edits}
    for node_index, d in shift.items():
        edit = out_edit.get(node_index)  # the consumer lost output channels itself
        _add_bias(ctx, node_index, d[edit.kept] if edit is not None else d)
    ctx.commit()
    if edits:
        _drop_stale_shapes(out, set(edits))
    after = scan_layers(out)
    params_after = sum(l.params for l in after.layers)
    macs_after = sum(l.macs or 0 for l in after.layers)
    for row in rows:
        row.reasons.extend(reasons.get(row.name, []))
    seen = {r.name for r in rows}
    for name, rs in reasons.items():
        if name not in seen:
            rows.append(LayerReduce(name, 0, 0, reasons=list(rs)))
    notes = []
    all_dec = [d for k in decisions for d in decisions[k]]
    removed = len(all_dec)
    n_merged = sum(p is not None for _, p, _, _ in all_dec)
    if removed:
        notes.append(f"reduce removed {removed} channels ({n_merged} merged into a scaled partner, "
                     f"{removed - n_merged} pruned), data-free; the function changes (predicted relative cost "
                     "per layer in the rows)")
        if compensate:
            notes.append("mean compensation: each removed channel's expected value (Gaussian model of its "
                         "BatchNorm statistics) went into its consumers' biases, averaged over output positions "
                         "(zero-padded borders see part of the kernel)")
        if uncompensated:
            notes.append(f"no bias to compensate into for {', '.join(sorted(uncompensated))} (MatMul)")
    return ReduceResult(out, rows, macs_total, macs_after, params_before, params_after,
                        float(sum(c for *_, c in all_dec)), notes, time.perf_counter() - t0)


def _drop_stale_shapes(model: onnx.ModelProto, edited: set) -> None:
    """Shapes the graph states that a channel edit made wrong: ``value_info`` of the edited tensors and of
    initializers whose dims changed (the dynamo exporter writes ``value_info`` for initializers too: a
    stale one fails shape inference, and with it every static shape, MAC count and synthetic input of the
    reduced model); graph inputs that name an edited initializer take its new dims."""
    dims = {t.name: list(t.dims) for t in model.graph.initializer}

    def stated(vi):
        return [d.dim_value if d.HasField("dim_value") else None for d in vi.type.tensor_type.shape.dim]

    keep = [vi for vi in model.graph.value_info
            if vi.name not in edited and not (vi.name in dims and stated(vi) != dims[vi.name])]
    del model.graph.value_info[:]
    model.graph.value_info.extend(keep)
    for vi in model.graph.input:
        if vi.name in dims and vi.type.HasField("tensor_type") and stated(vi) != dims[vi.name]:
            shape = vi.type.tensor_type.shape
            del shape.dim[:]
            for d in dims[vi.name]:
                shape.dim.add().dim_value = d


def _add_bias(ctx: EditContext, i: int, d: np.ndarray) -> None:
    node = ctx.node(i)
    if node.op_type == "MatMul":  # into the bias Add after it (refit.bias_add: found when the sums were made)
        where = bias_add(ctx.model, i)
        if where is not None:
            j, k = where
            c = ctx.get(j, k)
            ctx.set(j, k, (c.astype(np.float64) + d.reshape(c.shape)).astype(c.dtype))
        return
    if node.op_type == "Conv":
        if len(node.input) > 2 and node.input[2]:
            b = ctx.get(i, 2)
            ctx.set(i, 2, (b.astype(np.float64) + d).astype(b.dtype))
        else:
            ctx.append_input(i, 2, d.astype(np.float32))
        return
    if node.op_type == "Gemm":
        beta = next((a.f for a in node.attribute if a.name == "beta"), 1.0)
        if len(node.input) > 2 and node.input[2]:
            c = ctx.get(i, 2)
            ctx.set(i, 2, (c.astype(np.float64) + np.broadcast_to(d / beta, np.broadcast_shapes(c.shape, d.shape))
                           ).astype(c.dtype))
        else:
            ctx.append_input(i, 2, (d / beta).astype(np.float32))
