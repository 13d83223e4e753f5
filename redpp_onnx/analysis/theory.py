"""Data-free guarantees of the hashing step (RED++ "Theory", ``METHOD.md``), reported by ``analyze``.

Pure: reads ``ModelProto`` objects, never changes them (the hash pass works on its own copy).

What is computed
================

Per layer ``l`` (every Conv / Gemm / MatMul with a constant weight, in graph order):

* ``u_l``: the per-weight bound ``min(A, B)`` computed by the hash pass (``LayerHash.u_l``).
  A layer the pass left unchanged has ``u_l = 0``; a layer hashed without a KDE bound (the
  uniform int8 baseline) gets ``u_l = max |w - w̃|``, a valid per-weight bound.
  Layers that are not hashed (depthwise convs by default, shared weights) have ``e_l = 0`` but
  still enter the composition below through their gain ``g_l``.
* ``fan_in = n^{l-1}·h·w``: ``C_in/group·kh·kw`` for Conv, the input features for Gemm/MatMul.
* ``μ^l = mean_c β_c`` and ``σ^l = mean_c |γ_c|`` of the BatchNormalization that consumes the
  layer's output directly (its input ``X`` is the layer's output tensor; a BN anywhere else does
  not count). Without such a BN the activation factor is 1.
* ``e_l = u_l / √fan_in · (1 - erf(-μ^l / (σ^l √2)))`` (paper eq. ``hash_per_layer``); the
  factor equals ``2Φ(μ^l/σ^l)`` and lies in ``[0, 2]`` (``σ^l = 0``: its limit, 0, 1 or 2).

The model bound ``U`` -- our reading of eq. ``hashing_2``
=========================================================

The paper typesets ``U = Π_l e_l + μ^l - Π_l μ^l`` with a free index ``l``: as written it is
not well formed. The appendix's ``L = 2`` derivation ends with

    E‖f̃ - f‖ ≤ μ¹·E‖f̃² - f²‖ + μ²·E‖f̃¹ - f¹‖,

i.e. each layer's own error ``e_l`` is multiplied by a factor of every *other* layer. The
product form that reproduces this for ``L = 2`` (up to the second-order ``e_1 e_2``) and
generalises it is our reading::

    U = Π_l (e_l + g_l) - Π_l g_l  =  Σ_l e_l Π_{k≠l} g_k  + (higher orders in e)

where ``g_l`` is layer ``l``'s gain term (``g_l = 1`` for a layer without a following BN, in
both variants). ``U`` is computed without cancellation by the recurrence
``D_{k} = (g_k + e_k)·D_{k-1} + e_k·P_{k-1}``, ``P_k = g_k·P_{k-1}`` (``D`` = the difference,
``P`` = ``Π g``); the first-order sum is reported beside it.

Two choices of ``g_l`` are computed and reported:

* ``"paper"``: ``g_l = μ^l`` (the BN's mean β averaged over channels), the paper's literal
  symbol. It can be ~0 or negative (β is a learned shift), so ``Π g`` can change sign and
  ``U`` can come out negative: it is then not an upper bound on a norm.
* ``"magnitude"`` (**the default**): ``g_l = mean_c E|y_c|`` with ``y_c ~ N(β_c, γ_c²)``, the
  expected magnitude of layer ``l``'s BN output,
  ``E|y| = σ√(2/π)·exp(-μ²/(2σ²)) + μ·(1 - 2Φ(-μ/σ))``. In the appendix the multipliers come
  from the triangle inequality: ``μ¹`` stands for the size of layer 1's output fed to the
  perturbed layer 2 (``‖(W̃² - W²) f¹(x)‖ ∝ ‖f¹(x)‖``), ``μ²`` for how much layer 2 carries an
  error of its input; both are norms, hence non-negative. The paper estimates them from the
  BN statistics; ``E|y|`` is the same BN-statistics estimate of a magnitude, exact for the
  Gaussian the paper assumes, always ``≥ |μ^l|`` and equal to ``|μ^l|`` when ``γ → 0``. It
  keeps ``U ≥ 0`` and finite, which the literal choice does not guarantee.

The default is ``"magnitude"`` because an upper bound on ``E‖f̃ - f‖ ≥ 0`` that can be
negative (or flip sign with the sign of a learned shift β) is not usable as one; the literal
variant is reported next to it, unchanged. Nothing here is fitted to the paper's Table.

Caveat, measured on the shared models (``benchmarks/bench_theory.py``): in both variants the
product ``Π_{k≠l} g_k`` over tens of layers dominates ``U`` and scales like ``ḡ^L``. With
``ḡ < 1`` (ResNets) ``U`` vanishes far below the measured ``E_X‖f̃ - f‖``; with ``ḡ > 1``
(EfficientNet-Lite0) it explodes. So on these models neither variant is a usable upper bound;
compare with the measured values (``measure``) before relying on the verdict.

``E[norm]`` -- the data-free logit norm
=======================================

The graph is walked in order, tracking per-channel ``(mean, variance)`` of activations:

* after ``BatchNormalization``: ``mean = β``, ``var = γ² · rv / (rv + ε)`` (the BN normalises with
  its running statistics ``rv``; its output is assumed ``N(β_c, γ_c² rv_c / (rv_c + ε))`` per
  channel: the paper's assumption ``N(β_c, γ_c²)``, with the ``ε`` of the normalisation kept so
  that a channel dead in training, ``rv ≈ 0``, is the constant ``β_c``, as it is at inference);
* ``Relu`` / ``Clip(min, max)``: exact moments of the rectified / clipped Gaussian with that
  mean and variance; ``Tanh``, ``Sigmoid``, ``Gelu``, ``Softplus``, ``Elu``, ``LeakyRelu``,
  ``HardSigmoid``, ``HardSwish``: the Gaussian's moments through the function by 64-point
  Gauss-Hermite quadrature;
* ``Add`` / ``Sub`` of two tracked tensors: means add (subtract), variances add
  (independence); with a constant: the mean shifts. ``Mul`` / ``Div`` by a constant: scale;
* ``Slice`` / ``Pad`` on the channel axis select / add channels (padding adds channels of the
  pad value with variance 0); on spatial axes they keep the per-channel statistics (spatial
  zero padding is ignored: an approximation at the borders);
* ``MaxPool`` / ``AveragePool`` / ``GlobalAveragePool`` / ``GlobalMaxPool`` (and ``ReduceMean`` /
  ``ReduceMax`` over exactly the spatial axes, a global pool) keep the
  per-channel mean (exact for average pooling, an under-estimate for max pooling) and the
  variance (an upper bound for the average of correlated positions, ``Var(mean) ≤ mean Var``);
* ``Flatten`` / ``Reshape`` / ``Squeeze`` to ``[N, F]``, ``Identity``, ``Dropout``: map channels
  to features (repeated ``H·W`` times when the tensor is not pooled);
* ``Gemm`` / ``MatMul`` / 1x1 ``Conv`` on a pooled tensor: ``mean' = W·mean + b`` by
  linearity of expectation, ``var' = W²·var`` (independent inputs).

With ``input_stats="standard"`` (``analyze --input-stats standard``), for models whose
exporter folded BatchNorm into Conv: a float graph input is taken as N(0, 1) per element,
independent, and a Conv on a spatial tensor propagates ``mean' = Σ W·mean + b`` and ``var' =
Σ W²·var`` per channel (positions independent, zero padding ignored); the report lists these
assumptions.

Other tensors (the graph input, a Conv on a spatial tensor, an unsupported op) are "untracked";
that is not an error unless the logits depend on one: then ``E[norm]`` is ``None`` with the
reason. ``E[norm] = ‖E[logits]‖`` (first graph output), which is ``≤ E‖f‖`` by Jensen: a
conservative denominator, as the paper wants. ``V[norm] = √(Σ_i Var(logit_i)) =
√(E‖f - E f‖²)`` is the spread of the logits around their mean under the same model (the
paper's ``V[norm]``, in the same units as ``E[norm]``); ``U / (E[norm] - V[norm])`` is the
paper's more conservative ratio, reported when ``E[norm] > V[norm]``.

Verdict
=======

``ratio = U / E[norm]`` (with the default ``U``): below :data:`HARMLESS_BELOW` (0.1, the
paper's "never exceeds 1/10" for networks whose accuracy is preserved) "harmless
(U/E[norm] << 1)"; from :data:`HARMFUL_FROM` (1: the bound allows an error as large as the
logits themselves) "likely harmful"; in between "uncertain".

Birthday problem
================

Per layer with weight ``[n_l, n_{l-1}, h, w]`` (Gemm/MatMul: ``h = w = 1``) and ``M+`` =
distinct values after hashing, the paper's uniform-prior expectations (eqs. ``uniform_E_m``,
``uniform_E_s``) ``E = 1 - K(1 - (1 - 1/K)^{n_l}) / n_l`` with ``K_m = w·h·n_{l-1}·M+`` and
``K_s = w·h·M+``. They are computed as ``(1/n) Σ_{i=1}^{n-1} (1 - (1 - 1/K)^i)`` (the same
value: the expected number of distinct draws is ``Σ_{i<n} (1 - 1/K)^i``), each term by
``-expm1(i·log1p(-1/K))``: no cancellation even for ``K = 1e12`` (where ``E ≈ (n-1)/(2K)``).
Next to them: the measured ratios on the hashed weights, ``merge`` = 1 - distinct filters /
``n_l`` and ``split`` = 1 - (distinct kernels ``W[:, j]`` per input channel, averaged) / ``n_l``.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Optional

import numpy as np
import onnx
from onnx import helper
from scipy.special import erf, ndtr

from ..config import HashConfig
from .fold import fold_constants
from .layers import FLOAT_TYPES, ConstantTensors, node_names, scan_layers, static_shapes

__all__ = [
    "AnalysisReport",
    "DEFAULT_VARIANT",
    "HARMFUL_FROM",
    "HARMLESS_BELOW",
    "LayerTheory",
    "LogitEstimate",
    "Measurement",
    "VARIANTS",
    "activation_factor",
    "analyze",
    "analyze_hashed",
    "birthday_expectation",
    "clipped_gaussian_moments",
    "compose_bound",
    "expected_abs_gaussian",
    "expected_logits",
    "layer_theory",
    "measure",
    "per_layer_error",
    "rectified_gaussian_moments",
    "verdict",
]

#: ``U / E[norm]`` below this: "harmless (U/E[norm] << 1)" (the paper's 1/10 for networks whose
#: hashing is harmless).
HARMLESS_BELOW = 0.1
#: ``U / E[norm]`` at or above this: "likely harmful" (the bound allows an error the size of
#: the logits).
HARMFUL_FROM = 1.0
#: Gain term ``g_l`` of the composition: ``"magnitude"`` (``E|N(β, γ²)|``), ``"paper"`` (``μ^l``).
VARIANTS = ("magnitude", "paper")
DEFAULT_VARIANT = "magnitude"

_SQRT2 = math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


# --------------------------------------------------------------------------- closed forms

def activation_factor(mu: Optional[float], sigma: Optional[float]) -> float:
    """``1 - erf(-μ/(σ√2))`` (``= 2Φ(μ/σ)``); 1 without a BN (``mu is None``)."""
    if mu is None:
        return 1.0
    mu, sigma = float(mu), abs(float(sigma))
    if sigma == 0.0:
        return 2.0 if mu > 0 else (1.0 if mu == 0 else 0.0)
    return float(1.0 - erf(-mu / (sigma * _SQRT2)))


def per_layer_error(u_l: float, fan_in: int, mu: Optional[float] = None,
                    sigma: Optional[float] = None) -> float:
    """Paper eq. ``hash_per_layer``: ``u_l / √fan_in · (1 - erf(-μ/(σ√2)))``."""
    return float(u_l) / math.sqrt(fan_in) * activation_factor(mu, sigma)


def _phi(z):
    z = np.asarray(z, dtype=np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        out = np.exp(-0.5 * z * z) * _INV_SQRT_2PI
    return np.where(np.isfinite(z), out, 0.0)


def clipped_gaussian_moments(mu, sigma, lo=-np.inf, hi=np.inf):
    """Mean and variance of ``clip(X, lo, hi)`` for ``X ~ N(mu, sigma²)`` (element-wise).

    ``lo``/``hi`` may be infinite; ``sigma = 0`` gives the deterministic ``clip(mu)``."""
    mu = np.asarray(mu, dtype=np.float64)
    sigma = np.abs(np.asarray(sigma, dtype=np.float64))
    mu, sigma = np.broadcast_arrays(mu, sigma)
    lo = float(lo)
    hi = float(hi)
    if lo > hi:
        raise ValueError(f"clip bounds lo={lo} > hi={hi}")
    det = sigma == 0
    s = np.where(det, 1.0, sigma)
    with np.errstate(invalid="ignore", divide="ignore"):
        a = (lo - mu) / s
        b = (hi - mu) / s
    pa, pb = ndtr(a), ndtr(b)
    fa, fb = _phi(a), _phi(b)
    mid = pb - pa
    lo_term = lo * pa if math.isfinite(lo) else 0.0
    hi_term = hi * (1.0 - pb) if math.isfinite(hi) else 0.0
    lo_sq = lo * lo * pa if math.isfinite(lo) else 0.0
    hi_sq = hi * hi * (1.0 - pb) if math.isfinite(hi) else 0.0
    afa = a * fa if math.isfinite(lo) else 0.0
    bfb = b * fb if math.isfinite(hi) else 0.0
    mean = lo_term + hi_term + mu * mid + s * (fa - fb)
    second = lo_sq + hi_sq + (mu * mu + s * s) * mid + 2.0 * mu * s * (fa - fb) + s * s * (afa - bfb)
    var = np.maximum(second - mean * mean, 0.0)
    clipped = np.clip(mu, lo, hi)
    mean = np.where(det, clipped, mean)
    var = np.where(det, 0.0, var)
    return mean, var


def rectified_gaussian_moments(mu, sigma):
    """Mean and variance of ``max(X, 0)`` for ``X ~ N(mu, sigma²)``."""
    return clipped_gaussian_moments(mu, sigma, 0.0, np.inf)


def expected_abs_gaussian(mu, sigma):
    """``E|X|`` for ``X ~ N(mu, sigma²)`` (element-wise): the folded normal mean."""
    mu = np.asarray(mu, dtype=np.float64)
    sigma = np.abs(np.asarray(sigma, dtype=np.float64))
    det = sigma == 0
    s = np.where(det, 1.0, sigma)
    z = mu / s
    val = s * math.sqrt(2.0 / math.pi) * np.exp(-0.5 * z * z) + mu * (1.0 - 2.0 * ndtr(-z))
    return np.where(det, np.abs(mu), val)


def birthday_expectation(K: float, n: int) -> float:
    """``1 - K(1 - (1 - 1/K)^n)/n``: the expected pruning ratio of ``n`` uniform draws among ``K``.

    Computed as ``(1/n) Σ_{i=1}^{n-1} -expm1(i·log1p(-1/K))`` (identical value, no
    cancellation). ``K = 1`` gives ``1 - 1/n``; ``n = 1`` gives 0."""
    K = float(K)
    n = int(n)
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if not K >= 1:
        raise ValueError(f"K must be >= 1, got {K}")
    if n == 1:
        return 0.0
    i = np.arange(1, n, dtype=np.float64)
    if K == 1.0:
        return (n - 1) / n
    terms = -np.expm1(i * math.log1p(-1.0 / K))
    return float(terms.sum() / n)


def compose_bound(e, g):
    """``(Π (e_l + g_l) - Π g_l, Σ_l e_l Π_{k≠l} g_k)``: the bound and its first-order term.

    The difference is accumulated by ``D ← (g + e)·D + e·P``, ``P ← g·P`` (no cancellation)."""
    e = [float(x) for x in e]
    g = [float(x) for x in g]
    if len(e) != len(g):
        raise ValueError("e and g must have the same length")
    d, p = 0.0, 1.0
    for ek, gk in zip(e, g):
        d = (gk + ek) * d + ek * p
        p = gk * p
    first = 0.0
    for l, el in enumerate(e):
        if el == 0.0:
            continue
        prod = 1.0
        for k, gk in enumerate(g):
            if k != l:
                prod *= gk
        first += el * prod
    return d, first


def verdict(ratio: Optional[float]) -> str:
    """The criterion on ``U / E[norm]`` (thresholds :data:`HARMLESS_BELOW`, :data:`HARMFUL_FROM`)."""
    if ratio is None or not math.isfinite(ratio):
        return "unknown"
    if ratio < 0:
        return "unknown (negative U: not a bound)"
    if ratio < HARMLESS_BELOW:
        return "harmless (U/E[norm] << 1)"
    if ratio < HARMFUL_FROM:
        return "uncertain"
    return "likely harmful"


# --------------------------------------------------------------------------- graph helpers

def _attr(node: onnx.NodeProto, name: str, default=None):
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def _load(model) -> onnx.ModelProto:
    if isinstance(model, onnx.ModelProto):
        return model
    if isinstance(model, (bytes, bytearray)):
        return onnx.load_from_string(bytes(model))
    return onnx.load(os.fspath(model))


def _describe(model) -> str:
    if isinstance(model, (str, os.PathLike)):
        return os.fspath(model)
    if isinstance(model, onnx.ModelProto):
        return model.graph.name or "<ModelProto>"
    return f"<{type(model).__name__}>"


def _following_bn(model: onnx.ModelProto, output: str):
    """The BatchNormalization node whose input X is ``output``, or None."""
    for node in model.graph.node:
        if node.op_type == "BatchNormalization" and node.input and node.input[0] == output:
            return node
    return None


# --------------------------------------------------------------------------- per layer

@dataclasses.dataclass
class LayerTheory:
    """One row: a Conv/Gemm/MatMul with a constant weight (``hashed`` says if it was hashed)."""

    name: str
    op_type: str
    weight: str
    shape: tuple
    hashed: bool
    fan_in: int
    n_out: int                       # n_l
    n_in: int                        # n_{l-1} (per group for a grouped Conv)
    kernel: tuple                    # (h, w); (1, 1) for Gemm/MatMul
    u_l: float
    u_source: str                    # "kde bound min(A, B)" | "max |w - w~|" | "unchanged" | "not hashed"
    bn: Optional[str]
    bn_mu: Optional[float]
    bn_sigma: Optional[float]
    act_factor: float
    e_l: float
    gain: dict                       # variant -> g_l
    distinct_after: Optional[int] = None
    E_m: Optional[float] = None
    E_s: Optional[float] = None
    measured_merge: Optional[float] = None
    measured_split: Optional[float] = None
    notes: list = dataclasses.field(default_factory=list)
    macs: Optional[int] = None       # one sample (``scan_layers``); None: an output shape is unknown

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["shape"] = list(self.shape)
        d["kernel"] = list(self.kernel)
        return _clean(d)


def _dims(op_type: str, shape: tuple, trans_b: bool):
    """(fan_in, n_out, n_in, (h, w)) of a layer's weight."""
    if op_type == "Conv":
        h = int(shape[2]) if len(shape) > 2 else 1
        w = int(np.prod(shape[3:])) if len(shape) > 3 else 1
        return int(np.prod(shape[1:])), int(shape[0]), int(shape[1]), (h, w)
    if op_type == "Gemm" and trans_b:
        return int(shape[1]), int(shape[0]), int(shape[1]), (1, 1)
    return int(shape[0]), int(shape[1]), int(shape[0]), (1, 1)


