"""Dense Conv weights <-> the SplitConv storage (unique kernels, offsets, index map)."""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class SplitWeights:
    """SplitConv's weight inputs (see ``schema.py``)."""

    kernels: np.ndarray  # float32 [K, *kernel_shape]
    offsets: np.ndarray  # int64 [C_in + 1]
    idx: np.ndarray  # int32 [C_in, C_out], -1 = zero kernel

    @property
    def kernels_per_channel(self) -> np.ndarray:
        return np.diff(self.offsets)

    @property
    def c_in(self) -> int:
        return self.idx.shape[0]

    @property
    def c_out(self) -> int:
        return self.idx.shape[1]


def pack(weight: np.ndarray) -> SplitWeights:
    """Split dense weights ``W[C_out, C_in, *k]`` per input channel (METHOD.md, step 3).

    Per input channel ``c``: all-zero kernels get index -1; the others are deduplicated
    by exact equality (``np.unique`` over rows, so ``-0.0 == 0.0``) and indexed in the
    order ``np.unique`` returns them.
    """
    w = np.asarray(weight, dtype=np.float32)
    if w.ndim < 3:
        raise ValueError(f"expected conv weights [C_out, C_in, *kernel], got shape {w.shape}")
    c_out, c_in = w.shape[:2]
    kernel_shape = w.shape[2:]
    flat = w.reshape(c_out, c_in, -1)
    idx = np.full((c_in, c_out), -1, dtype=np.int32)
    offsets = np.zeros(c_in + 1, dtype=np.int64)
    chunks = []
    for c in range(c_in):
        rows = flat[:, c, :]
        nonzero = np.flatnonzero(np.any(rows != 0, axis=1))
        if nonzero.size:
            unique, inverse = np.unique(rows[nonzero], axis=0, return_inverse=True)
            idx[c, nonzero] = inverse.reshape(-1)
            chunks.append(unique)
            offsets[c + 1] = offsets[c] + unique.shape[0]
        else:
            offsets[c + 1] = offsets[c]
    taps = int(np.prod(kernel_shape))
    kernels = np.concatenate(chunks, axis=0) if chunks else np.zeros((0, taps), np.float32)
    return SplitWeights(kernels.reshape((-1,) + kernel_shape).astype(np.float32), offsets,
                        idx.astype(index_dtype(int(np.diff(offsets).max(initial=0)))))


def index_dtype(max_kernels_per_channel: int):
    """The narrowest idx type of the contract that holds 0 .. k - 1 and -1."""
    for dtype in (np.int8, np.int16, np.int32):
        if max_kernels_per_channel - 1 <= np.iinfo(dtype).max:
            return dtype
    raise ValueError(f"{max_kernels_per_channel} kernels per input channel do not fit the index map")


def unpack(split: SplitWeights) -> np.ndarray:
    """The dense weights ``W[C_out, C_in, *k]`` that ``split`` stands for."""
    kernel_shape = split.kernels.shape[1:]
    w = np.zeros((split.c_out, split.c_in) + kernel_shape, dtype=np.float32)
    for c in range(split.c_in):
        local = split.idx[c]
        used = local >= 0
        w[used, c] = split.kernels[split.offsets[c] + local[used]]
    return w
