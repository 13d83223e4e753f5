"""Half-precision weights (issue 13, part): float16 / bfloat16 weights are hashed in float32 and
written back in their own type; the report counts the values that type keeps; every pass leaves
the model's element types as they were; onnxruntime runs the result in float16."""

from __future__ import annotations

import json
from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, numpy_helper

from redpp_onnx.analysis.layers import representable, scan_layers, tensor_like
from redpp_onnx.cli import main
from redpp_onnx.passes.split import SplitPass

DIGITS = Path(__file__).resolve().parents[1] / "models" / "digits_cnn.onnx"


def _to_fp16(model: onnx.ModelProto) -> onnx.ModelProto:
    """The digits CNN with every float tensor (initializers, inputs, outputs) in float16."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    for t in m.graph.initializer:
        if t.data_type == TensorProto.FLOAT:
            t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float16), t.name))
    for v in list(m.graph.input) + list(m.graph.output) + list(m.graph.value_info):
        if v.type.tensor_type.elem_type == TensorProto.FLOAT:
            v.type.tensor_type.elem_type = TensorProto.FLOAT16
    return m


@pytest.fixture(scope="module")
def fp16_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("fp16") / "digits16.onnx"
    onnx.save(_to_fp16(onnx.load(str(DIGITS))), str(path))
    return path


def _run(path_or_model, x):
    src = path_or_model if isinstance(path_or_model, (str, Path)) else path_or_model.SerializeToString()
    s = ort.InferenceSession(str(src) if isinstance(src, Path) else src, providers=["CPUExecutionProvider"])
    return s.run(None, {s.get_inputs()[0].name: x})[0]


def test_rounding_helpers_match_numpy():
    x = np.array([1.0, 1.0 + 2 ** -12, 3.14159, -65504.0, 1e-8], np.float32)
    assert np.array_equal(representable(x, TensorProto.FLOAT16), x.astype(np.float16).astype(np.float32))
    assert np.array_equal(representable(x, TensorProto.BFLOAT16), x.astype(ml_dtypes.bfloat16).astype(np.float32))
    assert np.array_equal(representable(x, TensorProto.FLOAT), x)
    for dt, npdt in ((TensorProto.FLOAT16, np.float16), (TensorProto.BFLOAT16, ml_dtypes.bfloat16)):
        proto = numpy_helper.from_array(np.zeros(5, npdt), "w")
        t = tensor_like(proto, x)
        assert t.data_type == dt and t.name == "w"
        assert np.array_equal(numpy_helper.to_array(t).astype(np.float32), representable(x, dt))


def test_half_precision_layers_are_eligible():
    m = onnx.load(str(DIGITS))
    n32 = len(scan_layers(m).layers)
    assert n32 == 4 and len(scan_layers(_to_fp16(m)).layers) == n32


def test_plain_compress_keeps_float16_and_counts_rounded_values(fp16_path, tmp_path):
    out, rep = tmp_path / "o.onnx", tmp_path / "r.json"
    assert main(["compress", str(fp16_path), "-o", str(out), "--plain", "--report", str(rep), "-q"]) == 0
    model = onnx.load(str(out))
    src = onnx.load(str(fp16_path))
    assert {t.data_type for t in model.graph.initializer} == {TensorProto.FLOAT16}
    assert model.graph.input[0].type.tensor_type.elem_type == TensorProto.FLOAT16
    report = json.loads(rep.read_text())
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    before = {t.name: numpy_helper.to_array(t) for t in src.graph.initializer}
    changed = 0
    for row in report["layers"]:
        if not row["eligible"]:
            continue
        w = inits[row["weight"]]
        assert w.dtype == np.float16
        # the report counts the values the file holds (after rounding to float16)
        # (counted in float32: numpy 2.4's np.unique over-counts some float16 arrays)
        assert row["distinct_after"] == np.unique(w.astype(np.float32)).size, row["name"]
        if not np.array_equal(w, before[row["weight"]]):
            changed += 1
    assert changed == report["model"]["changed_layers"] == 4
    # --plain: weights stored as float16 tensors, 16 bits each before and after
    assert report["model"]["weight_bits_before"] == 16.0
    assert abs(report["model"]["bits_per_eligible_weight"] - 16.0) < 0.5
    assert report["model"]["distinct_values_after"] < report["model"]["distinct_values_before"] // 10
    # onnxruntime runs it in float16, close to the float16 original (the budget is 0.1 relative L2)
    x = np.random.default_rng(0).random((64, 1, 8, 8)).astype(np.float16)
    y0, y1 = _run(fp16_path, x).astype(np.float64), _run(out, x).astype(np.float64)
    assert _run(out, x).dtype == np.float16
    rel = np.linalg.norm(y1 - y0) / np.linalg.norm(y0)
    assert rel < 0.2
    assert report["verify"]["inputs"]["input"]["dtype"] == "float16"  # verified in float16
    assert report["verify"]["outputs"][0]["cosine_min"] > 0.95


def test_float16_and_float32_choose_alike(fp16_path, tmp_path):
    """Hashing in float32 then rounding: the float16 model gets the float32 model's choices up
    to the rounding (same granularity per layer, value counts within a few)."""
    r16, r32 = tmp_path / "r16.json", tmp_path / "r32.json"
    assert main(["compress", str(fp16_path), "-o", str(tmp_path / "a.onnx"), "--report", str(r16), "-q"]) == 0
    assert main(["compress", str(DIGITS), "-o", str(tmp_path / "b.onnx"), "--report", str(r32), "-q"]) == 0
    a = [r for r in json.loads(r16.read_text())["layers"] if r["eligible"]]
    b = [r for r in json.loads(r32.read_text())["layers"] if r["eligible"]]
    assert [r["granularity"] for r in a] == [r["granularity"] for r in b]
    for x, y in zip(a, b):
        assert abs(x["distinct_after"] - y["distinct_after"]) <= max(6, y["distinct_after"] // 4), x["name"]


def test_target_macs_on_float16_keeps_the_types(fp16_path, tmp_path):
    out16, out32 = tmp_path / "a.onnx", tmp_path / "b.onnx"
    r16, r32 = tmp_path / "a.json", tmp_path / "b.json"
    assert main(["compress", str(fp16_path), "-o", str(out16), "--target-macs", "0.7", "--plain", "--report",
                 str(r16), "-q"]) == 0
    assert main(["compress", str(DIGITS), "-o", str(out32), "--target-macs", "0.7", "--report", str(r32), "-q"]) == 0
    m16 = onnx.load(str(out16))
    assert {t.data_type for t in m16.graph.initializer if t.data_type != TensorProto.INT64} == {TensorProto.FLOAT16}
    a, b = json.loads(r16.read_text())["model"], json.loads(r32.read_text())["model"]
    assert a["merge_channels_removed"] == b["merge_channels_removed"] > 0
    assert a["macs_after"] == b["macs_after"] < a["macs_before"]
    x = np.zeros((2, 1, 8, 8), np.float16)
    assert _run(out16, x).shape == (2, 10)


def test_split_keeps_float16_convs_with_the_reason(fp16_path):
    result = SplitPass().run(onnx.load(str(fp16_path)))
    convs = [r for r in result.layers if r.shape and len(r.shape) == 4]
    assert len(convs) == 3
    assert all(any("FLOAT16 weights" in s for s in r.reasons) for r in convs)
    assert sum(n.domain == "ai.redpp" for n in result.model.graph.node) == 0


@pytest.mark.parametrize("storage", ["standard", "compact"])
def test_float16_codebooks_decode_to_the_same_weights(fp16_path, tmp_path, storage):
    """Stored as codebooks decoded in float32 and cast to float16: the same outputs, bit for bit,
    as the plain float16 file, in plain onnxruntime and through redpp_onnx.session (the fast path:
    a warning would mean it fell back); the file is at least 1.8x smaller than the float16 input."""
    import warnings

    import redpp_onnx

    plain, small, rep = tmp_path / "p.onnx", tmp_path / "s.onnx", tmp_path / "r.json"
    assert main(["compress", str(fp16_path), "-o", str(plain), "--plain", "-q"]) == 0
    assert main(["compress", str(fp16_path), "-o", str(small), "--storage", storage, "--report", str(rep),
                 "-q"]) == 0
    report = json.loads(rep.read_text())
    rows = [r for r in report["layers"] if r["eligible"]]
    assert sum(any("then cast to FLOAT16" in x for x in r["reasons"] + r.get("hash_reasons", [])) for r in rows) == 4
    casts = [n for n in onnx.load(str(small)).graph.node if n.op_type == "Cast" and n.output[0] in
             {r["weight"] for r in rows}]
    assert len(casts) == 4 and all(n.attribute[0].i == TensorProto.FLOAT16 for n in casts)
    assert small.stat().st_size * 1.8 <= fp16_path.stat().st_size
    assert report["model"]["bits_per_eligible_weight"] < 8
    x = np.random.default_rng(1).random((16, 1, 8, 8)).astype(np.float16)
    want = _run(plain, x)
    if storage == "standard":
        assert np.array_equal(_run(small, x), want)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        s = redpp_onnx.session(str(small))
        got = s.run(None, {s.get_inputs()[0].name: x})[0]
    assert got.dtype == np.float16 and np.array_equal(got, want)
