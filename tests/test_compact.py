"""The compact storage form (``--storage compact``, ``redpp_onnx/compact.py``, ``csrc/rans.h``):
the rANS coder round-trips every histogram and length bit for bit and costs what its model says;
the form decodes to exactly the stored tensors, in onnxruntime too; a damaged or edited file is
refused with a reason, never decoded to other weights."""

from __future__ import annotations

import hashlib
import json
import struct
import zlib

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import redpp_onnx
from redpp_onnx import _core, compact, storage
from redpp_onnx.cli import main
from redpp_onnx.compress import compress
from redpp_onnx.config import CompressConfig, HashConfig
from redpp_onnx.passes import codebook as cb
from redpp_onnx.runtime import CompactError

from .graphs import GraphBuilder
from .passes.test_codebook import _hashed_like, _per_channel, _tensors


# --------------------------------------------------------------------------- the coder

def _code(symbols, hists, channel_model, outer, inner):
    """Encode with models normalized from ``hists``; returns (stream, freqs, starts, S)."""
    s = compact.scale_bits(max(h.size for h in hists))
    freqs = [compact.normalize(h, s) for h in hists]
    flat = np.concatenate(freqs).astype(np.uint32)
    starts = np.concatenate([[0], np.cumsum([f.size for f in freqs])]).astype(np.int64)
    channels = channel_model.size
    stream = _core.rans_encode(symbols.astype(np.uint16), flat, starts, s, outer, channels, inner,
                               channel_model.astype(np.int32))
    return stream, flat, starts, s


def _decode(stream, flat, starts, s, outer, channel_model, inner, table, limits):
    channels = channel_model.size
    out = np.empty(outer * channels * inner, np.float32)
    got = _core.rans_decode(stream, flat, starts, s, outer, channels, inner, channel_model.astype(np.int32), out,
                            table, np.zeros(channels, np.int32), limits.astype(np.int32))
    return out, got


CASES = [  # (alphabet, weights, kind)
    (1, 1000, "normal"), (2, 17, "normal"), (40, 0, "normal"), (40, 1, "normal"), (40, 100_003, "normal"),
    (300, 50_000, "uniform"), (65536, 200_000, "uniform"), (5, 100_000, "skewed"), (4096, 30_000, "normal"),
]


@pytest.mark.parametrize("alphabet,n,kind", CASES)
def test_rans_round_trip_and_cost(alphabet, n, kind):
    rng = np.random.default_rng(alphabet + n)
    if kind == "normal":
        symbols = _hashed_like(rng, n, alphabet)
    elif kind == "uniform":
        symbols = rng.integers(0, alphabet, n)
    else:  # one symbol nearly always: its code is a small fraction of a bit
        symbols = np.where(rng.random(n) < 1e-4, rng.integers(1, alphabet, n), 0)
    hist = np.bincount(symbols, minlength=alphabet)
    if not hist.any():
        hist[0] = 1  # an empty tensor still has a model
    stream, flat, starts, s = _code(symbols, [hist], np.zeros(1), 1, n)
    table = np.arange(alphabet, dtype=np.float32)
    out, got = _decode(stream, flat, starts, s, 1, np.zeros(1), n, table, np.array([alphabet]))
    assert np.array_equal(out, symbols.astype(np.float32))
    assert got == cb.checksum(out)
    ideal = compact._coded_bits(hist, flat.astype(np.int64), s)  # the model's own cost
    assert stream.size % 4 == 0 and stream.size >= 8
    assert 8 * stream.size <= ideal + 64 + 32 + 1e-3 * n, (8 * stream.size, ideal)
    entropy = cb._entropy_bits(hist) if n else 0.0
    assert ideal <= entropy * (1 + 1e-3) + 1e-3 * n + 1  # the normalized model loses < 0.001 bit a weight


