"""``compress(model, config) -> (ModelProto, Report)``: the library entry the CLI is a thin layer over."""

from __future__ import annotations

import dataclasses
import time
from typing import Callable, Optional, Union

import onnx

from . import __version__, io, verify
from .config import CompressConfig
from .errors import RedppError
from .passes.hash import HashPass, refusal_dict
from .report import Report

Progress = Callable[[int, int, str], None]


def compress(model: Union[str, onnx.ModelProto], config: CompressConfig = CompressConfig(), *,
             progress: Optional[Progress] = None, file_bytes_before: Optional[int] = None):
    """Run the configured steps on ``model`` (a path or a ModelProto, never modified).

    Returns the new ``ModelProto`` and its :class:`~redpp_onnx.report.Report`. ``progress(i, n,
    layer)`` is called as layers are processed.
    """
    timings = {}
    t0 = time.perf_counter()
    source = None
    if not isinstance(model, onnx.ModelProto):
        source = str(model)
        model = io.load_model(model)
    timings["load"] = time.perf_counter() - t0
    if file_bytes_before is None:
        file_bytes_before = len(io.serialize(model))

    t = time.perf_counter()
    result = HashPass(config.hash, codebook=config.codebook, progress=progress).run(model)
    timings["hash"] = time.perf_counter() - t
    out = result.model
    try:
        onnx.checker.check_model(out)
    except onnx.checker.ValidationError as err:  # a bug of ours, not the user's: say so
        raise RuntimeError(f"redpp-onnx produced an invalid model ({err}); please report it") from err

    layers = [dict(dataclasses.asdict(l), eligible=True) for l in result.layers]
    layers += [dict(refusal_dict(r), eligible=False) for r in result.refused]
    params = sum(l.params for l in result.layers)
    macs = [l.macs for l in result.layers]
    macs_total = sum(macs) if macs and None not in macs else None
    d_before = sum(l.distinct_before for l in result.layers)
    d_after = sum(l.distinct_after for l in result.layers)
    file_after = len(io.serialize(out))
    summary = {
        "params_before": params, "params_after": params,  # hashing removes no weight
        "pruning_ratio": 0.0,
        "distinct_values_before": d_before, "distinct_values_after": d_after,
        "distinct_reduction": (1 - d_after / d_before) if d_before else 0.0,
        "macs_before": macs_total, "macs_after": macs_total,
        "file_bytes_before": file_bytes_before, "file_bytes_after": file_after,
        "eligible_layers": len(result.layers), "refused_layers": len(result.refused),
        "changed_layers": sum(1 for l in result.layers if l.method != "unchanged"),
        "codebook_layers": result.codebook_layers,
    }

    verify_info = {"skipped": "disabled (--no-verify)"}
    if config.verify:
        t = time.perf_counter()
        try:
            verify_info = verify.compare(model, out, batch=config.verify_batch, seed=config.seed).to_dict()
        except RedppError as err:
            verify_info = {"skipped": str(err)}
        except Exception as err:  # noqa: BLE001 - onnxruntime's errors have many types
            raise RedppError(f"onnxruntime cannot run the model: {str(err).splitlines()[0]}") from None
        timings["verify"] = time.perf_counter() - t
    timings["total"] = time.perf_counter() - t0

    h = config.hash
    notes = []
    if summary["changed_layers"]:
        if h.uniform_int8:
            notes.append("weights are uniform int8 quantize-dequantized (baseline): the function changes")
        else:
            budget = (f"fixed bandwidth factor f={h.bandwidth_factor:g}" if h.bandwidth_factor
                      else f"per-layer relative weight error <= {h.weight_error:g}")
            notes.append(f"hashing changes the function: every weight moves to the mode of its KDE cell "
                         f"({budget}); 'analyze' bounds the effect on the logits, data-free")
    else:
        notes.append("no layer was changed: the output computes exactly what the input does")
    report = Report(tool={"name": "redpp-onnx", "version": __version__},
                    config=dataclasses.asdict(config), model=summary, layers=layers,
                    verify=verify_info, timings=timings, notes=notes, input=source)
    return out, report
