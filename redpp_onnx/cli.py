"""``redpp-onnx``: the command line. Thin: argparse -> config -> library call -> report.

User mistakes (bad paths, bad files, bad options) end with one line on stderr and exit status 2;
nothing is written unless the whole job succeeded (writes are atomic).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from . import __version__, validate
from .errors import RedppError, VerificationFailed
from .files import Interrupted, Outputs, external_data_files, input_file, signals_interrupt, write_error
from .io import _default_mode
from .runtime import ORT_ERRORS
from .verify import ort_message

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
    c.add_argument("--budget", type=float, metavar="E",
                   help="rate-distortion hashing (the default): the fewest stored bits whose predicted relative "
                        "L2 error of the outputs, estimated data-free, stays within E (default 0.1 when the output "
                        "is class scores from a Gemm / MatMul head, else 0.03: embeddings and features are compared "
                        "by cosine, and 0.999 needs an error <= 0.045)")
    c.add_argument("--target-bits", type=float, metavar="B",
                   help="rate-distortion hashing: instead of --budget, the least predicted error within B stored "
                        "bits per eligible weight (tables included)")
    c.add_argument("--effort", choices=("fast", "thorough"), default="fast",
                   help="rate-distortion hashing: fast (default: one codebook per layer) or thorough (also one "
                        "per channel or group of channels: 4-9%% fewer bits in 5-10x the time)")
    c.add_argument("--workers", type=int, metavar="N",
                   help="rate-distortion hashing: processes for the per-layer work (default: every available core "
                        "on models of at least 2 M eligible weights, else 1; streamed models: 1); the output does "
                        "not depend on it")
    c.add_argument("--weight-error", type=float, metavar="EPS",
                   help="per-layer hashing instead: every layer within ||W~ - W|| / ||W|| <= EPS (the paper's "
                        "rule; 0.01 when another per-layer option is given)")
    c.add_argument("--bandwidth-factor", type=float, metavar="F",
                   help="per-layer hashing with a fixed bandwidth factor (1 = the paper's literal rule)")
    c.add_argument("--nms-radius", type=float, default=0.0, metavar="TAU",
                   help="merge KDE modes closer than TAU (weight units; default 0 = off)")
    c.add_argument("--snap-zero", action="store_true", help="give the cell holding 0 the value 0 when the budget allows")
    c.add_argument("--uniform-int8", action="store_true", help="baseline: uniform symmetric int8 instead of KDE hashing")
    c.add_argument("--codebook", action="store_true",
                   help="store hashed weights as codebooks + variable-length codes (the default; same outputs): "
                        "plain onnxruntime rebuilds them with standard ops when a session starts (extra memory "
                        "for a moment), redpp_onnx.session() decodes them in C++ at about the fp32 model's cost")
    c.add_argument("--plain", action="store_true",
                   help="store hashed weights as plain float32 tensors (the input's size; loads like the input "
                        "in any runtime)")
    c.add_argument("--storage", choices=("standard", "compact"), default="standard",
                   help="how codebooks are stored: standard (default: decoders of standard ONNX ops, any "
                        "onnxruntime loads the file) or compact (entropy-coded, 10-20%% smaller: only "
                        "redpp_onnx.session(), eval and bench load it; `redpp-onnx expand` writes a plain copy)")
    c.add_argument("--include-depthwise", action="store_true", help="also hash grouped and depthwise convolutions")
    c.add_argument("--alpha", type=float, default=0.0,
                   help="merge: 0 merges identical neurons only (exact, default); > 0 removes about that share of "
                        "each layer's channels (--merge-strategy), pruned or merged into a scaled partner with "
                        "their mean compensated, data-free (changes the function)")
    c.add_argument("--target-macs", type=float, metavar="F",
                   help="merge: keep at most the share F of the eligible MACs (e.g. 0.8), removing the channels "
                        "that cost least per MAC saved (measured on a synthetic twin with the refit, or by a "
                        "closed-form cost: --reduce-plan), at most half of any layer's, then refits the Convs "
                        "that read them on synthetic inputs (data-free; changes the function; runs before hashing)")
    c.add_argument("--channel-multiple", type=int, default=8, metavar="N",
                   help="with --target-macs / --alpha (rule redpp): kept channel counts are multiples of N "
                        "(default 8: onnxruntime's Conv blocks on AVX2; 16 runs faster on AVX-512 CPUs, at more cost "
                        "to accuracy; 1: any count)")
    c.add_argument("--reduce-plan", choices=("auto", "cost"), default="auto",
                   help="with --target-macs / --alpha and the refit: auto (default) chooses the channels and each "
                        "layer's count on the synthetic twin with the refit in the loop where every reducible group "
                        "is direct (producer, BatchNorm, activation, consumer), else the closed-form cost; cost: "
                        "the closed-form cost only")
    c.add_argument("--no-refit", action="store_true",
                   help="with --target-macs / --alpha (rule redpp): keep the mean compensation only, do not refit "
                        "the consumer Convs on the synthetic twin")
    c.add_argument("--merge-rule", choices=("redpp", "percentile"), default="redpp",
                   help="merge with --alpha > 0: redpp (default, above) or percentile (the old rule: channels "
                        "closer than the α-percentile of their distances become barycenters; for comparison)")
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
    c.add_argument("--stream", action="store_true",
                   help="compress tensor by tensor whatever the model's size (the path models too large for "
                        "memory take: per-layer hashing, plain storage, layer-wise check; docs/CLI.md)")
    c.add_argument("--memory-limit", metavar="SIZE",
                   help="memory the in-memory path may use (e.g. 8G; default: the memory available when the "
                        "command starts); a model whose estimated peak (30x its bytes) exceeds it is streamed")
    c.add_argument("--no-layout", action="store_true",
                   help="keep zero channel paddings (option-A shortcuts) as they are; by default they become exact "
                        "1x1 Convs so that onnxruntime's blocked NCHWc layout does not break there")
    c.add_argument("--no-verify", action="store_true", help="skip the check on seeded random inputs")
    c.add_argument("--input-shape", action="append", metavar="NAME=D0,D1,...",
                   help="the shape of an input whose dimensions the model leaves dynamic, for the verification, "
                        "the MAC counts and --split auto (repeat per input; NAME= may be left out for a "
                        "single-input model). Without it, dynamic dims other than the batch are verified at 64 "
                        "(or the first of 32, 16, ... 1 at which the model runs)")
    c.add_argument("--max-rel-l2", type=float, metavar="X",
                   help="fail (exit 3, no model written; the --report is) when the verification's relative L2 "
                        "difference exceeds X, e.g. 0.1 as a gate in a pipeline")
    c.add_argument("--verify-data", metavar="DATA.npz",
                   help="verify on these inputs instead of synthetic ones: an npz with one array per model input, "
                        "keyed by the input names, samples first (e.g. input_ids, attention_mask); every sample is "
                        "used")
    c.add_argument("--verify-samples", type=int, metavar="N",
                   help="verify on exactly N synthetic samples (or the first N of --verify-data) instead of the "
                        "automatic count: samples until the relative L2 is known within 2 %%, 32 to 512, at most "
                        "about 10 s of runs")
    c.add_argument("--plot", metavar="DIR",
                   help="also write per-layer figures (reduction by step; expected vs measured pruning) "
                        "into DIR (needs matplotlib: pip install 'redpp-onnx[plot]')")
    c.add_argument("--force", action="store_true", help="overwrite the output file if it exists")
    c.add_argument("--json", action="store_true", help="print the JSON report on stdout instead of the table")
    c.add_argument("-q", "--quiet", action="store_true", help="print nothing but errors")

    e = sub.add_parser("eval", help="top-1 / top-5 of a model on labelled data (optionally vs a reference)")
    e.add_argument("model", help="the ONNX model to evaluate")
    e.add_argument("--data", required=True,
                   help="an .npz data set: arrays named like the model's inputs (any model, e.g. input_ids, "
                        "attention_mask) plus optional labels (or y); or x/y; or CIFAR/ImageNet images (docs/API.md)")
    e.add_argument("--ref", help="a reference model (e.g. the original): per output cosine similarity and relative "
                                 "L2 difference, and with labels the agreement of top-1")
    e.add_argument("--limit", type=int, help="only the first N samples")
    e.add_argument("--preprocess", default="auto", choices=("auto", "cifar", "imagenet", "raw"),
                   help="auto: recognise the CIFAR-10 / ImageNet layouts (docs/API.md gives their preprocessing) "
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

    x = sub.add_parser("expand", help="write a copy of a compressed model with plain float32 weights (any runtime "
                                      "loads it)")
    x.add_argument("input", help="a model written by compress (codebooks of either storage form)")
    x.add_argument("-o", "--output", required=True, help="where to write the plain model")
    x.add_argument("--force", action="store_true", help="overwrite the output file if it exists")

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
    from .compress import compress, set_file_bits
    from .config import CompressConfig, HashConfig, MergeConfig
    from .io import data_path, write_model
    from .passes.split import SplitConfig

    config = CompressConfig(
        steps=args.steps,
        hash=HashConfig(weight_error=args.weight_error, bandwidth_factor=args.bandwidth_factor,
                        nms_radius=args.nms_radius, snap_zero=args.snap_zero, uniform_int8=args.uniform_int8,
                        include_depthwise=args.include_depthwise, budget=args.budget, target_bits=args.target_bits,
                        effort=args.effort, workers=args.workers),
        merge=MergeConfig(alpha=args.alpha, strategy=args.merge_strategy, target_macs=args.target_macs,
                          refit=not args.no_refit, channel_multiple=args.channel_multiple, plan=args.reduce_plan,
                          rule=args.merge_rule),
        calibrate=args.calibrate, max_drop=args.max_drop,
        split=SplitConfig(mode=args.split, portable=args.portable, tune=args.tune, tolerance=args.split_tolerance),
        codebook=not args.plain, storage=args.storage, verify=not args.no_verify, layout=not args.no_layout,
        verify_data=args.verify_data, verify_samples=args.verify_samples,
        input_shapes=_input_shapes(args.input_shape, args.input))
    src, dst = Path(args.input), Path(args.output)
    if args.codebook and args.plain:
        raise RedppError("--codebook and --plain exclude each other (codebooks are the default)")
    if args.codebook and "hash" not in config.steps:
        raise RedppError("--codebook stores hashed weights: it needs the hash step")
    if args.storage != "standard" and (args.plain or "hash" not in config.steps):
        raise RedppError(f"--storage {args.storage} stores hashed weights as codebooks: it needs the hash step "
                         "and excludes --plain")
    if args.max_rel_l2 is not None and (args.no_verify or not args.max_rel_l2 >= 0):
        raise RedppError("--max-rel-l2 needs verification (drop --no-verify) and a value >= 0")
    input_file(src, "ONNX model")
    for data in (args.calibrate, args.verify_data):
        if data:
            input_file(data, "data set (.npz)")
    external_in = external_data_files(src)
    plan = Outputs(force=args.force)
    plan.read("input model", src)
    for p in external_in:
        plan.read("input model's external data", p)
    plan.read("--calibrate data", args.calibrate)
    plan.read("--verify-data data", args.verify_data)
    plan.write("output model", dst)
    if external_in:  # external data in, external data out
        plan.write("output model's external data", data_path(dst))
    plan.write("report", args.report, replace=True)
    if args.plot:
        from .plots import PLOT_FILES, _pyplot

        _pyplot()  # fail before the work if matplotlib is missing
        plan.folder("--plot folder", args.plot)
        for name in PLOT_FILES:
            plan.write("figure", Path(args.plot) / name, replace=True)
    file_before = src.stat().st_size + sum(p.stat().st_size for p in external_in if p.is_file())
    from .stream import parse_size, stream_reason

    limit = parse_size(args.memory_limit) if args.memory_limit is not None else None
    reason = stream_reason(file_before, forced=args.stream, memory_limit=limit)
    if reason is not None:
        return _compress_streaming(args, config, plan, src, dst, reason, file_before, bool(external_in))
    plan.check()

    with tempfile.TemporaryDirectory(prefix="redpp-plots-") as plot_tmp:
        model, report = compress(src, config, progress=_Progress("hashing", not args.quiet),
                                 file_bytes_before=file_before, plot_dir=plot_tmp if args.plot else None)
        rel = report.verify.get("max_rel_l2")
        if args.max_rel_l2 is not None and (rel is None or not rel <= args.max_rel_l2):
            if args.report:
                _commit(plan, [(Path(args.report), _text_writer(report.to_json))], args.report)
            found = "verification was skipped: " + report.verify.get("skipped", "?") if rel is None else \
                f"max relative L2 {rel:.3g} > --max-rel-l2 {args.max_rel_l2:g}"
            where = f" (report: {args.report})" if args.report else ""
            raise VerificationFailed(f"{found}; {dst} was not written{where}")
        report.output = str(dst)
        sizes = []

        def write_model_file(staged):
            files = write_model(model, staged, external=bool(external_in))
            sizes.append(sum(f.stat().st_size for f in files))
            report.model["file_bytes_after"] = sizes[0]
            set_file_bits(report.model)
            return files

        writers = [(dst, write_model_file)]
        if args.plot:
            report.plots = [str(Path(args.plot) / Path(f).name) for f in report.plots or []]
            writers += [(Path(f), _copy_writer(Path(plot_tmp) / Path(f).name)) for f in report.plots]
        if args.report:
            writers.append((Path(args.report), _text_writer(report.to_json)))
        made = None
        if args.plot and not Path(args.plot).exists():
            made = Path(args.plot)
            made.mkdir()
        try:
            _commit(plan, writers, dst)
        except BaseException:
            if made is not None:
                shutil.rmtree(made, ignore_errors=True)
            raise
    if args.json:
        sys.stdout.write(report.to_json())
    elif not args.quiet:
        sys.stdout.write(report.table())
        sys.stdout.write(f"wrote {dst}" + (f" and {args.report}" if args.report else "") + "\n")
        for path in report.plots or []:
            sys.stdout.write(f"wrote {path}\n")
    return 0


STREAM_REFUSED = (("--budget", "budget"), ("--target-bits", "target_bits"), ("--uniform-int8", "uniform_int8"),
                  ("--calibrate", "calibrate"), ("--verify-data", "verify_data"), ("--max-rel-l2", "max_rel_l2"),
                  ("--plot", "plot"), ("--codebook", "codebook"), ("--tune", "tune"), ("--verify-samples", "verify_samples"))


def _compress_streaming(args, config, plan, src: Path, dst: Path, reason: str, file_before: int,
                        external_in: bool) -> int:
    """``compress`` through ``stream.py``: the model is read, hashed and written one tensor at a time
    inside the output's staging (nothing is left behind on an error)."""
    from .io import data_path
    from .stream import STREAM_WORKERS, StreamOptions, compress_file

    given = [flag for flag, attr in STREAM_REFUSED if getattr(args, attr, None) not in (None, False)]
    given += ["--effort thorough"] if args.effort != "fast" else []
    given += [f"--storage {args.storage}"] if args.storage != "standard" else []
    if given:
        raise RedppError(f"{', '.join(given)} {'needs' if len(given) == 1 else 'need'} the in-memory path, which this model cannot take: {reason}; "
                         "drop them (the streaming path hashes per layer, stores plainly and checks layer-wise) "
                         "or raise --memory-limit")
    hc = config.hash
    skipped = []
    if hc.method == "rd":
        skipped.append("rate-distortion hashing (the default) needs onnxruntime runs of the whole model for its "
                       f"sensitivities: the per-layer rule (--weight-error {hc.weight_error or 0.01:g}) is used instead")
    if "hash" not in config.steps:
        raise RedppError(f"the streaming path only hashes ({reason}); --steps {','.join(config.steps)} has no hash step")
    other = [s for s in config.steps if s != "hash"]
    if other:
        skipped.append(f"{' and '.join(other)} skipped: they edit or run the whole graph, which the streaming path "
                       "never holds")
    if not args.plain:
        skipped.append("codebook storage skipped (it holds every layer's codes in memory): hashed weights are written "
                       "plainly in their own type, so the file keeps its size")
    options = StreamOptions(weight_error=hc.weight_error if hc.weight_error is not None else 0.01,
                            bandwidth_factor=hc.bandwidth_factor, nms_radius=hc.nms_radius, snap_zero=hc.snap_zero,
                            include_depthwise=hc.include_depthwise,
                            workers=args.workers if args.workers is not None else STREAM_WORKERS,
                            seed=config.seed, reason=reason, skipped=skipped)
    if not external_in:
        plan.write("output model's external data", data_path(dst))
    plan.check()
    made = []

    def write_model_file(staged):
        files, report = compress_file(src, staged, options, file_bytes_before=file_before,
                                      progress=_Progress("hashing", not args.quiet))
        report.output = str(dst)
        made.append(report)
        return files

    writers = [(dst, write_model_file)]
    if args.report:
        writers.append((Path(args.report), _text_writer(lambda: made[0].to_json())))
    _commit(plan, writers, dst)
    report = made[0]
    if args.json:
        sys.stdout.write(report.to_json())
    elif not args.quiet:
        sys.stdout.write(report.table())
        sys.stdout.write(f"wrote {dst} and {data_path(dst)}" + (f" and {args.report}" if args.report else "") + "\n")
    return 0


