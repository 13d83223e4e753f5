"""Rate-distortion hashing vs data-free baselines: top-1 against bits per eligible weight, counted and real.

For each shared model: RD hashing (``redpp_onnx.hashing.rd``) at several output-error budgets
with both presets of ``rd.EFFORTS`` ("thorough", the headline family, and "fast", the default of
``redpp-onnx compress``), and every baseline setting of ``redpp_onnx.hashing.baselines`` (uniform
symmetric/asymmetric, per tensor/per channel, 3-8 bits; k-means per tensor K 8-256 and per output
channel K 4-32; fp16), all applied to the eligible weights (``scan_layers`` defaults: Conv group
1, Gemm, MatMul with constant weights) and COUNTED by the same code (``baselines.stored_bits``):
fixed-length bits and zeroth-order-entropy bits per eligible weight, tables included.

Every RD row is also written as the REAL file ``redpp-onnx compress`` writes
(``_rd_files.real_file``: ``store_codebooks``, byte for byte the same file) and its
``file_bytes``, ``file_bits_per_eligible_weight`` (the ``compress.set_file_bits`` rule: (file bytes
- (original bytes - 4·eligible))·8/eligible) and ``file_ratio`` are recorded next to the counted
bits; also as the file of ``--storage compact`` (rANS codes decoded by redpp-onnx; families
``COMPACT``: the same hashed weights and top-1, their own file bits). The two baselines a user can get as real files (``_real_baselines.py``: onnxruntime's
``quantize_dynamic``, 4 variants, and fp16 weights + Cast) are rows with real file bits; the
others have no real tool and keep their counted bits. Top-1 on the exact data (CIFAR-10 exact
1,017-image subset, ImageNet 1,000-image sample), with agreement and the relative L2 logit
difference against the original. onnxruntime runs with one intra-op thread.

Prints one table per model and the headline: per method family, the fewest bits within the
accuracy bar (0.3 points for the CIFAR ResNets, 0.5 for EfficientNet-Lite0), real file bits where
the family is a real file, else counted entropy bits (``headline``; ``headline_counted``: by
counted entropy bits only), and whether ours beats every baseline family (``verdict``). Then
exact merge and the split analysis after hashing (``after_hashing``: the headline RD output, the
fast default at budget 0.1, the old default KDE ε = 0.01). Writes ``benchmarks/results/rd.json``
(this run's models replace theirs, the others are kept) and ``docs/figures/rd_<model>.png``.
Evaluations are cached on disk by a digest of the model's weights (``--cache``, default
/tmp/rd_cache), so a re-run only evaluates what changed; the real files go to CACHE/files.

    python benchmarks/bench_rd.py [--models resnet20,resnet56,efficientnet] [--shared ../shared/bench]
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import onnx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import _real_baselines as real  # noqa: E402  (benchmarks/)
from _common import shared_parser, write_json  # noqa: E402
from _rd_files import after_hashing, file_bits, old_default, real_file, store_file  # noqa: E402

from redpp_onnx.analysis.layers import ConstantTensors, scan_layers  # noqa: E402
from redpp_onnx.evaluate import load_dataset  # noqa: E402
from redpp_onnx.hashing import baselines as B  # noqa: E402
from redpp_onnx.hashing import rd  # noqa: E402

MODELS = {  # key -> (model file, exact data, accuracy bar in points, batch)
    "resnet20": ("cifar10_resnet20.onnx", "cifar10_test_exact1017.npz", 0.3, 256),
    "resnet56": ("cifar10_resnet56.onnx", "cifar10_test_exact1017.npz", 0.3, 256),
    "efficientnet": ("imagenet_efficientnet_lite0.onnx", "imagenet_sample1000_224_q95.npz", 0.5, 50),
}

UNIFORM_BITS = (3, 4, 5, 6, 7, 8)
KMEANS_TENSOR_K = (8, 16, 32, 64, 128, 256)
KMEANS_CHANNEL_K = (4, 8, 16, 32)


def baseline_settings():
    """(family, label, function of (w, axis) -> Quantized) for every baseline setting."""
    out = []
    for sym in (True, False):
        for per in ("tensor", "channel"):
            fam = f"uniform {'sym' if sym else 'asym'} per-{per}"
            for b in UNIFORM_BITS:
                out.append((fam, f"{fam} {b}b",
                            lambda w, ax, b=b, sym=sym, per=per: B.uniform(w, b, symmetric=sym,
                                                                           axis=ax if per == "channel" else None)))
    for k in KMEANS_TENSOR_K:
        out.append(("kmeans per-tensor", f"kmeans per-tensor K{k}", lambda w, ax, k=k: B.kmeans(w, k)))
    for k in KMEANS_CHANNEL_K:
        out.append(("kmeans per-channel", f"kmeans per-channel K{k}", lambda w, ax, k=k: B.kmeans(w, k, axis=ax)))
    out.append(("fp16", "fp16", lambda w, ax: B.fp16(w)))
    return out


QUANTIZE_DYNAMIC = ((False, False), (True, False), (False, True), (True, True))  # (per_channel, unsigned)


def quantize_dynamic_row(model_path: Path, ev, eligible_weights: int, files: Path, *, per_channel: bool = False,
                         unsigned: bool = False):
    """onnxruntime's ``quantize_dynamic`` (int8 weights, activations quantized at run time) as the
    real file it writes (``_real_baselines.py``): bits per eligible weight from the file's bytes
    (the ``set_file_bits`` rule; it also quantizes weights that are not eligible, e.g. depthwise
    convs, which this rule credits to the eligible ones), top-1 by the same Evaluator. A row
    like the others, without counted bits; with ``error`` and no top-1 when onnxruntime cannot run it."""
    label = f"quantize_dynamic {'QUInt8' if unsigned else 'QInt8'} per-{'channel' if per_channel else 'tensor'}"
    dst = files / f"quantize_dynamic_{'u' if unsigned else 's'}{'c' if per_channel else 't'}.onnx"
    dst.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    real.ort_quantize_dynamic(model_path, dst, per_channel=per_channel, unsigned=unsigned)
    secs = time.perf_counter() - t0
    return _file_row("onnxruntime quantize_dynamic (file)", label, model_path, dst, ev, eligible_weights, secs)


def fp16_file_row(model_path: Path, ev, eligible_weights: int, files: Path):
    """Eligible weights stored as float16 and cast back (``_real_baselines.fp16_weights``), as a real file."""
    dst = files / "fp16.onnx"
    dst.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    real.fp16_weights(model_path, dst)
    return _file_row("fp16 (file)", "fp16 weights + Cast (file)", model_path, dst, ev, eligible_weights,
                     time.perf_counter() - t0)


def _file_row(family, label, model_path, dst, ev, eligible_weights, secs):
    size = dst.stat().st_size
    row = {"family": family, "setting": label, "ours": False, "real_file": True, "fixed_bits": None,
           "entropy_bits": None, "table_bits": None, "file_bytes": int(size),
           "file_bits_per_eligible_weight": file_bits(size, model_path.stat().st_size, eligible_weights),
           "file_ratio": model_path.stat().st_size / size, "quantize_seconds": secs}
    try:
        res = ev.model_result(onnx.load(str(dst)))
    except Exception as err:  # noqa: BLE001  an op onnxruntime's CPU provider lacks for this type
        print(f"  {label}: onnxruntime cannot run it: {str(err).splitlines()[0][:200]}", flush=True)
        return {**row, "error": str(err).splitlines()[0][:300]}
    return {**row, **res}


# --------------------------------------------------------------------------- model plumbing

def output_axis(layer) -> int:
    """The output-channel axis of an eligible layer's weight."""
    return rd.output_axis(layer.op_type, tuple(layer.weight_shape), layer.trans_b)


