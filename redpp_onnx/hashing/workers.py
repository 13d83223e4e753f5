"""Per-layer work of the rate-distortion hashing on several cores (a process pool), with the same
result as on one core, bit for bit: every task is a pure function of its inputs, computed by the
same code in a fresh process (``spawn``: no onnxruntime or BLAS thread state is inherited), and
the results are put back in task order.

``workers``: ``None`` chooses :func:`default_workers` (the cores this process may use, when the
model is large enough for the pool to pay for itself), ``1`` runs in this process.
"""

from __future__ import annotations

import multiprocessing as mp
import os
from typing import Callable, Iterable, Iterator, List, Optional, Sequence

POOL_MIN_WEIGHTS = 2_000_000
"""Below this many eligible weights the default is one process: starting a worker (a fresh
interpreter importing numpy, onnx and onnxruntime) costs about a second, more than the per-layer
work of a small model saves."""

_STATE = None  # a worker's shared inputs (set by the pool's initializer)


def available_cores() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def default_workers(eligible_weights: int) -> int:
    """The cores this process may use when the model has at least ``POOL_MIN_WEIGHTS`` eligible
    weights, else 1."""
    return available_cores() if eligible_weights >= POOL_MIN_WEIGHTS else 1


def resolve(workers: Optional[int], eligible_weights: int) -> int:
    if workers is None:
        return default_workers(eligible_weights)
    return max(1, int(workers))


def _init(state) -> None:
    import signal

    global _STATE
    _STATE = state
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C goes to the caller, which ends the workers


def state():
    """The shared inputs of the current task (in a worker: what the pool was started with)."""
    return _STATE


def _call(args):
    func, i, task = args
    try:
        return i, True, func(task)
    except Exception as err:  # noqa: BLE001 -- re-run in the caller, which raises it with its type
        return i, False, repr(err)


def pmap(func: Callable, tasks: Sequence, shared, workers: int, progress: Optional[Callable] = None,
         cost: Optional[Sequence[float]] = None) -> List:
    """``[func(t) for t in tasks]`` with :func:`state` returning ``shared`` inside ``func``: in this
    process when ``workers <= 1`` or there is one task, else in a pool of ``workers`` spawned
    processes (``func`` a module-level function; ``shared`` and the tasks picklable), the costliest
    tasks (``cost``) first. ``progress(done, total, index)`` after each task. A task that fails in
    a worker is run again here, so its exception is raised with its own type; when a worker dies,
    the tasks not done yet run here; an interruption (Ctrl-C, SIGTERM) ends the workers at once.

    Scripts that call this through the API must guard their top-level code with
    ``if __name__ == "__main__":`` (``spawn`` imports the main module in each worker)."""
    global _STATE
    n = len(tasks)
    workers = min(int(workers), n)
    if workers <= 1:
        prev, _STATE = _STATE, shared
        try:
            out = []
            for i, t in enumerate(tasks):
                out.append(func(t))
                if progress:
                    progress(i + 1, n, i)
            return out
        finally:
            _STATE = prev
    order = sorted(range(n), key=lambda i: -cost[i]) if cost is not None else list(range(n))
    out: List = [None] * n
    failed = []
    from concurrent.futures import ProcessPoolExecutor, as_completed
    from concurrent.futures.process import BrokenProcessPool

    pool = ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn"), initializer=_init, initargs=(shared,))
    try:
        futures = {pool.submit(_call, (func, i, tasks[i])): i for i in order}
        for done, fut in enumerate(as_completed(futures)):
            i, ok, value = fut.result()
            if ok:
                out[i] = value
            else:
                failed.append(i)
            if progress:
                progress(done + 1, n, i)
    except BrokenProcessPool:  # a worker died (killed, out of memory...): the rest here
        failed = [i for i in range(n) if out[i] is None]
    except BaseException:  # Ctrl-C, SIGTERM (the CLI raises it here), an error in progress: end the workers now
        for proc in list(getattr(pool, "_processes", {}).values()):
            proc.terminate()
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    if failed:
        prev, _STATE = _STATE, shared
        try:
            for i in sorted(failed):
                out[i] = func(tasks[i])
        finally:
            _STATE = prev
    return out


def imap_ordered(func: Callable, tasks: Iterable, workers: int, window: Optional[int] = None) -> Iterator:
    """``func(t)`` for each of ``tasks`` (an iterable, consumed as results are taken), yielded in task
    order: in this process when ``workers <= 1``, else in a pool of ``workers`` spawned processes
    with at most ``window`` tasks (default ``workers + 1``) submitted and not yet taken, so that
    the tasks' inputs and results in memory stay bounded (the streaming path: one tensor a task).
    A task's exception is raised with its own type; an interruption ends the workers at once."""
    if workers <= 1:
        for t in tasks:
            yield func(t)
        return
    from collections import deque
    from concurrent.futures import ProcessPoolExecutor

    window = max(1, window or workers + 1)
    pool = ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn"), initializer=_init, initargs=(None,))
    pending: deque = deque()
    source = iter(tasks)
    try:
        for t in source:
            pending.append(pool.submit(func, t))
            if len(pending) >= window:
                break
        while pending:
            value = pending.popleft().result()
            for t in source:
                pending.append(pool.submit(func, t))
                break
            yield value
    except BaseException:  # Ctrl-C, SIGTERM, an error in a task or in the caller: end the workers now
        for proc in list(getattr(pool, "_processes", {}).values()):
            proc.terminate()
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
