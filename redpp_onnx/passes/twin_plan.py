"""Twin-measured reduction plan: which channels, and how many per layer, chosen with the refit in the loop.

:func:`redpp_onnx.passes.reduce.plan` ranks channels by a closed-form cost (the consumer-output
variance a removed channel leaves behind, before any refit) and shares the MAC target out by the
same cost. Once the consumers are refitted (:mod:`redpp_onnx.passes.refit`), what a channel costs is
what the refitted consumer cannot rebuild from the channels kept. This module measures that on the
synthetic twin (no data is read):

* **which channels** (per group whose only consumer is a refittable Conv): backward elimination on
  the consumer's least squares. From the twin's covariance of the consumer's input patches and of
  its output, the channel whose removal raises the refitted residual least goes first, the system
  is downdated (block Schur complement on the inverse covariance), and so on. The residual is
  weighted per output by the gain of the BatchNorm after the consumer (what the next layer sees).
  This is the data-free counterpart of least-squares channel selection (ThiNet, He et al. 2017);
* **how many per group** (``target_macs``): every group's valid counts (kept a multiple of
  ``multiple``, at most ``max_share`` removed; at most :data:`MAX_OPTIONS` counts per group, evenly
  spaced) are applied one group at a time to the twin, the consumers refitted, and the logit
  drift measured (relative squared L2 against the twin). The target is then met by the least summed
  drift: greedy on each group's lower convex hull of (MACs removed, drift).

When it applies: every reducible group is *direct* (one producer, at most one BatchNorm and an
activation before its consumers, no other per-channel op such as a depthwise conv) and the model
has a twin. Measured on EfficientNet-Lite0, whose expansion channels pass a depthwise conv, the
twin-measured plan lost 7-10 top-1 points more than the closed-form plan at 5-10 % of the MACs
(the twin's first two moments do not describe what such channels carry); there :func:`unavailable`
gives the reason and the closed-form plan is used (the report says so).
"""

from __future__ import annotations

import heapq
import math
from typing import Dict, List, Optional

import numpy as np
import onnx

from . import refit as RF
from .editors import EditContext

MAX_OPTIONS = 6
"""Counts measured per group on the twin (evenly spaced over the valid ones, the largest included)."""
STATS_BYTES = 1 << 29
"""Covariances held at once while reading the twin (the consumers are read in chunks within it)."""
DRIFT_ELEMENTS = 1 << 23
"""Input values of the twin images the drift of each option is measured on (at most)."""


def unavailable(groups, tw: Optional[RF.Twin]) -> Optional[str]:
    """Why the twin-measured plan does not apply to these groups (None: it does)."""
    if tw is None:
        return "no synthetic twin"
    if not groups:
        return "no reducible channel group"
    coupled = [g.producer for g in groups if len(g.producers) > 1]
    if coupled:
        return f"{len(coupled)} residual-coupled group(s) ({coupled[0]}...): a channel leaves several producers at once"
    indirect = [g.producer for g in groups if g.rho is None]
    if indirect:
        return (f"{len(indirect)} group(s) pass a per-channel op other than one BatchNorm (e.g. a depthwise conv) "
                f"before their consumers ({indirect[0]}...): the twin does not predict those well (measured)")
    return None


# --------------------------------------------------------------------------- consumer moments

def consumer_moments(tw: RF.Twin, nodes: List[int]) -> Dict[int, tuple]:
    """Per refittable consumer Conv (node index): ``(Σ xxᵀ, Σ xyᵀ, Σ x, Σ y, n)`` of its input
    patches x and its output y on the twin (float64), read in chunks of at most :data:`STATS_BYTES`;
    only consumers with at least ``refit.ROWS_PER_FEATURE`` rows per unknown (the refit's own rule:
    fewer, and their least squares would choose from noise)."""
    g = tw.model.graph
    ctx = EditContext(tw.model)
    todo = [j for j in sorted(set(nodes)) if RF.refittable(g.node[j]) is None and ctx.get(j, 1).ndim == 4]
    out, chunk, size = {}, [], 0
    for j in todo + [None]:
        if j is not None:
            nf = ctx.get(j, 1)[0].size
            if not chunk or size + 8 * nf * nf <= STATS_BYTES:
                chunk.append(j)
                size += 8 * nf * nf
                continue
        if chunk:
            out.update({j: m for j, m in _read(tw, ctx, chunk).items()
                        if m[4] >= RF.ROWS_PER_FEATURE * (ctx.get(j, 1)[0].size + 1)})
        chunk, size = ([j], 8 * ctx.get(j, 1)[0].size ** 2) if j is not None else ([], 0)
    return out