def eligible(model: onnx.ModelProto):
    """[(layer, weight array float32, output axis)] of the eligible layers (scan defaults)."""
    consts = ConstantTensors(model)
    return [(l, consts.array(l.weight).astype(np.float32), output_axis(l)) for l in scan_layers(model).layers]


def digest(new: dict) -> str:
    h = hashlib.sha1()
    for name in sorted(new):
        a = np.ascontiguousarray(new[name], np.float32)
        h.update(name.encode())
        h.update(str(a.shape).encode())
        h.update(a.tobytes())
    return h.hexdigest()[:20]


class Evaluator:
    """Top-1 / agreement / logit drift of weight variants of one model on one data set, cached
    on disk by the digest of the new weights. One onnxruntime thread."""

    def __init__(self, model_path: Path, data_path: Path, cache: Path, batch: int):
        self.model = onnx.load(str(model_path))
        self.cache = cache / "eval" / model_path.stem
        self.cache.mkdir(parents=True, exist_ok=True)
        self.batch = batch
        xfile = cache / (data_path.name + ".x.npy")
        if not xfile.exists():
            d = load_dataset(data_path)
            np.save(cache / (data_path.name + ".y.npy"), d.labels)
            tmp = cache / (data_path.name + f".x.{os.getpid()}.npy")
            np.save(tmp, d.materialize())
            tmp.replace(xfile)
        self.x = np.load(xfile, mmap_mode="r")
        self.y = np.load(cache / (data_path.name + ".y.npy"))
        self.ref = self.logits(self.model)
        self.ref_top1 = float((self.ref.argmax(1) == self.y).mean())
        self.runs = 0
        self.seconds = 0.0

    def logits(self, model: onnx.ModelProto) -> np.ndarray:
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.intra_op_num_threads = 1
        so.inter_op_num_threads = 1
        so.log_severity_level = 3
        sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        name = sess.get_inputs()[0].name
        return np.concatenate([sess.run(None, {name: np.ascontiguousarray(self.x[i:i + self.batch])})[0]
                               for i in range(0, len(self.x), self.batch)]).astype(np.float64)

    def __call__(self, new: dict) -> dict:
        """Results of the model with the constants ``new`` (name -> array) replaced."""
        return self.run(rd.with_weights(self.model, new), digest(new))

    def model_result(self, model: onnx.ModelProto) -> dict:
        """Results of any variant of the model (digest of its serialized bytes)."""
        return self.run(model, "m" + hashlib.sha1(model.SerializeToString()).hexdigest()[:20])

    def run(self, model: onnx.ModelProto, key: str) -> dict:
        f = self.cache / f"{key}.json"
        if f.exists():
            return json.loads(f.read_text())
        t0 = time.perf_counter()
        lg = self.logits(model)
        self.seconds += time.perf_counter() - t0
        self.runs += 1
        diff = np.linalg.norm(lg - self.ref, axis=1)
        res = {"top1": float((lg.argmax(1) == self.y).mean()),
               "agreement": float((lg.argmax(1) == self.ref.argmax(1)).mean()),
               "logit_rel_l2": float(np.linalg.norm(lg - self.ref) / np.linalg.norm(self.ref)),
               "logit_rel_l2_mean": float(np.mean(diff / np.linalg.norm(self.ref, axis=1))),
               "n": int(len(self.y))}
        f.write_text(json.dumps(res))
        return res


