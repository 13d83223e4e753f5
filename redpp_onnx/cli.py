"""``redpp-onnx``: the command line. Thin: argparse -> config -> library call -> report.

User mistakes (bad paths, bad files, bad options) end with one line on stderr and exit status 2;
nothing is written unless the whole job succeeded (writes are atomic).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from . import __version__
from .errors import RedppError, VerificationFailed

EXIT_USER_ERROR = 2


class _Progress:
    """A one-line progress indicator on stderr, only when stderr is a terminal."""

    def __init__(self, label: str, enabled: bool):
        self.label = label
        self.enabled = enabled and sys.stderr.isatty()

    def __call__(self, i: int, n: int, item: str) -> None:
        if not self.enabled:
            return
        width = 24
        filled = width * i // max(n, 1)
        text = f"\r{self.label} [{'#' * filled}{'.' * (width - filled)}] {i}/{n} {item[:40]:40}"
        sys.stderr.write(text if i < n else "\r" + " " * len(text) + "\r")
        sys.stderr.flush()


def _steps(text: str) -> tuple:
    return tuple(s.strip() for s in text.split(",") if s.strip())


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="redpp-onnx", description="Data-free compression of ONNX models (RED++).")
    ap.add_argument("--version", action="version", version=f"redpp-onnx {__version__}")
    sub = ap.add_subparsers(dest="command", required=True)

    c = sub.add_parser("compress", help="hash (then merge, split) the weights of a model")
    c.add_argument("input", help="the ONNX model to compress")
    c.add_argument("-o", "--output", required=True, help="where to write the compressed model")
    c.add_argument("--report", help="also write the report as JSON to this file")
    c.add_argument("--steps", type=_steps, default=("hash", "merge", "split"),
                   help="comma-separated steps (default: hash,merge,split)")
    c.add_argument("--weight-error", type=float, default=0.01, metavar="EPS",
                   help="per-layer budget on ||W~ - W|| / ||W|| that chooses the bandwidth (default 0.01)")
    c.add_argument("--bandwidth-factor", type=float, metavar="F",
                   help="fixed bandwidth factor instead of the budget (1 = the paper's literal rule)")
    c.add_argument("--nms-radius", type=float, default=0.0, metavar="TAU",
                   help="merge KDE modes closer than TAU (weight units; default 0 = off)")
    c.add_argument("--snap-zero", action="store_true", help="give the cell holding 0 the value 0 when the budget allows")
    c.add_argument("--uniform-int8", action="store_true", help="baseline: uniform symmetric int8 instead of KDE hashing")
    c.add_argument("--codebook", action="store_true",
                   help="store hashed weights as codebooks + variable-length codes rebuilt by standard ops "
                        "(about 3.6-3.8x smaller files at the default budget, same outputs)")
    c.add_argument("--include-depthwise", action="store_true", help="also hash grouped and depthwise convolutions")
    c.add_argument("--alpha", type=float, default=0.0,
                   help="merge: 0 merges identical neurons only (exact, default); > 0 merges neurons closer than "
                        "the α-percentile of their distances into barycenters (changes the function)")
    c.add_argument("--merge-strategy", default="per_block", choices=("per_block", "uniform"),
                   help="per-layer α: per_block (paper's appendix: 2α-1 / α / 2α by thirds) or uniform")
    c.add_argument("--calibrate", metavar="DATA.npz",
                   help="DATA-DRIVEN: choose the largest merge α whose top-1 drop on this data stays within --max-drop")
    c.add_argument("--max-drop", type=float, default=0.3, metavar="POINTS", help="for --calibrate (default 0.3)")
    c.add_argument("--split", default="auto", choices=("auto", "all", "none"),
                   help="with the split step: rewrite the layers predicted to be at least as fast (auto, "
                        "default), every eligible layer (all: maximum pruning) or none (only count)")
    c.add_argument("--tune", action="store_true",
                   help="split auto: time each layer's two forms at conversion time instead of predicting")
    c.add_argument("--split-tolerance", type=float, default=0.0, metavar="EPS",
                   help="relaxed split: per layer, merge each input channel's kernels closer than a distance "
                        "chosen so that ||W'-W||/||W|| <= EPS (changes the function; default 0 = exact)")
    c.add_argument("--portable", action="store_true",
                   help="emit the split computation with standard ONNX ops only (no custom-op library needed)")
    c.add_argument("--no-verify", action="store_true", help="skip the check on seeded random inputs")
    c.add_argument("--input-shape", action="append", metavar="NAME=D0,D1,...",
                   help="the shape of an input whose dimensions the model leaves dynamic, for the verification, "
                        "the MAC counts and --split auto (repeat per input; NAME= may be left out for a "
                        "single-input model). Without it, dynamic dims other than the batch are verified at 64")
    c.add_argument("--max-rel-l2", type=float, metavar="X",
                   help="fail (exit 3, no model written; the --report is) when the verification's relative L2 "
                        "difference exceeds X, e.g. 0.1 as a gate in a pipeline")
    c.add_argument("--plot", metavar="DIR",
                   help="also write per-layer figures (reduction by step; expected vs measured pruning) "
                        "into DIR (needs matplotlib: pip install 'redpp-onnx[plot]')")
    c.add_argument("--force", action="store_true", help="overwrite the output file if it exists")
    c.add_argument("--json", action="store_true", help="print the JSON report on stdout instead of the table")
    c.add_argument("-q", "--quiet", action="store_true", help="print nothing but errors")

    e = sub.add_parser("eval", help="top-1 / top-5 of a model on labelled data (optionally vs a reference)")
    e.add_argument("model", help="the ONNX model to evaluate")
    e.add_argument("--data", required=True, help="an .npz data set (the shared CIFAR/ImageNet layouts, or x/y)")
    e.add_argument("--ref", help="a reference model (e.g. the original): agreement and logit drift too")
    e.add_argument("--limit", type=int, help="only the first N samples")
    e.add_argument("--preprocess", default="auto", choices=("auto", "cifar", "imagenet", "raw"),
                   help="auto: recognise the shared CIFAR-10 / ImageNet layouts (their documented preprocessing) "
                        "or x/y arrays; raw: your own arrays (with --mean/--std for uint8 images)")
    e.add_argument("--mean", type=float, nargs="+", metavar="M", help="raw uint8 images: per-channel mean of x/255")
    e.add_argument("--std", type=float, nargs="+", metavar="S", help="raw uint8 images: per-channel std of x/255")
    e.add_argument("--layout", choices=("NHWC", "NCHW"), help="raw uint8 images: the stored layout")
    e.add_argument("--batch-size", type=int, default=64)
    e.add_argument("--json", action="store_true", help="print the result as JSON")

    b = sub.add_parser("bench", help="latency in onnxruntime; with two models, the ratio B/A measured in one run")
    b.add_argument("model", help="model A (e.g. the original)")
    b.add_argument("other", nargs="?", help="model B (e.g. the compressed one)")
    b.add_argument("--batch", type=int, default=1)
    b.add_argument("--threads", type=int, default=1, help="onnxruntime intra-op threads")
    b.add_argument("--repeat", type=int, default=40, help="timed runs per model")
    b.add_argument("--json", action="store_true", help="print the result as JSON")

    a = sub.add_parser("analyze", help="the data-free guarantee of hashing: per-layer bounds, U, E[norm]")
    a.add_argument("input", help="the ONNX model to analyze (not modified)")
    a.add_argument("--data", help="an .npz data set: also measure E_X||f|| and E_X||f~ - f|| (see docs)")
    a.add_argument("--limit", type=int, help="use only the first N samples of --data")
    a.add_argument("--weight-error", type=float, default=0.01, metavar="EPS", help="as for compress")
    a.add_argument("--bandwidth-factor", type=float, metavar="F", help="as for compress")
    a.add_argument("--include-depthwise", action="store_true", help="as for compress")
    a.add_argument("--input-shape", action="append", metavar="NAME=D0,D1,...", help="as for compress")
    a.add_argument("--input-stats", choices=("standard",),
                   help="E[norm] for models without BatchNormalization statistics (e.g. exported with BN folded "
                        "into Conv): assume every input element N(0, 1), independent (an assumption, said in the "
                        "report)")
    a.add_argument("--report", help="also write the analysis as JSON to this file")
    a.add_argument("--json", action="store_true", help="print the JSON analysis instead of the table")
    return ap


def _compress(args) -> int:
    from .compress import compress
    from .config import CompressConfig, HashConfig, MergeConfig
    from .io import save_model
    from .passes.split import SplitConfig

    config = CompressConfig(
        steps=args.steps,
        hash=HashConfig(weight_error=args.weight_error, bandwidth_factor=args.bandwidth_factor,
                        nms_radius=args.nms_radius, snap_zero=args.snap_zero, uniform_int8=args.uniform_int8,
                        include_depthwise=args.include_depthwise),
        merge=MergeConfig(alpha=args.alpha, strategy=args.merge_strategy),
        calibrate=args.calibrate, max_drop=args.max_drop,
        split=SplitConfig(mode=args.split, portable=args.portable, tune=args.tune, tolerance=args.split_tolerance),
        codebook=args.codebook, verify=not args.no_verify,
        input_shapes=_input_shapes(args.input_shape, args.input))
    src, dst = Path(args.input), Path(args.output)
    if dst.exists() and dst.resolve() == src.resolve():
        raise RedppError(f"{dst}: output is the input file; choose another path")
    if dst.exists() and not args.force:
        raise RedppError(f"{dst}: already exists; pass --force to overwrite")
    if not dst.parent.is_dir():
        raise RedppError(f"{dst}: the folder {dst.parent} does not exist")
    if args.report and not Path(args.report).parent.is_dir():
        raise RedppError(f"{args.report}: the folder {Path(args.report).parent} does not exist")
    if args.calibrate and not Path(args.calibrate).is_file():
        raise RedppError(f"{args.calibrate}: no such file")
    if args.plot:
        if not Path(args.plot).parent.is_dir():
            raise RedppError(f"{args.plot}: the folder {Path(args.plot).parent} does not exist")
        from .plots import _pyplot

        _pyplot()  # fail before the work if matplotlib is missing
    file_before = src.stat().st_size if src.is_file() else None
    external = False
    if src.is_file():
        from .io import uses_external_data

        try:
            external = uses_external_data(src)
        except Exception:  # noqa: BLE001 - not ONNX: load_model reports it properly below
            external = False
        if external:
            data_files = {src.parent / t for t in _external_locations(src)}
            file_before += sum(p.stat().st_size for p in data_files if p.is_file())
    if args.max_rel_l2 is not None and (args.no_verify or not args.max_rel_l2 >= 0):
        raise RedppError("--max-rel-l2 needs verification (drop --no-verify) and a value >= 0")
    model, report = compress(src, config, progress=_Progress("hashing", not args.quiet),
                             file_bytes_before=file_before, plot_dir=args.plot)
    rel = report.verify.get("max_rel_l2")
    if args.max_rel_l2 is not None and (rel is None or not rel <= args.max_rel_l2):
        if args.report:
            _write_text_atomic(Path(args.report), report.to_json())
        found = "verification was skipped: " + report.verify.get("skipped", "?") if rel is None else \
            f"max relative L2 {rel:.3g} > --max-rel-l2 {args.max_rel_l2:g}"
        where = f" (report: {args.report})" if args.report else ""
        raise VerificationFailed(f"{found}; {dst} was not written{where}")
    report.model["file_bytes_after"] = save_model(model, dst, force=True, external=external)
    report.output = str(dst)
    if args.report:
        _write_text_atomic(Path(args.report), report.to_json())
    if args.json:
        sys.stdout.write(report.to_json())
    elif not args.quiet:
        sys.stdout.write(report.table())
        sys.stdout.write(f"wrote {dst}" + (f" and {args.report}" if args.report else "") + "\n")
        for path in report.plots or []:
            sys.stdout.write(f"wrote {path}\n")
    return 0


def _eval(args) -> int:
    from .evaluate import evaluate, load_dataset

    for path in [args.model, args.data] + ([args.ref] if args.ref else []):
        if not Path(path).is_file():
            raise RedppError(f"{path}: no such file")
    if args.limit is not None and args.limit < 1:
        raise RedppError(f"--limit must be >= 1, got {args.limit}")
    try:
        data = load_dataset(args.data, preprocess=args.preprocess, mean=args.mean, std=args.std,
                            layout=args.layout, limit=args.limit)
        result = evaluate(args.model, data, batch_size=args.batch_size, reference=args.ref)
    except ValueError as err:
        raise RedppError(str(err).splitlines()[0]) from None
    if args.json:
        sys.stdout.write(json.dumps(result.to_dict(), indent=2) + "\n")
        return 0
    print(f"{Path(args.model).name} on {data.name} (n={result.n}): top-1 {100 * result.top1:.2f}% "
          f"({result.top1_correct}/{result.n}), top-5 {100 * result.top5:.2f}%")
    if args.ref:
        print(f"{Path(args.ref).name} (reference): top-1 {100 * result.reference_top1:.2f}% "
              f"({result.reference_top1_correct}/{result.n}); agreement {100 * result.agreement:.2f}%, "
              f"max |logit diff| {result.max_abs_logit_diff:.3g}")
    return 0


def _bench(args) -> int:
    from .bench import measure

    for path in [args.model] + ([args.other] if args.other else []):
        if not Path(path).is_file():
            raise RedppError(f"{path}: no such file")
    for name in ("batch", "threads", "repeat"):
        if getattr(args, name) < 1:
            raise RedppError(f"--{name} must be >= 1, got {getattr(args, name)}")
    try:
        result = measure(args.model, args.other, batch=args.batch, threads=args.threads, repeat=args.repeat)
    except RedppError:
        raise
    except Exception as err:  # noqa: BLE001 - onnxruntime's errors have many types
        from .verify import ort_message

        raise RedppError(f"onnxruntime cannot run the model: {ort_message(err)}") from None
    if args.json:
        sys.stdout.write(json.dumps(result.to_dict(), indent=2) + "\n")
        return 0
    print(f"batch {result.batch}, {result.threads} thread(s), {result.runs} runs per model")
    for label, path, q in (("A", args.model, result.a), ("B", args.other, result.b)):
        if q is not None:
            print(f"{label} {Path(path).name}: p10 {q['p10_ms']:.3f} ms, median {q['p50_ms']:.3f} ms, "
                  f"p90 {q['p90_ms']:.3f} ms")
    if result.ratio is not None:
        lo, hi = result.ratio_iqr
        print(f"B/A: {result.ratio:.3f} (ratio of medians; adjacent-run ratios, interquartile: {lo:.3f} .. {hi:.3f})")
    return 0


def _input_shapes(specs, model_path):
    """``--input-shape`` values as {name: (dims...)}; a spec without ``NAME=`` names the model's
    only input."""
    if not specs:
        return None
    shapes = {}
    for spec in specs:
        name, _, dims = spec.rpartition("=")
        try:
            shape = tuple(int(d) for d in dims.replace("x", ",").split(",") if d.strip())
        except ValueError:
            shape = ()
        if not shape:
            raise RedppError(f"--input-shape {spec!r}: expected NAME=D0,D1,... (e.g. input=1,3,224,224)")
        if not name:
            import onnx

            try:
                model = onnx.load(str(model_path), load_external_data=False)
            except Exception:  # noqa: BLE001 - not ONNX: reported when the model is loaded
                raise RedppError(f"--input-shape {spec!r}: give NAME=D0,D1,...") from None
            init = {t.name for t in model.graph.initializer}
            names = [i.name for i in model.graph.input if i.name not in init]
            if len(names) != 1:
                raise RedppError(f"--input-shape {spec!r}: the model has {len(names)} inputs "
                                 f"({', '.join(names)}); give NAME=D0,D1,...")
            name = names[0]
        shapes[name] = shape
    return shapes


def _analyze(args) -> int:
    from .analysis.layers import check_input_shapes, input_shapes
    from .analysis.theory import analyze
    from .config import HashConfig
    from .io import load_model

    if args.report and not Path(args.report).parent.is_dir():
        raise RedppError(f"{args.report}: the folder {Path(args.report).parent} does not exist")
    if args.data and not Path(args.data).is_file():
        raise RedppError(f"{args.data}: no such file")
    if args.limit is not None and args.limit < 1:
        raise RedppError(f"--limit must be >= 1, got {args.limit}")
    config = HashConfig(weight_error=args.weight_error, bandwidth_factor=args.bandwidth_factor,
                        include_depthwise=args.include_depthwise)
    shapes = _input_shapes(args.input_shape, args.input)
    model = load_model(args.input)
    check_input_shapes(model, shapes)
    try:
        with input_shapes(shapes):
            result = analyze(model, config, data=args.data, limit=args.limit, input_stats=args.input_stats)
    except ValueError as err:  # a data set the evaluator cannot read
        raise RedppError(str(err)) from None
    text = json.dumps(result.to_dict(), indent=2) + "\n"
    if args.report:
        _write_text_atomic(Path(args.report), text)
    sys.stdout.write(text if args.json else result.table())
    return 0


def _external_locations(path: Path) -> set:
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    return {e.value for t in model.graph.initializer for e in t.external_data if e.key == "location"}


def _write_text_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "compress":
            return _compress(args)
        if args.command == "analyze":
            return _analyze(args)
        if args.command == "eval":
            return _eval(args)
        if args.command == "bench":
            return _bench(args)
    except RedppError as err:
        print(f"redpp-onnx: error: {err}", file=sys.stderr)
        return getattr(err, "exit_code", EXIT_USER_ERROR)
    except KeyboardInterrupt:
        print("redpp-onnx: interrupted; nothing was written", file=sys.stderr)
        return 130
    return 1


if __name__ == "__main__":
    sys.exit(main())