def test_rans_models_per_channel_round_trip():
    """outer x channels x inner, a model per channel (two channels share one): each symbol is
    coded with its channel's model, the cost is the sum of the per-model costs."""
    rng = np.random.default_rng(5)
    outer, channels, inner = 3, 4, 257
    channel_model = np.array([0, 1, 2, 1])
    sizes = [6, 50, 3]
    sym = np.empty((outer, channels, inner), np.int64)
    for c in range(channels):
        sym[:, c] = _hashed_like(rng, outer * inner, sizes[channel_model[c]]).reshape(outer, inner)
    hists = [np.bincount(sym[:, channel_model == m].ravel(), minlength=sizes[m]) for m in range(3)]
    stream, flat, starts, s = _code(sym.ravel(), hists, channel_model, outer, inner)
    table = np.arange(100, dtype=np.float32)
    out, _ = _decode(stream, flat, starts, s, outer, channel_model, inner, table, np.full(channels, 50))
    assert np.array_equal(out, sym.ravel().astype(np.float32))
    # a symbol coded with the wrong model would not round trip: the models differ in size
    with pytest.raises(ValueError, match="outside its model"):
        _code(sym.ravel(), hists, np.array([0, 0, 0, 0]), outer, inner)


def test_rans_refuses_bad_input_and_damaged_streams():
    rng = np.random.default_rng(6)
    n, m = 20_000, 30
    symbols = _hashed_like(rng, n, m)
    hist = np.bincount(symbols, minlength=m)
    stream, flat, starts, s = _code(symbols, [hist], np.zeros(1), 1, n)
    table = np.arange(m, dtype=np.float32)
    args = dict(flat=flat, starts=starts, s=s, outer=1, channel_model=np.zeros(1), inner=n, table=table,
                limits=np.array([m]))
    reference = cb.checksum(symbols.astype(np.float32))
    # damaged streams: never a crash, never silently other weights (the checksum tells)
    damaged = [stream[:-4], stream[:8], np.concatenate([stream, stream[:4]]), stream[:6]]
    for k in rng.choice(stream.size, 40, replace=False):
        d = stream.copy()
        d[k] ^= np.uint8(1 << int(rng.integers(8)))
        damaged.append(d)
    refused = 0
    for d in damaged:
        try:
            _, got = _decode(d, **args)
        except ValueError:
            refused += 1
            continue
        assert got != reference
    assert refused >= len(damaged) - 4
    # a rank beyond its channel's codebook, models that do not sum to 2^S, symbols of frequency 0
    with pytest.raises(ValueError, match="outside its channel's codebook"):
        _decode(stream, **{**args, "limits": np.array([3])})
    bad = flat.copy()
    bad[0] += 1
    with pytest.raises(ValueError, match="do not sum"):
        _decode(stream, **{**args, "flat": bad})
    zero = compact.normalize(np.bincount(symbols[symbols != 0], minlength=m), s).astype(np.uint32)
    with pytest.raises(ValueError, match="frequency 0"):
        _core.rans_encode(symbols.astype(np.uint16), zero, starts, s, 1, 1, n, np.zeros(1, np.int32))
    with pytest.raises(ValueError, match="model is not in the table"):
        _core.rans_encode(symbols.astype(np.uint16), flat, starts, s, 1, 1, n, np.ones(1, np.int32))
    with pytest.raises(ValueError, match="scale_bits"):
        _core.rans_encode(symbols.astype(np.uint16), flat, starts, 40, 1, 1, n, np.zeros(1, np.int32))


def test_normalize_keeps_every_symbol_and_the_total():
    rng = np.random.default_rng(7)
    for _ in range(50):
        m = int(rng.integers(1, 3000))
        hist = rng.integers(0, 5, m) * (rng.random(m) < 0.5)
        hist[int(rng.integers(m))] += int(rng.integers(1, 10 ** 6))
        s = compact.scale_bits(m)
        f = compact.normalize(hist, s)
        assert f.sum() == 1 << s and np.all((f > 0) == (hist > 0))


# --------------------------------------------------------------------------- the storage form

