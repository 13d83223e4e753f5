"""Baselines a user can already get as real files, measured by the same benchmark as ours:

* onnxruntime's own weight-only tool, ``onnxruntime.quantization.quantize_dynamic`` (int8 weights,
  per-tensor by default or per-channel, QInt8 / QUInt8): the file it writes, run in onnxruntime;
* fp16 weights: every eligible float32 weight stored as float16 and cast back to float32 by a
  ``Cast`` node (what a user gets from a float16 export that keeps float32 activations).

Each function writes a real file and returns its path; the caller measures bytes and accuracy.
Stored bits per eligible weight are counted from the file's tensors (see ``eligible_bits``).
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from redpp_onnx import io
from redpp_onnx.analysis.layers import scan_layers


def ort_quantize_dynamic(src: Path, dst: Path, *, per_channel: bool = False, unsigned: bool = False) -> Path:
    """onnxruntime's data-free int8 weight quantization (dynamic activations), as shipped."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    logging.getLogger().setLevel(logging.ERROR)  # it advises pre-processing on every call
    quantize_dynamic(str(src), str(dst), per_channel=per_channel,
                     weight_type=QuantType.QUInt8 if unsigned else QuantType.QInt8)
    return dst


def fp16_weights(src: Path, dst: Path) -> Path:
    """Eligible float32 weights stored as float16, each read through a Cast to float32."""
    model = io.load_model(src)
    weights = {layer.weight for layer in scan_layers(model).layers}
    inits = {t.name: t for t in model.graph.initializer}
    casts = []
    for name in sorted(weights):
        t = inits[name]
        half = numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float16), name + "__fp16")
        t.CopyFrom(half)
        casts.append(helper.make_node("Cast", [name + "__fp16"], [name], to=onnx.TensorProto.FLOAT,
                                      name=name + "__cast"))
    nodes = casts + list(model.graph.node)
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    io.save_model(model, dst, force=True)
    return dst


def eligible_weights(src: Path) -> int:
    """How many eligible weights the ORIGINAL model has (the denominator of bits per weight)."""
    return sum(layer.params for layer in scan_layers(io.load_model(src)).layers)


def file_bits_per_weight(original: Path, compressed: Path) -> float:
    """(file bytes of ``compressed`` - bytes of the original's non-eligible part) * 8 / eligible weights:
    what the eligible weights cost in the real file, everything else counted as in the original."""
    model = io.load_model(original)
    layers = scan_layers(model).layers
    eligible_bytes = sum(layer.params for layer in layers) * 4
    rest = original.stat().st_size - eligible_bytes
    return (compressed.stat().st_size - rest) * 8 / sum(layer.params for layer in layers)