# --------------------------------------------------------------------------- rows

def baseline_row(family, lab, fn, layers, ev, corrected=None):
    """One baseline setting on every eligible layer; ``corrected``: (views, stats) to apply the
    same data-free gain and bias corrections as RD hashing (``rd.correct``) before evaluating."""
    new, bits = {}, B.ZERO_BITS
    sq_err = sq_ref = 0.0
    t0 = time.perf_counter()
    for layer, w, ax in layers:
        q = fn(w, ax)
        new[layer.weight] = q.values
        bits = bits + B.method_bits(q)
        sq_err += float(np.sum((q.values.astype(np.float64) - w) ** 2))
        sq_ref += float(np.sum(w.astype(np.float64) ** 2))
    secs = time.perf_counter() - t0
    if corrected is None:
        res = ev(new)
    else:
        m = rd.with_weights(ev.model, new)
        rd.correct(ev.model, m, corrected[0], corrected[1])
        res = ev.model_result(m)
        family, lab = family + " + corr.", lab + " + corr."
    pw = bits.per_weight()
    return {"family": family, "setting": lab, "ours": False, "corrected": corrected is not None,
            "fixed_bits": pw["fixed"], "entropy_bits": pw["entropy"], "table_bits": pw["table"],
            "weight_rel_error": (sq_err / sq_ref) ** 0.5, "quantize_seconds": secs, **res}


THOROUGH, FAST = "RD hash (ours, thorough)", "RD hash (ours, fast)"
COMPACT = {THOROUGH: "RD hash (ours, thorough, compact file)", FAST: "RD hash (ours, fast, compact file)"}
OURS = (THOROUGH, FAST, *COMPACT.values())  # the families written as real files


def compact_row(row: dict, compact: dict) -> dict:
    """The row of the same hashed weights stored in the compact form (``--storage compact``):
    the same counted bits and top-1, the compact file's bytes and bits; family ``COMPACT[...]``."""
    fam = COMPACT[row["family"]]
    out = {k: v for k, v in row.items() if k != "layers" and not k.startswith("file")}
    out.update(compact, family=fam, setting=f"{fam} budget {row['budget']:g}", storage="compact")
    return out


def rd_plan(model, effort: str = "thorough", **kw):
    """``rd.prepare`` with the preset ``rd.EFFORTS[effort]`` (what ``compress --effort`` runs)."""
    e = rd.EFFORTS[effort]
    return rd.prepare(model, proxy=kw.pop("proxy", "synthetic"), granularities=kw.pop("granularities", e["granularities"]),
                      samples=e["samples"], **kw)


