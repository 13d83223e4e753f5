"""Numerical check of a rewritten model against the original, in onnxruntime.

The reference runs with graph optimizations off (nothing fused that could differ); the
candidate runs as a user would run it. The figure is the relative L2 difference per output,
pooled over all samples, ``sqrt(sum ||out - ref||^2 / sum ||ref||^2)``, and its maximum over the
outputs (what ``--max-rel-l2`` gates); per output also the cosine similarity per sample (mean
and min) and the max |diff|.

**Inputs.** Data-free by default: synthetic inputs drawn from ``numpy.random.default_rng(seed)``,
per input by these rules, in this order (the report's ``verify.inputs`` says, per input, which
one applied, with its distribution and range):

* bool inputs: ``True``;
* a name containing ``mask`` (any type): all ones (nothing masked);
* integer inputs whose name contains ``type`` or ``segment``: 0 (the first segment);
* integer inputs used as the indices of a ``Gather`` on a constant table (directly or through
  ``Cast``/``Unsqueeze``/``Squeeze``/``Reshape``/``Flatten``/``Identity``/``Expand``/
  ``Transpose``/``Slice``/``Tile``, or ``com.microsoft::EmbedLayerNormalization``): token ids,
  uniform in ``[0, vocabulary)``, the vocabulary being the size of the table along the gathered axis
  (the smallest table when there are several);
* other ``uint8``/``int8`` inputs: their full range (e.g. image pixels);
* other integers: 0 or 1 (a range no index or count can overflow);
* floats: standard normal.

The batch axis (a dynamic first dimension) is ``batch`` samples per run; other dynamic dims take
the shapes given (``--input-shape``) or else ``GUESS_DIM``, or the first of ``GUESS_FALLBACKS`` at
which the input model runs (said in the report). With ``data``
(``--verify-data``: an npz of named inputs, checked against the model) every sample of it is used
instead, ``batch`` at a time.

**How many samples (synthetic inputs).** One batch of 2 gives a noisy figure (ResNet-20 hashed:
relative L2 0.014-0.030 over 20 seeds). Runs of ``batch`` samples are added until the figure is
known: at least ``MIN_SAMPLES``, then until the standard error of every output's pooled relative
L2 (the delta method on the per-sample squared norms) is at most ``TARGET_REL_SE`` of the gate
figure (or below ``ABS_SE_FLOOR``), at most ``MAX_SAMPLES``; and never past a time budget
(``seconds`` of run time, checked after each run, so at least one run). The sample count is thus a
function of the seed and the model only, unless the time budget stops it (reported in
``stopped``). ``samples=N`` runs exactly N samples instead.
"""

from __future__ import annotations

import dataclasses
import math
import re
import time
from typing import Optional

import numpy as np
import onnx
import onnxruntime as ort

from . import io
from .errors import RedppError
from .runtime import ORT_ERRORS, session

_NP_TYPE = {onnx.TensorProto.FLOAT: np.float32, onnx.TensorProto.DOUBLE: np.float64,
            onnx.TensorProto.FLOAT16: np.float16, onnx.TensorProto.INT64: np.int64,
            onnx.TensorProto.INT32: np.int32, onnx.TensorProto.INT16: np.int16,
            onnx.TensorProto.BOOL: np.bool_, onnx.TensorProto.UINT8: np.uint8,
            onnx.TensorProto.INT8: np.int8, onnx.TensorProto.UINT16: np.uint16,
            onnx.TensorProto.UINT32: np.uint32, onnx.TensorProto.UINT64: np.uint64}


GUESS_DIM = 64
GUESS_FALLBACKS = (32, 16, 8, 4, 2, 1)
"""Sizes tried in turn for the guessed dynamic dims when the input model does not run at ``GUESS_DIM``
(e.g. a transformer whose learned position table has 16 rows: a sequence of 64 fails in its Add);
the first size at which the input model runs is verified (said in the report)."""
"""A dynamic dimension other than the batch, without a shape from the user, gets this size."""
UNKNOWN_INTEGERS = "integers of unknown use"
"""How the rule for integer inputs that index no table begins its ``why`` (no sample fits them)."""
MAX_INPUT_ELEMENTS = 1 << 28
"""A synthetic batch of one input has at most this many values (1 GiB of float32); a larger
one (a dimension of absurd size) is refused with the reason instead of exhausting memory."""
MIN_SAMPLES = 32
"""Synthetic inputs: at least this many samples (unless the time budget stops the runs first)."""
MAX_SAMPLES = 512
"""Synthetic inputs: at most this many samples."""
TARGET_REL_SE = 0.02
"""Stop when every output's standard error is at most this fraction of the gate figure: 20 seeds
then stay within about +-5 % of each other (ResNet-20 hashed: 0.0195-0.0209 at 96 samples)."""
ABS_SE_FLOOR = 1e-6
"""... or below this (an exact rewrite, whose differences are float rounding)."""
VERIFY_SECONDS = 10.0
"""Synthetic inputs: no new run after this many seconds of runs (both models)."""

