"""Configuration: frozen dataclasses, validated once when built (a bad value is a RedppError)."""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

from .errors import RedppError
from .passes.merge import STRATEGIES, MergeConfig  # noqa: F401  (re-exported)
from .passes.split import SplitConfig

STEPS = ("hash", "merge", "split")
AVAILABLE_STEPS = STEPS


def _positive(name: str, value: float, allow_zero: bool = False) -> None:
    if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        raise RedppError(f"{name} must be a {'non-negative' if allow_zero else 'positive'} number, got {value!r}")


HASH_METHODS = ("rd", "kde")
EFFORTS = ("fast", "thorough")
DEFAULT_BUDGET = 0.1
"""Default of ``budget`` for a model whose output is class scores (:func:`output_kind`): the predicted
relative L2 error of the logits that RD hashing spends. At 0.1 the shared models kept their top-1
within 0.3 points (ResNets) and 0.4 (EfficientNet-Lite0) on the exact data with every effort and
sensitivity sample count measured; at 0.2 ResNet-56 lost 1.8 points (``benchmarks/bench_rd.py``)."""
REDUCED_BUDGET_SHARE = 0.5
"""After a channel reduction removed channels (``--target-macs``, ``--alpha``), the default ``budget``
is this share of the usual one: the reduced model has less slack left for the hashing's error.
Measured (exact data, top-1: reduction alone / then hashing at 0.1 / at 0.05): ResNet-56 at 35 % of the
MACs 92.23 / 91.35 / 92.33, ResNet-20 at 20 % 91.25 / 90.56 / 91.25, EfficientNet-Lite0 at 5 % 84.80 /
84.60 / 85.00, ResNet-56 at 15 % 93.51 / 93.02 / 92.92 (originals 92.72, 91.64, 87.80). Beyond the
reduction's own loss, 0.1 cost 0.2-0.9 points; 0.05 cost nothing beyond one or two of the 1,017 test
images on three of the four, and 0.59 at ResNet-56's 15 % (as much as 0.1 there; both above the
original). The file is about 10 % larger (ResNet-56 at 35 %: 6.71x smaller instead of 7.42x). An
explicit ``budget`` or ``target_bits`` is used as given."""
DEFAULT_FEATURE_BUDGET = 0.03
"""Default of ``budget`` for a model whose output is not class scores (embeddings, pooled or per-token
features, maps): such an output is used by its direction, and a cosine similarity of 0.999 allows a
relative L2 error of at most sqrt(2 × 0.001) = 0.045 (cos ≥ 1 − e²/2); 0.03 leaves a margin of 1.5 for the
prediction's error. Measured on the BERT-sized encoder (``benchmarks/bench_transformer.py``): budget 0.03
gave cosine ≥ 0.99958, 0.05 gave 0.9982, 0.1 gave 0.9955."""
CLASS_SCORE_PASS = ("Identity", "Softmax", "LogSoftmax", "Flatten", "Reshape", "Squeeze", "Cast")


def output_kind(model) -> tuple:
    """``("scores" | "features", why)`` of the model's first output: class scores when, through
    :data:`CLASS_SCORE_PASS` ops and a constant bias Add, it comes from a Gemm or a MatMul with a
    constant weight (a classifier head); anything else (a pooling, a normalization, a convolution, an
    output of rank 3 or more) is features. Decides the default ``budget``."""
    g = model.graph
    if not g.output:
        return "features", "no graph output"
    consts = {t.name for t in g.initializer} | {o for n in g.node if n.op_type == "Constant" for o in n.output}
    made_by = {o: n for n in g.node for o in n.output}
    name = g.output[0].name
    dims = g.output[0].type.tensor_type.shape.dim
    if len(dims) > 2:
        return "features", f"output {name!r} has rank {len(dims)}"
    for _ in range(len(g.node) + 1):
        node = made_by.get(name)
        if node is None:
            return "features", f"output {name!r} is not computed by a node"
        if node.op_type in CLASS_SCORE_PASS:
            name = node.input[0]
            continue
        if node.op_type == "Add" and len(node.input) == 2 and any(x in consts for x in node.input):
            name = next((x for x in node.input if x not in consts), "")  # "": a constant, no node
            continue
        if node.op_type == "Gemm" or (node.op_type == "MatMul" and node.input[1] in consts):
            return "scores", f"output {g.output[0].name!r} comes from the {node.op_type} {node.name or node.output[0]!r}"
        return "features", f"output {g.output[0].name!r} comes from a {node.op_type}, not a classifier head"
    return "features", "output path too long"


