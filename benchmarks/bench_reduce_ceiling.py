"""Channel reduction with real data in place of the synthetic twin: the ceiling of our edits (issue 12).

``--target-macs`` removes channels (``passes/reduce.py``), compensates their means and refits the
consumers on a *synthetic twin* (``passes/refit.py``, ``passes/twin_plan.py``): no data is read. This
benchmark asks how much of the accuracy lost is the price of being data-free and how much is the
edit itself: the same edits (same channel groups, same channel orders, same mean compensation,
same least-squares refit) are made with real labelled images where the tool uses synthetic ones.
**The tool never does this**; these are upper bounds for it, measured to know where the bar of a
model can be reached at all.

The images are split: even indices are the *calibration* half (what the oracles may read), odd
indices the *held-out* half, on which every row's top-1 is measured (also on all images, for
comparison with bench_reduce.py). Rows per target F (keep at most F of the eligible MACs):

* **ours, data-free**: ``reduce_channels`` with the defaults (``compress --steps merge
  --target-macs F`` before the layout rewrite), a synthetic twin made once per model;
* **real-data counts**: the closed-form channel order of each group, and how many channels each
  group loses chosen by the logit drift of every option measured alone on the calibration images
  (the twin-measured plan's allocation, ``twin_plan.allocate``, with real images), mean
  compensation only;
* **real-data counts + synthetic refit**: the same decisions, consumers refitted on the synthetic
  twin (data-free refit, oracle counts);
* **real-data counts + real refit**: the same decisions, consumers refitted on the calibration
  images;
* **ours, real data as the twin**: the whole default pipeline (twin-measured plan on every group,
  also where the tool refuses it, and the refit) with the calibration images in place of the
  synthetic ones.

The real-data refits take ``ROWS_PER_FEATURE_REAL`` rows per unknown (the tool asks
``refit.ROWS_PER_FEATURE`` of its synthetic rows; the ridge term keeps a fit with fewer rows well posed).

    python benchmarks/bench_reduce_ceiling.py [--models efficientnet,resnet20,resnet56] [--targets 0.95,0.9,0.85]

Writes ``benchmarks/results/reduce_ceiling.json`` (this run's models replace theirs);
``render_results.py`` puts it in docs/RESULTS.md.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from _common import shared_parser, write_json  # noqa: E402
from bench_rd import MODELS, Evaluator  # noqa: E402
from bench_reduce import BARS  # noqa: E402

from redpp_onnx.analysis.coupling import analyze_coupling  # noqa: E402
from redpp_onnx.analysis.layers import scan_layers  # noqa: E402
from redpp_onnx.passes import reduce as R  # noqa: E402
from redpp_onnx.passes import refit as RF  # noqa: E402
from redpp_onnx.passes import twin_plan as TP  # noqa: E402

TARGETS = (0.95, 0.9, 0.85)
ROWS_PER_FEATURE_REAL = 4
FEED_BATCH = 25
METHODS = ("ours, data-free", "real-data counts", "real-data counts + synthetic refit",
           "real-data counts + real refit", "ours, real data as the twin")


@contextlib.contextmanager
def oracle_settings():
    """The tool's two data-free guards lifted for the real-data rows: the twin-measured plan on every
    group (the tool refuses it where a depthwise conv lies between producer and consumer) and
    ``ROWS_PER_FEATURE_REAL`` rows per unknown in a refit; restored afterwards."""
    unavailable, rows = TP.unavailable, RF.ROWS_PER_FEATURE
    TP.unavailable = lambda groups, tw: None
    RF.ROWS_PER_FEATURE = ROWS_PER_FEATURE_REAL
    try:
        yield
    finally:
        TP.unavailable, RF.ROWS_PER_FEATURE = unavailable, rows


def _top1(ev: Evaluator, logits: np.ndarray, idx: np.ndarray) -> float:
    return float((logits[idx].argmax(1) == ev.y[idx]).mean())


def _calibration_logits(ev: Evaluator, feeds, model) -> np.ndarray:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return np.concatenate([sess.run(None, f)[0] for f in feeds]).astype(np.float64)


def real_drift_table(ev, feeds, coupling, groups, seqs, reasons, macs_total) -> dict:
    """``{(group, count): (relative squared logit drift on the calibration images, MACs removed)}``,
    every option of :func:`twin_plan.options` alone, mean compensation only."""
    ref = _calibration_logits(ev, feeds, ev.model)
    den = float(np.sum(ref * ref)) or 1.0
    table = {}
    for k, gr in enumerate(groups):
        for r in TP.options(len(gr.classes), len(seqs[k]), 8):
            dec = {i: [] for i in range(len(groups))}
            dec[k] = seqs[k][:r]
            red = R.apply_plan(ev.model, coupling, groups, dec, reasons, macs_total).model
            lg = _calibration_logits(ev, feeds, red)
            table[(k, r)] = (float(np.sum((lg - ref) ** 2)) / den, r * gr.macs_per_channel)
    return table


def run_model(key: str, shared: Path, cache: Path, targets) -> dict:
    path, data_name, _, batch = MODELS[key]
    t0 = time.perf_counter()
    ev = Evaluator(shared / path, shared / data_name, cache, batch)
    m = ev.model
    n = len(ev.y)
    cal, held = np.arange(0, n, 2), np.arange(1, n, 2)
    feeds = [{m.graph.input[0].name: np.ascontiguousarray(ev.x[cal[i:i + FEED_BATCH]])}
             for i in range(0, len(cal), FEED_BATCH)]
    out = {"model": path, "data": data_name, "n_calibration": int(len(cal)), "n_held_out": int(len(held)),
           "original": {"top1_held_out": _top1(ev, ev.ref, held), "top1_all": ev.ref_top1},
           "rows_per_feature_real": ROWS_PER_FEATURE_REAL, "bar_points": BARS[key], "rows": []}
    coupling = analyze_coupling(m)
    synthetic = R.refit_twin(m)
    real = RF.Twin(m, feeds, True)
    # every group's closed-form sequence up to max_share: a target below anything reachable takes all
    groups, seqs, reasons, macs_total = R.plan(m, R.ReduceConfig(target_macs=1e-6, plan="cost", refit=False),
                                               coupling)
    print(f"  measuring {sum(len(TP.options(len(g.classes), len(seqs[k]), 8)) for k, g in enumerate(groups))} "
          "options on the calibration images", flush=True)
    table = real_drift_table(ev, feeds, coupling, groups, seqs, reasons, macs_total)
    out["groups"] = [{"producer": g.producer, "channels": len(g.classes)} for g in groups]
    out["drift_table"] = [[k, r, d, mac] for (k, r), (d, mac) in sorted(table.items())]

    def record(method, target, model, seconds):
        lg = ev.logits(model)
        macs_after = sum(l.macs or 0 for l in scan_layers(model).layers)
        row = {"method": method, "target": target, "macs_removed": 1 - macs_after / macs_total,
               "top1_held_out": _top1(ev, lg, held), "top1_all": float((lg.argmax(1) == ev.y).mean()),
               "seconds": seconds}
        row["drop_held_out"] = out["original"]["top1_held_out"] - row["top1_held_out"]
        out["rows"].append(row)
        print(f"  F={target:g} {method:38s} MACs -{100 * row['macs_removed']:5.2f} %  held-out top-1 "
              f"{100 * row['top1_held_out']:.2f} (drop {100 * row['drop_held_out']:+.2f})  all "
              f"{100 * row['top1_all']:.2f}", flush=True)

    for F in targets:
        t = time.perf_counter()
        record(METHODS[0], F, R.reduce_channels(m, R.ReduceConfig(target_macs=F), twin=synthetic).model,
               time.perf_counter() - t)
        counts, _ = TP.allocate(len(groups), table, (1.0 - F) * macs_total)
        dec = {k: seqs[k][:counts[k]] for k in range(len(groups))}
        base = R.apply_plan(m, coupling, groups, dec, reasons, macs_total)
        record(METHODS[1], F, base.model, 0.0)
        consumers = [c.node for k, gr in enumerate(groups) if dec[k] for c, _, _ in gr.consumers]
        cfg = R.ReduceConfig()
        for method, tw in ((METHODS[2], synthetic), (METHODS[3], real)):
            t = time.perf_counter()
            reduced = R.apply_plan(m, coupling, groups, dec, reasons, macs_total).model
            with oracle_settings() if tw is real else contextlib.nullcontext():
                RF.refit(m, reduced, lambda tm: R.apply_plan(tm, *R._regroup(tm, cfg, groups), dec, reasons,
                                                             macs_total).model, consumers, tw)
            record(method, F, reduced, time.perf_counter() - t)
        t = time.perf_counter()
        with oracle_settings():
            reduced = R.reduce_channels(m, R.ReduceConfig(target_macs=F), twin=real).model
        record(METHODS[4], F, reduced, time.perf_counter() - t)
    out["seconds"] = time.perf_counter() - t0
    return out


def main(argv=None):
    ap = shared_parser(__doc__, "reduce_ceiling.json")
    ap.add_argument("--models", default="efficientnet,resnet20,resnet56")
    ap.add_argument("--cache", default="/tmp/rd_cache", help="evaluation cache (shared with bench_rd.py)")
    ap.add_argument("--targets", default=",".join(f"{t:g}" for t in TARGETS),
                    help="MAC targets F (comma-separated)")
    args = ap.parse_args(argv)
    targets = tuple(float(t) for t in args.targets.split(","))
    out_path = Path(args.out)
    data = json.loads(out_path.read_text()) if out_path.exists() else {"models": {}}
    data["methods"] = list(METHODS)
    for key in args.models.split(","):
        if key not in MODELS:
            raise SystemExit(f"unknown model {key!r}: one of {', '.join(MODELS)}")
        print(f"{key}:", flush=True)
        data["models"][key] = run_model(key, Path(args.shared), Path(args.cache), targets)
        write_json(out_path, data)


if __name__ == "__main__":
    main()