def _filters(op_type: str, w: np.ndarray, trans_b: bool) -> np.ndarray:
    """The weight as ``[n_l, n_{l-1}, h·w]``."""
    if op_type == "Conv":
        return w.reshape(w.shape[0], w.shape[1], -1)
    if op_type == "Gemm" and trans_b:
        return w[:, :, None]
    return w.T[:, :, None]


def _measured_ratios(op_type: str, w: np.ndarray, trans_b: bool):
    f = _filters(op_type, np.asarray(w), trans_b)
    n = f.shape[0]
    merge = 1.0 - np.unique(f.reshape(n, -1), axis=0).shape[0] / n
    split = 1.0 - float(np.mean([np.unique(f[:, j, :], axis=0).shape[0] for j in range(f.shape[1])])) / n
    return float(merge), float(split)


def layer_theory(model: onnx.ModelProto, hash_layers=(), hashed_model: Optional[onnx.ModelProto] = None
                 ) -> list:
    """:class:`LayerTheory` rows for every Conv/Gemm/MatMul with a constant weight of ``model``.

    ``hash_layers``: the ``LayerHash`` rows of a hash pass on ``model`` (``HashPassResult.layers``);
    ``hashed_model``: its output (for ``max |w - w~|`` fallbacks and the measured ratios)."""
    scan = scan_layers(model, include_grouped=True)
    by_node = {h.name: h for h in hash_layers}
    consts = ConstantTensors(model)
    hconsts = ConstantTensors(hashed_model) if hashed_model is not None else None
    names = node_names(model)
    node_by_name = {names[i]: n for i, n in enumerate(model.graph.node)}
    rows = []
    for layer in scan.layers:
        node = node_by_name[layer.node]
        fan_in, n_out, n_in, hw = _dims(layer.op_type, layer.weight_shape, layer.trans_b)
        h = by_node.get(layer.node)
        notes = []
        hashed = h is not None and h.method != "unchanged"
        w_new = None
        if hconsts is not None and layer.weight in hconsts:
            w_new = hconsts.array(layer.weight)
        if h is None:
            u, src = 0.0, "not hashed"
        elif h.method == "unchanged":
            u, src = 0.0, "unchanged"
            notes.extend(h.reasons)
        elif h.u_l is not None:
            u, src = float(h.u_l), "kde bound min(A, B)"
        elif w_new is not None:
            u = float(np.max(np.abs(consts.array(layer.weight).astype(np.float64) - w_new)))
            src = "max |w - w~|"
        else:
            u, src = float("nan"), "unknown"
            notes.append("no per-weight bound and no hashed weights to measure one")
        bn = _following_bn(model, node.output[0])
        mu = sig = None
        gains = {v: 1.0 for v in VARIANTS}
        if bn is not None and len(bn.input) >= 3 and bn.input[1] in consts and bn.input[2] in consts:
            gamma = consts.array(bn.input[1]).astype(np.float64).ravel()
            beta = consts.array(bn.input[2]).astype(np.float64).ravel()
            mu, sig = float(beta.mean()), float(np.abs(gamma).mean())
            gains = {"paper": mu, "magnitude": float(expected_abs_gaussian(beta, gamma).mean())}
        elif bn is not None:
            notes.append(f"BatchNormalization {bn.name} has non-constant scale/bias: ignored")
            bn = None
        act = activation_factor(mu, sig)
        e = u / math.sqrt(fan_in) * act if math.isfinite(u) else float("nan")
        row = LayerTheory(layer.node, layer.op_type, layer.weight, tuple(layer.weight_shape), hashed,
                          fan_in, n_out, n_in, hw, u, src, bn.name if bn is not None else None, mu, sig,
                          act, e, gains, notes=notes, macs=layer.macs)
        if h is not None:
            row.distinct_after = int(h.distinct_after)
            m_plus = max(int(h.distinct_after), 1)
            row.E_m = birthday_expectation(hw[0] * hw[1] * n_in * m_plus, n_out)
            row.E_s = birthday_expectation(hw[0] * hw[1] * m_plus, n_out)
            if w_new is not None:
                row.measured_merge, row.measured_split = _measured_ratios(layer.op_type, w_new, layer.trans_b)
        rows.append(row)
    return rows


