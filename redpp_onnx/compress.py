"""``compress(model, config) -> (ModelProto, Report)``: the library entry the CLI is a thin layer over.

Steps run in order (hash -> merge -> split), each a pass that returns a new model; ``--codebook``
storage is applied last, to the hashed weights that are still plain tensors. Then the result is
checked (onnx.checker), verified against the original in onnxruntime, and reported.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable, Optional, Union

import onnx

from . import __version__, io, storage, validate, verify
from .analysis.fold import fold_constant_casts, resolve_constant_identities, restore_constant_casts
from .analysis.layers import ConstantTensors, check_input_shapes, input_shapes, np_dtype, scan_layers
from .config import REDUCED_BUDGET_SHARE, CompressConfig, default_budget
from .errors import RedppError
from .passes.hash import HashPass, refusal_dict, store_codebooks
from .passes import layout
from .passes.merge import MergePass, calibrate
from .passes.split import SplitPass
from .report import Report
from .runtime import ORT_ERRORS, half_compute_note

Progress = Callable[[int, int, str], None]


def compress(model: Union[str, onnx.ModelProto], config: CompressConfig = CompressConfig(), *,
             progress: Optional[Progress] = None, file_bytes_before: Optional[int] = None,
             plot_dir: Optional[str] = None):
    """Run the configured steps on ``model`` (a path or a ModelProto, never modified).

    Returns the new ``ModelProto`` and its :class:`~redpp_onnx.report.Report`. ``progress(i, n,
    layer)`` is called as layers are processed. ``plot_dir``: also write the per-layer figures
    there (``plots.py``; needs matplotlib) and list them in ``report.plots``.
    """
    with input_shapes(config.input_shapes):
        return _compress(model, config, progress=progress, file_bytes_before=file_bytes_before,
                         plot_dir=plot_dir)


def _compress(model, config: CompressConfig, *, progress, file_bytes_before, plot_dir):
    timings = {}
    t0 = time.perf_counter()
    source = None
    if not isinstance(model, onnx.ModelProto):
        source = str(model)
        model = io.load_model(model)
    validate.check_tensor_data(model)
    model, input_notes = validate.check_input_model(model)
    if config.verify:
        validate.check_runtime(model)
    timings["load"] = time.perf_counter() - t0
    check_input_shapes(model, config.input_shapes)
    verify_data = verify.load_data(config.verify_data, model) if config.verify and config.verify_data else None
    if file_bytes_before is None:
        file_bytes_before = len(io.serialize(model))
    # exporters rename deduplicated constants with Identity nodes: the passes read them directly
    work, aliases = resolve_constant_identities(model)
    # float16 / bfloat16 weights cast to float32 for the compute: the passes see the float32 weights
    work, folded = fold_constant_casts(work)
    eligible_before = scan_layers(work, include_grouped=config.hash.include_depthwise, tables=True)

    out, hashed, merged, split, calibration = work, None, None, None, None
    reduce_first = "merge" in config.steps and config.merge.reduces and not config.calibrate
    if reduce_first:  # channels go before hashing: the kept weights are then hashed and stored
        t = time.perf_counter()
        merged = MergePass(config.merge, progress=_phase(progress, "reducing")).run(out)
        out = merged.model
        timings["merge"] = time.perf_counter() - t
    hash_config, budget_note = config.hash, []
    if reduce_first and merged.params_after < merged.params_before and "hash" in config.steps:
        hash_config, budget_note = _reduced_budget(config.hash, out)
    if "hash" in config.steps:
        t = time.perf_counter()
        hashed = HashPass(hash_config, progress=_phase(progress, "hashing")).run(out)
        out = hashed.model
        timings["hash"] = time.perf_counter() - t
    if "merge" in config.steps and not reduce_first:
        t = time.perf_counter()
        merge_config = config.merge
        if config.calibrate:
            try:
                calibration = calibrate(out, config.calibrate, config.max_drop, strategy=merge_config.strategy)
            except ValueError as err:  # a data set the evaluator cannot read
                raise RedppError(str(err).splitlines()[0]) from None
            merge_config = dataclasses.replace(merge_config, alpha=calibration.alpha)
            timings["calibrate"] = time.perf_counter() - t
        _phase(progress, "merging")
        merged = MergePass(merge_config).run(out)
        out = merged.model
        timings["merge"] = time.perf_counter() - t
    if "split" in config.steps:
        t = time.perf_counter()
        split = SplitPass(config.split, progress=_phase(progress, "splitting")).run(out)
        out = split.model
        timings["split"] = time.perf_counter() - t
    final_scan = scan_layers(out, include_grouped=config.hash.include_depthwise, tables=True)  # before codebooks:
    if config.codebook and hashed is not None:  # they only change how the same weights are stored
        hashed.model = out
        _phase(progress, "codebooks")
        store_codebooks(hashed, config.storage)
        out = hashed.model
    storage_info = storage.describe(out) if hashed is not None and hashed.codebook_layers else None
    out, restored = restore_constant_casts(out, folded)
    layout_result = None
    if config.layout:  # exact: zero channel paddings as 1x1 Convs (onnxruntime's NCHWc chain holds)
        layout_result = layout.rewrite(out, eligible_before.macs)
        out = layout_result.model
    try:
        onnx.checker.check_model(out)
    except onnx.checker.ValidationError as err:  # a bug of ours, not the user's: say so
        raise RuntimeError(f"redpp-onnx produced an invalid model ({err}); please report it") from err

    summary, layers = _summary(eligible_before, hashed, merged, split, config.split.tolerance, final_scan)
    if layout_result is not None and layout_result.rows:
        summary["layout"] = layout_result.to_dict()
        if summary["macs_after"] is not None:  # the 1x1 Convs count (exact, but not free)
            summary["macs_after"] += layout_result.macs_added
    summary["file_bytes_before"] = file_bytes_before
    summary["file_bytes_after"] = len(io.serialize(out))
    summary["nodes_before"] = _op_counts(model)
    summary["nodes_after"] = _op_counts(out)
    summary["storage"] = storage_info or {"form": "plain"}
    summary["weight_bits_before"] = _weight_bits(work, eligible_before)
    set_file_bits(summary)

    verify_info = {"skipped": "disabled (--no-verify)"}
    if config.verify:
        t = time.perf_counter()
        _phase(progress, "verifying")
        try:
            verify_info = verify.compare(model, out, batch=config.verify_batch, seed=config.seed,
                                         shapes=config.input_shapes, data=verify_data,
                                         samples=config.verify_samples, seconds=config.verify_seconds).to_dict()
        except RedppError as err:
            if verify_data is not None or str(err).startswith("onnxruntime cannot load the input model"):
                raise
            verify_info = {"skipped": str(err)}
        except ORT_ERRORS as err:  # the input model failing on a later batch (ours raise RuntimeError)
            raise RedppError(f"onnxruntime cannot run the input model: {verify.ort_message(err)}") from None
        timings["verify"] = time.perf_counter() - t
    timings["total"] = time.perf_counter() - t0
    if progress is not None:
        progress(1, 1, "")  # clears the line

    report = Report(tool={"name": "redpp-onnx", "version": __version__},
                    config=dataclasses.asdict(config), model=summary, layers=layers,
                    verify=verify_info, timings=timings,
                    notes=(input_notes + _notes(config, hashed, merged, split, calibration, storage_info) + _control_flow_note(model)
                           + half_compute_note(out) + _alias_note(aliases) + _cast_note(folded, restored) + _verify_warning(verify_info)
                           + _guess_note(verify_info) + _layout_note(layout_result) + budget_note),
                    input=source,
                    merge_groups=[dataclasses.asdict(g) for g in merged.groups] if merged else None,
                    calibration=dataclasses.asdict(calibration) if calibration else None)
    if plot_dir is not None:
        from .plots import write_plots

        report.plots = write_plots(plot_dir, model, report, hashed)
    return out, report


def _summary(scan, hashed, merged, split, config_tolerance, final_scan):
    """The report's ``model`` numbers and ``layers`` rows, one row per eligible layer."""
    rows = {l.node: {"name": l.node, "op_type": l.op_type, "weight": l.weight, "shape": list(l.weight_shape),
                     "params": l.params, "macs": l.macs, "eligible": True, "reasons": []}
            for l in scan.layers}
    if hashed is not None:
        for h in hashed.layers:
            rows[h.name].update({k: v for k, v in dataclasses.asdict(h).items() if k != "reasons"})
            rows[h.name]["reasons"] += h.reasons
            rows[h.name]["hash_reasons"] = list(h.reasons)
    if merged is not None:
        for m in merged.layers:
            if m.name in rows:
                rows[m.name]["merge"] = {k: v for k, v in dataclasses.asdict(m).items() if k != "reasons"}
                rows[m.name]["reasons"] += m.reasons
    if split is not None:
        for s in split.layers:
            d = dataclasses.asdict(s)
            rows.setdefault(s.name, {"name": s.name, "op_type": "Conv", "eligible": True, "reasons": [
                "became eligible after merge (e.g. a grouped Conv left with one group)"]})
            rows[s.name]["split"] = {k: d[k] for k in (
                "decision", "params_before", "params_after", "kernels_total", "kernels_unique", "kernels_zero",
                "index_bytes", "macs_dense", "products", "additions", "predicted_ratio", "fused")}
            rows[s.name]["reasons"] += s.reasons
    layers = list(rows.values()) + [dict(refusal_dict(r), eligible=False) for r in scan.refused]

    params = sum(l.params for l in scan.layers)
    merge_removed = merged.params_before - merged.params_after if merged else 0
    removed = merge_removed + (sum(s.params_removed for s in split.layers if s.decision == "split") if split else 0)
    removable = merge_removed + (sum(s.params_removed for s in split.layers if s.decision != "counted")
                                 if split else 0)
    macs_total = scan.macs
    # After: SplitConv layers count their products (additions separately), the others their MACs
    # in the final model (merging removes channels).
    final = {l.node: l.macs for l in final_scan.layers}
    done = {s.name: s for s in split.layers if s.decision == "split"} if split else {}
    after = [done[l.node].products if l.node in done else final.get(l.node) for l in scan.layers]
    macs_after = sum(after) if after and None not in after else None
    additions = sum(s.additions for s in done.values()) if done and all(
        s.additions is not None for s in done.values()) else (0 if split is not None else None)
    summary = {
        "params_before": params, "params_after": params - removed,
        "pruning_ratio": removed / params if params else 0.0,
        "macs_before": macs_total, "macs_after": macs_after, "split_additions": additions,
        "eligible_layers": len(scan.layers), "refused_layers": len(scan.refused),
    }
    if merged is not None:
        summary.update({"merge_params_removed": merge_removed, "merge_channels_removed": merged.channels_removed,
                        "merge_other_params_removed": merged.other_params_removed,
                        "merge_pruning_ratio": merge_removed / params if params else 0.0,
                        "merge_alpha": merged.config.alpha, "merge_strategy": merged.config.strategy,
                        "merge_rule": merged.config.rule, "merge_target_macs": merged.config.target_macs})
    if hashed is not None:
        d_before = sum(l.distinct_before for l in hashed.layers)
        d_after = sum(l.distinct_after for l in hashed.layers)
        summary.update({
            "distinct_values_before": d_before, "distinct_values_after": d_after,
            "distinct_reduction": (1 - d_after / d_before) if d_before else 0.0,
            "changed_layers": sum(1 for l in hashed.layers if l.method != "unchanged"),
            "codebook_layers": hashed.codebook_layers})
        if hashed.rd is not None:  # budget, predicted error, counted bits, proxy, effort, seconds per stage
            summary["rd"] = hashed.rd
    if split is not None:
        summary.update({
            "split_layers": sum(1 for s in split.layers if s.decision == "split"),
            "split_candidates": len(split.layers),
            "split_pruning_ratio_if_all": removable / params if params else 0.0,
            "split_tolerance": config_tolerance,
            "split_relaxed_max_error": max((s.relaxed_error for s in split.layers), default=0.0),
            "index_bytes": sum(s.index_bytes for s in split.layers if s.decision == "split")})
    return summary, layers


