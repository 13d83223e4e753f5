"""Consumer refit on a synthetic twin: what channel reduction removed, the consumers relearn, data-free.

After :mod:`redpp_onnx.passes.reduce` removed channels, every Conv that reads a reduced tensor
(the consumer) is refitted by least squares so that, on synthetic inputs, it reproduces the
original model's output of that Conv from what the reduced model now gives it:

    W', b' = argmin E ‖ y_orig − (W' · patches(x_reduced) + b') ‖² + λ ‖W'‖²,   λ = ``ridge`` × mean feature variance

with ``y_orig`` the consumer's output in the original model and ``x_reduced`` its input in the
reduced model (so the errors of the layers reduced before it are corrected too: the refit runs
consumer by consumer in graph order). This generalises the merge's one-partner, one-scale
compensation (METHOD.md Step 2) to every kept channel and every kernel tap. A MatMul consumer
``x[..., D] @ W`` (a transformer MLP's second layer) is refitted the same way, every token a row, when
a constant bias Add follows it (:func:`bias_add`: the intercept goes there); without one it keeps
its mean compensation, said in its row.

**No data is read.** The statistics come from a *synthetic twin*:

* synthetic inputs (:func:`synthetic_feeds`): an image-like input (rank 4, at most 4 channels)
  gets noise with natural-image statistics (amplitude spectrum 1/f over the spatial axes,
  channels correlated ``IMAGE_CHANNEL_CORRELATION``); other inputs get the verification's rules
  (``rd._synthetic_inputs``: standard normal floats, token ids in range);
* each BatchNormalization sees the batch statistics of its input under a forward pass in which
  every BatchNorm input is renormalized to its running mean and variance (:func:`bn_batch_stats`),
  so that every layer's channels have the first and second moments the trained model expects;
  the twin is the model with those batch statistics as running statistics: on the synthetic
  inputs it computes exactly that renormalized forward, and it is an ordinary ONNX model that the
  reduction edits like the original. A model without BatchNorm is its own twin (noted).

How many synthetic images: enough that the largest refit sees ``ROWS_PER_FEATURE`` rows (output
positions × images) per unknown, at most ``MAX_INPUT_ELEMENTS`` input values in all.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np
import onnx
from onnx import helper, numpy_helper

IMAGE_CHANNEL_CORRELATION = 0.8
"""Correlation of the colour channels of synthetic images (natural RGB images: about 0.8-0.95)."""
ROWS_PER_FEATURE = 32
MIN_IMAGES, MAX_INPUT_ELEMENTS, BATCH_ELEMENTS = 64, 1 << 24, 1 << 20
RIDGE = 1e-3


class RefitUnavailable(Exception):
    """No synthetic inputs can be made for this model (the reason is the message)."""


@dataclasses.dataclass
class RefitRow:
    """One refitted consumer (a report row): relative error of its output on the synthetic twin."""

    name: str
    features: int
    rows: int
    error_before: float                # ‖y_orig − y_reduced‖ / ‖y_orig − mean‖ before the refit
    error_after: float
    refitted: bool = True
    reason: str = ""


# --------------------------------------------------------------------------- synthetic inputs

def _image_like(shape) -> bool:
    return len(shape) == 4 and all(isinstance(d, int) and d > 0 for d in shape[1:]) and shape[1] <= 4


def natural_noise(rng: np.random.Generator, shape) -> np.ndarray:
    """``shape`` = (N, C, H, W): zero-mean, unit-variance noise per channel with a 1/f amplitude
    spectrum over (H, W) and colour channels correlated ``IMAGE_CHANNEL_CORRELATION``."""
    n, c = shape[:2]
    x = rng.standard_normal((n, c + 1) + tuple(shape[2:]))
    r = IMAGE_CHANNEL_CORRELATION
    x = math.sqrt(r) * x[:, c:] + math.sqrt(1 - r) * x[:, :c]  # a common part and one of each channel's own
    h, w = shape[-2:]
    f = np.sqrt(np.fft.fftfreq(h)[:, None] ** 2 + np.fft.fftfreq(w)[None, :] ** 2)
    f[0, 0] = 1.0 / max(h, w)
    y = np.real(np.fft.ifft2(np.fft.fft2(x) / f))
    y -= y.mean(axis=(-2, -1), keepdims=True)
    y /= np.maximum(y.std(axis=(-2, -1), keepdims=True), 1e-12)
    return y.astype(np.float32)


def synthetic_feeds(model: onnx.ModelProto, images: int, seed: int = 0) -> List[dict]:
    """``images`` synthetic samples in batches (:data:`BATCH_ELEMENTS` input values at most each)."""
    from ..analysis.layers import static_shapes
    from ..hashing import rd

    shapes = static_shapes(model)
    inits = {t.name for t in model.graph.initializer}
    inputs = [i for i in model.graph.input if i.name not in inits]
    batch = max(1, min(images, BATCH_ELEMENTS // _values_per_sample(model, shapes)))
    batch = rd._fixed_batch(model) or batch  # an export with a static batch runs in batches of that size
    rng = np.random.default_rng(seed)
    feeds = []
    for b in range(max(1, images // batch)):
        try:
            f = rd._synthetic_inputs(model, batch, seed=seed + 1000 + b)
        except rd.SyntheticInputsUnavailable as err:
            raise RefitUnavailable(str(err)) from err
        for i in inputs:
            shp = shapes.get(i.name)
            if shp and _image_like(shp) and f.get(i.name) is not None and f[i.name].dtype == np.float32:
                f[i.name] = natural_noise(rng, (batch, *shp[1:]))
        feeds.append(f)
    return feeds


def images_needed(model: onnx.ModelProto, fits: List[tuple]) -> int:
    """The rule above: ``fits`` = [(features, output positions per image)]."""
    from ..analysis.layers import static_shapes

    want = max([math.ceil(ROWS_PER_FEATURE * f / max(p, 1)) for f, p in fits] + [MIN_IMAGES])
    return int(max(1, min(want, MAX_INPUT_ELEMENTS // _values_per_sample(model, static_shapes(model)))))


def _values_per_sample(model: onnx.ModelProto, shapes: dict) -> int:
    """Input values of one sample (every graph input that is not a constant, at its static shape)."""
    inits = {t.name for t in model.graph.initializer}
    return max(sum(math.prod(shapes[i.name][1:]) for i in model.graph.input
                   if i.name not in inits and shapes.get(i.name)), 1)


# --------------------------------------------------------------------------- the twin

def _session(model: onnx.ModelProto, outputs: List[str]):
    """A session computing ``outputs`` only: the graph cut after the nodes they need."""
    from ..io import runtime_ir_version
    from ..runtime import session

    need, keep = set(outputs), []
    for node in reversed(model.graph.node):
        if any(o in need for o in node.output) or node.op_type in ("If", "Loop", "Scan"):
            keep.append(node)
            need.update(node.input)
    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph
    del g.node[:]
    g.node.extend(reversed(keep))
    inits = [t for t in g.initializer if t.name in need]
    del g.initializer[:]
    g.initializer.extend(inits)
    types = {v.name: v.type.tensor_type.elem_type for v in list(g.value_info) + list(g.input) + list(g.output)}
    if any(not types.get(name) for name in outputs):  # the element types of the cut: from shape inference
        try:
            inferred = onnx.shape_inference.infer_shapes(m).graph.value_info
            types.update({v.name: v.type.tensor_type.elem_type for v in inferred})
        except Exception:  # noqa: BLE001 -- a graph the checker cannot type: float32 below
            pass
    del g.output[:]
    for name in outputs:
        g.output.append(helper.make_tensor_value_info(name, types.get(name) or onnx.TensorProto.FLOAT, None))
    m.ir_version = runtime_ir_version(m)
    return session(m, intra_op_num_threads=2)


def _renormalized(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy whose every BatchNormalization input is first renormalized per channel, over (N, spatial),
    to the node's running mean and variance."""
    from ..analysis.coupling import _opset

    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph
    consts = {t.name: t for t in g.initializer}
    opset = _opset(m)
    nodes = []
    for k, n in enumerate(g.node):
        if n.op_type != "BatchNormalization" or n.input[3] not in consts or n.input[4] not in consts:
            nodes.append(n)
            continue
        stored = numpy_helper.to_array(consts[n.input[3]])
        dtype = stored.dtype  # the BatchNorm's own type (float16 models: float16 constants)
        mean = stored.astype(np.float64).ravel()
        var = numpy_helper.to_array(consts[n.input[4]]).astype(np.float64).ravel()
        p = f"_redpp_rn{k}_"
        shape = (1, -1, 1, 1)
        tiny = 1e-12 if dtype != np.float16 else 1e-7
        g.initializer.extend([numpy_helper.from_array(mean.reshape(shape).astype(dtype), p + "mu"),
                              numpy_helper.from_array(np.sqrt(var).reshape(shape).astype(dtype), p + "sd"),
                              numpy_helper.from_array(np.array(tiny, dtype), p + "eps")])
        if opset >= 18:
            g.initializer.append(numpy_helper.from_array(np.array([0, 2, 3], np.int64), p + "ax"))

        def rmean(x, y):
            if opset >= 18:
                return helper.make_node("ReduceMean", [x, p + "ax"], [y], keepdims=1)
            return helper.make_node("ReduceMean", [x], [y], axes=[0, 2, 3], keepdims=1)

        z = n.input[0]
        nodes += [rmean(z, p + "m"), helper.make_node("Sub", [z, p + "m"], [p + "d"]),
                  helper.make_node("Mul", [p + "d", p + "d"], [p + "d2"]), rmean(p + "d2", p + "v"),
                  helper.make_node("Add", [p + "v", p + "eps"], [p + "ve"]), helper.make_node("Sqrt", [p + "ve"], [p + "s"]),
                  helper.make_node("Div", [p + "d", p + "s"], [p + "u"]), helper.make_node("Mul", [p + "u", p + "sd"], [p + "us"]),
                  helper.make_node("Add", [p + "us", p + "mu"], [p + "z"])]
        n2 = onnx.NodeProto()
        n2.CopyFrom(n)
        n2.input[0] = p + "z"
        nodes.append(n2)
    del g.node[:]
    g.node.extend(nodes)
    return m


