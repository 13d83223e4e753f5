"""Issue 5 on the real models: the emitted model equals the hashed + merged one (slow: ../shared/bench)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

import redpp_onnx
from redpp_onnx import io
from redpp_onnx.compress import compress
from redpp_onnx.config import CompressConfig
from redpp_onnx.evaluate import evaluate, load_dataset
from redpp_onnx.passes.split import SplitConfig

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "bench"
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not SHARED.is_dir(), reason=f"shared data not found at {SHARED}")]
MODELS = ["cifar10_resnet20.onnx", "cifar10_resnet56.onnx", "imagenet_efficientnet_lite0.onnx"]
TOL = 1e-5


def _outputs(model, x, plain=False):
    data = io.serialize(model)
    sess = (ort.InferenceSession(data, providers=["CPUExecutionProvider"]) if plain else redpp_onnx.session(data))
    return sess.run(None, {model.graph.input[0].name: x})[0]


def _rel(a, b):
    return float(np.linalg.norm(a.astype(np.float64) - b) / np.linalg.norm(b))


@pytest.fixture(scope="module", params=MODELS)
def models(request):
    original = io.load_model(SHARED / request.param)
    reference, _ = compress(original, CompressConfig(steps=("hash", "merge"), verify=False))
    shape = [d.dim_value for d in original.graph.input[0].type.tensor_type.shape.dim[1:]]
    x = np.random.default_rng(0).standard_normal([2] + shape).astype(np.float32)
    return request.param, original, reference, x


@pytest.mark.parametrize("mode", ["auto", "all"])
def test_emitted_model_equals_hashed_and_merged(models, mode):
    name, original, reference, x = models
    emitted, report = compress(original, CompressConfig(split=SplitConfig(mode=mode), verify=False))
    if mode == "all":
        convs = [l for l in report.layers if l.get("split", {}).get("decision") in ("split", "kept")]
        assert all(l["split"]["decision"] == "split" for l in convs) and convs
    assert _rel(_outputs(emitted, x), _outputs(reference, x)) <= TOL


def test_portable_runs_in_plain_onnxruntime_and_matches(models):
    name, original, reference, x = models
    emitted, _ = compress(original, CompressConfig(split=SplitConfig(mode="all", portable=True), verify=False))
    assert not any(n.domain == "ai.redpp" for n in emitted.graph.node)
    assert _rel(_outputs(emitted, x, plain=True), _outputs(reference, x)) <= TOL


def test_resnet20_split_all_keeps_the_hashed_top1():
    original = io.load_model(SHARED / "cifar10_resnet20.onnx")
    reference, _ = compress(original, CompressConfig(steps=("hash", "merge"), verify=False))
    emitted, _ = compress(original, CompressConfig(split=SplitConfig(mode="all"), verify=False))
    result = evaluate(emitted, load_dataset(SHARED / "cifar10_test_exact1017.npz"), reference=reference)
    assert result.top1_correct == result.reference_top1_correct and result.agreement == 1.0
