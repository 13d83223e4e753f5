"""Latency of one model, or of two models against each other, in onnxruntime (`redpp-onnx bench`).

Two models are measured in the same process, on the same seeded inputs: runs alternate A and B
(in alternating order, so that drift, background load and cache state hit both alike), over
several session pairs created in both orders (on a small shared machine, the same model reads
differently from one session to the next). The ratio B/A is the ratio of the medians; its
spread is the interquartile range of the ratios of runs adjacent in time.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from typing import Optional

import onnx

from . import io
from .errors import RedppError
from .runtime import session
from .verify import random_inputs


def time_runs(sess, feed: dict, repeat: int, warmup: int = 2) -> list:
    """Seconds of ``repeat`` runs of ``sess`` on ``feed``, after ``warmup`` untimed runs."""
    for _ in range(warmup):
        sess.run(None, feed)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        sess.run(None, feed)
        times.append(time.perf_counter() - t0)
    return times


def timed_pair(a, b, feed: dict, repeat: int) -> tuple:
    """(median A s, median B s, A run times, B run times): ``repeat`` runs each, interleaved."""
    for sess in (a, b):
        for _ in range(2):
            sess.run(None, feed)
    ta, tb = [], []
    for i in range(repeat):  # alternate which model runs first
        for sess, times in ((a, ta), (b, tb)) if i % 2 == 0 else ((b, tb), (a, ta)):
            t0 = time.perf_counter()
            sess.run(None, feed)
            times.append(time.perf_counter() - t0)
    return statistics.median(ta), statistics.median(tb), ta, tb


def _quantiles(times) -> dict:
    q = statistics.quantiles(times, n=20) if len(times) > 1 else [times[0]] * 19
    return {"p10_ms": 1e3 * q[1], "p50_ms": 1e3 * statistics.median(times), "p90_ms": 1e3 * q[17]}


@dataclasses.dataclass(frozen=True)
class BenchResult:
    batch: int
    threads: int
    runs: int
    a: dict                        # p10/p50/p90 ms of A
    b: Optional[dict] = None       # same for B
    ratio: Optional[float] = None  # median B / median A
    ratio_iqr: Optional[tuple] = None  # 25th and 75th percentiles of the adjacent-run ratios

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def measure(model_a, model_b=None, *, batch: int = 1, threads: int = 1, repeat: int = 40,
            session_pairs: int = 4, seed: int = 0) -> BenchResult:
    """Latency of ``model_a`` (and ``model_b`` against it); models are paths or ModelProtos."""
    a_model = _load(model_a)
    feeds = random_inputs(a_model, batch, seed)
    opts = dict(intra_op_num_threads=threads, inter_op_num_threads=1)
    a_bytes = io.serialize(a_model)
    if model_b is None:
        times = time_runs(session(a_bytes, **opts), feeds, repeat)
        return BenchResult(batch, threads, repeat, _quantiles(times))
    b_model = _load(model_b)
    _same_inputs(a_model, b_model)
    b_bytes = io.serialize(b_model)
    ta, tb = [], []
    pairs = max(1, session_pairs)
    for k in range(pairs):
        first, second = (a_bytes, b_bytes) if k % 2 == 0 else (b_bytes, a_bytes)
        s1, s2 = session(first, **opts), session(second, **opts)
        sa, sb = (s1, s2) if k % 2 == 0 else (s2, s1)
        _, _, ra, rb = timed_pair(sa, sb, feeds, max(repeat // pairs, 3))
        ta += ra
        tb += rb
    ratios = sorted(y / x for x, y in zip(ta, tb))
    q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
    return BenchResult(batch, threads, len(ta), _quantiles(ta), _quantiles(tb),
                       statistics.median(tb) / statistics.median(ta), (q[0], q[2]))


def _load(model) -> onnx.ModelProto:
    return model if isinstance(model, onnx.ModelProto) else io.load_model(model)


def _same_inputs(a: onnx.ModelProto, b: onnx.ModelProto) -> None:
    """Both models take the same inputs (names and element types): one feed serves both."""
    def inputs(m):
        inits = {t.name for t in m.graph.initializer}
        return {i.name: i.type.tensor_type.elem_type for i in m.graph.input if i.name not in inits}

    ia, ib = inputs(a), inputs(b)
    if ia != ib:
        raise RedppError(f"the two models take different inputs ({', '.join(sorted(ia))} vs {', '.join(sorted(ib))}, "
                         "or different element types): compare a model with its own compressed output")