def bn_batch_stats(model: onnx.ModelProto, feeds: List[dict]) -> Dict[int, tuple]:
    """Per BatchNormalization node index: (mean, variance) of its input under the renormalized forward."""
    bns = [k for k, n in enumerate(model.graph.node) if n.op_type == "BatchNormalization"
           and len(model.graph.node[k].input) >= 5]
    if not bns:
        return {}
    names = [model.graph.node[k].input[0] for k in bns]
    sess = _session(_renormalized(model), names)
    acc = {}
    for f in feeds:
        for k, z in zip(bns, sess.run(names, f)):
            z = np.asarray(z, np.float64)
            x = np.moveaxis(z, 1, 0).reshape(z.shape[1], -1)
            s1, s2, c = acc.get(k, (0.0, 0.0, 0))
            acc[k] = (s1 + x.sum(1), s2 + (x * x).sum(1), c + x.shape[1])
    return {k: (s1 / c, np.maximum(s2 / c - (s1 / c) ** 2, 0.0)) for k, (s1, s2, c) in acc.items()}


def twin(model: onnx.ModelProto, stats: Dict[int, tuple]) -> onnx.ModelProto:
    """The model with each BatchNorm's running statistics replaced by ``stats`` (own copies)."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    consts = {t.name: t for t in m.graph.initializer}
    for k, (mean, var) in stats.items():
        n = m.graph.node[k]
        for idx, arr in ((3, mean), (4, var)):
            name = f"{n.input[idx]}_redpp_twin{k}"
            dtype = numpy_helper.to_array(consts[n.input[idx]]).dtype
            m.graph.initializer.append(numpy_helper.from_array(arr.astype(dtype), name))
            n.input[idx] = name
    return m


# --------------------------------------------------------------------------- least squares

def add_moments(acc: Optional[list], xp: np.ndarray, yy: np.ndarray) -> list:
    """``acc`` (``[Σ xxᵀ, Σ xyᵀ, Σ x, Σ y, n]``, or None to start) with the rows ``xp`` -> ``yy`` added."""
    if acc is None:
        acc = [0.0, 0.0, 0.0, 0.0, 0]
    acc[0] = acc[0] + xp.T @ xp
    acc[1] = acc[1] + xp.T @ yy
    acc[2] = acc[2] + xp.sum(0)
    acc[3] = acc[3] + yy.sum(0)
    acc[4] += len(xp)
    return acc


def covariances(mom) -> tuple:
    """``(cov xx, cov xy, mean x, mean y)`` of the moments of :func:`add_moments`."""
    sxx, sxy, sx, sy, n = mom
    mx, my = sx / n, sy / n
    return sxx / n - np.outer(mx, mx), sxy / n - np.outer(mx, my), mx, my


def ridge_solve(mom, keep: Optional[np.ndarray] = None) -> tuple:
    """The ridge least squares ``(W [outputs, features], b, cov xx, cov xy)`` on the features ``keep``
    (all by default), λ = ``RIDGE`` × their mean variance."""
    cxx, cxy, mx, my = covariances(mom)
    if keep is not None:
        cxx, cxy, mx = cxx[np.ix_(keep, keep)], cxy[keep], mx[keep]
    lam = RIDGE * max(float(np.mean(np.diag(cxx))), 1e-30)
    w = np.linalg.solve(cxx + lam * np.eye(len(cxx)), cxy).T
    return w, my - w @ mx, cxx, cxy


def first_output(model: onnx.ModelProto, feeds: List[dict]) -> np.ndarray:
    """The model's first graph output on ``feeds``, each batch's values flattened and concatenated (float64)."""
    name = model.graph.output[0].name
    sess = _session(model, [name])
    return np.concatenate([np.asarray(sess.run([name], f)[0], np.float64).ravel() for f in feeds])


# --------------------------------------------------------------------------- the refit

def _patches(x: np.ndarray, node: onnx.NodeProto, wshape) -> np.ndarray:
    """im2col of a Conv's input (N, C, H, W) -> (N·H'·W', C·kh·kw), in the weight's (c, kh, kw) order."""
    at = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    kh, kw = wshape[2], wshape[3]
    pads = list(at.get("pads", [0, 0, 0, 0]))
    st, dl = list(at.get("strides", [1, 1])), list(at.get("dilations", [1, 1]))
    n, c, h, w = x.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])))
    ho = (h + pads[0] + pads[2] - dl[0] * (kh - 1) - 1) // st[0] + 1
    wo = (w + pads[1] + pads[3] - dl[1] * (kw - 1) - 1) // st[1] + 1
    cols = np.empty((n, ho, wo, c, kh, kw), x.dtype)
    for i in range(kh):
        for j in range(kw):
            cols[..., i, j] = xp[:, :, i * dl[0]: i * dl[0] + st[0] * ho: st[0],
                                 j * dl[1]: j * dl[1] + st[1] * wo: st[1]].transpose(0, 2, 3, 1)
    return cols.reshape(-1, c * kh * kw)


def bias_add(model: onnx.ModelProto, j: int, consts=None) -> Optional[Tuple[int, int]]:
    """``(node index, input position)`` of the bias of MatMul node ``j``: the only reader of its output is
    an Add with a constant of the weight's output width (every other axis 1); None otherwise.
    ``consts``: the model's ``ConstantTensors`` when the caller has them."""
    from ..analysis.layers import ConstantTensors

    g = model.graph
    node = g.node[j]
    readers = [(i, n) for i, n in enumerate(g.node) if node.output[0] in n.input]
    if len(readers) != 1 or readers[0][1].op_type != "Add" or any(o.name == node.output[0] for o in g.output):
        return None
    i, add = readers[0]
    k = 1 - list(add.input).index(node.output[0])
    consts = ConstantTensors(model) if consts is None else consts
    if add.input[k] not in consts or node.input[1] not in consts:
        return None
    c, w = consts.array(add.input[k]), consts.array(node.input[1])
    if w.ndim != 2 or c.size != w.shape[1] or c.shape[-1] != w.shape[1]:
        return None
    return i, k


