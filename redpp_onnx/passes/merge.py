"""Step 2: output-wise neuron merging (METHOD.md "Step 2", the paper's "Output-wise Neuron Merging").

For every channel group found by :mod:`redpp_onnx.analysis.coupling` (a producer layer, or
several coupled by residual Adds, Concats, squeeze-excitation gates...), and within it every
bucket of channels that appear in the same tensors:

* the **signature** of a channel is everything that computes it: the weight row and bias of every
  producer of the group, and every per-channel parameter met on the way to the consumers
  (BatchNormalization scale/B/mean/var, PRelu slope, per-channel Mul/Add/Sub/Div constants, a
  depthwise conv's kernel and bias);
* **α = 0** (default, data-free, exact): channels whose whole signatures are equal are merged.
  Candidates are grouped by a hash of the signature bytes, then equality is confirmed on the
  actual values (``numpy.array_equal``). Channel ``j`` is kept, every ``j'`` equal to it is
  deleted everywhere in the group, and each consumer adds the weights of input ``j'`` to those
  of ``j`` (``W[:, j] += W[:, j']``; a block of ``H*W`` features after a Flatten). The function
  is unchanged up to float rounding: for ``y = Σ_k W[:, k] x_k`` with ``x_j = x_j'``,
  ``W[:, j] x_j + W[:, j'] x_j' = (W[:, j] + W[:, j']) x_j``.
* **α > 0** (changes the function; the result says so): ``d`` = the α^l-percentile of the
  non-zero pairwise L2 distances between the bucket's signatures; channels at distance ``<= d``
  are linked and each connected component becomes one channel whose parameters are the
  component's barycenter (the mean of every weight row and per-channel parameter), the consumer
  weights of the component being summed. Decisions this module makes where the paper is silent:

  - the distance is the L2 distance between signatures in which each parameter tensor (a
    producer's weight rows, its bias, BN's scale, B, mean, var...) is divided by its RMS over the
    bucket, so that parameters of different scales (a BN variance of ~1, conv weights of ~0.05)
    weigh by their relative differences; a weight row of ``K`` values still weighs ``K`` times
    a scalar, as in the paper's distance between filters;
  - **BatchNormalization under α > 0**: scale, B, running mean and running variance are each
    averaged, as METHOD.md says ("mean of weights and per-channel parameters"). This is not the
    BN of the averaged neuron (that would need the folded affine ``γ/√(σ²+ε)``, ``β - γμ/√(σ²+ε)``);
    it is the literal barycenter of the parameters;
  - α^l of a bucket is the α of its **earliest producer** in the model's eligible-layer order
    (per-block strategy: first third ``max(2α-1, 0)``, middle third ``α``, last third
    ``min(2α, 1)``; or ``uniform``: α everywhere). A bucket whose α^l is 0 merges exactly.

``tolerance`` (> 0) relaxes the α^l = 0 equality to ``max |s_j - s_j'| <= tolerance``
(components of that relation become barycenters): also a change of the function, reported.

Counting (METHOD.md "What counts"): ``params`` are the float weights of eligible layers (Conv
group 1, Gemm, MatMul); the pruning ratio is removed / original over those. Biases, BN and
depthwise parameters removed too are counted apart in ``other_params_removed``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import time
from collections import defaultdict
from typing import Callable, Optional, Sequence

import numpy as np
import onnx
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import connected_components
from scipy.spatial.distance import pdist, squareform

from ..analysis.coupling import CONSUMER, PER_CHANNEL, PRODUCER, Coupling, analyze_coupling
from ..analysis.layers import ConstantTensors
from ..errors import RedppError
from .editors import ChannelEdit, EditContext, apply

STRATEGIES = ("per_block", "uniform")
RULES = ("redpp", "percentile")


def layer_share(alpha: float, strategy: str, index: int, n_layers: int) -> float:
    """α^l of the eligible layer at ``index`` (0-based) among ``n_layers``: ``uniform`` α, or
    ``per_block`` (the paper's appendix): first third ``max(2α - 1, 0)``, middle ``α``, last third
    ``min(2α, 1)``."""
    a = float(alpha)
    if strategy == "uniform" or n_layers <= 0:
        return a
    if index < n_layers / 3:
        return max(2 * a - 1, 0.0)
    if index <= 2 * n_layers / 3:
        return a
    return min(2 * a, 1.0)


@dataclasses.dataclass(frozen=True)
class MergeConfig:
    """Step 2 (METHOD.md): output-wise merging."""

    alpha: float = 0.0          # 0: merge equal neurons only (exact); > 0: barycenters (changes f)
    strategy: str = "per_block"  # per-layer α^l: "per_block" (paper's appendix) or "uniform"
    tolerance: float = 0.0      # α^l = 0 equality: max |difference| <= tolerance (0: exact)
    target_macs: Optional[float] = None  # keep at most this share of the eligible MACs (passes/reduce.py)
    rule: str = "redpp"         # α > 0: "redpp" (METHOD.md Step 2 revised: α^l = share of channels removed,
    #                             pruning / scale-matched merging with mean compensation, passes/reduce.py)
    #                             or "percentile" (the old rule: barycenters of close channels, for comparison)
    refit: bool = True          # rule redpp: the consumer Convs refitted on a synthetic twin (passes/refit.py)
    plan: str = "auto"          # rule redpp with refit: "auto" (measured on the twin where it applies,
    #                             passes/twin_plan.py) or "cost" (the closed-form cost only)
    channel_multiple: int = 8   # rule redpp: kept channel counts are multiples of this (onnxruntime's NCHWc block:
    #                             8 with AVX2, 16 with AVX-512; 8 serves both, 16 is faster on AVX-512, measured)

    @property
    def reduces(self) -> bool:
        """Channels are removed by the data-free reduction of ``passes/reduce.py``."""
        return self.rule == "redpp" and (self.alpha > 0 or self.target_macs is not None)

    def __post_init__(self):
        a = self.alpha
        if not isinstance(a, (int, float)) or not math.isfinite(a) or not 0 <= a <= 1:
            raise RedppError(f"--alpha must be a number in [0, 1], got {a!r}")
        if self.strategy not in STRATEGIES:
            raise RedppError(f"--merge-strategy must be one of {', '.join(STRATEGIES)}, got {self.strategy!r}")
        t = self.tolerance
        if not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
            raise RedppError(f"merge tolerance must be a non-negative number, got {t!r}")
        if self.rule not in RULES:
            raise RedppError(f"--merge-rule must be one of {', '.join(RULES)}, got {self.rule!r}")
        if self.plan not in ("auto", "cost"):
            raise RedppError(f"--reduce-plan must be auto or cost, got {self.plan!r}")
        m = self.channel_multiple
        if isinstance(m, bool) or not isinstance(m, int) or m < 1:
            raise RedppError(f"--channel-multiple must be a positive whole number, got {m!r}")
        f = self.target_macs
        if f is not None:
            if not isinstance(f, (int, float)) or not math.isfinite(f) or not 0 < f <= 1:
                raise RedppError(f"--target-macs must be a share in (0, 1], got {f!r}")
            if self.rule != "redpp":
                raise RedppError("--target-macs needs --merge-rule redpp")
            if self.alpha > 0:
                raise RedppError("--target-macs and --alpha exclude each other (the target chooses each "
                                 "layer's share)")

    def alpha_for(self, index: int, n_layers: int) -> float:
        """α^l of the eligible layer at ``index`` (0-based) among ``n_layers``."""
        return layer_share(self.alpha, self.strategy, index, n_layers)


@dataclasses.dataclass
class LayerMerge:
    """What merging did to one eligible layer (a row of the report)."""

    name: str
    op_type: str
    weight: str
    group: Optional[int]             # the group of its output channels (None: not analysed)
    in_groups: list                  # the groups it reads
    channels_before: int
    channels_after: int
    merged_out: int                  # output channels removed
    inputs_before: int               # input channels (features / inner)
    inputs_after: int
    folded_in: int                   # input channels folded into others
    params_before: int
    params_after: int
    params_removed: int
    alpha_l: Optional[float] = None  # α^l applied to its output channels (None: blocked / not analysed)
    exact: bool = True               # every merge of its output channels was between equal channels
    reasons: list = dataclasses.field(default_factory=list)
    pruned_out: int = 0              # rule redpp: output channels pruned (the rest of merged_out merged)
    predicted_cost: Optional[float] = None  # rule redpp: relative consumer-output variance removed
    macs_before: Optional[int] = None
    macs_after: Optional[int] = None


@dataclasses.dataclass
class BucketMerge:
    channels: int
    merged: int
    alpha_l: Optional[float]
    threshold: Optional[float]       # d (α^l > 0), tolerance, or 0 (exact)
    exact: bool
    reasons: list


@dataclasses.dataclass
class GroupMerge:
    """One channel group: its layers, what was merged and why not more."""

    id: int
    producers: list
    consumers: list
    ops: list                        # "name (role)" of every node in the group
    channels_before: int
    channels_after: int
    merged: int
    blocked_channels: int
    exact: bool
    buckets: list                    # BucketMerge
    reasons: list


@dataclasses.dataclass
class MergePassResult:
    model: onnx.ModelProto
    layers: list                     # LayerMerge per eligible layer
    groups: list                     # GroupMerge per channel group
    refused: list                    # Refusal per Conv/Gemm/MatMul that is not an eligible layer
    config: MergeConfig
    params_before: int
    params_after: int
    pruning_ratio: float
    channels_removed: int
    other_params_removed: int        # biases, BN, depthwise, per-channel constants
    function_changed: bool
    notes: list
    seconds: float = 0.0


class MergePass:
    """``MergePass(config).run(model)`` -> :class:`MergePassResult` (``model`` is not modified)."""

    def __init__(self, config: MergeConfig = MergeConfig(), *,
                 progress: Optional[Callable[[int, int, str], None]] = None):
        self.config = config
        self.progress = progress

    # ------------------------------------------------------------------ run
    def run(self, model: onnx.ModelProto) -> MergePassResult:
        if self.config.reduces:
            return self._run_reduce(model)
        t0 = time.perf_counter()
        coupling = analyze_coupling(model)
        scan = coupling.scan
        order = {l.node: k for k, l in enumerate(scan.layers)}
        values = _Values(ConstantTensors(model))
        positions = _Positions(coupling)

        rep_of = {}          # deleted class -> kept class
        cluster = {}         # kept class -> (classes, exact)
        bucket_rows = {}     # (group id, bucket index) -> BucketMerge
        class_bucket = {}    # class -> (group id, bucket index)
        for gi, g in enumerate(coupling.groups):
            if self.progress:
                self.progress(gi, len(coupling.groups), g.producers[0].name if g.producers else "")
            for bi, b in enumerate(g.buckets):
                for c in b.classes:
                    class_bucket[c] = (g.id, bi)
                if b.reasons:
                    bucket_rows[g.id, bi] = BucketMerge(len(b.classes), 0, None, None, True, list(b.reasons))
                    continue
                contrib = [op for op in g.ops if op.tensor in b.tensors and op.role in (PRODUCER, PER_CHANNEL)]
                producers = [op for op in contrib if op.role == PRODUCER]
                alpha_l = (self.config.alpha_for(order[producers[0].name], len(scan.layers))
                           if producers else 0.0)
                if len(b.classes) < 2:
                    bucket_rows[g.id, bi] = BucketMerge(len(b.classes), 0, alpha_l, None, True,
                                                        ["a single channel: nothing to merge"])
                    continue
                sections = [values.rows(op, p, positions[op.tensor], b.classes) for op in contrib for p in op.params]
                clusters, threshold = self._cluster(sections, len(b.classes), alpha_l)
                merged, all_exact = 0, True
                for members, exact in clusters:
                    keep = b.classes[members[0]]
                    cluster[keep] = (tuple(b.classes[m] for m in members), exact)
                    for m in members[1:]:
                        rep_of[b.classes[m]] = keep
                    merged += len(members) - 1
                    all_exact &= exact
                reasons = []
                if not merged:
                    reasons.append(self._nothing_reason(alpha_l, len(producers)))
                bucket_rows[g.id, bi] = BucketMerge(len(b.classes), merged, alpha_l, threshold, all_exact, reasons)
        if self.progress:
            self.progress(len(coupling.groups), len(coupling.groups), "")

        # ---- edits: one ChannelEdit per tensor that loses channels, applied through the editors
        out = onnx.ModelProto()
        out.CopyFrom(model)
        ctx = EditContext(out)
        edits = {}
        for t, cls in coupling.layout.items():
            if not any(c in rep_of for c in cls):
                continue
            pos = positions[t]
            keep, exact = [], []
            for p, c in enumerate(cls):
                if c in rep_of:
                    continue
                if c in cluster:
                    members, ex = cluster[c]
                    keep.append(tuple(pos[m] for m in members))
                    exact.append(ex)
                else:
                    keep.append((p,))
                    exact.append(True)
            edits[t] = ChannelEdit(len(cls), tuple(keep), tuple(exact))
        for g in coupling.groups:
            for op in g.ops:
                if op.tensor in edits:
                    apply(ctx, op, edits[op.tensor])
        layers = self._layer_rows(coupling, ctx, edits, bucket_rows, class_bucket, rep_of, cluster)
        ctx.commit()
        if edits:  # shapes of the tensors that lost channels are stale
            keep_vi = [vi for vi in out.graph.value_info if vi.name not in edits]
            del out.graph.value_info[:]
            out.graph.value_info.extend(keep_vi)

        groups = self._group_rows(coupling, bucket_rows, rep_of)
        params_before = sum(l.params_before for l in layers)
        params_after = sum(l.params_after for l in layers)
        eligible_weights = {l.weight for l in layers}
        other = sum(n for name, n in ctx.changed.items() if name not in eligible_weights)
        changed = any(not ex for _, ex in cluster.values())
        notes = self._notes(changed, len(rep_of), groups)
        return MergePassResult(out, layers, groups, list(scan.refused), self.config, params_before, params_after,
                               (params_before - params_after) / params_before if params_before else 0.0,
                               len(rep_of), other, changed, notes, time.perf_counter() - t0)

    def _run_reduce(self, model: onnx.ModelProto) -> MergePassResult:
        """α^l shares or a MAC target by the data-free reduction (``passes/reduce.py``)."""
        from ..analysis.layers import scan_layers
        from .reduce import ReduceConfig, reduce_channels

        c = self.config
        t0 = time.perf_counter()
        if self.progress:
            self.progress(0, 1, "channel statistics")
        res = reduce_channels(model, ReduceConfig(alpha=c.alpha, strategy=c.strategy, target_macs=c.target_macs,
                                                  refit=c.refit, multiple=c.channel_multiple, plan=c.plan),
                              progress=self.progress)
        refits = {r.name: r for r in res.refit}
        before, after = scan_layers(model), {l.node: l for l in scan_layers(res.model).layers}
        info = {r.name: r for r in res.layers}
        layers = []
        for l in before.layers:
            a = after.get(l.node, l)
            out_b, in_b = _out_in(l)
            out_a, in_a = _out_in(a)
            r = info.get(l.node)
            row = LayerMerge(l.node, l.op_type, l.weight, None, [], out_b, out_a, out_b - out_a, in_b, in_a,
                             in_b - in_a, l.params, a.params, l.params - a.params, exact=out_a == out_b,
                             macs_before=l.macs, macs_after=a.macs)
            if r is not None:
                row.alpha_l = r.share
                row.pruned_out = r.pruned
                row.predicted_cost = round(r.cost, 6)
                row.reasons = list(r.reasons)
            fit = refits.get(l.node)
            if fit is not None:
                row.reasons.append(f"refit: output error on the synthetic twin {fit.error_before:.3f} -> "
                                   f"{fit.error_after:.3f}" if fit.refitted else f"not refitted: {fit.reason}")
            layers.append(row)
        init_before = sum(int(np.prod(t.dims)) for t in model.graph.initializer)
        init_after = sum(int(np.prod(t.dims)) for t in res.model.graph.initializer)
        other = max(0, (init_before - init_after) - (res.params_before - res.params_after))
        removed = sum(r.merged_out for r in layers)
        how = (f"--target-macs {c.target_macs:g}" if c.target_macs is not None else f"α = {c.alpha:g} ({c.strategy})")
        notes = [f"merge ({how}, rule redpp, data-free) changes the function: eligible MACs {res.macs_before:,} -> "
                 f"{res.macs_after:,} ({100 * res.macs_removed:.1f} % removed), parameters {res.params_before:,} -> "
                 f"{res.params_after:,}" if removed else
                 f"merge ({how}, rule redpp, data-free): nothing removed"]
        notes += res.notes if removed else ["merge removed no channel: no group could be reduced (reasons per layer)"]
        if self.progress:
            self.progress(1, 1, "")
        ratio = (res.params_before - res.params_after) / res.params_before if res.params_before else 0.0
        return MergePassResult(res.model, layers, [], list(before.refused), c, res.params_before, res.params_after,
                               ratio, removed, other, bool(removed), notes, time.perf_counter() - t0)

    # ------------------------------------------------------------------ clustering
    def _cluster(self, sections: Sequence[np.ndarray], n: int, alpha_l: float):
        """Clusters (index lists into the bucket, size >= 2, first = kept) with their exactness,
        and the threshold used."""
        sig = (np.concatenate([s.astype(np.float64) for s in sections], axis=1)
               if sections else np.zeros((n, 0)))
        tol = float(self.config.tolerance)
        if alpha_l == 0 and tol == 0:
            return _equal_clusters(sig), 0.0
        if alpha_l == 0:
            dist = pdist(sig, metric="chebyshev") if sig.shape[1] else np.zeros(n * (n - 1) // 2)
            threshold = tol
        else:
            parts = []
            for s in sections:
                s = s.astype(np.float64)
                rms = math.sqrt(float(np.mean(s * s))) if s.size else 0.0
                if rms > 0:
                    parts.append(s / rms)
            z = np.concatenate(parts, axis=1) if parts else np.zeros((n, 0))
            dist = pdist(z) if z.shape[1] else np.zeros(n * (n - 1) // 2)
            nonzero = dist[dist > 0]
            threshold = float(np.percentile(nonzero, 100 * alpha_l)) if nonzero.size else 0.0
        adj = squareform(dist <= threshold)
        k, labels = connected_components(csr_matrix(adj), directed=False)
        clusters = []
        for lab in range(k):
            members = np.flatnonzero(labels == lab).tolist()
            if len(members) > 1:
                exact = all(np.array_equal(sig[m], sig[members[0]]) for m in members[1:])
                clusters.append((members, exact))
        return clusters, threshold

    def _nothing_reason(self, alpha_l: float, n_producers: int) -> str:
        across = f" across its {n_producers} producers" if n_producers > 1 else ""
        if alpha_l == 0 and self.config.tolerance == 0:
            return f"no two channels have equal signatures{across} (α^l = 0: exact equality)"
        if alpha_l == 0:
            return f"no two channels within tolerance {self.config.tolerance:g}{across}"
        return f"no two channels within the α^l = {alpha_l:g} distance{across}"

    # ------------------------------------------------------------------ statistics
    def _layer_rows(self, coupling: Coupling, ctx: EditContext, edits, bucket_rows, class_bucket,
                    rep_of, cluster) -> list:
        ops_by_node = defaultdict(list)
        for g in coupling.groups:
            for op in g.ops:
                ops_by_node[op.node].append((g, op))
        index = {name: i for i, name in enumerate(coupling.names)}
        rows = []
        for layer in coupling.scan.layers:
            i = index[layer.node]
            w_now = ctx.get(i, 1)
            row = LayerMerge(layer.node, layer.op_type, layer.weight, None, [], 0, 0, 0, 0, 0, 0,
                             layer.params, int(w_now.size), layer.params - int(w_now.size))
            for g, op in ops_by_node[i]:
                edit = edits.get(op.tensor)
                n_old = len(coupling.layout[op.tensor])
                n_new = edit.n_new if edit else n_old
                if op.role == PRODUCER:
                    row.group = g.id
                    row.channels_before, row.channels_after = n_old, n_new
                    row.merged_out = n_old - n_new
                    keys = dict.fromkeys(class_bucket[c] for c in coupling.layout[op.tensor])
                    buckets = [bucket_rows[k] for k in keys]
                    alphas = [b.alpha_l for b in buckets if b.alpha_l is not None]
                    row.alpha_l = max(alphas) if alphas else None
                    kept = [c for c in coupling.layout[op.tensor] if c in cluster]
                    row.exact = all(cluster[c][1] for c in kept)
                    if not row.merged_out:
                        for b in buckets:
                            for r in b.reasons:
                                if r not in row.reasons:
                                    row.reasons.append(r)
                elif op.role == CONSUMER:
                    row.in_groups.append(g.id)
                    row.inputs_before += n_old
                    row.inputs_after += n_new
                    row.folded_in += n_old - n_new
            if row.group is None:
                out = (layer.weight_shape[0] if layer.op_type == "Conv" or layer.trans_b
                       else layer.weight_shape[1])
                row.channels_before = row.channels_after = out
                row.reasons.append("output channels not analysed (the output's rank is unknown)")
            rows.append(row)
        return rows

    def _group_rows(self, coupling: Coupling, bucket_rows, rep_of) -> list:
        rows = []
        for g in coupling.groups:
            buckets = [bucket_rows[g.id, bi] for bi in range(len(g.buckets))]
            merged = sum(b.merged for b in buckets)
            blocked = sum(len(b.classes) for b in g.buckets if b.reasons)
            reasons = list(g.reasons)
            if not merged:
                for b in buckets:
                    for r in b.reasons:
                        if r not in reasons:
                            reasons.append(r)
            rows.append(GroupMerge(
                g.id, [op.name for op in g.producers], [op.name for op in g.consumers],
                [f"{op.name} ({op.role})" for op in g.ops], len(g.classes), len(g.classes) - merged, merged,
                blocked, all(b.exact for b in buckets), buckets, reasons))
        return rows

    def _notes(self, changed: bool, removed: int, groups: list) -> list:
        c = self.config
        notes = []
        if changed:
            how = (f"α = {c.alpha:g} ({c.strategy})" if c.alpha > 0 else f"tolerance {c.tolerance:g}")
            notes.append(f"merge with {how} changes the function: channels that are close but not equal "
                         "are replaced by their barycenter (mean of weights and per-channel parameters, "
                         "BatchNormalization parameters averaged as they are)")
        elif removed:
            notes.append(f"merge removed {removed} channels equal to others: the function is unchanged "
                         "up to float rounding")
        else:
            notes.append("merge removed no channel: " + (
                "no two channels have equal signatures in any group" if c.alpha == 0 and c.tolerance == 0
                else "no channels close enough to merge"))
        blocked = [g for g in groups if g.blocked_channels]
        if blocked:
            notes.append(f"{len(blocked)} of {len(groups)} channel groups have channels that cannot be merged "
                         "(reasons per group)")
        return notes


def _out_in(layer) -> tuple:
    """(output channels, inputs) of an eligible layer's weight."""
    shape = layer.weight_shape
    if layer.op_type == "Conv":
        return int(shape[0]), int(shape[1])
    if layer.op_type == "Gemm" and layer.trans_b:
        return int(shape[0]), int(shape[1])
    return int(shape[-1]), int(shape[-2]) if len(shape) > 1 else 1


def _equal_clusters(sig: np.ndarray) -> list:
    """Exact clusters: candidates by a hash of the signature bytes, equality confirmed on values."""
    candidates = defaultdict(list)
    normalized = sig + 0.0  # -0.0 -> 0.0 so that equal values have equal bytes
    for k in range(sig.shape[0]):
        key = hashlib.blake2b(np.ascontiguousarray(normalized[k]).tobytes(), digest_size=16).digest()
        candidates[key].append(k)
    clusters = []
    for ks in candidates.values():
        while len(ks) > 1:
            first, rest = ks[0], ks[1:]
            same = [k for k in rest if np.array_equal(sig[k], sig[first])]
            if same:
                clusters.append(([first] + same, True))
            ks = [k for k in rest if k not in same]
    clusters.sort(key=lambda c: c[0][0])
    return clusters


class _Values:
    """Original constant values, read once, as [channels, rest] matrices per (tensor, axis)."""

    def __init__(self, consts: ConstantTensors):
        self.consts = consts
        self._cache = {}

    def rows(self, op, param, pos: dict, classes) -> np.ndarray:
        key = (param.name, param.axis)
        if key not in self._cache:
            arr = self.consts.array(param.name)
            moved = np.moveaxis(arr, param.axis, 0)
            self._cache[key] = moved.reshape(moved.shape[0], -1)
        return self._cache[key][[pos[c] for c in classes]]


class _Positions(dict):
    def __init__(self, coupling: Coupling):
        super().__init__()
        self.coupling = coupling

    def __missing__(self, tensor):
        value = self.coupling.positions(tensor)
        self[tensor] = value
        return value


# ---------------------------------------------------------------------- data-driven α*

@dataclasses.dataclass
class Calibration:
    """Result of :func:`calibrate` (DATA-DRIVEN: α* was chosen on labelled data)."""

    alpha: float
    strategy: str
    max_drop_points: float
    data: str
    n: int
    top1_reference: float
    top1: float
    pruning_ratio: float
    trials: list                     # dicts: alpha, top1, drop_points, pruning_ratio, ok
    data_driven: bool = True


ALPHA_MIN = 1e-4  # the smallest α calibrate tries


def calibrate(model: onnx.ModelProto, data_path, max_drop_points: float, *, strategy: str = "per_block",
              steps: int = 6, batch_size: int = 256, limit: Optional[int] = None,
              progress: Optional[Callable[[str], None]] = None) -> Calibration:
    """DATA-DRIVEN search of α* (the paper's "highest α that preserves the accuracy"): α = 0 and 1,
    then bisection on log α in [ALPHA_MIN, 1] for ``steps`` rounds, keeping the largest α whose top-1 on ``data_path`` stays
    within ``max_drop_points`` (percentage points) of ``model``'s own top-1. Never used by
    default; the report must say that α was chosen on data. Top-1 need not be monotone in α: the
    bisection finds *a* passing α, not necessarily the largest one.
    """
    from ..evaluate import evaluate, load_dataset

    if not isinstance(max_drop_points, (int, float)) or max_drop_points < 0:
        raise RedppError(f"--max-drop must be a non-negative number of points, got {max_drop_points!r}")
    data = load_dataset(data_path, limit=limit)
    ref = evaluate(model, data, batch_size=batch_size)
    trials = []

    def trial(alpha):
        res = MergePass(MergeConfig(alpha=alpha, strategy=strategy)).run(model)
        ev = evaluate(res.model, data, batch_size=batch_size)
        drop = 100 * (ref.top1 - ev.top1)
        row = {"alpha": alpha, "top1": ev.top1, "drop_points": drop, "pruning_ratio": res.pruning_ratio,
               "ok": drop <= max_drop_points}
        trials.append(row)
        if progress:
            progress(f"α = {alpha:.4g}: top-1 {ev.top1:.2%} ({-drop:+.2f} pt), pruning {res.pruning_ratio:.2%}")
        return row

    # Bisection on log α in [ALPHA_MIN, 1]: useful α are often far below 1 (on the shared
    # ResNets accuracy already drops at α = 0.001), which a linear bisection would never try.
    best = trial(0.0)
    hi_row = trial(1.0)
    if hi_row["ok"]:
        best = hi_row
    else:
        low_row = trial(ALPHA_MIN)
        if low_row["ok"]:
            best = low_row
            lo, hi = math.log(ALPHA_MIN), 0.0
            for _ in range(max(0, steps)):
                mid = (lo + hi) / 2
                row = trial(math.exp(mid))
                if row["ok"]:
                    lo, best = mid, row
                else:
                    hi = mid
    return Calibration(best["alpha"], strategy, float(max_drop_points), data.name, len(data), ref.top1,
                       best["top1"], best["pruning_ratio"], trials)