_PASS_THROUGH = {"Cast", "Identity", "Unsqueeze", "Squeeze", "Reshape", "Flatten", "Expand", "Transpose",
                 "Slice", "Tile"}
_EMBED_LAYER_NORM_TABLE = {0: 2, 1: 4}  # com.microsoft::EmbedLayerNormalization: ids -> word, segment -> segment


@dataclasses.dataclass(frozen=True)
class InputPlan:
    """How one synthetic input is drawn; ``shape`` is one run's (the batch first)."""

    name: str
    dtype: np.dtype
    shape: tuple
    distribution: str           # "standard normal", "uniform integers" or "constant"
    low: Optional[int] = None   # uniform integers: inclusive bounds
    high: Optional[int] = None
    value: object = None        # constant
    why: str = ""
    batched: bool = False       # the first dimension is the (dynamic) batch axis

    def draw(self, rng: np.random.Generator) -> np.ndarray:
        if self.distribution == "standard normal":
            return rng.standard_normal(self.shape).astype(self.dtype)
        if self.distribution == "uniform integers":
            return rng.integers(self.low, self.high, self.shape, dtype=np.int64, endpoint=True).astype(self.dtype)
        return np.full(self.shape, self.value, dtype=self.dtype)

    def to_dict(self) -> dict:
        d = {"dtype": str(np.dtype(self.dtype)), "shape": list(self.shape), "distribution": self.distribution}
        if self.distribution == "standard normal":
            d.update(mean=0.0, std=1.0)
        elif self.distribution == "uniform integers":
            d["range"] = [self.low, self.high]
        else:
            d["value"] = self.value
        d["why"] = self.why
        return d

    def describe(self) -> str:
        if self.distribution == "uniform integers":
            return f"{self.name} uniform integers {self.low}..{self.high}"
        if self.distribution == "constant":
            return f"{self.name} all {self.value}"
        return f"{self.name} standard normal"


@dataclasses.dataclass(frozen=True)
class VerifyResult:
    """The comparison; ``to_dict()`` is the report's ``verify``: ``data`` ("synthetic" or "user"),
    ``source`` (the --verify-data file), ``inputs`` (per input: ``dtype``, ``shape`` of one run (the
    whole array for user data), ``distribution`` ("standard normal" with ``mean``/``std``, "uniform
    integers" with the inclusive ``range``, "constant" with ``value``, or "user data" with the observed
    ``range``) and ``why``), ``samples``, ``runs``, ``batch`` (samples in one run), ``seed`` (null for
    user data), ``stopped`` (why no more samples were drawn), ``input_shapes``, ``guessed_dims``,
    ``max_abs_diff``, ``max_rel_l2``, ``rel_l2_stderr`` (standard error of the latter, delta method)
    and ``outputs`` (per output ``name``, ``max_abs_diff``, ``rel_l2``, ``cosine_mean``,
    ``cosine_min``)."""

    batch: int
    seed: Optional[int]
    max_abs_diff: float
    max_rel_l2: float          # max over outputs of the pooled ‖out - ref‖ / ‖ref‖
    outputs: tuple             # per output: dict name, max_abs_diff, rel_l2, cosine_mean, cosine_min
    input_shapes: dict = dataclasses.field(default_factory=dict)  # name -> shape fed in one run
    guessed: tuple = ()        # inputs with a dynamic dim set to GUESS_DIM
    data: str = "synthetic"    # or "user" (--verify-data)
    source: Optional[str] = None
    inputs: dict = dataclasses.field(default_factory=dict)  # name -> what was fed (InputPlan.to_dict)
    samples: int = 0
    runs: int = 0
    stopped: str = ""          # why no more samples were drawn
    rel_l2_stderr: Optional[float] = None  # standard error of max_rel_l2's output

    def to_dict(self) -> dict:
        d = {"data": self.data}
        if self.source is not None:
            d["source"] = self.source
        d.update({"inputs": self.inputs, "samples": self.samples, "runs": self.runs, "batch": self.batch,
                  "seed": self.seed, "stopped": self.stopped,
                  "input_shapes": {k: list(v) for k, v in self.input_shapes.items()},
                  "guessed_dims": list(self.guessed),
                  "max_abs_diff": self.max_abs_diff, "max_rel_l2": self.max_rel_l2,
                  "rel_l2_stderr": self.rel_l2_stderr, "outputs": [dict(o) for o in self.outputs]})
        return d