def refittable(node: onnx.NodeProto, model: Optional[onnx.ModelProto] = None) -> Optional[str]:
    """None when the refit handles this consumer, else why not (a MatMul needs ``model``: its bias
    is the Add after it)."""
    if node.op_type == "MatMul":
        j = next((i for i, n in enumerate(model.graph.node) if n.output[0] == node.output[0]), None) \
            if model is not None else None
        if j is None or bias_add(model, j) is None:
            return "MatMul consumer without a constant bias Add after it: not refitted (no place for the intercept)"
        return None
    if node.op_type != "Conv":
        return f"{node.op_type} consumer: not refitted (the mean compensation stays)"
    at = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    if at.get("group", 1) != 1:
        return "grouped Conv consumer: not refitted"
    if at.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
        return "Conv with auto_pad: not refitted"
    return None


@dataclasses.dataclass
class Twin:
    """The synthetic twin of a model: its BatchNorms at the synthetic batch statistics, and the
    synthetic inputs it was measured on (one twin serves every reduction of the same model)."""

    model: onnx.ModelProto
    feeds: List[dict]
    has_bn: bool
    memo: dict = dataclasses.field(default_factory=dict)  # measurements on this twin (twin_plan), by their settings

    @property
    def images(self) -> int:
        return len(self.feeds) * (len(next(iter(self.feeds[0].values()))) if self.feeds and self.feeds[0] else 0)