def default_budget(model) -> tuple:
    """``(budget, why)``: :data:`DEFAULT_BUDGET` for class scores, :data:`DEFAULT_FEATURE_BUDGET` else."""
    kind, why = output_kind(model)
    if kind == "scores":
        return DEFAULT_BUDGET, f"default budget {DEFAULT_BUDGET:g}: the output is class scores ({why})"
    return DEFAULT_FEATURE_BUDGET, (f"default budget {DEFAULT_FEATURE_BUDGET:g}: the output is not class scores "
                                    f"({why}), it is compared by direction (cosine >= 0.999 needs a relative "
                                    "error <= 0.045); --budget sets another")
DEFAULT_WEIGHT_ERROR = 0.01


@dataclasses.dataclass(frozen=True)
class HashConfig:
    """Step 1: rate-distortion hashing (``method="rd"``, the default: per-layer KDE codebooks
    chosen for the fewest stored bits within a predicted logit error ``budget``, or within
    ``target_bits`` bits per eligible weight), or per-layer KDE hashing within a relative weight
    error (``method="kde"``: ``weight_error``, ``bandwidth_factor``, ``nms_radius``,
    ``snap_zero``; giving any of them selects it), or the uniform int8 baseline."""

    method: Optional[str] = None              # "rd" | "kde"; None: "kde" when a kde-only option is given
    weight_error: Optional[float] = None      # ε: budget on ‖W̃ - W‖ / ‖W‖ per layer (kde; default 0.01)
    bandwidth_factor: Optional[float] = None  # fixed f (1 = the paper's literal rule); None: per layer within ε
    nms_radius: float = 0.0                  # τ, in weight units (0 = off)
    snap_zero: bool = False
    uniform_int8: bool = False               # the baseline instead of KDE hashing
    include_depthwise: bool = False          # also grouped / depthwise convs (kde)
    budget: Optional[float] = None           # rd: predicted relative L2 error of the logits (None: default_budget
    #                                          of the model: 0.1 for class scores, 0.03 for features)
    target_bits: Optional[float] = None      # rd: instead, stored bits per eligible weight not to exceed
    effort: str = "fast"                     # rd: "fast" | "thorough" (rd.EFFORTS)
    workers: Optional[int] = None            # rd: processes for the per-layer work (None: hashing/workers.py
    #                                          chooses by the model's size; the result does not depend on it)

    def __post_init__(self):
        kde_only = [name for name, given in (("--weight-error", self.weight_error is not None),
                                             ("--bandwidth-factor", self.bandwidth_factor is not None),
                                             ("--nms-radius", bool(self.nms_radius)),
                                             ("--snap-zero", self.snap_zero),
                                             ("--uniform-int8", self.uniform_int8),
                                             ("--include-depthwise", self.include_depthwise)) if given]
        rd_only = [name for name, given in (("--budget", self.budget is not None),
                                            ("--target-bits", self.target_bits is not None)) if given]
        method = self.method
        if method is None:
            method = "kde" if kde_only else "rd"
        if method not in HASH_METHODS:
            raise RedppError(f"hash method must be one of {', '.join(HASH_METHODS)}, got {method!r}")
        if method == "rd" and kde_only:
            raise RedppError(f"{', '.join(kde_only)} select the per-layer hashing; they do not combine with the "
                             "rate-distortion hashing" + (f" ({', '.join(rd_only)})" if rd_only else ""))
        if method == "kde" and rd_only:
            raise RedppError(f"{', '.join(rd_only)} belong to the rate-distortion hashing (the default); "
                             f"they do not combine with {', '.join(kde_only) or 'the per-layer hashing'}")
        if self.budget is not None and self.target_bits is not None:
            raise RedppError("give one of --budget and --target-bits")
        if self.effort not in EFFORTS:
            raise RedppError(f"--effort must be one of {', '.join(EFFORTS)}, got {self.effort!r}")
        if self.weight_error is not None:
            _positive("--weight-error", self.weight_error, allow_zero=True)
        if self.bandwidth_factor is not None:
            _positive("--bandwidth-factor", self.bandwidth_factor)
        _positive("--nms-radius", self.nms_radius, allow_zero=True)
        if self.budget is not None:
            _positive("--budget", self.budget)
        if self.target_bits is not None:
            _positive("--target-bits", self.target_bits)
        if self.workers is not None and (isinstance(self.workers, bool) or not isinstance(self.workers, int)
                                         or self.workers < 1):
            raise RedppError(f"--workers must be a positive integer, got {self.workers!r}")
        object.__setattr__(self, "method", method)
        if method == "kde" and self.weight_error is None:
            object.__setattr__(self, "weight_error", DEFAULT_WEIGHT_ERROR)


