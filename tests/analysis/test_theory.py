"""redpp_onnx.analysis.theory: the per-layer bound, U, E[norm], the birthday expectations."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import onnx
import pytest
from scipy.special import erf

import redpp_onnx
from redpp_onnx.analysis import theory
from redpp_onnx.analysis.theory import (
    HARMFUL_FROM,
    HARMLESS_BELOW,
    analyze,
    birthday_expectation,
    clipped_gaussian_moments,
    compose_bound,
    expected_abs_gaussian,
    expected_logits,
    rectified_gaussian_moments,
    verdict,
)
from redpp_onnx.config import HashConfig
from redpp_onnx.passes.hash import HashPass

from ..graphs import GraphBuilder

SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "bench"

BETA = np.array([0.5, -0.3, 0.0, 1.2], dtype=np.float32)
GAMMA = np.array([1.0, -0.8, 0.4, 2.0], dtype=np.float32)
RUN_MEAN = np.array([0.1, -0.2, 0.3, 0.0], dtype=np.float32)
RUN_VAR = np.array([1.0, 0.5, 2.0, 0.25], dtype=np.float32)
EPS = 1e-5


def _bn_var(gamma=GAMMA, rv=RUN_VAR, eps=EPS) -> np.ndarray:
    """The walk's variance after a BatchNorm: ``γ² rv / (rv + ε)`` (an input whose variance is the
    running one)."""
    rv = np.asarray(rv, np.float64)
    return np.asarray(gamma, np.float64) ** 2 * rv / (rv + eps)


def _bn(g: GraphBuilder, x: str) -> str:
    ins = [g.const(a, "bn") for a in (GAMMA, BETA, RUN_MEAN, RUN_VAR)]
    return g.node("BatchNormalization", [x] + ins, epsilon=EPS)


CFG = HashConfig(weight_error=0.05)  # tiny layers: the default 1 % budget leaves them unchanged


def conv_bn_model(seed=0):
    """x[N,16,8,8] -> Conv(16->4, 3x3) -> BN -> Relu -> GAP -> Flatten -> Gemm(4->50)."""
    g = GraphBuilder(seed)
    h = g.node("Relu", [_bn(g, g.conv("x", 16, 4, bias=False))])
    h = g.node("Flatten", [g.node("GlobalAveragePool", [h])])
    return g.model(["N", 16, 8, 8], g.gemm(h, 4, 50))


def bn_head_model(hw=1, act="Relu", tail=None, seed=1):
    """x[N,4,hw,hw] -> BN -> act -> GAP -> Flatten -> Gemm(4->3) [-> tail]; and the Gemm arrays."""
    g = GraphBuilder(seed)
    h = _bn(g, "x")
    if act:
        h = g.node(act, [h])
    h = g.node("Flatten", [g.node("GlobalAveragePool", [h])])
    w = (g.rng.standard_normal((3, 4))).astype(np.float32)
    b = np.array([0.1, -0.2, 0.3], dtype=np.float32)
    y = g.node("Gemm", [h, g.const(w, "G"), g.const(b, "GB")], transB=1)
    if tail:
        y = g.node(tail, [y])
    return g.model(["N", 4, hw, hw], y), w, b


def _rectified_mean_var(mu, s):
    """Closed forms of max(N(mu, s^2), 0), written independently of the module."""
    from scipy.stats import norm

    z = mu / s
    m = mu * norm.cdf(z) + s * norm.pdf(z)
    second = (mu ** 2 + s ** 2) * norm.cdf(z) + mu * s * norm.pdf(z)
    return m, second - m ** 2


# --------------------------------------------------------------------------- per layer


def test_per_layer_error_matches_numpy_formula():
    model = conv_bn_model()
    result = HashPass(CFG).run(model)
    rows = theory.layer_theory(model, result.layers, result.model)
    assert [r.op_type for r in rows] == ["Conv", "Gemm"]
    assert all(h.method == "kde" and h.u_l > 0 for h in result.layers)
    conv, gemm = rows
    u_conv = next(h.u_l for h in result.layers if h.op_type == "Conv")
    mu, sigma = float(BETA.astype(np.float64).mean()), float(np.abs(GAMMA.astype(np.float64)).mean())
    expected = u_conv / math.sqrt(16 * 3 * 3) * (1 - erf(-mu / (sigma * math.sqrt(2))))
    assert conv.u_l == u_conv and conv.fan_in == 144 and conv.bn is not None
    assert conv.bn_mu == pytest.approx(mu, rel=1e-12)
    assert conv.bn_sigma == pytest.approx(sigma, rel=1e-12)
    assert conv.e_l == pytest.approx(expected, rel=1e-12)
    # The Gemm has no following BN: factor 1, fan_in = its input features.
    u_gemm = next(h.u_l for h in result.layers if h.op_type == "Gemm")
    assert gemm.bn is None and gemm.act_factor == 1.0 and gemm.fan_in == 4
    assert gemm.e_l == pytest.approx(u_gemm / 2.0, rel=1e-12)
    # Gains: paper = mean beta; magnitude = mean E|N(beta, gamma^2)|, checked by sampling.
    assert conv.gain["paper"] == pytest.approx(mu)
    rng = np.random.default_rng(0)
    samples = rng.standard_normal((400_000, 4)) * GAMMA + BETA
    assert conv.gain["magnitude"] == pytest.approx(np.abs(samples).mean(axis=0).mean(), rel=5e-3)
    assert gemm.gain == {"magnitude": 1.0, "paper": 1.0}


def test_bn_not_directly_after_layer_does_not_count():
    g = GraphBuilder(2)
    h = _bn(g, g.node("Relu", [g.conv("x", 16, 4, bias=False)]))  # Conv -> Relu -> BN
    h = g.node("Flatten", [g.node("GlobalAveragePool", [h])])
    model = g.model(["N", 16, 8, 8], g.gemm(h, 4, 5))
    result = HashPass(CFG).run(model)
    conv = theory.layer_theory(model, result.layers, result.model)[0]
    assert conv.bn is None and conv.bn_mu is None and conv.act_factor == 1.0
    assert conv.u_l > 0 and conv.e_l == pytest.approx(conv.u_l / math.sqrt(144), rel=1e-12)


def test_activation_factor_limits():
    assert theory.activation_factor(None, None) == 1.0
    assert theory.activation_factor(0.0, 1.0) == pytest.approx(1.0)
    assert theory.activation_factor(1.0, 0.0) == 2.0
    assert theory.activation_factor(-1.0, 0.0) == 0.0
    assert theory.activation_factor(0.3, 0.7) == pytest.approx(1 + erf(0.3 / (0.7 * math.sqrt(2))))


def test_compose_bound_is_product_difference_and_first_order():
    rng = np.random.default_rng(3)
    e = rng.uniform(0, 0.01, 7)
    g = rng.uniform(0.5, 1.5, 7)
    u, first = compose_bound(e, g)
    assert u == pytest.approx(np.prod(e + g) - np.prod(g), rel=1e-9)
    assert first == pytest.approx(sum(e[l] * np.prod(np.delete(g, l)) for l in range(7)), rel=1e-12)
    # The appendix's L = 2 case: mu^1 E||f2~ - f2|| + mu^2 E||f1~ - f1|| (+ e1 e2).
    u2, first2 = compose_bound([0.1, 0.2], [3.0, 5.0])
    assert first2 == pytest.approx(0.1 * 5.0 + 0.2 * 3.0)
    assert u2 == pytest.approx(first2 + 0.1 * 0.2)
    # Tiny e with huge products: no cancellation (the naive difference would be 0).
    u3, first3 = compose_bound([1e-20] * 3, [1e8] * 3)
    assert u3 == pytest.approx(3e-20 * 1e16, rel=1e-9, abs=0)


# --------------------------------------------------------------------------- Gaussian moments


@pytest.mark.parametrize("mu,sigma,lo,hi", [
    (0.3, 0.7, 0.0, np.inf),     # ReLU
    (-1.0, 0.5, 0.0, np.inf),    # ReLU, mostly off
    (2.0, 3.0, 0.0, 6.0),        # ReLU6
    (5.5, 1.0, 0.0, 6.0),        # ReLU6, mostly saturated
    (0.0, 1.0, -1.0, np.inf),
])
def test_clipped_gaussian_moments_against_sampling(mu, sigma, lo, hi):
    # 1e6 samples: std. error of the mean <= sigma/1000; tolerance 5 std. errors on the mean,
    # 1 % (plus 5 std. errors) on the variance.
    x = np.clip(np.random.default_rng(7).normal(mu, sigma, 1_000_000), lo, hi)
    m, v = clipped_gaussian_moments(mu, sigma, lo, hi)
    assert abs(float(m) - x.mean()) < 5 * sigma / 1000
    assert float(v) == pytest.approx(x.var(), rel=1e-2, abs=5 * sigma ** 2 / 1000)


def test_rectified_gaussian_matches_closed_form_and_limits():
    mu = np.array([-2.0, -0.1, 0.0, 0.4, 3.0])
    s = np.array([1.0, 0.3, 2.0, 0.5, 0.1])
    m, v = rectified_gaussian_moments(mu, s)
    em, ev = _rectified_mean_var(mu, s)
    np.testing.assert_allclose(m, em, rtol=1e-10)
    np.testing.assert_allclose(v, ev, rtol=1e-8, atol=1e-14)
    m0, v0 = rectified_gaussian_moments([-1.0, 2.0], [0.0, 0.0])  # deterministic
    np.testing.assert_array_equal(m0, [0.0, 2.0])
    np.testing.assert_array_equal(v0, [0.0, 0.0])
    assert float(expected_abs_gaussian(-0.7, 0.0)) == pytest.approx(0.7)
    assert float(expected_abs_gaussian(0.0, 1.0)) == pytest.approx(math.sqrt(2 / math.pi))


# --------------------------------------------------------------------------- E[norm]


def test_enorm_closed_form_on_bn_relu_gap_gemm():
    model, w, b = bn_head_model(hw=3)
    est = expected_logits(model)
    assert est.reason is None
    # the BN's output: N(β, γ² rv / (rv + ε)) (an input whose variance is the running one)
    m, v = _rectified_mean_var(BETA.astype(np.float64), np.sqrt(_bn_var()))
    mean = w.astype(np.float64) @ m + b
    np.testing.assert_allclose(est.mean, mean, rtol=1e-9)
    assert est.E_norm == pytest.approx(np.linalg.norm(mean), rel=1e-9)
    # The variance passes GAP unchanged (an upper bound) and adds through the Gemm.
    np.testing.assert_allclose(est.var, (w.astype(np.float64) ** 2) @ v, rtol=1e-9)
    assert est.V_norm == pytest.approx(math.sqrt(((w.astype(np.float64) ** 2) @ v).sum()), rel=1e-9)


def test_enorm_monte_carlo_through_onnxruntime():
    # BN input ~ N(running_mean, running_var + eps) per channel makes the BN output exactly
    # N(beta, gamma^2): the walk's logit mean and variance must match the sampled ones.
    model, _, _ = bn_head_model(hw=1)
    est = expected_logits(model)
    n = 200_000
    rng = np.random.default_rng(11)
    x = (rng.standard_normal((n, 4)) * np.sqrt(RUN_VAR.astype(np.float64) + EPS) + RUN_MEAN).astype(np.float32)
    y = redpp_onnx.session(model).run(None, {"x": x.reshape(n, 4, 1, 1)})[0].astype(np.float64)
    stderr = np.sqrt(y.var(axis=0) / n)
    assert np.all(np.abs(y.mean(axis=0) - est.mean) < 5 * stderr + 1e-6)
    np.testing.assert_allclose(est.var, y.var(axis=0), rtol=2e-2)
    assert est.E_norm <= np.linalg.norm(y, axis=1).mean()  # Jensen: a conservative denominator


def test_enorm_through_slice_pad_add_clip_mul():
    # BN(4) -> Slice(spatial, stride 2) -> Pad(channels 2 + 2) -> Add(BN'(8)) -> Clip(0, 6) -> *2
    g = GraphBuilder(5)
    h = g.node("Slice", [_bn(g, "x"), g.const(np.array([0, 0]), "s"), g.const(np.array([2 ** 62, 2 ** 62]), "e"),
                         g.const(np.array([2, 3]), "a"), g.const(np.array([2, 2]), "st")])
    h = g.node("Pad", [h, g.const(np.array([0, 2, 0, 0, 0, 2, 0, 0]), "p")], mode="constant")
    beta2 = np.linspace(-1, 1, 8).astype(np.float32)
    gamma2 = np.linspace(0.5, 1.5, 8).astype(np.float32)
    other = g.node("BatchNormalization", ["y2"] + [g.const(a, "bn") for a in
                   (gamma2, beta2, np.zeros(8, np.float32), np.ones(8, np.float32))])
    h = g.node("Add", [h, other])
    h = g.node("Clip", [h, g.const(np.array(0.0, np.float32), "lo"), g.const(np.array(6.0, np.float32), "hi")])
    h = g.node("Mul", [h, g.const(np.array(2.0, np.float32), "k")])
    y = g.node("Flatten", [g.node("GlobalAveragePool", [h])])
    graph = onnx.helper.make_graph(
        g.nodes, "g", [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["N", 4, 6, 6]),
                       onnx.helper.make_tensor_value_info("y2", onnx.TensorProto.FLOAT, ["N", 8, 3, 3])],
        [onnx.helper.make_tensor_value_info(y, onnx.TensorProto.FLOAT, ["N", 8])], g.inits)
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model)
    est = expected_logits(model)
    assert est.reason is None
    m1 = np.concatenate([np.zeros(2), BETA.astype(np.float64), np.zeros(2)])
    v1 = np.concatenate([np.zeros(2), _bn_var(), np.zeros(2)])
    m, v = clipped_gaussian_moments(m1 + beta2, np.sqrt(v1 + _bn_var(gamma2, np.ones(8), 1e-5)), 0.0, 6.0)
    np.testing.assert_allclose(est.mean, 2 * m, rtol=1e-9)
    np.testing.assert_allclose(est.var, 4 * v, rtol=1e-9)


def test_enorm_channel_slice_and_reshape():
    # BN(4) -> Slice(channels 1::2) -> Relu -> GAP -> Reshape[N, 2]
    g = GraphBuilder(6)
    h = g.node("Slice", [_bn(g, "x"), g.const(np.array([1]), "s"), g.const(np.array([4]), "e"),
                         g.const(np.array([1]), "a"), g.const(np.array([2]), "st")])
    h = g.node("GlobalAveragePool", [g.node("Relu", [h])])
    y = g.node("Reshape", [h, g.const(np.array([-1, 2]), "shape")])
    model = g.model(["N", 4, 5, 5], y)
    est = expected_logits(model)
    assert est.reason is None
    m, v = _rectified_mean_var(BETA[1::2].astype(np.float64), np.sqrt(_bn_var()[1::2]))
    np.testing.assert_allclose(est.mean, m, rtol=1e-9)
    np.testing.assert_allclose(est.var, v, rtol=1e-9)


@pytest.mark.parametrize("act,tail,word", [("Softsign", None, "Softsign"), ("Relu", "Softmax", "Softmax")])
def test_unsupported_op_makes_enorm_unavailable(act, tail, word):
    model, _, _ = bn_head_model(act=act, tail=tail)
    est = expected_logits(model)
    assert est.mean is None and est.E_norm is None and est.V_norm is None
    assert word in est.reason


def test_no_batchnorm_gives_reason_not_crash():
    g = GraphBuilder(4)
    h = g.node("Flatten", [g.node("GlobalAveragePool", [g.node("Relu", [g.conv("x", 3, 4)])])])
    model = g.model(["N", 3, 8, 8], g.gemm(h, 4, 5))
    report = analyze(model)
    assert report.E_norm is None and "graph input" in report.E_norm_reason
    assert report.verdict.startswith("unknown")
    assert all(math.isfinite(u) for u in report.U.values())
    json.dumps(report.to_dict())


# --------------------------------------------------------------------------- birthday


def _naive(K, n):
    return 1 - K * (1 - (1 - 1 / K) ** n) / n


def test_birthday_lemma_es_greater_than_em():
    n_out, n_in, m_plus = 64, 64, 100
    e_m = birthday_expectation(3 * 3 * n_in * m_plus, n_out)
    e_s = birthday_expectation(3 * 3 * m_plus, n_out)
    assert e_s > e_m > 0
    assert e_m == pytest.approx(_naive(3 * 3 * n_in * m_plus, n_out), rel=1e-6, abs=0)
    assert e_s == pytest.approx(_naive(900, 64), rel=1e-10)


def test_birthday_limits_and_stability():
    # K = 1: every draw is the same value -> 1 distinct among n: E = 1 - 1/n.
    assert birthday_expectation(1, 64) == pytest.approx(1 - 1 / 64)
    assert birthday_expectation(1e6, 1) == 0.0
    # K = 1e12: E ~ (n - 1)/(2K); the naive formula loses about half its digits.
    e = birthday_expectation(1e12, 64)
    assert e == pytest.approx(63 / 2e12, rel=1e-9, abs=0)
    assert birthday_expectation(1e300, 1000) == pytest.approx(999 / 2e300, rel=1e-9, abs=0)
    assert birthday_expectation(1e4, 500) == pytest.approx(_naive(1e4, 500), rel=1e-10)
    with pytest.raises(ValueError):
        birthday_expectation(0.5, 10)


def test_layer_birthday_uses_distinct_after():
    model = conv_bn_model()
    result = HashPass(CFG).run(model)
    conv = theory.layer_theory(model, result.layers, result.model)[0]
    mp = conv.distinct_after
    assert mp == next(h.distinct_after for h in result.layers if h.op_type == "Conv") < 576
    assert conv.E_m == pytest.approx(birthday_expectation(9 * 16 * mp, 4))
    assert conv.E_s == pytest.approx(birthday_expectation(9 * mp, 4))
    assert 0.0 <= conv.measured_merge <= 1.0 and 0.0 <= conv.measured_split <= 1.0


# --------------------------------------------------------------------------- report, verdict


def test_verdict_thresholds():
    assert verdict(HARMLESS_BELOW / 2).startswith("harmless")
    assert verdict(HARMLESS_BELOW) == "uncertain"
    assert verdict((HARMLESS_BELOW + HARMFUL_FROM) / 2) == "uncertain"
    assert verdict(HARMFUL_FROM) == "likely harmful"
    assert verdict(None) == "unknown"


def test_analyze_report_is_pure_and_serializable():
    model = conv_bn_model()
    before = model.SerializeToString()
    report = analyze(model, CFG)
    assert model.SerializeToString() == before
    d = json.loads(json.dumps(report.to_dict()))
    assert {"name", "op_type", "fan_in", "u_l", "bn_mu", "bn_sigma", "e_l", "E_m", "E_s"} <= set(d["layers"][0])
    m = d["model"]
    assert set(m["U"]) == {"magnitude", "paper"} and m["default_variant"] == "magnitude"
    assert m["U_default"] == m["U"]["magnitude"] > 0
    e = [r.e_l for r in report.layers]
    assert m["U"]["paper"] == pytest.approx(compose_bound(e, [r.gain["paper"] for r in report.layers])[0])
    assert m["E_norm"] > 0 and m["ratio"] == pytest.approx(m["U_default"] / m["E_norm"])
    assert m["verdict"] == verdict(m["ratio"]) and m["measured"] is None
    text = report.table()
    assert "E[norm]" in text and "verdict" in text and report.layers[0].name in text


def test_analyze_with_data_measures_logit_drift(tmp_path):
    model = conv_bn_model()
    rng = np.random.default_rng(9)
    x = rng.standard_normal((40, 16, 8, 8)).astype(np.float32)
    path = tmp_path / "raw.npz"
    np.savez(path, x=x, y=rng.integers(0, 50, 40))
    report = analyze(model, CFG, data=path, batch_size=16)
    hashed = HashPass(CFG).run(model).model
    f = redpp_onnx.session(model).run(None, {"x": x})[0].astype(np.float64)
    ft = redpp_onnx.session(hashed).run(None, {"x": x})[0].astype(np.float64)
    m = report.measured
    assert m.n == 40
    assert m.E_X_f == pytest.approx(np.linalg.norm(f, axis=1).mean(), rel=1e-5)
    assert m.E_X_diff == pytest.approx(np.linalg.norm(ft - f, axis=1).mean(), rel=1e-4)
    assert m.E_X_diff > 0
    for v, u in report.U.items():
        assert m.tightness[v] == pytest.approx((u - m.E_X_diff) / u)
    assert report.to_dict()["model"]["measured"]["E_X_diff"] == pytest.approx(m.E_X_diff)


@pytest.mark.slow
def test_resnet20_without_data():
    path = SHARED / "cifar10_resnet20.onnx"
    if not path.is_file():
        pytest.skip(f"{path} not found")
    report = analyze(path)
    assert len(report.layers) == 20
    assert all(math.isfinite(u) for u in report.U.values()) and report.U_default > 0
    assert report.E_norm is not None and report.E_norm > 0
    assert report.verdict in {"harmless (U/E[norm] << 1)", "uncertain", "likely harmful"}


@pytest.mark.parametrize("keepdims", [0, 1])
def test_enorm_through_reducemean_over_spatial_axes_equals_global_pool(keepdims):
    """torch's x.mean((2, 3)) exports as ReduceMean: the walk reads it as a global average pool."""
    reference = expected_logits(bn_head_model(hw=3)[0])
    g = GraphBuilder(1)
    h = g.node("Relu", [_bn(g, "x")])
    h = g.node("ReduceMean", [h], axes=[2, 3], keepdims=keepdims)
    if keepdims:
        h = g.node("Flatten", [h])
    w = (g.rng.standard_normal((3, 4))).astype(np.float32)
    y = g.node("Gemm", [h, g.const(w, "G"), g.const(np.array([0.1, -0.2, 0.3], np.float32), "GB")], transB=1)
    est = expected_logits(g.model(["N", 4, 3, 3], y))
    assert est.reason is None and est.E_norm == pytest.approx(reference.E_norm, rel=1e-12)
    g2 = GraphBuilder(1)
    h2 = g2.node("ReduceMean", [g2.node("Relu", [_bn(g2, "x")])], axes=[1, 2, 3], keepdims=0)
    y2 = g2.node("Mul", [h2, g2.const(np.float32(2.0))])
    assert "not exactly the spatial axes" in expected_logits(g2.model(["N", 4, 3, 3], y2)).reason