def _commit(plan, writers, what) -> None:
    try:
        plan.commit(writers)
    except OSError as err:
        raise write_error(err, what) from None


def _text_writer(text_fn):
    def write(staged: Path):
        staged.write_text(text_fn())
        os.chmod(staged, _default_mode())
        return [staged]
    return write


def _copy_writer(source: Path):
    def write(staged: Path):
        shutil.copyfile(source, staged)
        return [staged]
    return write


def _eval(args) -> int:
    from .evaluate import evaluate, load_data

    _check_models([args.model] + ([args.ref] if args.ref else []))
    input_file(args.data, "data set (.npz)")
    if args.limit is not None and args.limit < 1:
        raise RedppError(f"--limit must be >= 1, got {args.limit}")
    try:
        data = load_data(args.data, args.model, preprocess=args.preprocess, mean=args.mean, std=args.std,
                         layout=args.layout, limit=args.limit)
        result = evaluate(args.model, data, batch_size=args.batch_size, reference=args.ref)
    except ValueError as err:
        raise RedppError(str(err).splitlines()[0]) from None
    except ORT_ERRORS as err:
        raise RedppError(f"onnxruntime cannot run the model: {ort_message(err)}") from None
    if args.json:
        sys.stdout.write(json.dumps(result.to_dict(), indent=2) + "\n")
        return 0
    sys.stdout.write(result.summary(Path(args.model).name, Path(args.ref).name if args.ref else None))
    return 0


