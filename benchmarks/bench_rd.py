"""Rate-distortion hashing vs data-free baselines: top-1 against stored bits per eligible weight.

For each shared model: RD hashing (``redpp_onnx.hashing.rd``) at several output-error budgets,
and every baseline setting of ``redpp_onnx.hashing.baselines`` (uniform symmetric/asymmetric,
per tensor/per channel, 3-8 bits; k-means per tensor K 8-256 and per output channel K 4-32;
fp16), all applied to the eligible weights (``scan_layers`` defaults: Conv group 1, Gemm, MatMul
with constant weights) and counted by the same code (``baselines.stored_bits``): fixed-length
bits and zeroth-order-entropy bits per eligible weight, tables included. Top-1 on the exact data
(CIFAR-10 exact 1,017-image subset, ImageNet 1,000-image sample), with agreement and the
relative L2 logit difference against the original. onnxruntime runs with one intra-op thread.

Prints one table per model and the headline (per method family, the fewest entropy bits within
the accuracy bar: 0.3 points for the CIFAR ResNets, 0.5 for EfficientNet-Lite0); writes
``benchmarks/results/rd.json`` and ``docs/figures/rd_<model>.png``. Evaluations are cached on
disk by a digest of the model's weights (``--cache``, default /tmp/rd_cache), so a re-run only
evaluates what changed.

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

from _common import shared_parser, write_json  # noqa: E402  (benchmarks/)

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


def quantize_dynamic_row(model_path: Path):
    """Hook for onnxruntime's ``quantize_dynamic`` (a real file, measured separately): return a
    row dict like the others (``bits`` from the file) or None. Not measured here."""
    return None


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


def rd_row(ev, plan, budget, family="RD hash (ours)"):
    t0 = time.perf_counter()
    out, info = rd.rd_hash(ev.model, budget, plan=plan)
    secs = time.perf_counter() - t0
    res = ev.model_result(out)
    pw = info.bits_per_weight
    return {"family": family, "setting": f"{family} budget {budget:g}", "ours": True, "budget": budget,
            "fixed_bits": pw["fixed"], "entropy_bits": pw["entropy"], "table_bits": pw["table"],
            "weight_rel_error": info.weight_rel_error, "predicted_error": info.predicted_error,
            "hash_seconds": secs, "proxy": plan.proxy, "gain_correction": plan.gain_correction,
            "bias_correction": plan.bias_correction,
            "granularities": sorted({l.granularity for l in info.layers}),
            "layers": [l.to_dict() for l in info.layers], **res}, info


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


def slim_rows(rows, best):
    """The rows as saved: per-layer details only for the headline settings (every setting's would make
    the file megabytes); the printed tables and the plot use all of them."""
    keep = {r["setting"] for r in best.values()}
    return [r if r["setting"] in keep else {k: v for k, v in r.items() if k != "layers"} for r in rows]


def headline(rows, ref_top1, bar):
    """Per family: the row with the fewest entropy bits whose top-1 is within ``bar`` points."""
    best = {}
    for r in rows:
        if 100 * (ref_top1 - r["top1"]) <= bar + 1e-9:
            if r["family"] not in best or r["entropy_bits"] < best[r["family"]]["entropy_bits"]:
                best[r["family"]] = r
    return best


def print_table(key, rows, ref_top1, bar):
    print(f"\n{key}: original top-1 {100 * ref_top1:.2f} %, bar {bar} points")
    print(f"{'setting':36s} {'fixed':>6s} {'entropy':>7s} {'top-1':>6s} {'drop':>6s} {'agree':>6s} {'logit relL2':>11s}")
    for r in rows:
        print(f"{r['setting']:36s} {r['fixed_bits']:6.2f} {r['entropy_bits']:7.2f} {100 * r['top1']:6.2f} "
              f"{100 * (ref_top1 - r['top1']):+6.2f} {100 * r['agreement']:6.2f} {r['logit_rel_l2']:11.4f}")
    best = headline(rows, ref_top1, bar)
    print(f"\nheadline ({key}): fewest entropy bits per eligible weight within {bar} points")
    for fam, r in sorted(best.items(), key=lambda kv: kv[1]["entropy_bits"]):
        print(f"  {fam:28s} {r['entropy_bits']:5.2f} (fixed {r['fixed_bits']:5.2f})  {r['setting']}, "
              f"top-1 {100 * r['top1']:.2f}")
    return best


def plot(key, rows, ref_top1, bar, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fams = sorted({r["family"] for r in rows}, key=lambda f: (not f.startswith("RD hash (ours)"), f))
    plain = [f for f in fams if not f.endswith("+ corr.") and not f.startswith("RD hash")]
    colors = {f: plt.cm.tab10(i % 10) for i, f in enumerate(plain)}
    fig, axes = plt.subplots(1, 2, figsize=(14, 6), sharey=True)
    for ax, kind in zip(axes, ("entropy_bits", "fixed_bits")):
        for fam in fams:
            rs = sorted((r for r in rows if r["family"] == fam), key=lambda r: r[kind])
            if fam == "RD hash (ours)":
                style = dict(color="black", lw=2.5, marker="o", ms=6)
            elif fam.startswith("RD hash"):
                style = dict(color="grey", lw=1.2, ls=":", marker="o", ms=4)
            elif fam.endswith("+ corr."):
                style = dict(color=colors.get(fam[:-len(" + corr.")], "grey"), lw=1, ls="--", marker="x", ms=4)
            else:
                style = dict(color=colors[fam], lw=1, marker=".", ms=5)
            ax.plot([r[kind] for r in rs], [100 * r["top1"] for r in rs], label=fam, **style)
        ax.axhline(100 * ref_top1, color="grey", lw=0.8)
        ax.axhline(100 * ref_top1 - bar, color="grey", lw=0.8, ls="--")
        ax.set_xlabel(f"stored bits per eligible weight ({'entropy' if kind == 'entropy_bits' else 'fixed-length'} "
                      "codes, tables included)")
        ax.set_xlim(1, 9)
        ax.set_ylim(max(0, 100 * ref_top1 - 6), 100 * ref_top1 + 1.5)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("top-1 %")
    axes[1].legend(fontsize=6.5, loc="lower right", ncol=2)
    fig.suptitle(f"{key}: top-1 vs stored bits per eligible weight (dashed line: the {bar}-point bar; "
                 "dashed curves: baselines with the same corrections as ours)", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"wrote {path}")


DEFAULT_BUDGETS = (0.05, 0.075, 0.1, 0.125, 0.15, 0.175, 0.2, 0.25, 0.3)
ABLATION_BUDGETS = (0.1, 0.15, 0.2)
PROXY_BUDGETS = (0.1, 0.2)
CORRECTED_BASELINES = ("uniform", "kmeans")  # families also run with the corrections


def main(argv=None):
    ap = shared_parser(__doc__, "rd.json")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--cache", default="/tmp/rd_cache")
    ap.add_argument("--budgets", default=",".join(str(b) for b in DEFAULT_BUDGETS))
    ap.add_argument("--no-baselines", action="store_true")
    ap.add_argument("--no-ablations", action="store_true")
    ap.add_argument("--no-proxies", action="store_true")
    ap.add_argument("--figures", default=str(ROOT / "docs" / "figures"))
    args = ap.parse_args(argv)
    shared, cache = Path(args.shared), Path(args.cache)
    cache.mkdir(parents=True, exist_ok=True)
    budgets = [float(b) for b in args.budgets.split(",") if b]
    out_path = Path(args.out)
    out = {"models": {}}
    if out_path.exists():  # keep the other models' results
        try:
            out = json.loads(out_path.read_text())
        except json.JSONDecodeError:
            pass
    out["budgets"] = budgets
    t_all = time.perf_counter()
    for key in args.models.split(","):
        model_file, data_file, bar, batch = MODELS[key]
        t0 = time.perf_counter()
        ev = Evaluator(shared / model_file, shared / data_file, cache, batch)
        layers = eligible(ev.model)
        timings = {}
        rows = []
        t = time.perf_counter()
        plan = rd.prepare(ev.model, proxy="synthetic")
        timings["rd_prepare"] = plan.seconds
        for b in budgets:
            row, info = rd_row(ev, plan, b)
            rows.append(row)
            print(f"  {row['setting']}: {row['entropy_bits']:.3f} bits, top-1 {100 * row['top1']:.2f}, "
                  f"logit relL2 {row['logit_rel_l2']:.3f} (predicted {row['predicted_error']:.3f})", flush=True)
        timings["rd_budgets"] = time.perf_counter() - t
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
                p = rd.prepare(ev.model, **kw)
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
        external = quantize_dynamic_row(shared / model_file)
        if external is not None:
            rows.append(external)
        best = print_table(key, rows, ev.ref_top1, bar)
        plot(key, rows, ev.ref_top1, bar, Path(args.figures) / f"rd_{Path(model_file).stem}.png")
        out["models"][key] = {"model": model_file, "data": data_file, "n": int(len(ev.y)),
                              "original_top1": ev.ref_top1, "bar_points": bar,
                              "eligible_weights": int(sum(w.size for _, w, _ in layers)),
                              "eligible_layers": len(layers), "rows": slim_rows(rows, best),
                              "headline": {f: {"setting": r["setting"], "entropy_bits": r["entropy_bits"],
                                               "fixed_bits": r["fixed_bits"], "top1": r["top1"]}
                                           for f, r in best.items()},
                              "proxy_comparison": proxies, "timings": timings,
                              "seconds": time.perf_counter() - t0, "evaluations_run": ev.runs,
                              "evaluation_seconds": ev.seconds}
        print(f"{key}: {time.perf_counter() - t0:.0f} s ({ev.runs} evaluations run, {ev.seconds:.0f} s of them)")
        write_json(out_path, out)
    out["seconds_total"] = time.perf_counter() - t_all
    write_json(out_path, out)


if __name__ == "__main__":
    main()
