"""The shipped demo model (models/digits_cnn.onnx) and its held-out set (models/digits_test.npz).

Both are written by models/make_digits_cnn.py (torch + scikit-learn, development time only);
these tests import neither. The numbers checked here are the ones models/README.md records.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest

from redpp_onnx.cli import main
from redpp_onnx.evaluate import evaluate, load_dataset

MODELS = Path(__file__).resolve().parents[1] / "models"
MODEL = MODELS / "digits_cnn.onnx"
TEST_SET = MODELS / "digits_test.npz"
README = MODELS / "README.md"

# Held-out accuracy of digits_cnn.onnx measured with redpp_onnx.evaluate (onnxruntime), as
# recorded in models/README.md ("Measured accuracy": 358 / 360). Regenerating the model with
# another torch version may change it: update both places.
EXPECTED_CORRECT = 358
EXPECTED_N = 360


@pytest.fixture(scope="module")
def dataset():
    return load_dataset(TEST_SET)


@pytest.fixture(scope="module")
def original(dataset):
    return evaluate(str(MODEL), dataset)


def test_shipped_model_is_a_small_valid_cnn_with_separate_batchnorm():
    assert MODEL.stat().st_size < 1_000_000
    model = onnx.load(str(MODEL))
    onnx.checker.check_model(model, full_check=True)
    assert model.ir_version <= 13  # what onnxruntime 1.31 loads
    ops = [n.op_type for n in model.graph.node]
    assert ops.count("Conv") == 3 and ops.count("BatchNormalization") == 3
    assert "Gemm" in ops or "MatMul" in ops
    # every BatchNormalization directly follows a Conv and feeds a Relu
    producer = {o: n for n in model.graph.node for o in n.output}
    consumers = {}
    for n in model.graph.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n.op_type)
    for n in model.graph.node:
        if n.op_type == "BatchNormalization":
            assert producer[n.input[0]].op_type == "Conv"
            assert consumers[n.output[0]] == ["Relu"]
    assert [i.name for i in model.graph.input] == ["input"]
    assert [o.name for o in model.graph.output] == ["logits"]


def test_held_out_set_is_the_raw_layout(dataset):
    with np.load(TEST_SET) as npz:
        assert sorted(npz.files) == ["x", "y"]
        x, y = npz["x"], npz["y"]
    assert x.dtype == np.float32 and x.shape == (EXPECTED_N, 1, 8, 8)
    assert y.dtype == np.int64 and y.shape == (EXPECTED_N,)
    assert 0.0 <= x.min() and x.max() <= 1.0  # pixels / 16
    assert set(np.unique(y).tolist()) == set(range(10))
    assert len(dataset) == EXPECTED_N and dataset.sample_shape == (1, 8, 8)
    assert dataset.preprocessing.startswith("raw")


def test_held_out_accuracy_is_the_one_recorded_in_the_readme(original):
    assert original.n == EXPECTED_N
    assert original.top1_correct == EXPECTED_CORRECT
    assert f"**{EXPECTED_CORRECT} / {EXPECTED_N}**" in README.read_text()


def test_compress_keeps_the_held_out_accuracy(tmp_path, dataset, original):
    out, rep = tmp_path / "d.onnx", tmp_path / "r.json"
    before = MODEL.read_bytes()
    assert main(["compress", str(MODEL), "-o", str(out), "--report", str(rep), "-q"]) == 0
    assert MODEL.read_bytes() == before
    report = json.loads(rep.read_text())["model"]
    assert report["distinct_values_after"] < report["distinct_values_before"] // 2
    compressed = evaluate(str(out), dataset, reference=str(MODEL))
    assert compressed.n == original.n
    # within 1 percentage point of the original, on integer counts
    assert abs(compressed.top1_correct - original.top1_correct) * 100 <= original.n
    assert compressed.reference_top1_correct == original.top1_correct