def _bench(args) -> int:
    from .bench import measure

    _check_models([args.model] + ([args.other] if args.other else []))
    for name in ("batch", "threads", "repeat"):
        if getattr(args, name) < 1:
            raise RedppError(f"--{name} must be >= 1, got {getattr(args, name)}")
    try:
        result = measure(args.model, args.other, batch=args.batch, threads=args.threads, repeat=args.repeat)
    except ORT_ERRORS as err:
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


def _expand(args) -> int:
    from . import storage
    from .io import load_model, write_model

    src, dst = Path(args.input), Path(args.output)
    input_file(src, "ONNX model")
    model = load_model(src)
    if storage.describe(model)["form"] in ("plain", "plain + stale map"):
        raise RedppError(f"{src} has no codebooks to expand (its weights are plain already)")
    try:
        plain = storage.materialize(model)
    except storage.StorageError as err:
        raise RedppError(f"{src}: its codebooks cannot be decoded ({err})") from None
    plain.ir_version = model.ir_version
    external = bool(external_data_files(src))
    plan = Outputs(force=args.force)
    plan.read("input model", src)
    plan.write("output model", dst)
    if external:
        from .io import data_path

        plan.write("output model's external data", data_path(dst))
    plan.check()
    _commit(plan, [(dst, lambda staged: write_model(plain, staged, external=external))], dst)
    print(f"wrote {dst} (plain float32 weights; {dst.stat().st_size:,} bytes)")
    return 0