# --------------------------------------------------------------------------- E[norm]

@dataclasses.dataclass
class _Stat:
    mean: np.ndarray   # per channel (axis 1), float64
    var: np.ndarray
    rank: int          # 4 (NCHW-like) or 2 ([N, F])
    pooled: bool       # every axis after the channel axis has size 1 (or rank 2)
    last: bool = False  # features on the LAST axis of a rank >= 3 tensor ([N, S, D] tokens, after a
    #                     LayerNormalization): the leading axes are samples; followed only by LAST_OK ops


@dataclasses.dataclass
class LogitEstimate:
    """Data-free statistics of the first graph output (``None`` fields with a ``reason``)."""

    output: str
    mean: Optional[np.ndarray] = None
    var: Optional[np.ndarray] = None
    reason: Optional[str] = None
    approximations: list = dataclasses.field(default_factory=list)

    @property
    def E_norm(self) -> Optional[float]:
        return None if self.mean is None else float(np.linalg.norm(self.mean))

    @property
    def V_norm(self) -> Optional[float]:
        return None if self.var is None else float(math.sqrt(float(np.sum(self.var))))


class _Untracked(Exception):
    pass


class _Walker:
    """Per-channel (mean, var) propagation; see the module docstring for the rules."""

    PASS = ("Identity", "Dropout")
    LAST_OK = ("Identity", "Dropout", "MatMul", "Add", "Sub", "Mul", "Div", "Relu", "Clip", "LayerNormalization")
    """Ops that follow statistics of features on the last axis (with _ELEMENTWISE)."""
    POOL = ("MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool", "LpPool")

    def __init__(self, model: onnx.ModelProto, input_stats: Optional[str] = None):
        self.model = model
        self.consts = ConstantTensors(model)
        self.shapes = static_shapes(model)
        self.names = node_names(model)
        self.producer = {o: n for n in model.graph.node for o in n.output}
        self.state: dict = {}  # tensor -> _Stat | str (the reason it is untracked)
        self.approx: list = []
        self.assumed = input_stats == "standard"
        inits = {t.name for t in model.graph.initializer}
        for inp in model.graph.input:
            if inp.name in inits:
                continue
            self.state[inp.name] = (f"graph input {inp.name!r} has no known statistics (no BatchNormalization "
                                    "on the path; --input-stats standard assumes standardized inputs)")
            dims = inp.type.tensor_type.shape.dim if inp.type.HasField("tensor_type") else []
            if (self.assumed and inp.type.tensor_type.elem_type in FLOAT_TYPES and len(dims) >= 2
                    and dims[1].HasField("dim_value")):
                c = dims[1].dim_value
                rank = len(dims)
                self.state[inp.name] = _Stat(np.zeros(c), np.ones(c), rank, rank == 2 or all(
                    d.HasField("dim_value") and d.dim_value == 1 for d in dims[2:]))
                self.note(f"input {inp.name!r} is standardized: every element N(0, 1), independent "
                          "(--input-stats standard)")

    def const(self, name: str) -> Optional[np.ndarray]:
        if name and name in self.consts:
            return self.consts.floats(name)
        return None

    def get(self, name: str) -> _Stat:
        s = self.state.get(name)
        if isinstance(s, _Stat):
            return s
        raise _Untracked(s or f"tensor {name!r} has no known statistics")

    def pooled(self, name: str, rank: int, default: bool) -> bool:
        shape = self.shapes.get(name)
        if shape is None:
            return default
        return rank == 2 or all(d == 1 for d in shape[2:])

    def note(self, text: str):
        if text not in self.approx:
            self.approx.append(text)

    def run(self) -> LogitEstimate:
        for i, node in enumerate(self.model.graph.node):
            if node.op_type == "Constant":
                continue
            label = f"{node.op_type} node {self.names[i]!r}"
            try:
                outs = self.step(node, label)
            except _Untracked as exc:
                reason = str(exc)
                for o in node.output:
                    self.state[o] = reason
                continue
            except Exception as exc:  # noqa: BLE001 - never crash: the walk only informs
                reason = f"{label}: statistics walk failed ({type(exc).__name__}: {exc})"
                for o in node.output:
                    self.state[o] = reason
                continue
            for o, s in zip(node.output, outs):
                self.state[o] = s
        out = self.model.graph.output[0].name
        s = self.state.get(out)
        est = LogitEstimate(out, approximations=list(self.approx))
        if isinstance(s, _Stat):
            est.mean, est.var = s.mean.copy(), s.var.copy()
        else:
            if s is None:
                s = f"output {out!r} is not computed by a node the walk visited"
            est.reason = f"the logits depend on: {s}"
        return est

    # -- one node -> list of output _Stat (raises _Untracked)
    def step(self, node: onnx.NodeProto, label: str) -> list:
        op = node.op_type
        if node.domain not in ("", "ai.onnx"):
            raise _Untracked(f"{label} (domain {node.domain}) is not supported by the statistics walk")
        if op not in self.LAST_OK and op not in _ELEMENTWISE and any(
                isinstance(self.state.get(x), _Stat) and self.state[x].last for x in node.input if x):
            raise _Untracked(f"{label}: features on the last axis (after a LayerNormalization) are followed only "
                             "through MatMul, elementwise ops and per-feature constants")
        if op == "LayerNormalization":
            return [self.layer_norm(node, label)]
        if op == "BatchNormalization":
            gamma, beta = self.const(node.input[1]), self.const(node.input[2])
            if gamma is None or beta is None:
                raise _Untracked(f"{label} has non-constant scale/bias")
            mean = beta.astype(np.float64).ravel()
            var = gamma.astype(np.float64).ravel() ** 2
            running = self.const(node.input[4]) if len(node.input) > 4 else None
            if running is not None and running.size in (1, var.size):
                # an input whose variance is the running one leaves the normalisation with variance
                # rv / (rv + ε), not 1: a channel dead in training (rv ≈ 0) is the constant β
                rv = np.maximum(running.astype(np.float64).ravel(), 0.0)
                eps = float(_attr(node, "epsilon") if _attr(node, "epsilon") is not None else 1e-5)
                var = var * (rv / (rv + eps))
            shape = self.shapes.get(node.output[0])
            rank = len(shape) if shape else 4
            return [_Stat(mean, var, rank, self.pooled(node.output[0], rank, False))]
        if op in self.PASS:
            return [self.get(node.input[0])]
        if op == "Relu":
            s = self.get(node.input[0])
            m, v = rectified_gaussian_moments(s.mean, np.sqrt(s.var))
            return [dataclasses.replace(s, mean=m, var=v)]
        if op == "Clip":
            s = self.get(node.input[0])
            lo, hi = -np.inf, np.inf
            if len(node.input) > 1 or not node.attribute:
                for k, name in ((1, "lo"), (2, "hi")):
                    if len(node.input) > k and node.input[k]:
                        c = self.const(node.input[k])
                        if c is None:
                            raise _Untracked(f"{label}: its {name} bound is not a constant")
                        if k == 1:
                            lo = float(c)
                        else:
                            hi = float(c)
            if _attr(node, "min") is not None:
                lo = float(_attr(node, "min"))
            if _attr(node, "max") is not None:
                hi = float(_attr(node, "max"))
            m, v = clipped_gaussian_moments(s.mean, np.sqrt(s.var), lo, hi)
            return [dataclasses.replace(s, mean=m, var=v)]
        if op in ("Add", "Sub", "Mul", "Div"):
            return [self.binary(node, label)]
        if op in self.POOL:
            s = self.get(node.input[0])
            if op in ("MaxPool", "GlobalMaxPool", "LpPool"):
                self.note(f"{op}: the per-channel mean is kept (an under-estimate of a maximum)")
            pooled = op.startswith("Global") or self.pooled(node.output[0], s.rank, s.pooled)
            return [_Stat(s.mean, s.var, s.rank, pooled)] + [None] * (len(node.output) - 1)
        if op in ("ReduceMean", "ReduceMax"):
            return [self.reduce_spatial(node, label)]
        if op in _ELEMENTWISE:
            if op == "HardSigmoid" and float(_attr(node, "beta", 0.5)) != 0.5:
                raise _Untracked(f"{label}: HardSigmoid with beta != 0.5")
            return [self.elementwise(node, label)]
        if op == "Slice":
            return [self.slice(node, label)]
        if op == "Pad":
            return [self.pad(node, label)]
        if op in ("Flatten", "Reshape", "Squeeze"):
            return [self.flatten(node, label)]
        if op in ("Gemm", "MatMul"):
            return [self.linear(node, label)]
        if op == "Conv":
            return [self.conv(node, label)]
        raise _Untracked(f"{label}: op {op} is not supported by the statistics walk")

    def binary(self, node, label) -> _Stat:
        op = node.op_type
        a_name, b_name = node.input[0], node.input[1]
        ca, cb = self.const(a_name), self.const(b_name)
        if ca is None and cb is None:
            if op == "Mul":  # x * g(x): a gated activation written out (erf GELU, SiLU / Swish, x * x)
                gated = self.gated(a_name, b_name) or self.gated(b_name, a_name)
                if gated is not None:
                    return gated
            a, b = self.get(a_name), self.get(b_name)
            if op in ("Mul", "Div"):
                raise _Untracked(f"{label}: {op} of two activations is not supported by the statistics walk")
            if a.rank != b.rank or a.last != b.last:
                raise _Untracked(f"{label}: operands of ranks {a.rank} and {b.rank}"
                                 + (" (features on different axes)" if a.last != b.last else ""))
            if a.mean.size != b.mean.size and 1 not in (a.mean.size, b.mean.size):
                raise _Untracked(f"{label}: operands with {a.mean.size} and {b.mean.size} channels")
            mean = a.mean + b.mean if op == "Add" else a.mean - b.mean
            return _Stat(mean, a.var + b.var, a.rank, a.pooled and b.pooled, a.last)
        if ca is not None and cb is not None:
            raise _Untracked(f"{label}: constant expression (not folded)")
        s = self.get(b_name if ca is not None else a_name)
        c = ca if ca is not None else cb
        c = self.per_channel(c, s, label)
        if op == "Add":
            return dataclasses.replace(s, mean=s.mean + c)
        if op == "Sub":
            return dataclasses.replace(s, mean=c - s.mean if ca is not None else s.mean - c)
        if op == "Mul":
            return dataclasses.replace(s, mean=s.mean * c, var=s.var * c * c)
        if ca is not None:
            raise _Untracked(f"{label}: division by an activation is not supported")
        return dataclasses.replace(s, mean=s.mean / c, var=s.var / (c * c))

    GATE_UNARY = {"Erf": erf, "Tanh": np.tanh, "Sigmoid": lambda z: _sigmoid(z), "Relu": lambda z: np.maximum(z, 0.0),
                  "Abs": np.abs, "Neg": np.negative, "Identity": lambda z: z}
    """Unary ops a gate ``g(x)`` of ``x * g(x)`` may be written with (besides constant arithmetic)."""

    def gate(self, name: str, root: str, s: _Stat, depth: int = 0):
        """``g`` with ``name = g(root)`` elementwise, as a function of ``z`` (``[channels, points]``), when
        ``name`` is computed from ``root`` alone through :data:`GATE_UNARY` ops and arithmetic with scalar
        or per-channel constants; None otherwise."""
        if name == root:
            return lambda z: z
        node = self.producer.get(name)
        if node is None or depth > 12 or node.domain not in ("", "ai.onnx"):
            return None
        live = [x for x in node.input if x and self.const(x) is None]
        if len(live) != 1:
            return None
        inner = self.gate(live[0], root, s, depth + 1)
        if inner is None:
            return None
        op = node.op_type
        if op in self.GATE_UNARY:
            f = self.GATE_UNARY[op]
            return lambda z: f(inner(z))
        if op in _ELEMENTWISE and op != "HardSigmoid":
            f, alpha = _ELEMENTWISE[op], _attr(node, "alpha", None)
            return (lambda z: f(inner(z))) if alpha is None else (lambda z: f(inner(z), float(alpha)))
        if op in ("Add", "Sub", "Mul", "Div", "Pow") and len(node.input) == 2:
            k = 1 if node.input[0] == live[0] else 0
            try:
                c = self.per_channel(self.const(node.input[k]), s, op)[:, None]
            except _Untracked:
                return None
            left = k == 1  # the live operand first
            fn = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Div": np.divide, "Pow": np.power}[op]
            return (lambda z: fn(inner(z), c)) if left else (lambda z: fn(c, inner(z)))
        return None

    def gated(self, x_name: str, g_name: str) -> Optional[_Stat]:
        """``x * g(x)`` with ``x`` tracked: its moments by Gauss-Hermite quadrature of ``z g(z)``."""
        s = self.state.get(x_name)
        if not isinstance(s, _Stat):
            return None
        g = self.gate(g_name, x_name, s)
        if g is None:
            return None
        x, wq = _HERMITE
        z = s.mean[:, None] + np.sqrt(np.maximum(s.var, 0.0))[:, None] * x[None, :]
        with np.errstate(all="ignore"):
            fz = z * np.broadcast_to(g(z), z.shape)
        if not np.all(np.isfinite(fz)):
            return None
        m = fz @ wq
        self.note("x * g(x) (a gated activation written out, e.g. erf GELU or SiLU): moments by quadrature")
        return dataclasses.replace(s, mean=m, var=np.maximum((fz * fz) @ wq - m * m, 0.0))

    def per_channel(self, c: np.ndarray, s: _Stat, label: str) -> np.ndarray:
        """A constant operand as a per-channel vector (scalar or broadcast along axis 1 only)."""
        c = np.asarray(c, dtype=np.float64)
        if c.size == 1:
            return np.full(s.mean.shape, float(c.ravel()[0]))
        if s.last:  # features on the last axis: a constant of shape [..., D], every other axis 1
            if c.shape[-1] != s.mean.size or c.size != s.mean.size:
                raise _Untracked(f"{label}: constant of shape {list(c.shape)} is not per-feature")
            return c.ravel()
        shape = (1,) * (s.rank - c.ndim) + c.shape
        if len(shape) != s.rank or any(d != 1 for k, d in enumerate(shape) if k != 1):
            raise _Untracked(f"{label}: constant of shape {list(c.shape)} is not per-channel")
        if shape[1] != s.mean.size:
            raise _Untracked(f"{label}: constant with {shape[1]} channels for {s.mean.size}")
        return c.ravel()

    def axes_input(self, node, k, label):
        if len(node.input) > k and node.input[k]:
            c = self.const(node.input[k])
            if c is None:
                raise _Untracked(f"{label}: input {k} is not a constant")
            return [int(x) for x in np.asarray(c).ravel()]
        return None

    def slice(self, node, label) -> _Stat:
        s = self.get(node.input[0])
        starts = self.axes_input(node, 1, label)
        ends = self.axes_input(node, 2, label)
        axes = self.axes_input(node, 3, label)
        steps = self.axes_input(node, 4, label)
        if starts is None or ends is None:
            raise _Untracked(f"{label}: needs constant starts/ends")
        axes = axes if axes is not None else list(range(len(starts)))
        steps = steps if steps is not None else [1] * len(starts)
        mean, var = s.mean, s.var
        for st, en, ax, sp in zip(starts, ends, axes, steps):
            ax = ax + s.rank if ax < 0 else ax
            if ax == 0:
                continue
            if ax == 1:
                sl = slice(*slice(st, en, sp).indices(mean.size))
                mean, var = mean[sl], var[sl]
            elif s.rank == 2:
                raise _Untracked(f"{label}: slices axis {ax} of a rank-2 tensor")
        pooled = self.pooled(node.output[0], s.rank, s.pooled)
        return _Stat(mean, var, s.rank, pooled)

    def pad(self, node, label) -> _Stat:
        s = self.get(node.input[0])
        mode = _attr(node, "mode", b"constant")
        mode = mode.decode() if isinstance(mode, bytes) else mode
        pads = self.axes_input(node, 1, label) if len(node.input) > 1 else _attr(node, "pads")
        if pads is None:
            raise _Untracked(f"{label}: needs constant pads")
        axes = self.axes_input(node, 3, label)
        axes = [a + s.rank if a < 0 else a for a in axes] if axes is not None else list(range(s.rank))
        n = len(axes)
        value = 0.0
        if len(node.input) > 2 and node.input[2]:
            c = self.const(node.input[2])
            if c is None:
                raise _Untracked(f"{label}: non-constant pad value")
            value = float(np.asarray(c).ravel()[0]) if np.asarray(c).size else 0.0
        elif _attr(node, "value") is not None:
            value = float(_attr(node, "value"))
        mean, var = s.mean, s.var
        for k, ax in enumerate(axes):
            before, after = int(pads[k]), int(pads[k + n])
            if ax == 1 and (before or after):
                if mode != "constant":
                    raise _Untracked(f"{label}: {mode} padding on the channel axis")
                if before < 0 or after < 0:
                    mean, var = mean[max(-before, 0):mean.size - max(-after, 0)], var[max(-before, 0):var.size - max(-after, 0)]
                mean = np.concatenate([np.full(max(before, 0), value), mean, np.full(max(after, 0), value)])
                var = np.concatenate([np.zeros(max(before, 0)), var, np.zeros(max(after, 0))])
            elif ax >= 2 and (before or after):
                self.note("spatial padding: per-channel statistics kept (border positions ignored)")
        return _Stat(mean, var, s.rank, self.pooled(node.output[0], s.rank, s.pooled))

    def reduce_spatial(self, node, label) -> _Stat:
        """``ReduceMean`` / ``ReduceMax`` over every spatial axis (``x.mean((2, 3))``): a global
        pool, with ``keepdims=0`` also the flatten to ``[N, C]``."""
        s = self.get(node.input[0])
        if len(node.input) > 1 and node.input[1]:
            axes = self.const(node.input[1])
            if axes is None:
                raise _Untracked(f"{label}: computed axes")
            axes = [int(a) for a in np.ravel(axes)]
        else:
            axes = _attr(node, "axes")
        if not axes:
            raise _Untracked(f"{label}: reduces every axis")
        axes = sorted(a + s.rank if a < 0 else a for a in axes)
        if s.rank < 3 or axes != list(range(2, s.rank)):
            raise _Untracked(f"{label}: reduces axes {axes}, not exactly the spatial axes of a rank-{s.rank} tensor")
        if node.op_type == "ReduceMax":
            self.note("ReduceMax: the per-channel mean is kept (an under-estimate of a maximum)")
        return _Stat(s.mean, s.var, s.rank if int(_attr(node, "keepdims", 1)) else 2, True)

    def flatten(self, node, label) -> _Stat:
        s = self.get(node.input[0])
        op = node.op_type
        out_shape = self.shapes.get(node.output[0])
        if op == "Flatten" and int(_attr(node, "axis", 1)) != 1:
            raise _Untracked(f"{label}: Flatten with axis != 1")
        if op != "Flatten":
            if out_shape is None or len(out_shape) != 2:
                raise _Untracked(f"{label}: {op} to a shape other than [N, F] (or unknown)")
        if s.rank == 2:
            return s
        if s.pooled:
            return _Stat(s.mean, s.var, 2, True)
        in_shape = self.shapes.get(node.input[0])
        if in_shape is None:
            raise _Untracked(f"{label}: flattens a spatial tensor of unknown shape")
        reps = int(np.prod(in_shape[2:]))
        return _Stat(np.repeat(s.mean, reps), np.repeat(s.var, reps), 2, True)

    def layer_norm(self, node, label) -> _Stat:
        """``LayerNormalization`` over the last axis: each normalized feature taken as N(0, 1) over the
        tokens (the per-feature counterpart of a BatchNorm's assumption), so the output feature ``d`` is
        ``N(bias_d, scale_d²)``, whatever the input's statistics."""
        shape = self.shapes.get(node.input[0])
        axis = int(_attr(node, "axis", -1))
        if shape is None or len(shape) < 2:
            raise _Untracked(f"{label}: input of unknown rank")
        if axis % len(shape) != len(shape) - 1:
            raise _Untracked(f"{label}: normalizes from axis {axis}, not the last axis only")
        scale = self.const(node.input[1])
        bias = self.const(node.input[2]) if len(node.input) > 2 and node.input[2] else None
        d = shape[-1] if isinstance(shape[-1], int) else (scale.size if scale is not None else None)
        if scale is None or (bias is None and len(node.input) > 2 and node.input[2]) or not isinstance(d, int):
            raise _Untracked(f"{label}: non-constant scale/bias or unknown width")
        scale = np.broadcast_to(np.asarray(scale, np.float64).ravel(), (d,))
        bias = np.zeros(d) if bias is None else np.broadcast_to(np.asarray(bias, np.float64).ravel(), (d,))
        self.note("LayerNormalization: each normalized feature taken as N(0, 1) over the tokens")
        rank = len(shape)
        return _Stat(bias.copy(), scale * scale, rank, rank == 2, rank > 2)

    def linear(self, node, label) -> _Stat:
        s = self.get(node.input[0])
        if s.last:  # [..., D] @ W[D, F]: features stay on the last axis
            w = self.const(node.input[1])
            if node.op_type != "MatMul" or w is None or w.ndim != 2 or w.shape[0] != s.mean.size:
                raise _Untracked(f"{label}: weight is not a constant [{s.mean.size}, F] matrix")
            w = w.astype(np.float64)
            return _Stat(s.mean @ w, s.var @ (w * w), s.rank, False, True)
        if s.rank != 2:
            raise _Untracked(f"{label}: input of rank {s.rank} (only [N, F] is tracked)")
        w = self.const(node.input[1])
        if w is None or w.ndim != 2:
            raise _Untracked(f"{label}: weight is not a constant matrix")
        w = w.astype(np.float64)
        if node.op_type == "Gemm":
            if int(_attr(node, "transA", 0)):
                raise _Untracked(f"{label}: transA=1")
            if int(_attr(node, "transB", 0)):
                w = w.T
            alpha, beta = float(_attr(node, "alpha", 1.0)), float(_attr(node, "beta", 1.0))
        else:
            alpha, beta = 1.0, 0.0
        if w.shape[0] != s.mean.size:
            raise _Untracked(f"{label}: weight expects {w.shape[0]} features, statistics have {s.mean.size}")
        mean = alpha * (s.mean @ w)
        var = alpha * alpha * (s.var @ (w * w))
        if node.op_type == "Gemm" and len(node.input) > 2 and node.input[2]:
            c = self.const(node.input[2])
            if c is None:
                raise _Untracked(f"{label}: non-constant bias")
            mean = mean + beta * np.broadcast_to(np.asarray(c, dtype=np.float64).ravel(), mean.shape)
        return _Stat(mean, var, 2, True)

    def conv(self, node, label) -> _Stat:
        s = self.get(node.input[0])  # untracked input: its own reason propagates
        if not s.pooled and not self.assumed:
            # Not an error: a BatchNormalization after it restores known statistics.
            raise _Untracked(f"{label}: output statistics not tracked (Conv on a spatial tensor; only a "
                             f"following BatchNormalization restores them, or --input-stats standard)")
        w = self.const(node.input[1])
        if w is None:
            raise _Untracked(f"{label}: weight is not a constant")
        if any(k != 1 for k in w.shape[2:]):
            if s.pooled:
                raise _Untracked(f"{label}: kernel {list(w.shape[2:])} on a pooled tensor (only 1x1)")
            self.note("Conv on spatial tensors (--input-stats standard): positions treated as independent, "
                      "zero padding ignored")
        group = int(_attr(node, "group", 1))
        w = w.reshape(w.shape[0], w.shape[1], -1).astype(np.float64)
        w, w2 = w.sum(axis=2), (w * w).sum(axis=2)  # per (out, in) channel pair: the taps add up
        cout, cin_g = w.shape
        if cin_g * group != s.mean.size:
            raise _Untracked(f"{label}: weight expects {cin_g * group} channels, statistics have {s.mean.size}")
        og = cout // group
        mean, var = np.empty(cout), np.empty(cout)
        for g in range(group):
            rows = slice(g * og, (g + 1) * og)
            mean[rows] = w[rows] @ s.mean[g * cin_g:(g + 1) * cin_g]
            var[rows] = w2[rows] @ s.var[g * cin_g:(g + 1) * cin_g]
        if len(node.input) > 2 and node.input[2]:
            b = self.const(node.input[2])
            if b is None:
                raise _Untracked(f"{label}: non-constant bias")
            mean = mean + np.asarray(b, dtype=np.float64).ravel()
        return _Stat(mean, var, s.rank, self.pooled(node.output[0], s.rank, s.pooled))

    def elementwise(self, node, label) -> _Stat:
        """Moments of ``f(X)``, ``X ~ N(mean, var)`` per channel, by Gauss-Hermite quadrature."""
        s = self.get(node.input[0])
        f = _ELEMENTWISE[node.op_type]
        alpha = _attr(node, "alpha", None)
        x, wq = _HERMITE
        z = s.mean[:, None] + np.sqrt(np.maximum(s.var, 0.0))[:, None] * x[None, :]
        fz = f(z) if alpha is None else f(z, float(alpha))
        m = fz @ wq
        v = np.maximum((fz * fz) @ wq - m * m, 0.0)
        return dataclasses.replace(s, mean=m, var=v)


