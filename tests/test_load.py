"""Loading --codebook models (``redpp_onnx/storage.py``, ``redpp_onnx.session``): the fast path
gives the outputs of the standard-ops form and of the plain hashed model bit for bit; a model
without the map loads as before; a map that does not match the model (damaged, edited, or a
graph edited after writing) is refused with a warning and the standard-ops form is loaded:
never a wrong result."""

from __future__ import annotations

import functools
import json
import warnings

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import redpp_onnx
from redpp_onnx import storage
from redpp_onnx.compress import compress
from redpp_onnx.config import CompressConfig, HashConfig
from redpp_onnx.passes import codebook as cb
from redpp_onnx.runtime import CodebookWarning, DecodedSession

from .graphs import GraphBuilder

X = np.random.default_rng(0).standard_normal((3, 8, 10, 10)).astype(np.float32)


def _graph(seed=0):
    g = GraphBuilder(seed)
    h = g.node("Relu", [g.bn(g.conv("x", 8, 32, bias=False), 32)])
    h = g.node("Relu", [g.conv(h, 32, 48)])
    y = g.gemm(g.node("Flatten", [g.node("GlobalAveragePool", [h])]), 48, 30, trans_b=False)  # (K, N) weight
    return g.model(["N", 8, 10, 10], y)


@functools.lru_cache(maxsize=None)
def _models():
    """``(hashed, packed)``: the plainly hashed model and its --codebook form (serialized)."""
    model = _graph()
    cfg = CompressConfig(steps=("hash",), hash=HashConfig(weight_error=0.02), verify=False, codebook=False)
    hashed, _ = compress(model, cfg)
    packed, report = compress(model, CompressConfig(steps=("hash",), hash=cfg.hash, codebook=True, verify=False))
    assert report.model["codebook_layers"] == 3
    assert json.loads(storage.metadata(packed))["banks"][0]["suffix"] is not None  # the damages below need one
    return hashed.SerializeToString(), packed.SerializeToString()


def _model(which) -> onnx.ModelProto:
    return onnx.ModelProto.FromString(_models()[which])


def _run(sess):
    return sess.run(None, {"x": X})[0]


