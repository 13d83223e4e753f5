"""Write docs/CLI.md: the fixed text below, then each command's own --help.

    python docs/render_cli.py
"""

from pathlib import Path
import sys

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from redpp_onnx.cli import build_parser  # noqa: E402

HEAD = "# The command line\n\n`redpp-onnx` has four commands: `compress` (the job), `analyze` (the data-free guarantee of\nhashing), `eval` (accuracy on labelled data) and `bench` (latency). Reference below, generated\nfrom the program's own help by `python docs/render_cli.py` (`tests/test_docs.py` checks that every\noption is here).\n\n## Behaviour users can rely on\n\n- **Nothing is written unless the job succeeded.** Outputs are written to a temporary file in the\n  destination folder and renamed; the input is never modified; an existing output is kept unless\n  `--force`; the output may not be the input.\n- **User mistakes end with one line and exit status 2**: `redpp-onnx: error: ...` naming the\n  file or option (a missing or unreadable file, a file that is not ONNX or is truncated, a missing\n  output folder, a bad option value, a model onnxruntime cannot load). Exit 130 on Ctrl-C.\n- **Verification is on by default**: seeded random inputs through the original (onnxruntime,\n  graph optimizations off) and the output; the report's `verify` gives the max |diff| and the\n  max relative L2 difference, and a warning is printed (and put in the report's notes) above 0.25.\n  Dynamic dimensions other than the batch take the sizes given with `--input-shape`, else 64\n  (the report says so; if the model rejects 64, verification is skipped with that reason).\n  `--max-rel-l2 X` makes it a gate for pipelines: above X, exit status 3, the model is not written\n  (the `--report` is, saying why).\n- **Output IR version**: the input's when onnxruntime loads it, else the lowest the opsets allow\n  (onnx 1.23 writes IR 14 by default; onnxruntime 1.31 loads at most 13).\n- **Reports**: the table on stdout (`-q` for none), the JSON with `--json` (stdout) or\n  `--report FILE`; the JSON keys are documented in `redpp_onnx/report.py`.\n- A progress line appears on stderr while layers are processed, only when stderr is a terminal.\n\n## What changes the function\n\nHashing (always within `--weight-error` per layer), `--alpha > 0`, `--split-tolerance > 0` and\n`--uniform-int8` change the function; the report's notes say so. Merge with `--alpha 0`, split\n(without tolerance) and `--codebook` are exact (up to float summation order). `--calibrate`\nchooses α on data and is labelled DATA-DRIVEN in the report.\n\n"


def main():
    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    parts = []
    for name, p in sub.choices.items():
        p.prog = f"redpp-onnx {name}"
        parts.append(f"### `redpp-onnx {name}`\n\n```\n{p.format_help().rstrip()}\n```\n")
    (ROOT / "docs" / "CLI.md").write_text(HEAD + "## Reference\n\n" + "\n".join(parts))


if __name__ == "__main__":
    main()