def _check_models(paths) -> None:
    """Each path is a readable ONNX model (one-line errors, before onnxruntime sees it)."""
    from .io import load_model

    for path in paths:
        input_file(path, "ONNX model")
        load_model(path)


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

    input_file(args.input, "ONNX model")
    if args.data:
        input_file(args.data, "data set (.npz)")
    if args.limit is not None and args.limit < 1:
        raise RedppError(f"--limit must be >= 1, got {args.limit}")
    plan = Outputs()
    plan.read("input model", args.input)
    for p in external_data_files(args.input):
        plan.read("input model's external data", p)
    plan.read("--data", args.data)
    plan.write("report", args.report, replace=True)
    plan.check()
    config = HashConfig(method="kde", weight_error=args.weight_error, bandwidth_factor=args.bandwidth_factor,
                        include_depthwise=args.include_depthwise)
    shapes = _input_shapes(args.input_shape, args.input)
    model = load_model(args.input)
    validate.check_tensor_data(model)
    model, _ = validate.check_input_model(model)
    check_input_shapes(model, shapes)
    try:
        with input_shapes(shapes):
            result = analyze(model, config, data=args.data, limit=args.limit, input_stats=args.input_stats)
    except ValueError as err:  # a data set the evaluator cannot read
        raise RedppError(str(err)) from None
    text = json.dumps(result.to_dict(), indent=2) + "\n"
    if args.report:
        _commit(plan, [(Path(args.report), _text_writer(lambda: text))], args.report)
    sys.stdout.write(text if args.json else result.table())
    return 0


