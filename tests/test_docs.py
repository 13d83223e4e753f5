"""The docs cannot go stale: every CLI option is in docs/CLI.md."""

from __future__ import annotations

from pathlib import Path

from redpp_onnx.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]


def test_every_cli_option_is_documented():
    text = (ROOT / "docs" / "CLI.md").read_text()
    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    missing = []
    for name, p in sub.choices.items():
        if f"redpp-onnx {name}" not in text:
            missing.append(name)
        for action in p._actions:
            missing += [opt for opt in action.option_strings if opt.startswith("--") and opt not in text]
    assert not missing, f"not in docs/CLI.md: {missing} (run: python docs/render_cli.py)"
