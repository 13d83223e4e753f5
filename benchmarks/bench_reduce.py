"""Channel reduction (issue 12): MACs removed vs top-1, ours against the baselines, same data.

Per shared model, every method removes channels of the same groups (``passes/reduce.py``:
single-producer groups whose consumers are Conv / Gemm / MatMul) and is measured by the same code:

* **ours** (``--target-macs F``, rule ``redpp``, the defaults: the twin-measured plan where it
  applies, ``passes/twin_plan.py``, else the closed-form one: moment-walk statistics, pruning or
  scale-matched merging with mean compensation, global cost-per-MAC order; then the refit), F in
  ``TARGETS``, kept channel counts multiples of 8 (the default: onnxruntime's Conv blocks) and in any
  count (``multiple = 1``); and ours with the closed-form plan (``--reduce-plan cost``) and without
  the refit (``--no-refit``, closed-form plan);
* **L1 pruning**: the same share of every group's channels with the smallest filter L1 norm,
  pruned, no compensation (``_reduce_baselines.l1_decisions``);
* **Neuron-Merging-style**: the same L1 selection, merged BatchNorm-aware into the most similar
  kept filter (cosine with the bias mismatch, scale from norms and BatchNorm ratios), no mean
  compensation (``_reduce_baselines.neuron_merging_decisions``);
* **old percentile rule** (``--merge-rule percentile``) at α in ``OLD_ALPHAS``;
* two variants of ours: the per-block allocation (``--alpha`` α in ``BLOCK_ALPHAS``: α^l by layer
  position, the same rule in each layer) instead of the global order, and residual-coupled groups
  included (``ReduceConfig.coupled``: a channel leaves every producer of an Add at once, pruned).

Each point: eligible MACs and params removed (``scan_layers``), top-1 / agreement / logit drift
on the exact data (``bench_rd.Evaluator``, cached, one onnxruntime thread), and two data-free
predictions of the drift: ``predicted_cost`` (ours only: the summed relative costs of the rule)
and ``synthetic_drift`` (every method: relative L2 between the original's and the reduced model's
logits on 64 standard-normal inputs, no data). Spearman rank correlations of each prediction
against the measured top-1 drop, per method and pooled. Per-layer shares of ours are kept for
every target.

    python benchmarks/bench_reduce.py [--models resnet20,resnet56,efficientnet]

Writes ``benchmarks/results/reduce.json`` (this run's models replace theirs) and
``docs/figures/reduce_<model>.png``; ``render_results.py`` puts them in docs/RESULTS.md.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import onnx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import _reduce_baselines as RB  # noqa: E402
from _common import shared_parser, write_json  # noqa: E402
from bench_rd import MODELS, Evaluator  # noqa: E402

from redpp_onnx.analysis.coupling import analyze_coupling  # noqa: E402
from redpp_onnx.analysis.layers import scan_layers  # noqa: E402
from redpp_onnx.hashing import rd  # noqa: E402
from redpp_onnx.passes import reduce as R  # noqa: E402
from redpp_onnx.passes.merge import MergeConfig, MergePass  # noqa: E402

TARGETS = (0.95, 0.9, 0.85, 0.8, 0.75, 0.7, 0.65, 0.6)
SHARES = (0.1, 0.2, 0.3, 0.4, 0.5)
OLD_ALPHAS = (0.0003, 0.001, 0.003)
OURS8, OURS1 = "ours (redpp, multiples of 8)", "ours (redpp, any count)"
NOFIT8, NOFIT1 = "ours without refit (multiples of 8)", "ours without refit (any count)"
COST8 = "ours, closed-form plan (multiples of 8)"
BLOCK, COUPLED = "ours, per-block α (multiples of 8)", "ours + residual-coupled groups (multiples of 8)"
L1, NM, OLD = "L1 pruning", "Neuron-Merging-style", "old percentile rule"
METHODS = (OURS8, OURS1, COST8, NOFIT8, NOFIT1, BLOCK, COUPLED, L1, NM, OLD)
BLOCK_ALPHAS = (0.1, 0.2, 0.3, 0.4)
COUPLED_TARGETS = (0.95, 0.9, 0.85, 0.8)
SYNTHETIC_SAMPLES = 64
SHARE_TARGETS = (0.9, 0.8, 0.7)  # per-layer shares drawn for these targets
BARS = {"resnet20": 0.5, "resnet56": 0.5, "efficientnet": 1.0}  # issue 12's accuracy bars (points)


def counts(model: onnx.ModelProto) -> tuple:
    scan = scan_layers(model)
    return sum(l.macs or 0 for l in scan.layers), sum(l.params for l in scan.layers)


class Drift:
    """Data-free drift: relative L2 of the logits on standard-normal inputs (``rd``'s synthetic
    inputs), original vs a variant."""

    def __init__(self, model: onnx.ModelProto):
        self.feeds = rd._synthetic_inputs(model, SYNTHETIC_SAMPLES, seed=0)
        self.ref = self.run(model)

    def run(self, model):
        sess = rd._session(model)
        return np.asarray(sess.run(None, self.feeds)[0], np.float64)

    def __call__(self, model) -> float:
        out = self.run(model)
        return float(np.linalg.norm(out - self.ref) / np.linalg.norm(self.ref))


def point(method, setting, model, ev, drift, macs0, params0, **extra) -> dict:
    macs, params = counts(model)
    res = ev.model_result(model)
    row = {"method": method, "setting": setting, "macs_removed": 1 - macs / macs0,
           "params_removed": 1 - params / params0, "synthetic_drift": drift(model), **res, **extra}
    print(f"  {method:32s} {setting:12s} MACs -{100 * row['macs_removed']:5.1f} %  params "
          f"-{100 * row['params_removed']:5.1f} %  top-1 {100 * res['top1']:6.2f}  agree {100 * res['agreement']:6.2f}  "
          f"synthetic drift {row['synthetic_drift']:.3f}", flush=True)
    return row


def spearman(rows, key: str) -> dict:
    from scipy.stats import spearmanr

    out = {}
    for m in list(METHODS) + ["all"]:
        rs = [r for r in rows if (m == "all" or r["method"] == m) and r.get(key) is not None]
        if len(rs) >= 3:
            rho = spearmanr([r[key] for r in rs], [r["drop"] for r in rs]).statistic
            out[m] = {"rho": None if not np.isfinite(rho) else float(rho), "n": len(rs)}
    return out


def best_within(rows, bar: float) -> dict:
    """Per method, the most MACs removed with top-1 within ``bar`` points of the original."""
    out = {}
    for m in METHODS:
        ok = [r for r in rows if r["method"] == m and 100 * r["drop"] <= bar + 1e-9]
        if ok:
            b = max(ok, key=lambda r: r["macs_removed"])
            out[m] = {"setting": b["setting"], "macs_removed": b["macs_removed"], "top1": b["top1"],
                      "drop_points": 100 * b["drop"]}
    return out


def plot(key, rows, ref_top1, bar, path: Path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(15, 5.5), gridspec_kw={"width_ratios": [1, 1.2]})
    styles = {OURS8: dict(color="black", lw=2.2, marker="o"), OURS1: dict(color="black", lw=1.2, ls="--", marker="s"),
              NOFIT8: dict(color="tab:purple", lw=1.2, marker="o", ms=4),
              COST8: dict(color="tab:brown", lw=1.2, marker="o", ms=4),
              NOFIT1: dict(color="tab:purple", lw=1, ls="--", marker="s", ms=4),
              BLOCK: dict(color="grey", lw=1.2, ls=":", marker="D"), COUPLED: dict(color="tab:green", lw=1, marker="*"),
              L1: dict(color="tab:blue", marker="v"), NM: dict(color="tab:orange", marker="^"),
              OLD: dict(color="tab:red", marker="x")}
    for m in METHODS:
        rs = sorted((r for r in rows if r["method"] == m), key=lambda r: r["macs_removed"])
        if rs:
            ax.plot([100 * r["macs_removed"] for r in rs], [100 * r["top1"] for r in rs], label=m, **styles[m])
    ax.axhline(100 * ref_top1, color="grey", lw=0.8)
    ax.axhline(100 * ref_top1 - bar, color="grey", lw=0.8, ls="--", label=f"bar: -{bar} points")
    ax.set_xlabel("eligible MACs removed (%)")
    ax.set_ylabel("top-1 (%)")
    ax.set_ylim(max(0, 100 * ref_top1 - 12), 100 * ref_top1 + 1)
    ax.set_title(f"{key}: channel reduction, data-free (no fine-tuning)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    for r, color in zip((x for x in rows if x["method"] == OURS8 and x.get("target_macs") in SHARE_TARGETS),
                        ("tab:green", "tab:purple", "tab:brown")):
        ls = r["layers"]
        bx.plot(range(len(ls)), [100 * (1 - l["after"] / l["before"]) for l in ls], marker="o", ms=3, color=color,
                label=f"{r['setting']}: MACs -{100 * r['macs_removed']:.1f} %, top-1 {100 * r['top1']:.2f}")
    bx.set_xlabel("reducible layer (graph order)")
    bx.set_ylabel("channels removed (%)")
    bx.set_title("ours (multiples of 8): share removed per layer")
    bx.grid(alpha=0.3)
    bx.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"wrote {path}")


def run_model(key, shared: Path, cache: Path, figures: Path, targets=TARGETS, variants: bool = True) -> dict:
    model_file, data_file, _, batch = MODELS[key]
    bar = BARS[key]
    t0 = time.perf_counter()
    ev = Evaluator(shared / model_file, shared / data_file, cache, batch)
    model = ev.model
    macs0, params0 = counts(model)
    drift = Drift(model)
    t1 = time.perf_counter()
    twin = R.refit_twin(model)  # one synthetic twin for every refit of this model (data-free)
    twin_seconds = time.perf_counter() - t1
    print(f"  synthetic twin: {twin.images} images, {twin_seconds:.1f} s", flush=True)
    rows = []
    for label, multiple, refit, how in ((OURS8, 8, True, "auto"), (OURS1, 1, True, "auto"), (COST8, 8, True, "cost"),
                                        (NOFIT8, 8, False, "auto"), (NOFIT1, 1, False, "auto")):
        for f in targets:
            res = R.reduce_channels(model, R.ReduceConfig(target_macs=f, multiple=multiple, refit=refit, plan=how),
                                    twin=twin)
            if label == OURS8 and f == targets[0]:
                print(f"  {res.notes[0]}", flush=True)
            shares = [{"layer": l.name, "before": l.channels_before, "after": l.channels_after,
                       "pruned": l.pruned, "merged": l.merged} for l in res.layers if l.channels_before]
            rows.append(point(label, f"F = {f:g}", res.model, ev, drift, macs0, params0, target_macs=f,
                              predicted_cost=res.predicted_cost, twin_drift=res.twin_drift, layers=shares,
                              seconds=res.seconds))
    for a in BLOCK_ALPHAS if variants else ():  # the other allocation: α^l by the per-block strategy, same rule per layer
        res = R.reduce_channels(model, R.ReduceConfig(alpha=a), twin=twin)
        rows.append(point(BLOCK, f"α = {a:g}", res.model, ev, drift, macs0, params0, alpha=a,
                          predicted_cost=res.predicted_cost, twin_drift=res.twin_drift, seconds=res.seconds))
    for f in COUPLED_TARGETS if variants else ():  # residual-coupled groups too (ReduceConfig.coupled, experimental)
        res = R.reduce_channels(model, R.ReduceConfig(target_macs=f, coupled=True), twin=twin)
        rows.append(point(COUPLED, f"F = {f:g}", res.model, ev, drift, macs0, params0, target_macs=f,
                          predicted_cost=res.predicted_cost, twin_drift=res.twin_drift, seconds=res.seconds))
    coupling = analyze_coupling(model)
    groups, _, reasons, macs_total = R.plan(model, R.ReduceConfig(alpha=0.0), coupling)
    for label, fn in ((L1, RB.l1_decisions), (NM, RB.neuron_merging_decisions)):
        for s in SHARES:
            dec = fn(model, coupling, groups, s)
            res = R.apply_plan(model, coupling, groups, dec, reasons, macs_total, compensate=False)
            merged = sum(p is not None for d in dec.values() for _, p, _, _ in d)
            rows.append(point(label, f"share {s:g}", res.model, ev, drift, macs0, params0, share=s, merged=merged))
    for a in OLD_ALPHAS:
        res = MergePass(MergeConfig(alpha=a, rule="percentile")).run(model)
        rows.append(point(OLD, f"α = {a:g}", res.model, ev, drift, macs0, params0, alpha=a))
    for r in rows:
        r["drop"] = ev.ref_top1 - r["top1"]
    plot(key, rows, ev.ref_top1, bar, figures / f"reduce_{Path(model_file).stem}.png")
    entry = {"model": model_file, "data": data_file, "n": int(len(ev.y)), "original_top1": ev.ref_top1,
             "bar_points": bar, "eligible_macs": int(macs0), "eligible_params": int(params0),
             "groups": len(groups), "group_channels": int(sum(len(g.classes) for g in groups)),
             "rows": rows, "best_within_bar": best_within(rows, bar),
             "spearman": {"synthetic_drift": spearman(rows, "synthetic_drift"),
                          "predicted_cost": spearman(rows, "predicted_cost"),
                          "twin_drift": spearman(rows, "twin_drift")},
             "twin_images": twin.images, "twin_seconds": twin_seconds, "targets": list(targets),
             "variants": variants,
             "synthetic_samples": SYNTHETIC_SAMPLES, "seconds": time.perf_counter() - t0}
    for m, b in entry["best_within_bar"].items():
        print(f"  within {bar} points, {m}: {100 * b['macs_removed']:.1f} % of the MACs ({b['setting']}, "
              f"{b['drop_points']:+.2f})")
    for k, v in entry["spearman"].items():
        print(f"  Spearman {k} vs top-1 drop: " + ", ".join(f"{m} {x['rho']:+.2f} (n={x['n']})"
                                                         for m, x in v.items() if x["rho"] is not None))
    return entry


def main(argv=None):
    ap = shared_parser(__doc__, "reduce.json")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--cache", default="/tmp/rd_cache", help="evaluation cache (shared with bench_rd.py)")
    ap.add_argument("--figures", default=str(ROOT / "docs" / "figures"))
    ap.add_argument("--targets", default=",".join(f"{t:g}" for t in TARGETS),
                    help="MAC targets F of ours (comma-separated)")
    ap.add_argument("--no-variants", action="store_true",
                    help="skip the per-block and residual-coupled variants of ours (each point refits)")
    args = ap.parse_args(argv)
    targets = tuple(float(t) for t in args.targets.split(","))
    out_path = Path(args.out)
    data = {"models": {}}
    if out_path.exists():
        import json

        data = json.loads(out_path.read_text())
    data.update(targets=list(targets), shares=list(SHARES), old_alphas=list(OLD_ALPHAS))
    for key in args.models.split(","):
        print(f"{key}:", flush=True)
        data["models"][key] = run_model(key, Path(args.shared), Path(args.cache), Path(args.figures), targets,
                                        not args.no_variants)
        write_json(out_path, data)


if __name__ == "__main__":
    main()
