"""--codebook storage, randomized: seeded code histograms, layouts and stream lengths encoded by
``codebook.py`` and decoded in both forms, every result checked bit for bit: the standard-ops
decoders in onnxruntime, and the fast path (the map decoded by ``storage.decode`` in C++, the
weights handed to onnxruntime by ``redpp_onnx.session``). Tensors with one codebook per group
of output channels (per-channel hashing) are among the cases, chosen by their stored size.

Edge cases are built on purpose (one value, two values, empty offset fields at the start, in the
middle and at the end of the suffix stream, suffix streams that end on a byte boundary, lengths
around byte and word boundaries, skewed histograms, thousands of values, every layout the planner
picks, -0.0 and NaN payloads), the rest is random. All cases of a test go into one model (one
onnxruntime session per opset: sessions are what costs time); when it fails, the cases are run
one by one to name the first that does."""

from __future__ import annotations

import functools
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import redpp_onnx
from redpp_onnx import storage
from redpp_onnx.passes import codebook as cb

# every opset from MIN_OPSET on where an op of the decoders (Cast, Reshape, Split, Slice,
# Gather, CumSum, Div, Mod, Mul, Add, Identity) has a new version, and the newest onnx knows. The
# decoders' graphs differ only in Split (an attribute before 13, an input from 13 on): all the
# cases run at 11, 13 and the newest opset, a quick set at the others.
NEWEST = onnx.defs.onnx_opset_version()
FULL_OPSETS = (11, 13, NEWEST)
OPSETS = sorted({11, 13, 14, 18, 19, 21, 23, 24, 25, NEWEST})
LENGTHS = (1, 2, 3, 7, 8, 9, 15, 16, 17, 23, 24, 25, 31, 32, 33, 63, 64, 65, 255, 256, 257, 1000)


def _session(model: onnx.ModelProto) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def _merged(graphs, opset):
    """One model of every case's graph (names prefixed ``c<i>_``; each graph's outputs are the
    case's outputs)."""
    nodes, inits, outputs = [], [], []
    for i, g in enumerate(graphs):
        p = lambda name: f"c{i}_{name}" if name else name  # noqa: E731
        for n in g.node:
            n = onnx.NodeProto.FromString(n.SerializeToString())
            n.input[:] = [p(x) for x in n.input]
            n.output[:] = [p(x) for x in n.output]
            nodes.append(n)
        for t in g.initializer:
            t = onnx.TensorProto.FromString(t.SerializeToString())
            t.name = p(t.name)
            inits.append(t)
        outputs += [helper.make_tensor_value_info(p(o.name), o.type.tensor_type.elem_type, None) for o in g.output]
    graph = helper.make_graph(nodes, "cases", [], outputs, inits)
    opsets = [helper.make_opsetid("", opset)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=helper.find_min_ir_version_for(opsets))


def _run_cases(graphs, labels, opset):
    """Outputs of every case (a list per case), from one session; the first failing case named."""
    try:
        flat = _session(_merged(graphs, opset)).run(None, {})
    except Exception:  # noqa: BLE001 - find the case
        for g, label in zip(graphs, labels):
            try:
                _session(_merged([g], opset)).run(None, {})
            except Exception as err:  # noqa: BLE001
                pytest.fail(f"opset {opset}, case {label}: {err}")
        raise
    out, k = [], 0
    for g in graphs:
        out.append(flat[k:k + len(g.output)])
        k += len(g.output)
    return out


def _bug_condition(widths: np.ndarray) -> bool:
    """The suffix fields fill whole bytes and the last one is empty: issue 10's stream."""
    return widths.size > 0 and widths[-1] == 0 and int(widths.sum()) % 8 == 0


# --------------------------------------------------------------------------- the decoder alone

def _skewed(rng, k):
    """Probabilities of ``k`` classes: uniform, geometric or one dominant."""
    kind = rng.integers(3)
    if kind == 0 or k == 1:
        p = np.ones(k)
    elif kind == 1:
        p = rng.uniform(0.2, 0.9) ** np.arange(k)
    else:
        p = np.full(k, 0.01 / max(k - 1, 1))
        p[rng.integers(k)] = 0.99
    return p / p.sum()


