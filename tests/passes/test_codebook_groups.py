"""--codebook storage of tensors hashed per group of channels that are not consecutive
(``redpp_onnx/hashing/rd.py``: channels sorted by RMS and cut into groups of 2^k): one codebook
per group and a channel -> group map (``codebook.Groups.channel_map``), rebuilt by the
standard-ops decoders and by the fast path (``storage.decode``) bit for bit, chosen by its exact
stored bits, and refused (standard-ops form, with a warning) when the map is damaged."""

from __future__ import annotations

import functools
import json
import warnings

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import redpp_onnx
from redpp_onnx import storage
from redpp_onnx.hashing import hash_tensor
from redpp_onnx.hashing.kde import grid_step
from redpp_onnx.passes import codebook as cb
from redpp_onnx.passes.hash import HashPassResult, LayerHash, store_codebooks
from redpp_onnx.runtime import CodebookWarning

from ..graphs import GraphBuilder
from .test_codebook_random import NEWEST, _bank_model, _mapped_tensor, _run_cases, _session


def _bits(t: cb.TensorCodes) -> int:
    """What ``tensor_codes`` counts: the codes under their own best layout plus the tables."""
    return cb.plan_layout(cb.rank_histogram(t.codes, t.n_ranks))[0] + t.table_bits()


def _same(a, b) -> bool:
    a, b = np.ascontiguousarray(a, np.float32).reshape(-1), np.ascontiguousarray(b, np.float32).reshape(-1)
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


# --------------------------------------------------------------------------- the map itself

def test_group_ids_are_numbered_by_their_first_channel_and_runs_need_no_map():
    size, m = cb._canonical_map(np.array([7, 3, 7, 3, 9, 9]), 6)
    assert size == 2 and m.tolist() == [0, 1, 0, 1, 2, 2]
    assert cb._canonical_map(np.array([5, 5, 5, 2, 2, 2, 8]), 7) == (3, None)  # runs, the last shorter
    assert cb._canonical_map(np.array([4, 1, 0, 2]), 4) == (1, None)  # one channel a group, any ids
    assert cb._canonical_map(np.zeros(5, np.int64), 5) == (5, None)
    assert cb._canonical_map(np.array([0.0, 1.0, 0.0]), 3)[1].tolist() == [0, 1, 0]  # integral floats
    size, m = cb._canonical_map(np.array([0, 0, 1, 1, 1]), 5)  # not runs of the first group's size
    assert size == 3 and m.tolist() == [0, 0, 1, 1, 1]
    for bad in (np.zeros(4, np.int64), np.zeros((5, 1), np.int64), np.array([0.5, 0, 0, 0, 0])):
        with pytest.raises(ValueError):
            cb._canonical_map(bad, 5)
    with pytest.raises(ValueError, match="channel_groups"):
        cb.tensor_codes("w", np.ones((4, 3), np.float32), None, channel_groups=[0, 1, 0])