def make_twin(original: onnx.ModelProto, consumers: List[int], images: Optional[int] = None, seed: int = 0) -> Twin:
    """The twin, with enough images for refitting the Conv ``consumers`` (node indices) by
    :func:`images_needed`'s rule (their full input: the most a reduction leaves)."""
    from ..analysis.layers import ConstantTensors, static_shapes

    consts, shapes, fits = ConstantTensors(original), static_shapes(original), []
    for j in sorted(set(consumers)):
        node = original.graph.node[j]
        if refittable(node, original) is None:
            out_shape = shapes.get(node.output[0])
            inner = (out_shape[2:] if node.op_type == "Conv" else out_shape[1:-1]) if out_shape else None
            pos = math.prod(inner) if inner is not None and all(isinstance(d, int) for d in inner) else 1
            w = consts.array(node.input[1])
            fits.append(((w[0].size if node.op_type == "Conv" else w.shape[0]) + 1, pos))
    feeds = synthetic_feeds(original, images or images_needed(original, fits), seed)
    stats = bn_batch_stats(original, feeds)
    return Twin(twin(original, stats), feeds, bool(stats))


def refit(original: onnx.ModelProto, reduced: onnx.ModelProto, edit: Callable[[onnx.ModelProto], onnx.ModelProto],
          consumers: List[int], twin_: Optional[Twin] = None, images: Optional[int] = None, seed: int = 0,
          progress: Optional[Callable[[int, int], None]] = None) -> tuple:
    """Refit the Conv ``consumers`` (node indices, the same in both models) of ``reduced``
    (= the reduction of ``original``) in place; ``edit`` applies the same reduction to the twin
    (``twin_``, made here when None). Returns ``(rows, notes, predicted drift or None)``."""
    notes, rows, todo = [], [], []
    for j in sorted(set(consumers)):
        node = reduced.graph.node[j]
        why = refittable(node, reduced) if node.output[0] == original.graph.node[j].output[0] else \
            "graph changed around it"
        if why is not None:
            rows.append(RefitRow(node.name, 0, 0, float("nan"), float("nan"), False, why))
        else:
            todo.append(j)
    if not todo:
        return rows, notes, None
    tw = twin_ or make_twin(original, todo, images, seed)
    if not tw.has_bn:
        notes.append("refit: no BatchNormalization, the synthetic inputs run through the model as they are")
    tw1 = edit(tw.model)
    done = []
    for t, j in enumerate(todo):
        if progress is not None:
            progress(t, len(todo))
        done.append(_refit_one(tw.model, tw1, reduced, j, tw.feeds))
    rows += done
    kinds = "/".join(sorted({reduced.graph.node[j].op_type for j in todo}))
    notes.append(f"refit: {sum(r.refitted for r in done)} of {len(todo)} consumer {kinds}(s) refitted by least squares "
                 f"on {tw.images} synthetic samples (the model's synthetic inputs: natural-image noise for images, "
                 "token ids uniform over their table; BatchNorm inputs at their running moments), data-free; the "
                 "others say why in their rows")
    drift = twin_drift(tw, tw1)
    if drift is not None:
        notes.append(f"predicted output drift (relative L2 on the synthetic twin, data-free): {drift:.4f}")
    return rows, notes, drift


