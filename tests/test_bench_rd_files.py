"""benchmarks/_rd_files.py: the real file bench_rd.py writes for an RD output is the one
``redpp-onnx compress`` writes (same bytes, same bits per eligible weight), and the merge/split
analysis after hashing reports what the passes count."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx

from redpp_onnx import io
from redpp_onnx.analysis.layers import ConstantTensors, scan_layers
from redpp_onnx.compress import compress
from redpp_onnx.config import CompressConfig, HashConfig
from redpp_onnx.hashing import rd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import _rd_files  # noqa: E402

DIGITS = ROOT / "models" / "digits_cnn.onnx"


def test_real_file_is_what_compress_writes(tmp_path):
    model = io.load_model(DIGITS)
    eligible = sum(l.params for l in scan_layers(model).layers)
    out, res = rd.rd_hash(model, 0.1, **rd.EFFORTS["fast"])
    got = _rd_files.real_file(model, out, res, DIGITS, eligible, tmp_path / "rd.onnx")
    assert got["file_decodes_exactly"] and got["file_codebook_layers"] == len(res.layers)
    assert got["file_storage"]["form"] == "standard-ops + map"
    assert got["file_bytes"] == (tmp_path / "rd.onnx").stat().st_size
    assert 0 < got["file_bits_per_eligible_weight"] < 32 and got["file_ratio"] > 1

    cfg = CompressConfig(steps=("hash",), hash=HashConfig(budget=0.1, effort="fast"), verify=False)
    cm, report = compress(DIGITS, cfg, file_bytes_before=DIGITS.stat().st_size)
    assert len(io.serialize(cm)) == got["file_bytes"]
    assert abs(report.model["bits_per_eligible_weight"] - got["file_bits_per_eligible_weight"]) < 1e-9
    stored = onnx.load(str(tmp_path / "rd.onnx"))
    assert stored.SerializeToString() == io.serialize(cm)  # the same file, byte for byte
    plain = ConstantTensors(out)
    for info in res.layers:  # the helper does not change the plain output
        assert np.array_equal(plain.array(info.weight), ConstantTensors(out).array(info.weight))


def test_after_hashing_counts(tmp_path):
    model = io.load_model(DIGITS)
    out, _ = rd.rd_hash(model, 0.1, **rd.EFFORTS["fast"])
    a = _rd_files.after_hashing(out)
    assert a["merge"]["function_changed"] is False and a["merge"]["channels_removed"] >= 0
    convs, every = a["split"]["convs"], a["split"]["all"]
    assert 0 < convs["kernels_unique"] + convs["kernels_zero"] <= convs["kernels_total"]
    assert every["kernels_total"] >= convs["kernels_total"] and convs["layers"] <= every["layers"]
    old = _rd_files.old_default(model)
    f = _rd_files.store_file(old, DIGITS, sum(l.params for l in scan_layers(model).layers), tmp_path / "k.onnx")
    assert f["file_decodes_exactly"] and f["file_bits_per_eligible_weight"] < 32


def test_compact_file_is_what_compress_writes(tmp_path):
    model = io.load_model(DIGITS)
    eligible = sum(l.params for l in scan_layers(model).layers)
    out, res = rd.rd_hash(model, 0.1, **rd.EFFORTS["fast"])
    std = _rd_files.real_file(model, out, res, DIGITS, eligible, tmp_path / "rd.onnx")
    got = _rd_files.real_file(model, out, res, DIGITS, eligible, tmp_path / "rd.compact.onnx", form="compact")
    assert got["file_decodes_exactly"] and got["file_storage"]["form"] == "compact"
    assert got["file_bytes"] == (tmp_path / "rd.compact.onnx").stat().st_size < std["file_bytes"]

    cfg = CompressConfig(steps=("hash",), hash=HashConfig(budget=0.1, effort="fast"), verify=False, storage="compact")
    cm, report = compress(DIGITS, cfg, file_bytes_before=DIGITS.stat().st_size)
    assert onnx.load(str(tmp_path / "rd.compact.onnx")).SerializeToString() == io.serialize(cm)
    assert abs(report.model["bits_per_eligible_weight"] - got["file_bits_per_eligible_weight"]) < 1e-9
