"""What users read points to the project's own docs, never to files they do not have (the
method notes and the benchmark folder that live beside the project, outside it).

Scanned: the CLI help of every command, every string literal of the package that is not a
docstring (error messages, report notes and reasons, table text), and the docs in docs/.
Docstrings and comments are for developers and may name those files."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from redpp_onnx.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "redpp_onnx"
FORBIDDEN = re.compile(r"METHOD\.md|\.\./shared|shared/(bench|docs)|the shared (CIFAR|models|npz)")
DOC_LINK = re.compile(r"docs/([A-Za-z_]+\.md)")


def _help_texts():
    parser = build_parser()
    yield "redpp-onnx", parser.format_help()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    for name, p in sub.choices.items():
        yield f"redpp-onnx {name}", p.format_help()


def _string_literals():
    """(file, line, text) of every str constant of the package that is not a docstring (a bare
    string statement: module, class, function and attribute docs)."""
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        docs = {id(n.value) for n in ast.walk(tree)
                if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)}
        for n in ast.walk(tree):
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs:
                yield path.relative_to(ROOT), n.lineno, n.value


def test_cli_help_names_no_file_outside_the_project():
    found = [(cmd, m.group(0)) for cmd, text in _help_texts() for m in FORBIDDEN.finditer(" ".join(text.split()))]
    assert not found, found


def test_package_strings_name_no_file_outside_the_project():
    found = [f"{path}:{line}: {text[:80]!r}" for path, line, text in _string_literals() if FORBIDDEN.search(text)]
    assert not found, "\n".join(found)


@pytest.mark.parametrize("doc", sorted(p.name for p in (ROOT / "docs").glob("*.md")))
def test_docs_name_no_file_outside_the_project(doc):
    text = " ".join((ROOT / "docs" / doc).read_text().split())
    found = [text[max(m.start() - 40, 0):m.end() + 20] for m in FORBIDDEN.finditer(text)]
    assert not found, f"docs/{doc}: {found}"


def test_the_docs_users_are_sent_to_exist():
    named = {m.group(1) for _, _, text in _string_literals() for m in DOC_LINK.finditer(text)}
    named |= {m.group(1) for _, text in _help_texts() for m in DOC_LINK.finditer(" ".join(text.split()))}
    missing = sorted(n for n in named if not (ROOT / "docs" / n).is_file())
    assert not missing, missing


def test_the_depthwise_refusal_points_to_a_doc_that_gives_the_reason():
    from redpp_onnx.analysis.layers import scan_layers

    from ..graphs import conv_bn_relu_gemm

    reason = next(r.reason for r in scan_layers(conv_bn_relu_gemm()).refused if "depthwise" in r.reason)
    doc = DOC_LINK.search(reason).group(1)
    text = " ".join((ROOT / "docs" / doc).read_text().split())
    assert "--include-depthwise" in text and "harms accuracy" in text