def moment_state(model: onnx.ModelProto, input_stats: Optional[str] = "standard") -> dict:
    """Per tensor, the moment walk's per-channel statistics (``_Stat``: ``mean``, ``var``) or the
    reason it has none (a string); {} when the walk cannot follow the graph at all. The one
    statistics engine of ``analyze``, the rate-distortion hashing and the channel reduction."""
    try:
        walker = _Walker(model, input_stats)
        walker.run()
        return walker.state
    except Exception:  # noqa: BLE001  a graph the moment walk cannot follow: statistics unknown (said per layer)
        return {}


def _sigmoid(z):
    return 0.5 * (1.0 + np.tanh(0.5 * z))


_ELEMENTWISE = {
    "Tanh": np.tanh,
    "Sigmoid": _sigmoid,
    "Gelu": lambda z: 0.5 * z * (1.0 + erf(z / math.sqrt(2.0))),
    "Softplus": lambda z: np.logaddexp(0.0, z),
    "Elu": lambda z, a=1.0: np.where(z > 0, z, a * np.expm1(np.minimum(z, 0.0))),
    "LeakyRelu": lambda z, a=0.01: np.where(z > 0, z, a * z),
    "HardSigmoid": lambda z, a=0.2: np.clip(a * z + 0.5, 0.0, 1.0),
    "HardSwish": lambda z: z * np.clip(z / 6.0 + 0.5, 0.0, 1.0),
}
"""Elementwise activations the walk follows by quadrature (``alpha``: the op's attribute; the
ONNX defaults are the functions' defaults, HardSigmoid's beta is taken as 0.5)."""

