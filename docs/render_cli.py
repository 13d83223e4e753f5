"""Write docs/CLI.md: the fixed text below, then each command's own --help.

    python docs/render_cli.py
"""

from pathlib import Path
import sys

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from redpp_onnx.cli import build_parser  # noqa: E402

HEAD = """# The command line

`redpp-onnx` has four commands: `compress` (the job), `analyze` (the data-free guarantee of
hashing), `eval` (accuracy on labelled data, or the agreement of two models on any model's inputs)
and `bench` (latency). Reference below, generated from the program's own help by
`python docs/render_cli.py` (`tests/test_docs.py` checks that every option is here).

## Behaviour users can rely on

- **Every path is checked before the work**, so a long run never ends in an error about a file:
  what is read (the input model, its external data, `--calibrate`, `--verify-data`, `--data`)
  must be a readable regular file (not a folder, a FIFO or a device); no output may be an input or
  another output, also through a symbolic link, a hard link or `./x` (the report may not be the
  model, nor overwrite the input or its `.data`); each output's folder must exist and take a new
  file; no name may be longer than the file system allows; `--plot` must name a folder (and
  matplotlib be installed). An existing output model, and its `.data` file, are replaced only
  with `--force`. The `--report` (and the `--plot` figures) are replaced like a log, without
  `--force`, but never when the report path is one of the inputs.
- **All or nothing.** The outputs (model, its `.data`, report, figures) are written in full into a
  hidden staging folder beside their destination, then renamed into place together; files they
  replace are put back if a rename fails. On any error, on Ctrl-C and on SIGTERM or SIGHUP, nothing
  of the run is left behind: no half-written file, no model without its `.data`, no temporary
  file. The input is never modified.
- **The input model is checked first.** Duplicate names, negative dimensions, weights whose data
  does not match their shape (e.g. a truncated external data file), a graph `onnx.checker`
  rejects and (unless `--no-verify`) a model onnxruntime cannot load are one-line errors. What
  exporters commonly get wrong and onnxruntime accepts anyway (a missing `ir_version`, IR < 4,
  `value_info` the checker rejects) is repaired on the working copy and said in the report's
  notes.
- **Exit statuses**: 0 done; 2 your input or options, with one line `redpp-onnx: error: ...`
  naming the file or option; 3 the `--max-rel-l2` gate; 1 an internal error, i.e. a bug of
  redpp-onnx (one line saying so; set `REDPP_ONNX_DEBUG=1` for the traceback); 128 + N when
  stopped by signal N (130 on Ctrl-C, 143 on SIGTERM). Nothing is written in any failing case
  except the `--report` of the gate. No numpy warning or onnxruntime log line reaches stderr.
- **Verification is on by default**: the original (onnxruntime, graph optimizations off) and the
  output run on the same inputs. Without data they are synthetic, seeded and realistic: floats
  N(0, 1); integer inputs that index an embedding table (token ids) uniform within its rows;
  inputs named like `mask` all ones; integer `type`/`segment` ids 0; other int8/uint8 inputs their
  full range; other integers 0 or 1. Samples are pooled: runs of 2 are added until every output's
  relative L2 difference is known within 2 % (its standard error), at least 32 and at most 512
  samples, and no new run after about 10 s (a note then says the figure is less precise).
  `--verify-samples N` fixes the count. `--verify-data DATA.npz` verifies on your own inputs
  instead: one array per model input, keyed by the input names, samples first, checked against
  the model (names, ranks, fixed dimensions, dtype kinds, finite values); every sample is used (the
  first N with `--verify-samples`). The table's `verify:` line and the report's `verify` give the
  max |diff|, the max relative L2 difference (pooled over the samples), the cosine similarity per
  output and what was fed; above 0.25 a warning is printed (a note for random token ids, which
  can overstate the drift). Dynamic dimensions other than the batch take the sizes given with
  `--input-shape`, else 64 (the report says so; if the model rejects 64, verification is skipped
  with that reason). `--max-rel-l2 X` makes it a gate for pipelines: above X (or when the
  verification was skipped), exit status 3, the model is not written (the `--report` is, saying
  why).
- **Output IR version**: the input's when onnxruntime loads it, else the lowest the opsets allow
  (onnx 1.23 writes IR 14 by default; onnxruntime 1.31 loads at most 13).
- **Reports**: the table on stdout (`-q` for none), the JSON with `--json` (stdout) or
  `--report FILE`; the JSON keys are documented in `redpp_onnx/report.py` (`verify`: docs/API.md).
- A progress line appears on stderr while layers are processed, only when stderr is a terminal.

## What changes the function

Hashing (always within `--weight-error` per layer), `--alpha > 0`, `--split-tolerance > 0` and
`--uniform-int8` change the function; the report's notes say so. Merge with `--alpha 0`, split
(without tolerance) and `--codebook` are exact (up to float summation order). `--calibrate`
chooses α on data and is labelled DATA-DRIVEN in the report.

## Models larger than memory (`--stream`, `--memory-limit`)

The in-memory path holds the model several times over (the rate-distortion hashing runs it in
onnxruntime for its sensitivities, the verification runs it and the output): its peak was 12-29x
the model's bytes. A model of B bytes (file plus external data) is therefore streamed when 30 x B
exceeds the memory available when the command starts, or `--memory-limit SIZE` (e.g. `8G`);
`--stream` streams any model. The streamed path reads the graph without its external data, then
each eligible weight alone: hashed by the data-free per-layer rule (`--weight-error`, 0.01 by
default, `--bandwidth-factor`, `--nms-radius`, `--snap-zero` apply), checked layer-wise (the
layer's output on seeded N(0, 1) inputs, original vs hashed weight: `verify.layerwise` in the
report, `verify.skipped` says why the whole model is not run), written in its own type to the
output's external data (`OUT.data`) and dropped. `--workers N` hashes N weights at once (default 1:
on this project's 2-core machine a second worker made it slower, docs/RESULTS.md); the output is the
same bytes with any N. Not done on that path, each said in the report's notes: rate-distortion
hashing, merge, split, codebook storage (the file keeps its size). Options that need the
in-memory path (`--budget`, `--target-bits`, `--effort thorough`, `--uniform-int8`, `--codebook`,
`--storage compact`, `--calibrate`, `--verify-data`, `--verify-samples`, `--max-rel-l2`, `--plot`,
`--tune`) are refused with the reason.

"""


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
