"""Loading --codebook models: peak memory and session-creation time, fp32 against both forms.

For each model (the synthetic ResNet-50 of ``bench_scale.py``, 25.6 M parameters, and
``imagenet_efficientnet_lite0.onnx`` of ../shared/bench), hashed with the default settings and
written with ``--codebook`` (one file: the standard-ops form plus the ``redpp.codebook`` map), it
measures in fresh processes:

* ``fp32``: the original fp32 model, ``onnxruntime.InferenceSession(path)``;
* ``standard-ops (onnxruntime)``: the --codebook file in plain onnxruntime, which folds the decoders;
* ``fast path (redpp_onnx.session)``: the same file through ``redpp_onnx.session(path)``: the map
  is checked, the weights decoded in C++ and handed to onnxruntime; the time counts everything
  from the path to the session (reading, checking, decoding, onnxruntime);
* ``fp32 (redpp_onnx.session)``, for reference: what importing redpp-onnx (onnx, numpy) adds;
* ``compact (redpp_onnx.session)``: the same hashed weights written with ``--storage compact``
  (rANS codes, ``redpp_onnx/compact.py``) through ``redpp_onnx.session(path)``.

Each process reports its peak RSS (VmHWM) and the seconds to create the session. The variants
alternate within each of ``--runs`` rounds (the machine is shared); every figure is the median
over the rounds, and the ratios are medians of each round's ratio to the fp32 model measured in
that round. Outputs of the fast path, the standard-ops form and the plain hashed model are
compared with ``np.array_equal`` on a seeded input. Hashing the 25 M-parameter graph takes about
a minute: the hashed models are cached in ``--cache`` (keyed by the hashing sources), the
--codebook files too (keyed by the storage sources).

    python benchmarks/bench_load.py [--cache /tmp/load_cache] [--runs 5] [--out benchmarks/results/load.json]
"""

from __future__ import annotations

import hashlib
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _common import PEAK_RSS_KB_EXPR, shared_parser, write_json  # noqa: E402  (benchmarks/)

from redpp_onnx import storage  # noqa: E402
from redpp_onnx.config import HashConfig  # noqa: E402
from redpp_onnx.passes.hash import HashPass, HashPassResult, LayerHash, store_codebooks  # noqa: E402
from redpp_onnx.runtime import session  # noqa: E402

LOAD = """
import json, re, sys, time
mode, path = sys.argv[1], sys.argv[2]
peak = lambda: int(""" + PEAK_RSS_KB_EXPR + """)
info = {}
if mode == "ort":
    import onnxruntime as ort
    so = ort.SessionOptions(); so.log_severity_level = 3
    before = peak(); t = time.perf_counter()
    s = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
else:
    import redpp_onnx
    before = peak(); t = time.perf_counter()
    s = redpp_onnx.session(path)
    info = {"form": s.redpp_load.form, "decode_s": s.redpp_load.decode_s}
seconds = time.perf_counter() - t
print(json.dumps(dict(info, create_s=seconds, peak_kb=peak(), imports_kb=before)))
"""
VARIANTS = [("fp32", "ort", "fp32"), ("standard-ops (onnxruntime)", "ort", "codebook"),
            ("fast path (redpp_onnx.session)", "redpp", "codebook"), ("fp32 (redpp_onnx.session)", "redpp", "fp32"),
            ("compact (redpp_onnx.session)", "redpp", "compact")]
MODELS = {"resnet50_synthetic": None, "imagenet_efficientnet_lite0": "imagenet_efficientnet_lite0.onnx"}


def _sources_key(*relpaths) -> str:
    h = hashlib.sha256()
    for rel in relpaths:
        h.update((ROOT / rel).read_bytes())
    return h.hexdigest()[:12]


HASH_KEY = ("redpp_onnx/hashing/kde.py", "redpp_onnx/hashing/rd.py", "redpp_onnx/passes/hash.py", "redpp_onnx/config.py")
STORE_KEY = ("redpp_onnx/passes/codebook.py", "redpp_onnx/passes/hash.py", "redpp_onnx/compact.py", "csrc/rans.h")