@pytest.mark.parametrize("act,attrs", [("Tanh", {}), ("Sigmoid", {}), ("Softplus", {}), ("Elu", {"alpha": 0.7}),
                                       ("LeakyRelu", {}), ("HardSigmoid", {}), ("HardSwish", {}), ("Relu", {})])
def test_input_stats_standard_matches_monte_carlo(act, attrs):
    """Inputs N(0, 1): a valid 3x3 Conv gives every output position exactly N(b, Σw²), the
    activation's moments come by quadrature, the spatial mean and the Gemm are linear: the
    walk's logit means must match the sampled ones (variances are upper bounds: positions are
    correlated)."""
    g = GraphBuilder(7)
    h = g.node("Conv", ["x", g.const(g.weights(6, 3, 3, 3), "W"), g.const(g.weights(6, scale=0.5), "B")],
               pads=[0, 0, 0, 0])
    h = g.node(act, [h], **attrs)
    h = g.node("ReduceMean", [h], axes=[2, 3], keepdims=0)
    y = g.gemm(h, 6, 3)
    model = g.model(["N", 3, 6, 6], y)
    assert "--input-stats standard" in expected_logits(model).reason
    est = expected_logits(model, input_stats="standard")
    assert est.reason is None and any("standardized" in a for a in est.approximations)
    n = 100_000
    x = np.random.default_rng(3).standard_normal((n, 3, 6, 6)).astype(np.float32)
    ys = redpp_onnx.session(model).run(None, {"x": x})[0].astype(np.float64)
    stderr = np.sqrt(ys.var(axis=0) / n)
    assert np.all(np.abs(ys.mean(axis=0) - est.mean) < 5 * stderr + 1e-4)
    assert np.all(est.var >= ys.var(axis=0) * 0.5)