def twin_drift(tw: Twin, reduced_twin: onnx.ModelProto) -> Optional[float]:
    """Relative L2 distance of the first graph output, reduced twin vs twin, on the twin's inputs
    (a data-free prediction of how far the reduction moves the model); None when not comparable."""
    a, b = first_output(tw.model, tw.feeds), first_output(reduced_twin, tw.feeds)
    if a.shape != b.shape:
        return None
    num, den = float(np.sum((a - b) ** 2)), float(np.sum(a * a))
    return math.sqrt(num / den) if den > 0 else None


def _fit(name: str, nf: int, rows) -> tuple:
    """The least squares of one consumer: ``rows`` yields ``(x rows, y rows, the current prediction of
    y)`` per batch of the twin, or None when the consumer lost outputs too. ``(RefitRow, W, b)``; W and
    b are None when the fit is not taken (too few rows per unknown, or no better on the twin: the row
    says why)."""
    mom, syy, err0 = None, 0.0, 0.0
    for batch in rows:
        if batch is None:
            return RefitRow(name, nf, 0, float("nan"), float("nan"), False, "consumer lost outputs too"), None, None
        xp, yy, pred = batch
        err0 += float(np.sum((pred - yy) ** 2))
        mom = add_moments(mom, xp, yy)
        syy += float(np.sum(yy * yy))
    n = mom[4] if mom is not None else 0
    if n < ROWS_PER_FEATURE * nf:
        return RefitRow(name, nf, n, float("nan"), float("nan"), False,
                        f"{n:,} synthetic rows for {nf:,} unknowns: fewer than {ROWS_PER_FEATURE} per unknown "
                        f"(the input budget of {MAX_INPUT_ELEMENTS:,} values allows no more samples)"), None, None
    wn, bn, cxx, cxy = ridge_solve(mom)
    my = mom[3] / n
    total = syy - n * float(my @ my)
    # residual energy of the fit (training error on the synthetic twin)
    cyy_fit = float(np.trace(wn @ cxx @ wn.T) - 2 * np.trace(wn @ cxy) + (total / n))
    err1 = math.sqrt(max(cyy_fit, 0.0) * n / max(total, 1e-300))
    e0 = math.sqrt(err0 / max(total, 1e-300))
    if not err1 < e0:  # never make it worse on the twin
        return RefitRow(name, nf, n, e0, e0, False, "least squares did not improve on the twin"), None, None
    return RefitRow(name, nf, n, e0, err1), wn, bn