def _model_of(tensors, form):
    """A graph whose outputs are x * W for every tensor W (x: a scalar input), stored in ``form``."""
    graph = helper.make_graph([], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [])], [])
    for t in tensors:
        y = f"y_{t.name}"
        graph.node.append(helper.make_node("Mul", [t.name, "x"], [y]))
        graph.output.append(helper.make_tensor_value_info(y, TensorProto.FLOAT, list(t.shape)))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    if form == "compact":
        bits = compact.write(model, tensors)
    else:
        bits = {k: v[0] for k, v in cb.write_codebooks(model, tensors, 17).items()}
    onnx.checker.check_model(model)
    return model, bits


def _all_forms(rng):
    unit = float(np.float32(1e-3))
    units = np.float32(rng.uniform(1e-4, 1e-2, 24))
    odd = rng.standard_normal(9).astype(np.float32)
    odd[0], odd[1] = -0.0, np.float32(np.inf)
    odd[2] = np.frombuffer(np.uint32(0x7FC01234).tobytes(), np.float32)[0]  # a NaN with a payload
    tensors = [cb.tensor_codes("a", _per_channel(rng, (16, 8, 3, 3), 7), unit, coder="rans"),
               cb.tensor_codes("b", _per_channel(rng, (40, 24), 4, axis=1), unit, coder="rans"),
               cb.tensor_codes("c", _per_channel(rng, (24, 50), 6, units=units), units.astype(np.float64),
                               coder="rans"),
               cb.tensor_codes("d", np.repeat(_per_channel(rng, (4, 60), 9), 8, axis=0), None, coder="rans"),
               cb.tensor_codes("e", _per_channel(rng, (12, 30), 5), unit, channel_groups=np.arange(12) % 3,
                               coder="rans", forms=("map",)),
               cb.tensor_codes("odd", odd[_hashed_like(rng, 999, 9)].reshape(27, 37), None, coder="rans"),
               cb.tensor_codes("one", np.full((5, 7), 0.25, np.float32), unit, coder="rans")]
    return tensors + _tensors(rng)[:3]


def test_compact_form_decodes_every_form_bit_for_bit_in_onnxruntime(tmp_path):
    rng = np.random.default_rng(8)
    tensors = _all_forms(rng)
    forms = {t.name: t.form for t in tensors}
    assert forms["a"] == forms["c"] == forms["d"] == "groups" and forms["e"] == "groups"
    assert tensors[4].groups.channel_map is not None and tensors[2].groups.units is not None
    model, bits = _model_of(tensors, "compact")
    assert sum(n.op_type == compact.OP_TYPE and n.domain == "ai.redpp" for n in model.graph.node) == len(tensors)
    assert not {t.name for t in tensors} & {i.name for i in model.graph.initializer}
    plain = storage.materialize(model)
    got = {i.name: numpy_helper.to_array(i) for i in plain.graph.initializer}
    for t in tensors:
        assert np.array_equal(got[t.name].view(np.uint32), t.values().view(np.uint32)), t.name
    assert not any(n.domain == "ai.redpp" for n in plain.graph.node)
    assert [p.key for p in plain.metadata_props] == []
    path = tmp_path / "c.onnx"
    path.write_bytes(model.SerializeToString())
    sess = redpp_onnx.session(path)
    assert sess.redpp_load.form == "decoded" and sess.redpp_load.weights == sum(t.codes.size for t in tensors)
    x = np.float32(1.5)
    for t, y in zip(tensors, sess.run(None, {"x": np.array(x)})):
        assert np.array_equal((t.values() * x).view(np.uint32), y.view(np.uint32)), t.name
    info = storage.describe(model)
    assert info["form"] == "compact" and info["fast_path"] == "ok" and info["tensors"] == len(tensors)
    assert "cannot load it" in info["load"]["onnxruntime"]