_HERMITE = (lambda xw: (xw[0] * math.sqrt(2.0), xw[1] / math.sqrt(math.pi)))(np.polynomial.hermite.hermgauss(64))
"""Nodes and weights for E[f(X)], X ~ N(0, 1): 64-point Gauss-Hermite."""


def expected_logits(model, input_stats: Optional[str] = None) -> LogitEstimate:
    """Data-free per-logit mean and variance of the first graph output (never raises on a graph).
    ``input_stats="standard"``: assume every input element N(0, 1), independent, where no
    BatchNormalization gives statistics (models whose BatchNorms the exporter folded)."""
    model = _load(model)
    if not model.graph.output:
        return LogitEstimate("", reason="the graph has no output")
    return _Walker(model, input_stats).run()


# --------------------------------------------------------------------------- measurement

@dataclasses.dataclass
class Measurement:
    """Measured with data (``redpp_onnx.evaluate.evaluate``, hashed vs original)."""

    dataset: str
    n: int
    E_X_f: float            # E_X ‖f‖ (original)
    E_X_f_hashed: float     # E_X ‖f̃‖
    E_X_diff: float         # E_X ‖f̃ - f‖
    top1: float             # original
    top1_hashed: float
    agreement: float
    tightness: dict = dataclasses.field(default_factory=dict)  # variant -> (U - E_X_diff) / U
    seconds: float = 0.0

    def to_dict(self) -> dict:
        return _clean(dataclasses.asdict(self))