def _read(tw: RF.Twin, ctx: EditContext, nodes: List[int]) -> Dict[int, tuple]:
    g = tw.model.graph
    names = list(dict.fromkeys(n for j in nodes for n in (g.node[j].input[0], g.node[j].output[0])))
    sess = RF._session(tw.model, names)
    acc: Dict[int, list] = {}
    for f in tw.feeds:
        vals = dict(zip(names, sess.run(names, f)))
        for j in nodes:
            node = g.node[j]
            y = np.asarray(vals[node.output[0]], np.float64)
            xp = RF._patches(np.asarray(vals[node.input[0]], np.float64), node, ctx.get(j, 1).shape)
            acc[j] = RF.add_moments(acc.get(j), xp, np.moveaxis(y, 1, -1).reshape(-1, y.shape[1]))
    return {j: tuple(a) for j, a in acc.items()}


def solve(mom: tuple, keep: np.ndarray) -> tuple:
    """The refitted consumer ``(W [outputs, features kept], b)`` from the moments, on the features
    ``keep`` (``refit.ridge_solve``: the refit's own least squares)."""
    return RF.ridge_solve(mom, keep)[:2]


def elimination_order(mom: tuple, candidates: List[int], taps: int, gain: Optional[np.ndarray] = None,
                      limit: Optional[int] = None) -> tuple:
    """Backward elimination of input channels (``candidates``: positions in the consumer's input,
    ``taps`` features each): ``(order, step costs)``, each step's cost the rise of the refitted
    residual (outputs weighted by ``gain²``) over the explained energy of the full fit."""
    cxx, cxy, _, _ = RF.covariances(mom)
    if gain is not None:
        cxy = cxy * gain[None, :]
    nf = cxx.shape[0]
    lam = RF.RIDGE * max(float(np.mean(np.diag(cxx))), 1e-30)
    p = np.linalg.inv(cxx + lam * np.eye(nf))
    w = p @ cxy
    total = float(np.sum(cxy * w)) or 1.0
    current = list(range(nf // taps))  # channel positions still in p / w, in their order
    left = [c for c in candidates]
    order, costs = [], []
    limit = len(left) if limit is None else min(limit, len(left))
    while len(order) < limit:
        at = {c: i for i, c in enumerate(current)}
        feats = np.array([at[c] for c in left])[:, None] * taps + np.arange(taps)[None, :]
        pss = p[feats[:, :, None], feats[:, None, :]]
        ws = w[feats]
        inv = np.linalg.inv(pss)
        rise = np.einsum("cto,ctu,cuo->c", ws, inv, ws)
        i = int(np.argmin(rise))
        s = feats[i]
        keep = np.setdiff1d(np.arange(p.shape[0]), s)
        pks = p[np.ix_(keep, s)]
        w = w[keep] - pks @ inv[i] @ w[s]
        p = p[np.ix_(keep, keep)] - pks @ inv[i] @ pks.T
        order.append(left.pop(i))
        current.remove(order[-1])
        costs.append(max(float(rise[i]), 0.0) / total)
    return order, costs


# --------------------------------------------------------------------------- the plan

def sequences(model: onnx.ModelProto, groups, proxy_seqs, moments, max_share: float) -> tuple:
    """Per group, its channels in removal order ``[(j, None, 0.0, cost)]`` (pruned: the refit
    recombines the rest): the backward elimination where the group's only consumer is refitted,
    the closed-form order otherwise. Returns ``(sequences, how many groups were ordered by elimination)``."""
    from collections import defaultdict

    from ..analysis.layers import ConstantTensors
    from .reduce import _output_gain

    users = defaultdict(list)
    for n in model.graph.node:
        for x in n.input:
            users[x].append(n)
    consts = ConstantTensors(model)
    out, by_elimination = [], 0
    for k, gr in enumerate(groups):
        cons = gr.consumers
        if len(cons) != 1 or cons[0][0].node not in moments:
            out.append(proxy_seqs[k])
            continue
        c, cidx, _ = cons[0]
        w = consts.array(c.params[0].name)
        taps = int(np.prod(w.shape[2:])) if w.ndim > 2 else 1
        gain = _output_gain(consts, users, model.graph.node[c.node])
        if gain is not None and gain.size != w.shape[0]:
            gain = None
        j_of = {cidx[j]: j for j in range(len(gr.classes))}
        order, costs = elimination_order(moments[c.node], list(j_of), taps, gain,
                                         int(math.floor(max_share * len(gr.classes))))
        out.append([(j_of[pos], None, 0.0, cost) for pos, cost in zip(order, costs)])
        by_elimination += 1
    return out, by_elimination


def options(n_classes: int, n_seq: int, multiple: int) -> List[int]:
    """The removal counts measured for a group: kept a multiple of ``multiple``, at most
    :data:`MAX_OPTIONS` of them evenly spaced, the largest always."""
    valid = [r for r in range(1, n_seq + 1) if (n_classes - r) % multiple == 0]
    if len(valid) > MAX_OPTIONS:
        step = math.ceil(len(valid) / MAX_OPTIONS)
        valid = valid[::-1][::step][::-1]
    return valid


def drift_table(tw: RF.Twin, tcoupling, tgroups, seqs, reasons, macs_total, moments, multiple: int,
                progress=None) -> Dict[tuple, tuple]:
    """``{(group, count): (relative squared logit drift on the twin, MACs removed)}``: each option
    alone, its consumers refitted from ``moments``."""
    from .reduce import apply_plan

    per = max(RF._values_per_sample(tw.model, _shapes(tw.model)), 1)
    feeds, seen = [], 0
    for f in tw.feeds:
        if feeds and seen + len(next(iter(f.values()))) * per > DRIFT_ELEMENTS:
            break
        feeds.append(f)
        seen += len(next(iter(f.values()))) * per
    ref = RF.first_output(tw.model, feeds)
    den = float(np.sum(ref * ref)) or 1.0
    table = {}
    empty = {k: [] for k in range(len(tgroups))}
    for k, gr in enumerate(tgroups):
        if progress is not None:
            progress(k, len(tgroups))
        for r in options(len(gr.classes), len(seqs[k]), multiple):
            dec = dict(empty)
            dec[k] = seqs[k][:r]
            red = apply_plan(tw.model, tcoupling, tgroups, dec, reasons, macs_total).model
            for c, cidx, _ in gr.consumers:
                if c.node not in moments:
                    continue
                gone = {cidx[j] for j, *_ in dec[k]}
                ctx = EditContext(red)
                w = ctx.get(c.node, 1)
                taps = int(np.prod(w.shape[2:]))
                n_in = w.shape[1] + len(gone)
                keep = np.array([p * taps + t for p in range(n_in) if p not in gone for t in range(taps)])
                wn, bn = solve(moments[c.node], keep)
                _set_conv(ctx, c.node, wn.reshape(w.shape), bn)
            lg = RF.first_output(red, feeds)
            table[(k, r)] = (float(np.sum((lg - ref) ** 2)) / den, r * gr.macs_per_channel)
    return table


def _shapes(model):
    from ..analysis.layers import static_shapes

    return static_shapes(model)


def _set_conv(ctx: EditContext, j: int, w: np.ndarray, b: np.ndarray) -> None:
    node = ctx.node(j)
    dtype = ctx.get(j, 1).dtype
    ctx.set(j, 1, w.astype(dtype))
    if len(node.input) > 2 and node.input[2]:
        ctx.set(j, 2, b.astype(ctx.get(j, 2).dtype))
    else:
        ctx.append_input(j, 2, b.astype(dtype))
    ctx.commit()


def allocate(n_groups: int, table: Dict[tuple, tuple], budget: float) -> tuple:
    """Counts per group meeting ``budget`` MACs with the least summed drift: greedy over each
    group's lower convex hull of (MACs removed, drift), steepest-cheapest first. ``(counts, MACs)``."""
    hulls = []
    for k in range(n_groups):
        pts = [(0.0, 0.0, 0)] + sorted((m, d, r) for (kk, r), (d, m) in table.items() if kk == k)
        hull = [pts[0]]
        for p in pts[1:]:
            if p[0] <= hull[-1][0]:
                continue
            while len(hull) >= 2:
                (m1, d1, _), (m2, d2, _) = hull[-2], hull[-1]
                if (d2 - d1) * (p[0] - m1) >= (p[1] - d1) * (m2 - m1):
                    hull.pop()
                else:
                    break
            hull.append(p)
        hulls.append(hull)
    at = [0] * n_groups
    heap = []

    def push(k):
        h, i = hulls[k], at[k]
        if i + 1 < len(h):
            heapq.heappush(heap, ((h[i + 1][1] - h[i][1]) / (h[i + 1][0] - h[i][0]), k))

    for k in range(n_groups):
        push(k)
    got = 0.0
    while heap and got < budget:
        _, k = heapq.heappop(heap)
        got += hulls[k][at[k] + 1][0] - hulls[k][at[k]][0]
        at[k] += 1
        push(k)
    return [hulls[k][at[k]][2] for k in range(n_groups)], got
