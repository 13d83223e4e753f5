"""Prototype measurement: what removing a whole residual branch costs, data-free (issue 12, speed).

On this AVX-512 machine onnxruntime's Conv works in blocks of 16 channels, so a residual block whose
inner width is 16 (ResNet-56's first stage) gets faster only if its branch goes entirely. The
data-free replacement of a branch ``BN(conv2(...))`` is its expected value, the BatchNorm's bias β
per channel (its input has the running mean on the training data, so its output has mean β). For
each residual Add of the model, that branch alone is replaced by β and the top-1 on the exact data
is measured (``bench_rd.Evaluator``, one onnxruntime thread), with the relative L2 drift of the
logits. No redpp-onnx pass is involved: this asks whether such a pass would be worth building.

    python benchmarks/proto_block_drop.py [--models resnet20,resnet56] [--cache /tmp/rd_cache]
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from _common import shared_parser, write_json  # noqa: E402
from bench_rd import MODELS, Evaluator  # noqa: E402


def branch_to_beta(model: onnx.ModelProto, add_index: int):
    """The model with the residual Add ``add_index``'s BatchNorm operand replaced by its β (None when the
    Add has no BatchNorm operand)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    producer = {o: n for n in out.graph.node for o in n.output}
    add = out.graph.node[add_index]
    k = next((k for k, x in enumerate(add.input) if x in producer and producer[x].op_type == "BatchNormalization"),
             None)
    if k is None:
        return None
    bn = producer[add.input[k]]
    beta = numpy_helper.to_array(next(t for t in out.graph.initializer if t.name == bn.input[2]))
    name = bn.output[0] + "__beta"
    out.graph.initializer.append(numpy_helper.from_array(beta.reshape(1, -1, 1, 1).astype(np.float32), name))
    add.input[k] = name
    return out


def main(argv=None):
    ap = shared_parser(__doc__, "block_drop.json")
    ap.add_argument("--models", default="resnet20,resnet56")
    ap.add_argument("--cache", default="/tmp/rd_cache")
    args = ap.parse_args(argv)
    data = {}
    for key in args.models.split(","):
        model_file, data_file, _, batch = MODELS[key]
        ev = Evaluator(Path(args.shared) / model_file, Path(args.shared) / data_file, Path(args.cache), batch)
        rows = []
        for i, node in enumerate(ev.model.graph.node):
            if node.op_type != "Add":
                continue
            m = branch_to_beta(ev.model, i)
            if m is None:
                continue
            r = ev.model_result(m)
            rows.append({"add": node.name or node.output[0], "top1": r["top1"], "logit_rel_l2": r["logit_rel_l2"],
                         "drop_points": 100 * (ev.ref_top1 - r["top1"])})
            print(f"{key} {rows[-1]['add']:40} top-1 {r['top1']:.4f} ({rows[-1]['drop_points']:+.2f} points) "
                  f"logit drift {r['logit_rel_l2']:.3f}", flush=True)
        drops = np.array([r["drop_points"] for r in rows])
        # several at once, the cheapest first by their measured drop on the exact data: an oracle choice,
        # the best any data-free choice of the same branches could do
        names = [n.name or n.output[0] for n in ev.model.graph.node]
        combined, m = [], ev.model
        order = sorted(rows, key=lambda r: r["drop_points"])
        for k, r in enumerate(order[:8], 1):
            m = branch_to_beta(m, names.index(r["add"]))
            if k in (2, 4, 6, 8):
                res = ev.model_result(m)
                combined.append({"branches": k, "top1": res["top1"], "drop_points": 100 * (ev.ref_top1 - res["top1"]),
                                 "logit_rel_l2": res["logit_rel_l2"]})
                print(f"{key}: the {k} cheapest branches at once: top-1 {res['top1']:.4f} "
                      f"({combined[-1]['drop_points']:+.2f} points)", flush=True)
        data[key] = {"combined_oracle": combined, "model": model_file, "data": data_file, "n": len(ev.y), "original_top1": ev.ref_top1,
                     "rows": rows, "median_drop_points": float(np.median(drops)),
                     "within_0.1_points": int(np.sum(drops <= 0.1))}
        print(f"{key}: {len(rows)} branches; median drop {np.median(drops):.2f} points; "
              f"{int(np.sum(drops <= 0.1))} within 0.1 point", flush=True)
    write_json(args.out, data)


if __name__ == "__main__":
    main()