def _weight_bits(model: onnx.ModelProto, scan) -> float:
    """Bits per eligible weight in the input: 32 for float32, 16 for float16 / bfloat16 (averaged
    over the weights when the types are mixed)."""
    consts = ConstantTensors(model)
    total = sum(l.params for l in scan.layers)
    if not total:
        return 32.0
    bits = sum(l.params * 8 * np_dtype(consts.proto(l.weight).data_type).itemsize for l in scan.layers)
    return bits / total


def set_file_bits(summary: dict) -> None:
    """``bits_per_eligible_weight``: what the eligible weights cost in the output file, every other byte
    counted as in the input (``weight_bits_before`` bits per eligible weight: float32 32, float16 16)."""
    eligible = summary.get("params_before") or 0
    if eligible and summary.get("file_bytes_after") and summary.get("file_bytes_before"):
        rest = summary["file_bytes_before"] - summary.get("weight_bits_before", 32.0) / 8 * eligible
        summary["bits_per_eligible_weight"] = max(0.0, (summary["file_bytes_after"] - rest) * 8 / eligible)


def _op_counts(model: onnx.ModelProto) -> dict:
    counts = {}
    for node in model.graph.node:
        key = node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}::{node.op_type}"
        counts[key] = counts.get(key, 0) + 1
    return dict(sorted(counts.items()))