def prepare(name: str, source, cache: Path) -> dict:
    """Paths of the fp32, plainly hashed and --codebook models of ``name`` (built or cached)."""
    cache.mkdir(parents=True, exist_ok=True)
    fp32 = cache / f"{name}.fp32.onnx" if source is None else Path(source)
    if source is None and not fp32.is_file():
        from bench_scale import resnet50

        onnx.save(resnet50(), str(fp32))
    hkey = _sources_key(*HASH_KEY)
    hashed, units_path = cache / f"{name}.hashed.{hkey}.onnx", cache / f"{name}.units.{hkey}.json"
    if not hashed.is_file() or not units_path.is_file():
        t = time.perf_counter()
        result = HashPass(HashConfig()).run(onnx.load(str(fp32)))
        print(f"{name}: hashed in {time.perf_counter() - t:.0f} s", flush=True)
        onnx.save(result.model, str(hashed))
        units_path.write_text(json.dumps({  # per-channel units and channel maps as lists
            "units": {w: (u.tolist() if isinstance(u, np.ndarray) else u) for w, u in result.lattice_units.items()},
            "axes": result.lattice_axes,
            "groups": {w: g.tolist() for w, g in result.lattice_groups.items()}}))
    skey = _sources_key(*STORE_KEY)
    out = {"fp32": fp32, "hashed": hashed}
    for form, which in (("standard", "codebook"), ("compact", "compact")):
        packed = cache / f"{name}.{which}.{hkey}.{skey}.onnx"
        if not packed.is_file():
            saved = json.loads(units_path.read_text())
            units = {w: (np.asarray(u, np.float64) if isinstance(u, list) else u) for w, u in saved["units"].items()}
            rows = [LayerHash(w, "", w, (), 0, None, "rd", 0, 0, 0.0) for w in units]
            result = HashPassResult(onnx.load(str(hashed)), rows, [], lattice_units=units,
                                    lattice_axes=saved["axes"],
                                    lattice_groups={w: np.asarray(g, np.int64) for w, g in saved["groups"].items()})
            t = time.perf_counter()
            store_codebooks(result, form)  # what compress (--storage FORM) does after hashing
            print(f"{name}: codebooks ({form}) written in {time.perf_counter() - t:.0f} s "
                  f"({result.codebook_layers} tensors)", flush=True)
            onnx.save(result.model, str(packed))
        out[which] = packed
    return out


def outputs_equal(paths: dict) -> dict:
    """The fast path's outputs against the standard-ops form's and the plain hashed model's."""
    model = onnx.load(str(paths["fp32"]), load_external_data=False)
    inp = model.graph.input[0]
    shape = [d.dim_value or 1 for d in inp.type.tensor_type.shape.dim]
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    fast = session(str(paths["codebook"]))
    assert fast.redpp_load.form == "decoded", fast.redpp_load
    y_fast = fast.run(None, {inp.name: x})[0]
    del fast
    y_std = session(str(paths["codebook"]), decode_codebooks=False).run(None, {inp.name: x})[0]
    y_plain = session(str(paths["hashed"])).run(None, {inp.name: x})[0]
    y_compact = session(str(paths["compact"])).run(None, {inp.name: x})[0]
    return {"fast_vs_standard_ops": bool(np.array_equal(y_fast, y_std)),
            "fast_vs_plain_hashed": bool(np.array_equal(y_fast, y_plain)),
            "compact_vs_plain_hashed": bool(np.array_equal(y_compact, y_plain))}