def _tightness(u: Optional[float], diff: float) -> Optional[float]:
    if u is None or not math.isfinite(u) or u == 0:
        return None
    return (u - diff) / u


def measure(model, hashed_model, dataset, *, U=None, batch_size: int = 256,
            limit: Optional[int] = None) -> Measurement:
    """``E_X‖f‖``, ``E_X‖f̃ - f‖`` (and the tightness ``(U - E_X‖f̃-f‖)/U`` when ``U`` is given:
    a number or a ``{variant: U}`` dict). ``dataset``: a ``Dataset`` or an ``.npz`` path."""
    from ..evaluate import Dataset, evaluate, load_dataset

    if not isinstance(dataset, Dataset):
        dataset = load_dataset(dataset, limit=limit)
    res = evaluate(hashed_model, dataset, reference=model, batch_size=batch_size)
    m = Measurement(dataset.name, res.n, res.reference_mean_logit_norm, res.mean_logit_norm,
                    res.mean_logit_diff_norm, res.reference_top1, res.top1, res.agreement,
                    seconds=res.seconds)
    if U is not None:
        us = U if isinstance(U, dict) else {DEFAULT_VARIANT: U}
        m.tightness = {k: _tightness(v, m.E_X_diff) for k, v in us.items()}
    return m


# --------------------------------------------------------------------------- the report

