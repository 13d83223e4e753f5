"""The README's two commands stay true: they are the ones .ci/run and this test run."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import numpy as np

from redpp_onnx.cli import main
from redpp_onnx.evaluate import evaluate, load_dataset

ROOT = Path(__file__).resolve().parents[1]


def _commands():
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## The two commands"):text.index("## Requirements")]
    return [line for line in re.findall(r"```bash\n(.*?)\n```", section, re.S)]


def test_the_readme_has_two_commands_and_ci_runs_the_second():
    first, second = _commands()
    assert "pip install -e ." in first and "redpp-onnx compress models/digits_cnn.onnx" in first
    assert "redpp-onnx eval" in first
    test_command = second.split("&&")[-2:]
    ci = (ROOT / ".ci" / "run").read_text()
    assert 'pip install -q -e ".[test]" && python -m pytest -q' in ci
    assert [c.strip() for c in test_command] == ['pip install -e ".[test]"', "python -m pytest -q"]


def test_the_first_command_runs_as_written(tmp_path, monkeypatch, capsys):
    """Its redpp-onnx steps, in the repository folder, with the output in a temporary folder."""
    monkeypatch.chdir(ROOT)
    steps = [c.strip() for c in _commands()[0].split("&&") if c.strip().startswith("redpp-onnx")]
    assert len(steps) == 2
    out = tmp_path / "digits.redpp.onnx"
    for step in steps:
        args = [str(out) if a == "digits.redpp.onnx" else a for a in shlex.split(step)[1:]]
        assert main(args) == 0
    printed = capsys.readouterr().out
    assert "distinct weight values" in printed and "top-1" in printed
    data = load_dataset(ROOT / "models" / "digits_test.npz")
    result = evaluate(out, data, reference=ROOT / "models" / "digits_cnn.onnx")
    assert result.top1_correct >= result.reference_top1_correct - 3 and np.isfinite(result.max_abs_logit_diff)