# --------------------------------------------------------------------------- synthetic inputs

class _Graph:
    """What the input rules need to know about a graph: consumers and constant shapes."""

    def __init__(self, model: onnx.ModelProto):
        g = model.graph
        self.init = {t.name: tuple(t.dims) for t in g.initializer}
        self.consumers, self.producer = {}, {}
        for node in g.node:
            for i, t in enumerate(node.input):
                self.consumers.setdefault(t, []).append((node, i))
            for t in node.output:
                self.producer[t] = node

    def const_shape(self, name: str, depth: int = 0) -> Optional[tuple]:
        if name in self.init:
            return self.init[name]
        node = self.producer.get(name)
        if node is None or depth > 8:
            return None
        if node.op_type == "Constant":
            for a in node.attribute:
                if a.name == "value":
                    return tuple(a.t.dims)
            return None
        if node.op_type in ("Identity", "Cast", "DequantizeLinear") and node.input:
            return self.const_shape(node.input[0], depth + 1)
        return None

    def vocabulary(self, name: str) -> Optional[tuple]:
        """(size, table, node) of the smallest constant table ``name`` indexes, or None."""
        found, frontier, seen = [], [(name, 0)], set()
        while frontier:
            t, depth = frontier.pop()
            if t in seen:
                continue
            seen.add(t)
            for node, idx in self.consumers.get(t, []):
                table_idx = None
                if node.op_type == "Gather" and node.domain in ("", "ai.onnx") and idx == 1:
                    table_idx = 0
                elif node.op_type == "EmbedLayerNormalization" and idx in _EMBED_LAYER_NORM_TABLE:
                    table_idx = _EMBED_LAYER_NORM_TABLE[idx]
                if table_idx is not None and len(node.input) > table_idx:
                    shape = self.const_shape(node.input[table_idx])
                    axis = next((a.i for a in node.attribute if a.name == "axis"), 0) if node.op_type == "Gather" else 0
                    if shape and -len(shape) <= axis < len(shape) and shape[axis] > 0:
                        found.append((int(shape[axis]), node.input[table_idx], node.name or node.op_type))
                elif node.op_type in _PASS_THROUGH and idx == 0 and depth < 8 and node.output:
                    frontier.append((node.output[0], depth + 1))
        return min(found) if found else None


def _rule(graph: _Graph, name: str, dtype: np.dtype) -> dict:
    """The distribution of one input (InputPlan fields), by the rules of the module docstring."""
    lname = name.lower()
    kind = np.dtype(dtype).kind
    if kind == "b":
        return dict(distribution="constant", value=True, why="booleans: True")
    if "mask" in lname:
        return dict(distribution="constant", value=True if kind == "b" else 1,
                    why="a mask (the name contains 'mask'): all ones, nothing masked")
    if kind in "iu":
        if "type" in lname or "segment" in lname:
            return dict(distribution="constant", value=0,
                        why="type / segment ids (the name contains 'type' or 'segment'): 0, the first segment")
        info = np.iinfo(dtype)
        vocab = graph.vocabulary(name)
        if vocab is not None:
            size, table, node = vocab
            return dict(distribution="uniform integers", low=0, high=int(min(size, int(info.max) + 1)) - 1,
                        why=f"token ids: uniform in [0, {size}), the {size} rows of embedding table '{table}' "
                            f"(node {node})")
        if np.dtype(dtype).itemsize == 1:
            return dict(distribution="uniform integers", low=int(info.min), high=int(info.max),
                        why=f"the full {np.dtype(dtype)} range (e.g. image pixels)")
        return dict(distribution="uniform integers", low=0, high=1,
                    why=f"{UNKNOWN_INTEGERS} (no Gather on a constant table found): 0 or 1, a range no index "
                        "or count overflows; give your own inputs with --verify-data")
    return dict(distribution="standard normal", why="floats: standard normal")