def rd_row(ev, plan, budget, family=THOROUGH, effort="thorough", files=None):
    """One RD setting: counted bits, top-1; with ``files`` (original path, eligible weights,
    folder) also the real file of ``store_codebooks`` (``_rd_files.real_file``). Returns (row,
    RDResult, hashed model with plain weights)."""
    e = rd.EFFORTS[effort]
    t0 = time.perf_counter()
    out, info = rd.rd_hash(ev.model, budget, plan=plan, refine_rounds=e["refine_rounds"], refine_all=e["refine_all"])
    secs = time.perf_counter() - t0
    res = ev.model_result(out)
    pw = info.bits_per_weight
    row = {"family": family, "setting": f"{family} budget {budget:g}", "ours": True, "budget": budget,
           "effort": effort, "fixed_bits": pw["fixed"], "entropy_bits": pw["entropy"], "table_bits": pw["table"],
           "weight_rel_error": info.weight_rel_error, "predicted_error": info.predicted_error,
           "hash_seconds": secs, "proxy": plan.proxy, "gain_correction": plan.gain_correction,
           "bias_correction": plan.bias_correction,
           "granularities": sorted({l.granularity for l in info.layers}), **res}
    if files is not None:
        original, n_eligible, folder = files
        t = time.perf_counter()
        slug = family.split("(")[-1].rstrip(")").replace("ours, ", "")
        row.update(real_file(ev.model, out, info, original, n_eligible, folder / f"rd_{slug}_{budget:g}.onnx"))
        row["file_seconds"] = time.perf_counter() - t
        t = time.perf_counter()
        row["compact"] = real_file(ev.model, out, info, original, n_eligible,
                                   folder / f"rd_{slug}_{budget:g}.compact.onnx", form="compact")
        row["compact"]["file_seconds"] = time.perf_counter() - t
    row["layers"] = [l.to_dict() for l in info.layers]
    return row, info, out


# --------------------------------------------------------------------------- proxies

def proxy_comparison(ev, plans: dict, budgets, single_rel: float = 0.2):
    """Which data-free sensitivity predicts the measured logit error and top-1 drop best.

    Settings: (i) every layer alone hashed (one codebook per tensor, the coarse candidate whose
    weighted relative error is closest to ``single_rel``), with the corrections; (ii) the whole
    model hashed by RD with each proxy's allocation at each budget. Every proxy predicts every
    setting, ``sqrt(Σ_l E_l(D_l))`` with its own responses; Spearman against the measured
    relative L2 logit difference and the top-1 drop."""
    from scipy.stats import spearmanr

    base = next(iter(plans.values()))
    views, stats = base.views, base.stats
    settings = []  # (label, kind, {layer: D}, result)
    for k, (v, lc) in enumerate(zip(views, base.candidates)):
        g = next(g for g in lc.grans if g.label == "tensor")
        g.pack()
        book, curve = g.books[0], g.curves[0]
        d0 = rd._distortion(v, base.vins[k], np.zeros_like(v.rows), False)
        rel = np.sqrt(np.maximum(curve.dist, 0) / d0) if d0 > 0 else np.zeros_like(curve.dist)
        ok = [j for j in range(len(rel)) if curve.factor[j] > 0]
        if not ok:
            continue
        j = min(ok, key=lambda i: abs(np.log(max(rel[i], 1e-12) / single_rel)))
        f, c = float(curve.factor[j]), float(curve.nms[j])
        hashed = rd._kde.hash_tensor(v.rows, bandwidth_factor=f, nms_radius=c * book.base * f).hashed
        m = rd.with_weights(ev.model, {v.weight: v.tensor(hashed)})
        rd.correct(ev.model, m, [v], [stats[k]], gain=base.gain_correction, bias=base.bias_correction)
        d = rd._distortion(v, base.vins[k], hashed, base.gain_correction)
        settings.append((f"{v.name} alone", "single layer", {k: d}, ev.model_result(m)))
    for name, plan in plans.items():
        for budget in budgets:
            out, info = rd.rd_hash(ev.model, budget, plan=plan)
            ds = {k: rd._distortion(v, plan.vins[k], rd.channel_rows(ConstantTensors(out).array(v.weight), v.axis),
                                    plan.gain_correction) for k, v in enumerate(views)}
            settings.append((f"RD allocation ({name}) budget {budget:g}", "whole model", ds, ev.model_result(out)))
    table = {}
    for name, plan in plans.items():
        pred = [float(np.sqrt(sum(float(plan.responses[k](d)) for k, d in ds.items()))) for _, _, ds, _ in settings]
        meas = [r["logit_rel_l2"] for *_, r in settings]
        drop = [ev.ref_top1 - r["top1"] for *_, r in settings]
        row = {}
        for kind in ("single layer", "whole model", "all"):
            idx = [i for i, s in enumerate(settings) if kind == "all" or s[1] == kind]
            if len(idx) >= 3:
                row[kind] = {"spearman_logit_error": float(spearmanr([pred[i] for i in idx], [meas[i] for i in idx])[0]),
                             "spearman_top1_drop": float(spearmanr([pred[i] for i in idx], [drop[i] for i in idx])[0]),
                             "settings": len(idx)}
        row["predicted"] = pred
        table[name] = row
    return {"settings": [{"label": l, "kind": k, **r} for l, k, _, r in settings], "proxies": table}


