"""The whole `compress` command on a GPT-style decoder of about 1 B float16 parameters (external data).

The model is built here with onnx.helper (no torch, no training), tensor by tensor straight into
its external data file (the builder never holds the model): token embedding table (Gather),
learned positions, per layer LayerNormalization, attention Q/K/V/O MatMuls (causal mask,
Softmax), LayerNormalization, MLP MatMuls (4x, sigmoid-GELU), a final LayerNormalization and an
untied LM head MatMul. Default: 18 layers, 2,048 wide, 16 heads, 32,000 tokens, 128 positions:
1.04 B parameters, 2.07 GB. Weights are seeded Laplace/normal mixtures with 0.01 % outliers
whose spread differs per layer and per matrix (GPT-2's 0.02 init, the output projections
scaled by 1/sqrt(2 x layers), and a per-layer factor 0.7-1.4), not trained weights.

The CLI runs in a fresh process per run (as a user runs it), with 1 and with 2 workers; the
script records wall time, the peak RSS of the command's process and of its largest worker
(``VmHWM`` / ``RUSAGE_CHILDREN``), the output's size and SHA-256 (model file and external data),
and the report's numbers. The model (~2 GB) is written to a temporary folder, never kept.

    python benchmarks/bench_large.py [--layers 18] [--dim 2048] [--runs 1] [--out benchmarks/results/large.json]

Run it alone on the machine (it times; /work/TIMING.lock).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))

from _common import PEAK_RSS_KB_EXPR, run_python, shared_parser, write_json  # noqa: E402

from redpp_onnx.hashing.workers import available_cores  # noqa: E402
from redpp_onnx.io import runtime_ir_version  # noqa: E402
from redpp_onnx.stream import available_memory  # noqa: E402

CHILD = r"""
import json, re, resource, sys, time
from redpp_onnx.cli import main
if __name__ == "__main__":
    t = time.perf_counter()
    code = main(sys.argv[1:])
    print(json.dumps({"exit": code, "wall_s": time.perf_counter() - t, "peak_kb": int(%s),
                      "worker_peak_kb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}))
""" % PEAK_RSS_KB_EXPR


SEQ = 128


def weights(shape, sigma: float, rng: np.random.Generator) -> np.ndarray:
    """Laplace/normal mixture of standard deviation about ``sigma`` with 0.01 % outliers, float16."""
    n = int(np.prod(shape))
    w = rng.laplace(0.0, sigma / np.sqrt(2.0), n).astype(np.float32)
    normal = rng.random(n, dtype=np.float32) >= 0.7
    w[normal] = rng.standard_normal(int(normal.sum()), dtype=np.float32) * (0.5 * sigma)
    k = max(1, n // 10000)
    idx = rng.choice(n, k, replace=False)
    w[idx] = rng.choice([-1.0, 1.0], k) * rng.uniform(8 * sigma, 30 * sigma, k)
    return w.astype(np.float16).reshape(shape)


def build_gpt(path: Path, *, layers: int = 18, dim: int = 2048, heads: int = 16, vocab: int = 32000, seq: int = 128,
              seed: int = 0) -> dict:
    """Write the decoder to ``path`` and its tensors to ``path.data``; returns its sizes."""
    rng = np.random.default_rng(seed)
    data_path = Path(str(path) + ".data")
    nodes, inits = [], []
    params = [0]
    count = [0]

    def name(prefix):
        count[0] += 1
        return f"{prefix}_{count[0]}"

    with open(data_path, "wb") as data:
        def tensor(array: np.ndarray, prefix: str, external: bool = True) -> str:
            n = name(prefix)
            params[0] += array.size
            if not external or array.nbytes < 1024:
                inits.append(helper.make_tensor(n, helper.np_dtype_to_tensor_dtype(array.dtype), array.shape,
                                                array.tobytes(), raw=True))
                return n
            offset = data.tell()
            offset += -offset % 64
            data.seek(offset)
            data.write(array.tobytes())
            t = TensorProto(name=n, data_type=helper.np_dtype_to_tensor_dtype(array.dtype), dims=array.shape)
            t.data_location = TensorProto.EXTERNAL
            for k, v in (("location", data_path.name), ("offset", str(offset)), ("length", str(array.nbytes))):
                t.external_data.add(key=k, value=v)
            inits.append(t)
            return n

        def const(values, dtype=np.int64) -> str:
            a = np.asarray(values, dtype)
            n = name("c")
            inits.append(helper.make_tensor(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape, a.tobytes(),
                                            raw=True))
            return n

        def node(op, inputs, **attrs):
            out = name(op.lower())
            nodes.append(helper.make_node(op, inputs, [out], name=name(op), **attrs))
            return out

        def layer_norm(x):
            g = tensor((1.0 + 0.05 * rng.standard_normal(dim)).astype(np.float16), "ln_g", external=False)
            b = tensor((0.02 * rng.standard_normal(dim)).astype(np.float16), "ln_b", external=False)
            return node("LayerNormalization", [x, g, b], axis=-1, epsilon=1e-5)

        def matmul(x, shape, sigma):
            return node("MatMul", [x, tensor(weights(shape, sigma, rng), "W")])

        head = dim // heads
        x = node("Gather", [tensor(weights((vocab, dim), 0.02, rng), "wte"), "ids"], axis=0)
        x = node("Add", [x, tensor(weights((seq, dim), 0.01, rng), "wpe")])
        mask = np.triu(np.full((seq, seq), -1e4, np.float16), 1)
        causal = tensor(mask, "mask")
        split_heads = const([1, seq, heads, head])
        scale = tensor(np.asarray(1.0 / np.sqrt(head), np.float16), "scale", external=False)
        for layer in range(layers):
            spread = 0.7 + 0.7 * rng.random()  # per-layer factor
            sigma, out_sigma = 0.02 * spread, 0.02 * spread / np.sqrt(2 * layers)
            h = layer_norm(x)
            q, k, v = (node("Transpose", [node("Reshape", [matmul(h, (dim, dim), sigma), split_heads])],
                            perm=[0, 2, 1, 3]) for _ in range(3))
            scores = node("Add", [node("Mul", [node("MatMul", [q, node("Transpose", [k], perm=[0, 1, 3, 2])]), scale]),
                                  causal])
            attn = node("MatMul", [node("Softmax", [scores], axis=-1), v])
            attn = node("Reshape", [node("Transpose", [attn], perm=[0, 2, 1, 3]), const([1, seq, dim])])
            x = node("Add", [x, matmul(attn, (dim, dim), out_sigma)])
            h = matmul(layer_norm(x), (dim, 4 * dim), sigma)
            h = node("Mul", [h, node("Sigmoid", [node("Mul", [h, tensor(np.asarray(1.702, np.float16), "k",
                                                                             external=False)])])])
            x = node("Add", [x, matmul(h, (4 * dim, dim), out_sigma)])
        logits = matmul(layer_norm(x), (dim, vocab), 0.02)
    graph = helper.make_graph(nodes, "gpt_synthetic", [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, seq])],
                              [helper.make_tensor_value_info(logits, TensorProto.FLOAT16, [1, seq, vocab])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = runtime_ir_version(model)
    onnx.save(model, str(path))
    return {"params": params[0], "file_bytes": path.stat().st_size + data_path.stat().st_size}


CHECK = r"""
import json, re, sys
import numpy as np, onnxruntime as ort
ids = np.random.default_rng(1).integers(0, int(sys.argv[3]), (1, int(sys.argv[4])))
so = ort.SessionOptions()
so.intra_op_num_threads = 2
ys = []
for p in sys.argv[1:3]:
    ys.append(ort.InferenceSession(p, so).run(None, {"ids": ids})[0].astype(np.float64)[0])
a, b = ys
cos = (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)
print(json.dumps({"rel_l2": float(np.linalg.norm(a - b) / np.linalg.norm(a)), "cosine_min": float(cos.min()),
                  "top1_agreement": float((a.argmax(-1) == b.argmax(-1)).mean()), "positions": int(a.shape[0]),
                  "peak_kb": int(%s)}))
""" % PEAK_RSS_KB_EXPR


def whole_model_check(src: Path, out: Path, vocab: int, seq: int) -> dict:
    """What the command cannot afford for this model, done here: both models in onnxruntime on one
    sequence of seeded token ids, logits compared (relative L2, cosine per position, top-1 agreement)."""
    seconds, proc = run_python(CHECK, [src, out, vocab, seq])
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    res["wall_s"] = seconds
    res["peak_rss_mib"] = res.pop("peak_kb") / 1024
    return res


def sha256(paths) -> str:
    h = hashlib.sha256()
    for p in paths:
        with open(p, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 24), b""):
                h.update(chunk)
    return h.hexdigest()


def run_cli(args) -> dict:
    """The command in a fresh process; with the machine's 1-minute load average before and after (the
    machine is shared: a load above its cores means the wall times are inflated)."""
    load = os.getloadavg()[0]
    seconds, proc = run_python(CHILD, args)
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    return {"wall_s": seconds, "peak_rss_mib": res["peak_kb"] / 1024, "worker_peak_rss_mib": res["worker_peak_kb"] / 1024,
            "load_before": load, "load_after": os.getloadavg()[0]}


def scale_rows(tmp: Path, runs: int) -> dict:
    """Hashing speed: the ResNet-50-sized graph of bench_scale.py (25.6 M float32 parameters) with
    external data, through the streaming path (``--stream``: the per-layer rule, no model run) on 1
    and 2 workers; wall time of the command and the report's seconds, medians of ``runs``."""
    from bench_scale import resnet50

    src = tmp / "resnet50.onnx"
    model = resnet50()
    onnx.save(model, str(src), save_as_external_data=True, location="resnet50.onnx.data")
    params = sum(int(np.prod(t.dims)) for t in model.graph.initializer)
    del model
    rows, digests = [], {}
    for workers in (1, 2):
        runs_ = []
        for _ in range(runs):
            out, rep = tmp / "r50_out.onnx", tmp / f"r50_{workers}.json"
            cli = run_cli(["compress", str(src), "-o", str(out), "--report", str(rep), "-q", "--force", "--stream",
                           "--workers", str(workers)])
            report = json.loads(rep.read_text())
            cli.update({f"report_{k}_s": v for k, v in report["timings"].items()})  # load / stream / total
            cli["eligible_params"] = report["model"]["params_before"]
            runs_.append(cli)
        digests[workers] = sha256([out, Path(str(out) + ".data")])
        med = lambda k: sorted(r[k] for r in runs_)[len(runs_) // 2]  # noqa: E731
        rows.append({"workers": workers, "runs": runs_, "wall_s_median": med("wall_s"),
                     "stream_s_median": med("report_stream_s"), "peak_rss_mib_max": max(r["peak_rss_mib"] for r in runs_),
                     "eligible_params": runs_[0]["eligible_params"]})
        print(f"ResNet-50-sized graph, --stream, workers {workers}: wall {med('wall_s'):.1f} s (hashing and writing "
              f"{med('report_stream_s'):.1f} s), peak {rows[-1]['peak_rss_mib_max']:.0f} MiB", flush=True)
    return {"params": params, "input_bytes": src.stat().st_size + Path(str(src) + ".data").stat().st_size,
            "rows": rows, "identical_1_2_workers": digests[1] == digests[2]}


def main(argv=None):
    ap = shared_parser(__doc__, "large.json", shared=False)
    ap.add_argument("--layers", type=int, default=18)
    ap.add_argument("--dim", type=int, default=2048)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--runs", type=int, default=1, help="runs per worker count (the median is reported)")
    ap.add_argument("--tmp", help="folder for the model (default: a temporary folder; needs ~6 GB)")
    ap.add_argument("--scale-runs", type=int, default=3, help="runs per worker count of the ResNet-50-sized graph")
    args = ap.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        src = Path(tmp) / "gpt.onnx"
        t = time.perf_counter()
        info = build_gpt(src, layers=args.layers, dim=args.dim, heads=args.heads, vocab=args.vocab, seq=SEQ)
        info["build_s"] = time.perf_counter() - t
        print(f"GPT-style decoder: {info['params']:,} parameters (float16), {info['file_bytes']:,} bytes "
              f"(built in {info['build_s']:.0f} s)", flush=True)
        digests = {}
        for workers in (1, 2):
            runs = []
            for r in range(args.runs):
                out, rep = Path(tmp) / "out.onnx", Path(tmp) / f"r{workers}.json"  # one name: the model names its data file
                cli = run_cli(["compress", str(src), "-o", str(out), "--report", str(rep), "-q", "--force",
                               "--workers", str(workers)])
                runs.append(cli)
                print(f"workers {workers}, run {r + 1}: {cli['wall_s']:.1f} s, peak {cli['peak_rss_mib']:.0f} MiB "
                      f"(largest worker {cli['worker_peak_rss_mib']:.0f} MiB)", flush=True)
            report = json.loads(rep.read_text())
            files = [out, Path(str(out) + ".data")]
            digests[workers] = sha256(files)
            model = report["model"]
            walls = sorted(r["wall_s"] for r in runs)
            rows.append({
                "workers": workers, "runs": runs, "wall_s_median": walls[len(walls) // 2],
                "peak_rss_mib_max": max(r["peak_rss_mib"] for r in runs),
                "worker_peak_rss_mib_max": max(r["worker_peak_rss_mib"] for r in runs),
                "output_bytes": sum(f.stat().st_size for f in files), "sha256": digests[workers],
                "stream_reason": model.get("stream", {}).get("reason"),
                "distinct_values_before": model["distinct_values_before"],
                "distinct_values_after": model["distinct_values_after"], "changed_layers": model["changed_layers"],
                "eligible_layers": model["eligible_layers"], "verify": report["verify"],
                "max_weight_rel_error": max(l["rel_error"] for l in report["layers"] if l.get("eligible", True)),
                "hash_seconds_sum": sum(l.get("seconds", 0.0) for l in report["layers"] if l.get("eligible", True)),
                "notes": report["notes"]})
        identical = digests[1] == digests[2]
        print(f"output identical with 1 and 2 workers: {identical}", flush=True)
        check = whole_model_check(src, out, args.vocab, SEQ)
        print(f"whole model in onnxruntime (outside the command): logits relative L2 {check['rel_l2']:.4f}, cosine "
              f"min {check['cosine_min']:.5f}, top-1 agreement {check['top1_agreement']:.3f}", flush=True)
        out.unlink()
        Path(str(out) + ".data").unlink()
        src.unlink()
        Path(str(src) + ".data").unlink()
        scale = scale_rows(Path(tmp), args.scale_runs) if args.scale_runs else None
    write_json(args.out, {"model": {"layers": args.layers, "dim": args.dim, "heads": args.heads, "vocab": args.vocab,
                                    "seq": SEQ, **info},
                          "rows": rows, "identical_1_2_workers": identical, "whole_model_check": check, "scale": scale,
                          "machine": {"cores": available_cores(), "memory_bytes": available_memory()}})


if __name__ == "__main__":
    main()