@dataclasses.dataclass(frozen=True)
class CompressConfig:
    steps: tuple = STEPS
    hash: HashConfig = HashConfig()
    merge: MergeConfig = MergeConfig()
    split: SplitConfig = SplitConfig()
    calibrate: Optional[str] = None  # DATA-DRIVEN: choose merge α on this data set
    max_drop: float = 0.3            # calibrate: largest top-1 drop allowed, in points
    codebook: bool = True       # store hashed weights as codebooks + prefix codes (decoders + a map for the fast
    #                             load path of redpp_onnx.session); only when the hash step runs
    storage: str = "standard"   # codebook storage form: "standard" (standard-ops decoders, any onnxruntime) or
    #                             "compact" (rANS codes, loaded by redpp-onnx only; redpp_onnx/compact.py)
    layout: bool = True         # zero channel paddings as exact 1x1 Convs (passes/layout.py: onnxruntime's
    #                             NCHWc layout no longer breaks at option-A shortcuts)
    verify: bool = True         # seeded random inputs through the original and the output
    verify_batch: int = 2
    seed: int = 0
    input_shapes: Optional[dict] = None  # input name -> shape, for the model's dynamic dims
    verify_data: Optional[str] = None    # --verify-data: an npz of named inputs to verify on instead
    verify_samples: Optional[int] = None  # exactly this many synthetic samples (the first N of verify_data);
    #                                       None: the automatic count of verify.py
    verify_seconds: float = 10.0         # time budget of the automatic count (seconds of runs)

    def __post_init__(self):
        steps = tuple(self.steps)
        unknown = [s for s in steps if s not in STEPS]
        if unknown:
            raise RedppError(f"unknown step(s) {', '.join(unknown)}; steps are {', '.join(STEPS)}")
        missing = [s for s in steps if s not in AVAILABLE_STEPS]
        if missing:
            raise RedppError(f"step(s) {', '.join(missing)} not available in this version (available: "
                             f"{', '.join(AVAILABLE_STEPS)})")
        if not steps:
            raise RedppError("no step chosen (--steps)")
        if self.storage not in ("standard", "compact"):
            raise RedppError(f"unknown storage form {self.storage!r}: standard or compact")
        if self.calibrate and "merge" not in steps:
            raise RedppError("--calibrate chooses the merge α: it needs the merge step")
        if not isinstance(self.verify_batch, int) or self.verify_batch < 1:
            raise RedppError(f"verify batch must be >= 1, got {self.verify_batch!r}")
        if self.verify_data is not None and not self.verify:
            raise RedppError("--verify-data needs verification (drop --no-verify)")
        if self.verify_samples is not None and (isinstance(self.verify_samples, bool)
                                                or not isinstance(self.verify_samples, int) or self.verify_samples < 1):
            raise RedppError(f"--verify-samples must be a whole number >= 1, got {self.verify_samples!r}")
        _positive("verify time budget", self.verify_seconds, allow_zero=True)
        for name, shape in (self.input_shapes or {}).items():
            if not shape or not all(isinstance(d, int) and d >= 1 for d in shape):
                raise RedppError(f"--input-shape {name}: dimensions must be whole numbers >= 1, got {shape!r}")
        object.__setattr__(self, "steps", steps)
