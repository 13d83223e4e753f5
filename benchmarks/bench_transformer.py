"""A BERT-sized sentence encoder: our compressed files against the data-free alternatives a user
already has (onnxruntime's ``quantize_dynamic`` int8, float16 weights), measured by the same code:
file bytes, cosine similarity of the sentence embeddings to the float32 original on held-out
token ids, compress wall time and peak memory.

The model is ``BertLike`` of tests/zoo/make_zoo.py at BERT-small sizes (default: 30,522-token
table, 384 wide, 6 layers, 6 heads, MLP 1,536, 64 tokens: 22.3 M parameters, about 89 MB),
built with torch from seeded random weights (torch is needed to build it, never to run it);
its weights are random, not trained: the distributions differ from a trained BERT's.

    python benchmarks/bench_transformer.py [--layers 6] [--dim 384] [--vocab 30522] [--samples 256] [--part all|mlp]

``--part mlp`` measures only the MLP channel reduction (``--target-macs``: ours with and without the
refit, L1-norm pruning of the same share) and puts it into the existing result file.

Run it alone on the machine (it times).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from _common import PEAK_RSS_KB_EXPR, shared_parser, write_json  # noqa: E402

CHILD = r"""
import json, re, sys, time
from redpp_onnx.cli import main
if __name__ == "__main__":
    t = time.perf_counter()
    code = main(sys.argv[1:])
    print(json.dumps({"exit": code, "wall_s": time.perf_counter() - t, "peak_kb": int(%s)}))
""" % PEAK_RSS_KB_EXPR


def build(path: Path, vocab: int, dim: int, layers: int, heads: int, ffn: int, seq: int, half: bool = False) -> dict:
    """Export the seeded BertLike (``half``: the same weights in float16, computed in float16 throughout:
    ``model.half()`` before the export, what a user's float16 conversion gives)."""
    import warnings

    import onnx
    import torch

    sys.path.insert(0, str(ROOT / "tests" / "zoo"))
    from make_zoo import IR_VERSION, BertLike

    warnings.filterwarnings("ignore")
    torch.manual_seed(0)
    model = BertLike(vocab, dim, layers, seq, heads, ffn).eval()
    ids = torch.randint(0, vocab, (2, seq))
    if half:
        model = model.half()
    torch.onnx.export(model, (ids,), str(path), dynamo=False, opset_version=17, input_names=["ids"],
                      output_names=["embedding"], dynamic_axes={"ids": {0: "N"}, "embedding": {0: "N"}})
    m = onnx.load(str(path))
    m.ir_version = min(m.ir_version, IR_VERSION)
    onnx.save(m, str(path))
    return {"params": int(sum(p.numel() for p in model.parameters())), "file_bytes": path.stat().st_size}


def fp16_all(src: Path, dst: Path, bf16: bool = False) -> Path:
    """Every float32 initializer of at least 1,024 values stored as float16 (``bf16``: bfloat16, rounded
    to nearest even) and cast back to float32 (tables included): what a user gets from a half-precision
    export that keeps float32 activations."""
    import onnx
    from onnx import helper, numpy_helper

    from redpp_onnx import io
    from redpp_onnx.analysis.layers import np_dtype

    model = io.load_model(src)
    casts = []
    for t in model.graph.initializer:
        if t.data_type == onnx.TensorProto.FLOAT and np.prod(t.dims) >= 1024:
            name = t.name
            half = np_dtype(onnx.TensorProto.BFLOAT16 if bf16 else onnx.TensorProto.FLOAT16)
            t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t).astype(half), name + "__fp16"))
            casts.append(helper.make_node("Cast", [name + "__fp16"], [name], to=onnx.TensorProto.FLOAT))
    nodes = casts + list(model.graph.node)
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    io.save_model(model, dst, force=True)
    return dst


def embeddings(path: Path, ids: np.ndarray, fast: bool) -> np.ndarray:
    import onnxruntime as ort

    import redpp_onnx

    if fast:
        s = redpp_onnx.session(str(path))
    else:  # onnxruntime as a user runs it; a float16-compute graph needs its crash workaround (runtime.py)
        import onnx

        from redpp_onnx.runtime import DISABLE_KEY, HALF_COMPUTE_DISABLED, half_compute

        so = ort.SessionOptions()
        if half_compute(onnx.load(str(path), load_external_data=False)):
            so.add_session_config_entry(DISABLE_KEY, ",".join(HALF_COMPUTE_DISABLED))
        s = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    name = s.get_inputs()[0].name
    return np.concatenate([s.run(None, {name: ids[i:i + 32]})[0] for i in range(0, len(ids), 32)]).astype(np.float64)


