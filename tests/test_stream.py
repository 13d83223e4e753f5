"""The streaming path of ``compress`` (redpp_onnx/stream.py): models larger than memory allows."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from redpp_onnx import stream
from redpp_onnx.analysis.layers import representable
from redpp_onnx.cli import main
from redpp_onnx.hashing import hash_tensor

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_large import build_gpt  # noqa: E402

DIGITS = ROOT / "models" / "digits_cnn.onnx"


@pytest.fixture(scope="module")
def gpt(tmp_path_factory) -> Path:
    """A tiny GPT-style decoder in float16 with external data (the benchmark's builder)."""
    path = tmp_path_factory.mktemp("gpt") / "gpt.onnx"
    build_gpt(path, layers=2, dim=64, heads=4, vocab=500, seq=16)
    return path


def tensors(path: Path) -> dict:
    """Initializers and Constant nodes' values, by name."""
    model = onnx.load(str(path))
    out = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    out.update({n.output[0]: numpy_helper.to_array(a.t) for n in model.graph.node if n.op_type == "Constant"
                for a in n.attribute if a.name == "value" and a.type == onnx.AttributeProto.TENSOR})
    return out


def same_tensors(a: Path, b: Path) -> None:
    ta, tb = tensors(a), tensors(b)
    assert set(ta) == set(tb)
    for name in ta:
        assert ta[name].dtype == tb[name].dtype and ta[name].shape == tb[name].shape, name
        assert ta[name].tobytes() == tb[name].tobytes(), name


def digest(*paths: Path) -> str:
    h = hashlib.sha256()
    for p in paths:
        h.update(p.read_bytes())
    return h.hexdigest()


def run(*args) -> int:
    return main(["compress", *map(str, args), "-q"])


ZOO = ROOT / "tests" / "zoo"


@pytest.mark.parametrize("source", ["gpt", "digits"] + sorted(p.name for p in ZOO.glob("*.onnx")))
def test_streaming_gives_the_in_memory_per_layer_tensors(source, gpt, tmp_path):
    """The same tensors, bit for bit, as the in-memory path with the same per-layer rule (the bytes of
    the files differ: the streaming path lays the external data out itself, each tensor aligned
    to 64 bytes, and always writes external data, also for an input without). The small models of
    tests/zoo too (both torch exporters: Constant nodes, external data, tied weights, LSTM...)."""
    src = {"gpt": gpt, "digits": DIGITS}.get(source, ZOO / source)
    assert run(src, "-o", tmp_path / "s.onnx", "--stream", "--workers", "1") == 0
    assert run(src, "-o", tmp_path / "m.onnx", "--weight-error", "0.01", "--steps", "hash", "--plain",
               "--no-verify") == 0
    same_tensors(tmp_path / "s.onnx", tmp_path / "m.onnx")
    assert (tmp_path / "s.onnx.data").stat().st_size > 0
    changed = tensors(tmp_path / "s.onnx")
    original = tensors(src)
    assert sum(not np.array_equal(changed[k], original[k]) for k in original) >= 1  # weights were hashed


def test_streamed_model_runs_in_onnxruntime(gpt, tmp_path):
    import onnxruntime as ort

    assert run(gpt, "-o", tmp_path / "s.onnx", "--stream", "--workers", "1") == 0
    ids = np.random.default_rng(0).integers(0, 500, (1, 16))
    y = ort.InferenceSession(str(tmp_path / "s.onnx")).run(None, {"ids": ids})[0].astype(np.float32)
    y0 = ort.InferenceSession(str(gpt)).run(None, {"ids": ids})[0].astype(np.float32)
    assert 0 < np.linalg.norm(y - y0) / np.linalg.norm(y0) < 0.1


def test_workers_give_the_same_bytes(gpt, tmp_path):
    assert run(gpt, "-o", tmp_path / "one.onnx", "--stream", "--workers", "1") == 0
    assert run(gpt, "-o", tmp_path / "two.onnx", "--stream", "--workers", "2") == 0
    assert digest(tmp_path / "one.onnx.data") == digest(tmp_path / "two.onnx.data")
    one = (tmp_path / "one.onnx").read_bytes().replace(b"one.onnx.data", b"X")
    assert one == (tmp_path / "two.onnx").read_bytes().replace(b"two.onnx.data", b"X")


@pytest.mark.parametrize("workers", ["1", "2"])
def test_no_partial_output_on_error(gpt, tmp_path, workers, capsys):
    """External data cut short: one-line error, nothing written (no model, no data, no staging folder)."""
    bad = tmp_path / "in"
    bad.mkdir()
    model = onnx.load(str(gpt), load_external_data=False)
    onnx.save(model, str(bad / "gpt.onnx"))
    data = Path(str(gpt) + ".data").read_bytes()
    (bad / "gpt.onnx.data").write_bytes(data[: len(data) * 2 // 3])
    out = tmp_path / "out"
    out.mkdir()
    assert run(bad / "gpt.onnx", "-o", out / "o.onnx", "--stream", "--workers", workers) == 2
    err = capsys.readouterr().err
    assert "truncated" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert list(out.iterdir()) == []


def test_size_limit_falls_back_and_says_why(gpt, tmp_path):
    rep = tmp_path / "r.json"
    assert run(gpt, "-o", tmp_path / "o.onnx", "--memory-limit", "1M", "--report", rep) == 0
    report = json.loads(rep.read_text())
    reason = report["model"]["stream"]["reason"]
    assert "--memory-limit" in reason and "30x" in reason
    assert any("rate-distortion hashing (the default) needs onnxruntime runs" in n for n in report["notes"])
    assert reason in report["verify"]["skipped"] and report["verify"]["layerwise"]["max_output_rel_l2"] > 0
    assert all(l["method"] in ("kde", "unchanged") for l in report["layers"] if l.get("eligible", True))
    # within the limit: the in-memory path (rate-distortion hashing, whole-model verification)
    assert run(gpt, "-o", tmp_path / "m.onnx", "--memory-limit", "100G", "--report", rep, "--force",
               "--no-verify") == 0
    report = json.loads(rep.read_text())
    assert "stream" not in report["model"] and report["model"].get("rd")


def test_options_of_the_in_memory_path_are_refused_with_the_reason(gpt, tmp_path, capsys):
    assert run(gpt, "-o", tmp_path / "o.onnx", "--memory-limit", "1M", "--budget", "0.05") == 2
    err = capsys.readouterr().err
    assert "--budget needs the in-memory path" in err and "--memory-limit" in err
    assert not (tmp_path / "o.onnx").exists()


def test_stream_reason_rule():
    assert stream.stream_reason(100, memory_limit=3000) is None
    assert stream.stream_reason(101, memory_limit=3000) is not None
    assert "--stream" in stream.stream_reason(1, forced=True)
    assert stream.parse_size("1.5G") == int(1.5 * (1 << 30)) and stream.parse_size("500M") == 500 << 20
    with pytest.raises(Exception):
        stream.parse_size("lots")


@pytest.mark.parametrize("dtype", [onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16])
def test_hash_array_matches_hash_tensor(dtype):
    from redpp_onnx.analysis.layers import np_dtype

    rng = np.random.default_rng(3)
    w = (rng.laplace(0, 0.02, (96, 80)).astype(np.float32)).astype(np_dtype(dtype))
    w.flat[5] = -0.0  # -0 and +0: one value, as np.unique of float32 sees them
    w.flat[6] = 0.0
    hashed, stats = stream.hash_array(w, dtype, {"eps": 0.01})
    ref = hash_tensor(w.astype(np.float32), weight_error=0.01)
    assert hashed.dtype == w.dtype
    np.testing.assert_array_equal(hashed.astype(np.float32), representable(ref.hashed, dtype))
    assert stats["distinct_before"] == ref.distinct_before
    assert stats["rel_error"] == pytest.approx(ref.rel_error, rel=1e-9)


@pytest.mark.parametrize("op,trans_b,shape", [("MatMul", False, (3000, 1500)), ("Gemm", True, (1500, 3000)),
                                             ("Conv", False, (64, 32, 3, 3))])
def test_layer_check_in_blocks_is_the_layer_output_error(op, trans_b, shape, monkeypatch):
    rng = np.random.default_rng(0)
    w = rng.standard_normal(shape).astype(np.float32)
    h = w + 0.01 * rng.standard_normal(shape).astype(np.float32)
    monkeypatch.setattr(stream, "CHECK_BLOCK", 1 << 16)  # many blocks
    sampled = stream.layer_check(w, h, {"op_type": op, "trans_b": trans_b}, 1)
    monkeypatch.setattr(stream, "CHECK_OUTPUTS", 1 << 20)  # every output
    got = stream.layer_check(w, h, {"op_type": op, "trans_b": trans_b}, 1)
    m = w.reshape(shape[0], -1)
    d = h.reshape(m.shape) - m
    x = np.random.default_rng(1).standard_normal((stream.CHECK_ROWS, m.shape[0] if op == "MatMul" else m.shape[1]),
                                                 dtype=np.float32)
    ref, diff = (x @ m, x @ d) if op == "MatMul" else (x @ m.T, x @ d.T)
    assert got == pytest.approx(np.linalg.norm(diff) / np.linalg.norm(ref), rel=1e-5)
    assert sampled == pytest.approx(got, rel=0.1)  # 1,024 of the outputs: close


def test_16_bit_helpers_match_numpy(monkeypatch):
    bits = np.random.default_rng(2).integers(0, 1 << 16, 1_000_003).astype(np.uint16)
    lut = np.random.default_rng(3).integers(0, 1 << 16, 1 << 16).astype(np.uint16)
    assert stream._core16() is not None
    native = stream._histogram16(bits), stream._lookup16(lut, bits)
    monkeypatch.setattr(stream, "_core16", lambda: None)
    monkeypatch.setattr(stream, "INDEX_BLOCK", 1 << 16)
    np.testing.assert_array_equal(native[0], stream._histogram16(bits))
    np.testing.assert_array_equal(native[0], np.bincount(bits, minlength=1 << 16))
    np.testing.assert_array_equal(native[1], stream._lookup16(lut, bits))
    np.testing.assert_array_equal(native[1], lut[bits])


def test_a_weight_with_nan_is_left_as_it_is_with_the_reason(gpt, tmp_path):
    bad = tmp_path / "in"
    bad.mkdir()
    model = onnx.load(str(gpt))
    table = next(t for t in model.graph.initializer if t.name.startswith("wte"))
    values = numpy_helper.to_array(table).copy()
    values[3, :5] = np.nan
    table.CopyFrom(numpy_helper.from_array(values, table.name))
    onnx.save(model, str(bad / "gpt.onnx"), save_as_external_data=True, location="gpt.onnx.data")
    rep = tmp_path / "r.json"
    assert run(bad / "gpt.onnx", "-o", tmp_path / "o.onnx", "--stream", "--workers", "1", "--report", rep) == 0
    row = next(l for l in json.loads(rep.read_text())["layers"] if l["weight"] == table.name)
    assert row["method"] == "unchanged" and "5 NaN/Inf" in row["reasons"][0]
    np.testing.assert_array_equal(tensors(tmp_path / "o.onnx")[table.name], values)
