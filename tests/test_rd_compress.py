"""Rate-distortion hashing as compress's default: the report, the knobs, the fallbacks, and the
stored weights equal to the hashed ones bit for bit in both runtimes."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper as nh

import redpp_onnx
from redpp_onnx.analysis.layers import ConstantTensors
from redpp_onnx.cli import main
from redpp_onnx.compress import compress
from redpp_onnx.config import CompressConfig, HashConfig
from redpp_onnx.errors import RedppError

from .graphs import GraphBuilder

ROOT = __import__("pathlib").Path(__file__).resolve().parents[1]
DIGITS = ROOT / "models" / "digits_cnn.onnx"
ZOO = ROOT / "tests" / "zoo"


def _weights(model: onnx.ModelProto, names) -> dict:
    consts = ConstantTensors(model)
    return {n: consts.array(n) for n in names}


def test_default_is_rate_distortion_with_its_report(tmp_path, capsys):
    out, rep = tmp_path / "o.onnx", tmp_path / "r.json"
    assert main(["compress", str(DIGITS), "-o", str(out), "--report", str(rep)]) == 0
    table = capsys.readouterr().out
    report = json.loads(rep.read_text())
    rows = [l for l in report["layers"] if l.get("eligible", True)]
    assert len(rows) == 4 and all(l["method"] == "rd" for l in rows)
    for l in rows:  # point 4: granularity, values kept, bits, sensitivity, error per layer
        assert l["granularity"] == "tensor" and l["codebooks"] == 1
        assert 2 <= l["distinct_after"] < l["distinct_before"]
        assert 0 < l["bits_per_weight"] < 12 and l["sensitivity"] > 0 and l["sensitivity_proxy"] == "synthetic"
        assert 0 < l["rel_error"] < 0.5 and 0 < l["predicted_error"] <= 0.1 + 1e-9
    rd = report["model"]["rd"]
    assert rd["budget"] == 0.1 and rd["effort"] == "fast" and rd["predicted_error"] <= 0.1 + 1e-9
    assert report["model"]["file_bytes_before"] / report["model"]["file_bytes_after"] > 3
    assert report["verify"]["max_rel_l2"] < 0.2  # predicted 0.09 on synthetic inputs, measured 0.06
    assert "codebooks  values bits/w sensitivity" in table and "file ratio" in table
    assert "rate-distortion hashing (fast)" in table


def test_budget_and_target_bits_move_the_trade():
    model = onnx.load(str(DIGITS))
    bits, errs = [], []
    for budget in (0.03, 0.1, 0.3):
        _, r = compress(model, CompressConfig(steps=("hash",), hash=HashConfig(budget=budget), verify=False))
        bits.append(r.model["rd"]["bits_per_weight"]["entropy"])
        errs.append(r.model["rd"]["predicted_error"])
        assert errs[-1] <= budget + 1e-9
    assert bits[0] > bits[1] > bits[2]
    _, r = compress(model, CompressConfig(steps=("hash",), hash=HashConfig(target_bits=4.0), verify=False))
    assert r.model["rd"]["bits_per_weight"]["entropy"] <= 4.0 and r.model["rd"]["target_bits"] == 4.0


@pytest.mark.parametrize("args, fragment", [
    (["--budget", "0.1", "--weight-error", "0.01"], "do not combine"),
    (["--target-bits", "3", "--uniform-int8"], "do not combine"),
    (["--budget", "0.1", "--target-bits", "3"], "one of --budget and --target-bits"),
    (["--budget", "0"], "--budget must be a positive number"),
    (["--target-bits", "-2"], "--target-bits must be a positive number"),
])
def test_conflicting_hash_options_are_user_errors(tmp_path, capsys, args, fragment):
    assert main(["compress", str(DIGITS), "-o", str(tmp_path / "o.onnx")] + args) == 2
    err = capsys.readouterr().err
    assert fragment in err and "Traceback" not in err
    assert not (tmp_path / "o.onnx").exists()


def test_weight_error_still_selects_the_per_layer_rule():
    _, r = compress(onnx.load(str(DIGITS)), CompressConfig(steps=("hash",), hash=HashConfig(weight_error=0.01),
                                                           verify=False))
    rows = [l for l in r.layers if l.get("eligible", True)]
    assert {l["method"] for l in rows} == {"kde", "unchanged"} and "rd" not in r.model
    assert all(l["rel_error"] <= 0.01 + 1e-6 for l in rows)


def test_a_model_with_token_inputs_is_measured_on_token_ids():
    """Token ids are drawn as the verification draws them (uniform over the embedding table's
    rows), so the synthetic measurement runs; the embedding table is hashed too."""
    path = ZOO / "encoder_ts.onnx"
    _, r = compress(onnx.load(str(path)), CompressConfig(steps=("hash",), verify=False))
    assert r.model["rd"]["proxy"] == "synthetic"
    assert not any("synthetic-input measurement cannot feed this model" in n for n in r.notes)
    assert {l["op_type"] for l in r.layers if l.get("eligible", True) and l["method"] == "rd"} >= {"Gather", "Gemm"}


def test_integers_of_unknown_use_fall_back_to_the_bn_proxy_and_say_so():
    """An integer input that indexes no table: no synthetic sample fits it."""
    from onnx import TensorProto

    g = GraphBuilder(3)
    y = g.gemm(g.node("Cast", ["x"], to=TensorProto.FLOAT), 16, 8)
    m = g.model(["N", 16], y, check=False)
    m.graph.input[0].type.tensor_type.elem_type = TensorProto.INT64
    onnx.checker.check_model(m)
    _, r = compress(m, CompressConfig(steps=("hash",), verify=False))
    assert r.model["rd"]["proxy"] == "bn"
    assert any("integers of unknown use" in n for n in r.notes)


def test_config_errors():
    with pytest.raises(RedppError, match="effort"):
        HashConfig(effort="slow")
    with pytest.raises(RedppError, match="do not combine"):
        HashConfig(method="rd", weight_error=0.01)
    assert HashConfig().method == "rd" and HashConfig(nms_radius=0.1).method == "kde"


def _two_conv_model(c: int = 64) -> onnx.ModelProto:
    """conv 3->c, BN, Relu, conv c->c (channel scales spread over two decades, so that per-group
    codebooks pay), BN, Relu, pool, Gemm."""
    g = GraphBuilder(5)
    h = g.node("Relu", [g.bn(g.conv("x", 3, c, bias=False), c)])
    h = g.node("Relu", [g.bn(g.conv(h, c, c, bias=False), c)])
    h = g.node("Flatten", [g.node("GlobalAveragePool", [h])])
    model = g.model(["N", 3, 8, 8], g.gemm(h, c, 10))
    w = model.graph.initializer[[t.name for t in model.graph.initializer].index(model.graph.node[3].input[1])]
    a = nh.to_array(w)
    scale = np.logspace(-1, 1, c).astype(np.float32)[np.random.default_rng(1).permutation(c)]
    w.CopyFrom(nh.from_array(a * scale[:, None, None, None], w.name))
    return model


@pytest.mark.parametrize("effort", ["fast", "thorough"])
def test_stored_weights_equal_the_hashed_ones_bit_for_bit(effort):
    """Point 3 for the rd output: the codebook file (standard-ops form in plain onnxruntime, and
    the C++ fast path) rebuilds exactly the weights of the --plain output (the hashed weights)."""
    model = _two_conv_model()
    assert model.graph.node[3].op_type == "Conv"
    cfg = CompressConfig(steps=("hash",), hash=HashConfig(effort=effort, budget=0.05), verify=False)
    plain, rp = compress(model, CompressConfig(**{**cfg.__dict__, "codebook": False}))
    packed, rc = compress(model, cfg)
    assert rc.model["codebook_layers"] == rp.model["changed_layers"] >= 2
    names = [l["weight"] for l in rp.layers if l.get("method") == "rd"]
    want = _weights(plain, names)
    x = np.random.default_rng(0).standard_normal((2, 3, 8, 8)).astype(np.float32)
    # the fast path decodes the map; plain onnxruntime folds the standard-ops decoders
    from redpp_onnx import storage

    got = storage.materialize(packed)
    assert all(np.array_equal(_weights(got, [n])[n].view(np.uint32), want[n].view(np.uint32)) for n in names)
    ref = ort.InferenceSession(plain.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    y1 = ort.InferenceSession(packed.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    y2 = redpp_onnx.session(packed).run(None, {"x": x})[0]
    assert np.array_equal(ref, y1) and np.array_equal(ref, y2)
    grans = {l["granularity"] for l in rp.layers if l.get("method") == "rd"}
    if effort == "thorough":  # the spread channel scales make a per-group choice pay: stored with its map
        assert any(g.startswith("groups of") or g == "channel" for g in grans)
        assert rc.model["storage"].get("grouped_tensors", 0) >= 1
    else:
        assert grans == {"tensor"}


def test_progress_covers_the_sensitivity_and_the_codebooks():
    seen = []
    compress(onnx.load(str(DIGITS)), CompressConfig(steps=("hash",), verify=False),
             progress=lambda i, n, item: seen.append((i, n, item)))
    items = [x for x in seen if x[2].startswith(("sensitivity", "codebooks"))]
    assert [i for i, n, _ in items] == list(range(8)) and {n for _, n, _ in items} == {8}  # 4 layers, twice
    assert items[0][2].startswith("sensitivity") and items[-1][2].startswith("codebooks")