def test_compact_form_is_smaller_than_the_standard_ops_form():
    rng = np.random.default_rng(9)
    tensors = _tensors(rng)
    standard, _ = _model_of(tensors, "standard")
    small, bits = _model_of(tensors, "compact")
    assert small.ByteSize() < 0.95 * standard.ByteSize()
    for t in tensors:  # the stream's cost is within 0.01 bit a weight (+ 96 bits) of the entropy + models
        hist = cb.rank_histogram(t.codes, t.n_ranks)
        _, _, _, planned = compact.plan_models(t)
        assert bits[t.name] * t.codes.size <= planned + 96 + 0.01 * t.codes.size
        assert planned <= cb._entropy_bits(hist) + compact.MODEL_ENTRY_BITS * hist.size + 0.002 * t.codes.size


def test_models_per_group_when_the_groups_differ():
    rng = np.random.default_rng(10)
    a = np.where(rng.random((8, 4000)) < 0.9, 0, rng.integers(1, 16, (8, 4000)))  # peaked
    b = rng.integers(0, 16, (8, 4000))  # flat
    values = (np.concatenate([a, b]) * np.float32(1e-3)).astype(np.float32)
    t = cb.tensor_codes("w", values, float(np.float32(1e-3)), forms=("groups",), coder="rans")
    models, freqs, _, _ = compact.plan_models(t)
    assert t.groups is not None and models == "groups" and len(freqs) == t.groups.n_groups
    alike = cb.tensor_codes("w", (rng.integers(0, 16, (16, 4000)) * np.float32(1e-3)).astype(np.float32),
                            float(np.float32(1e-3)), coder="rans")
    assert compact.plan_models(alike)[0] == "tensor"


# --------------------------------------------------------------------------- damaged files

def _blob(model):
    name = json.loads(compact.metadata(model))["blob"]
    return next(i for i in model.graph.initializer if i.name == name)