def _fields_case(rng, layout, n, empty=None, residue=None, tries=2000):
    """Codes of ``n`` weights under ``layout``; ``empty`` ('start', 'middle', 'end', 'all'): a run
    of weights there gets a class of width 0; ``residue``: the suffix bits ``% 8``. None when
    ``tries`` draws miss ``residue``."""
    widths = np.asarray(layout.classes, np.int64)
    zero = np.flatnonzero(widths == 0)
    if residue is not None and residue % np.gcd.reduce(np.append(widths, 8)):
        return None  # no sum of these widths has this residue
    cum = np.cumsum(_skewed(rng, widths.size))
    for _ in range(tries):
        cls = np.minimum(np.searchsorted(cum, rng.random(n) * cum[-1], side="right"), widths.size - 1)
        if empty is not None:
            run = n if empty == "all" else int(rng.integers(1, max(2, min(10, n // 2 + 1))))
            start = {"start": 0, "middle": (n - run) // 2, "end": n - run, "all": 0}[empty]
            cls[start:start + run] = rng.choice(zero, run)
        if residue is None or int(widths[cls].sum()) % 8 == residue:
            break
    else:
        return None
    off = (rng.random(n) * (1 << widths[cls])).astype(np.int64)
    return layout.bases[cls] + off


def _random_layout(rng, need_zero=False):
    width = int(rng.choice([1, 2, 4]))
    k = int(rng.integers(1, (1 << width) + 1))
    classes = np.where(rng.random(k) < 0.3, 0, rng.integers(0, 17, k))
    if need_zero and not np.any(classes == 0):
        classes[rng.integers(k)] = 0
    return cb.Layout(width, tuple(int(c) for c in classes))


def _layout_and_fields(rng, n, empty=None, residue=None):
    """A random layout with a suffix (and a class of width 0 for ``empty``) and codes as asked."""
    while True:
        layout = _random_layout(rng, need_zero=empty is not None)
        if layout.direct:
            layout = cb.Layout(layout.width, layout.classes[:-1] + (int(rng.integers(1, 17)),))
        if empty is not None and 0 not in layout.classes:
            continue
        codes = _fields_case(rng, layout, n, empty, residue, tries=100)
        if codes is not None:
            return layout, codes


@functools.lru_cache(maxsize=None)
def _decoder_cases(quick):
    """``(label, layout, codes)``: hand-made edge cases, then random layouts and streams (fewer
    when ``quick``)."""
    rng = np.random.default_rng(10 + quick)
    cases = [
        ("one value", cb.Layout(1, (0,)), np.zeros(8, np.int64)),
        ("issue 10: 8 suffix bits, then empty fields", cb.Layout(1, (0, 2)), np.array([1, 2, 3, 4, 0, 0, 0, 0])),
        ("empty fields first", cb.Layout(1, (0, 2)), np.array([0, 0, 0, 0, 1, 2, 3, 4])),
        ("empty fields in the middle", cb.Layout(1, (0, 2)), np.array([1, 2, 0, 0, 0, 0, 3, 4])),
        ("one 16-bit field, then empty", cb.Layout(2, (0, 16)), np.array([65536] + [0] * 7)),
        ("16-bit fields at every bit offset", cb.Layout(4, (1, 16) + (0,) * 14),  # 17 bits a pair
         np.array([v for i in range(16) for v in (i % 2, 2 + (65535, 0, 12345, 54321)[i % 4])] + [65538] * 8)),
        ("one class, all 16 bits", cb.Layout(1, (16,)), np.arange(0, 65536, 4099)[:16]),
    ]
    for width in (1, 2, 4):  # class fields only (a layout the planner picks for uniform codes)
        cases.append((f"direct {width}-bit classes", cb.Layout(width, (0,) * (1 << width)),
                      rng.integers(0, 1 << width, 24)))
    for width, m in ((8, 256), (8, 3), (16, 65536), (16, 300)):
        for n in ((1, 9) if quick else (1, 2, 9, 1000)):
            cases.append((f"direct {width}-bit, {m} values, {n} weights", cb.Layout(width, (0,) * m),
                          rng.integers(0, m, n)))
    for n in ((8, 136) if quick else (8, 16, 24, 136, 1024)):  # the suffix stream ends on each bit of a byte
        for residue in range(8):
            layout, codes = _layout_and_fields(rng, n, residue=residue)
            cases.append((f"n={n}, suffix bits % 8 = {residue}, {layout}", layout, codes))
    for empty in ("start", "middle", "end", "all"):
        for n in ((8, 64) if quick else (8, 16, 64, 1000 - 1000 % 8)):
            for residue in ((0, 1, 7) if empty != "all" and not quick else (0,)):
                layout, codes = _layout_and_fields(rng, n, empty, residue)
                cases.append((f"empty fields at the {empty}, n={n}, suffix bits % 8 = {residue}, {layout}",
                              layout, codes))
    for i in range(0 if quick else 24):  # random layouts and lengths
        layout = _random_layout(rng, need_zero=i % 4 != 3)
        n = int(rng.integers(1, 600)) * 8
        cases.append((f"random {i}, n={n}, {layout}", layout,
                      _fields_case(rng, layout, n, ("start", "middle", "end", None)[i % 4])))
    return cases


def _decoder_graph(layout, codes):
    """The decoder of one stream (its graph does not depend on the opset: no Split)."""
    graph = helper.make_graph([], "g", [], [])
    b = cb._Builder(graph, cb.MIN_OPSET)
    cls, off = cb.encode(codes, layout)
    b.op("Identity", [cb._decode_bank(b, cls, off, layout)], ["codes"])
    graph.node.extend(b.nodes)
    graph.initializer.extend(b.inits)
    graph.output.append(helper.make_tensor_value_info("codes", TensorProto.INT32, None))
    return graph


@functools.lru_cache(maxsize=None)
def _decoder_graphs(quick):
    return [_decoder_graph(layout, codes) for _, layout, codes in _decoder_cases(quick)]


@pytest.mark.parametrize("opset", OPSETS)
def test_decoder_of_any_layout_and_stream_in_onnxruntime(opset):
    quick = opset not in FULL_OPSETS
    cases = _decoder_cases(quick)
    outs = _run_cases(_decoder_graphs(quick), [c[0] for c in cases], opset)
    for (label, layout, codes), (y,) in zip(cases, outs):
        assert y.dtype == np.int32 and np.array_equal(y, codes), label


def test_numpy_mirror_reads_every_decoder_stream():
    for label, layout, codes in _decoder_cases(False):
        cls, off = cb.encode(codes, layout)
        assert np.array_equal(cb.decode(cls, off, layout), codes), label
        w = np.asarray(layout.classes, np.int64)[cls]
        assert np.array_equal(cb.unpack(cb.pack_fields(off, w), w, off.size), off), label


# --------------------------------------------------------------------------- write_codebooks

def _codebook(rng, m, kind):
    """``m`` distinct float32 values: lattice ``k * unit`` (int16 k), or floats with -0.0, 0.0,
    a subnormal, infinities and a NaN among them when ``m`` allows."""
    unit = float(np.float32(rng.uniform(1e-4, 1e-2)))
    if kind == "lattice":
        k = rng.permutation(np.arange(-32768, 32768))[:m].astype(np.int16)
        return (k.astype(np.float32) * np.float32(unit)), unit
    special = np.float32([0.0, -0.0, 1e-45, np.inf, -np.inf, np.nan, -3.5])
    values = np.concatenate([special, rng.standard_normal(m).astype(np.float32)])
    _, first = np.unique(values.view(np.uint32), return_index=True)
    values = values[np.sort(first)]  # distinct bits
    return rng.permutation(values[:m] if m >= special.size else values)[:m], unit  # all specials from m = 7


def _counts_probabilities(rng, m, shape):
    if shape in ("uniform", "exact") or m == 1:
        p = np.ones(m)
    elif shape == "geometric":
        p = rng.uniform(0.3, 0.95) ** np.arange(m)
    elif shape == "dominant":
        p = np.full(m, 0.001 / (m - 1))
        p[0] = 0.999
    elif shape == "zipf":
        p = 1.0 / np.arange(1, m + 1) ** rng.uniform(0.8, 2.0)
    else:  # hashed-like: roughly normal ranks, a few central values dominate
        p = np.exp(-0.5 * ((np.arange(m) - (m - 1) / 2) / (m / 5)) ** 2) + 1e-9
    return p / p.sum()


def _tensor(rng, name, n, m, shape, kind, order, forms=("tensor", "groups")):
    """A tensor of ``n`` weights drawn from ``m`` values (every value present when ``n`` allows),
    laid out in ``order``: 'random', or the most frequent value first / last / in the middle
    (where the empty offset fields are); stored in the smallest of ``forms``."""
    book, unit = _codebook(rng, m, kind)
    if shape == "exact":  # every value n / m times
        codes = rng.permutation(np.arange(n) % m)
    else:
        cum = np.cumsum(_counts_probabilities(rng, m, shape))
        codes = np.minimum(np.searchsorted(cum, rng.random(n) * cum[-1], side="right"), m - 1)
        codes[: min(n, m)] = rng.permutation(m)[: min(n, m)]
        codes = rng.permutation(codes)
    if order != "random":
        top = np.bincount(codes, minlength=m).argmax()
        rest = codes[codes != top]
        same = codes[codes == top]
        split = rest.size // 2
        codes = {"first": np.concatenate([same, rest]), "last": np.concatenate([rest, same]),
                 "middle": np.concatenate([rest[:split], same, rest[split:]])}[order]
    values = book[codes]
    dims = (n,) if n % 4 or rng.random() < 0.5 else (4, n // 4)
    return cb.tensor_codes(name, values.reshape(dims), unit if kind == "lattice" else None, forms=forms), values


def _grouped_tensor(rng, name, shape, axis, size, m, kind, forms=("tensor", "groups")):
    """A tensor hashed per group of ``size`` consecutive channels along ``axis``: each group has
    its own ``m`` values (its own grid for ``kind`` 'units': per-channel lattice units; one
    grid for 'lattice'; none for 'float'), hashed-like frequencies."""
    channels = shape[axis]
    moved = np.empty((channels,) + tuple(d for k, d in enumerate(shape) if k != axis), np.float32)
    unit = float(np.float32(rng.uniform(1e-4, 1e-2)))
    units = np.float32(rng.uniform(1e-4, 1e-2, -(-channels // size)))
    for g in range(-(-channels // size)):
        k = rng.permutation(np.arange(-3000, 3000))[:m]
        if kind == "units":
            book = k.astype(np.float32) * units[g]
        elif kind == "lattice":
            book = k.astype(np.float32) * np.float32(unit)
        else:
            book = rng.standard_normal(m).astype(np.float32)
        p = _counts_probabilities(rng, m, "hashed")
        block = moved[g * size:(g + 1) * size]
        block[...] = book[np.minimum(np.searchsorted(np.cumsum(p), rng.random(block.shape)), m - 1)]
    values = np.moveaxis(moved, 0, axis)
    hint = {"units": np.repeat(units.astype(np.float64), size)[:channels], "lattice": unit, "float": None}[kind]
    t = cb.tensor_codes(name, values, hint, forms=forms, unit_axis=axis)
    return t, np.ascontiguousarray(values).reshape(-1)


def _channel_groups(rng, channels, size, how):
    """``(ids, groups)``: ``channels`` channels cut into groups of ``size`` (the last maybe
    shorter) in the order ``how``: 'permutation' (any order, as rd.py's RMS sort gives),
    'interleaved' (channel ``c`` in group ``c % n_groups``) or 'consecutive'; ``ids``: one group
    id per channel, arbitrary distinct integers or 0, 1, ..."""
    n_groups = -(-channels // size)
    if how == "interleaved":
        groups = [np.arange(g, channels, n_groups) for g in range(n_groups)]
    else:
        order = rng.permutation(channels) if how == "permutation" else np.arange(channels)
        groups = [np.sort(order[i:i + size]) for i in range(0, channels, size)]
    labels = rng.choice(1 << 20, n_groups, replace=False) if rng.random() < 0.5 else np.arange(n_groups)
    ids = np.empty(channels, np.int64)
    for g, idx in enumerate(groups):
        ids[idx] = labels[g]
    return ids, groups


def _mapped_tensor(rng, name, shape, axis, size, m, kind, how="permutation", hist="hashed", forms=("map",)):
    """A tensor hashed per group of ``size`` channels along ``axis`` that are not consecutive
    (:func:`_channel_groups`), stored with the channel map (``forms`` ``("map",)``) or in the
    smallest form. Each group has its own ``m`` values: on its own grid (``kind`` 'units': the
    per-slice unit hint is its group's), on one grid ('lattice'), float32 ('float'), or on a grid
    per channel ('channel units': the hint is not constant within a group: float32 tables);
    ``hist``: the values' frequencies (:func:`_counts_probabilities`)."""
    channels = shape[axis]
    ids, groups = _channel_groups(rng, channels, size, how)
    moved = np.empty((channels,) + tuple(d for k, d in enumerate(shape) if k != axis), np.float32)
    unit = float(np.float32(rng.uniform(1e-4, 1e-2)))
    units = np.float32(rng.uniform(1e-4, 1e-2, len(groups)))
    slice_units = np.empty(channels, np.float64)
    for g, idx in enumerate(groups):
        slice_units[idx] = units[g]
        cum = np.cumsum(_counts_probabilities(rng, m, hist))
        k = rng.permutation(np.arange(-12000, 12000))[:m].astype(np.float32)
        for c in idx:
            if kind == "channel units":
                slice_units[c] = float(np.float32(rng.uniform(1e-4, 1e-2)))
                book = k * np.float32(slice_units[c])
            else:
                book = {"units": k * units[g], "lattice": k * np.float32(unit),
                        "float": (k / 7000).astype(np.float32) ** 3}[kind]
            moved[c] = book[np.minimum(np.searchsorted(cum, rng.random(moved[c].shape) * cum[-1]), m - 1)]
    values = np.moveaxis(moved, 0, axis)
    hint = {"units": slice_units, "channel units": slice_units, "lattice": unit, "float": None}[kind]
    t = cb.tensor_codes(name, values, hint, forms=forms, unit_axis=axis, channel_groups=ids)
    return t, np.ascontiguousarray(values).reshape(-1)


@functools.lru_cache(maxsize=None)
def _bank_cases(quick):
    """``(label, [(TensorCodes, values), ...])``: one bank (one write_codebooks) per case (fewer
    when ``quick``)."""
    rng = np.random.default_rng(20 + quick)
    lengths = (1, 2, 7, 8, 9, 16, 17, 33) if quick else LENGTHS
    cases = []

    def add(label, *specs):
        bank = [_tensor(rng, f"w{j}", *spec) for j, spec in enumerate(specs)]
        cases.append((f"{label}: " + "; ".join(f"n={s[0]} m={s[1]} {s[2]} {s[3]} {s[4]}" for s in specs), bank))

    def grouped(label, *specs):
        bank = [_grouped_tensor(rng, f"g{j}", *spec) for j, spec in enumerate(specs)]
        cases.append((f"{label}: " + "; ".join(f"shape={s[0]} axis={s[1]} size={s[2]} m={s[3]} {s[4]}"
                                               for s in specs), bank))

    for n in lengths:  # every length, one and two values, uniform codes (direct layouts)
        add("one value", (n, 1, "uniform", "float", "random"))
        if n >= 2:
            add("two values", (n, 2, "geometric", "lattice", "random"))
    for n, m in ((64, 3), (64, 4), (64, 16), (256, 256), (999, 333)) + (() if quick else ((1 << 16, 1 << 16),)):
        add("uniform", (n, m, "exact", "lattice", "random", ("tensor",)))  # direct 2, 4, 8, 16-bit fields
    for n in lengths[3:]:  # skewed codes where the empty fields are, at every length
        for order in ("first", "middle", "last"):
            m = int(rng.integers(3, min(n, 40) + 1))
            add("skewed", (n, m, ("dominant", "geometric", "zipf")[int(rng.integers(3))], "lattice", order))
    for m, n in ((3000, 20000),) if quick else ((1000, 5000), (3000, 20000), (9000, 30000)):  # thousands of values
        add("many values", (n, m, "hashed", "lattice", "random"))
        add("many values", (n, m, "zipf", "float", "last"))
    add("dominant", (4000, 500, "dominant", "lattice", "last"))
    add("floats with -0.0, NaN", (333, 7, "uniform", "float", "random"), (40, 7, "geometric", "float", "last"))
    # per-channel (or channel-group) hashed tensors: the grouped form, along the first or the last
    # axis, with one lattice unit, one per group, or float tables; some forced, in banks with others
    for kind in ("units", "lattice", "float"):
        grouped(f"per channel, {kind}", ((16, 8, 3, 3), 0, 1, 12, kind))
        grouped(f"per channel along the last axis, {kind}", ((40, 24), 1, 1, 6, kind))
        grouped(f"channel groups, {kind}", ((32, 16, 3, 3), 0, 4, 20, kind))
    grouped("one channel group, forced", ((6, 5), 0, 8, 7, "lattice", ("groups",)))
    grouped("many values per channel", ((8, 512), 0, 1, 300, "units"), ((64, 9), 1, 1, 3, "float"))
    for i in range(2 if quick else 12):  # random grouped tensors, with a per-tensor one in the bank
        axis = int(rng.integers(2))
        shape = (int(rng.integers(2, 40)), int(rng.integers(1, 30)))
        shape += (3, 3) if axis == 0 and rng.random() < 0.5 else ()
        size = int(rng.choice([1, 1, 2, 4, 8]))
        m = int(rng.integers(1, 40))
        kind = str(rng.choice(["units", "lattice", "float"]))
        bank = [_grouped_tensor(rng, "g0", shape, axis if len(shape) == 2 else 0, size, m, kind),
                _tensor(rng, "w1", int(rng.integers(1, 500)), int(rng.integers(1, 50)), "hashed", "lattice", "random")]
        cases.append((f"random grouped {i}: shape={shape} axis={axis} size={size} m={m} {kind}", bank))
    for i in range(5 if quick else 50):  # random banks of 1-3 tensors
        specs = []
        for _ in range(int(rng.integers(1, 4))):
            n = int(rng.choice(LENGTHS)) if rng.random() < 0.5 else int(rng.integers(1, 3000))
            m = int(rng.integers(1, min(n, 600) + 1))
            shape = str(rng.choice(["uniform", "geometric", "dominant", "zipf", "hashed"]))
            order = str(rng.choice(["random", "first", "middle", "last"]))
            specs.append((n, m, shape, str(rng.choice(["lattice", "float"])), order))
        add(f"random {i}", *specs)
    # channel groups that are not consecutive (rd.py: channels sorted by RMS, cut into groups of
    # 2^k): one codebook per group and a channel map, forced or chosen by size, with others in the
    # bank (a generator of its own: the cases above stay as they were)
    rng = np.random.default_rng(30 + quick)

    def mapped(label, *specs, others=0):
        bank = [_mapped_tensor(rng, f"p{j}", *spec) for j, spec in enumerate(specs)]
        bank += [_tensor(rng, f"w{j}", int(rng.integers(1, 800)), int(rng.integers(1, 60)), "hashed", "lattice",
                         "random") for j in range(others)]
        cases.append((f"{label}: " + "; ".join(f"shape={s[0]} axis={s[1]} size={s[2]} m={s[3]} {' '.join(s[4:6])}"
                                               for s in specs), bank))

    for kind in ("units", "lattice", "float", "channel units"):
        mapped(f"channel map, Conv, {kind}", ((24, 6, 3, 3), 0, 4, 9, kind))
        mapped(f"channel map, MatMul, short last group, {kind}", ((20, 27), 1, 4, 5, kind), others=1)
    mapped("interleaved groups, chosen by size", ((64, 32, 3, 3), 0, 32, 12, "units", "interleaved", "hashed",
                                                 ("tensor", "groups")))
    mapped("consecutive groups given as a map", ((30, 8), 0, 8, 6, "units", "consecutive"))
    mapped("one value per group", ((12, 5), 1, 2, 1, "lattice"), ((9, 4, 2, 2), 0, 3, 1, "float"))
    mapped("two values per group, dominant", ((16, 40), 0, 4, 2, "units", "permutation", "dominant"))
    mapped("thousands of values per group", ((16, 1200), 0, 8, 2000, "units", "permutation", "zipf"), others=1)
    mapped("more than 256 groups: a uint16 map", ((3, 600), 1, 2, 3, "units"))
    for i in range(2 if quick else 10):  # random shapes, sizes (2^k), kinds and histograms
        axis = int(rng.integers(2))
        shape = (int(rng.integers(2, 50)), int(rng.integers(2, 40)))
        shape = shape + (3, 3) if axis == 0 and rng.random() < 0.5 else shape
        size = int(rng.choice([1, 2, 4, 8, 16]))
        m = int(rng.integers(1, 50))
        kind = str(rng.choice(["units", "lattice", "float", "channel units"]))
        hist = str(rng.choice(["uniform", "geometric", "dominant", "zipf", "hashed"]))
        forms = ("map",) if rng.random() < 0.7 else ("tensor", "groups")
        mapped(f"random mapped {i}", (shape, axis, size, m, kind, "permutation", hist, forms),
               others=int(rng.integers(2)))
    return cases


def _bank_model(bank, opset):
    """A model whose outputs are the bank's tensors (with the codebook map) and its stored layouts."""
    tensors = [t for t, _ in bank]
    opsets = [helper.make_opsetid("", opset)]
    model = helper.make_model(helper.make_graph([], "g", [], []), opset_imports=opsets,
                              ir_version=helper.find_min_ir_version_for(opsets))
    stored = cb.write_codebooks(model, tensors, opset)
    for t in tensors:  # the weights feed a node, as in a model
        model.graph.node.append(helper.make_node("Identity", [t.name], [f"y_{t.name}"]))
        model.graph.output.append(helper.make_tensor_value_info(f"y_{t.name}", TensorProto.FLOAT, None))
    return model, stored


def _bank_graph(bank, opset):
    model, stored = _bank_model(bank, opset)
    return model.graph, stored


@functools.lru_cache(maxsize=None)
def _bank_graphs(quick, opset):
    """Graphs and stored layouts of the cases; ``opset`` 11 or 13: the two forms of Split."""
    return [_bank_graph(bank, opset) for _, bank in _bank_cases(quick)]


def test_the_cases_cover_every_layout_and_issue_10_streams():
    """Every layout the planner picks (class fields alone of 1, 2, 4, 8, 16 bits, or class
    fields of 1, 2, 4 bits with a suffix) and streams whose suffix fields fill whole bytes before
    an empty field (issue 10) are among the cases."""
    kinds, bugs = set(), 0
    for (label, bank), (_, stored) in zip(_bank_cases(False), _bank_graphs(False, 13)):
        layout = stored[bank[0][0].name][1]
        kinds.add((layout.width, layout.direct))
        codes = np.concatenate([t.codes for t, _ in bank])
        cls, _ = cb.encode(np.concatenate([codes, np.zeros(-codes.size % 8, np.int64)]), layout)
        bugs += not layout.direct and _bug_condition(np.asarray(layout.classes)[cls])
    assert kinds == {(1, True), (2, True), (4, True), (8, True), (16, True), (1, False), (2, False), (4, False)}
    assert bugs >= 3
    streams = [np.asarray(l.classes)[cb.encode(c, l)[0]] for _, l, c in _decoder_cases(False)]
    assert sum(map(_bug_condition, streams)) >= 10


@pytest.mark.parametrize("opset", OPSETS)
def test_write_codebooks_of_random_histograms_in_onnxruntime_bit_for_bit(opset):
    quick = opset not in FULL_OPSETS
    cases = _bank_cases(quick)
    graphs = [g for g, _ in _bank_graphs(quick, 11 if opset < 13 else 13)]
    outs = _run_cases(graphs, [c[0] for c in cases], opset)
    for (label, bank), ys in zip(cases, outs):
        for (t, values), y in zip(bank, ys):
            assert y.dtype == np.float32 and y.shape == t.shape, label
            assert np.array_equal(y.reshape(-1).view(np.uint32), values.view(np.uint32)), f"{label}: {t.name}"


def test_the_cases_cover_every_grouped_form():
    """One codebook per channel and per group of channels, along the first and the last axis,
    with int16 tables times one unit or a unit per group, and float32 tables, chosen by the
    stored size (some in banks with per-tensor tensors)."""
    forms = set()
    for _, bank in _bank_cases(False):
        for t, _ in bank:
            g = t.groups
            if g is not None:
                table = "float32" if t.lattice is None else "units" if g.units is not None else "lattice"
                forms.add((g.axis == len(t.shape) - 1, g.size > 1, table))
    assert {(False, False, k) for k in ("float32", "units", "lattice")} <= forms
    assert {(True, False, k) for k in ("float32", "units", "lattice")} <= forms
    assert {(False, True, k) for k in ("float32", "units", "lattice")} <= forms


def test_the_cases_cover_every_channel_map():
    """Channel maps (groups that are not consecutive), along the first and the last axis, with
    int16 tables times a unit per group or one unit, and float32 tables; uint8 and uint16 maps;
    a map chosen by size; a consecutive grouping given as a map stored without one."""
    forms, dtypes, chosen, unmapped = set(), set(), 0, 0
    for label, bank in _bank_cases(False):
        for t, values in bank:
            g = t.groups
            if g is None or g.channel_map is None:
                unmapped += "consecutive groups given" in label and g is not None and g.size == 8
                continue
            table = "float32" if t.lattice is None else "units" if g.units is not None else "lattice"
            forms.add((g.axis == len(t.shape) - 1, table))
            dtypes.add(np.dtype(g.map_dtype).name)
            chosen += "chosen by size" in label
            per = np.bincount(g.channel_map)  # groups of size channels, the last maybe fewer
            assert per.max() == g.size and np.sum(per < g.size) <= 1, label
    assert {(a, k) for a in (False, True) for k in ("float32", "units", "lattice")} <= forms
    assert dtypes == {"uint8", "uint16"} and chosen == 1 and unmapped == 1


@functools.lru_cache(maxsize=None)
def _bank_models(quick, opset):
    return [_bank_model(bank, opset)[0] for _, bank in _bank_cases(quick)]


@pytest.mark.parametrize("opset", [11, 13])
def test_fast_path_decodes_every_case_bit_for_bit(opset):
    """storage.decode: the map checked against the graph, the codes decoded in C++; every tensor
    of every case (and of the quick set) bit for bit."""
    for quick in (False, True):
        for (label, bank), model in zip(_bank_cases(quick), _bank_models(quick, opset)):
            decoded = storage.decode(model)
            assert set(decoded.weights) == {t.name for t, _ in bank}, label
            for t, values in bank:
                w = decoded.weights[t.name]
                assert w.dtype == np.float32 and w.shape == t.shape, label
                assert np.array_equal(w.reshape(-1).view(np.uint32), values.view(np.uint32)), f"{label}: {t.name}"
            assert not any(n.op_type != "Identity" for n in decoded.model.graph.node), label  # decoders gone


@pytest.mark.parametrize("opset", FULL_OPSETS)
def test_fast_path_sessions_in_onnxruntime_bit_for_bit(opset):
    """redpp_onnx.session on each case's model: the fast path taken (no warning), onnxruntime
    runs on the decoded weights, outputs bit for bit."""
    quick = opset != 13
    for (label, bank), model in zip(_bank_cases(quick), _bank_models(quick, 11 if opset < 13 else 13)):
        m = onnx.ModelProto()
        m.CopyFrom(model)
        m.opset_import[0].version = opset
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            sess = redpp_onnx.session(m)
        assert sess.redpp_load.form == "decoded", label
        for (t, values), y in zip(bank, sess.run(None, {})):
            assert np.array_equal(y.reshape(-1).view(np.uint32), values.view(np.uint32)), f"{label}: {t.name}"