def slim_rows(rows, keep):
    """The rows as saved: per-layer details only for the settings in ``keep`` (our headline ones,
    by real and by counted bits; every setting's would make the file megabytes); the printed
    tables and the plot use all of them."""
    return [r if r["setting"] in keep else {k: v for k, v in r.items() if k != "layers"} for r in rows]


def comparison_bits(r):
    """The bits a row is compared by: real file bits where the row is a real file (ours,
    quantize_dynamic, fp16 file), else its counted entropy bits (codes + tables, no file format)."""
    fb = r.get("file_bits_per_eligible_weight")
    return fb if fb is not None else r.get("entropy_bits")


def counted_bits(r):
    return r.get("entropy_bits")


def within_bar(r, ref_top1, bar) -> bool:
    return "top1" in r and 100 * (ref_top1 - r["top1"]) <= bar + 1e-9


def headline(rows, ref_top1, bar, bits=comparison_bits):
    """Per family: the row with the fewest ``bits(row)`` whose top-1 is within ``bar`` points."""
    best = {}
    for r in rows:
        b = bits(r)
        if b is None or not within_bar(r, ref_top1, bar):
            continue
        if r["family"] not in best or b < bits(best[r["family"]]):
            best[r["family"]] = r
    return best


def headline_entry(r) -> dict:
    real_file = r.get("file_bits_per_eligible_weight") is not None
    return {"setting": r["setting"], "ours": r["ours"], "bits": comparison_bits(r),
            "bits_kind": "file" if real_file else "counted entropy", "entropy_bits": r.get("entropy_bits"),
            "fixed_bits": r.get("fixed_bits"), "file_bits": r.get("file_bits_per_eligible_weight"),
            "file_bytes": r.get("file_bytes"), "file_ratio": r.get("file_ratio"), "top1": r["top1"],
            "agreement": r.get("agreement"), "budget": r.get("budget")}


def verdict(best, best_counted) -> dict:
    """For each of our families: does it beat every baseline family? ``real``: our real file bits
    against each baseline's real file bits or, for a baseline without a real tool, its counted
    entropy bits (an ideal entropy coder's size, decoders and file format free: favours the
    baseline); ``counted``: our counted entropy bits against each baseline's counted entropy bits."""
    out = {}
    for fam in OURS:
        entry = {}
        for kind, table, bits in (("real", best, comparison_bits), ("counted", best_counted, counted_bits)):
            base = {f: r for f, r in table.items() if not r["ours"]}
            if fam not in table or not base:
                continue
            bf, br = min(base.items(), key=lambda kv: bits(kv[1]))
            entry[kind] = {"ours_setting": table[fam]["setting"], "ours_bits": bits(table[fam]),
                           "best_baseline_family": bf, "best_baseline_setting": br["setting"],
                           "best_baseline_bits": bits(br),
                           "best_baseline_bits_kind": "file" if br.get("file_bits_per_eligible_weight") is not None
                           else "counted entropy",
                           "beats_every_baseline": bits(table[fam]) < bits(br)}
        if entry:
            out[fam] = entry
    return out


def _f(x, fmt):
    return "-" if x is None else fmt.format(x)


def print_table(key, rows, ref_top1, bar):
    print(f"\n{key}: original top-1 {100 * ref_top1:.2f} %, bar {bar} points")
    print("fixed / entropy: COUNTED bits per eligible weight (codes + tables, baselines.stored_bits); file: REAL "
          "file bits per eligible weight (set_file_bits rule), only for real files (ours, quantize_dynamic, fp16 file)")
    print(f"{'setting':44s} {'fixed':>6s} {'entropy':>7s} {'file':>6s} {'ratio':>6s} {'top-1':>6s} {'drop':>6s} "
          f"{'agree':>6s} {'logit relL2':>11s}")
    for r in rows:
        if "top1" not in r:
            print(f"{r['setting']:44s} {_f(r.get('fixed_bits'), '{:6.2f}'):>6s} {_f(r.get('entropy_bits'), '{:7.2f}'):>7s} "
                  f"{_f(r.get('file_bits_per_eligible_weight'), '{:6.2f}'):>6s} {_f(r.get('file_ratio'), '{:6.2f}'):>6s} "
                  f"not run: {r.get('error', '?')[:60]}")
            continue
        print(f"{r['setting']:44s} {_f(r.get('fixed_bits'), '{:6.2f}'):>6s} {_f(r.get('entropy_bits'), '{:7.2f}'):>7s} "
              f"{_f(r.get('file_bits_per_eligible_weight'), '{:6.2f}'):>6s} {_f(r.get('file_ratio'), '{:6.2f}'):>6s} "
              f"{100 * r['top1']:6.2f} {100 * (ref_top1 - r['top1']):+6.2f} {100 * r['agreement']:6.2f} "
              f"{r['logit_rel_l2']:11.4f}")
    best = headline(rows, ref_top1, bar)
    best_counted = headline(rows, ref_top1, bar, counted_bits)
    print(f"\nheadline ({key}): per family, the fewest bits per eligible weight within {bar} points "
          "(real file bits where a real file exists, else counted entropy bits)")
    for fam, r in sorted(best.items(), key=lambda kv: comparison_bits(kv[1])):
        kind = "file" if r.get("file_bits_per_eligible_weight") is not None else "counted"
        print(f"  {fam:40s} {comparison_bits(r):5.2f} {kind:7s} (entropy {_f(r.get('entropy_bits'), '{:5.2f}')}, "
              f"fixed {_f(r.get('fixed_bits'), '{:5.2f}')})  {r['setting']}, top-1 {100 * r['top1']:.2f}")
    for fam, v in verdict(best, best_counted).items():
        for kind, e in v.items():
            print(f"  {fam} ({kind}): {e['ours_bits']:.3f} vs best baseline {e['best_baseline_family']} "
                  f"{e['best_baseline_bits']:.3f} ({e['best_baseline_bits_kind']}): "
                  f"{'BEATS every baseline' if e['beats_every_baseline'] else 'does NOT beat every baseline'}")
    return best, best_counted