def plan_inputs(model: onnx.ModelProto, batch: int = 2, shapes: Optional[dict] = None,
                guessed: Optional[list] = None, guess: int = GUESS_DIM) -> list:
    """One :class:`InputPlan` per graph input. Shapes: ``shapes[name]`` when given; else a dynamic
    first dimension is the batch and other dynamic ones get ``GUESS_DIM`` (their inputs' names are
    appended to ``guessed``)."""
    initializers = {t.name for t in model.graph.initializer}
    graph = _Graph(model)
    plans = []
    for vi in model.graph.input:
        if vi.name in initializers:
            continue
        tt = vi.type.tensor_type
        if not vi.type.HasField("tensor_type") or tt.elem_type not in _NP_TYPE:
            raise RedppError(f"input {vi.name}: only tensor inputs of common types can be verified")
        if shapes and vi.name in shapes:
            shape = tuple(shapes[vi.name])
        else:
            shape = []
            for axis, d in enumerate(tt.shape.dim):
                if d.HasField("dim_value"):
                    shape.append(d.dim_value)
                elif axis == 0:
                    shape.append(batch)
                else:
                    shape.append(guess)
                    if guessed is not None and vi.name not in guessed:
                        guessed.append(vi.name)
            shape = tuple(shape)
        dtype = np.dtype(_NP_TYPE[tt.elem_type])
        batched = not (shapes and vi.name in shapes) and len(tt.shape.dim) > 0 and \
            not tt.shape.dim[0].HasField("dim_value")
        plans.append(InputPlan(vi.name, dtype, shape, batched=batched, **_rule(graph, vi.name, dtype)))
    return plans


def random_inputs(model: onnx.ModelProto, batch: int = 2, seed: int = 0,
                  shapes: Optional[dict] = None, guessed: Optional[list] = None) -> dict:
    """One seeded batch: a value per graph input, by the rules of the module docstring."""
    rng = np.random.default_rng(seed)
    return {p.name: p.draw(rng) for p in plan_inputs(model, batch, shapes, guessed)}


def load_data(path, model: onnx.ModelProto):
    """``--verify-data``: the npz of named inputs, checked against ``model`` (RedppError, one line)."""
    from .evaluate import load_inputs

    try:
        return load_inputs(path, model)
    except ValueError as err:
        raise RedppError(f"--verify-data {str(err).splitlines()[0]}") from None


def ort_message(err: Exception) -> str:
    """onnxruntime's error text on one line, without its C++ source locations and signatures."""
    text = " ".join(str(err).split())
    text = re.sub(r"\S*onnxruntime_src\S*:\d+ [^(]*\([^)]*\)\s*", "", text)
    return re.sub(r"^\[ONNXRuntimeError\] : \d+ : \w+ : ", "", text)


# --------------------------------------------------------------------------- the drift figure

class _Drift:
    """Per output, per unit (a sample, or a whole run when an output has no batch axis): squared
    norms of the difference and of the reference, cosine similarities, max |diff|."""

    def __init__(self, names):
        self.names = list(names)
        self.d = [[] for _ in names]
        self.r = [[] for _ in names]
        self.cos = [[] for _ in names]
        self.max_abs = [0.0 for _ in names]

    def add(self, ref_out, new_out, n: int) -> None:
        from .evaluate import cosines

        for k, (b, a) in enumerate(zip(ref_out, new_out)):
            a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
            if a64.shape != b64.shape:
                raise RuntimeError(f"output {self.names[k]}: shape {list(a64.shape)} after the rewrite, "
                                   f"{list(b64.shape)} before; please report it")
            per_sample = a64.ndim >= 1 and a64.shape[0] == n
            a2 = a64.reshape(n if per_sample else 1, -1)
            b2 = b64.reshape(a2.shape)
            diff = a2 - b2
            if diff.size:
                self.max_abs[k] = max(self.max_abs[k], float(np.max(np.abs(diff))))
            self.d[k].extend(np.sum(diff * diff, axis=1).tolist())
            self.r[k].extend(np.sum(b2 * b2, axis=1).tolist())
            if a2.shape[1]:
                self.cos[k].extend(cosines(a2, b2).tolist())

    def rel(self, k: int) -> float:
        d, r = sum(self.d[k]), sum(self.r[k])
        return float(np.sqrt(d / r)) if r > 0 else self.max_abs[k]

    def stderr(self, k: int) -> Optional[float]:
        """Standard error of output k's pooled relative L2 (delta method), None below 2 units."""
        d, r = np.asarray(self.d[k]), np.asarray(self.r[k])
        n = d.size
        if n < 2:
            return None
        if r.sum() <= 0:  # a zero reference: the figure is max |diff|, settled when there is none
            return 0.0 if d.sum() == 0 else None
        r2 = d.sum() / r.sum()
        if r2 == 0:
            return 0.0
        z = d - r2 * r
        se_r2 = np.sqrt(np.sum(z * z) / (n - 1) / n) / r.mean()
        return float(se_r2 / (2 * np.sqrt(r2)))

    def settled(self) -> bool:
        gate = max(self.rel(k) for k in range(len(self.names)))
        bound = max(TARGET_REL_SE * gate, ABS_SE_FLOOR)
        for k in range(len(self.names)):
            se = self.stderr(k)
            if se is None or not se <= bound:
                return False
        return True

    def rows(self) -> tuple:
        return tuple({"name": name, "max_abs_diff": self.max_abs[k], "rel_l2": self.rel(k),
                      "cosine_mean": float(np.mean(self.cos[k])) if self.cos[k] else 1.0,
                      "cosine_min": float(np.min(self.cos[k])) if self.cos[k] else 1.0}
                     for k, name in enumerate(self.names))


