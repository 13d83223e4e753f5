"""Numerical check of a rewritten model against the original, in onnxruntime, on seeded inputs.

The reference runs with graph optimizations off (nothing fused that could differ); the
candidate runs as a user would run it. Data-free: inputs are standard normal (floats) or
zeros (integers), the batch axis set to ``batch``, other dynamic dims to the shapes given
(``--input-shape``) or else to ``GUESS_DIM`` (said in the report).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Optional

import numpy as np
import onnx
import onnxruntime as ort

from . import io
from .errors import RedppError
from .runtime import session

_NP_TYPE = {onnx.TensorProto.FLOAT: np.float32, onnx.TensorProto.DOUBLE: np.float64,
            onnx.TensorProto.FLOAT16: np.float16, onnx.TensorProto.INT64: np.int64,
            onnx.TensorProto.INT32: np.int32, onnx.TensorProto.BOOL: np.bool_,
            onnx.TensorProto.UINT8: np.uint8, onnx.TensorProto.INT8: np.int8}


GUESS_DIM = 64
"""A dynamic dimension other than the batch, without a shape from the user, gets this size."""


@dataclasses.dataclass(frozen=True)
class VerifyResult:
    batch: int
    seed: int
    max_abs_diff: float
    max_rel_l2: float          # max over outputs of ‖out - ref‖ / ‖ref‖
    outputs: tuple             # per output: (name, max_abs_diff, rel_l2)
    input_shapes: dict = dataclasses.field(default_factory=dict)  # name -> shape fed
    guessed: tuple = ()        # inputs with a dynamic dim set to GUESS_DIM

    def to_dict(self) -> dict:
        return {"inputs": "seeded standard normal", "batch": self.batch, "seed": self.seed,
                "input_shapes": {k: list(v) for k, v in self.input_shapes.items()},
                "guessed_dims": list(self.guessed),
                "max_abs_diff": self.max_abs_diff, "max_rel_l2": self.max_rel_l2,
                "outputs": [{"name": n, "max_abs_diff": a, "rel_l2": r} for n, a, r in self.outputs]}


def random_inputs(model: onnx.ModelProto, batch: int = 2, seed: int = 0,
                  shapes: Optional[dict] = None, guessed: Optional[list] = None) -> dict:
    """One seeded input per graph input. Shapes: ``shapes[name]`` when given; else a dynamic
    first dimension is the batch and other dynamic ones get ``GUESS_DIM`` (their inputs'
    names are appended to ``guessed``)."""
    rng = np.random.default_rng(seed)
    initializers = {t.name for t in model.graph.initializer}
    feeds = {}
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
                    shape.append(GUESS_DIM)
                    if guessed is not None and vi.name not in guessed:
                        guessed.append(vi.name)
        dtype = _NP_TYPE[tt.elem_type]
        if np.issubdtype(dtype, np.floating):
            feeds[vi.name] = rng.standard_normal(shape).astype(dtype)
        else:
            feeds[vi.name] = np.zeros(shape, dtype)
    return feeds


def ort_message(err: Exception) -> str:
    """onnxruntime's error text on one line, without its C++ source locations and signatures."""
    text = " ".join(str(err).split())
    text = re.sub(r"\S*onnxruntime_src\S*:\d+ [^(]*\([^)]*\)\s*", "", text)
    return re.sub(r"^\[ONNXRuntimeError\] : \d+ : \w+ : ", "", text)


def compare(original: onnx.ModelProto, candidate: onnx.ModelProto, *, batch: int = 2, seed: int = 0,
            shapes: Optional[dict] = None) -> VerifyResult:
    guessed = []
    feeds = random_inputs(original, batch, seed, shapes, guessed)
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
    try:
        ref_out = ref.run(names, feeds)
    except Exception as err:  # noqa: BLE001 - e.g. a size the model does not accept
        fed = ", ".join(f"{k} {list(v.shape)}" for k, v in feeds.items())
        hint = (f" (dynamic dims of {', '.join(guessed)} set to {GUESS_DIM}: give the real sizes with "
                "--input-shape NAME=D0,D1,...)" if guessed else "")
        raise RedppError(f"the input model does not run on the verification inputs {fed}{hint}: "
                         f"{ort_message(err)}") from None
    new_out = new.run(names, feeds)
    rows = []
    for name, a, b in zip(names, new_out, ref_out):
        a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
        diff = float(np.max(np.abs(a64 - b64))) if a64.size else 0.0
        norm = float(np.linalg.norm(b64))
        rel = float(np.linalg.norm(a64 - b64) / norm) if norm > 0 else diff
        rows.append((name, diff, rel))
    return VerifyResult(batch, seed, max(r[1] for r in rows), max(r[2] for r in rows), tuple(rows),
                        {k: tuple(v.shape) for k, v in feeds.items()}, tuple(guessed))
