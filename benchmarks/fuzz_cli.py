"""Fuzz the command line with N seeded mutants (default 2000) and save the outcome table.

The mutants (tests/fuzzing.py) are derived from models/digits_cnn.onnx and the exported models of
tests/zoo/ (their external data files too): byte flips, truncations, changed dims, attributes,
op types and dtypes, dropped or duplicated initializers and inputs, renamed or dangling edges,
other opsets and IR versions, NaN/Inf and zero-size weights, broken external data, and valid but
unusual rewrites (grouped Convs, tied weights, Identity aliases, Gemm as MatMul...). Each runs
through ``compress`` with a rotating option variant (15 % through analyze / eval / bench instead)
in a forked child with a time limit. Prints the table (counts per class; failures grouped by
signature, one reproducing mutant each) and saves it, with every run, as JSON.

Usage: ``python benchmarks/fuzz_cli.py [-n 2000] [--seed 0] [--workers 2] [--time-limit 20]
[--repro-dir /tmp/fuzz_repro] [--out benchmarks/results/fuzz.json]``. ``--repro-dir`` writes one
folder per distinct failure signature (the mutant's files), a README.md with the argv of each,
and repro.sh N. One mutant again: ``python -m tests.fuzzing show --seed S --index I``.
"""

from __future__ import annotations

import os
import platform
import sys
from pathlib import Path

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):  # before numpy: no BLAS
    os.environ.setdefault(_var, "1")                                          # threads in the forking parent
os.environ.pop("REDPP_ONNX_DEBUG", None)

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from _common import shared_parser, write_json  # noqa: E402
from tests.fuzzing import format_table, run_fuzz, write_repros  # noqa: E402


def main(argv=None) -> int:
    ap = shared_parser(__doc__, "fuzz.json", shared=False)
    ap.add_argument("-n", type=int, default=2000, help="mutants to run (default 2000)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--start", type=int, default=0, help="first mutant number")
    ap.add_argument("--workers", type=int, default=2, help="children at a time (default 2)")
    ap.add_argument("--time-limit", type=float, default=20.0, help="seconds per run (default 20)")
    ap.add_argument("--other-fraction", type=float, default=0.15,
                    help="share of runs through analyze/eval/bench instead of compress (default 0.15)")
    ap.add_argument("--repro-dir", help="write one reproduction per failure signature here")
    ap.add_argument("-v", "--verbose", action="store_true", help="print each failure as it happens")
    args = ap.parse_args(argv)
    summary, results = run_fuzz(args.n, args.seed, workers=args.workers, time_limit=args.time_limit,
                                start=args.start, other_fraction=args.other_fraction, verbose=args.verbose)
    table = format_table(summary, max_signatures=200)
    sys.stdout.write(table)
    meta = {"script": "benchmarks/fuzz_cli.py", "argv": sys.argv[1:], "python": platform.python_version(),
            "machine": platform.machine(), "cpus": os.cpu_count()}
    runs = [f"#{r['index']} {r['class']} (exit {r['exit']}{', signal ' + str(r['signal']) if r['signal'] else ''}, "
            f"{r['seconds']:.2f} s) | {r['argv']} | {r['mutation']}"
            + (f" | {r['problems'][0][1]}" if r["problems"] else "") for r in results]
    write_json(args.out, {"meta": meta, "summary": summary, "table": table.splitlines(), "runs": runs})
    if args.repro_dir:
        where = write_repros(summary, args.repro_dir)
        print(f"reproductions of the {len(summary['signatures'])} signature(s): {where}")
    return 1 if summary["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
