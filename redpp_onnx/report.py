"""The compression report: a JSON contract (what users parse) and a table (what users read).

JSON keys (stable; later steps add to them):
``model``: ``params_before/after``, ``pruning_ratio`` (removed / original float weights of the
eligible layers), ``distinct_values_before/after`` and ``distinct_reduction`` (summed over
eligible layers; reduction = 1 - after / before), ``macs_before/after`` (eligible layers, one
sample, at the ``--input-shape`` sizes; null when an output shape is unknown, printed "unknown"),
``file_bytes_before/after``, ``nodes_before/after`` (count per op type), ``eligible_layers``,
``refused_layers``.
``layers[]``: per layer ``name``, ``op_type``, ``shape``, ``params``, ``macs``, ``method``
(``rd``, ``kde``, ``uniform-int8`` or ``unchanged``), ``distinct_before/after`` (values kept),
``bandwidth``, ``factor`` (rd: median over the layer's codebooks), ``modes``, ``rel_error``, ``u_l``
(kde), ``seconds``, ``reasons`` (why it was left unchanged or refused; ``eligible`` false for
refused); rate-distortion hashing adds ``granularity`` ("tensor", "groups of g", "channel",
"unchanged"), ``codebooks``, ``bits_per_weight`` (entropy-coded, tables included, as counted by
the allocation), ``sensitivity`` and ``sensitivity_proxy``, ``weighted_rel_error``,
``predicted_error`` (this layer's predicted relative L2 error of the logits) and ``correction``;
``code_bits`` / ``codebook_type`` are what the file stores.
``verify``: ``max_abs_diff``, ``max_rel_l2``, what was fed and how many samples (or ``skipped``:
see ``verify.VerifyResult``). ``timings``: seconds per stage.
``notes``: what changed in the function and why it holds.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Optional


@dataclasses.dataclass
class Report:
    tool: dict
    config: dict
    model: dict
    layers: list
    verify: dict
    timings: dict
    notes: list
    input: Optional[str] = None
    output: Optional[str] = None
    merge_groups: Optional[list] = None   # the channel groups of the merge step
    calibration: Optional[dict] = None    # DATA-DRIVEN α choice (--calibrate)
    plots: Optional[list] = None          # --plot: the figures written

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, default=_json_default) + "\n"

    def table(self) -> str:
        return render_table(self)


def _json_default(obj):
    try:
        import numpy as np

        if isinstance(obj, np.generic):
            return obj.item()
    except ImportError:  # pragma: no cover
        pass
    if isinstance(obj, tuple):
        return list(obj)
    raise TypeError(f"not JSON serializable: {type(obj).__name__}")


def _fed(name: str, spec: dict) -> str:
    """One verification input as the table says it: ``ids uniform 0..29999``, ``x N(0, 1)``."""
    kind = spec.get("distribution")
    if kind == "uniform integers":
        return f"{name} uniform {spec['range'][0]}..{spec['range'][1]}"
    if kind == "constant":
        return f"{name} = {spec['value']}"
    return f"{name} N(0, 1)"


def _num(x, fmt="{:,}") -> str:
    return "-" if x is None else fmt.format(x)


def _macs(x, rows) -> str:
    """A MAC total; None is "unknown" (a shape that depends on a dynamic dimension) when there
    are eligible layers, "-" when there are none."""
    return "unknown" if x is None and rows else _num(x)


def _ratio(before, after) -> str:
    if not before or after is None:
        return "-"
    return f"{100.0 * (after - before) / before:+.2f}%"


def render_table(r: Report) -> str:
    lines = []
    rows = [l for l in r.layers if l.get("eligible", True)]
    if rows and any(l.get("granularity") for l in rows):
        header = (f"{'layer':32} {'op':6} {'params':>9} {'codebooks':>14} {'values':>7} {'bits/w':>6} "
                  f"{'sensitivity':>11} {'rel err':>8} {'pred err':>8}  note")
        lines += [header, "-" * len(header)]
        for l in (l for l in rows if "distinct_before" in l):
            name = l["name"] if len(l["name"]) <= 32 else "…" + l["name"][-31:]
            gran = l.get("granularity") or "-"
            books = gran if gran in ("tensor", "unchanged") else f"{l.get('codebooks')} ({gran.replace('groups of ', 'x')})"
            note = "; ".join(l.get("hash_reasons", []) + ([l["correction"]] if l.get("correction") else []))
            lines.append(f"{name:32} {l['op_type']:6} {l['params']:>9,} {books:>14} {l['distinct_after']:>7,} "
                         f"{_num(l.get('bits_per_weight'), '{:.2f}'):>6} {_num(l.get('sensitivity'), '{:.3g}'):>11} "
                         f"{l['rel_error']:>8.4f} {_num(l.get('predicted_error'), '{:.4f}'):>8}  {note}")
    elif rows and any("distinct_before" in l for l in rows):
        header = f"{'layer':32} {'op':6} {'params':>9} {'distinct':>17} {'f':>7} {'rel err':>8} {'u_l':>9}  note"
        lines += [header, "-" * len(header)]
        for l in (l for l in rows if "distinct_before" in l):
            name = l["name"] if len(l["name"]) <= 32 else "…" + l["name"][-31:]
            distinct = f"{l['distinct_before']:,} -> {l['distinct_after']:,}"
            note = "; ".join(l.get("hash_reasons", []))
            lines.append(f"{name:32} {l['op_type']:6} {l['params']:>9,} {distinct:>17} "
                         f"{_num(l.get('factor'), '{:.3g}'):>7} {l['rel_error']:>8.4f} "
                         f"{_num(l.get('u_l'), '{:.2e}'):>9}  {note}")
    split_rows = [l for l in rows if "split" in l]
    if split_rows:
        header = f"{'split':32} {'decision':8} {'kernels kept':>17} {'zero':>6} {'params':>17} {'ratio':>6}  fused / reason"
        lines += ["", header, "-" * len(header)]
        for l in split_rows:
            sp = l["split"]
            name = l["name"] if len(l["name"]) <= 32 else "…" + l["name"][-31:]
            kept = f"{sp['kernels_unique']:,}/{sp['kernels_total']:,}"
            params = f"{sp['params_before']:,} -> {sp['params_after']:,}"
            why = "+".join(sp["fused"]) if sp["decision"] == "split" else "; ".join(
                x for x in l["reasons"] if x.startswith(("kept", "--split", "auto_pad", "1-D", "3-D")))
            lines.append(f"{name:32} {sp['decision']:8} {kept:>17} {sp['kernels_zero']:>6,} {params:>17} "
                         f"{_num(sp.get('predicted_ratio'), '{:.2f}'):>6}  {why}")
    refused = [l for l in r.layers if not l.get("eligible", True)]
    if refused:
        lines.append("")
        lines.append(f"not eligible ({len(refused)}):")
        for l in refused[:10]:
            lines.append(f"  {l['name']} ({l['op_type']}): {'; '.join(l['reasons'])}")
        if len(refused) > 10:
            lines.append(f"  ... and {len(refused) - 10} more (see the JSON report)")
    m = r.model
    lines.append("")
    summary = [("", "before", "after", "change"),
               ("float params (eligible)", _num(m["params_before"]), _num(m["params_after"]),
                _ratio(m["params_before"], m["params_after"])),
               ("distinct weight values", _num(m.get("distinct_values_before")), _num(m.get("distinct_values_after")),
                _ratio(m.get("distinct_values_before"), m.get("distinct_values_after"))),
               ("MACs (eligible, 1 sample)", _macs(m["macs_before"], rows), _macs(m["macs_after"], rows),
                _ratio(m["macs_before"], m["macs_after"])),
               ("file bytes", _num(m["file_bytes_before"]), _num(m["file_bytes_after"]),
                _ratio(m["file_bytes_before"], m["file_bytes_after"]))]
    if m.get("bits_per_eligible_weight") is not None and m.get("file_bytes_after"):
        bits = m["bits_per_eligible_weight"]
        before = m.get("weight_bits_before", 32.0)
        summary += [("bits / eligible weight (file)", f"{before:.2f}", f"{bits:.2f}",
                     f"/{before / bits:.2f}" if bits else "-"),
                    ("file ratio", "", f"{m['file_bytes_before'] / m['file_bytes_after']:.2f}x smaller", "")]
    unknown = sum(1 for l in rows if l.get("macs", 0) is None)
    for a, b, c, d in summary:
        lines.append(f"{a:28} {b:>16} {c:>16} {d:>9}")
        if a.startswith("MACs") and unknown:
            lines.append(f"  (unknown: the output shapes of {unknown} of {len(rows)} eligible layers are not known; "
                         "give the sizes the model leaves dynamic with --input-shape NAME=D0,D1,...)")
    before, after = m.get("nodes_before") or {}, m.get("nodes_after") or {}
    changed = [op for op in sorted(set(before) | set(after)) if before.get(op, 0) != after.get(op, 0)]
    lines.append(f"{'nodes':28} {sum(before.values()):>16,} {sum(after.values()):>16,}")
    for op in changed:
        lines.append(f"{'  ' + op:28} {before.get(op, 0):>16,} {after.get(op, 0):>16,}")
    v = r.verify
    lines.append("")
    if "skipped" in v:
        lines.append(f"verify: skipped ({v['skipped']})")
    else:
        fed = (f"{v.get('samples', '?')} samples of {v.get('source', 'your data')}" if v.get("data") == "user" else
               f"{v.get('samples', '?')} seeded synthetic samples: "
               + ", ".join(_fed(name, i) for name, i in (v.get("inputs") or {}).items()))
        cos = [o["cosine_min"] for o in v.get("outputs", []) if o.get("cosine_min") is not None]
        lines.append(f"verify: max |diff| {v['max_abs_diff']:.3g}, max relative L2 {v['max_rel_l2']:.3g}"
                     + (f", min cosine {min(cos):.4f}" if cos else "") + f" ({fed}; onnxruntime)")
    for note in r.notes:
        lines.append(f"warning: {note[len('WARNING: '):]}" if note.startswith("WARNING: ") else f"note: {note}")
    return "\n".join(lines) + "\n"