def cosines(a: np.ndarray, b: np.ndarray) -> dict:
    c = np.sum(a * b, 1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    return {"min": float(c.min()), "mean": float(c.mean())}


MLP_TARGETS = (0.95, 0.9, 0.8, 0.7)


def mlp_reduction(src: Path, ids: np.ndarray, ref: np.ndarray, work: Path, script: Path) -> dict:
    """Channel reduction of the MLP hidden units (the only reducible groups: attention's channels pass
    reshapes into heads), float32, no hashing, each method on the same groups and the same data: ours
    (``--target-macs F``: closed-form choice, mean compensation into the bias Add, the second MatMul
    refitted on the synthetic twin), ours without the refit, and L1-norm pruning (Li et al.) of the same
    share in every group, no compensation; then ours at F = 0.9 with the default hashing and storage."""
    import _reduce_baselines as RB
    from redpp_onnx import io
    from redpp_onnx.analysis.coupling import analyze_coupling
    from redpp_onnx.passes import reduce as R

    from redpp_onnx.analysis.fold import resolve_constant_identities

    model, _ = resolve_constant_identities(io.load_model(src))  # as compress reads it (exported aliases)
    rows = []

    def add(method, setting, res, seconds):
        path = work / "mlp.onnx"
        io.save_model(res.model, path, force=True)
        row = {"method": method, "setting": setting, "macs_removed": res.macs_removed,
               "channels_removed": sum(r.channels_before - r.channels_after for r in res.layers),
               "channels": sum(r.channels_before for r in res.layers if r.channels_before),
               "cosine": cosines(ref, embeddings(path, ids, fast=False)), "seconds": seconds}
        rows.append(row)
        print(f"  {method:34} {setting:9} MACs -{100 * row['macs_removed']:5.1f} %  channels -{row['channels_removed']:5}"
              f"  cosine min {row['cosine']['min']:.5f} mean {row['cosine']['mean']:.5f}  {seconds:.1f} s", flush=True)
        return row

    coupling = analyze_coupling(model)
    groups, _, reasons, macs_total = R.plan(model, R.ReduceConfig(alpha=0.0), coupling)
    for F in MLP_TARGETS:
        for refit in (True, False):
            t = time.perf_counter()
            res = R.reduce_channels(model, R.ReduceConfig(target_macs=F, refit=refit))
            row = add("ours" if refit else "ours without refit", f"F = {F:g}", res, time.perf_counter() - t)
            if refit:
                share = row["channels_removed"] / max(row["channels"], 1)
        t = time.perf_counter()
        dec = RB.l1_decisions(model, coupling, groups, share, multiple=8)
        add("L1 pruning", f"share {share:.3f}", R.apply_plan(model, coupling, groups, dec, reasons, macs_total,
                                                             compensate=False), time.perf_counter() - t)
    out = work / "mlp_full.onnx"
    proc = subprocess.run([sys.executable, str(script), "compress", str(src), "-o", str(out), "-q", "--no-verify",
                           "--target-macs", "0.9", "--storage", "compact"], capture_output=True, text=True)
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    if res["exit"] != 0:
        raise SystemExit(f"--target-macs 0.9: exit {res['exit']}: {proc.stderr[-2000:]}")
    full = {"how": "redpp-onnx compress --target-macs 0.9 --storage compact", "file_bytes": out.stat().st_size,
            "cosine": cosines(ref, embeddings(out, ids, fast=True)), "wall_s": res["wall_s"],
            "peak_rss_mb": res["peak_kb"] / 1024}
    print(f"  {full['how']}: {full['file_bytes']:,} B, cosine min {full['cosine']['min']:.5f}", flush=True)
    groups_info = [{"producer": gr.producer, "channels": len(gr.classes), "activation": gr.activation} for gr in groups]
    return {"groups": groups_info, "targets": list(MLP_TARGETS), "rows": rows, "with_hashing": full,
            "exact_merge": "no two hidden units have equal weights (seeded random weights): exact merging removes none",
            "neuron_merging": "not run: its scale and bias mismatch come from the BatchNorm after the producer; a "
                              "transformer MLP has none"}


def main(argv=None):
    ap = shared_parser(__doc__, "transformer.json", shared=False)
    ap.add_argument("--vocab", type=int, default=30522)
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--heads", type=int, default=6)
    ap.add_argument("--ffn", type=int, default=1536)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--samples", type=int, default=256)
    ap.add_argument("--part", choices=("all", "mlp"), default="all")
    args = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="bench_transformer_"))
    src = work / "encoder.onnx"
    info = build(src, args.vocab, args.dim, args.layers, args.heads, args.ffn, args.seq)
    print(f"model: {info['params']:,} parameters, {info['file_bytes']:,} bytes", flush=True)
    ids = np.random.default_rng(1).integers(0, args.vocab, (args.samples, args.seq)).astype(np.int64)
    ref = embeddings(src, ids, fast=False)
    script = work / "child.py"
    script.write_text(CHILD)
    if args.part == "mlp":  # into the existing results of the same settings
        data = json.loads(Path(args.out).read_text())
        if data["model"]["params"] != info["params"]:
            raise SystemExit(f"{args.out} holds another model ({data['model']['params']:,} parameters)")
        data["mlp_reduction"] = mlp_reduction(src, ids, ref, work, script)
        write_json(args.out, data)
        return
    rows = []

    def record(label, path, seconds=None, peak_kb=None, fast=False, how=""):
        emb = embeddings(path, ids, fast)
        row = {"setting": label, "how": how, "file_bytes": path.stat().st_size,
               "ratio": info["file_bytes"] / path.stat().st_size, "cosine": cosines(ref, emb),
               "wall_s": seconds, "peak_rss_mb": peak_kb / 1024 if peak_kb else None}
        rows.append(row)
        print(f"  {label:44} {row['file_bytes']:>12,} B  {row['ratio']:5.2f}x  cosine min {row['cosine']['min']:.5f}"
              f" mean {row['cosine']['mean']:.5f}" + (f"  {seconds:.1f} s" if seconds else "")
              + (f", {row['peak_rss_mb']:.0f} MB" if peak_kb else ""),
              flush=True)

    # the default budget of this model is config.DEFAULT_FEATURE_BUDGET (its output is pooled features);
    # 0.1 is the classifiers' default, shown for comparison
    ours = [("redpp default (standard-ops form)", []),
            ("redpp default, compact", ["--storage", "compact"]),
            ("redpp --budget 0.1 (classifiers' default), compact", ["--budget", "0.1", "--storage", "compact"]),
            ("redpp --budget 0.05, compact", ["--budget", "0.05", "--storage", "compact"]),
            ("redpp --budget 0.02, compact", ["--budget", "0.02", "--storage", "compact"]),
            ("redpp --budget 0.01, compact", ["--budget", "0.01", "--storage", "compact"])]
    for k, (label, extra) in enumerate(ours):
        out = work / f"ours{k}.onnx"
        proc = subprocess.run([sys.executable, str(script), "compress", str(src), "-o", str(out), "-q", "--no-verify",
                               *extra], capture_output=True, text=True)
        res = json.loads(proc.stdout.strip().splitlines()[-1])
        if res["exit"] != 0:
            raise SystemExit(f"{label}: exit {res['exit']}: {proc.stderr[-2000:]}")
        record(label, out, res["wall_s"], res["peak_kb"], fast=True, how="redpp-onnx compress " + " ".join(extra))
    from _real_baselines import ort_quantize_dynamic

    for per_channel in (False, True):
        dst = work / f"qd{int(per_channel)}.onnx"
        t = time.perf_counter()
        ort_quantize_dynamic(src, dst, per_channel=per_channel)
        record(f"onnxruntime quantize_dynamic int8{' per-channel' if per_channel else ''}", dst,
               time.perf_counter() - t, how="onnxruntime.quantization.quantize_dynamic")
    halves = [("float16-compute", "float16 compute (model.half() exported)", "the torch model in float16, exported: "
               "float16 weights and activations, float16 output")]
    halves += [(kind, f"{kind} weights + Cast", f"every float32 initializer >= 1,024 values as {kind}, cast to float32")
               for kind in ("float16", "bfloat16")]
    for kind, half_label, half_how in halves:  # the half-precision files, and ours of each (>= 1.8x smaller)
        if kind == "float16-compute":
            half = work / "float16_compute.onnx"
            build(half, args.vocab, args.dim, args.layers, args.heads, args.ffn, args.seq, half=True)
        else:
            half = fp16_all(src, work / f"{kind}.onnx", kind == "bfloat16")
        record(half_label, half, how=half_how)
        for label, extra in ((f"redpp default of the {kind} file", []),
                             (f"redpp default of the {kind} file, compact", ["--storage", "compact"])):
            out = work / f"ours_{kind}{len(extra)}.onnx"
            proc = subprocess.run([sys.executable, str(script), "compress", str(half), "-o", str(out), "-q",
                                   "--no-verify", *extra], capture_output=True, text=True)
            res = json.loads(proc.stdout.strip().splitlines()[-1])
            if res["exit"] != 0:
                raise SystemExit(f"{label}: exit {res['exit']}: {proc.stderr[-2000:]}")
            record(label, out, res["wall_s"], res["peak_kb"], fast=True,
                   how=f"redpp-onnx compress {' '.join(extra)} of the {kind} file")
            rows[-1]["vs_half_file"] = half.stat().st_size / out.stat().st_size
            print(f"    {rows[-1]['vs_half_file']:.2f}x smaller than the {kind} file", flush=True)
    write_json(args.out, {"model": {"kind": "BertLike (tests/zoo/make_zoo.py), seeded random weights",
                                    "vocab": args.vocab, "dim": args.dim, "layers": args.layers, "heads": args.heads,
                                    "ffn": args.ffn, "seq": args.seq, **info},
                          "samples": args.samples, "ids": "uniform over the vocabulary, seed 1", "rows": rows,
                          "mlp_reduction": mlp_reduction(src, ids, ref, work, script)})


if __name__ == "__main__":
    main()