def _refit_one(tw0, tw1, reduced, j: int, feeds) -> RefitRow:
    from ..passes.editors import EditContext

    node1 = tw1.graph.node[j]
    if node1.op_type == "MatMul":
        return _refit_matmul(tw0, tw1, reduced, j, feeds)
    ctx1 = EditContext(tw1)
    w = ctx1.get(j, 1).astype(np.float64)
    if w.ndim != 4:
        return RefitRow(node1.name, 0, 0, float("nan"), float("nan"), False, f"{w.ndim - 2}-D Conv: not refitted")
    has_bias = len(node1.input) > 2 and bool(node1.input[2])
    b = ctx1.get(j, 2).astype(np.float64) if has_bias else np.zeros(w.shape[0])
    sess = _session(tw1, [node1.input[0]])
    y_name = tw0.graph.node[j].output[0]
    ref_sess = _session(tw0, [y_name])
    wf = w.reshape(w.shape[0], -1)

    def rows():
        for f in feeds:
            x = np.asarray(sess.run([node1.input[0]], f)[0], np.float64)
            y = np.asarray(ref_sess.run([y_name], f)[0], np.float64)
            if y.shape[1] != w.shape[0]:
                yield None
                return
            xp = _patches(x, node1, w.shape)
            yield xp, np.moveaxis(y, 1, -1).reshape(-1, y.shape[1]), xp @ wf.T + b

    row, wn, bn = _fit(node1.name, w[0].size, rows())
    if wn is None:
        return row
    for m in (tw1, reduced):
        ctx = EditContext(m)
        ctx.set(j, 1, wn.reshape(w.shape).astype(ctx.get(j, 1).dtype))
        if has_bias:
            ctx.set(j, 2, bn.astype(ctx.get(j, 2).dtype))
        else:
            ctx.append_input(j, 2, bn.astype(np.float32))
        ctx.commit()
    return row