def _clean(x):
    """JSON-safe: numpy scalars to Python, non-finite floats to None."""
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    if isinstance(x, np.ndarray):
        return _clean(x.tolist())
    if isinstance(x, (np.floating, float)):
        x = float(x)
        return x if math.isfinite(x) else None
    if isinstance(x, np.integer):
        return int(x)
    return x


@dataclasses.dataclass
class AnalysisReport:
    """What ``analyze`` found: per-layer terms, ``U`` (both variants), ``E[norm]``, the verdict."""

    model: str
    layers: list                      # LayerTheory, graph order
    U: dict                           # variant -> Π(e+g) - Π g
    U_first_order: dict               # variant -> Σ e_l Π_{k≠l} g_k
    default_variant: str
    E_norm: Optional[float]
    V_norm: Optional[float]
    E_norm_reason: Optional[str]
    E_norm_approximations: list
    hash_config: dict
    measured: Optional[Measurement] = None
    notes: list = dataclasses.field(default_factory=list)

    @property
    def U_default(self) -> Optional[float]:
        return self.U.get(self.default_variant)

    def ratio_for(self, variant: str) -> Optional[float]:
        u = self.U.get(variant)
        if u is None or self.E_norm is None or not self.E_norm > 0 or not math.isfinite(u):
            return None
        return u / self.E_norm

    @property
    def ratio(self) -> Optional[float]:
        return self.ratio_for(self.default_variant)

    @property
    def ratio_conservative(self) -> Optional[float]:
        """``U / (E[norm] - V[norm])`` (the paper's wider criterion), when ``E[norm] > V[norm]``."""
        u = self.U_default
        if u is None or self.E_norm is None or self.V_norm is None or not self.E_norm > self.V_norm:
            return None
        return u / (self.E_norm - self.V_norm)

    @property
    def verdict(self) -> str:
        if self.E_norm is None:
            return f"unknown (E[norm] unavailable: {self.E_norm_reason})"
        if not self.E_norm > 0:
            return "unknown (E[norm] = 0)"
        if self.U_default is None or not math.isfinite(self.U_default):
            return "unknown (U unavailable)"
        return verdict(self.ratio)

    def to_dict(self) -> dict:
        model = {
            "name": self.model,
            "U": dict(self.U),
            "U_first_order": dict(self.U_first_order),
            "default_variant": self.default_variant,
            "U_default": self.U_default,
            "E_norm": self.E_norm,
            "V_norm": self.V_norm,
            "E_norm_reason": self.E_norm_reason,
            "E_norm_approximations": list(self.E_norm_approximations),
            "ratio": self.ratio,
            "ratio_by_variant": {v: self.ratio_for(v) for v in self.U},
            "ratio_conservative": self.ratio_conservative,
            "verdict": self.verdict,
            "thresholds": {"harmless_below": HARMLESS_BELOW, "harmful_from": HARMFUL_FROM},
            "measured": self.measured.to_dict() if self.measured is not None else None,
        }
        return _clean({"model": model, "layers": [r.to_dict() for r in self.layers],
                       "hash_config": self.hash_config, "notes": list(self.notes)})

    def table(self) -> str:
        def f(x, fmt="{:.3g}"):
            return "-" if x is None or (isinstance(x, float) and not math.isfinite(x)) else fmt.format(x)

        head = (f"{'layer':<40} {'op':<6} {'fan_in':>6} {'u_l':>9} {'bn_mu':>8} {'bn_sig':>7} "
                f"{'e_l':>9} {'g_mag':>7} {'g_pap':>8} {'M+':>5} {'E_m':>8} {'E_s':>8} {'merge':>6} {'split':>6}")
        lines = [head, "-" * len(head)]
        for r in self.layers:
            name = r.name if len(r.name) <= 40 else "…" + r.name[-39:]
            if not r.hashed:
                name = (name + " *")[-40:]
            lines.append(
                f"{name:<40} {r.op_type:<6} {r.fan_in:>6} {f(r.u_l):>9} {f(r.bn_mu):>8} {f(r.bn_sigma):>7} "
                f"{f(r.e_l):>9} {f(r.gain.get('magnitude')):>7} {f(r.gain.get('paper')):>8} "
                f"{f(r.distinct_after, '{:d}'):>5} {f(r.E_m):>8} {f(r.E_s):>8} "
                f"{f(r.measured_merge, '{:.3f}'):>6} {f(r.measured_split, '{:.3f}'):>6}")
        if any(not r.hashed for r in self.layers):
            lines.append("(* not hashed: e_l = 0, enters U through its gain only)")
        lines.append("")
        if self.layers:
            unknown = sum(1 for r in self.layers if r.macs is None)
            macs = (f"{sum(r.macs for r in self.layers):,}" if not unknown else
                    f"unknown (the output shapes of {unknown} of {len(self.layers)} layers are not known; "
                    "give the sizes the model leaves dynamic with --input-shape NAME=D0,D1,...)")
            lines.append(f"MACs of these layers (1 sample): {macs}")
        for v in self.U:
            mark = " (default)" if v == self.default_variant else ""
            lines.append(f"U[{v}]{mark} = {f(self.U[v], '{:.4g}')}   first order {f(self.U_first_order[v], '{:.4g}')}"
                         f"   U/E[norm] = {f(self.ratio_for(v), '{:.4g}')}")
        if self.E_norm is None:
            lines.append(f"E[norm] unavailable: {self.E_norm_reason}")
        else:
            lines.append(f"E[norm] = {self.E_norm:.4g}   V[norm] = {f(self.V_norm, '{:.4g}')}"
                         f"   U/(E-V) = {f(self.ratio_conservative, '{:.4g}')}")
        lines.append(f"verdict: {self.verdict}")
        m = self.measured
        if m is not None:
            t = ", ".join(f"{k} {f(v, '{:.3g}')}" for k, v in m.tightness.items())
            lines.append(f"measured on {m.dataset} (n={m.n}): E_X‖f‖ = {m.E_X_f:.4g}, E_X‖f~-f‖ = {m.E_X_diff:.4g}, "
                         f"top-1 {m.top1:.2%} -> {m.top1_hashed:.2%}, agreement {m.agreement:.2%}; tightness: {t}")
        lines += [f"E[norm] assumes: {a}" for a in self.E_norm_approximations]
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines) + "\n"