WARN_REL_L2 = 0.25
"""A verification relative L2 above this gets a warning (hashing alone gave <= 0.09 on the shared
models, whose accuracy it keeps). On synthetic inputs of models with integer or bool inputs (token
ids: random sequences, not sentences) it is a note instead: a sentence-embedding transformer gave
0.27 on them and 0.055 on real sentences, with its pair accuracy unchanged."""

_LOWER = "or lower the settings that change the function (--alpha, --split-tolerance, --weight-error)"
_EVAL = ("`redpp-onnx eval OUT.onnx --ref IN.onnx --data DATA.npz` (DATA.npz: one array per model input, keyed by "
         "the input names, samples first, plus optional labels or y for top-1; or the CIFAR/ImageNet layouts)")


def _verify_warning(verify_info: dict) -> list:
    """Above WARN_REL_L2: a warning that says on which inputs the figure was measured and names commands
    that read the user's own data (a note, not a warning, for synthetic token inputs)."""
    rel = verify_info.get("max_rel_l2")
    if rel is None or rel <= WARN_REL_L2:
        return []
    cos = [o["cosine_min"] for o in verify_info.get("outputs") or [] if o.get("cosine_min") is not None]
    figure = f"{rel:.3g} (relative L2" + (f"; cosine similarity min {min(cos):.3g}" if cos else "") + ")"
    n = verify_info.get("samples")
    if verify_info.get("data") == "user":
        src = verify_info.get("source", "the --verify-data inputs")
        return [f"WARNING: the outputs differ from the input model's by {figure} on {src} ({n} samples): accuracy is "
                f"probably lost; measure it with `redpp-onnx eval OUT.onnx --ref IN.onnx --data {src}` (with labels "
                f"or y in it, top-1 too), {_LOWER}"]
    inputs = verify_info.get("inputs") or {}
    tokens = [k for k, v in inputs.items() if isinstance(v, dict) and (
        str(v.get("why", "")).startswith("token ids")
        or (v.get("distribution") == "uniform integers" and v.get("dtype") in ("int32", "int64")))]
    if tokens:
        return [f"the outputs differ from the input model's by {figure} on synthetic inputs ({n} samples; "
                f"{', '.join(tokens)} random token ids, as the report's verify.inputs says). Random token sequences "
                "are not sentences and can overstate the drift (a sentence-embedding model: 0.27 on them, 0.055 on real "
                "sentences with its pair accuracy unchanged), so this is no verdict: verify on real inputs with "
                f"--verify-data DATA.npz or measure with {_EVAL}"]
    return [f"WARNING: the outputs differ from the input model's by {figure} on synthetic inputs ({n} seeded samples, "
            f"as the report's verify.inputs says): accuracy is probably lost; check on real inputs with --verify-data "
            f"DATA.npz or measure with {_EVAL}, {_LOWER}"]