def _samples_in(feeds: dict) -> int:
    for v in feeds.values():
        return int(v.shape[0]) if v.ndim else 1
    return 1


def compare(original: onnx.ModelProto, candidate: onnx.ModelProto, *, batch: int = 2, seed: int = 0,
            shapes: Optional[dict] = None, data=None, samples: Optional[int] = None,
            seconds: float = VERIFY_SECONDS) -> VerifyResult:
    """Run both models on the same inputs and compare their outputs (see the module docstring).

    ``data``: a path to an npz of named inputs or an :class:`~redpp_onnx.evaluate.NamedInputs`
    (all of its samples are used, the first ``samples`` when given); else synthetic inputs from
    ``seed``. ``samples``: exactly this many synthetic samples instead of the automatic count.
    ``seconds``: the time budget of the automatic count.
    """
    from .evaluate import NamedInputs

    if samples is not None and (not isinstance(samples, (int, np.integer)) or samples < 1):
        raise ValueError(f"samples must be a positive integer, got {samples!r}")
    guessed = []
    if data is not None and not isinstance(data, NamedInputs):
        data = load_data(data, original)
    plans = None if data is not None else plan_inputs(original, batch, shapes, guessed)
    for p in plans or []:
        size = math.prod(p.shape)
        if size > MAX_INPUT_ELEMENTS:
            raise RedppError(f"input {p.name}: one synthetic batch of shape {list(p.shape)} has {size:,} values, more "
                             f"than the {MAX_INPUT_ELEMENTS:,} verification draws; give realistic sizes with "
                             "--input-shape, or pass --no-verify")
    try:
        ref = session(io.serialize(original),
                      graph_optimization_level=ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    except Exception as err:  # noqa: BLE001 - onnxruntime raises many types
        raise RedppError(f"onnxruntime cannot load the input model: {ort_message(err)}") from None
    try:
        new = session(io.serialize(candidate))
    except Exception as err:  # noqa: BLE001
        raise RuntimeError(f"redpp-onnx produced a model onnxruntime cannot load ({ort_message(err)}); "
                           "please report it") from err
    names = [o.name for o in ref.get_outputs()]
    drift = _Drift(names)

    dropped = 0
    if data is not None:
        dim0 = ref.get_inputs()[0].shape[0] if ref.get_inputs() and ref.get_inputs()[0].shape else None
        fixed = dim0 if isinstance(dim0, int) and dim0 > 0 else None
        chunk = fixed or batch
        total = len(data) if samples is None else min(samples, len(data))
        usable = total - total % fixed if fixed else total
        dropped = total - usable
        if usable == 0:
            raise RedppError(f"--verify-data {data.source}: {total} sample(s), but the model's batch axis is "
                             f"fixed to {fixed}")
        trimmed = {k: v[:usable] for k, v in data.arrays.items()}
        feeds_iter = ({k: v[a:a + chunk] for k, v in trimmed.items()} for a in range(0, usable, chunk))
    else:
        rng = np.random.default_rng(seed)
        shorten = samples is not None and all(p.batched for p in plans)

        def synthetic():
            while True:
                yield {p.name: p.draw(rng) for p in plans}

        feeds_iter = synthetic()

    count = runs = first_n = 0
    spent = 0.0
    stopped = ""
    shapes_fed = {}
    fallbacks = list(GUESS_FALLBACKS) if data is None and guessed else []
    first_failure = None
    for feeds in feeds_iter:
        if data is None and shorten and count + _samples_in(feeds) > samples:
            feeds = {k: v[:samples - count] for k, v in feeds.items()}  # the last run, shortened
        if runs == 0:
            shapes_fed = {k: tuple(v.shape) for k, v in feeds.items()}
            first_n = _samples_in(feeds)
        t = time.perf_counter()
        try:
            ref_out = ref.run(names, feeds)
        except Exception as err:  # noqa: BLE001 - e.g. a size the model does not accept
            if runs:
                raise
            first_failure = first_failure or (feeds, err)
            if fallbacks:  # the guessed dynamic dims: the next smaller size (the generator reads `plans`)
                plans = plan_inputs(original, batch, shapes, None, fallbacks.pop(0))
                continue
            feeds, err = first_failure  # said at the guess (GUESS_DIM), with the sizes also tried in the hint
            fed = ", ".join(f"{k} {list(v.shape)}" for k, v in feeds.items())
            if data is not None:
                raise RedppError(f"--verify-data {data.source}: the input model does not run on it ({fed}): "
                                 f"{ort_message(err)}") from None
            hint = (f" (dynamic dims of {', '.join(guessed)} set to {GUESS_DIM}, then {GUESS_FALLBACKS[0]} down to "
                    f"{GUESS_FALLBACKS[-1]}: give the real sizes with "
                    "--input-shape NAME=D0,D1,...)" if guessed else "")
            raise RedppError(f"the input model does not run on the verification inputs {fed}{hint}: "
                             f"{ort_message(err)}; or verify on your own inputs with --verify-data DATA.npz") from None
        try:
            new_out = new.run(names, feeds)
        except ORT_ERRORS as err:  # the input ran on these inputs: the output must too
            raise RuntimeError(f"redpp-onnx produced a model that fails in onnxruntime where the input model runs "
                               f"({ort_message(err)}); please report it") from err
        spent += time.perf_counter() - t
        n = _samples_in(feeds)
        drift.add(ref_out, new_out, n)
        runs += 1
        count += n
        if data is not None:
            continue
        if samples is not None:
            if count >= samples:
                stopped = f"a fixed count of {samples} samples (--verify-samples)"
                break
            continue
        if spent >= seconds:
            stopped = f"time budget: {spent:.1f} s of runs >= {seconds:g} s (the figure may be less precise)"
            break
        if count >= MAX_SAMPLES:
            stopped = f"sample cap {MAX_SAMPLES}"
            break
        if count >= MIN_SAMPLES and drift.settled():
            stopped = (f"standard error <= {TARGET_REL_SE:.0%} of the max relative L2 (or < {ABS_SE_FLOOR:g}), "
                       f"after at least {MIN_SAMPLES} samples")
            break
    if data is not None:
        stopped = (f"all {count} samples of {data.source}" if count == len(data) else
                   f"the first {count} of the {len(data)} samples of {data.source}"
                   + (f" (the model's batch axis is fixed to {chunk}: {dropped} left out)" if dropped else ""))

    rows = drift.rows()
    rels = [r["rel_l2"] for r in rows]
    worst = int(np.argmax(rels)) if rels and not np.isnan(rels).any() else 0
    if data is not None:
        inputs = data.describe()
        for name, d in inputs.items():
            d["shape"][0] = count
    else:
        inputs = {p.name: p.to_dict() for p in plans}
    return VerifyResult(
        batch=first_n,
        seed=None if data is not None else seed,
        max_abs_diff=max((r["max_abs_diff"] for r in rows), default=0.0),
        max_rel_l2=float(np.max(rels)) if rels else 0.0, outputs=rows, input_shapes=shapes_fed,
        guessed=tuple(guessed), data="user" if data is not None else "synthetic",
        source=data.source if data is not None else None, inputs=inputs, samples=count, runs=runs,
        stopped=stopped, rel_l2_stderr=drift.stderr(worst) if rels else None)
