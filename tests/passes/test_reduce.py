"""Relaxed merging that prunes (``redpp_onnx/passes/reduce.py``, ``--target-macs``, ``--alpha`` with
rule redpp) on small graphs: the compensation is exact on a constant channel, scale matching is
exact where the activation is homogeneous and refused where it is not, coupled channels are left
alone, a model without BatchNorm gets its statistics from the moment walk; each test counts the
channels that went and measures the output error."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from redpp_onnx.analysis.layers import scan_layers
from redpp_onnx.cli import main
from redpp_onnx.passes import reduce as R
from redpp_onnx.passes.merge import MergeConfig, MergePass

from ..graphs import GraphBuilder

SIZE = 8


def _run(model, x):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0].astype(np.float64)


def _x(seed=0, n=64, c=4):
    return np.random.default_rng(seed).standard_normal((n, c, SIZE, SIZE)).astype(np.float32)


def _rel(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(a))


def _bn(g, c, gamma, beta):
    vals = [gamma, beta, np.zeros(c), np.ones(c)]
    return lambda x: g.node("BatchNormalization", [x] + [g.const(np.asarray(v, np.float32), "bn") for v in vals],
                            epsilon=0.0)


def _chain(act="Relu", k2=1, constant=None, scaled=None, seed=0, c=8):
    """x -> Conv(4->c, 3x3) -> BN -> act -> Conv(c->6, k2 x k2) -> y. ``constant``: a channel whose
    BN scale is 0 (the channel is its BN bias: a constant); ``scaled``: (j, k, s) makes channel j's
    weights and BN shift s times channel k's."""
    g = GraphBuilder(seed)
    w = g.weights(c, 4, 3, 3)
    gamma, beta = np.full(c, 1.0), g.rng.normal(0.2, 0.3, c)
    if constant is not None:
        gamma[constant] = 0.0
        beta[constant] = 0.7
    if scaled is not None:
        j, k, s = scaled
        gamma[j], beta[j] = s * gamma[k], s * beta[k]
        w[j] = w[k]
    h = g.node("Conv", ["x", g.const(w, "W")], pads=[1] * 4)
    h = _bn(g, c, gamma, beta)(h)
    if act == "Relu":
        h = g.node("Relu", [h])
    elif act == "Clip":
        h = g.node("Clip", [h, g.const(np.float32(0.0), "lo"), g.const(np.float32(6.0), "hi")])
    y = g.node("Conv", [h, g.const(g.weights(6, c, k2, k2), "W2"), g.const(g.weights(6, scale=0.1), "B2")],
               pads=[k2 // 2] * 4)
    return g.model(["N", 4, SIZE, SIZE], y)


def _decisions(model, config):
    groups, decisions, _, _ = R.plan(model, config)
    return groups, decisions


def test_pruning_a_constant_channel_is_exact_with_its_mean_compensated():
    """The mean compensation alone (the refit, on by default, is tested in test_refit.py)."""
    model = _chain(constant=3)
    res = R.reduce_channels(model, R.ReduceConfig(alpha=0.1, strategy="uniform", multiple=1, refit=False))  # floor(0.8) = 0 channels
    assert res.macs_after == res.macs_before
    res = R.reduce_channels(model, R.ReduceConfig(alpha=0.125, strategy="uniform", multiple=1, refit=False))  # 1 of 8
    row = next(r for r in res.layers if r.pruned + r.merged)
    assert (row.channels_before, row.channels_after, row.pruned) == (8, 7, 1) and row.cost == 0.0
    x = _x()
    assert _rel(_run(model, x), _run(res.model, x)) < 1e-6  # 1x1 consumer: exact
    off = R.reduce_channels(model, R.ReduceConfig(alpha=0.125, strategy="uniform", compensate=False, multiple=1, refit=False))
    assert _rel(_run(model, x), _run(off.model, x)) > 1e-2  # without compensation its mean is lost


def test_compensation_through_a_padded_consumer_is_exact_in_the_mean_over_positions():
    model = _chain(constant=5, k2=3)
    res = R.reduce_channels(model, R.ReduceConfig(alpha=0.125, strategy="uniform", multiple=1, refit=False))
    assert sum(r.pruned for r in res.layers) == 1
    x = _x()
    a, b = _run(model, x), _run(res.model, x)
    # borders see part of the kernel: per position the error is not 0, its mean over positions is
    assert _rel(a, b) > 1e-4
    np.testing.assert_allclose(a.mean(axis=(2, 3)), b.mean(axis=(2, 3)), atol=1e-5)


@pytest.mark.parametrize("act", ["Relu", "none"])
def test_scale_matching_is_exact_for_a_homogeneous_activation(act):
    model = _chain(act=act, scaled=(6, 2, 2.5), seed=3)
    groups, decisions = _decisions(model, R.ReduceConfig(alpha=0.125, strategy="uniform", multiple=1))
    (k, dec), = [(k, d) for k, d in decisions.items() if d]
    j, partner, s, cost = dec[0]
    gr = groups[k]
    assert {gr.classes[j], gr.classes[partner]} == {6, 2}
    assert s == pytest.approx(2.5 if gr.classes[j] == 6 else 0.4, rel=1e-5) and cost < 1e-9
    res = R.reduce_channels(model, R.ReduceConfig(alpha=0.125, strategy="uniform", multiple=1, plan="cost"))
    assert sum(r.merged for r in res.layers) == 1 and sum(r.pruned for r in res.layers) == 0
    x = _x()
    assert _rel(_run(model, x), _run(res.model, x)) < 1e-5


def test_scale_matching_is_refused_for_a_clip():
    """Relu6 is not positively homogeneous: a channel 2.5x another is not its scaled copy there;
    only s = 1 merges are allowed, so it is pruned (or merged with s = 1), never scaled."""
    model = _chain(act="Clip", scaled=(6, 2, 2.5), seed=3)
    _, decisions = _decisions(model, R.ReduceConfig(alpha=0.125, strategy="uniform", multiple=1))
    for dec in decisions.values():
        for j, partner, s, _ in dec:
            assert partner is None or s == 1.0
    res = R.reduce_channels(model, R.ReduceConfig(alpha=0.125, strategy="uniform", multiple=1))
    assert sum(r.pruned + r.merged for r in res.layers) == 1
    x = _x()
    assert 1e-4 < _rel(_run(model, x), _run(res.model, x)) < 0.5


def _residual(seed=4, c=8):
    """x -> Conv -> BN -> Relu = h; h -> Conv -> BN -> Relu -> Conv -> BN -> (+ h) -> Relu -> head."""
    g = GraphBuilder(seed)
    h = g.node("Relu", [g.bn(g.conv("x", 4, c, bias=False), c)])
    inner = g.node("Relu", [g.bn(g.conv(h, c, c, bias=False), c)])
    out = g.node("Relu", [g.node("Add", [g.bn(g.conv(inner, c, c, bias=False), c), h])])
    y = g.gemm(g.node("Flatten", [g.node("GlobalAveragePool", [out])]), c, 5)
    return g.model(["N", 4, SIZE, SIZE], y)


def test_coupled_channels_go_from_every_producer_at_once():
    model = _residual()
    default = R.reduce_channels(model, R.ReduceConfig(alpha=0.5, strategy="uniform", multiple=1))
    assert sum(r.pruned + r.merged for r in default.layers) == 4  # the inner conv's half only
    assert sum(any("coupled" in x for x in r.reasons) for r in default.layers) == 2
    groups, decisions = _decisions(model, R.ReduceConfig(alpha=0.5, strategy="uniform", coupled=True, multiple=1))
    coupled = [k for k, gr in enumerate(groups) if len(gr.producers) == 2]
    assert len(coupled) == 1 and len(groups) == 2  # the Add's channels; the inner conv's
    assert all(p is None for _, p, _, _ in decisions[coupled[0]])  # pruned, never merged
    res = R.reduce_channels(model, R.ReduceConfig(alpha=0.5, strategy="uniform", coupled=True, multiple=1))
    after = sorted(l.weight_shape[:2] for l in scan_layers(res.model).layers if len(l.weight_shape) == 4)
    # half of the residual channels (8 -> 4) from the first and last conv, and half the inner ones
    assert after == [(4, 4, ), (4, 4), (4, 4)]
    gemm = [l for l in scan_layers(res.model).layers if l.op_type == "Gemm"][0]
    assert 4 in gemm.weight_shape
    x = _x()
    err = _rel(_run(model, x), _run(res.model, x))
    assert 1e-3 < err < 1.0 and np.isfinite(_run(res.model, x)).all()


def test_a_model_without_batchnorm_gets_statistics_from_the_moment_walk():
    g = GraphBuilder(6)
    h = g.node("Relu", [g.conv("x", 4, 16)])
    y = g.gemm(g.node("Flatten", [g.node("GlobalAveragePool", [g.node("Relu", [g.conv(h, 16, 12)])])]), 12, 5)
    model = g.model(["N", 4, SIZE, SIZE], y)
    res = R.reduce_channels(model, R.ReduceConfig(alpha=0.25, strategy="uniform", multiple=1))
    removed = {r.name: r.pruned + r.merged for r in res.layers if r.pruned + r.merged}
    assert sum(removed.values()) == 4 + 3  # a quarter of 16 and of 12
    x = _x()
    err = _rel(_run(model, x), _run(res.model, x))
    assert 1e-4 < err < 0.5
    # the cheapest quarter by the predicted cost loses less than the dearest quarter
    from redpp_onnx.analysis.coupling import analyze_coupling

    coupling = analyze_coupling(model)
    groups, decisions, reasons, macs = R.plan(model, R.ReduceConfig(alpha=0.25, strategy="uniform", merge=False, multiple=1),
                                              coupling)
    dearest = {}
    for k, gr in enumerate(groups):
        order = np.argsort(-gr.loss)[:len(decisions[k])]
        dearest[k] = [(int(j), None, 0.0, 0.0) for j in order]
    worse = R.apply_plan(model, coupling, groups, dearest, reasons, macs)
    assert _rel(_run(model, x), _run(worse.model, x)) > 1.5 * err


def test_target_macs_is_reached_with_at_most_half_a_layer():
    model = _residual(c=16)
    before = sum(l.macs for l in scan_layers(model).layers)
    res = R.reduce_channels(model, R.ReduceConfig(target_macs=0.9, multiple=1))
    assert res.macs_before == before and res.macs_after <= 0.9 * before
    for r in res.layers:
        assert r.pruned + r.merged <= r.channels_before // 2
    merged = MergePass(MergeConfig(target_macs=0.9)).run(model)  # kept counts multiples of 8: 16 -> 8
    assert merged.function_changed and merged.channels_removed == 8
    row = next(l for l in merged.layers if l.merged_out)
    assert row.macs_after < row.macs_before and row.predicted_cost is not None


def test_kept_channel_counts_are_multiples_of_eight_by_default():
    """onnxruntime's Conv runs channel blocks of 8 (AVX2): other counts made it slower."""
    model = _residual(c=32)
    res = R.reduce_channels(model, R.ReduceConfig(target_macs=0.8))
    rows = [r for r in res.layers if r.pruned + r.merged]
    assert rows and all(r.channels_after % 8 == 0 for r in rows)
    assert res.macs_after <= 0.8 * res.macs_before
    fine = R.reduce_channels(model, R.ReduceConfig(target_macs=0.8, multiple=1))
    assert any(r.channels_after % 8 for r in fine.layers if r.pruned + r.merged)
    few = R.reduce_channels(_chain(c=12), R.ReduceConfig(alpha=0.5, strategy="uniform"))  # 12 -> 8, not 6
    assert [r.channels_after for r in few.layers if r.pruned + r.merged] == [8]


def test_cli_target_macs(tmp_path, capsys):
    src = tmp_path / "m.onnx"
    src.write_bytes(_residual(c=16).SerializeToString())
    report = tmp_path / "r.json"
    assert main(["compress", str(src), "-o", str(tmp_path / "o.onnx"), "--target-macs", "0.9", "--report",
                 str(report), "-q"]) == 0
    import json

    r = json.loads(report.read_text())
    assert r["model"]["macs_after"] <= 0.9 * r["model"]["macs_before"]
    assert r["model"]["merge_target_macs"] == 0.9 and r["model"]["merge_channels_removed"] > 0
    for bad in (["--alpha", "0.2"], ["--merge-rule", "percentile"]):
        assert main(["compress", str(src), "-o", str(tmp_path / "x.onnx"), "--target-macs", "0.9"] + bad) == 2
        assert "--target-macs" in capsys.readouterr().err
    assert not (tmp_path / "x.onnx").exists()
    onnx.checker.check_model(onnx.load(str(tmp_path / "o.onnx")))


def test_a_channel_dead_in_training_is_its_constant_and_pruned_exactly():
    """Channel 3's filter is zero and its BatchNorm running variance 0 (a channel dead in training):
    at inference it is the constant Relu(β_3) = 0.7. The moment walk must say so (variance
    γ² rv / (rv + ε) = 0, not γ²), so it is removed first at no cost and its compensation is exact
    (with ``E[Relu(N(β, γ²))]`` instead of 0.7 the output would move)."""
    from redpp_onnx.analysis.theory import moment_state

    c = 8
    g = GraphBuilder(5)
    w = g.weights(c, 4, 3, 3)
    w[3] = 0.0
    gamma, beta = np.full(c, 1.0), g.rng.normal(0.2, 0.3, c)
    beta[3] = 0.7
    var = np.ones(c)
    var[3] = 0.0
    h = g.node("Conv", ["x", g.const(w, "W")], pads=[1] * 4)
    h = g.node("BatchNormalization", [h] + [g.const(np.asarray(v, np.float32), "bn")
                                            for v in (gamma, beta, np.zeros(c), var)], epsilon=1e-3)
    r = g.node("Relu", [h])
    y = g.node("Conv", [r, g.const(g.weights(6, c, 1, 1), "W2"), g.const(g.weights(6, scale=0.1), "B2")])
    model = g.model(["N", 4, SIZE, SIZE], y)
    st = moment_state(model)[h]
    assert st.var[3] == 0.0 and st.mean[3] == pytest.approx(0.7)
    assert st.var[0] == pytest.approx(1.0 / (1.0 + 1e-3))
    res = R.reduce_channels(model, R.ReduceConfig(alpha=0.125, strategy="uniform", multiple=1))
    row = next(r for r in res.layers if r.pruned + r.merged)
    assert (row.channels_after, row.pruned) == (7, 1) and row.cost < 1e-12  # both plans: it costs nothing
    x = _x()
    assert _rel(_run(model, x), _run(res.model, x)) < 1e-6


def test_cli_channel_multiple(tmp_path, capsys):
    """--channel-multiple 16 (onnxruntime's NCHWc block on AVX-512): kept counts are multiples of 16."""
    import json

    src = tmp_path / "m.onnx"
    src.write_bytes(_residual(c=32).SerializeToString())
    report = tmp_path / "r.json"
    assert main(["compress", str(src), "-o", str(tmp_path / "o.onnx"), "--target-macs", "0.8", "--channel-multiple",
                 "16", "--report", str(report), "-q"]) == 0
    layers = [l["merge"] for l in json.loads(report.read_text())["layers"] if l.get("merge")]
    cut = [l for l in layers if l["channels_after"] < l["channels_before"]]
    assert [l["channels_after"] for l in cut] == [16]
    assert main(["compress", str(src), "-o", str(tmp_path / "x.onnx"), "--target-macs", "0.8",
                 "--channel-multiple", "0"]) == 2
    assert "--channel-multiple" in capsys.readouterr().err and not (tmp_path / "x.onnx").exists()


def test_cli_reduce_plan_says_which_plan_it_used(tmp_path, capsys):
    """--reduce-plan auto (default) measures the plan on the twin for a direct model and says so in the
    report's notes; --reduce-plan cost keeps the closed-form plan; a wrong value is refused."""
    import json

    src = tmp_path / "m.onnx"
    src.write_bytes(_residual(c=32).SerializeToString())
    notes = {}
    for how in ("auto", "cost"):
        report = tmp_path / f"{how}.json"
        assert main(["compress", str(src), "-o", str(tmp_path / f"{how}.onnx"), "--target-macs", "0.8",
                     "--reduce-plan", how, "--report", str(report), "-q"]) == 0
        notes[how] = " ".join(json.loads(report.read_text())["notes"])
    assert "plan measured on the synthetic twin" in notes["auto"]
    assert "plan measured on the synthetic twin" not in notes["cost"]
    with pytest.raises(SystemExit) as exc:
        main(["compress", str(src), "-o", str(tmp_path / "x.onnx"), "--target-macs", "0.8", "--reduce-plan", "best"])
    assert exc.value.code == 2
    assert "--reduce-plan" in capsys.readouterr().err and not (tmp_path / "x.onnx").exists()
