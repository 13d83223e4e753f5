"""Prototype measurement: unary-class rank codes (``benchmarks/_unary_code.py``) against the
fixed-width class fields of :mod:`redpp_onnx.passes.codebook`.

(a) real rank streams: for each --codebook file given (default: the /tmp/cli_t files named in the
brief, those that exist), the stored tensors (the ``redpp.codebook`` map) are materialized,
rebuilt as ``TensorCodes`` (``codebook.tensor_codes(name, w, None)``), grouped in banks as
``codebook.banks`` does (and, second row, the codes as the file stores them: its own forms, e.g.
channel-group maps, and banks), and each bank's pooled rank histogram is coded by: its entropy (the floor),
``plan_layout`` (today), ``plan_unary``, and the better of both per bank. Bits per weight, summed
over banks (no stream padding).
(b) synthetic histograms.
(c) decoder nodes and folding memory (the unary decoder over all weights per level, its compact
form that narrows each level to the weights reaching it, both also with at most 6 classes): every intermediate tensor of the decoder (what onnxruntime
keeps while it folds), measured by running the decoder with all intermediates as outputs, in bytes
per weight, for the unary and the existing decoder on the same codes.

    python benchmarks/proto_unary.py [files...]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from redpp_onnx import storage  # noqa: E402
from redpp_onnx.passes import codebook as cb  # noqa: E402
import _unary_code as u  # noqa: E402  (benchmarks/)

DEFAULT = ["/tmp/cli_t/new_cifar10_resnet20.onnx", "/tmp/cli_t/new_cifar10_resnet56.onnx",
           "/tmp/cli_t/th_cifar10_resnet20.onnx", "/tmp/cli_t/th_cifar10_resnet56.onnx", "/tmp/x.onnx"]


def entropy_bits(h: np.ndarray) -> float:
    h = np.asarray(h, np.float64)
    n = h.sum()
    p = h[h > 0] / n
    return float(-(h[h > 0] * np.log2(p)).sum())


def bank_hists(path: str):
    model = onnx.load(path)
    meta = next(p.value for p in model.metadata_props if p.key == cb.METADATA_KEY)
    names = list(json.loads(meta)["tensors"])
    plain = storage.materialize(model)
    weights = {t.name: onnx.numpy_helper.to_array(t) for t in plain.graph.initializer if t.name in names}
    tcs = [cb.tensor_codes(n, weights[n], None) for n in names]
    out = []
    for members in cb.banks(tcs):
        group = [tcs[i] for i in members]
        h = np.zeros(max(t.n_ranks for t in group), np.int64)
        for t in group:
            h[: t.n_ranks] += cb.rank_histogram(t.codes, t.n_ranks)
        out.append(h)
    return out


def stored_bank_hists(path: str):
    """The rank histograms of the codes as the file stores them (its own forms and banks: the
    bank streams of the ``redpp.codebook`` map decoded, the padding dropped)."""
    model = onnx.load(path)
    meta = json.loads(next(p.value for p in model.metadata_props if p.key == cb.METADATA_KEY))
    inits = {t.name: t for t in model.graph.initializer}
    used = {}
    for e in meta["tensors"].values():
        used[e["bank"]] = used.get(e["bank"], 0) + e["count"]
    out = []
    for i, bank in enumerate(meta["banks"]):
        main = onnx.numpy_helper.to_array(inits[bank["main"]])
        count, width = bank["count"], bank["width"]
        cls = main.astype(np.int64).ravel() if width in (8, 16) else cb.unpack(np.r_[main, np.zeros(3, np.uint8)], width, count)
        if bank["suffix"] is None:
            codes = cls
        else:
            layout = cb.Layout(width, tuple(bank["classes"]))
            widths = np.asarray(layout.classes, np.int64)[cls]
            codes = layout.bases[cls] + cb.unpack(onnx.numpy_helper.to_array(inits[bank["suffix"]]), widths, count)
        out.append(np.bincount(codes[: used.get(i, 0)]))
    return out


def compare(hists):
    """Totals over banks: (weights, entropy, fixed, unary, best, kinds chosen, unary levels)."""
    n = ent = fixed = unary = best = 0
    kinds, levels = [], []
    for h in hists:
        n += int(h.sum())
        ent += entropy_bits(h)
        fb, _ = cb.plan_layout(h)
        ub, ul = u.plan_unary(h)
        bb, kind, _ = u.best_layout(h)
        fixed, unary, best = fixed + fb, unary + ub, best + bb
        kinds.append(kind[0])
        levels.append(len(ul) - 1)
    return n, ent, fixed, unary, best, "".join(kinds), levels


def file_totals(hists):
    """Bytes of codes plus decoder nodes and tables, per method: fixed, unary (planned with
    ``LEVEL_BITS`` per level), the better per bank; and the unary levels."""
    fixed = unary = best = 0
    levels = []
    for h in hists:
        sample = np.flatnonzero(h) if h.any() else np.zeros(1, np.int64)
        fb, fl = cb.plan_layout(h)
        ub, ul = u.plan_unary(h, level_bits=u.LEVEL_BITS)
        f_tot = fb / 8 + u.node_bytes(u.decoder_model(sample, fl, 13))[1]
        u_tot = ub / 8 + u.node_bytes(u.decoder_model(sample, ul, 13))[1]
        fixed, unary, best = fixed + f_tot, unary + u_tot, best + min(f_tot, u_tot)
        levels.append(len(ul) - 1)
    return fixed, unary, best, levels


def synthetic():
    rng = np.random.default_rng(0)
    m = 256
    cases = {}
    r = np.arange(m)
    cases["geometric q=0.5"] = 0.5 ** r
    cases["geometric q=0.8"] = 0.8 ** r
    for p0 in (0.3, 0.5, 0.8, 0.95):
        p = np.full(m, (1 - p0) / (m - 1))
        p[0] = p0
        cases[f"peaked p0={p0}"] = p
    x = np.abs(rng.normal(0, 8, 10 ** 6)).astype(int)
    cases["|normal| sigma=8 ranks"] = np.bincount(x)
    cases["flat 256"] = np.ones(m)
    cases["flat 200"] = np.ones(200)
    out = {}
    for name, p in cases.items():
        h = np.rint(np.asarray(p, np.float64) / np.sum(p) * 10 ** 6).astype(np.int64)
        out[name] = compare([h])
    return out


def folding_bytes(model: onnx.ModelProto, n: int) -> float:
    """Bytes per weight of all the decoder's intermediate tensors (node outputs), measured."""
    inferred = onnx.shape_inference.infer_shapes(model)
    types = {v.name: v.type.tensor_type.elem_type for v in inferred.graph.value_info}
    types.update({v.name: v.type.tensor_type.elem_type for v in inferred.graph.output})
    g = onnx.ModelProto.FromString(model.SerializeToString())
    have = {o.name for o in g.graph.output}
    outs = [o for node in g.graph.node for o in node.output if o not in have]
    g.graph.output.extend(helper.make_tensor_value_info(o, types.get(o, onnx.TensorProto.INT32), None) for o in outs)
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    vals = ort.InferenceSession(g.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, {})
    return sum(np.asarray(v).nbytes for v in vals) / n


