"""SplitConv in an onnxruntime session vs onnxruntime's own Conv on the dense weights.

Every (C_in, C_out, kernel) of the grid below is a case; the other parameters (stride,
dilation, asymmetric pads, batch, odd spatial size, bias, affine, activation, weight pattern)
are drawn per case from a seeded generator, and ``test_grid_covers_every_value`` checks that
the grid as a whole covers every value. Tolerance: max |y - y_conv| / max |y_conv| <= 1e-5
(float32) for the kernel and for the float64 numpy reference; the pybind11 core must give
the kernel's result bit for bit.
"""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest

import redpp_onnx
from redpp_onnx import _core
from redpp_onnx.ops import packing, reference

from .models import dense_conv_model, rel_err, run_stock, split_conv_model

CHANNELS = (1, 3, 16, 64, 130)
KERNELS = (1, 3, 5, 7)
PATTERNS = ("unique", "all_duplicate", "zero_channels", "mixed")
ACTIVATIONS = ("", "Relu", "Clip")
TOL = 1e-5


@dataclasses.dataclass(frozen=True)
class Case:
    c_in: int
    c_out: int
    kernel: tuple
    stride: tuple
    dilation: tuple
    pads: tuple
    batch: int
    spatial: tuple
    bias: bool
    affine: bool
    activation: str
    pattern: str
    seed: int

    @property
    def id(self) -> str:
        return (f"{self.c_in}x{self.c_out}-k{'x'.join(map(str, self.kernel))}-s{self.stride[-1]}"
                f"-d{self.dilation[-1]}-n{self.batch}-{self.pattern}-{self.activation or 'noact'}"
                f"{'-b' if self.bias else ''}{'-aff' if self.affine else ''}")