def _with_blob(model, data: bytes, digest: bool):
    """``model`` with another blob; ``digest``: with that blob's digest (a writer that wrote it so),
    else the old one (the blob damaged after writing)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    _blob(out).CopyFrom(numpy_helper.from_array(np.frombuffer(data, np.uint8).copy(), _blob(out).name))
    if digest:
        meta = json.loads(compact.metadata(out))
        compact.set_metadata(out, json.dumps({**meta, "sha256": hashlib.sha256(data).hexdigest()}))
    return out


def test_damaged_or_edited_compact_files_are_refused(tmp_path):
    rng = np.random.default_rng(11)
    model, _ = _model_of(_tensors(rng)[:3], "compact")
    raw = numpy_helper.to_array(_blob(model)).tobytes()
    (h,) = struct.unpack_from("<I", raw, 4)
    (k,) = struct.unpack_from("<I", raw, 8 + h)
    header = json.loads(zlib.decompress(raw[8:8 + h]))

    def rezip(hdr):
        zh = zlib.compress(json.dumps(hdr).encode())
        return raw[:4] + struct.pack("<I", len(zh)) + zh + raw[8 + h:]

    checks = {"magic": b"XXXX" + raw[4:], "truncated": raw[: len(raw) // 2], "header zlib": raw[:10] + b"\0" + raw[11:],
              "tables zlib": raw[:12 + h + 2] + b"\0\0" + raw[12 + h + 4:],
              "stream byte": raw[:-9] + bytes([raw[-9] ^ 0x10]) + raw[-8:],
              "stream cut": raw[:-4]}
    first = next(iter(header["tensors"]))
    edited = json.loads(json.dumps(header))
    edited["tensors"][first]["checksum"] = "0" * 32
    checks["checksum"] = rezip(edited)
    edited = json.loads(json.dumps(header))
    edited["tensors"][first]["models"] = "groups"
    checks["models"] = rezip(edited)
    edited = json.loads(json.dumps(header))
    edited["tables"][0][1] += 1
    checks["tables"] = rezip(edited)
    for what, data in checks.items():
        for digest in (False, True):  # damaged after writing (the digest tells), or written so
            bad = _with_blob(model, data, digest)
            with pytest.raises(storage.StorageError, match=None if digest else "SHA-256"):
                storage.decode(bad)
            with pytest.raises(CompactError, match="cannot be decoded"):
                redpp_onnx.session(bad)
            assert storage.describe(bad)["fast_path"].startswith("refused"), what
    edited = json.loads(json.dumps(header))  # a shape edited after writing: only the digest tells
    edited["tensors"][first]["shape"] = [1] + edited["tensors"][first]["shape"]
    with pytest.raises(storage.StorageError, match="SHA-256"):
        storage.decode(_with_blob(model, rezip(edited), False))
    # the graph: a Decode node removed or pointed elsewhere, the metadata of another version
    gone = onnx.ModelProto()
    gone.CopyFrom(model)
    del gone.graph.node[0]
    with pytest.raises(storage.StorageError, match="Decode nodes"):
        storage.decode(gone)
    other = onnx.ModelProto()
    other.CopyFrom(model)
    compact.set_metadata(other, json.dumps({"version": 2, "blob": _blob(model).name}))
    with pytest.raises(storage.StorageError, match="malformed"):
        storage.decode(other)
    assert np.array_equal(raw, numpy_helper.to_array(_blob(model)).tobytes())  # nothing changed the model
    del k


# --------------------------------------------------------------------------- compress, expand

def _graph():
    g = GraphBuilder(3)
    h = g.node("Relu", [g.bn(g.conv("x", 8, 32, bias=False), 32)])
    h = g.node("Relu", [g.conv(h, 32, 48)])
    y = g.gemm(g.node("Flatten", [g.node("GlobalAveragePool", [h])]), 48, 30, trans_b=False)
    return g.model(["N", 8, 10, 10], y)


def test_compress_compact_equals_standard_and_expand_writes_the_plain_model(tmp_path):
    model = _graph()
    hash_cfg = HashConfig(weight_error=0.02)
    outs = {}
    for form in ("standard", "compact"):
        out, report = compress(model, CompressConfig(steps=("hash",), hash=hash_cfg, storage=form, verify=False))
        assert report.model["codebook_layers"] == 3
        assert report.model["storage"]["form"] == ("compact" if form == "compact" else "standard-ops + map")
        path = tmp_path / f"{form}.onnx"
        path.write_bytes(out.SerializeToString())
        outs[form] = path
    assert outs["compact"].stat().st_size < outs["standard"].stat().st_size
    x = np.random.default_rng(0).standard_normal((2, 8, 10, 10)).astype(np.float32)
    run = lambda p: redpp_onnx.session(p).run(None, {"x": x})[0]  # noqa: E731
    reference = run(outs["standard"])
    assert np.array_equal(run(outs["compact"]), reference)
    assert main(["expand", str(outs["compact"]), "-o", str(tmp_path / "plain.onnx")]) == 0
    import onnxruntime as ort

    plain = ort.InferenceSession(str(tmp_path / "plain.onnx"), providers=["CPUExecutionProvider"])
    assert np.array_equal(plain.run(None, {"x": x})[0], reference)
    assert main(["expand", str(outs["standard"]), "-o", str(tmp_path / "plain2.onnx")]) == 0
    assert main(["expand", str(tmp_path / "plain.onnx"), "-o", str(tmp_path / "again.onnx")]) == 2
    assert not (tmp_path / "again.onnx").exists()
    assert main(["expand", str(outs["compact"]), "-o", str(tmp_path / "plain.onnx")]) == 2  # exists: --force


def test_cli_storage_compact(tmp_path, capsys):
    src = tmp_path / "m.onnx"
    src.write_bytes(_graph().SerializeToString())
    out, report = tmp_path / "o.onnx", tmp_path / "r.json"
    assert main(["compress", str(src), "-o", str(out), "--storage", "compact", "--report", str(report), "-q",
                 "--steps", "hash"]) == 0
    r = json.loads(report.read_text())
    assert r["model"]["storage"]["form"] == "compact" and r["config"]["storage"] == "compact"
    assert any("compact" in n for n in r["notes"])
    assert main(["compress", str(src), "-o", str(tmp_path / "p.onnx"), "--storage", "compact", "--plain"]) == 2
    assert "excludes --plain" in capsys.readouterr().err
    assert not (tmp_path / "p.onnx").exists()