def analyze_hashed(model, hash_result, *, hash_config: Optional[HashConfig] = None, data=None,
                   batch_size: int = 256, limit: Optional[int] = None,
                   input_stats: Optional[str] = None) -> AnalysisReport:
    """The report for an existing ``HashPassResult`` of ``model`` (no re-hashing)."""
    name = _describe(model)
    model = _load(model)
    rows = layer_theory(model, hash_result.layers, hash_result.model)
    notes = []
    U, U1 = {}, {}
    if any(not math.isfinite(r.e_l) for r in rows):
        notes.append("some layers have no per-weight bound: U unavailable")
        U = {v: None for v in VARIANTS}
        U1 = {v: None for v in VARIANTS}
    else:
        for v in VARIANTS:
            U[v], U1[v] = compose_bound([r.e_l for r in rows], [r.gain[v] for r in rows])
    if U.get("paper") is not None and U["paper"] < 0:
        notes.append("U[paper] is negative (a negative BN mean in the product): not an upper bound")
    est = expected_logits(model, input_stats)
    cfg = dataclasses.asdict(hash_config) if hash_config is not None else None
    report = AnalysisReport(name, rows, U, U1, DEFAULT_VARIANT, est.E_norm, est.V_norm, est.reason,
                            est.approximations, cfg, notes=notes)
    if data is not None:
        report.measured = measure(model, hash_result.model, data, U=dict(U), batch_size=batch_size, limit=limit)
        u = report.U_default
        if u is not None and math.isfinite(u) and report.measured.E_X_diff > u:
            report.notes.append(
                f"the bound does not hold on this model: measured E_X||f~-f|| = {report.measured.E_X_diff:.4g} "
                f"> U[{report.default_variant}] = {u:.4g}; do not rely on the data-free verdict here")
    return report


def analyze(model, hash_config: HashConfig = HashConfig(method="kde"), data=None, *, batch_size: int = 256,
            limit: Optional[int] = None, input_stats: Optional[str] = None) -> AnalysisReport:
    """Hash ``model`` (a path or ``ModelProto``; not modified) with ``hash_config`` and report the
    data-free guarantees; with ``data`` (an ``.npz`` path or a ``Dataset``) also measure
    ``E_X‖f‖``, ``E_X‖f̃ - f‖`` and the tightness (``limit``: first samples only)."""
    from ..passes.hash import HashPass

    name = _describe(model)
    proto = fold_constants(_load(model))  # e.g. a --codebook model's weights
    result = HashPass(hash_config).run(proto)
    report = analyze_hashed(proto, result, hash_config=hash_config, data=data, batch_size=batch_size, limit=limit,
                            input_stats=input_stats)
    report.model = name
    return report