def _case(seed: int, pair: int, c_in: int, c_out: int, k: int, nd: int) -> Case:
    """``pair`` numbers the (C_in, C_out) pairs; it fixes the pattern and the stride so that,
    as every pair meets every kernel size, all (pattern, kernel, stride) combinations occur."""
    rng = np.random.default_rng(seed)
    stride = (1, 2)[(pair // len(PATTERNS)) % 2]
    dilation = int(rng.choice([1, 2])) if k > 1 else 1
    span = dilation * (k - 1) + 1
    pads = tuple(int(p) for p in rng.integers(0, k, size=2 * nd))  # begins and ends differ
    # odd sizes, at least the span, small enough to keep the 130-channel cases quick
    extra = 2 * rng.integers(0, 4 if c_in * c_out < 4000 else 2, size=nd) + 1
    spatial = tuple(int(max(span, 3) + e) | 1 for e in extra)
    return Case(c_in, c_out, (k,) * nd, (stride,) * nd, (dilation,) * nd, pads,
                batch=int(rng.choice([1, 4])), spatial=spatial, bias=bool(rng.integers(2)),
                affine=bool(rng.integers(2)), activation=str(rng.choice(ACTIVATIONS)),
                pattern=PATTERNS[pair % len(PATTERNS)], seed=seed)


GRID_2D = [_case(i, i // len(KERNELS), ci, co, k, 2)
           for i, (ci, co, k) in enumerate(itertools.product(CHANNELS, CHANNELS, KERNELS))]
GRID_1D = [_case(1000 + i, i // len(KERNELS), ci, co, k, 1)
           for i, (ci, co, k) in enumerate(itertools.product((1, 16, 130), (3, 64), KERNELS))]


def make_weights(case: Case, rng: np.random.Generator) -> np.ndarray:
    shape = (case.c_out, case.c_in) + case.kernel
    scale = 1.0 / np.sqrt(case.c_in * np.prod(case.kernel))
    if case.pattern == "unique":
        return (rng.standard_normal(shape) * scale).astype(np.float32)
    if case.pattern == "all_duplicate":  # one kernel per input channel, used by every output
        per_channel = rng.standard_normal((1, case.c_in) + case.kernel) * scale
        return np.broadcast_to(per_channel, shape).astype(np.float32).copy()
    if case.pattern == "zero_channels":  # about half of the input channels all zero
        w = (rng.standard_normal(shape) * scale).astype(np.float32)
        zero = rng.random(case.c_in) < 0.5
        zero[0] = True  # at least one (C_in = 1: the whole layer is zero, K = 0)
        w[:, zero] = 0.0
        return w
    # mixed: per input channel a pool of 1-3 kernels, and 30% zero kernels
    pools = rng.standard_normal((case.c_in, 3) + case.kernel) * scale
    pick = rng.integers(0, rng.integers(1, 4, size=case.c_in)[None, :], size=(case.c_out, case.c_in))
    w = pools[np.arange(case.c_in)[None, :], pick].astype(np.float32)
    w[rng.random((case.c_out, case.c_in)) < 0.3] = 0.0
    return w


def check_pattern(case: Case, weight: np.ndarray, split: packing.SplitWeights) -> None:
    """The pattern really has the structure it claims (so a broken packer cannot pass)."""
    k = split.kernels_per_channel
    zero_kernels = int(np.sum(split.idx < 0))
    if case.pattern == "unique":
        assert np.all(k == case.c_out) and zero_kernels == 0
    elif case.pattern == "all_duplicate":
        assert np.all(k == 1) and zero_kernels == 0
    elif case.pattern == "zero_channels":
        zero_channels = ~np.any(weight.reshape(case.c_out, case.c_in, -1) != 0, axis=(0, 2))
        assert np.all(k[zero_channels] == 0) and np.all(split.idx[zero_channels] == -1)
    else:
        assert np.all(k <= 3)
    assert np.array_equal(packing.unpack(split), weight)


def run_case(case: Case) -> None:
    rng = np.random.default_rng(case.seed)
    weight = make_weights(case, rng)
    split = packing.pack(weight)
    check_pattern(case, weight, split)
    vec = lambda: rng.standard_normal(case.c_out).astype(np.float32)  # noqa: E731
    bias = vec() if case.bias else None
    scale, shift = (vec(), vec()) if case.affine else (None, None)
    clip = dict(clip_min=-0.4, clip_max=0.6) if case.activation == "Clip" else {}
    geometry = dict(strides=list(case.stride), pads=list(case.pads), dilations=list(case.dilation))
    x = rng.standard_normal((case.batch, case.c_in) + case.spatial).astype(np.float32)

    model = split_conv_model(split, bias=bias, scale=scale, shift=shift,
                             activation=case.activation, **clip, **geometry)
    y = redpp_onnx.session(model).run(None, {"X": x})[0]
    y_conv = run_stock(dense_conv_model(weight, bias=bias, scale=scale, shift=shift,
                                        activation=case.activation, **clip, **geometry), x)
    y_ref = reference.split_conv(x, split.kernels, split.offsets, split.idx, bias, scale, shift,
                                 activation=case.activation, **clip, **geometry)
    y_core = _core.split_conv(x, split.kernels, split.offsets, split.idx, bias, scale, shift,
                              activation=case.activation, **clip, **geometry)

    assert y.shape == y_conv.shape
    assert rel_err(y, y_conv) <= TOL, case.id
    assert rel_err(y_ref, y_conv) <= TOL, case.id
    assert rel_err(y, y_ref) <= TOL, case.id
    assert np.array_equal(y_core, y), "the pybind11 core and the onnxruntime kernel must agree exactly"


@pytest.mark.parametrize("case", GRID_2D, ids=lambda c: c.id)
def test_split_conv_2d_matches_conv(case):
    run_case(case)


@pytest.mark.parametrize("case", GRID_1D, ids=lambda c: c.id)
def test_split_conv_1d_matches_conv(case):
    run_case(case)


def test_grid_covers_every_value():
    grid = GRID_2D
    assert {c.c_in for c in grid} == set(CHANNELS) and {c.c_out for c in grid} == set(CHANNELS)
    assert {c.kernel[0] for c in grid} == set(KERNELS)
    assert {c.stride[0] for c in grid} == {1, 2} and {c.dilation[0] for c in grid} == {1, 2}
    assert {c.batch for c in grid} == {1, 4}
    assert {c.bias for c in grid} == {True, False} and {c.affine for c in grid} == {True, False}
    assert {c.activation for c in grid} == set(ACTIVATIONS) and {c.pattern for c in grid} == set(PATTERNS)
    assert any(c.pads[0] != c.pads[2] or c.pads[1] != c.pads[3] for c in grid)  # asymmetric
    assert all(s % 2 == 1 for c in grid for s in c.spatial)  # odd spatial sizes
    # every pattern meets every kernel size and both strides
    for pattern, k, s in itertools.product(PATTERNS, KERNELS, (1, 2)):
        assert any(c.pattern == pattern and c.kernel[0] == k and c.stride[0] == s for c in grid), (pattern, k, s)


def test_large_image_many_tiles():
    """A 64x64 image: many tiles per image, rows split across tiles, stride 2 and padding."""
    case = Case(16, 32, (3, 3), (2, 2), (1, 1), (1, 0, 0, 1), batch=2, spatial=(65, 63), bias=True,
                affine=True, activation="Relu", pattern="mixed", seed=7)
    run_case(case)