def _refit_matmul(tw0, tw1, reduced, j: int, feeds) -> RefitRow:
    """A MatMul consumer ``x[..., D] @ W[D, F]`` and the bias Add after it: refitted like a 1x1 Conv
    (every token a row), the intercept into the Add's constant."""
    from ..passes.editors import EditContext

    node1 = tw1.graph.node[j]
    add_j, k = bias_add(tw1, j)
    ctx1 = EditContext(tw1)
    w = ctx1.get(j, 1).astype(np.float64)             # [D kept, F]
    c0 = EditContext(tw0).get(add_j, k).astype(np.float64).reshape(-1)  # the original bias
    shift = ctx1.get(add_j, k).astype(np.float64).reshape(-1) - c0     # what the compensation added
    sess = _session(tw1, [node1.input[0]])
    y_name = tw0.graph.node[j].output[0]
    ref_sess = _session(tw0, [y_name])

    def rows():
        for f in feeds:
            x = np.asarray(sess.run([node1.input[0]], f)[0], np.float64).reshape(-1, w.shape[0])
            y = np.asarray(ref_sess.run([y_name], f)[0], np.float64)
            if y.shape[-1] != w.shape[1]:
                yield None
                return
            yield x, y.reshape(-1, y.shape[-1]), x @ w + shift

    row, wn, bn = _fit(node1.name, w.shape[0], rows())
    if wn is None:
        return row
    for m in (tw1, reduced):
        ctx = EditContext(m)
        ctx.set(j, 1, wn.T.astype(ctx.get(j, 1).dtype))
        c = ctx.get(add_j, k)
        ctx.set(add_j, k, (c0 + bn).reshape(c.shape).astype(c.dtype))
        ctx.commit()
    return row
