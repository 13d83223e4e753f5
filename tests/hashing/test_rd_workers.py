"""Rate-distortion hashing on several processes (``redpp_onnx/hashing/workers.py``): the same
output, bit for bit, with 1 and 2 workers; a task that fails in a worker raises its own exception
in the caller; the CLI option reaches the hashing."""

from __future__ import annotations

from pathlib import Path

import pytest

from redpp_onnx import io
from redpp_onnx.analysis.layers import scan_layers
from redpp_onnx.config import HashConfig
from redpp_onnx.errors import RedppError
from redpp_onnx.hashing import rd
from redpp_onnx.hashing import workers as W

DIGITS = Path(__file__).resolve().parents[2] / "models" / "digits_cnn.onnx"


@pytest.mark.parametrize("effort", ["fast", "thorough"])
def test_one_and_two_workers_give_the_same_model(effort):
    model = io.load_model(DIGITS)
    out1, res1 = rd.rd_hash(model, 0.1, workers=1, **rd.EFFORTS[effort])
    out2, res2 = rd.rd_hash(model, 0.1, workers=2, **rd.EFFORTS[effort])
    assert out1.SerializeToString() == out2.SerializeToString()
    assert [l.to_dict() for l in res1.layers] == [l.to_dict() for l in res2.layers]
    assert res1.bits_per_weight == res2.bits_per_weight and len(res1.layers) == len(scan_layers(model).layers) > 1


def _square_or_fail(x):
    if x == 3:
        raise ValueError("three")
    return x * x + W.state()["offset"]


def test_pmap_order_state_and_errors():
    seen = []
    got = W.pmap(_square_or_fail, [0, 1, 2, 4, 5], {"offset": 10}, 2, progress=lambda d, n, i: seen.append((d, n)),
                 cost=[1, 5, 2, 4, 3])
    assert got == [10, 11, 14, 26, 35] and [d for d, _ in seen] == [1, 2, 3, 4, 5]
    assert W.pmap(_square_or_fail, [2, 1], {"offset": 0}, 1) == [4, 1]
    with pytest.raises(ValueError, match="three"):  # raised in a worker, re-raised here with its type
        W.pmap(_square_or_fail, [1, 3], {"offset": 0}, 2)


def test_default_workers_by_model_size():
    assert W.default_workers(W.POOL_MIN_WEIGHTS - 1) == 1
    assert W.default_workers(W.POOL_MIN_WEIGHTS) == W.available_cores()
    assert W.resolve(3, 10) == 3 and W.resolve(None, 10) == 1


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_bad_worker_counts_are_refused(bad):
    with pytest.raises(RedppError, match="--workers"):
        HashConfig(workers=bad)


def test_a_second_model_is_not_measured_with_the_first_ones_graph():
    """The serial path parses the model once per call; a later call on another model (whose
    serialized bytes may reuse the freed object's address) must measure that model."""
    import numpy as np
    from onnx import numpy_helper

    a = io.load_model(DIGITS)
    b = io.load_model(DIGITS)
    w = b.graph.initializer[0]
    w.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(w) * np.float32(3.0), w.name))

    def curves(model):
        return [(r.d.tolist(), r.e.tolist()) for r in rd.sensitivities(model, rd.layer_views(model), workers=1)]

    alone = curves(b)
    assert not rd._PARSED  # nothing kept between calls
    first = curves(a)
    assert curves(b) == alone != first