def test_gelu_op_by_quadrature():
    g = GraphBuilder(8)
    h = g.node("Gelu", [g.gemm("x", 8, 16)])
    y = g.gemm(h, 16, 3)
    graph = onnx.helper.make_graph(g.nodes, "g", [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT,
                                                                                      ["N", 8])],
                                   [onnx.helper.make_tensor_value_info(y, onnx.TensorProto.FLOAT, ["N", 3])], g.inits)
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 20)], ir_version=10)
    est = expected_logits(model, input_stats="standard")
    n = 200_000
    x = np.random.default_rng(4).standard_normal((n, 8)).astype(np.float32)
    ys = redpp_onnx.session(model).run(None, {"x": x})[0].astype(np.float64)
    assert np.all(np.abs(ys.mean(axis=0) - est.mean) < 5 * np.sqrt(ys.var(axis=0) / n) + 1e-4)


def test_analyze_cli_with_input_stats_says_the_assumption(tmp_path, capsys):
    from redpp_onnx.cli import main

    g = GraphBuilder(9)
    y = g.gemm(g.node("Tanh", [g.gemm("x", 8, 16)]), 16, 3)
    path = tmp_path / "m.onnx"
    onnx.save(g.model(["N", 8], y), str(path))
    assert main(["analyze", str(path)]) == 0
    assert "verdict: unknown" in capsys.readouterr().out
    assert main(["analyze", str(path), "--input-stats", "standard"]) == 0
    out = capsys.readouterr().out
    assert "E[norm] assumes: input 'x' is standardized" in out and "verdict: unknown" not in out
