"""Rate-distortion KDE hashing: the fewest stored bits at a given output error, data-free.

The hash is RED++'s (``kde.py``): every weight becomes the mode of its KDE cell, exactly as
``hash_tensor(w, bandwidth_factor=f, nms_radius=τ)`` gives it. What this module chooses, per
eligible layer (``scan_layers`` defaults), is

* the **granularity**: one codebook per tensor, per output channel, or per group of ``2^k``
  output channels (channels sorted by RMS; a group or channel codebook holds at least
  ``MIN_CODEBOOK_WEIGHTS`` weights);
* each codebook's **bandwidth factor** ``f`` (``Δ = median gap × f``) and **NMS radius**
  (none, or ``NMS_BANDWIDTHS·Δ``), or to leave it as it is;

so as to minimise the model's stored bits under a predicted relative error of the logits.

Stored bits (counted like ``baselines.stored_bits``)
-----------------------------------------------------
A codebook of ``n`` weights with ``K`` values: ``16·K + 32`` table bits (int16 lattice indices
and a float32 step, ``passes/codebook.py``; ``32·K`` if the values are not on the KDE lattice)
plus ``n·H`` code bits, ``H`` the zeroth-order entropy of its codes (fixed-length:
``n·ceil(log2 K)``). Channel groups add the channel-to-group map, ``C·ceil(log2 G)`` bits. A
codebook left as it is costs 32 bits per weight.

Distortion
----------
``D_l = Σ_c a_c² · min_α Σ_i v_i (α·W̃_ci - W_ci)²``: the weight error weighted per output
channel by ``a_c = |γ_c|/sqrt(var_c + eps)`` of a BatchNormalization that is the layer's only
consumer (1 otherwise; an error in a channel the BatchNorm amplifies costs more), per input
position by the variance ``v_i`` of its input channel (moment walk of ``analysis.theory``,
normalised to mean 1), and measured after the best per-channel gain ``α`` (which the gain
correction below applies; ``α = 1`` without a following BatchNorm).

Sensitivity: each layer's response
----------------------------------
Layer ``l``'s predicted effect on the logits is a monotone curve ``E_l(D)`` (relative logit
energy, :class:`Response`), estimated data-free by one of three proxies (:func:`sensitivities`):

* ``"synthetic"`` (default): seeded standard-normal inputs; one layer at a time gets seeded
  Gaussian weight noise (``a_c``-scaled) at the relative levels ``SYNTHETIC_LEVELS``, is
  corrected like the final model, and the relative change of the logits' energy is measured
  at each level. Measuring at several levels matters: hashing errors of 20-60 % act far from
  linearly (a linear extrapolation from 5 % under-predicted the measured logit error by 3x);
* ``"bn"``: linear, the relative error power at the layer's BatchNorm output from BatchNorm
  statistics and the moment walk (gain 1 to the logits);
* ``"params"``: linear, every weight alike (the parameter-weighted mean relative error).

``benchmarks/bench_rd.py`` measures which predicts the measured logit error and top-1 drop best
(Spearman over single-layer and whole-model settings); ``"synthetic"`` wins on every shared
model, so it is the default.

Allocation
----------
Two Lagrangians. Within a layer, for each multiplier of ``INNER_LAMBDAS`` every codebook takes
the candidate minimising ``bits + λ·D`` and the layer the granularity with the least total:
the layer's (bits, ``D``) frontier. Across layers, each layer takes the frontier point
minimising ``bits + μ·E_l(D)``, ``μ`` bisected in log scale until ``Σ_l E_l(D_l) <= budget²``
(``budget``: the predicted relative L2 error of the logits) or the bits per eligible weight fit
``target_bits``. Candidates start on a coarse grid (``f = 2^k``, no NMS); then, for
``REFINE_ROUNDS`` rounds, every granularity of every layer gets the grid ``FINE_STEPS`` times
finer, with and without NMS, within one coarse step of the factor each codebook takes at the
layer's current multiplier, and the allocation is redone. Small codebooks are evaluated in
batches (their lattices laid end to end, one FFT): the same partitions as one call each.

Corrections (data-free, on by default)
--------------------------------------
The weights stay the KDE modes; what follows each layer absorbs two systematic effects
(:func:`correct`): the **gain** (the modes of wide cells sit toward the density peak, shrinking
the channel: ``α_c`` multiplies the following BatchNorm's ``γ``) and the **mean shift**
``E[(W - α W̃)·x]`` (moves the expected output of the channel, which global pooling does not
average out; into the BatchNorm's running mean, or the bias), with ``E[x]`` from the moment
walk (inputs assumed standardized) and zero padding counted per kernel tap. These change only
BatchNorm parameters and biases, which are stored as float32 anyway.

Everything is deterministic (seeded noise, one onnxruntime thread, stable sorts), and a result
does not depend on earlier runs that shared the same :class:`RDPlan`.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import List, Optional, Sequence

import numpy as np
import onnx
from onnx import numpy_helper

from ..analysis.layers import ConstantTensors, np_dtype, representable, scan_layers, static_shapes, tensor_like
from ..passes.codebook import lattice_codes
from . import kde as _kde
from . import workers as _workers
from .baselines import ZERO_BITS, StoredBits, channel_rows, from_rows

__all__ = ["EFFORTS", "SyntheticInputsUnavailable", "LayerView", "LayerInfo", "RDResult", "RDPlan", "InputStats", "layer_views", "input_stats",
           "sensitivities", "prepare", "rd_hash", "layer_candidates", "allocate", "correct", "PROXIES"]

PROXIES = ("synthetic", "bn", "params")
EFFORTS = {
    "fast": {"granularities": ("tensor",), "samples": 8, "refine_rounds": 1, "refine_all": False},
    "thorough": {"granularities": ("tensor", "groups", "channel"), "samples": 64, "refine_rounds": 3,
                 "refine_all": True},
}
"""Presets of :func:`rd_hash` (``compress --effort``). ``"fast"`` (the default of ``compress``):
one codebook per tensor, 8 synthetic samples, one refinement round of the chosen candidates.
At budget 0.1 on ResNet-20 / ResNet-56 / EfficientNet-Lite0 it took 5 / 18 / 53 s (2 cores) for
4.41 / 3.65 / 5.46 counted entropy bits per eligible weight, where ``"thorough"`` (every
granularity, 64 samples, three rounds over all granularities; the benchmark's headline) took
5-10x as long (23 / 115 / 550 s) for 4-9 % fewer bits (4.22 / 3.38 / 4.99); top-1 within 0.3
points (ResNets) and 0.4 (EfficientNet) of the original for both on the exact data."""
COARSE_RATIO = 2.0
"""Coarse candidate grid: ``f = COARSE_RATIO^k`` from 1 until one value is left."""
FINE_STEPS = 4
"""Refinement grid: ``COARSE_RATIO^(i/FINE_STEPS)``. The bits and error of a KDE codebook are
not smooth in ``f`` (cells appear and vanish); on ResNet-20 the finer grid saves 0.13 bit per
weight at the same predicted error (3.47 -> 3.34), a finer one no longer matters there."""
REFINE_ROUNDS = 3
"""At most this many refinement rounds (they stop earlier when no candidate is added)."""
NMS_BANDWIDTHS = 4.0
"""Second NMS variant in the refinement: modes closer than this many bandwidths merge
(``kde.suppress_modes``). Mostly merges isolated tail modes, each of which costs a table entry
(16 bits) and a long code; radii 2 and 8 were not better on ResNet-20 layers."""
MIN_CODEBOOK_WEIGHTS = 256
"""Per-channel and group codebooks hold at least this many weights. A codebook costs 32 bits
plus 16 per value; with the 8+ values a useful precision needs that is 160+ bits, over 0.6 bit
per weight below 256 weights, more than any finer granularity saved on the layers measured;
the bound also keeps the number of candidates (time) in check."""
SYNTHETIC_SAMPLES = 64
SYNTHETIC_LEVELS = (0.05, 0.2, 0.8)
"""Relative (weighted) noise levels at which each layer's response is measured: from a small
perturbation, where it acts linearly, to the errors the coarsest useful codebooks make."""
RAW_BITS = 32
MAX_CODEBOOK_VALUES = 1 << 16
"""The storage writes codebooks of at most this many values (codes of at most 16 bits); a
candidate with more is not offered (the coarse grid stops there, :func:`_coarse`)."""


# --------------------------------------------------------------------------- layers

@dataclasses.dataclass
class LayerView:
    """One eligible layer as the allocation sees it (weights as ``(C_out, fan_in)`` rows)."""

    name: str
    op_type: str
    weight: str
    shape: tuple
    axis: int                 # output-channel axis of the weight
    rows: np.ndarray          # (C, fan_in) float32
    scale: np.ndarray         # (C,) gain a_c of what follows
    scale_source: str         # "BatchNormalization" | "none"
    node: onnx.NodeProto = dataclasses.field(repr=False, default=None)

    @property
    def params(self) -> int:
        return int(self.rows.size)

    @property
    def channels(self) -> int:
        return int(self.rows.shape[0])

    def weighted_energy(self) -> float:
        return float(np.sum(self.scale[:, None] ** 2 * self.rows.astype(np.float64) ** 2))

    def tensor(self, rows: np.ndarray) -> np.ndarray:
        return from_rows(np.asarray(rows, np.float32), self.shape, self.axis)


def output_axis(op_type: str, shape: tuple, trans_b: bool) -> int:
    """The output-channel axis of an eligible layer's weight: 0 for Conv and Gemm(transB=1),
    the last axis for Gemm(transB=0) and MatMul (``[in, out]``)."""
    if op_type == "Conv" or (op_type == "Gemm" and trans_b):
        return 0
    return len(shape) - 1  # Gemm(transB=0), MatMul [in, out], Gather table [rows, dims]: dims


def _attr(node, name, default):
    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default


def _consumers(model: onnx.ModelProto) -> dict:
    out = {}
    for n in model.graph.node:
        for i in n.input:
            out.setdefault(i, []).append(n)
    return out


def _following_bn(model, consumers, node):
    users = consumers.get(node.output[0], [])
    if len(users) == 1 and users[0].op_type == "BatchNormalization" and users[0].input[0] == node.output[0]:
        return users[0]
    return None


def layer_views(model: onnx.ModelProto) -> List[LayerView]:
    """The eligible layers (``scan_layers`` defaults) with their per-channel gains ``a_c``."""
    consts = ConstantTensors(model)
    consumers = _consumers(model)
    node_of = {}
    for n in model.graph.node:
        if n.op_type in ("Conv", "Gemm", "MatMul") and len(n.input) > 1:
            node_of.setdefault(n.input[1], n)
        elif n.op_type == "Gather" and n.input:
            node_of.setdefault(n.input[0], n)
    views = []
    for layer in scan_layers(model, tables=True).layers:
        w = consts.array(layer.weight).astype(np.float32)
        ax = output_axis(layer.op_type, w.shape, layer.trans_b)
        rows = channel_rows(w, ax)
        node = node_of[layer.weight]
        scale, source = np.ones(rows.shape[0]), "none"
        bn = _following_bn(model, consumers, node)
        if bn is not None and all(bn.input[k] in consts for k in (1, 4)):
            gamma = consts.array(bn.input[1]).astype(np.float64).ravel()
            var = consts.array(bn.input[4]).astype(np.float64).ravel()
            if gamma.size == rows.shape[0]:
                scale = np.abs(gamma) / np.sqrt(var + float(_attr(bn, "epsilon", 1e-5)))
                source = "BatchNormalization"
        views.append(LayerView(layer.node, layer.op_type, layer.weight, tuple(w.shape), ax, rows,
                               scale, source, node))
    return views


# --------------------------------------------------------------------------- bias correction

def _tap_fractions(node, in_shape, w_shape) -> Optional[np.ndarray]:
    """For a Conv: the share of output positions at which each kernel tap reads inside the
    input (zero padding reads nothing), shape ``w_shape[2:]``; None when shapes are unknown."""
    k = tuple(int(d) for d in w_shape[2:])
    if not k:
        return None
    if in_shape is None or len(in_shape) != 2 + len(k) or any(not isinstance(d, int) for d in in_shape[2:]):
        return None
    spatial = in_shape[2:]
    strides = list(_attr(node, "strides", [1] * len(k)))
    dil = list(_attr(node, "dilations", [1] * len(k)))
    pads = list(_attr(node, "pads", [0] * (2 * len(k))))
    auto = _attr(node, "auto_pad", b"NOTSET")
    auto = auto.decode() if isinstance(auto, bytes) else auto
    frac = np.ones(k)
    for ax, (size, kk, s, d) in enumerate(zip(spatial, k, strides, dil)):
        ext = d * (kk - 1) + 1
        if auto in ("SAME_UPPER", "SAME_LOWER"):
            out = -(-size // s)
            total = max(0, (out - 1) * s + ext - size)
            begin = total // 2 if auto == "SAME_UPPER" else total - total // 2
        elif auto == "VALID":
            out = (size - ext) // s + 1
            begin = 0
        else:
            begin = int(pads[ax])
            out = (size + begin + int(pads[ax + len(k)]) - ext) // s + 1
        if out <= 0:
            return None
        pos = np.arange(out)[:, None] * s - begin + np.arange(kk)[None, :] * d  # (out, kk)
        inside = ((pos >= 0) & (pos < size)).mean(axis=0)
        shape = [1] * len(k)
        shape[ax] = kk
        frac = frac * inside.reshape(shape)
    return frac


@dataclasses.dataclass
class InputStats:
    """Data-free statistics of a layer's input, per input channel (None when unknown)."""

    mean: Optional[np.ndarray]
    var: Optional[np.ndarray]


def input_stats(model: onnx.ModelProto, views: Sequence[LayerView]) -> List[InputStats]:
    """Per layer: ``E[x]`` and ``Var[x]`` of each input channel from the moment walk of
    ``analysis.theory`` (BatchNorm statistics; graph inputs assumed standardized)."""
    from ..analysis.theory import moment_state

    state = moment_state(model)
    out = []
    for v in views:
        if v.op_type == "Gather":  # a lookup: every row read alike (no input statistics)
            out.append(InputStats(None, None))
            continue
        s = state.get(v.node.input[0])
        mean, var = getattr(s, "mean", None), getattr(s, "var", None)
        out.append(InputStats(None if mean is None else np.asarray(mean, np.float64).ravel(),
                              None if var is None else np.asarray(var, np.float64).ravel()))
    return out


def position_weights(view: LayerView, stats: Optional[InputStats], centered: bool = True) -> np.ndarray:
    """The distortion weight of each input position of a row (``fan_in`` values): the input
    channel's variance (its second moment when ``centered`` is False: no bias correction),
    normalised to mean 1; ones when unknown or when the sizes do not fit."""
    fan = view.rows.shape[1]
    if stats is None or stats.var is None:
        return np.ones(fan)
    m = stats.var if centered else stats.var + (stats.mean if stats.mean is not None else 0.0) ** 2
    if m.size == 0 or fan % m.size or np.mean(m) <= 0:
        return np.ones(fan)
    w = np.repeat(m, fan // m.size) if view.op_type == "Conv" else np.resize(m, fan)
    if view.op_type != "Conv" and m.size != fan:
        return np.ones(fan)
    return w / np.mean(w)


def _distortion(view: LayerView, vin: np.ndarray, rows_new: np.ndarray, gain: bool) -> float:
    """``D`` of new rows for a layer (the candidates' formula, all channels)."""
    b = _Codebook.__new__(_Codebook)
    x = view.rows.astype(np.float64)
    b.g = x.shape[0]
    b.chan = np.repeat(np.arange(b.g), x.shape[1])
    b.w = x.ravel()
    b.vw = np.tile(vin, b.g)
    b.a2 = view.scale ** 2
    b.gain = gain and view.scale_source == "BatchNormalization"
    b.s_ww = np.bincount(b.chan, b.vw * b.w * b.w, minlength=b.g)
    return b.distortion(np.asarray(rows_new, np.float64).ravel())


def _output_shift(v: LayerView, dw: np.ndarray, mean: np.ndarray, frac) -> Optional[np.ndarray]:
    """``E[ΔW·x]`` per output channel (None if the statistics do not fit the weight)."""
    if v.op_type == "Conv":
        if dw.shape[1] != mean.size:
            return None
        d = dw * frac if frac is not None else dw
        return d.reshape(d.shape[0], d.shape[1], -1).sum(axis=2) @ mean
    rows = channel_rows(dw, v.axis)  # (out, in)
    if rows.shape[1] != mean.size:
        return None
    return rows @ mean


def correct(original: onnx.ModelProto, model: onnx.ModelProto, views: Sequence[LayerView],
            stats: Sequence[InputStats], *, gain: bool = True, bias: bool = True,
            shapes: Optional[dict] = None) -> List[str]:
    """Data-free corrections folded into what follows each changed layer (in place on
    ``model``, whose layer weights may differ from ``original``'s); the weights stay as they are.

    * gain (only with a following BatchNorm): ``α_c = <W̃_c, W_c>_v / <W̃_c, W̃_c>_v`` (inner
      products weighted by the input variances, second moments when ``bias`` is off, as in the
      candidates' distortion), applied as ``γ_c·α_c`` (kept at 1 when
      ``α_c <= 0``);
    * bias: ``δ_c = E[(W - α_c W̃_c)·x]`` (input means, zero padding counted per tap), applied
      as running mean ``(μ_c - δ_c)/α_c`` of the following BatchNorm, else as bias ``b_c + δ_c``
      (Conv, Gemm with ``beta != 0``).

    Returns one note per layer ("" when corrected or unchanged)."""
    consts0 = ConstantTensors(original)
    consts = ConstantTensors(model)
    consumers = _consumers(model)
    node_of = {n.input[1]: n for n in model.graph.node if n.op_type in ("Conv", "Gemm", "MatMul") and len(n.input) > 1}
    if shapes is None and bias:
        shapes = static_shapes(original)
    notes = []
    for v, st in zip(views, stats):
        w0 = consts0.array(v.weight).astype(np.float64)
        wq = consts.array(v.weight).astype(np.float64)
        if np.array_equal(w0, wq):
            notes.append("")
            continue
        if v.op_type == "Gather":
            notes.append("an embedding table: no gain or bias to correct (rows are read, not summed)")
            continue
        node = node_of[v.weight]
        bn = _following_bn(model, consumers, node)
        have_bn = bn is not None and all(bn.input[k] in consts for k in (1, 3))
        alpha = np.ones(v.channels)
        note = []
        if gain and have_bn:
            vin = position_weights(v, st, centered=bias)
            r0, rq = channel_rows(w0, v.axis), channel_rows(wq, v.axis)
            num = (vin * rq * r0).sum(axis=1)
            den = (vin * rq * rq).sum(axis=1)
            ok = (den > 0) & (num > 0)
            alpha = np.where(ok, num / np.where(ok, den, 1.0), 1.0)
        delta = None
        if bias:
            if st is None or st.mean is None:
                note.append("bias not corrected: input statistics unknown")
            else:
                frac = _tap_fractions(node, shapes.get(node.input[0]), v.shape) if v.op_type == "Conv" else None
                eff = from_rows(channel_rows(wq, v.axis) * alpha[:, None], v.shape, v.axis)
                delta = _output_shift(v, w0 - eff, st.mean, frac)
                if delta is None:
                    note.append("bias not corrected: input statistics do not match the weight")
        if have_bn:
            g = consts.proto(bn.input[1])
            mu = consts.proto(bn.input[3])
            gv = numpy_helper.to_array(g).astype(np.float64).ravel()
            mv = numpy_helper.to_array(mu).astype(np.float64).ravel()
            if delta is not None:
                mv = mv - delta
            g.CopyFrom(tensor_like(g, (gv * alpha).reshape(tuple(g.dims))))
            mu.CopyFrom(tensor_like(mu, (mv / alpha).reshape(tuple(mu.dims))))
        elif delta is not None:
            if v.op_type in ("Conv", "Gemm") and len(node.input) > 2 and node.input[2] in consts \
                    and consts.array(node.input[2]).size == delta.size:
                beta = float(_attr(node, "beta", 1.0)) if v.op_type == "Gemm" else 1.0
                if beta != 0:
                    p = consts.proto(node.input[2])
                    b = numpy_helper.to_array(p).astype(np.float64).ravel() + delta / beta
                    p.CopyFrom(tensor_like(p, b.reshape(tuple(p.dims))))
                else:
                    note.append("bias not corrected: Gemm beta = 0")
            else:
                note.append("bias not corrected: no following BatchNormalization and no bias")
        notes.append("; ".join(note))
    return notes


# --------------------------------------------------------------------------- sensitivity

def _session(model: onnx.ModelProto):
    from ..runtime import session

    return session(model, intra_op_num_threads=1, inter_op_num_threads=1)  # one thread: deterministic


def with_weights(model: onnx.ModelProto, new: dict) -> onnx.ModelProto:
    """A copy of ``model`` whose constants ``new`` (name -> array) are replaced (in each
    constant's own element type)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    consts = ConstantTensors(out)
    for name, a in new.items():
        p = consts.proto(name)
        p.CopyFrom(tensor_like(p, a))
    return out


MAX_SYNTHETIC_ELEMENTS = 1 << 26
"""At most this many values per input of the synthetic measurement (256 MiB of float32): larger
inputs fall back to the ``"bn"`` estimate."""


class SyntheticInputsUnavailable(ValueError):
    """The ``"synthetic"`` proxy cannot feed this model (an input without a static shape, or not
    float): the caller falls back to ``"bn"``."""


def _synthetic_inputs(model: onnx.ModelProto, samples: int, seed: int) -> dict:
    """``samples`` inputs: floats standard normal; other inputs by the verification's rules
    (``verify.plan_inputs``: token ids uniform over the embedding table they index, masks of ones,
    segment ids 0), or :class:`SyntheticInputsUnavailable` when none fits."""
    from ..verify import UNKNOWN_INTEGERS, plan_inputs

    inits = {t.name for t in model.graph.initializer}
    shapes = static_shapes(model)
    feeds, sizes = {}, {}
    rng = np.random.default_rng(seed)
    for inp in model.graph.input:
        if inp.name in inits:
            continue
        shape = shapes.get(inp.name)
        if shape is None or any(not isinstance(d, int) for d in shape[1:]):
            raise SyntheticInputsUnavailable(f"input {inp.name!r} has no static shape (give it with --input-shape)")
        size = samples * math.prod(shape[1:])
        if size > MAX_SYNTHETIC_ELEMENTS:
            raise SyntheticInputsUnavailable(f"input {inp.name!r}: {samples} samples of shape {list(shape[1:])} "
                                             f"are {size:,} values, more than {MAX_SYNTHETIC_ELEMENTS:,}")
        elem = inp.type.tensor_type.elem_type
        if elem in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16):
            feeds[inp.name] = rng.standard_normal((samples, *shape[1:])).astype(np.float32).astype(np_dtype(elem))
        else:
            sizes[inp.name] = (samples, *shape[1:])
    if sizes:
        try:
            plans = [p for p in plan_inputs(model, samples, shapes=sizes) if p.name in sizes]
        except Exception as err:  # noqa: BLE001 -- an input type verification does not know either
            raise SyntheticInputsUnavailable(str(err)) from err
        for p in plans:
            if p.why.startswith(UNKNOWN_INTEGERS):
                raise SyntheticInputsUnavailable(f"input {p.name!r}: integers of unknown use (no embedding table "
                                                 "found to draw token ids from)")
            feeds[p.name] = p.draw(rng)
    return feeds


@dataclasses.dataclass
class Response:
    """A layer's predicted effect on the logits: relative logit energy ``E(D)`` as a function of
    its distortion ``D``, through measured points ``(d_k, e_k)`` (increasing ``d``),
    interpolated linearly in log-log coordinates; below the first point ``E`` is proportional to
    ``D`` (small perturbations act linearly), above the last it follows the last segment's slope."""

    d: np.ndarray
    e: np.ndarray

    @property
    def slope(self) -> float:
        """``E/D`` at the first (smallest) point: the linear sensitivity ``s_l``."""
        return float(self.e[0] / self.d[0]) if self.d[0] > 0 else 0.0

    def __call__(self, dist) -> np.ndarray:
        dist = np.asarray(dist, np.float64)
        out = np.zeros_like(dist)
        pos = dist > 0
        if not pos.any() or self.e[0] <= 0:
            return out
        ld, le = np.log(self.d), np.log(np.maximum(self.e, 1e-300))
        x = np.log(dist[pos])
        y = np.interp(x, ld, le)
        y = np.where(x < ld[0], le[0] + (x - ld[0]), y)
        last = (le[-1] - le[-2]) / (ld[-1] - ld[-2]) if len(ld) > 1 and ld[-1] > ld[-2] else 1.0
        # above the last point: at least linear (a one-point, linear response was flat there: the
        # 'bn' proxy priced every distortion above D = 1 like D = 1, and a 1,000-row embedding table,
        # whose D is in squared weight units, collapsed to one value)
        y = np.where(x > ld[-1], le[-1] + max(last, 1.0) * (x - ld[-1]), y)
        out[pos] = np.exp(y)
        return out


def sensitivities(model: onnx.ModelProto, views: Sequence[LayerView], proxy: str = "synthetic", *,
                  samples: int = SYNTHETIC_SAMPLES, levels: Sequence[float] = SYNTHETIC_LEVELS, seed: int = 0,
                  gain_correction: bool = True, bias_correction: bool = True, batch: int = 16,
                  stats: Optional[Sequence[InputStats]] = None, progress=None,
                  workers: Optional[int] = None) -> List[Response]:
    """The :class:`Response` of every layer (module docstring): measured on synthetic inputs at
    each noise level (``"synthetic"``), or linear with the BatchNorm (``"bn"``) or parameter
    count (``"params"``) slope. ``workers``: processes for the per-layer measurements
    (:mod:`.workers`; the result does not depend on it)."""
    if stats is None:
        stats = input_stats(model, views)
    vins = [position_weights(v, st, bias_correction) for v, st in zip(views, stats)]
    if proxy == "params":
        total = sum(v.params for v in views)
        return [_linear(v.params / total / max(_distortion(v, vin, np.zeros_like(v.rows), False), 1e-300))
                for v, vin in zip(views, vins)]
    if proxy == "bn":
        return [_linear(x) for x in _bn_sensitivity(model, views, vins)]
    if proxy != "synthetic":
        raise ValueError(f"proxy must be one of {PROXIES}, got {proxy!r}")
    if not model.graph.output:
        raise SyntheticInputsUnavailable("the model has no outputs")
    fixed = _fixed_batch(model)
    if fixed:  # an export with a static batch dimension: run it in batches of exactly that size
        batch = fixed
        samples = max(fixed, samples // fixed * fixed)
    feeds = _synthetic_inputs(model, samples, seed)
    ref = _run_synthetic(model, feeds, samples, batch)
    shared = {"model": model.SerializeToString(), "feeds": feeds, "views": list(views), "vins": vins,
              "stats": list(stats), "shapes": static_shapes(model), "levels": tuple(levels), "seed": seed,
              "gain": gain_correction, "bias": bias_correction, "samples": samples, "batch": batch,
              "ref": ref, "ref_energy": float(np.sum(ref ** 2))}
    n = len(views)
    try:
        return _workers.pmap(_sensitivity_task, list(range(n)), shared,
                             _workers.resolve(workers, sum(v.params for v in views)),
                             progress=(lambda done, total, i: progress(done - 1, total, views[i].name))
                             if progress else None, cost=[v.params for v in views])
    finally:
        _PARSED.clear()  # the serial path parsed here: do not keep the model alive


def _fixed_batch(model: onnx.ModelProto) -> Optional[int]:
    """The static first dimension of the graph inputs when one is static (exporters that trace
    with an example batch), else None (a dynamic batch)."""
    inits = {t.name for t in model.graph.initializer}
    for inp in model.graph.input:
        dims = inp.type.tensor_type.shape.dim if inp.type.HasField("tensor_type") else []
        if inp.name not in inits and dims and dims[0].HasField("dim_value") and dims[0].dim_value > 0:
            return int(dims[0].dim_value)
    return None


def _run_synthetic(model: onnx.ModelProto, feeds: dict, samples: int, batch: int) -> np.ndarray:
    sess = _session(model)
    out = []
    for i in range(0, samples, batch):
        out.append(sess.run(None, {k: a[i:i + batch] for k, a in feeds.items()})[0])
    return np.concatenate(out).astype(np.float64)


_PARSED = {}  # the parsed model of the serialized bytes it holds (a worker's, or this process's during one call)


def _sensitivity_task(k: int) -> Response:
    """The :class:`Response` of layer ``k`` (``workers.state()``: what :func:`sensitivities`
    shares): its weights plus seeded noise at each level, corrected, run on the synthetic inputs."""
    sh = _workers.state()
    if _PARSED.get("bytes") is not sh["model"]:  # held, so its identity cannot be reused by another model
        _PARSED.clear()
        m0 = onnx.ModelProto()
        m0.ParseFromString(sh["model"])
        _PARSED.update(bytes=sh["model"], model=m0)
    model = _PARSED["model"]
    v, vin, st = sh["views"][k], sh["vins"][k], sh["stats"][k]
    gain, bias = sh["gain"], sh["bias"]
    energy = v.weighted_energy()
    z = np.random.default_rng([sh["seed"], k]).standard_normal(v.rows.shape)
    safe = np.where(v.scale > 0, v.scale, 1.0)
    r = math.sqrt(energy / v.params) if energy > 0 else 0.0
    d, e = [], []
    for rho in sh["levels"]:
        noisy = (v.rows + rho * r / safe[:, None] * z).astype(np.float32)
        dist = _distortion(v, vin, noisy, gain)
        if dist <= 0:
            continue
        m = with_weights(model, {v.weight: v.tensor(noisy)})
        if gain or bias:
            correct(model, m, [v], [st], gain=gain, bias=bias, shapes=sh["shapes"])
        y = _run_synthetic(m, sh["feeds"], sh["samples"], sh["batch"])
        d.append(dist)
        e.append(float(np.sum((y - sh["ref"]) ** 2)) / sh["ref_energy"])
    if not d:
        return _linear(0.0)
    d, e = np.asarray(d), np.maximum.accumulate(np.asarray(e))  # monotone in D
    return Response(d, np.maximum(e, 1e-30))


def _linear(slope: float) -> Response:
    return Response(np.array([1.0]), np.array([max(float(slope), 0.0)]))


def _bn_sensitivity(model, views, vins):
    from ..analysis.theory import _Walker

    try:
        walker = _Walker(model, "standard")
        walker.run()
        state = walker.state
    except Exception:  # noqa: BLE001  a graph the moment walk cannot follow: unit input power
        state = {}
    consts = ConstantTensors(model)
    consumers = _consumers(model)
    out = []
    for v, vin in zip(views, vins):
        s = state.get(v.node.input[0])
        e_in = float(np.mean(np.asarray(s.mean) ** 2 + np.asarray(s.var))) if hasattr(s, "mean") else 1.0
        bn = _following_bn(model, consumers, v.node)
        if bn is not None and bn.input[1] in consts and bn.input[2] in consts:
            g = consts.array(bn.input[1]).astype(np.float64)
            b = consts.array(bn.input[2]).astype(np.float64)
            p_out = float(np.sum(g ** 2 + b ** 2))
        else:
            so = state.get(v.node.output[0])
            p_out = (float(np.sum(np.asarray(so.mean) ** 2 + np.asarray(so.var))) if hasattr(so, "mean")
                     else v.weighted_energy() * e_in)
        # D is weighted by the input variances normalised to mean 1: their mean is e_in's share
        out.append(e_in / p_out if p_out > 0 else 0.0)
    return np.array(out)


# --------------------------------------------------------------------------- candidates

@dataclasses.dataclass
class Curve:
    """Candidates of one codebook: parallel arrays, row 0 = left as it is (float32)."""

    factor: np.ndarray    # 0 for "as it is"
    nms: np.ndarray       # NMS radius in bandwidths
    table: np.ndarray     # table bits
    entropy: np.ndarray   # code bits at the entropy
    fixed: np.ndarray     # code bits, fixed length
    dist: np.ndarray      # weighted squared error
    values: np.ndarray    # values kept


def codebook_bits(r) -> tuple:
    """(table, entropy code bits, fixed code bits) of one ``hash_tensor`` result stored as a
    codebook (module docstring)."""
    n = r.codes.size
    k = r.distinct_after
    unit = _kde.grid_step(r.bandwidth) / 2 if r.bandwidth else None
    on_lattice = unit is not None and lattice_codes(np.asarray(r.codebook, np.float32), unit) is not None
    table = 16.0 * k + 32.0 if on_lattice else 32.0 * k
    _, counts = np.unique(r.codes, return_counts=True)
    entropy = float(max(0.0, -(counts * np.log2(counts / n)).sum()))
    return table, entropy, float(n * math.ceil(math.log2(max(k, 1))))


BATCH_POINTS = _kde.CHUNK_POINTS - 2 * _kde._REACH
"""Grid points per batched density evaluation (one FFT block, so that coordinates stay small
and every codebook's density is computed in one piece)."""


def _partitions(items: Sequence[tuple]) -> List[_kde.Partition]:
    """``kde._partition(v, counts, bw, kde._binned_density)`` of many small value sets at once.

    Each set's lattice is laid end to end with the others (the way ``kde._lattice`` lays a
    tensor's segments end to end: the padding keeps every value beyond the kernel's reach of the
    next set), the counts are divided by each set's total (the density's scale does not move its
    extrema), one binned-FFT density is computed, and its extrema are split per set: a set's
    maxima are those on its grid, its minima those between its first and last maximum (the
    minimum at a junction is the cut between two sets). The result is the same partition as one
    call per set, up to floating-point rounding of the density."""
    lats = [_kde._lattice(v, bw) for v, _, bw in items]
    sizes = np.array([lat.size for lat in lats], np.int64)
    offs = np.concatenate(([0], np.cumsum(sizes)[:-1]))
    coords = np.concatenate([lat.coords + o for lat, o in zip(lats, offs)])
    counts = np.concatenate([c / c.sum() for _, c, _ in items])
    comb = _kde._Lattice(1.0, coords, np.zeros(1, np.int64), np.zeros(1), int(sizes.sum()))
    minima, maxima, peaks = _kde._extrema(_kde._binned_density(comb, None, counts, 1.0, 1.0), comb.size)
    out = []
    mx_lo = np.searchsorted(maxima, offs, side="left")
    mx_hi = np.searchsorted(maxima, offs + sizes, side="left")
    for (v, c, bw), lat, o, a, b in zip(items, lats, offs, mx_lo, mx_hi):
        mx = maxima[a:b]
        mn = minima[np.searchsorted(minima, mx[0], side="right"):np.searchsorted(minima, mx[-1], side="left")]
        mn = mn - o
        out.append(_kde.Partition(values=v, counts=c, starts=np.concatenate(([0], np.searchsorted(lat.coords, mn, side="left"))),
                                  cuts=lat.to_values(mn), modes=lat.to_values(mx - o), peaks=peaks[a:b],
                                  bandwidth=bw, grid_size=lat.size))
    return out


def _evaluate_many(books: Sequence["_Codebook"], f: float, nms: Sequence[float]) -> None:
    """Evaluate factor ``f`` (each NMS radius in ``nms``) for every hashable codebook that does
    not have it yet, batching the small ones."""
    todo = [b for b in books if b.hashable and f <= b.f_max * COARSE_RATIO
            and any(b.key(f, c) not in b.rows for c in nms)]
    batch, points = [], 0

    def flush():
        nonlocal batch, points
        if batch:
            parts = _partitions([(b.v, b.counts, b.base * f) for b in batch])
            for b, part in zip(batch, parts):
                for c in nms:
                    b.evaluate(f, c, part)
        batch, points = [], 0

    for b in todo:
        est = 34 * len(b.v) + 64  # upper bound of a lattice's size (kde._lattice)
        if est > BATCH_POINTS // 4:
            part = _kde._partition(b.v, b.counts, b.base * f, _kde._binned_density)
            for c in nms:
                b.evaluate(f, c, part)
            continue
        if points + est > BATCH_POINTS:
            flush()
        batch.append(b)
        points += est
    flush()


class _Codebook:
    """One codebook's weights and its candidates, evaluated on demand and cached (the same
    values as ``hash_tensor(x, bandwidth_factor=f, nms_radius=c·Δ)``). ``coarse_keys`` are
    always offered to the allocation; refined ones only in the run that asked for them, so a
    result never depends on earlier runs.

    ``rows``: the codebook's channels ``(g, fan_in)``; ``a2``: their ``a_c²``; ``vin``: the
    weight of each input position in the distortion (input variance, ones when unknown);
    ``gain``: the distortion is taken after each channel's least-squares gain (the gain
    correction folds it into the following BatchNorm)."""

    def __init__(self, rows: np.ndarray, a2: np.ndarray, vin: np.ndarray, gain: bool):
        rows = np.asarray(rows, np.float32)
        x = rows.ravel()
        self.n = x.size
        self.g = rows.shape[0]
        v32, inv, counts = np.unique(x, return_inverse=True, return_counts=True)
        self.v = v32.astype(np.float64)
        self.counts = counts.astype(np.float64)
        self.inv = inv.ravel()
        self.chan = np.repeat(np.arange(self.g), rows.shape[1])
        self.w = x.astype(np.float64)
        self.vw = np.tile(np.asarray(vin, np.float64), self.g)
        self.a2 = np.asarray(a2, np.float64)
        self.gain = gain
        self.s_ww = np.bincount(self.chan, self.vw * self.w * self.w, minlength=self.g)
        self.base = float(np.median(np.diff(self.v))) if len(self.v) >= 2 else 0.0
        self.f_max = (self.v[-1] - self.v[0]) / self.base if self.base > 0 else 1.0
        self.rows = {}
        self.coarse_keys = []
        self.raw = (0.0, 0.0, 0.0, RAW_BITS * self.n, RAW_BITS * self.n, 0.0, len(self.v))

    def distortion(self, q: np.ndarray) -> float:
        """``Σ_c a_c² · min_α Σ_i v_i (α q_ci - w_ci)²`` (α = 1 without gain correction)."""
        vq = self.vw * q
        s_qw = np.bincount(self.chan, vq * self.w, minlength=self.g)
        s_qq = np.bincount(self.chan, vq * q, minlength=self.g)
        plain = self.s_ww - 2 * s_qw + s_qq
        if self.gain:
            ok = (s_qq > 0) & (s_qw > 0)
            fitted = self.s_ww - np.where(ok, s_qw * s_qw / np.where(ok, s_qq, 1.0), 0.0)
            plain = np.where(ok, np.minimum(fitted, plain), plain)
        return float(np.dot(self.a2, np.maximum(plain, 0.0)))

    @property
    def hashable(self) -> bool:
        return len(self.v) >= 3

    def key(self, f: float, c: float) -> tuple:
        return (round(math.log2(f) * 64), float(c))

    def evaluate(self, f: float, c: float, part: Optional[_kde.Partition] = None):
        """The candidate at factor ``f`` and NMS radius ``c`` bandwidths (cached; ``part``: its
        KDE partition before NMS when already computed)."""
        key = self.key(f, c)
        if key not in self.rows:
            bw = self.base * f
            if part is None:
                part = _kde._partition(self.v, self.counts, bw, _kde._binned_density)
            part = _kde.suppress_modes(part, c * bw)
            modes32 = part.modes.astype(np.float32)
            mode = modes32.astype(np.float64)[np.repeat(np.arange(part.n_cells), part.sizes)]
            dist = self.distortion(mode[self.inv])
            book, code = np.unique(mode.astype(np.float32), return_inverse=True)
            mass = np.bincount(code, self.counts)
            entropy = float(max(0.0, -(mass * np.log2(mass / self.n)).sum()))
            k = len(book)
            table = 16 * k + 32 if lattice_codes(book, _kde.grid_step(bw) / 2) is not None else 32 * k
            self.rows[key] = (f, c, float(table), entropy, float(self.n * math.ceil(math.log2(max(k, 1)))), dist, k)
        return key

    def window(self, f: float) -> List[float]:
        """The factors ``FINE_STEPS`` times finer than the coarse grid within one coarse step of
        ``f`` (all on the grid ``COARSE_RATIO^(i/FINE_STEPS)``)."""
        if not self.hashable or f <= 0:
            return []
        i0 = round(math.log(f, COARSE_RATIO) * FINE_STEPS)
        out = []
        for i in range(i0 - FINE_STEPS + 1, i0 + FINE_STEPS):
            g = COARSE_RATIO ** (i / FINE_STEPS)
            if 1.0 <= g <= self.f_max * COARSE_RATIO:
                out.append(g)
        return out

    def curve(self, extra=()) -> Curve:
        keys = sorted(k for k in set(self.coarse_keys) | set(extra) if self.rows[k][6] <= MAX_CODEBOOK_VALUES)
        a = np.array([self.raw] + [self.rows[k] for k in keys], np.float64)
        return Curve(a[:, 0], a[:, 1], a[:, 2], a[:, 3], a[:, 4], a[:, 5], a[:, 6].astype(np.int64))


@dataclasses.dataclass
class _Granularity:
    label: str                 # "tensor" | "channel" | "groups of g"
    groups: List[np.ndarray]   # channel indices of each codebook
    books: List[_Codebook]
    map_bits: float
    # padded candidate arrays (codebooks x candidates), filled by pack()
    bits: np.ndarray = None
    dist: np.ndarray = None

    def pack(self, extra=None) -> None:
        """Candidate arrays: the coarse candidates plus ``extra[i]`` keys for codebook ``i``."""
        self.curves = [b.curve(extra[i] if extra else ()) for i, b in enumerate(self.books)]
        width = max(len(c.factor) for c in self.curves)
        self.bits = np.full((len(self.curves), width), np.inf)
        self.dist = np.zeros((len(self.curves), width))
        for i, c in enumerate(self.curves):
            self.bits[i, :len(c.factor)] = c.table + c.entropy
            self.dist[i, :len(c.factor)] = c.dist


GRANULARITIES = ("tensor", "groups", "channel")


def _groupings(view: LayerView, min_weights: int, allowed: Sequence[str] = GRANULARITIES,
               group_step: int = 2) -> List[tuple]:
    """(label, groups, map bits) of the granularities in ``allowed``: per tensor, per channel,
    groups of 2^k channels (sorted by RMS, stable), the last two only with at least
    ``min_weights`` weights per codebook; per tensor when nothing else is left."""
    C, fan = view.rows.shape
    out = []
    if "tensor" in allowed:
        out.append(("tensor", [np.arange(C)], 0.0))
    rms = np.sqrt(np.mean(view.rows.astype(np.float64) ** 2, axis=1))
    order = np.argsort(rms, kind="stable")
    g = 1
    while g < C:
        if g * fan >= min_weights:
            if g == 1:
                if "channel" in allowed:
                    out.append(("channel", [np.array([c]) for c in range(C)], 0.0))
            elif "groups" in allowed:
                groups = [np.sort(order[i:i + g]) for i in range(0, C, g)]
                out.append((f"groups of {g}", groups, float(C * math.ceil(math.log2(len(groups))))))
        g *= group_step
    if not out:  # a single-channel layer, or nothing allowed fits: one codebook for the tensor
        out.append(("tensor", [np.arange(C)], 0.0))
    return out


@dataclasses.dataclass
class _LayerCands:
    view: LayerView
    grans: List[_Granularity]


def _coarse(books: Sequence[_Codebook]) -> None:
    """The coarse candidates ``f = COARSE_RATIO^k`` (no NMS) of every codebook, batched per
    factor, from the factor that leaves one value (above ``f_max``) DOWN to 1 or to the first
    factor that leaves more than ``MAX_CODEBOOK_VALUES`` values: the storage cannot write such a
    codebook (``passes/codebook.py``: codes of at most 16 bits), and on a large tensor the small
    factors are the slow ones (EfficientNet-Lite0's 1.28 M-weight classifier: f = 1, 2, 4 took 9 s,
    the 20 factors above 0.5 s together)."""
    live = [b for b in books if b.hashable]
    if not live:
        return
    top = max(0, math.ceil(math.log(max(b.f_max for b in live), COARSE_RATIO)) + 1)
    for k in range(top, -1, -1):
        f = COARSE_RATIO ** k
        now = [b for b in live if f <= b.f_max * COARSE_RATIO]
        if not now:
            continue
        _evaluate_many(now, f, (0.0,))
        full = set()
        for b in now:
            key = b.key(f, 0.0)
            if b.rows[key][6] <= MAX_CODEBOOK_VALUES:
                b.coarse_keys.append(key)
            else:
                full.add(id(b))
        live = [b for b in live if id(b) not in full]
        if not live:
            break


def _refine(books: Sequence[_Codebook], factors: Sequence[float]) -> List[list]:
    """For each codebook, the keys of its fine window around its factor (with and without NMS),
    evaluated batched per factor."""
    need = {}
    wins = []
    for b, f in zip(books, factors):
        w = b.window(f)
        wins.append(w)
        for g in w:
            need.setdefault(round(math.log(g, COARSE_RATIO) * FINE_STEPS), []).append(b)
    for i in sorted(need):
        _evaluate_many(need[i], COARSE_RATIO ** (i / FINE_STEPS), (0.0, NMS_BANDWIDTHS))
    return [[b.key(g, c) for g in w for c in (0.0, NMS_BANDWIDTHS)] for b, w in zip(books, wins)]


def layer_candidates(view: LayerView, min_weights: int = MIN_CODEBOOK_WEIGHTS, vin: Optional[np.ndarray] = None,
                     gain: bool = True, granularities: Sequence[str] = GRANULARITIES,
                     group_step: int = 2) -> _LayerCands:
    """Coarse candidates of every granularity of one layer. ``vin``: per input position (a row
    of ``view.rows``) the distortion weight (default ones); ``gain``: distortion after each
    channel's least-squares gain (only where a BatchNorm follows)."""
    lc = _layer_books(view, min_weights, vin, gain, granularities, group_step)
    for g in lc.grans:
        _coarse(g.books)
    return lc


def _layer_books(view: LayerView, min_weights: int, vin: Optional[np.ndarray], gain: bool,
                 granularities: Sequence[str], group_step: int) -> _LayerCands:
    """Every granularity's codebooks of one layer, no candidate evaluated yet."""
    a2 = view.scale ** 2
    fan = view.rows.shape[1]
    vin = np.ones(fan) if vin is None else np.asarray(vin, np.float64)
    gain = gain and view.scale_source == "BatchNormalization"
    grans = []
    for label, groups, map_bits in _groupings(view, min_weights, granularities, group_step):
        grans.append(_Granularity(label, groups, [_Codebook(view.rows[g], a2[g], vin, gain) for g in groups], map_bits))
    return _LayerCands(view, grans)


def _candidates_task(task) -> list:
    """Per granularity, per codebook: the evaluated candidates (``_Codebook.rows``) and the coarse
    keys of one layer (``task = (view, vin)``; ``workers.state()``: the settings) -- small, so
    that a worker sends back these and not the codebooks' arrays, which the parent rebuilds."""
    view, vin = task
    sh = _workers.state()
    lc = layer_candidates(view, sh["min_weights"], vin, sh["gain"], sh["granularities"], sh["group_step"])
    return [[(b.rows, b.coarse_keys) for b in g.books] for g in lc.grans]


# --------------------------------------------------------------------------- allocation

@dataclasses.dataclass
class _Choice:
    gran: int
    idx: np.ndarray
    bits: float
    dist: float
    lam: float = 0.0      # the within-layer multiplier that selects it


INNER_LAMBDAS = np.logspace(-12, 30, 337)
"""Multipliers of the within-layer Lagrangian (8 per decade): each gives one point of the
layer's bits-distortion frontier."""


def _frontier(lc: _LayerCands) -> List[_Choice]:
    """The layer's lower convex frontier of (bits, D): for each inner multiplier, the best
    granularity and, within it, each codebook's best candidate; duplicates removed, sorted by
    increasing bits."""
    pts = {}
    for lam in INNER_LAMBDAS:
        best = None
        for gi, g in enumerate(lc.grans):
            idx = np.argmin(g.bits + lam * g.dist, axis=1)
            rows = np.arange(len(idx))
            bits = float(g.bits[rows, idx].sum()) + g.map_bits
            dist = float(g.dist[rows, idx].sum())
            if best is None or bits + lam * dist < best.bits + lam * best.dist:
                best = _Choice(gi, idx, bits, dist, float(lam))
        pts.setdefault((round(best.bits, 6), round(best.dist, 12)), best)
    return sorted(pts.values(), key=lambda c: (c.bits, c.dist))


def allocate(cands: Sequence[_LayerCands], responses: Sequence[Response], budget: Optional[float] = None,
             target_bits: Optional[float] = None, frontiers=None, iters: int = 80):
    """One frontier point per layer: the fewest bits with ``Σ_l E_l(D_l) <= budget²``, or the
    least ``Σ E_l`` within ``target_bits`` bits per weight (outer Lagrangian on the layers'
    frontiers, multiplier bisected in log scale). Returns (choices, Σ E_l, bits per weight)."""
    if (budget is None) == (target_bits is None):
        raise ValueError("give exactly one of budget and target_bits")
    if frontiers is None:
        frontiers = [_frontier(lc) for lc in cands]
    total_w = sum(lc.view.params for lc in cands)
    table = []
    for fr, resp in zip(frontiers, responses):
        bits = np.array([c.bits for c in fr])
        err = resp(np.array([c.dist for c in fr]))
        table.append((bits, err))

    def run(log_mu):
        mu = 10.0 ** log_mu
        idx = [int(np.argmin(b + mu * e)) for b, e in table]
        err = float(sum(e[i] for (b, e), i in zip(table, idx)))
        bits = float(sum(b[i] for (b, e), i in zip(table, idx))) / max(total_w, 1)
        return idx, err, bits

    def ok(err, bits):
        return err <= budget ** 2 if budget is not None else bits <= target_bits

    # log λ in [-20, 40]: with a budget, a larger λ means less error (its safe end is high); with a
    # target, a smaller λ means fewer bits (its safe end is low). Bisect towards the cheap end.
    safe, cheap = (40.0, -20.0) if budget is not None else (-20.0, 40.0)
    r_safe, r_cheap = run(safe), run(cheap)
    best = r_cheap if ok(*r_cheap[1:]) else r_safe
    if not ok(*r_cheap[1:]):
        for _ in range(iters):
            mid = 0.5 * (safe + cheap)
            r = run(mid)
            if ok(*r[1:]):
                safe, best = mid, r
            else:
                cheap = mid
    idx, err, bits = best
    return [fr[i] for fr, i in zip(frontiers, idx)], err, bits


# --------------------------------------------------------------------------- results

@dataclasses.dataclass
class LayerInfo:
    """What RD hashing did to one layer (a row of the report)."""

    name: str
    op_type: str
    weight: str
    shape: tuple
    params: int
    granularity: str                 # "tensor" | "channel" | "groups of g" | "unchanged"
    codebooks: int
    values_kept: int                 # summed over codebooks
    distinct_before: int
    bits: StoredBits
    sensitivity: float               # s_l = E_l(D)/D for small D
    sensitivity_proxy: str
    scale_source: str
    weighted_rel_error: float        # sqrt(D_l / D_l(W̃ = 0)): the distortion relative to the layer's
    rel_error: float                 # ‖W̃ - W‖ / ‖W‖
    predicted_error: float           # sqrt(E_l(D_l))
    factors: List[float] = dataclasses.field(default_factory=list)
    nms: List[float] = dataclasses.field(default_factory=list)
    groups: List[list] = dataclasses.field(default_factory=list, repr=False)
    bias: str = ""
    units: List[Optional[float]] = dataclasses.field(default_factory=list, repr=False)
    axis: int = 0                    # output-channel axis of the weight (the groups' channels)

    def channel_units(self) -> Optional[np.ndarray]:
        """The lattice unit (``h/2`` of the KDE grid, ``passes/codebook.py``) of every output
        channel's codebook, NaN for a codebook left as it is; None for the whole layer unchanged."""
        if not self.groups or all(u is None for u in self.units):
            return None
        out = np.full(sum(len(g) for g in self.groups), np.nan)
        for grp, u in zip(self.groups, self.units):
            out[np.asarray(grp, np.int64)] = np.nan if u is None else u
        return out

    def channel_groups(self) -> Optional[np.ndarray]:
        """The codebook of every output channel (None for one codebook per tensor)."""
        if len(self.groups) <= 1:
            return None
        out = np.zeros(sum(len(g) for g in self.groups), np.int64)
        for k, grp in enumerate(self.groups):
            out[np.asarray(grp, np.int64)] = k
        return out

    def to_dict(self) -> dict:
        f = np.asarray([x for x in self.factors if x > 0] or [0.0])
        return {"name": self.name, "op_type": self.op_type, "weight": self.weight, "shape": list(self.shape),
                "params": self.params, "granularity": self.granularity, "codebooks": self.codebooks,
                "values_kept": self.values_kept, "distinct_before": self.distinct_before,
                "bits_per_weight": self.bits.per_weight(), "sensitivity": self.sensitivity,
                "sensitivity_proxy": self.sensitivity_proxy, "scale_source": self.scale_source,
                "weighted_rel_error": self.weighted_rel_error, "rel_error": self.rel_error,
                "predicted_error": self.predicted_error,
                "factor_median": float(np.median(f)), "factor_min": float(f.min()), "factor_max": float(f.max()),
                "codebooks_with_nms": int(sum(1 for c in self.nms if c > 0)),
                "bias": self.bias or "corrected or unchanged"}


@dataclasses.dataclass
class RDResult:
    layers: List[LayerInfo]
    total_bits: StoredBits
    predicted_error: float           # sqrt(Σ s_l D_l): predicted relative L2 error of the logits
    budget: Optional[float]
    target_bits: Optional[float]
    proxy: str
    gain_correction: bool
    bias_correction: bool
    weight_rel_error: float          # ‖W̃ - W‖ / ‖W‖ over all eligible weights
    seconds: dict

    @property
    def bits_per_weight(self) -> dict:
        return self.total_bits.per_weight()

    def to_dict(self) -> dict:
        return {"bits_per_weight": self.bits_per_weight, "weights": self.total_bits.weights,
                "predicted_error": self.predicted_error, "budget": self.budget, "target_bits": self.target_bits,
                "proxy": self.proxy, "gain_correction": self.gain_correction,
                "bias_correction": self.bias_correction,
                "weight_rel_error": self.weight_rel_error, "seconds": self.seconds,
                "layers": [l.to_dict() for l in self.layers]}


# --------------------------------------------------------------------------- the pass

@dataclasses.dataclass
class RDPlan:
    """What does not depend on the budget: layers, input statistics, sensitivities and the
    candidates (:func:`prepare`); pass it to :func:`rd_hash` to try several budgets."""

    views: List[LayerView]
    stats: List[InputStats]
    vins: List[np.ndarray]
    responses: List[Response]
    candidates: List[_LayerCands]
    proxy: str
    gain_correction: bool
    bias_correction: bool
    seconds: dict


def prepare(model: onnx.ModelProto, *, proxy: str = "synthetic", gain_correction: bool = True,
            bias_correction: bool = True, seed: int = 0, min_codebook_weights: int = MIN_CODEBOOK_WEIGHTS,
            granularities: Sequence[str] = GRANULARITIES, responses: Optional[List[Response]] = None,
            samples: int = SYNTHETIC_SAMPLES, group_step: int = 2, progress=None,
            workers: Optional[int] = None) -> RDPlan:
    """Layers, statistics, sensitivities (``proxy``, or the given ``responses``) and coarse
    candidates of ``model``. ``workers``: processes for the per-layer work (:mod:`.workers`:
    ``None`` chooses by the model's size; the plan does not depend on it)."""
    if proxy not in PROXIES:
        raise ValueError(f"proxy must be one of {PROXIES}, got {proxy!r}")
    t0 = time.perf_counter()
    views = layer_views(model)
    stats = input_stats(model, views)
    vins = [position_weights(v, st, bias_correction) for v, st in zip(views, stats)]
    t1 = time.perf_counter()
    if responses is None:
        responses = sensitivities(model, views, proxy, seed=seed, gain_correction=gain_correction,
                                  bias_correction=bias_correction, stats=stats, samples=samples,
                                  progress=(lambda k, n, name: progress(k, 2 * n, f"sensitivity {name}"))
                                  if progress else None, workers=workers)
    t2 = time.perf_counter()
    n = len(views)
    procs = _workers.resolve(workers, sum(v.params for v in views))
    cands = []
    if procs <= 1:
        for k, (v, vin) in enumerate(zip(views, vins)):
            if progress:
                progress(n + k, 2 * n, f"codebooks {v.name}")
            cands.append(layer_candidates(v, min_codebook_weights, vin, gain_correction, granularities, group_step))
        found = []
    else:
        shared = {"min_weights": min_codebook_weights, "gain": gain_correction,
                  "granularities": tuple(granularities), "group_step": group_step}
        found = _workers.pmap(_candidates_task, [(v, vin) for v, vin in zip(views, vins)], shared, procs,
                              progress=(lambda done, total, i: progress(n + done - 1, 2 * n,
                                                                        f"codebooks {views[i].name}"))
                              if progress else None, cost=[v.params for v in views])
    for v, vin, evaluated in zip(views, vins, found):
        lc = _layer_books(v, min_codebook_weights, vin, gain_correction, granularities, group_step)
        for g, rows in zip(lc.grans, evaluated):
            for b, (cache, keys) in zip(g.books, rows):
                b.rows, b.coarse_keys = cache, keys
        cands.append(lc)
    t3 = time.perf_counter()
    return RDPlan(views, stats, vins, list(responses), cands, proxy, gain_correction, bias_correction,
                  {"statistics": t1 - t0, "sensitivity": t2 - t1, "candidates": t3 - t2})


def rd_hash(model: onnx.ModelProto, budget: Optional[float] = 0.1, *, target_bits: Optional[float] = None,
            proxy: str = "synthetic", gain_correction: bool = True, bias_correction: bool = True, seed: int = 0,
            min_codebook_weights: int = MIN_CODEBOOK_WEIGHTS, granularities: Sequence[str] = GRANULARITIES,
            plan: Optional[RDPlan] = None, refine_rounds: int = REFINE_ROUNDS, refine_all: bool = True,
            samples: int = SYNTHETIC_SAMPLES, progress=None, workers: Optional[int] = None):
    """RD hashing of every eligible layer of ``model`` (module docstring).

    Args:
        model: the ONNX model (not changed).
        budget: predicted relative L2 error of the logits, ``sqrt(Σ_l s_l·D_l)``; ignored when
            ``target_bits`` is given.
        target_bits: instead, the stored bits per eligible weight (entropy count, tables
            included) not to exceed.
        proxy: the sensitivity, ``"synthetic"`` (default), ``"bn"`` or ``"params"``.
        gain_correction, bias_correction: the data-free corrections (:func:`correct`).
        seed: of the synthetic inputs and noise.
        plan: from :func:`prepare` for this model (then ``proxy``, the corrections, ``seed`` and
            ``min_codebook_weights`` are the plan's).
        workers: processes for the per-layer work of :func:`prepare` (``None``: the available
            cores on models of at least ``workers.POOL_MIN_WEIGHTS`` eligible weights); the
            result is the same, bit for bit.

    Returns:
        ``(new ModelProto, RDResult)``: the new model has the hashed weights as plain float32
        tensors (and corrected BatchNorm parameters / biases); the result has per-layer info.
    """
    if target_bits is not None:
        if not (target_bits > 0 and math.isfinite(target_bits)):
            raise ValueError(f"target_bits must be a positive number, got {target_bits!r}")
        budget = None
    elif budget is None or not (budget > 0 and math.isfinite(budget)):
        raise ValueError(f"budget must be a positive number, got {budget!r}")
    if plan is None and not scan_layers(model, tables=True).layers:  # nothing eligible: nothing to measure or choose
        out = onnx.ModelProto()
        out.CopyFrom(model)
        return out, RDResult([], ZERO_BITS, 0.0, budget, target_bits, proxy, gain_correction, bias_correction, 0.0, {})
    if plan is None:
        plan = prepare(model, proxy=proxy, gain_correction=gain_correction, bias_correction=bias_correction,
                       seed=seed, min_codebook_weights=min_codebook_weights, granularities=granularities,
                       samples=samples, progress=progress, workers=workers)
    t3 = time.perf_counter()
    candidates, responses = plan.candidates, plan.responses
    for lc in candidates:
        for g in lc.grans:
            g.pack()
    frontiers = [_frontier(lc) for lc in candidates]
    choices, err, _ = allocate(candidates, responses, budget, target_bits, frontiers)
    extra = [[[] for _ in g.books] for lc in candidates for g in lc.grans]
    extra_of = {}
    k = 0
    for li, lc in enumerate(candidates):
        for gi, _ in enumerate(lc.grans):
            extra_of[(li, gi)] = extra[k]
            k += 1
    for _ in range(refine_rounds):  # refine every granularity around its choice at the layer's slope
        grown = False
        for li, (lc, ch) in enumerate(zip(candidates, choices)):
            for gi, g in enumerate(lc.grans):
                if not refine_all and gi != ch.gran:
                    continue
                idx = np.argmin(g.bits + ch.lam * g.dist, axis=1)
                keys = extra_of[(li, gi)]
                wins = _refine(g.books, [float(curve.factor[j]) for curve, j in zip(g.curves, idx)])
                for kk, new in zip(keys, wins):
                    new = [x for x in new if x not in kk]
                    if new:
                        kk.extend(new)
                        grown = True
                g.pack(keys)
            frontiers[li] = _frontier(lc)
        if not grown:
            break
        choices, err, _ = allocate(candidates, responses, budget, target_bits, frontiers)
    t4 = time.perf_counter()

    out = onnx.ModelProto()
    out.CopyFrom(model)
    consts = ConstantTensors(out)
    infos = []
    total = ZERO_BITS
    sq_err = sq_ref = 0.0
    for lc, ch, resp, vin in zip(candidates, choices, responses, plan.vins):
        v = lc.view
        g = lc.grans[ch.gran]
        proto = consts.proto(v.weight)
        dtype = proto.data_type
        rows = v.rows.copy()
        factors, nmss, units = [], [], []
        values = 0
        table = g.map_bits
        ent = fix = 0.0
        for grp, book, curve, j in zip(g.groups, g.books, g.curves, ch.idx):
            f, c = float(curve.factor[j]), float(curve.nms[j])
            factors.append(f)
            nmss.append(c)
            if f <= 0:  # left as it is
                units.append(None)
                values += int(np.unique(v.rows[grp]).size)
                raw = 8 * np_dtype(dtype).itemsize  # RAW_BITS for float32, 16 for float16 / bfloat16
                ent += raw * v.rows[grp].size
                fix += raw * v.rows[grp].size
                continue
            r = _kde.hash_tensor(v.rows[grp], bandwidth_factor=f, nms_radius=c * book.base * f)
            rows[grp] = representable(r.hashed, dtype)  # float16 / bfloat16 weights: their own values
            units.append(_kde.grid_step(r.bandwidth) / 2 if r.bandwidth else None)
            t, e, x = codebook_bits(r)  # counted on the result itself
            values += r.distinct_after if dtype == onnx.TensorProto.FLOAT else int(np.unique(rows[grp]).size)
            table, ent, fix = table + t, ent + e, fix + x
        bits = StoredBits(v.params, table, fix, ent)
        total = total + bits
        proto.CopyFrom(tensor_like(proto, v.tensor(rows)))
        d_w = _distortion(v, vin, rows, plan.gain_correction)
        e_w = _distortion(v, vin, np.zeros_like(rows), False)
        diff = rows.astype(np.float64) - v.rows
        ref = float(np.sum(v.rows.astype(np.float64) ** 2))
        sq_err += float(np.sum(diff ** 2))
        sq_ref += ref
        label = g.label if any(x > 0 for x in factors) else "unchanged"
        infos.append(LayerInfo(v.name, v.op_type, v.weight, v.shape, v.params, label, len(g.groups), values,
                               int(np.unique(v.rows).size), bits, resp.slope, plan.proxy, v.scale_source,
                               math.sqrt(d_w / e_w) if e_w > 0 else 0.0,
                               math.sqrt(float(np.sum(diff ** 2)) / ref) if ref > 0 else 0.0,
                               math.sqrt(float(resp(d_w))), factors, nmss,
                               [list(map(int, grp)) for grp in g.groups], units=units, axis=v.axis))
    if plan.gain_correction or plan.bias_correction:
        notes = correct(model, out, plan.views, plan.stats, gain=plan.gain_correction, bias=plan.bias_correction)
        for info, note in zip(infos, notes):
            info.bias = note
    t5 = time.perf_counter()
    result = RDResult(infos, total, math.sqrt(max(err, 0.0)), budget, target_bits, plan.proxy,
                      plan.gain_correction, plan.bias_correction,
                      math.sqrt(sq_err / sq_ref) if sq_ref > 0 else 0.0,
                      {**plan.seconds, "allocation": t4 - t3, "apply": t5 - t4})
    return out, result
