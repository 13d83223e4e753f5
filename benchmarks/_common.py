"""What the benchmark scripts share: their --shared/--out arguments and how they save results."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


# A child process's own peak RSS in kB, as a Python expression for the snippets the benchmarks run
# in fresh processes (``import re`` there). VmHWM, not ru_maxrss: ru_maxrss survives exec, so a child
# of a large benchmark process would report the parent's.
PEAK_RSS_KB_EXPR = 're.search(r"VmHWM:\\s+(\\d+) kB", open("/proc/self/status").read()).group(1)'


def shared_parser(doc: str, result_name: str, shared: bool = True) -> argparse.ArgumentParser:
    """A parser with ``--shared`` (../shared/bench beside the checkout; unless ``shared`` is
    False) and ``--out`` (benchmarks/results/RESULT_NAME); the description is the docstring's
    first line."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    if shared:
        ap.add_argument("--shared", default=str(ROOT.parent / "shared" / "bench"))
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / result_name))
    return ap


def write_json(path, payload: dict) -> Path:
    """Save ``payload`` (indented, UTF-8, final newline), creating the folder; says where."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(payload, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {out}")
    return out


def run_python(code: str, args) -> tuple:
    """``python -c CODE ARGS...`` in a fresh process (as a user runs the command): ``(wall seconds,
    the completed process)``; a failure ends the benchmark with its stderr."""
    t = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code] + [str(a) for a in args], capture_output=True, text=True)
    seconds = time.perf_counter() - t
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(map(str, args[:1]))} failed ({proc.returncode}): {proc.stderr.strip()[-2000:]}")
    return seconds, proc
