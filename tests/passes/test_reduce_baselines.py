"""The channel-reduction baselines of ``benchmarks/bench_reduce.py`` (``benchmarks/_reduce_baselines.py``)
do what they claim on a small graph: L1 pruning removes the filters of smallest L1 norm and
compensates nothing; the Neuron-Merging-style rule merges a filter that is an exact positive
multiple of a kept one (BatchNorm included) without output error, and only prunes behind a
non-homogeneous activation."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from onnx import numpy_helper

from redpp_onnx.analysis.coupling import analyze_coupling
from redpp_onnx.passes import reduce as R

from .test_reduce import _chain, _rel, _run, _x

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import _reduce_baselines as RB  # noqa: E402


def _model(act="Relu"):
    """Channels 0 and 1 of the first Conv: equal filters, channel 0's BatchNorm scale and shift 0.5x
    channel 1's (channel 0 = 0.5 x channel 1 after BatchNorm); every other filter 10x larger, so
    0 and 1 have the smallest L1 norms (0 first on the tie)."""
    model = _chain(act=act, scaled=(0, 1, 0.5))
    for t in model.graph.initializer:
        a = numpy_helper.to_array(t)
        if a.ndim == 4 and a.shape[:2] == (8, 4):
            a = a.copy()
            a[2:] *= 10
            t.CopyFrom(numpy_helper.from_array(a, t.name))
    return model


def _apply(model, fn, share):
    coupling = analyze_coupling(model)
    groups, _, reasons, macs = R.plan(model, R.ReduceConfig(alpha=0.0), coupling)
    dec = fn(model, coupling, groups, share)
    return dec, R.apply_plan(model, coupling, groups, dec, reasons, macs, compensate=False)


def test_l1_prunes_the_smallest_filters_without_compensation():
    model = _model()
    dec, res = _apply(model, RB.l1_decisions, 0.25)  # 2 of 8
    assert [(j, p) for j, p, _, _ in dec[0]] == [(0, None), (1, None)]
    row = next(r for r in res.layers if r.channels_before)
    assert (row.channels_before, row.channels_after, row.pruned, row.merged) == (8, 6, 2, 0)
    x = _x()
    assert _rel(_run(model, x), _run(res.model, x)) > 1e-3  # the channels' means are lost


def test_neuron_merging_merges_an_exact_multiple_exactly():
    model = _model()
    dec, res = _apply(model, RB.neuron_merging_decisions, 0.125)  # 1 of 8: channel 0, into channel 1
    assert len(dec[0]) == 1
    j, partner, scale, _ = dec[0][0]
    assert (j, partner) == (0, 1) and abs(scale - 0.5) < 1e-9
    row = next(r for r in res.layers if r.channels_before)
    assert (row.channels_after, row.pruned, row.merged) == (7, 0, 1)
    x = _x()
    assert _rel(_run(model, x), _run(res.model, x)) < 1e-5
    _, pruned = _apply(model, RB.l1_decisions, 0.125)
    assert _rel(_run(model, x), _run(pruned.model, x)) > 1e-3


def test_neuron_merging_only_prunes_behind_clip():
    model = _model("Clip")
    dec, res = _apply(model, RB.neuron_merging_decisions, 0.125)
    assert [(j, p) for j, p, _, _ in dec[0]] == [(0, None)]
    assert next(r for r in res.layers if r.channels_before).pruned == 1