def test_the_map_is_counted_in_the_side_bits_as_it_is_stored():
    rng = np.random.default_rng(1)
    for channels, size, dtype in ((40, 4, np.uint8), (1024, 4, np.uint8), (1026, 4, np.uint16)):
        order = rng.permutation(channels)
        ids = np.empty(channels, np.int64)
        ids[order] = np.arange(channels) // size
        values = np.float32(rng.integers(-3, 4, (2, channels))) * np.float32(0.25)
        t = cb.tensor_codes("w", values, 0.25, forms=("map",), unit_axis=1, channel_groups=ids)
        g = t.groups
        assert g.channel_map is not None and g.n_groups == -(-channels // size) and g.map_dtype is dtype
        plain = cb.Groups(g.axis, g.outer, g.channels, g.inner, g.size, g.counts, g.units)
        assert g.side_bits() - plain.side_bits() == channels * 8 * np.dtype(dtype).itemsize
        model = helper.make_model(helper.make_graph([], "g", [], []), opset_imports=[helper.make_opsetid("", 17)])
        cb.write_codebooks(model, [t], 17)
        name = json.loads(storage.metadata(model))["tensors"]["w"]["groups"]["map"]
        stored = next(x for x in model.graph.initializer if x.name == name)
        assert stored.data_type == helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
        assert len(stored.raw_data) * 8 == channels * 8 * np.dtype(dtype).itemsize


def test_without_channel_groups_nothing_changes():
    """A grouping of runs of channels is stored as the consecutive form it is, without a map:
    the same tensor codes as without ``channel_groups`` (ids of any numbering)."""
    rng = np.random.default_rng(2)
    for shape, axis, size in (((64, 32, 3, 3), 0, 4), ((200, 48), 1, 1), ((48, 400), 0, 8), ((30, 300), 0, 8)):
        channels = shape[axis]
        ids = np.arange(channels) // size
        units = np.float32(rng.uniform(1e-4, 1e-2, ids[-1] + 1))
        moved = np.empty((channels,) + tuple(d for k, d in enumerate(shape) if k != axis), np.float32)
        for g in range(ids[-1] + 1):
            k = rng.permutation(np.arange(-500, 500))[:9].astype(np.float32)
            block = moved[ids == g]
            moved[ids == g] = (k * units[g])[np.minimum(rng.geometric(0.3, block.shape) - 1, 8)]
        values = np.moveaxis(moved, 0, axis)
        hint = units[ids].astype(np.float64)
        plain = cb.tensor_codes("w", values, hint, unit_axis=axis)
        mapped = cb.tensor_codes("w", values, hint, unit_axis=axis, channel_groups=ids * 7 + 3)
        assert (plain.groups.axis, plain.groups.size, plain.groups.channel_map) == (axis, size, None), shape
        assert (mapped.groups.axis, mapped.groups.size, mapped.groups.channel_map) == (axis, size, None), shape
        assert np.array_equal(plain.codes, mapped.codes) and _same(plain.codebook, mapped.codebook)
        assert np.array_equal(plain.lattice, mapped.lattice) and _bits(plain) == _bits(mapped)
        assert _same(mapped.values(), values)


def test_the_map_decoder_costs_what_the_choice_counts():
    """The map form's decoder nodes and small constants (its tables aside: counted in
    ``side_bits``) add ``GROUP_GRAPH_BITS`` to those of one codebook, within 40 %."""
    rng = np.random.default_rng(4)
    for kind in ("units", "lattice", "float"):
        t, _ = _mapped_tensor(rng, "layer3.0.conv2.weight", (64, 32, 3, 3), 0, 4, 12, kind)
        assert t.groups.channel_map is not None
        b = cb._Builder(helper.make_graph([], "g", [], []), 17)
        meta = cb._gather_groups(b, t, "book", "part", t.name, "units" if t.groups.units is not None else None)
        extra = sum(n.ByteSize() + 3 for n in b.nodes) + sum(
            x.ByteSize() + 3 for x in b.inits if x.name not in (meta["counts"], meta["units"], meta["map"]))
        plain = cb._Builder(helper.make_graph([], "g", [], []), 17)
        plain.op("Reshape", [plain.op("Gather", ["book", "part"], axis=0), plain.init(np.asarray(t.shape, np.int64))],
                 [t.name])
        extra -= sum(n.ByteSize() + 3 for n in plain.nodes) + sum(x.ByteSize() + 3 for x in plain.inits)
        assert 0.6 * cb.GROUP_GRAPH_BITS / 8 <= extra <= 1.4 * cb.GROUP_GRAPH_BITS / 8, (kind, extra)


# --------------------------------------------------------------------------- exactness, randomized

@functools.lru_cache(maxsize=None)
def _cases():
    """``(label, [(TensorCodes, values), ...])``: Conv weights [O, I, kh, kw] (axis 0) and MatMul
    weights [in, out] (axis 1), channel counts from 2 to 700, groups of 1-64 channels (the last
    maybe shorter) in any order, a unit per group, one unit, float32 tables, one to thousands of
    values per group; forced to the map form or chosen by size, alone or two to a bank."""
    rng = np.random.default_rng(40)
    cases = []
    kinds = ("units", "lattice", "float", "channel units")
    hists = ("uniform", "geometric", "dominant", "zipf", "hashed", "exact")
    specs = [((64, 16, 3, 3), 0, 16, 30, "units", "permutation", "hashed"),
             ((96, 128), 1, 32, 25, "units", "interleaved", "hashed"),
             ((8, 6, 1, 1), 0, 4, 1, "float", "permutation", "uniform"),  # one value a group
             ((2, 3), 1, 2, 2, "lattice", "permutation", "dominant"),
             ((5, 700), 1, 2, 4, "units", "permutation", "zipf"),  # 350 groups: uint16 map
             ((12, 4000), 0, 4, 3000, "units", "interleaved", "zipf"),  # thousands of values a group
             ((37, 10, 3, 3), 0, 8, 40, "channel units", "permutation", "geometric"),
             ((130, 3), 0, 64, 17, "float", "permutation", "exact")]
    for i in range(24):
        axis = int(rng.integers(2))
        channels = int(rng.integers(2, 90))
        shape = (channels, int(rng.integers(1, 24))) + ((3, 3) if rng.random() < 0.5 else ())
        if axis == 1:
            shape = (int(rng.integers(1, 60)), channels)
        size = int(rng.choice([1, 2, 4, 8, 16, 32]))
        m = int(rng.choice([1, 2, 3, int(rng.integers(4, 80))]))
        specs.append((shape, axis, size, m, str(rng.choice(kinds)), str(rng.choice(["permutation", "interleaved"])),
                      str(rng.choice(hists))))
    for i, spec in enumerate(specs):
        forms = ("map",) if i % 3 else ("tensor", "groups")
        bank = [_mapped_tensor(rng, "w", *spec, forms=forms)]
        if i % 4 == 1:  # a second tensor in the bank
            bank.append(_mapped_tensor(rng, "v", *specs[(i * 7) % len(specs)]))
        cases.append((f"case {i}: shape={spec[0]} axis={spec[1]} size={spec[2]} m={spec[3]} {spec[4]} {spec[5]} "
                      f"{spec[6]} {forms}", bank))
    return cases


def test_the_random_cases_use_maps_of_every_kind():
    kinds = set()
    for label, bank in _cases():
        for t, values in bank:
            assert _same(t.values(), values), label  # the numpy mirror
            g = t.groups
            if g is not None and g.channel_map is not None:
                kinds.add((g.axis, t.lattice is None, g.units is not None, np.dtype(g.map_dtype).name))
    assert {(0, True, False, "uint8"), (1, True, False, "uint8"), (0, False, True, "uint8"),
            (1, False, True, "uint8"), (1, False, True, "uint16")} <= kinds
    assert any(not lat and not units for _, lat, units, _ in kinds)  # one unit for all groups


@functools.lru_cache(maxsize=None)
def _models(opset):
    return [_bank_model(bank, opset)[0] for _, bank in _cases()]


@pytest.mark.parametrize("opset", [11, 13, NEWEST])
def test_standard_ops_decoders_rebuild_every_case_bit_for_bit(opset):
    cases = _cases()
    outs = _run_cases([m.graph for m in _models(11 if opset < 13 else 13)], [c[0] for c in cases], opset)
    for (label, bank), ys in zip(cases, outs):
        for (t, values), y in zip(bank, ys):
            assert y.shape == t.shape and _same(y, values), f"{label}: {t.name}"


@pytest.mark.parametrize("opset", [11, 13])
def test_fast_path_rebuilds_every_case_bit_for_bit(opset):
    for (label, bank), model in zip(_cases(), _models(opset)):
        decoded = storage.decode(model)
        for t, values in bank:
            assert _same(decoded.weights[t.name], values), f"{label}: {t.name}"
        m = onnx.ModelProto()
        m.CopyFrom(model)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            sess = redpp_onnx.session(m)
        assert sess.redpp_load.form == "decoded", label
        for (t, values), y in zip(bank, sess.run(None, {})):
            assert _same(y, values), f"{label}: {t.name}"
    for (label, bank), model in list(zip(_cases(), _models(opset)))[:4]:
        info = storage.describe(model)
        assert info["fast_path"] == "ok", label
        assert info["mapped_tensors"] == sum(t.groups is not None and t.groups.channel_map is not None
                                             for t, _ in bank), label


# --------------------------------------------------------------------------- the choice

def _two_scales(rng, shape=(64, 32, 3, 3), axis=0):
    """Channels alternating between two very different scales, each scale's channels hashed on its
    own grid; the RMS-sorted grouping (two groups of interleaved channels) and its unit hint."""
    channels = shape[axis]
    moved = np.empty((channels,) + tuple(d for k, d in enumerate(shape) if k != axis), np.float32)
    units = np.float32([0.0173, 0.000291])
    ids = np.arange(channels) % 2
    for c in range(channels):
        spread = (6, 40)[ids[c]]
        k = np.clip(np.rint(rng.standard_normal(moved[c].shape) * spread), -200, 200) + 0.0
        moved[c] = k.astype(np.float32) * units[ids[c]]
    rms = np.sqrt(np.mean(moved.astype(np.float64).reshape(channels, -1) ** 2, axis=1))
    order = np.argsort(rms, kind="stable")  # as rd.py cuts them: sorted by RMS, groups of 2^k
    groups = np.empty(channels, np.int64)
    groups[order] = np.arange(channels) // (channels // 2)
    return np.moveaxis(moved, 0, axis), groups, units[ids].astype(np.float64)


@pytest.mark.parametrize("shape, axis", [((64, 32, 3, 3), 0), ((288, 64), 1)])
def test_the_rms_sorted_grouping_is_chosen_when_it_takes_fewer_bits(shape, axis):
    values, groups, hint = _two_scales(np.random.default_rng(3), shape, axis)
    assert not np.array_equal(groups, np.arange(shape[axis]) // (shape[axis] // 2))  # not runs
    t = cb.tensor_codes("w", values, hint, unit_axis=axis, channel_groups=groups)
    g = t.groups
    assert g is not None and g.channel_map is not None and g.n_groups == 2 and g.units is not None
    assert np.array_equal(g.channel_map, (groups != groups[0]).astype(np.int64))  # numbered from channel 0
    assert _same(t.values(), values)
    without = cb.tensor_codes("w", values, hint, unit_axis=axis)  # the best of one codebook and runs
    consecutive = cb.tensor_codes("w", values, hint, unit_axis=axis, forms=("groups",))
    assert _bits(t) < _bits(without) and _bits(t) < _bits(consecutive)
    assert _bits(t) < 0.95 * min(_bits(without), _bits(consecutive))
    sizes = []  # in the real file too
    for x in (t, without):
        model = helper.make_model(helper.make_graph([], "g", [], []), opset_imports=[helper.make_opsetid("", 17)])
        cb.write_codebooks(model, [x], 17)
        sizes.append(model.ByteSize())
    assert sizes[0] < sizes[1]
    # a tie or a loss keeps the consecutive or per-tensor forms
    same = cb.tensor_codes("w", values, hint, unit_axis=axis, channel_groups=np.zeros(shape[axis], np.int64))
    assert _bits(same) == _bits(without) and (same.groups is None or same.groups.channel_map is None)


# --------------------------------------------------------------------------- a damaged map

def _packed(channels=48, inner=20, seed=5):
    rng = np.random.default_rng(seed)
    t, values = _mapped_tensor(rng, "w", (channels, inner), 0, 4, 6, "units", "permutation")
    model, _ = _bank_model([(t, values)], 17)
    assert t.groups.channel_map is not None
    return model, values


def _meta(model):
    return json.loads(storage.metadata(model))


def _map_init(model):
    name = _meta(model)["tensors"]["w"]["groups"]["map"]
    return next(x for x in model.graph.initializer if x.name == name)


def _resign(model, meta):
    """``model`` with the map ``meta`` and its digest recomputed (written wrongly but consistently)."""
    nodes, _ = storage._decoder_nodes(model.graph, list(meta["tensors"]))
    meta["digest"] = cb.decoder_digest([model.graph.node[k] for k in nodes],
                                       {t.name: t for t in model.graph.initializer}, meta)
    cb.set_metadata(model, json.dumps(meta))
    return model


def _refused(model, match=None):
    with pytest.raises(storage.StorageError, match=match):
        storage.decode(model)
    with pytest.warns(CodebookWarning, match="map was refused"):
        sess = redpp_onnx.session(model)
    assert sess.redpp_load.form == "onnxruntime"
    return sess.run(None, {})[0]


def _set_map(model, ids):
    init = _map_init(model)
    init.CopyFrom(numpy_helper.from_array(np.asarray(ids), init.name))


def test_a_damaged_map_falls_back_to_the_standard_ops_form_with_a_warning():
    model, values = _packed()
    ids = numpy_helper.to_array(_map_init(model)).copy()
    # the map's entry in the JSON points elsewhere or is gone: the standard-ops form is intact
    for edit in (lambda g: g.update(map=None), lambda g: g.update(map=g["counts"]), lambda g: g.pop("map")):
        bad = onnx.ModelProto()
        bad.CopyFrom(model)
        meta = _meta(bad)
        edit(meta["tensors"]["w"]["groups"])
        cb.set_metadata(bad, json.dumps(meta))
        assert _same(_refused(bad, "digest"), values)
    # the map's bytes changed (two channels of different groups swapped): refused by the digest
    bad = onnx.ModelProto()
    bad.CopyFrom(model)
    swapped = ids.copy()
    a, b = 0, int(np.flatnonzero(ids != ids[0])[0])
    swapped[[a, b]] = swapped[[b, a]]
    _set_map(bad, swapped)
    y = _refused(bad, "digest")
    assert _same(y, _session(bad).run(None, {})[0]) and not _same(y, values)  # what the file computes


def test_a_map_written_wrongly_is_refused_by_its_checks():
    model, values = _packed()
    ids = numpy_helper.to_array(_map_init(model)).copy()
    for label, ids_bad, match in (("out of range", np.where(ids == ids.max(), 200, ids).astype(ids.dtype), "outside"),
                                  ("too short", ids[:-1], "entries"), ("too long", np.append(ids, ids[:1]), "entries"),
                                  ("int64", ids.astype(np.int64), "data type"),
                                  ("swapped", ids[np.r_[1:ids.size, 0]], "checksum|outside")):
        bad = onnx.ModelProto()
        bad.CopyFrom(model)
        _set_map(bad, ids_bad)
        _resign(bad, _meta(bad))
        with pytest.raises(storage.StorageError, match=match):
            storage.decode(bad)
        assert storage.describe(bad)["fast_path"].startswith("refused"), label
    for edit, match in ((lambda g: g.update(map=None), "checksum|outside"), (lambda g: g.update(map=g["counts"]),
                                                                                  "entries|checksum|outside")):
        bad = onnx.ModelProto()
        bad.CopyFrom(model)
        meta = _meta(bad)
        edit(meta["tensors"]["w"]["groups"])
        _resign(bad, meta)
        assert _same(_refused(bad, match), values)  # the standard-ops form still says the right thing


def test_a_large_map_damaged_is_caught_by_the_checksum():
    """A map larger than ``DIGEST_BYTES`` is in the digest by type and shape only: a change of
    its bytes is caught by the decoded values' checksum."""
    model, values = _packed(channels=2 * cb.DIGEST_BYTES + 6, inner=2, seed=6)
    ids = numpy_helper.to_array(_map_init(model))
    assert ids.nbytes > cb.DIGEST_BYTES and ids.dtype == np.uint16
    assert _same(storage.decode(model).weights["w"], values)
    bad = onnx.ModelProto()
    bad.CopyFrom(model)
    swapped = ids.copy()
    b = int(np.flatnonzero(ids != ids[0])[0])
    swapped[[0, b]] = swapped[[b, 0]]
    _set_map(bad, swapped)
    _refused(bad, "checksum")


def test_files_written_before_maps_existed_still_decode():
    """Grouped entries without a ``map`` key (consecutive channels) decode as before."""
    rng = np.random.default_rng(7)
    t, values = _mapped_tensor(rng, "w", (32, 12), 0, 4, 6, "units", "consecutive")
    assert t.groups.channel_map is None and t.groups.size == 4
    model, _ = _bank_model([(t, values)], 17)
    meta = _meta(model)
    assert meta["tensors"]["w"]["groups"].pop("map") is None
    _resign(model, meta)
    assert "map" not in storage.metadata(model)
    assert _same(storage.decode(model).weights["w"], values)


# --------------------------------------------------------------------------- the hash pass

def _rd_like(w: np.ndarray, axis: int, size: int):
    """``(hashed, units, ids)``: ``w`` hashed as rd.py does per group of ``size`` channels sorted
    by RMS (each group's modes on its own grid ``grid_step(bandwidth) / 2``)."""
    moved = np.moveaxis(w, axis, 0)
    rows = moved.reshape(moved.shape[0], -1)
    order = np.argsort(np.sqrt(np.mean(rows.astype(np.float64) ** 2, axis=1)), kind="stable")
    ids = np.empty(rows.shape[0], np.int64)
    units = np.empty(rows.shape[0], np.float64)
    out = rows.copy()
    for g, start in enumerate(range(0, rows.shape[0], size)):
        grp = np.sort(order[start:start + size])
        res = hash_tensor(rows[grp], weight_error=0.02)
        out[grp] = res.hashed
        ids[grp], units[grp] = g, grid_step(res.bandwidth) / 2
    return np.moveaxis(out.reshape(moved.shape), 0, axis).astype(np.float32), units, ids


def test_store_codebooks_uses_the_lattice_axes_and_groups():
    g = GraphBuilder(8)
    h = g.node("Relu", [g.conv("x", 16, 64)])
    y = g.gemm(g.node("Flatten", [g.node("GlobalAveragePool", [h])]), 64, 96, trans_b=False)  # [in, out]
    plain = g.model(["N", 16, 6, 6], y)
    inits = {t.name: t for t in plain.graph.initializer}
    conv, gemm = (n.input[1] for n in plain.graph.node if n.op_type in ("Conv", "Gemm"))
    result = HashPassResult(plain, [], [])
    for name, axis in ((conv, 0), (gemm, 1)):
        w = numpy_helper.to_array(inits[name]).copy()
        scale = np.where(np.arange(w.shape[axis]) % 2 == 0, 8.0, 0.05)  # two scales, interleaved
        w = w * scale.reshape([-1 if k == axis else 1 for k in range(w.ndim)]).astype(np.float32)
        hashed, units, ids = _rd_like(w, axis, w.shape[axis] // 2)
        inits[name].CopyFrom(numpy_helper.from_array(hashed, name))
        result.layers.append(LayerHash(name, "", name, hashed.shape, hashed.size, None, "kde", 0, 0, 0.0))
        result.lattice_units[name] = units
        result.lattice_groups[name] = ids
        if axis:
            result.lattice_axes[name] = axis
    reference = onnx.ModelProto()
    reference.CopyFrom(plain)
    result.model = plain
    store_codebooks(result)
    packed = result.model
    assert result.codebook_layers == 2
    meta = _meta(packed)
    groups = {n: meta["tensors"][n]["groups"] for n in (conv, gemm)}
    assert groups[conv]["axis"] == 0 and groups[gemm]["axis"] == 1
    assert all(gr["map"] is not None and gr["units"] is not None for gr in groups.values())
    x = np.random.default_rng(0).standard_normal((2, 16, 6, 6)).astype(np.float32)
    expected = _session(reference).run(None, {"x": x})[0]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fast = redpp_onnx.session(packed)
    assert fast.redpp_load.form == "decoded"
    assert _same(fast.run(None, {"x": x})[0], expected)
    assert _same(_session(packed).run(None, {"x": x})[0], expected)
    decoded = storage.decode(packed).weights
    for name in (conv, gemm):
        assert _same(decoded[name], numpy_helper.to_array(inits[name]))


def test_store_codebooks_ignores_groups_that_do_not_fit_the_tensor():
    rng = np.random.default_rng(9)
    w = _two_scales(rng, (32, 8, 3, 3))[0]
    units = np.where(np.arange(32) % 2 == 0, 0.0173, 0.000291).astype(np.float32).astype(np.float64)
    opsets = [helper.make_opsetid("", 17)]
    graph = helper.make_graph([helper.make_node("Identity", ["w"], ["y"])], "g", [],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=opsets)
    result = HashPassResult(model, [LayerHash("n", "Conv", "w", w.shape, w.size, None, "kde", 0, 0, 0.0)], [],
                            lattice_units={"w": units}, lattice_groups={"w": np.arange(31) % 2})
    store_codebooks(result)
    assert result.codebook_layers == 1
    entry = _meta(result.model)["tensors"]["w"]
    assert entry["groups"] is None or entry["groups"]["map"] is None
    assert _same(storage.decode(result.model).weights["w"], w)
