"""Speed and memory of the adaptive hashing on a ResNet-50-sized set of synthetic weights.

Builds the weight tensors of every Conv (OIHW) and of the final fully connected layer of a
ResNet-50 (about 25.5 M parameters) with seeded, realistic distributions, hashes each one with
the default settings of :func:`redpp_onnx.hashing.hash_tensor`, prints the time per layer,
the total time and the peak memory, and writes everything as JSON.

Distribution of a layer with fan-in ``n`` (``σ = 1/√n``): a mixture of 70 % Laplace
(scale ``σ/√2``, so standard deviation ``σ``) and 30 % normal (``0.5 σ``), plus 0.01 % of
outliers drawn uniformly in ``±[8σ, 30σ]``; float32.

Usage: ``python benchmarks/bench_hashing.py [--out PATH] [--seed N] [--weight-error E] [--numpy]``
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from redpp_onnx.hashing import hash_tensor  # noqa: E402

STAGES = [  # (blocks, bottleneck width, output channels) of ResNet-50
    (3, 64, 256),
    (4, 128, 512),
    (6, 256, 1024),
    (3, 512, 2048),
]


def resnet50_shapes():
    """``(name, shape)`` of the Conv weights (OIHW) and of the fc weight of a ResNet-50."""
    shapes = [("conv1", (64, 3, 7, 7))]
    cin = 64
    for s, (blocks, width, cout) in enumerate(STAGES, start=1):
        for b in range(blocks):
            prefix = f"layer{s}.{b}"
            shapes += [
                (f"{prefix}.conv1", (width, cin, 1, 1)),
                (f"{prefix}.conv2", (width, width, 3, 3)),
                (f"{prefix}.conv3", (cout, width, 1, 1)),
            ]
            if b == 0:
                shapes.append((f"{prefix}.downsample", (cout, cin, 1, 1)))
            cin = cout
    shapes.append(("fc", (1000, 2048)))
    return shapes


def synthetic_weights(shape, rng):
    """Laplace/normal mixture scaled by ``1/√fan_in`` with 0.01 % outliers (float32)."""
    n = int(np.prod(shape))
    sigma = 1.0 / np.sqrt(np.prod(shape[1:]))
    w = np.where(
        rng.random(n) < 0.7,
        rng.laplace(0.0, sigma / np.sqrt(2.0), n),
        rng.normal(0.0, 0.5 * sigma, n),
    )
    k = max(1, n // 10000)
    idx = rng.choice(n, k, replace=False)
    w[idx] = rng.choice([-1.0, 1.0], k) * rng.uniform(8 * sigma, 30 * sigma, k)
    return w.astype(np.float32).reshape(shape)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default_out = ROOT / "benchmarks" / "results" / "hashing_speed.json"
    parser.add_argument("--out", default=str(default_out))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--weight-error", type=float, default=0.01)
    parser.add_argument("--numpy", action="store_true",
                        help="the KDE binning in numpy instead of C++ (redpp_onnx._core): the same numbers, for timing")
    args = parser.parse_args(argv)
    if args.numpy:
        from redpp_onnx.hashing import kde

        kde.NATIVE = False

    rng = np.random.default_rng(args.seed)
    layers = [(name, synthetic_weights(shape, rng)) for name, shape in resnet50_shapes()]
    n_params = sum(w.size for _, w in layers)
    print(f"{len(layers)} tensors, {n_params:,} parameters, weight_error={args.weight_error}")
    print(f"{'layer':22s} {'shape':>20s} {'distinct':>9s} {'after':>6s} {'f':>9s} "
          f"{'rel err':>8s} {'evals':>5s} {'grid':>8s} {'peak MB':>8s} {'s':>7s}")

    tracemalloc.start()
    rows = []
    total = 0.0
    before_all = after_all = 0
    for name, w in layers:
        tracemalloc.reset_peak()
        base, _ = tracemalloc.get_traced_memory()
        t0 = time.perf_counter()
        r = hash_tensor(w, weight_error=args.weight_error)
        dt = time.perf_counter() - t0
        peak = (tracemalloc.get_traced_memory()[1] - base) / 2**20
        total += dt
        before_all += r.distinct_before
        after_all += r.distinct_after
        rows.append(dict(
            name=name, shape=list(w.shape), params=int(w.size),
            distinct_before=r.distinct_before, distinct_after=r.distinct_after,
            factor=r.factor, bandwidth=r.bandwidth, rel_error=r.rel_error,
            n_modes=r.n_modes, evaluations=r.evaluations, grid_size=r.grid_size,
            reason=r.reason, seconds=dt, peak_traced_mb=peak,
        ))
        factor = f"{r.factor:9.1f}" if r.factor is not None else f"{'-':>9s}"
        print(f"{name:22s} {str(w.shape):>20s} {r.distinct_before:9d} {r.distinct_after:6d} "
              f"{factor} {r.rel_error:8.5f} {r.evaluations:5d} {r.grid_size:8d} "
              f"{peak:8.1f} {dt:7.3f}")
    tracemalloc.stop()

    max_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    peak_traced = max(r["peak_traced_mb"] for r in rows)
    reduction = 1.0 - after_all / before_all
    print(f"total hashing time: {total:.2f} s for {n_params:,} parameters")
    print(f"distinct values removed: {100 * reduction:.2f} %")
    print(f"peak memory: ru_maxrss {max_rss_mb:.0f} MiB (process, weights included), "
          f"tracemalloc peak of one hash_tensor call {peak_traced:.0f} MiB")

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(dict(
        benchmark="hash_tensor on ResNet-50-shaped synthetic weights",
        seed=args.seed, weight_error=args.weight_error, kde_binning="numpy" if args.numpy else "C++",
        n_tensors=len(layers), n_params=int(n_params),
        total_seconds=total, reduction=reduction,
        max_rss_mib=max_rss_mb, peak_traced_mib_per_call=peak_traced,
        python=platform.python_version(), numpy=np.__version__, machine=platform.machine(),
        layers=rows,
    ), indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