def plot(key, rows, ref_top1, bar, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fams = sorted({r["family"] for r in rows}, key=lambda f: (not f.startswith("RD hash (ours"), f))
    plain = [f for f in fams if not f.endswith("+ corr.") and not f.startswith("RD hash")]
    colors = {f: plt.cm.tab10(i % 10) for i, f in enumerate(plain)}
    fig, axes = plt.subplots(1, 3, figsize=(20, 6), sharey=True)
    kinds = (("entropy_bits", "counted bits (entropy codes + tables)", 9),
             ("fixed_bits", "counted bits (fixed-length codes + tables)", 9),
             ("file_bits_per_eligible_weight", "REAL file bits (set_file_bits rule)", 17))
    for ax, (kind, what, xmax) in zip(axes, kinds):
        for fam in fams:
            rs = sorted((r for r in rows if r["family"] == fam and r.get(kind) is not None and "top1" in r),
                        key=lambda r: r[kind])
            if not rs:
                continue
            if fam == THOROUGH:
                style = dict(color="black", lw=2.5, marker="o", ms=6)
            elif fam == FAST:
                style = dict(color="black", lw=1.5, ls="--", marker="s", ms=5)
            elif fam == COMPACT[THOROUGH]:
                style = dict(color="red", lw=2.5, marker="o", ms=6)
            elif fam == COMPACT[FAST]:
                style = dict(color="red", lw=1.5, ls="--", marker="s", ms=5)
            elif fam.startswith("RD hash"):
                style = dict(color="grey", lw=1.2, ls=":", marker="o", ms=4)
            elif fam.endswith("+ corr."):
                style = dict(color=colors.get(fam[:-len(" + corr.")], "grey"), lw=1, ls="--", marker="x", ms=4)
            elif fam.endswith("(file)"):
                style = dict(color=colors[fam], lw=0, marker="D", ms=7)
            else:
                style = dict(color=colors[fam], lw=1, marker=".", ms=5)
            ax.plot([r[kind] for r in rs], [100 * r["top1"] for r in rs], label=fam, **style)
        ax.axhline(100 * ref_top1, color="grey", lw=0.8)
        ax.axhline(100 * ref_top1 - bar, color="grey", lw=0.8, ls="--")
        ax.set_xlabel(f"bits per eligible weight: {what}")
        ax.set_xlim(1, xmax)
        ax.set_ylim(max(0, 100 * ref_top1 - 6), 100 * ref_top1 + 1.5)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("top-1 %")
    axes[1].legend(fontsize=6.5, loc="lower right", ncol=2)
    axes[2].legend(fontsize=6.5, loc="lower right")
    fig.suptitle(f"{key}: top-1 vs bits per eligible weight (dashed line: the {bar}-point bar; "
                 "dashed curves: baselines with the same corrections as ours)", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"wrote {path}")


def after_hashing_rows(ev, rows, best, outs, original, n_eligible, files_dir) -> dict:
    """Exact merge and the split analysis after hashing (``_rd_files.after_hashing``) on the
    headline RD output (thorough, by real file bits), the fast default at budget 0.1, and the
    old default (per-layer KDE, ε = 0.01)."""
    picks = []
    if THOROUGH in best:
        picks.append(("RD thorough (headline)", best[THOROUGH]["setting"]))
    fast = f"{FAST} budget 0.1"
    if fast in outs:
        picks.append(("RD fast (default), budget 0.1", fast))
    out = {}
    for label, setting in picks:
        r = next(x for x in rows if x["setting"] == setting)
        t = time.perf_counter()
        out[label] = {"setting": setting, "top1": r["top1"], "entropy_bits": r["entropy_bits"],
                      "file_bits_per_eligible_weight": r.get("file_bits_per_eligible_weight"),
                      **after_hashing(outs[setting]), "seconds": time.perf_counter() - t}
    t = time.perf_counter()
    res = old_default(ev.model)
    entry = {"setting": "KDE per layer, ε = 0.01 (old default: HashConfig(method='kde'))",
             **{k: v for k, v in ev.model_result(res.model).items() if k in ("top1", "agreement", "logit_rel_l2")}}
    if files_dir is not None:
        f = store_file(res, original, n_eligible, files_dir / "kde_eps0.01.onnx")
        entry.update({k: f[k] for k in ("file_bytes", "file_bits_per_eligible_weight", "file_ratio",
                                        "file_decodes_exactly")})
    entry.update(after_hashing(res.model))
    entry["seconds"] = time.perf_counter() - t
    out["old default: KDE ε = 0.01"] = entry
    for label, e in out.items():
        m, c = e["merge"], e["split"]["convs"]
        print(f"  after hashing, {label}: {m['channels_removed']} channels merged; conv kernels unique "
              f"{100 * c['unique_fraction']:.2f} %, zero {100 * c['zero_fraction']:.2f} % "
              f"({c['kernels_total']} kernels); --split auto rewrites {e['split']['layers_split_auto']} layers",
              flush=True)
    return out


def save_model_entry(out_path: Path, key: str, entry: dict, lock_dir: Path) -> None:
    """Write ``entry`` as ``models[key]`` of ``out_path``, keeping the other models' results as the
    file has them now (several processes may run different models at once: a lock file in the
    cache serialises the read-modify-write)."""
    import fcntl

    lock_dir.mkdir(parents=True, exist_ok=True)
    with open(lock_dir / "rd.json.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        data = {"models": {}}
        if out_path.exists():
            try:
                data = json.loads(out_path.read_text())
            except json.JSONDecodeError:
                pass
        data.pop("seconds_total", None)
        data["budgets"] = list(DEFAULT_BUDGETS)
        data.setdefault("models", {})[key] = entry
        write_json(out_path, data)


DEFAULT_BUDGETS = (0.05, 0.075, 0.1, 0.125, 0.15, 0.175, 0.2, 0.25, 0.3)
ABLATION_BUDGETS = (0.1, 0.15, 0.2)
PROXY_BUDGETS = (0.1, 0.2)
CORRECTED_BASELINES = ("uniform", "kmeans")  # families also run with the corrections


def main(argv=None):
    ap = shared_parser(__doc__, "rd.json")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--cache", default="/tmp/rd_cache")
    ap.add_argument("--files", default=None, help="folder of the real files written (default CACHE/files)")
    ap.add_argument("--budgets", default=",".join(str(b) for b in DEFAULT_BUDGETS))
    ap.add_argument("--no-fast", action="store_true", help="without the rows of rd.EFFORTS['fast']")
    ap.add_argument("--no-files", action="store_true", help="without the real files of ours")
    ap.add_argument("--no-baselines", action="store_true")
    ap.add_argument("--no-real-baselines", action="store_true", help="without quantize_dynamic / fp16 files")
    ap.add_argument("--no-ablations", action="store_true")
    ap.add_argument("--no-proxies", action="store_true")
    ap.add_argument("--no-after-hashing", action="store_true", help="without merge/split after hashing")
    ap.add_argument("--figures", default=str(ROOT / "docs" / "figures"))
    args = ap.parse_args(argv)
    shared, cache = Path(args.shared), Path(args.cache)
    cache.mkdir(parents=True, exist_ok=True)
    budgets = [float(b) for b in args.budgets.split(",") if b]
    out_path = Path(args.out)
    for key in args.models.split(","):
        model_file, data_file, bar, batch = MODELS[key]
        t0 = time.perf_counter()
        original = shared / model_file
        ev = Evaluator(original, shared / data_file, cache, batch)
        layers = eligible(ev.model)
        n_eligible = int(sum(w.size for _, w, _ in layers))
        files_dir = Path(args.files or cache / "files") / original.stem
        files = None if args.no_files else (original, n_eligible, files_dir)
        timings = {}
        rows, outs = [], {}  # outs: setting -> hashed model (plain weights), for merge/split after hashing
        for fam, effort in ((THOROUGH, "thorough"), (FAST, "fast")):
            if effort == "fast" and args.no_fast:
                continue
            t = time.perf_counter()
            p = rd_plan(ev.model, effort)
            if effort == "thorough":
                plan = p
            timings[f"rd_prepare_{effort}"] = p.seconds
            for b in budgets:
                row, info, m = rd_row(ev, p, b, fam, effort, files)
                rows.append(row)
                cb = None
                if "compact" in row:
                    rows.append(compact_row(row, row.pop("compact")))
                    cb = rows[-1]["file_bits_per_eligible_weight"]
                outs[row["setting"]] = m
                fb = row.get("file_bits_per_eligible_weight")
                print(f"  {row['setting']}: {row['entropy_bits']:.3f} counted entropy bits, "
                      f"{'-' if fb is None else f'{fb:.3f}'} file bits"
                      f"{'' if cb is None else f' ({cb:.3f} compact)'}, top-1 {100 * row['top1']:.2f}, "
                      f"logit relL2 {row['logit_rel_l2']:.3f} (predicted {row['predicted_error']:.3f}), "
                      f"{row['hash_seconds']:.0f} s", flush=True)
            timings[f"rd_budgets_{effort}"] = time.perf_counter() - t
        proxies = None
        if not args.no_proxies:
            t = time.perf_counter()
            plans = {"synthetic": plan}
            for name in ("bn", "params"):
                plans[name] = dataclasses.replace(
                    plan, proxy=name, responses=rd.sensitivities(ev.model, plan.views, name, stats=plan.stats,
                                                                 gain_correction=plan.gain_correction,
                                                                 bias_correction=plan.bias_correction))
            proxies = proxy_comparison(ev, plans, PROXY_BUDGETS)
            for name, r in proxies["proxies"].items():
                print(f"  proxy {name}: " + ", ".join(f"{k}: logit {v['spearman_logit_error']:+.2f} / top-1 "
                                                       f"{v['spearman_top1_drop']:+.2f} (n={v['settings']})"
                                                       for k, v in r.items() if k != "predicted"), flush=True)
            timings["proxy_comparison"] = time.perf_counter() - t
        if not args.no_ablations:
            t = time.perf_counter()
            ablations = {  # the same budgets without one ingredient
                "RD hash, no corrections": dict(gain_correction=False, bias_correction=False),
                "RD hash, per-tensor only": dict(granularities=("tensor",), responses=plan.responses),
            }
            for fam, kw in ablations.items():
                p = rd_plan(ev.model, "thorough", **kw)
                for b in ABLATION_BUDGETS:
                    rows.append(rd_row(ev, p, b, family=fam)[0])
            timings["ablations"] = time.perf_counter() - t
        if not args.no_baselines:
            t = time.perf_counter()
            for fam, lab, fn in baseline_settings():
                rows.append(baseline_row(fam, lab, fn, layers, ev))
            for fam, lab, fn in baseline_settings():
                if fam.split()[0] in CORRECTED_BASELINES:
                    rows.append(baseline_row(fam, lab, fn, layers, ev, corrected=(plan.views, plan.stats)))
            timings["baselines"] = time.perf_counter() - t
        if not args.no_real_baselines:
            t = time.perf_counter()
            for per_channel, unsigned in QUANTIZE_DYNAMIC:
                rows.append(quantize_dynamic_row(original, ev, n_eligible, files_dir, per_channel=per_channel,
                                                 unsigned=unsigned))
            rows.append(fp16_file_row(original, ev, n_eligible, files_dir))
            timings["real_baselines"] = time.perf_counter() - t
        best, best_counted = print_table(key, rows, ev.ref_top1, bar)
        plot(key, rows, ev.ref_top1, bar, Path(args.figures) / f"rd_{original.stem}.png")
        after = None
        if not args.no_after_hashing:
            t = time.perf_counter()
            after = after_hashing_rows(ev, rows, best, outs, original, n_eligible, None if args.no_files else files_dir)
            timings["after_hashing"] = time.perf_counter() - t
        keep = {t[f]["setting"] for t in (best, best_counted) for f in OURS if f in t}  # per-layer rows kept
        entry = {"model": model_file, "data": data_file, "n": int(len(ev.y)), "original_top1": ev.ref_top1,
                 "bar_points": bar, "original_file_bytes": original.stat().st_size, "eligible_weights": n_eligible,
                 "eligible_layers": len(layers), "budgets": budgets, "rows": slim_rows(rows, keep),
                 "headline": {f: headline_entry(r) for f, r in best.items()},
                 "headline_counted": {f: headline_entry(r) for f, r in best_counted.items()},
                 "verdict": verdict(best, best_counted), "after_hashing": after,
                 "proxy_comparison": proxies, "timings": timings,
                 "seconds": time.perf_counter() - t0, "evaluations_run": ev.runs,
                 "evaluation_seconds": ev.seconds}
        print(f"{key}: {time.perf_counter() - t0:.0f} s ({ev.runs} evaluations run, {ev.seconds:.0f} s of them)")
        save_model_entry(out_path, key, entry, cache)


if __name__ == "__main__":
    main()
