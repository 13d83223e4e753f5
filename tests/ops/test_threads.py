"""SplitConv runs on onnxruntime's intra-op pool and its result does not depend on it."""

from __future__ import annotations

import numpy as np
import pytest

import redpp_onnx
from redpp_onnx.ops import packing

from .models import dense_conv_model, rel_err, run_stock, split_conv_model


@pytest.mark.parametrize("kernel", [3, 1])  # 1: the fused one-tap path
@pytest.mark.parametrize("batch,size", [(1, 32), (4, 15), (1, 7)])
def test_one_and_two_threads_give_identical_results(batch, size, kernel):
    rng = np.random.default_rng(batch * 100 + size + kernel)
    w = (rng.standard_normal((64, 200, kernel, kernel)) / 40).astype(np.float32)
    w[rng.random((64, 200)) < 0.4] = w[0, 0]  # shared kernels
    split = packing.pack(w)
    pads = [kernel // 2] * 4
    model = split_conv_model(split, pads=pads, activation="Relu")
    x = rng.standard_normal((batch, 200, size, size)).astype(np.float32)
    y1 = redpp_onnx.session(model, intra_op_num_threads=1).run(None, {"X": x})[0]
    y2 = redpp_onnx.session(model, intra_op_num_threads=2).run(None, {"X": x})[0]
    assert np.array_equal(y1, y2)  # bit for bit: the tiling depends on shapes only
    y_conv = run_stock(dense_conv_model(w, pads=pads, activation="Relu"), x)
    assert rel_err(y2, y_conv) <= 1e-5