EXIT_BUG = 1
DEBUG_ENV = "REDPP_ONNX_DEBUG"
"""Set to 1 to see the traceback of an internal error instead of its one-line summary."""


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    commands = {"compress": _compress, "analyze": _analyze, "eval": _eval, "bench": _bench, "expand": _expand}
    try:
        with signals_interrupt(), _quiet_libraries():
            return commands[args.command](args)
    except RedppError as err:
        print(f"redpp-onnx: error: {_one_line(err)}", file=sys.stderr)
        return getattr(err, "exit_code", EXIT_USER_ERROR)
    except KeyboardInterrupt:
        print("redpp-onnx: interrupted; nothing was written", file=sys.stderr)
        return 130
    except Interrupted as sig:
        print(f"redpp-onnx: stopped by signal {sig.signum}; nothing was written", file=sys.stderr)
        return 128 + sig.signum
    except MemoryError:
        print("redpp-onnx: error: out of memory; nothing was written", file=sys.stderr)
        return EXIT_BUG
    except Exception as err:  # noqa: BLE001 - a bug of ours: one line, the traceback on request
        if os.environ.get(DEBUG_ENV) == "1":
            raise
        text = _one_line(err)[:500]
        if "please report it" not in text:
            text += "; this is a bug of redpp-onnx, please report it"
        print(f"redpp-onnx: internal error: {type(err).__name__}: {text} (set {DEBUG_ENV}=1 for the traceback); "
              "nothing was written", file=sys.stderr)
        return EXIT_BUG


@contextlib.contextmanager
def _quiet_libraries():
    """No numpy RuntimeWarning, no onnxruntime log line on stderr: errors reach the user as one
    line of ours (warnings that matter are in the report)."""
    import warnings

    import onnxruntime as ort

    from . import runtime

    level = runtime.LOG_SEVERITY
    runtime.LOG_SEVERITY = 4
    ort.set_default_logger_severity(4)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            yield
    finally:
        runtime.LOG_SEVERITY = level
        ort.set_default_logger_severity(2)


def _one_line(err: BaseException) -> str:
    return " ".join(str(err).split())


if __name__ == "__main__":
    sys.exit(main())