def _phase(progress: Optional[Progress], label: str) -> Optional[Progress]:
    """Name the step a progress indicator shows (when it has a ``label``) and show it."""
    if progress is not None:
        if hasattr(progress, "label"):
            progress.label = label
        progress(0, 1, "")
    return progress


def _cast_note(folded: dict, restored: int) -> list:
    if not folded:
        return []
    return [f"{len(folded)} float16 / bfloat16 weight(s) cast to float32 for the compute were read as the float32 "
            f"they are computed in; {len(folded) - restored} stored as codebooks (decoded to float32, the Cast "
            f"gone), {restored} written back in their own type behind their Cast (values rounded to it)"]


def _alias_note(aliases: int) -> list:
    return [f"{aliases} Identity node(s) that only renamed a constant were removed; their consumers read the "
            "constant directly"] if aliases else []


def _guess_note(verify_info: dict) -> list:
    """When the verification was cut short by its time budget, and when dynamic dims were guessed:
    how to give them."""
    notes = _inputs_note(verify_info)
    if not verify_info.get("guessed_dims"):
        return notes
    shapes = "; ".join(f"{k} {v}" for k, v in verify_info["input_shapes"].items())
    return notes + [f"verification fed {shapes}: the dynamic dimensions of {', '.join(verify_info['guessed_dims'])} "
                    f"were guessed ({verify.GUESS_DIM}, or the first of {', '.join(map(str, verify.GUESS_FALLBACKS))} "
                    "at which the input model runs); give the real sizes with --input-shape NAME=D0,D1,... (also "
                    "counts MACs and lets --split auto predict timings for them)"]


