"""Hash then merge on the real models in ../shared/bench (slow)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper as nh

from redpp_onnx import io, verify
from redpp_onnx.analysis.coupling import PER_CHANNEL, PRODUCER, analyze_coupling
from redpp_onnx.config import HashConfig
from redpp_onnx.passes.hash import HashPass
from redpp_onnx.passes.merge import MergeConfig, MergePass

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "bench"
MODELS = sorted(p.name for p in SHARED.glob("*.onnx")) if SHARED.is_dir() else []
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not MODELS, reason=f"shared data not found at {SHARED}")]

_HASHED = {}


def hashed(name: str) -> onnx.ModelProto:
    if name not in _HASHED:
        _HASHED[name] = HashPass(HashConfig()).run(io.load_model(SHARED / name)).model
    return _HASHED[name]


def _check(before, result, tol=1e-5):
    onnx.checker.check_model(result.model)
    for seed in (0, 1):
        assert verify.compare(before, result.model, batch=2, seed=seed).max_rel_l2 <= tol


@pytest.mark.parametrize("name", MODELS)
def test_hash_then_merge_alpha0_keeps_the_hashed_function(name):
    model = hashed(name)
    result = MergePass(MergeConfig()).run(model)
    _check(model, result)
    assert not result.function_changed
    assert result.params_before == sum(l.params_before for l in result.layers) > 0
    for row in result.layers:  # nothing silently skipped: every unmerged layer says why
        assert row.merged_out or row.reasons, row.name
    for group in result.groups:
        assert group.merged or group.reasons, group.id
    assert any(r == "channel feeds the graph output logits" for g in result.groups for r in g.reasons)


def test_efficientnet_lite0_refusals_are_explained():
    result = MergePass(MergeConfig()).run(hashed("imagenet_efficientnet_lite0.onnx"))
    depthwise = [r for r in result.refused if "depthwise" in r.reason]
    assert len(depthwise) == 16
    reasons = {r for l in result.layers for r in l.reasons}
    assert "channel feeds the graph output logits" in reasons
    assert any(r.startswith("no two channels have equal signatures") for r in reasons)
    fc = [l for l in result.layers if l.op_type == "Gemm"][0]
    assert fc.reasons == ["channel feeds the graph output logits"] and fc.inputs_before == 1280


def plant(model: onnx.ModelProto, producer: str, src: int, dst: int) -> onnx.ModelProto:
    """Copy output channel ``src`` of ``producer``'s bucket onto ``dst`` in every producer and
    per-channel op of the bucket (weights, bias, BN, depthwise kernel...)."""
    coupling = analyze_coupling(model)
    group = [g for g in coupling.groups if any(op.name == producer for op in g.producers)][0]
    out = onnx.ModelProto()
    out.CopyFrom(model)
    inits = {t.name: t for t in out.graph.initializer}
    for op in group.ops:
        if op.role not in (PRODUCER, PER_CHANNEL):
            continue
        pos = coupling.layout[op.tensor]
        classes = coupling.layout[[o for o in group.ops if o.name == producer and o.role == PRODUCER][0].tensor]
        if classes[src] not in pos:
            continue
        s, d = pos.index(classes[src]), pos.index(classes[dst])
        for p in op.params:
            arr = np.moveaxis(nh.to_array(inits[p.name]).copy(), p.axis, 0)
            arr[d] = arr[s]
            inits[p.name].CopyFrom(nh.from_array(np.moveaxis(arr, 0, p.axis), p.name))
    return out


@pytest.mark.parametrize("name,producer,planted", [
    ("cifar10_resnet20.onnx", "/layer2/layer2.1/conv1/Conv", [(0, 5), (0, 9), (3, 4)]),
    ("cifar10_resnet56.onnx", "/layer3/layer3.8/conv1/Conv", [(1, 2)]),
    ("cifar10_resnet20.onnx", "/conv1/Conv", [(2, 7)]),  # the stage-1 trunk: 10 producers, Pad, Slice
    ("imagenet_efficientnet_lite0.onnx", "/_blocks.4/_expand_conv/Conv", [(0, 10), (7, 8)]),  # via depthwise
    ("imagenet_efficientnet_lite0.onnx", "/_conv_head/Conv", [(5, 6)]),  # GAP -> Flatten -> Gemm
])
def test_planted_duplicates_merge_exactly_in_real_graphs(name, producer, planted):
    model = hashed(name)
    for src, dst in planted:
        model = plant(model, producer, src, dst)
    result = MergePass(MergeConfig()).run(model)
    assert result.channels_removed == len(planted)
    row = [l for l in result.layers if l.name == producer][0]
    assert row.merged_out == len(planted)
    _check(model, result)


def test_resnet20_alpha_changes_the_function_and_says_so():
    model = hashed("cifar10_resnet20.onnx")
    removed = []
    for alpha in (0.0, 0.05, 0.2):
        result = MergePass(MergeConfig(alpha=alpha)).run(model)
        removed.append(result.channels_removed)
        onnx.checker.check_model(result.model)
        if alpha and result.channels_removed:
            assert result.function_changed and "changes the function" in result.notes[0]
            assert verify.compare(model, result.model, batch=2).max_rel_l2 > 1e-3
        else:
            # kept counts are multiples of 8: a small alpha on 16-channel layers may remove
            # nothing, and then the pass must say so and leave the function alone
            assert not result.function_changed
            assert any("removed no channel" in n for n in result.notes)
    assert removed[0] <= removed[1] <= removed[2] and removed[2] > 0