def measure(paths: dict, runs: int) -> list:
    raw = {label: [] for label, _, _ in VARIANTS}
    for r in range(runs):
        for label, mode, which in VARIANTS:
            proc = subprocess.run([sys.executable, "-c", LOAD, mode, str(paths[which])], check=True,
                                  capture_output=True, text=True)
            raw[label].append(json.loads(proc.stdout.strip().splitlines()[-1]))
        print(f"  round {r + 1}/{runs}: " + ", ".join(f"{label} {raw[label][-1]['create_s']:.2f} s "
                                                     f"{raw[label][-1]['peak_kb'] / 1024:.0f} MiB"
                                                     for label, _, _ in VARIANTS), flush=True)
    base = raw["fp32"]
    rows = []
    for label, mode, which in VARIANTS:
        runs_ = raw[label]
        row = {"variant": label, "file": which, "file_bytes": paths[which].stat().st_size,
               "peak_rss_mib": statistics.median(x["peak_kb"] / 1024 for x in runs_),
               "create_s": statistics.median(x["create_s"] for x in runs_),
               "imports_rss_mib": statistics.median(x["imports_kb"] / 1024 for x in runs_),
               "peak_ratio": statistics.median(x["peak_kb"] / b["peak_kb"] for x, b in zip(runs_, base)),
               "time_ratio": statistics.median(x["create_s"] / b["create_s"] for x, b in zip(runs_, base)),
               "runs": runs_}
        if mode == "redpp":
            row["form"] = runs_[0]["form"]
            row["decode_s"] = statistics.median(x["decode_s"] for x in runs_)
        rows.append(row)
    return rows


def decode_speed(path: Path, repeat: int = 5) -> dict:
    """``storage.decode`` of the --codebook file in this process, median of ``repeat``: all of it
    (map checks, C++ decoding, graph without decoders) and the C++ decoder alone (first writes to
    the new weight arrays included); seconds and ns per stored weight."""
    model = onnx.load(str(path))
    times, decoder = [], []
    for _ in range(repeat):
        d = storage.decode(model)
        times.append(d.seconds)
        decoder.append(d.decoder_seconds)
        weights = d.stored_weights
        del d
    s, c = statistics.median(times), statistics.median(decoder)
    return {"decode_s": s, "decoder_s": c, "stored_weights": weights, "ns_per_weight": s / weights * 1e9,
            "decoder_ns_per_weight": c / weights * 1e9}


def main(argv=None):
    ap = shared_parser(__doc__, "load.json")
    ap.add_argument("--cache", default="/tmp/load_cache")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--models", nargs="*", default=list(MODELS))
    args = ap.parse_args(argv)
    results = []
    for name in args.models:
        source = MODELS[name] and Path(args.shared) / MODELS[name]
        if source is not None and not source.is_file():
            print(f"{name}: {source} not found, skipped")
            continue
        paths = prepare(name, source, Path(args.cache))
        fp32 = onnx.load(str(paths["fp32"]))
        params = sum(int(np.prod(t.dims)) for t in fp32.graph.initializer)
        del fp32
        info = storage.describe(str(paths["codebook"]))
        print(f"{name}: {params:,} parameters, {info['stored_weights']:,} stored as codebooks "
              f"({info['grouped_tensors']} of {info['tensors']} tensors per channel group); map: {info['fast_path']}",
              flush=True)
        entry = {"model": name, "params": params, "stored_weights": info["stored_weights"],
                 "tensors": info["tensors"], "grouped_tensors": info["grouped_tensors"],
                 "outputs_equal": outputs_equal(paths), "decode": decode_speed(paths["codebook"]),
                 "decode_compact": decode_speed(paths["compact"]),
                 "rows": measure(paths, args.runs)}
        results.append(entry)
        print(f"{'variant':<32} {'file bytes':>12} {'peak MiB':>9} {'x fp32':>7} {'create s':>9} {'x fp32':>7}")
        for row in entry["rows"]:
            print(f"{row['variant']:<32} {row['file_bytes']:>12,} {row['peak_rss_mib']:>9.0f} "
                  f"{row['peak_ratio']:>7.2f} {row['create_s']:>9.2f} {row['time_ratio']:>7.2f}")
        for key, label in (("decode", "map"), ("decode_compact", "compact")):
            d = entry[key]
            print(f"decode {label} (in process): {d['decode_s']:.3f} s, {d['ns_per_weight']:.1f} ns per stored weight, "
                  f"of which the C++ decoder {d['decoder_ns_per_weight']:.1f} ns", flush=True)
        print(f"outputs equal: {entry['outputs_equal']}", flush=True)
    write_json(args.out, {"runs": args.runs, "models": results})


if __name__ == "__main__":
    main()