def _inputs_note(verify_info: dict) -> list:
    """Said only when the verification figure is less certain than usual (the table's verify line
    says what was fed and how many samples)."""
    stopped = verify_info.get("stopped") or ""
    if not stopped.startswith("time budget"):
        return []
    return [f"verification stopped by its {stopped}, after {verify_info.get('samples')} samples; "
            "--verify-samples N fixes the count"]


def _control_flow_note(model: onnx.ModelProto) -> list:
    nodes = [n for n in model.graph.node
             if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in n.attribute)]
    if not nodes:
        return []
    kinds = ", ".join(sorted({n.op_type for n in nodes}))
    return [f"{len(nodes)} control-flow node(s) ({kinds}): their subgraphs are left untouched, and channels "
            "that a subgraph reads are not merged"]


def _reduced_budget(hash_config, model) -> tuple:
    """``(HashConfig, notes)``: the default hashing budget times REDUCED_BUDGET_SHARE after channels
    were removed (config.REDUCED_BUDGET_SHARE says why); a budget or bit target given is kept."""
    if (hash_config.method != "rd" or hash_config.uniform_int8 or hash_config.budget is not None
            or hash_config.target_bits is not None):
        return hash_config, []
    budget, _ = default_budget(model)
    budget *= REDUCED_BUDGET_SHARE
    return dataclasses.replace(hash_config, budget=budget), [
        f"hashing budget {budget:g} after the channel reduction ({REDUCED_BUDGET_SHARE:g} x the default for this "
        "output: a reduced model has less slack for the hashing's error; measured on the benchmark models after "
        "reductions of 5-35 % of the MACs, the full default cost 0.2-0.9 top-1 points beyond the reduction's own "
        "loss, this share at most one or two test images on three of four; docs/HASHING.md); --budget sets another"]


