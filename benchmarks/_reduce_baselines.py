"""Channel-reduction baselines for ``bench_reduce.py``, on the channel groups of ``redpp-onnx``'s
reduction (``passes/reduce.py``: single-producer groups whose consumers are Conv / Gemm / MatMul),
applied by the same editor (``reduce.apply_plan``), so that only the RULE differs:

* :func:`l1_decisions`: plain L1-norm filter pruning (Li et al., "Pruning filters for efficient
  ConvNets"): in every group the share ``share`` of the channels whose producer filters have the
  smallest L1 norm is removed, nothing compensated;
* :func:`neuron_merging_decisions`: Neuron-Merging-style (Kim et al., NeurIPS 2020, the
  BatchNorm-aware rule of its reference code): the same L1 selection, then each removed filter is
  merged into the kept filter that minimises ``λ·(1 − cos) + (1 − λ)·bias mismatch`` (the
  mismatch normalised to [0, 1] over the kept filters), when their cosine similarity is at least
  ``threshold``, with the scale from the filter norms and the BatchNorm ratios; no mean
  compensation. Defaults ``λ = 0.85``, ``threshold = 0.1``: the values of its ResNet-56 script.
  The scale and the mismatch are written here from the algebra of conv -> BatchNorm (pruned
  ``≈ S · kept + c``): ``S = (‖F_j‖/‖F_k‖)·(a_j/a_k)``, ``a = γ/sqrt(var + ε)``, and ``c`` the
  constant left over, compared at the scale of the kept neuron (``|c| / S``).

Each returns ``decisions`` in the form ``apply_plan`` takes: per group, ``[(j, partner or None,
scale, 0.0)]``.
"""

from __future__ import annotations

import math
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import onnx

from redpp_onnx.analysis.coupling import PER_CHANNEL
from redpp_onnx.analysis.layers import ConstantTensors


def producer_rows(model: onnx.ModelProto, coupling, group) -> Tuple[np.ndarray, Optional[tuple], bool]:
    """``(rows, bn, other_per_channel)`` of a reduce group (``reduce._Group``): the producer's
    filters as rows (one per class of the group, in its order), the BatchNormalization on the way
    ``(gamma, beta, mean, var, eps)`` per class (None without one) and whether any other
    per-channel op (a depthwise conv...) lies on the way (then merging is not exact: prune only)."""
    consts = ConstantTensors(model)
    g = next(x for x in coupling.groups if x.id == group.gid)
    prod = next(p for p in g.producers if p.name == group.producer)
    ppos = coupling.positions(prod.tensor)
    n = len(coupling.layout[prod.tensor])
    w = consts.array(prod.params[0].name).astype(np.float64)
    rows = np.moveaxis(w, prod.params[0].axis, 0).reshape(n, -1)[[ppos[c] for c in group.classes]]
    b = g.buckets[group.bucket]
    per = [op for op in g.ops if op.role == PER_CHANNEL and op.tensor in b.tensors]
    bns = [op for op in per if op.op_type == "BatchNormalization"]
    bn = None
    if len(bns) == 1:
        node = model.graph.node[bns[0].node]
        pos = coupling.positions(bns[0].tensor)
        idx = [pos[c] for c in group.classes]
        gamma, beta, mean, var = (consts.array(node.input[k]).astype(np.float64).ravel()[idx] for k in (1, 2, 3, 4))
        eps = next((onnx.helper.get_attribute_value(a) for a in node.attribute if a.name == "epsilon"), 1e-5)
        bn = (gamma, beta, mean, var, float(eps))
    return rows, bn, len(per) != len(bns) or len(bns) > 1


def l1_order(rows: np.ndarray) -> np.ndarray:
    """Channel indices by increasing L1 norm of their filters (ties by index)."""
    return np.argsort(np.abs(rows).sum(axis=1), kind="stable")


def _removed(n: int, share: float, multiple: int) -> int:
    r = int(math.floor(share * n))
    while r > 0 and (n - r) % multiple:
        r -= 1
    return r


def l1_decisions(model, coupling, groups: Sequence, share: float, multiple: int = 1) -> Dict[int, list]:
    """Per group, the ``share`` of channels with the smallest filter L1 norms, pruned."""
    out = {}
    for k, gr in enumerate(groups):
        rows, _, _ = producer_rows(model, coupling, gr)
        r = _removed(len(gr.classes), share, multiple)
        out[k] = [(int(j), None, 0.0, 0.0) for j in l1_order(rows)[:r]]
    return out


def neuron_merging_decisions(model, coupling, groups: Sequence, share: float, multiple: int = 1,
                             lam: float = 0.85, threshold: float = 0.1) -> Dict[int, list]:
    """The L1 selection of :func:`l1_decisions`, each removed channel merged Neuron-Merging-style
    into its best kept partner when the cosine similarity reaches ``threshold`` (else pruned)."""
    out = {}
    for k, gr in enumerate(groups):
        rows, bn, other = producer_rows(model, coupling, gr)
        n = len(gr.classes)
        r = _removed(n, share, multiple)
        order = l1_order(rows)
        gone, kept = order[:r], np.sort(order[r:])
        dec: List[tuple] = []
        can_merge = not other and gr.homogeneous and kept.size > 0
        norms = np.linalg.norm(rows, axis=1)
        safe = np.where(norms > 0, norms, 1.0)
        unit = rows / safe[:, None]
        if bn is not None:
            gamma, beta, mean, var, eps = bn
            a = gamma / np.sqrt(var + eps)
            offset = beta - a * mean  # BN(F·x) = a·F·x + offset
        else:
            a, offset = np.ones(n), np.zeros(n)
        for j in gone:
            if not can_merge or norms[j] == 0:
                dec.append((int(j), None, 0.0, 0.0))
                continue
            cos = unit[kept] @ unit[j]
            s = norms[j] / safe[kept]                  # F_j ≈ s·F_k
            with np.errstate(divide="ignore", invalid="ignore"):
                scale = s * a[j] / np.where(a[kept] != 0, a[kept], np.nan)  # pruned ≈ S·kept + c
                c = offset[j] - scale * offset[kept]
                mismatch = np.abs(c) / np.abs(scale)
            mismatch = np.where(np.isfinite(mismatch), mismatch, np.inf)
            finite = mismatch[np.isfinite(mismatch)]
            if finite.size == 0:
                dec.append((int(j), None, 0.0, 0.0))
                continue
            lo, hi = float(finite.min()), float(finite.max())
            norm_mis = (mismatch - lo) / (hi - lo) if hi > lo else np.zeros_like(mismatch)
            dist = lam * (1 - cos) + (1 - lam) * norm_mis
            i = int(np.argmin(dist))
            if cos[i] >= threshold and scale[i] > 0 and np.isfinite(scale[i]):
                dec.append((int(j), int(kept[i]), float(scale[i]), 0.0))
            else:
                dec.append((int(j), None, 0.0, 0.0))
        out[k] = dec
    return out
