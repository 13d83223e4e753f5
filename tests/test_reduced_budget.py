"""After a channel reduction the default hashing budget is halved (config.REDUCED_BUDGET_SHARE)."""

from pathlib import Path

import pytest

from redpp_onnx.compress import compress
from redpp_onnx.config import DEFAULT_BUDGET, REDUCED_BUDGET_SHARE, CompressConfig, HashConfig, MergeConfig

DIGITS = Path(__file__).resolve().parents[1] / "models" / "digits_cnn.onnx"


def _budget_notes(report):
    return [n for n in report.notes if n.startswith("hashing budget")]


def _spent(report):
    note = next(n for n in report.notes if "rate-distortion hashing" in n)
    return float(note.split("relative L2 logit error of ")[1].split()[0])


def test_default_budget_is_halved_after_a_reduction():
    _, report = compress(str(DIGITS), CompressConfig(merge=MergeConfig(target_macs=0.7), verify=False))
    assert report.model["merge_channels_removed"] > 0
    assert _spent(report) == pytest.approx(DEFAULT_BUDGET * REDUCED_BUDGET_SHARE)
    assert len(_budget_notes(report)) == 1 and "0.05 after the channel reduction" in _budget_notes(report)[0]


@pytest.mark.parametrize("config", [
    CompressConfig(verify=False),  # no reduction: exact merges only
    CompressConfig(hash=HashConfig(budget=0.1), merge=MergeConfig(target_macs=0.7), verify=False),  # given
])
def test_the_budget_stays_without_reduction_or_when_given(config):
    _, report = compress(str(DIGITS), config)
    assert _spent(report) == pytest.approx(DEFAULT_BUDGET) and _budget_notes(report) == []
