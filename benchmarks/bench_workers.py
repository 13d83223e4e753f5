"""Rate-distortion hashing on 1 and 2 processes (``--workers``): wall time per stage and whether
the outputs are identical, on the 25.6 M-parameter ResNet-50 graph of ``bench_scale.py`` and on
the shared models.

Each setting runs ``rd.rd_hash`` (the fast effort and budget 0.1 of ``redpp-onnx compress``) in a
fresh process, ``--repeat`` times alternating the worker counts; medians. Run it alone on the
machine (it times).

    python benchmarks/bench_workers.py [--repeat 3] [--models r50,resnet56,efficientnet]
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from _common import shared_parser, write_json  # noqa: E402

CHILD = r"""
import hashlib, json, sys, time
from redpp_onnx import io
from redpp_onnx.hashing import rd
if __name__ == "__main__":
    model = io.load_model(sys.argv[1])
    t = time.perf_counter()
    out, res = rd.rd_hash(model, 0.1, workers=int(sys.argv[2]), **rd.EFFORTS["fast"])
    wall = time.perf_counter() - t
    print(json.dumps({"wall_s": wall, "stages": res.seconds, "params": sum(l.params for l in res.layers),
                      "digest": hashlib.sha256(out.SerializeToString()).hexdigest()}))
"""

SHARED = {"resnet56": "cifar10_resnet56.onnx", "efficientnet": "imagenet_efficientnet_lite0.onnx"}


def run(path: Path, workers: int, script: Path) -> dict:
    p = subprocess.run([sys.executable, str(script), str(path), str(workers)], capture_output=True, text=True,
                       check=True)
    return json.loads(p.stdout.strip().splitlines()[-1])


def main(argv=None):
    ap = shared_parser(__doc__, "workers.json")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--models", default="r50,resnet56,efficientnet")
    args = ap.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "child.py"
        script.write_text(CHILD)
        for key in args.models.split(","):
            if key == "r50":
                from bench_scale import resnet50

                from redpp_onnx import io

                path = Path(tmp) / "resnet50_graph.onnx"
                io.save_model(resnet50(), path, force=True)
                label = "ResNet-50-sized graph (bench_scale.py, seeded weights)"
            else:
                path = Path(args.shared) / SHARED[key]
                label = SHARED[key]
            runs = {1: [], 2: []}
            for _ in range(args.repeat):
                for w in (1, 2):
                    runs[w].append(run(path, w, script))
                    print(f"  {label}: {w} worker(s) {runs[w][-1]['wall_s']:.1f} s", flush=True)
            digests = {r["digest"] for rs in runs.values() for r in rs}
            row = {"model": label, "params": runs[1][0]["params"], "repeat": args.repeat,
                   "identical": len(digests) == 1}
            for w, rs in runs.items():
                row[f"workers_{w}"] = {"wall_s_median": statistics.median(r["wall_s"] for r in rs),
                                       "wall_s": [r["wall_s"] for r in rs],
                                       "stages_median": {k: statistics.median(r["stages"][k] for r in rs)
                                                         for k in rs[0]["stages"]}}
            row["speedup"] = row["workers_1"]["wall_s_median"] / row["workers_2"]["wall_s_median"]
            rows.append(row)
            print(f"{label}: {row['workers_1']['wall_s_median']:.1f} s -> {row['workers_2']['wall_s_median']:.1f} s "
                  f"with 2 workers ({row['speedup']:.2f}x), identical outputs: {row['identical']}", flush=True)
    write_json(Path(args.out), {"rows": rows, "effort": "fast", "budget": 0.1})


if __name__ == "__main__":
    main()
