"""--codebook storage: escape levels, the width planner, lattice codebooks, banks, and the
decoder graph in onnxruntime against the numpy arrays it stores (bit for bit)."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import redpp_onnx
from redpp_onnx.analysis.layers import LARGE_CONSTANT, static_shapes
from redpp_onnx.compress import compress
from redpp_onnx.config import CompressConfig, HashConfig
from redpp_onnx.hashing import hash_tensor
from redpp_onnx.hashing.kde import grid_step
from redpp_onnx.passes import codebook as cb

from ..graphs import GraphBuilder


def _run(model, x):
    return redpp_onnx.session(model.SerializeToString()).run(None, {"x": x})[0]


def _hashed_like(rng, n, n_values, spread=2.5):
    """Codes of a roughly normal tensor hashed to ``n_values`` values (a few dominate)."""
    centre = (n_values - 1) / 2
    codes = np.clip(np.rint(rng.normal(centre, n_values / (2 * spread), n)), 0, n_values - 1)
    return codes.astype(np.int64)


# --------------------------------------------------------------------------- bit streams, levels

@pytest.mark.parametrize("bits", [1, 3, 7, 8, 9, 12, 16])
def test_pack_unpack_round_trip(bits):
    rng = np.random.default_rng(bits)
    codes = rng.integers(0, 1 << bits, size=1001)
    packed = cb.pack(codes, bits)
    assert packed.size == 1001 * bits // 8 + 3  # 3 bytes readable from bit 1001 * bits on
    assert np.array_equal(cb.unpack(packed, bits, codes.size), codes)


def test_pack_fields_of_mixed_widths_round_trip():
    rng = np.random.default_rng(1)
    widths = rng.integers(0, 17, 3000)
    fields = rng.integers(0, 1 << 16, 3000) % (1 << widths)
    packed = cb.pack_fields(fields, widths)
    assert packed.size == int(widths.sum()) // 8 + 3
    assert np.array_equal(cb.unpack(packed, widths, fields.size), fields)
    with pytest.raises(ValueError, match="does not fit"):
        cb.pack_fields([4], [2])


@pytest.mark.parametrize("layout", [cb.Layout(4, (0, 0, 1, 2, 3, 5, 8)), cb.Layout(2, (3, 5, 9)),
                                    cb.Layout(1, (0, 9)), cb.Layout(16, (0,) * 300)])
def test_encode_decode_round_trip(layout):
    codes = _hashed_like(np.random.default_rng(2), 5000, 300)
    cls, off = cb.encode(codes, layout)
    assert int(cls.max()) < (1 << layout.width) and np.all(off < (1 << np.asarray(layout.classes)[cls]))
    assert np.array_equal(cb.decode(cls, off, layout), codes)
    with pytest.raises(ValueError, match="does not fit"):
        cb.encode(np.array([layout.capacity]), layout)


def test_plan_layout_cost_is_the_stored_bits_and_nears_the_entropy():
    codes = _hashed_like(np.random.default_rng(0), 20000, 300)
    book, ranks = cb.rank_codes(codes.astype(np.float32))
    hist = cb.rank_histogram(ranks, book.size)
    bits, layout = cb.plan_layout(hist)
    assert bits == cb.stored_bits(ranks, layout)
    assert layout.width in (1, 2, 4) and not layout.direct
    p = hist[hist > 0] / hist.sum()
    entropy = float(-(p * np.log2(p)).sum()) * codes.size
    assert entropy <= bits < entropy + 0.15 * codes.size < 9 * codes.size  # flat codes need 9 bits
    # uniform codes: no layout beats plain bytes, which win the tie
    flat = np.random.default_rng(1).integers(0, 256, 20000)
    assert cb.plan_layout(np.bincount(flat, minlength=256)) == (8 * 20000, cb.Layout(8, (0,) * 256))
    # two values: one bit; one frequent value: a 1-bit class field, the others 1 + 2 bits
    assert cb.plan_layout(np.array([7, 3])) == (10, cb.Layout(1, (0, 0)))
    assert cb.plan_layout(np.array([50, 30, 10, 5, 5])) == (200, cb.Layout(1, (0, 2)))
    with pytest.raises(ValueError, match="invalid layout"):
        cb.Layout(2, (0,) * 5)


def test_rank_codes_most_frequent_first():
    values = np.array([0.5, -1.0, 0.5, 2.0, 0.5, -1.0], np.float32)
    book, codes = cb.rank_codes(values)
    assert book.tolist() == [0.5, -1.0, 2.0] and np.array_equal(book[codes], values)
    # values are told apart by their bits: -0.0 is not 0.0
    signed = np.float32([0.0, -0.0, -0.0, 1.0])
    book, codes = cb.rank_codes(signed)
    assert book.size == 3 and np.array_equal(book[codes].view(np.uint32), signed.view(np.uint32))


def test_lattice_codes_exact_or_none():
    unit = float(np.float32(0.0123))
    k = np.array([-300, -1, 0, 1, 7, 32000], np.int16)
    book = k.astype(np.float32) * np.float32(unit)
    assert np.array_equal(cb.lattice_codes(book, unit), k)
    off = book.copy()
    off[2] = np.nextafter(np.float32(0), np.float32(1))
    assert cb.lattice_codes(off, unit) is None                      # a value off the lattice
    assert cb.lattice_codes(np.float32([0, 40000 * unit]), unit) is None  # beyond int16
    assert cb.lattice_codes(book, None) is None
    assert cb.lattice_codes(book, 0.1) is None                      # unit not a float32 number
    assert cb.lattice_codes(np.float32([-0.0, unit]), unit) is None  # 0 * unit is +0.0


def test_kde_modes_lie_on_the_float32_lattice():
    """What lets hashed codebooks be stored as int16: every mode is float32(k) * (h/2)."""
    rng = np.random.default_rng(3)
    for w in (rng.standard_normal(4000) * 0.05, rng.laplace(0, 0.02, 3000), rng.uniform(-1, 1, 2000)):
        res = hash_tensor(w.astype(np.float32))
        assert res.reason is None
        assert cb.lattice_codes(np.unique(res.hashed), grid_step(res.bandwidth) / 2) is not None


# --------------------------------------------------------------------------- banks and the graph

def _decoder_model(tensors, opset):
    """A graph whose outputs are x * W for every stored tensor W (x: a scalar input)."""
    graph = helper.make_graph([], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [])], [])
    stored = cb.write_codebooks(graph, tensors, opset)
    for t in tensors:
        y = f"y_{t.name}"
        graph.node.append(helper.make_node("Mul", [t.name, "x"], [y]))
        graph.output.append(helper.make_tensor_value_info(y, TensorProto.FLOAT, list(t.shape)))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)
    onnx.checker.check_model(model, full_check=True)
    return model, stored


SPECS = (((64, 32, 3, 3), 300), ((128, 64), 500), ((16, 8, 3, 3), 40), ((1001,), 200), ((3, 2), 4),
         ((20, 5), 1))


def _tensors(rng, specs=SPECS):
    """Hashed-like tensors (lattice codebooks) of several histograms and sizes (not multiples of
    8), and one with a float codebook."""
    unit = float(np.float32(1e-3))
    out = []
    for i, (shape, n_values) in enumerate(specs):
        codes = _hashed_like(rng, int(np.prod(shape)), n_values)
        k = rng.permutation(np.arange(-n_values, n_values))[:n_values].astype(np.int16)
        values = (k.astype(np.float32) * np.float32(unit))[codes].reshape(shape)
        out.append(cb.tensor_codes(f"w{i}", values, unit))
    floats = rng.standard_normal(37).astype(np.float32)[_hashed_like(rng, 4093, 37)].reshape(4093)
    out.append(cb.tensor_codes("wf", floats, unit))
    return out


def _check_decoders(tensors, opset, tmp_path):
    model, stored = _decoder_model(tensors, opset)
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.optimized_model_filepath = str(tmp_path / "opt.onnx")
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    outs = sess.run(None, {"x": np.array(1.0, np.float32)})
    for t, y in zip(tensors, outs):
        assert np.array_equal(y, t.values()), t.name
        bits, layout = stored[t.name]
        assert bits == cb.stored_bits(t.codes, layout) / t.codes.size
    folded = onnx.load(str(tmp_path / "opt.onnx"))
    assert {n.op_type for n in folded.graph.node} == {"Mul"}  # every decoder folded at load
    return model, stored


@pytest.mark.parametrize("opset", [11, 13, 17])
def test_decoders_rebuild_every_tensor_bit_for_bit_and_onnxruntime_folds_them(opset, tmp_path):
    tensors = _tensors(np.random.default_rng(opset))
    assert sum(t.lattice is None for t in tensors) == 1  # the float one
    model, stored = _check_decoders(tensors, opset, tmp_path)
    layout = stored["w0"][1]
    assert layout.width == 4 and not layout.direct  # classes and suffixes were exercised
    assert any(t.data_type == TensorProto.INT16 for t in model.graph.initializer)


@pytest.mark.parametrize("n_values,width", [(2, 1), (16, 4), (256, 8), (65536, 16)])
def test_decoders_of_direct_layouts(n_values, width, tmp_path):
    """Uniform codes: plain 1-bit, 4-bit, uint8 and uint16 fields (ties go to no suffix)."""
    rng = np.random.default_rng(n_values)
    unit = float(np.float32(1e-3))
    values = (np.float32(unit) * rng.permutation(np.arange(n_values * 4) % n_values)).astype(np.float32)
    t = cb.tensor_codes("w", values.reshape(-1, 4), unit)
    _, stored = _check_decoders([t], 17, tmp_path)
    assert stored["w"][1].direct and stored["w"][1].width == width


def test_banks_are_cut_at_their_size_limit(monkeypatch, tmp_path):
    monkeypatch.setattr(cb, "BANK_WEIGHTS", 20000)
    tensors = _tensors(np.random.default_rng(9))
    parts = cb.banks(tensors)
    assert sorted(i for b in parts for i in b) == list(range(len(tensors)))
    assert all(sum(tensors[i].codes.size for i in b) <= 20000 for b in parts) and len(parts) >= 2
    model, _ = _check_decoders(tensors, 17, tmp_path)
    assert sum(n.op_type == "CumSum" for n in model.graph.node) == len(parts)  # one decoder per bank


def _coded(name, rng, n, probs):
    values = (np.arange(len(probs)) - len(probs) // 2).astype(np.float32) * np.float32(0.125)
    return cb.tensor_codes(name, rng.choice(values, size=(n // 64, 64), p=probs), 0.0625)


def test_tensors_with_unlike_histograms_get_a_bank_each(tmp_path):
    """A peaked tensor (one value holds 90 % of the weights) and a flat one (64 values alike) code
    in fewer bits with a layout each: two banks, a smaller file than one pooled bank; two alike
    tensors share one."""
    rng = np.random.default_rng(4)
    peaked = np.full(9, 0.1 / 8)
    peaked[4] = 0.9
    flat = np.full(64, 1 / 64)
    unlike = [_coded("p", rng, 1 << 16, peaked), _coded("f", rng, 1 << 16, flat)]
    assert sorted(map(sorted, cb.banks(unlike))) == [[0], [1]]
    alike = [_coded("a", rng, 1 << 16, flat), _coded("b", rng, 1 << 16, flat)]
    assert cb.banks(alike) == [[0, 1]]

    def size(parts):
        old = cb.banks
        cb.banks = lambda t: parts
        try:
            model, _ = _check_decoders(unlike, 17, tmp_path)  # also decodes both, bit for bit
        finally:
            cb.banks = old
        return model.ByteSize()

    assert size([[0], [1]]) < size([[0, 1]]) - 4000  # the peaked tensor alone: about 1.1 bits a weight saved


def test_refusal_of_tensors_the_storage_would_not_shrink():
    rng = np.random.default_rng(7)
    distinct = cb.tensor_codes("d", rng.standard_normal(1000).astype(np.float32), None)
    assert "would not shrink" in cb.refusal(distinct)
    few = cb.tensor_codes("h", rng.standard_normal(8)[rng.integers(0, 8, 1000)].astype(np.float32), None)
    assert cb.refusal(few) is None


# --------------------------------------------------------------------------- through compress

@pytest.mark.parametrize("weight_error,n_out", [(0.05, 16), (0.002, 64), (0.01, 3)])
def test_codebook_model_equals_hashed_model(weight_error, n_out):
    """Few values, many values; tiny layers (n_out = 3) are kept plain: the decoder would cost
    more than their codes save."""
    g = GraphBuilder(3)
    h = g.node("Relu", [g.conv("x", 16, n_out)])
    y = g.gemm(g.node("Flatten", [g.node("GlobalAveragePool", [h])]), n_out, 40)
    model = g.model(["N", 16, 9, 9], y)
    cfg = CompressConfig(hash=HashConfig(weight_error=weight_error), verify=False, codebook=False)
    hashed, plain_report = compress(model, cfg)
    packed, report = compress(model, CompressConfig(hash=cfg.hash, codebook=True, verify=False))
    onnx.checker.check_model(packed, full_check=True)
    changed = [l for l in report.layers if l["eligible"] and l["method"] != "unchanged"]
    bits = [l["code_bits"] for l in changed]
    x = np.random.default_rng(0).standard_normal((3, 16, 9, 9)).astype(np.float32)
    assert np.array_equal(_run(hashed, x), _run(packed, x))
    if n_out == 3:
        assert report.model["codebook_layers"] == 0 and packed.ByteSize() == hashed.ByteSize()
        assert all(any("would make the file" in r for r in l["reasons"]) for l in changed)
        return
    assert report.model["codebook_layers"] == len(changed) >= 1 and all(b is not None for b in bits)
    assert all(l["codebook_type"] == "int16" for l in changed)  # KDE modes: grid indices x step
    stored = sum(l["params"] for l in changed)
    assert any(n.startswith(f"stored as codebooks (standard-ops + map, {stored:,} weights)") for n in report.notes)
    assert report.model["storage"]["form"] == "standard-ops + map"
    # the weights were replaced by decoders: no float tensor of the weights' size is left, and the
    # hashed codebooks went in as int16 lattice integers
    assert not any(t.dims and list(t.dims) == [n_out, 16, 3, 3] for t in packed.graph.initializer)
    assert any(t.data_type == TensorProto.INT16 for t in packed.graph.initializer)
    assert not any(t.data_type == TensorProto.INT16 for t in hashed.graph.initializer)
    # the report's numbers describe the same model
    for key in ("params_after", "macs_after", "distinct_values_after"):
        assert report.model[key] == plain_report.model[key], key
    if weight_error == 0.002:
        assert max(l["modes"] for l in changed) > 256


def test_static_shapes_of_a_codebook_model_cut_the_decoders(monkeypatch):
    """Shape inference with data propagation copies integer constants element by element: the
    decoders are replaced by inputs first, and the shapes are those of the plain model."""
    g = GraphBuilder(4)
    y = g.gemm(g.node("Flatten", [g.node("GlobalAveragePool", [g.conv("x", 16, 64)])]), 64, 40)
    model = g.model(["N", 16, 9, 9], y)
    cfg = CompressConfig(hash=HashConfig(weight_error=0.002), verify=False, codebook=False)
    hashed, _ = compress(model, cfg)
    packed, _ = compress(model, CompressConfig(hash=cfg.hash, codebook=True, verify=False))
    seen = []
    real = onnx.shape_inference.infer_shapes

    def spy(m, *args, **kwargs):
        seen.append((kwargs.get("data_prop", False), onnx.ModelProto.FromString(m.SerializeToString())))
        return real(m, *args, **kwargs)

    monkeypatch.setattr(onnx.shape_inference, "infer_shapes", spy)
    plain_shapes, packed_shapes = static_shapes(hashed), static_shapes(packed)
    assert all(packed_shapes[k] == v for k, v in plain_shapes.items())
    (first_prop, first), (second_prop, second) = seen[-2:]
    assert not first_prop and second_prop
    # tensors computed from the input x; every other node with a large output is a decoder's
    from_x = {"x"}
    for n in packed.graph.node:
        if from_x & set(n.input):
            from_x.update(n.output)
    large = lambda m: {o for n in m.graph.node for o in n.output  # noqa: E731
                       if o not in from_x and np.prod(packed_shapes.get(o, (0,))) > LARGE_CONSTANT}
    assert large(first) and not large(second)  # the decoders' large outputs were cut off


@pytest.mark.parametrize("opset", [11, 17])
def test_decoder_reads_a_zero_width_field_at_the_end_of_a_whole_byte_suffix(opset, tmp_path):
    """Issue 10: the suffix fields take whole bytes (here 4 x 2 bits) and the last weight's field
    is empty (rank 0, class of one value): it starts one bit past the data, where the decoder
    still gathers a 3-byte window; onnxruntime failed with 'indices element out of data bounds'."""
    unit = float(np.float32(1e-3))
    values = (np.float32(unit) * np.float32([1, 2, 3, 4] + [0] * 12)).reshape(4, 4)
    t = cb.tensor_codes("w", values, unit)
    layout = cb.plan_layout(cb.rank_histogram(t.codes, t.codebook.size))[1]
    cls, off = cb.encode(t.codes, layout)
    assert layout == cb.Layout(1, (0, 2)) and t.codes[-1] == 0  # 8 suffix bits, then an empty field
    widths = np.asarray(layout.classes)[cls]
    assert np.array_equal(cb.unpack(cb.pack_fields(off, widths), widths, off.size), off)
    _check_decoders([t], opset, tmp_path)


# --------------------------------------------------------------------------- one codebook per channel group

def _per_channel(rng, shape, m, axis=0, units=None):
    """Values hashed per output channel: each slice along ``axis`` has its own ``m`` values
    (lattice integers times its unit, or times 1e-3), hashed-like frequencies."""
    channels = shape[axis]
    units = np.full(channels, np.float32(1e-3)) if units is None else units
    out = np.empty((channels,) + tuple(d for k, d in enumerate(shape) if k != axis), np.float32)
    for c in range(channels):
        k = rng.permutation(np.arange(-2000, 2000))[:m]
        out[c] = (k.astype(np.float32) * units[c])[_hashed_like(rng, out[c].size, m).reshape(out[c].shape)]
    return np.moveaxis(out, 0, axis)


def test_grouped_form_is_chosen_by_its_exact_stored_bits():
    rng = np.random.default_rng(11)
    unit = float(np.float32(1e-3))
    per_channel = _per_channel(rng, (64, 32, 3, 3), 12)
    t = cb.tensor_codes("w", per_channel, unit)
    assert t.form == "groups" and t.groups.axis == 0 and t.groups.size == 1 and t.lattice is not None
    assert np.array_equal(t.values(), per_channel)
    whole = cb.tensor_codes("w", per_channel, unit, forms=("tensor",))
    cost = lambda x: cb.plan_layout(cb.rank_histogram(x.codes, x.n_ranks))[0] + x.table_bits()  # noqa: E731
    assert cost(t) < cost(whole)
    for size in (2, 4):  # every other size it tried costs more
        other = cb.tensor_codes("w", per_channel, unit, forms=("groups",))
        assert cost(other) == cost(t)
    # per-tensor hashing (one set of values for all channels): one codebook is smaller
    shared = cb.tensor_codes("w", (np.float32(unit) * rng.integers(-150, 150, 300).astype(np.float32))
                             [_hashed_like(rng, 64 * 288, 300)].reshape(64, 32, 3, 3), unit)
    assert shared.form == "tensor"
    # along the last axis (MatMul weights), and groups of channels sharing their values
    last = _per_channel(rng, (48, 40), 5, axis=1)
    assert cb.tensor_codes("w", last, unit).groups.axis == 1
    pairs = np.repeat(_per_channel(rng, (16, 128), 10), 4, axis=0)  # 4 channels share each set
    g = cb.tensor_codes("w", pairs, unit).groups
    assert g.size == 4 and g.n_groups == 16


def test_grouped_lattice_with_a_unit_per_channel():
    """Per-channel hashing puts each channel's modes on its own grid: int16 tables and one
    float32 unit per channel, the product the same float32 number as the value."""
    rng = np.random.default_rng(12)
    units = np.float32(rng.uniform(1e-4, 1e-2, 32))
    values = _per_channel(rng, (32, 16, 3, 3), 9, units=units)
    t = cb.tensor_codes("w", values, units.astype(np.float64))
    assert t.form == "groups" and t.lattice is not None and t.groups.units is not None
    assert np.array_equal(t.values().view(np.uint32), values.view(np.uint32))
    assert cb.tensor_codes("w", values, None).lattice is None  # no grid given: float32 tables


def test_grouped_graph_cost_estimate():
    """GROUP_GRAPH_BITS is what the grouped decoder's nodes and small constants add to those of one
    codebook (within 40 %)."""
    rng = np.random.default_rng(13)
    for size, units in ((1, None), (4, np.repeat(np.float32(rng.uniform(1e-4, 1e-2, 16)), 4))):
        values = np.repeat(_per_channel(rng, (64 // size, 32, 3, 3), 12,
                                        units=None if units is None else units[::size]), size, axis=0)
        t = cb.tensor_codes("layer3.0.conv2.weight", values, None if units is None else units.astype(np.float64),
                            forms=("groups",))
        assert t.groups.size == size and (t.groups.units is not None) == (units is not None)
        b = cb._Builder(helper.make_graph([], "g", [], []), 17)
        meta = cb._gather_groups(b, t, "book", "part", t.name, None if units is None else "units")
        extra = sum(n.ByteSize() + 3 for n in b.nodes) + sum(
            x.ByteSize() + 3 for x in b.inits if x.name not in (meta["counts"], meta["units"]))
        plain = cb._Builder(helper.make_graph([], "g", [], []), 17)  # what one codebook's decoder has instead
        plain.op("Reshape", [plain.op("Gather", ["book", "part"], axis=0), plain.init(np.asarray(t.shape, np.int64))],
                 [t.name])
        extra -= sum(n.ByteSize() + 3 for n in plain.nodes) + sum(x.ByteSize() + 3 for x in plain.inits)
        assert 0.6 * cb.GROUP_GRAPH_BITS / 8 <= extra <= 1.4 * cb.GROUP_GRAPH_BITS / 8, extra


@pytest.mark.parametrize("opset", [11, 17])
def test_grouped_decoders_in_onnxruntime_and_the_map(opset, tmp_path):
    rng = np.random.default_rng(opset)
    unit = float(np.float32(1e-3))
    units = np.float32(rng.uniform(1e-4, 1e-2, 24))
    tensors = [cb.tensor_codes("a", _per_channel(rng, (16, 8, 3, 3), 7), unit),
               cb.tensor_codes("b", _per_channel(rng, (40, 24), 4, axis=1), unit),
               cb.tensor_codes("c", _per_channel(rng, (24, 50), 6, units=units), units.astype(np.float64)),
               cb.tensor_codes("d", np.repeat(_per_channel(rng, (4, 60), 9), 8, axis=0), None)] + _tensors(rng)[:2]
    assert [t.form for t in tensors[:4]] == ["groups"] * 4
    _check_decoders(tensors, opset, tmp_path)
    model = helper.make_model(helper.make_graph([], "g", [], []), opset_imports=[helper.make_opsetid("", opset)])
    cb.write_codebooks(model, tensors, opset)
    meta = json.loads(model.metadata_props[0].value)
    assert model.metadata_props[0].key == cb.METADATA_KEY and meta["version"] == 1
    assert [meta["tensors"][n]["groups"] is not None for n in "abcd"] == [True] * 4
    assert meta["tensors"]["c"]["groups"]["units"] is not None and meta["tensors"]["c"]["book"]["unit"] is None
    for t in tensors:
        assert int(meta["tensors"][t.name]["checksum"], 16) == cb.checksum(t.values())


def test_checksum_in_cpp_and_numpy():
    from redpp_onnx import _core

    rng = np.random.default_rng(14)
    for n in (0, 1, 7, 1 << 20, (1 << 20) + 5):
        v = rng.standard_normal(n).astype(np.float32)
        assert int(_core.checksum(v)) == cb.checksum(v)
    v = rng.standard_normal(1000).astype(np.float32)
    w = v.copy()
    w[[3, 4]] = w[[4, 3]]
    assert cb.checksum(w) != cb.checksum(v)  # order matters