def _layout_note(result) -> list:
    if result is None or not result.rows:
        return []
    done = [r for r in result.rows if r.rewritten]
    left = [f"{r.name}: {r.reason}" for r in result.rows if not r.rewritten]
    note = []
    if done:
        note.append(f"layout: {len(done)} zero channel padding(s) (with {sum(r.slices for r in done)} strided "
                    f"Slice(s)) rewritten as 1x1 Conv, exact, +{result.macs_added:,} MACs counted: onnxruntime's "
                    "blocked NCHWc layout no longer breaks there (--no-layout keeps them)")
    if left:
        note.append("layout: not rewritten: " + "; ".join(left[:3]) + (" ..." if len(left) > 3 else ""))
    return note


def _notes(config, hashed, merged, split, calibration, storage_info=None) -> list:
    notes = []
    h = config.hash
    if hashed is not None and any(l.method != "unchanged" for l in hashed.layers):
        if h.uniform_int8:
            notes.append("weights are uniform int8 quantize-dequantized (baseline): the function changes")
        elif hashed.rd is not None:
            r = hashed.rd
            goal = (f"within {h.target_bits:g} bits per eligible weight" if h.target_bits is not None
                    else f"within a predicted relative L2 logit error of {r['budget']:g}")
            notes.append(f"hashing changes the function: rate-distortion hashing ({h.effort}) chose per layer the "
                         f"codebook granularity and bandwidth with the fewest stored bits {goal} (predicted "
                         f"{r['predicted_error']:.3g}, sensitivity '{r['proxy']}', data-free; the verify line "
                         f"measures it); {r['bits_per_weight']['entropy']:.2f} entropy-coded bits per eligible "
                         "weight counted; the BatchNorm after each layer (or its bias) absorbs the mean shift "
                         "and gain; --budget / --target-bits set the trade, --weight-error selects the "
                         "paper's per-layer rule instead")
            notes += list(r.get("notes") or [])
        else:
            budget = (f"fixed bandwidth factor f={h.bandwidth_factor:g}" if h.bandwidth_factor
                      else f"per-layer relative weight error <= {h.weight_error:g}")
            notes.append(f"hashing changes the function: every weight moves to the mode of its KDE cell "
                         f"({budget}); 'analyze' bounds the effect on the logits, data-free")
    if storage_info and storage_info.get("load"):
        load = storage_info["load"]
        notes.append(f"stored as codebooks ({storage_info['form']}, {storage_info.get('stored_weights', 0):,} weights): "
                     f"redpp_onnx.session() {load['redpp_onnx.session']}; plain onnxruntime {load['onnxruntime']} "
                     "(--plain writes float32 tensors instead)")
    if merged is not None:
        notes += list(merged.notes)
    if calibration is not None:
        notes.append(f"DATA-DRIVEN: merge α = {calibration.alpha:g} was chosen on {calibration.data} "
                     f"(largest α within a {calibration.max_drop_points:g}-point top-1 drop); the rest is data-free")
    if split is not None:
        convs = [s for s in split.layers if s.decision != "counted"]
        n = sum(1 for s in convs if s.decision == "split")
        form = "standard ONNX ops (--portable)" if config.split.portable else "ai.redpp::SplitConv"
        exact = ("exact: same function up to float summation order" if not config.split.tolerance else
                 f"RELAXED: kernels closer than a per-layer distance replaced by their mean, relative weight "
                 f"error <= {config.split.tolerance:g} per layer: the function changes")
        notes.append(f"split: {n} of {len(convs)} Conv layers rewritten as {form} ({exact}); the others are "
                     f"kept, each with its reason")
    changed = ((hashed is not None and any(l.method != "unchanged" for l in hashed.layers))
               or (merged is not None and merged.params_after < merged.params_before)
               or (split is not None and any(s.decision == "split" for s in split.layers)))
    if not changed:
        notes.insert(0, "no layer was changed: the output computes exactly what the input does")
    return notes
