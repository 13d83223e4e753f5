"""Weight hashing: pure functions on numpy arrays (no ONNX or graph knowledge).

* :func:`hash_tensor`: RED++ adaptive KDE hashing of one tensor (METHOD.md step 1), with the
  bandwidth factor chosen per tensor within a relative-error budget, or fixed.
* :func:`uniform_int8`: the baseline, uniform symmetric per-tensor int8 quantize-dequantize.
* :func:`kde_partition` / :func:`exact_kde_partition`: the cells of the binned-FFT KDE and of
  the exact KDE (reference) for given values and bandwidth; :func:`suppress_modes` (NMS).

Both hashers return a frozen :class:`QuantResult` (``hashed``, ``codebook``, ``codes``,
distinct counts, errors); :class:`HashResult` adds the bandwidth, factor, modes and the
paper's per-weight bound ``u = min(A, B)``.
"""

from .kde import (
    HashResult,
    Partition,
    QuantResult,
    exact_kde_partition,
    hash_tensor,
    kde_partition,
    median_gap,
    suppress_modes,
)
from .uniform import UniformResult, uniform_int8

__all__ = [
    "HashResult",
    "Partition",
    "QuantResult",
    "UniformResult",
    "exact_kde_partition",
    "hash_tensor",
    "kde_partition",
    "median_gap",
    "suppress_modes",
    "uniform_int8",
]
