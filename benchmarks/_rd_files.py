"""Real files and the later steps for the outputs of RD hashing (``bench_rd.py``).

* :func:`hash_pass_result`: the :class:`~redpp_onnx.passes.hash.HashPassResult` that
  ``HashPass._run_rd`` builds from ``rd.rd_hash``'s output (``passes.hash.rd_pass_result``:
  per-layer rows, the lattice unit of every output channel's codebook, the channel -> codebook
  map), so that the storage of ``redpp-onnx compress`` (``store_codebooks``) writes it;
* :func:`real_file`: that file, written, with its bytes, the bits per eligible weight of
  ``compress.set_file_bits`` and a check that it decodes to exactly the hashed weights;
* :func:`after_hashing`: exact merge (``MergePass(MergeConfig())``) and the split analysis
  (``SplitPass(SplitConfig(mode="auto"))``) on a hashed model, as ``compress`` runs them after
  hashing: channels merged, unique and zero kernels.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import onnx

from redpp_onnx import io, storage
from redpp_onnx.analysis.layers import ConstantTensors
from redpp_onnx.config import HashConfig
from redpp_onnx.passes.hash import HashPass, HashPassResult, rd_pass_result, store_codebooks
from redpp_onnx.passes.merge import MergeConfig, MergePass
from redpp_onnx.passes.split import SplitConfig, SplitPass


def hash_pass_result(model: onnx.ModelProto, out: onnx.ModelProto, res) -> HashPassResult:
    """``HashPassResult`` of ``(out, res) = rd.rd_hash(model, ...)`` as ``compress`` builds it
    (``passes.hash.rd_pass_result``); ``out`` is copied."""
    copy = onnx.ModelProto()
    copy.CopyFrom(out)
    return rd_pass_result(model, copy, res)


def file_bits(file_bytes: int, original_bytes: int, eligible: int) -> float:
    """``compress.set_file_bits``: what the eligible weights cost in the file, every other byte
    counted as in the original (float32 weights: 32 bits)."""
    return max(0.0, (file_bytes - (original_bytes - 4 * eligible)) * 8 / eligible)


def real_file(model: onnx.ModelProto, out: onnx.ModelProto, res, original: Path, eligible: int,
              dst: Path, form: str = "standard") -> dict:
    """Write ``out`` (RD hashing's output, plain float32 weights) as ``redpp-onnx compress
    [--storage FORM]`` stores it (``store_codebooks``) to ``dst``: see :func:`store_file`."""
    return store_file(hash_pass_result(model, out, res), original, eligible, dst, form)


def store_file(result: HashPassResult, original: Path, eligible: int, dst: Path, form: str = "standard") -> dict:
    """``store_codebooks(result, form)`` written to ``dst`` (``result.model`` is not changed): its
    bytes, bits per eligible weight (file), file ratio (original bytes / these), the layers
    stored as codebooks, the storage form, and whether the file decodes
    (``storage.materialize``: the map's C++ decoder, or the compact form's rANS decoder) to
    exactly the plain weights."""
    plain = result.model
    copy = onnx.ModelProto()
    copy.CopyFrom(plain)
    result = dataclasses.replace(result, model=copy, layers=[dataclasses.replace(r, reasons=list(r.reasons))
                                                               for r in result.layers])
    store_codebooks(result, form)
    stored = result.model
    if form == "standard":  # the compact form's Decode op has no onnx schema
        onnx.checker.check_model(stored)
    dst.parent.mkdir(parents=True, exist_ok=True)
    size = io.save_model(stored, dst, force=True)
    before = original.stat().st_size
    consts, decoded = ConstantTensors(plain), ConstantTensors(storage.materialize(stored))
    exact = all(np.array_equal(decoded.array(w), consts.array(w)) for w in result.lattice_units)
    notes = sorted({r for row in result.layers for r in row.reasons if r.startswith("codebook storage")})
    return {"file_bytes": int(size), "file_bits_per_eligible_weight": file_bits(size, before, eligible),
            "file_ratio": before / size, "file_codebook_layers": int(result.codebook_layers),
            "file_storage": {k: v for k, v in storage.describe(stored).items() if k in
                             ("form", "tensors", "grouped_tensors", "mapped_tensors", "fast_path")},
            "file_decodes_exactly": bool(exact), "file_notes": notes, "file": dst.name}


def _kernels(rows, convs_only: bool) -> dict:
    rs = [r for r in rows if not convs_only or r.decision != "counted"]
    total = sum(r.kernels_total for r in rs)
    unique = sum(r.kernels_unique for r in rs)
    zero = sum(r.kernels_zero for r in rs)
    params = sum(r.params_before for r in rs)
    kept = sum(r.params_after for r in rs)
    return {"layers": len(rs), "kernels_total": int(total), "kernels_unique": int(unique),
            "kernels_zero": int(zero), "unique_fraction": unique / total if total else None,
            "zero_fraction": zero / total if total else None,
            "params_removed_fraction": (params - kept) / params if params else None}


def after_hashing(hashed: onnx.ModelProto) -> dict:
    """Exact merge then the split analysis (``--split auto``) on a hashed model (plain weights):
    channels merged, params removed by merging, and per model the unique / zero kernels summed
    over the Conv layers (``convs``) and over every eligible layer as the split pass counts them
    (``all``: Gemm/MatMul "kernels" are scalars), with the layers ``--split auto`` would rewrite."""
    merged = MergePass(MergeConfig()).run(hashed)
    split = SplitPass(SplitConfig(mode="auto")).run(merged.model)
    return {"merge": {"channels_removed": int(merged.channels_removed),
                      "params_before": int(merged.params_before), "params_after": int(merged.params_after),
                      "pruning_ratio": float(merged.pruning_ratio), "function_changed": bool(merged.function_changed),
                      "other_params_removed": int(merged.other_params_removed)},
            "split": {"convs": _kernels(split.layers, True), "all": _kernels(split.layers, False),
                      "layers_split_auto": sum(r.decision == "split" for r in split.layers)}}


def old_default(model: onnx.ModelProto) -> HashPassResult:
    """The previous default hashing: per-layer KDE within ε = 0.01 (``HashConfig(method="kde")``),
    plain weights (pass the result to :func:`store_file` for its file)."""
    return HashPass(HashConfig(method="kde")).run(model)