def _quiet_session(model, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning at all
        return redpp_onnx.session(model, **kw)


def test_fast_path_equals_the_standard_ops_form_and_the_plain_hashed_model(tmp_path):
    hashed, packed = _model(0), _model(1)
    assert storage.metadata(hashed) is None and storage.metadata(packed) is not None
    path = tmp_path / "packed.onnx"
    path.write_bytes(packed.SerializeToString())
    reference = _run(_quiet_session(hashed))
    standard = redpp_onnx.session(packed, decode_codebooks=False)
    assert standard.redpp_load.form == "onnxruntime" and standard.redpp_load.reason is None
    assert np.array_equal(_run(standard), reference)
    for source in (packed, packed.SerializeToString(), str(path), path):  # ModelProto, bytes, str, PathLike
        sess = _quiet_session(source)
        assert isinstance(sess, DecodedSession)
        assert sess.redpp_load.form == "decoded" and sess.redpp_load.weights == sum(
            int(np.prod(t.dims)) for t in hashed.graph.initializer if len(t.dims) > 1)
        assert np.array_equal(_run(sess), reference)
    assert _model(1) == packed  # the model given is not changed


def test_a_model_without_the_map_loads_as_before(tmp_path):
    """A plain model (and an old --codebook file without the map) goes to onnxruntime as is."""
    hashed, packed = _model(0), _model(1)
    old = onnx.ModelProto()
    old.CopyFrom(packed)
    cb.set_metadata(old, None)
    for model in (hashed, old, hashed.SerializeToString()):
        sess = _quiet_session(model)
        assert type(sess).__name__ == "InferenceSession" and sess.redpp_load.form == "onnxruntime"
        assert sess.redpp_load.reason is None
        assert np.array_equal(_run(sess), _run(_quiet_session(_model(0))))
    assert storage.describe(old) == {"form": "standard-ops"}
    assert storage.describe(hashed) == {"form": "plain"}


def test_a_map_whose_decoders_were_folded_by_a_tool_is_ignored_quietly():
    """A tool that folds the decoders into initializers and keeps the metadata (e.g. the
    analyses' constant folding) leaves a stale map: the model loads as it is, no warning."""
    folded = storage.materialize(_model(1))
    folded.metadata_props.add(key=cb.METADATA_KEY, value=storage.metadata(_model(1)))
    sess = _quiet_session(folded)
    assert sess.redpp_load.form == "onnxruntime" and "folded" in sess.redpp_load.reason
    assert np.array_equal(_run(sess), _run(_quiet_session(_model(0))))


def test_the_map_keeps_other_metadata_and_the_decoded_graph_has_no_decoder():
    packed = _model(1)
    packed.metadata_props.add(key="author", value="me")
    decoded = storage.decode(packed)
    assert [(p.key, p.value) for p in decoded.model.metadata_props] == [("author", "me")]
    ops = {n.op_type for n in decoded.model.graph.node}
    assert ops == {n.op_type for n in _model(0).graph.node}  # the hashed model's nodes, no decoder
    assert {t.name for t in decoded.model.graph.initializer} == {t.name for t in _model(0).graph.initializer}
    placeholders = [t for t in decoded.model.graph.initializer if t.name in decoded.weights]
    assert all(t.data_location == onnx.TensorProto.EXTERNAL for t in placeholders)
    info = storage.describe(packed)
    assert info["form"] == "standard-ops + map" and info["fast_path"] == "ok" and info["tensors"] == 3


def test_materialize_gives_the_plain_hashed_weights():
    plain = storage.materialize(_model(1))
    hashed = {t.name: numpy_helper.to_array(t) for t in _model(0).graph.initializer}
    got = {t.name: numpy_helper.to_array(t) for t in plain.graph.initializer}
    assert got.keys() == hashed.keys()
    for name, value in hashed.items():
        assert np.array_equal(got[name].view(np.uint32) if got[name].dtype == np.float32 else got[name],
                              value.view(np.uint32) if value.dtype == np.float32 else value), name
    onnx.checker.check_model(plain)


def test_set_providers_decodes_again():
    sess = _quiet_session(_model(1))
    before = _run(sess)
    sess.set_providers(["CPUExecutionProvider"])
    assert np.array_equal(_run(sess), before) and sess.redpp_load.form == "decoded"


# --------------------------------------------------------------------------- refused maps

def _meta(model):
    return json.loads(storage.metadata(model))


def _with_meta(meta, resign=False, model=None):
    """The --codebook model with the map ``meta`` (``resign``: its digest recomputed, as a map
    written wrongly but consistently would have)."""
    m = model if model is not None else _model(1)
    if resign:  # over the decoder of the map as written
        nodes, _ = storage._decoder_nodes(m.graph, list(_meta(m)["tensors"]))
        meta["digest"] = cb.decoder_digest([m.graph.node[k] for k in nodes],
                                           {t.name: t for t in m.graph.initializer}, meta)
    cb.set_metadata(m, json.dumps(meta))
    return m


def _first(meta):
    return next(iter(meta["tensors"].values()))


def _last(meta):
    return list(meta["tensors"].values())[-1]


def _edit(path, value):
    def edit(meta):
        entry = meta
        for key in path[:-1]:
            entry = entry(meta) if callable(entry) else entry
            entry = key(entry) if callable(key) else entry[key]
        entry[path[-1]] = value(entry[path[-1]]) if callable(value) else value
        return meta
    return edit


CORRUPT = {
    # (edit of the map, whether the digest is recomputed): every one is refused
    "not JSON": (None, False),
    "another version": (_edit(("version",), 2), False),
    "a checksum digit": (lambda m: _edit((_first, "checksum"), lambda c: c[:-1] + ("0" if c[-1] != "0" else "1"))(m),
                         False),
    "a bank start": (lambda m: _edit((_last, "start"), lambda s: s + 1)(m), False),
    "a shape": (lambda m: _edit((_first, "shape"), lambda s: s[::-1])(m), False),
    "a unit": (lambda m: _edit((_first, "book", "unit"), lambda u: float(float.fromhex(u) * 2).hex())(m), False),
    "no digest": (lambda m: {k: v for k, v in m.items() if k != "digest"}, False),
    "a tensor left out": (lambda m: dict(m, tensors=dict(list(m["tensors"].items())[1:])), False),
    # written wrongly but consistently (digest recomputed): the checks after the digest catch it
    "signed: a bank start": (lambda m: _edit((_last, "start"), lambda s: s + 1)(m), True),
    "signed: a book offset": (lambda m: _edit((_first, "book", "offset"), lambda s: s + 1)(m), True),
    "signed: a unit": (lambda m: _edit((_first, "book", "unit"), lambda u: float(float.fromhex(u) * 2).hex())(m), True),
    "signed: a shape": (lambda m: _edit((_first, "shape"), lambda s: s[::-1])(m), True),
    "signed: class widths": (lambda m: _edit(("banks", 0, "classes"), lambda c: [min(o + 1, 16) for o in c])(m), True),
    "signed: a class width of 40 bits": (lambda m: _edit(("banks", 0, "classes"), lambda c: [40] + c[1:])(m), True),
    "signed: a class field width": (lambda m: _edit(("banks", 0, "width"), lambda w: 1 if w != 1 else 2)(m), True),
    "signed: a bank count": (lambda m: _edit(("banks", 0, "count"), lambda n: n + 8)(m), True),
    "signed: a weight the decoder does not give": (lambda m: dict(m, tensors=dict(
        m["tensors"], **{"x": _first(m)})), True),
    "signed: a stream that is not the decoder's": (lambda m: _edit(("banks", 0, "main"), "x")(m), True),
    "signed: a book of another type": (lambda m: _edit((_first, "book", "init"), m["banks"][0]["main"])(m), True),
    "signed: a checksum": (lambda m: _edit((_first, "checksum"), "0" * 32)(m), True),
}


@pytest.mark.parametrize("case", sorted(CORRUPT))
def test_a_damaged_map_falls_back_to_the_standard_ops_form_with_a_warning(case):
    edit, resign = CORRUPT[case]
    if edit is None:
        bad = _model(1)
        cb.set_metadata(bad, "{not json")
    else:
        bad = _with_meta(edit(_meta(_model(1))), resign)
    with pytest.raises(storage.StorageError):
        storage.decode(bad)
    with pytest.warns(CodebookWarning, match="map was refused"):
        sess = redpp_onnx.session(bad)
    assert sess.redpp_load.form == "onnxruntime" and sess.redpp_load.reason
    assert np.array_equal(_run(sess), _run(_quiet_session(_model(0))))
    info = storage.describe(bad)
    assert info["fast_path"].startswith("refused")


def test_a_graph_edited_after_writing_is_refused_and_its_own_function_kept():
    """An edit of the decoder (here the unit constant of one codebook doubled) changes what the
    standard-ops form computes; the map no longer describes it: refused, and the session runs
    the edited graph as onnxruntime would."""
    m = _model(1)
    meta = _meta(m)
    entry = _first(meta)
    nodes, consts = storage._decoder_nodes(m.graph, list(meta["tensors"]))
    unit = np.float32(float.fromhex(entry["book"]["unit"]))
    for t in m.graph.initializer:
        if t.name in consts and t.data_type == onnx.TensorProto.FLOAT and list(t.dims) == [] \
                and numpy_helper.to_array(t) == unit:
            t.CopyFrom(numpy_helper.from_array(np.float32(unit * 2), t.name))
            break
    else:
        pytest.fail("no unit constant")
    with pytest.warns(CodebookWarning, match="digest"):
        sess = redpp_onnx.session(m)
    assert np.array_equal(_run(sess), _run(redpp_onnx.session(m, decode_codebooks=False)))
    assert not np.array_equal(_run(sess), _run(_quiet_session(_model(0))))


def test_a_decoder_output_used_elsewhere_is_refused():
    m = _model(1)
    meta = _meta(m)
    nodes, _ = storage._decoder_nodes(m.graph, list(meta["tensors"]))
    inner = m.graph.node[nodes[0]].output[0]
    m.graph.output.append(helper.make_tensor_value_info(inner, onnx.TensorProto.INT32, None))
    with pytest.raises(storage.StorageError, match="also used elsewhere"):
        storage.decode(m)


def test_peek_reads_the_map_without_parsing_and_ignores_broken_files(tmp_path):
    packed = _model(1).SerializeToString()
    text = storage.metadata(_model(1))
    path = tmp_path / "m.onnx"
    path.write_bytes(packed)
    assert storage.peek_metadata(path) == text == storage.peek_metadata(packed)
    assert storage.peek_metadata(_models()[0]) is None
    for broken in (packed[:-7], packed[:100], b"\xff" * 50, b""):
        assert storage.peek_metadata(broken) is None or broken == b""
    assert storage.peek_metadata(tmp_path / "missing.onnx") is None
    path.write_bytes(packed[:-7])  # truncated: onnxruntime says so, as before
    with pytest.raises(redpp_onnx.runtime.ORT_ERRORS):
        redpp_onnx.session(path)


# --------------------------------------------------------------------------- per-channel storage end to end

def test_per_channel_codebooks_through_both_forms():
    """Weights hashed per output channel (each channel its own values on its own grid): stored
    with one codebook per channel, both forms give the plain model's outputs bit for bit."""
    rng = np.random.default_rng(5)
    plain = _graph(1)
    inits = {t.name: t for t in plain.graph.initializer}
    weights = [t.name for t in plain.graph.initializer if len(t.dims) > 1]
    tensors = []
    for name in weights:
        w = numpy_helper.to_array(inits[name])
        axis = 0 if w.ndim == 4 else 1  # Conv (out first), Gemm without transB (out last)
        units = np.float32(np.abs(w).max(axis=tuple(k for k in range(w.ndim) if k != axis)) / 7)
        shape = [1] * w.ndim
        shape[axis] = -1
        k = np.clip(np.rint(w / units.reshape(shape)), -7, 7) + 0.0  # (no -0.0: it is not on a lattice)
        q = k.astype(np.float32) * units.reshape(shape)
        inits[name].CopyFrom(numpy_helper.from_array(q.astype(np.float32), name))
        tensors.append(cb.tensor_codes(name, q, units.astype(np.float64), unit_axis=axis))
    assert all(t.form == "groups" and t.groups.units is not None for t in tensors)
    assert [t.groups.axis for t in tensors] == [0, 0, 1]
    packed = onnx.ModelProto()
    packed.CopyFrom(plain)
    keep = [t for t in packed.graph.initializer if t.name not in weights]
    del packed.graph.initializer[:]
    packed.graph.initializer.extend(keep)
    cb.write_codebooks(packed, tensors, 17)
    onnx.checker.check_model(packed, full_check=True)
    assert packed.ByteSize() < plain.ByteSize() / 3
    reference = _run(_quiet_session(plain))
    fast = _quiet_session(packed)
    assert fast.redpp_load.form == "decoded"
    assert np.array_equal(_run(fast), reference)
    assert np.array_equal(_run(redpp_onnx.session(packed, decode_codebooks=False)), reference)


def test_the_hash_pass_drops_the_map_when_it_keeps_weights_plain():
    """Tiny layers: the decoder would cost more than the codes save, the weights stay plain and
    no map is written."""
    g = GraphBuilder(3)
    y = g.gemm(g.node("Flatten", [g.node("GlobalAveragePool", [g.conv("x", 4, 3)])]), 3, 5)
    model = g.model(["N", 4, 6, 6], y)
    packed, report = compress(model, CompressConfig(steps=("hash",), codebook=True, verify=False))
    assert report.model["codebook_layers"] == 0 and storage.metadata(packed) is None


def test_decode_bank_never_reads_outside_its_arrays():
    from redpp_onnx import _core

    table = np.arange(4, dtype=np.float32)
    out = np.empty(16, np.float32)
    job = (0, out, table, 1, 1, 16, np.zeros(1, np.int32), None)
    main = np.full(16, 9, np.uint8)  # direct 8-bit codes past the 4-value table
    with pytest.raises(ValueError, match="outside"):
        _core.decode_bank(main, 8, [], None, 16, [job])
    with pytest.raises(ValueError, match="fewer than"):
        _core.decode_bank(main[:8], 8, [], None, 16, [job])
    with pytest.raises(ValueError, match="suffix stream has"):  # class widths that do not fit the stream
        _core.decode_bank(np.zeros(8, np.uint8), 1, [16, 16], np.zeros(3, np.uint8), 16,
                          [(0, out, np.zeros(1 << 17, np.float32), 1, 1, 16, np.zeros(1, np.int32), None)])
    with pytest.raises(ValueError, match="bank order"):
        _core.decode_bank(main, 8, [], None, 16, [job, job])