def decoder_costs(hist: np.ndarray, n: int = 20000, seed: int = 0):
    """Per decoder: (nodes, node+table bytes, folding bytes/weight, bits/weight, layout)."""
    rng = np.random.default_rng(seed)
    codes = rng.choice(hist.size, n, p=hist / hist.sum())
    h = np.bincount(codes, minlength=hist.size)
    res = {}
    fb, fl = cb.plan_layout(h)
    ub, ul = u.plan_unary(h)
    u6b, u6 = u.plan_unary(h, 6)
    for kind, layout, bits, compact in (("fixed", fl, fb, False), ("unary", ul, ub, False),
                                        ("unary compact", ul, ub, True), ("unary K<=6", u6, u6b, False),
                                        ("unary K<=6 compact", u6, u6b, True)):
        m = u.decoder_model(codes, layout, 13, compact=compact)
        nodes, nbytes = u.node_bytes(m)
        res[kind] = (nodes, nbytes, folding_bytes(m, n), bits / n, layout)
    return res


def main(argv):
    files = argv or [f for f in DEFAULT if Path(f).exists()]
    row = "{:<36} {:>8} {:>7} {:>7} {:>7} {:>7}  {}"
    print(row.format("bits/weight", "weights", "entropy", "fixed", "unary", "best", "banks (f/u), unary levels"))
    real = []
    for f in files:
        hists = bank_hists(f)
        real.extend(hists)
        n, ent, fixed, unary, best, kinds, levels = compare(hists)
        print(row.format(Path(f).name, n, f"{ent / n:.3f}", f"{fixed / n:.3f}", f"{unary / n:.3f}",
                         f"{best / n:.3f}", f"{kinds} {levels}"))
        n, ent, fixed, unary, best, kinds, levels = compare(stored_bank_hists(f))
        print(row.format("  as stored (file's forms, banks)", n, f"{ent / n:.3f}", f"{fixed / n:.3f}",
                         f"{unary / n:.3f}", f"{best / n:.3f}", f"{kinds} {levels}"))
    for name, (n, ent, fixed, unary, best, kinds, levels) in synthetic().items():
        print(row.format(name, n, f"{ent / n:.3f}", f"{fixed / n:.3f}", f"{unary / n:.3f}", f"{best / n:.3f}",
                         f"{kinds} {levels}"))
    print("\ncodes + decoder nodes/tables, KB (unary planned with LEVEL_BITS = 400 B per level):")
    for f in files:
        for label, hists in ((Path(f).name, bank_hists(f)), ("  as stored", stored_bank_hists(f))):
            fx, un, be, levels = file_totals(hists)
            print(f"  {label:<34} fixed {fx / 1e3:8.1f}  unary {un / 1e3:8.1f}  best {be / 1e3:8.1f}  "
                  f"saved {(fx - be) / 1e3:6.1f} KB of {Path(f).stat().st_size / 1e3:.0f} KB  levels {levels}")
    if real:
        print("\nall real banks pooled per file above; unary with at most K classes (K-1 decoder levels), "
              "bits/weight over all files:")
        n = sum(int(h.sum()) for h in real)
        fixed = sum(cb.plan_layout(h)[0] for h in real)
        print(f"  entropy {sum(map(entropy_bits, real)) / n:.3f}  fixed {fixed / n:.3f}")
        for k in (2, 3, 4, 5, 6, 8, 12, 16):
            tot = 0
            for h in real:
                try:
                    tot += min(u.plan_unary(h, k)[0], cb.plan_layout(h)[0])
                except ValueError:
                    tot += cb.plan_layout(h)[0]
            print(f"  K<={k:<2} best(unary, fixed) {tot / n:.3f}")
    print("\ndecoder on 20000 codes drawn from a histogram (opset 13): bits/weight, nodes, node+table "
          "bytes, folding intermediates (all node outputs) bytes/weight")
    cases = {"peaked p0=0.8 (256 ranks)": np.r_[0.8 * 255, np.full(255, 0.2)],
             "geometric q=0.8": 0.8 ** np.arange(64), "flat 256": np.ones(256)}
    if real:
        big = max(real, key=lambda h: h.sum())
        cases["largest real bank"] = big.astype(np.float64)
    for name, h in cases.items():
        for kind, (nodes, nbytes, fold, bpw, layout) in decoder_costs(np.asarray(h, np.float64)).items():
            lay = str(layout) if len(str(layout)) < 90 else str(layout)[:86] + " ..."
            print(f"  {name:<26} {kind:<18} {bpw:6.3f} bits/w {nodes:>4} nodes {nbytes:>6} B "
                  f"{fold:6.1f} B/weight  {lay}")


if __name__ == "__main__":
    main(sys.argv[1:])
