"""benchmarks/bench_reduce_ceiling.py: the real-data rows lift the tool's two data-free guards only
while they run, and the rendered section picks, per method, the most MACs removed within the bar on
the held-out half."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from redpp_onnx.passes import refit as RF
from redpp_onnx.passes import twin_plan as TP

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_reduce_ceiling as C  # noqa: E402
import render_results  # noqa: E402


def test_oracle_settings_are_restored_even_on_error():
    unavailable, rows = TP.unavailable, RF.ROWS_PER_FEATURE
    with C.oracle_settings():
        assert TP.unavailable([], None) is None
        assert RF.ROWS_PER_FEATURE == C.ROWS_PER_FEATURE_REAL != rows
    assert (TP.unavailable, RF.ROWS_PER_FEATURE) == (unavailable, rows)
    with pytest.raises(ZeroDivisionError):
        with C.oracle_settings():
            1 / 0
    assert (TP.unavailable, RF.ROWS_PER_FEATURE) == (unavailable, rows)


def _row(method, target, macs, drop):
    return {"method": method, "target": target, "macs_removed": macs, "top1_held_out": 0.9 - drop,
            "top1_all": 0.9 - drop, "drop_held_out": drop, "seconds": 0.0}


def test_section_picks_the_most_macs_within_the_bar():
    a, b = C.METHODS[0], C.METHODS[3]
    data = {"methods": list(C.METHODS), "models": {"m": {
        "model": "m.onnx", "n_calibration": 10, "n_held_out": 10, "rows_per_feature_real": 4, "seconds": 1.0,
        "original": {"top1_held_out": 0.9, "top1_all": 0.9}, "bar_points": 1.0, "drift_table": [[0, 8, 0.1, 5.0]],
        "rows": [_row(a, 0.95, 0.05, 0.03), _row(a, 0.9, 0.10, 0.08),
                 _row(b, 0.95, 0.05, 0.0), _row(b, 0.9, 0.10, 0.01), _row(b, 0.85, 0.15, 0.011)]}}}
    text = "\n".join(render_results.section_reduce_ceiling(data))
    assert f"{a} none" in text                      # 3 and 8 points lost: over the 1-point bar
    assert f"{b} 10.00 %" in text                   # 1.0 point is within, 1.1 is not
    assert text.count("| 0.95 |") == 2 and "| 0.85 | " + b in text
    assert render_results.section_reduce_ceiling({"models": {}}) == []
