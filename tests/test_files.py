"""The file-level battery (issue 10): every subcommand refuses, before any work, paths that would
destroy a file or fail late, and leaves nothing behind when it fails or is stopped."""

from __future__ import annotations

import errno
import os
import shutil
import signal
import stat
import tempfile
from pathlib import Path

import numpy as np
import onnx
import pytest

from redpp_onnx import cli, io
from redpp_onnx.cli import main

from .graphs import conv_bn_relu_gemm

DIGITS = Path(__file__).resolve().parents[1] / "models"
NOBODY = 65534


def _one_line_error(capsys, code, expected_code=2, fragment=None):
    err = capsys.readouterr().err.strip()
    assert code == expected_code, err
    assert err.startswith("redpp-onnx: error:") and "\n" not in err and "Traceback" not in err, err
    if fragment is not None:
        assert fragment in err, err
    return err


def _files(folder: Path) -> dict:
    """Every file below ``folder`` (hidden ones too) with its bytes."""
    return {str(p.relative_to(folder)): (p.read_bytes() if p.is_file() else None)
            for p in sorted(folder.rglob("*")) if not p.is_dir() or p.name.startswith(".")}


@pytest.fixture
def work(tmp_path):
    model = conv_bn_relu_gemm()
    path = tmp_path / "m.onnx"
    io.save_model(model, path)
    return tmp_path, path


def _external_model(folder: Path, name="e.onnx", data_name=None) -> Path:
    model = conv_bn_relu_gemm()
    path = folder / name
    onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=data_name or name + ".data", size_threshold=64)
    return path


# -- compress: outputs that are inputs ----------------------------------------------------------

@pytest.mark.parametrize("how", ["same", "dot", "symlink", "hardlink"])
def test_report_naming_the_input_is_refused(work, capsys, how):
    tmp, model = work
    alias = {"same": model, "dot": tmp / "." / model.name}.get(how)
    if how == "symlink":
        alias = tmp / "link.json"
        alias.symlink_to(model)
    if how == "hardlink":
        alias = tmp / "hard.json"
        os.link(model, alias)
    before = _files(tmp)
    err = _one_line_error(capsys, main(["compress", str(model), "-o", str(tmp / "o.onnx"), "--report", str(alias)]))
    assert "same file as the input model" in err
    assert _files(tmp) == before


def test_report_naming_the_output_is_refused(work, capsys):
    tmp, model = work
    before = _files(tmp)
    out = tmp / "o.onnx"
    err = _one_line_error(capsys, main(["compress", str(model), "-o", str(out), "--report", str(tmp / "./o.onnx")]))
    assert "same file as the output model" in err
    assert _files(tmp) == before


def test_output_through_a_symlink_to_the_input_is_refused(work, capsys):
    tmp, model = work
    (tmp / "link.onnx").symlink_to(model)
    before = _files(tmp)
    _one_line_error(capsys, main(["compress", str(model), "-o", str(tmp / "link.onnx"), "--force"]),
                    fragment="same file as the input model")
    assert _files(tmp) == before


def test_output_data_file_that_is_the_inputs_data_is_refused(tmp_path, capsys):
    src = _external_model(tmp_path, "a.onnx", data_name="b.onnx.data")  # a.onnx keeps its tensors in b.onnx.data
    before = _files(tmp_path)
    _one_line_error(capsys, main(["compress", str(src), "-o", str(tmp_path / "b.onnx"), "--force"]),
                    fragment="same file as the input model's external data")
    assert _files(tmp_path) == before


def test_output_data_file_is_not_overwritten_without_force(tmp_path, capsys):
    src = _external_model(tmp_path)
    (tmp_path / "o.onnx.data").write_bytes(b"someone's file")
    before = _files(tmp_path)
    _one_line_error(capsys, main(["compress", str(src), "-o", str(tmp_path / "o.onnx")]), fragment="--force")
    assert _files(tmp_path) == before
    assert main(["compress", str(src), "-o", str(tmp_path / "o.onnx"), "--force", "-q"]) == 0
    assert (tmp_path / "o.onnx.data").read_bytes() != b"someone's file"


def test_compressing_an_external_model_onto_itself_is_refused(tmp_path, capsys):
    src = _external_model(tmp_path, "m.onnx")
    before = _files(tmp_path)
    _one_line_error(capsys, main(["compress", str(src), "-o", str(src), "--force"]),
                    fragment="same file as the input model")
    assert _files(tmp_path) == before


# -- compress: paths that would fail late --------------------------------------------------------

@pytest.mark.parametrize("flag", ["--report", "-o"])
def test_a_folder_as_an_output_file_is_refused_before_the_work(work, capsys, flag):
    tmp, model = work
    (tmp / "d").mkdir()
    args = {"--report": ["-o", str(tmp / "o.onnx"), "--report", str(tmp / "d")],
            "-o": ["-o", str(tmp / "d"), "--force"]}[flag]
    before = _files(tmp)
    _one_line_error(capsys, main(["compress", str(model)] + args), fragment="is a folder")
    assert _files(tmp) == before


def test_report_dot_is_refused_before_the_work(work, capsys, monkeypatch):
    tmp, model = work
    monkeypatch.chdir(tmp)
    before = _files(tmp)
    _one_line_error(capsys, main(["compress", "m.onnx", "-o", "o.onnx", "--report", "."]), fragment="is a folder")
    assert _files(tmp) == before


def test_a_long_legal_output_name_works(work):
    tmp, model = work
    out = tmp / ("x" * 245 + ".onnx")  # 250 bytes: legal; the temporary names must stay shorter
    assert main(["compress", str(model), "-o", str(out), "-q", "--report", str(tmp / ("r" * 250))]) == 0
    assert onnx.load(str(out)).graph.node
    assert sorted(p.name for p in tmp.iterdir()) == sorted(["m.onnx", out.name, "r" * 250])


def test_a_too_long_data_file_name_is_refused_before_the_work(tmp_path, capsys):
    src = _external_model(tmp_path)
    out = tmp_path / ("x" * 247 + ".onnx")  # 252 bytes: legal, but out + ".data" is not
    before = _files(tmp_path)
    _one_line_error(capsys, main(["compress", str(src), "-o", str(out)]), fragment="this file system allows")
    assert _files(tmp_path) == before


def test_plot_naming_a_file_is_refused(work, capsys):
    pytest.importorskip("matplotlib")
    tmp, model = work
    (tmp / "f").write_text("x")
    before = _files(tmp)
    _one_line_error(capsys, main(["compress", str(model), "-o", str(tmp / "o.onnx"), "--plot", str(tmp / "f")]),
                    fragment="must be a folder")
    assert _files(tmp) == before


def test_fifo_as_input_is_refused_without_hanging(tmp_path, capsys):
    fifo = tmp_path / "pipe.onnx"
    os.mkfifo(fifo)
    for args in (["compress", str(fifo), "-o", str(tmp_path / "o.onnx")], ["analyze", str(fifo)],
                 ["eval", str(fifo), "--data", str(DIGITS / "digits_test.npz")], ["bench", str(fifo)],
                 ["eval", str(DIGITS / "digits_cnn.onnx"), "--data", str(fifo)]):
        _one_line_error(capsys, main(args), fragment="FIFO")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pipe.onnx"]


# -- read-only folders (a process without root: root writes anywhere) ---------------------------

def _as_unprivileged(fn) -> int:
    """Run ``fn()`` (returns an exit status) in a child without root's privileges."""
    if os.geteuid() != 0:
        return fn()
    pid = os.fork()
    if pid == 0:
        code = 99
        try:
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            code = fn()
        finally:
            os._exit(code)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


@pytest.fixture
def shared_tmp():
    """A folder an unprivileged user can enter (pytest's tmp_path is private to root)."""
    folder = Path(tempfile.mkdtemp(prefix="redpp-files-"))
    folder.chmod(0o777)
    try:
        yield folder
    finally:
        for p in folder.rglob("*"):
            if p.is_dir():
                p.chmod(0o777)
        shutil.rmtree(folder)


@pytest.mark.parametrize("which", ["output", "report", "plot"])
def test_read_only_folders_are_refused_before_the_work(shared_tmp, which):
    if which == "plot":
        pytest.importorskip("matplotlib")
    model = shared_tmp / "m.onnx"
    io.save_model(conv_bn_relu_gemm(), model)
    model.chmod(0o644)
    ro = shared_tmp / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    rw = shared_tmp / "rw"
    rw.mkdir()
    rw.chmod(0o777)
    target = {"output": ["-o", str(ro / "o.onnx")],
              "report": ["-o", str(rw / "o.onnx"), "--report", str(ro / "r.json")],
              "plot": ["-o", str(rw / "o.onnx"), "--plot", str(ro / "figs")]}[which]
    err_file = shared_tmp / "err.txt"
    calls = []

    def run():
        import sys

        from redpp_onnx import compress as compress_module

        def never(*a, **k):  # the refusal must come before the work
            calls.append(1)
            os._exit(98)

        compress_module._compress = never
        with open(err_file, "w") as f:
            sys.stderr = f
            return main(["compress", str(model)] + target)

    assert _as_unprivileged(run) == 2
    err = err_file.read_text().strip()
    assert err.startswith("redpp-onnx: error:") and "cannot write" in err and "\n" not in err, err
    assert list(ro.iterdir()) == [] and list(rw.iterdir()) == []


# -- failures and signals during the write leave nothing ------------------------------------------

def test_full_disk_while_writing_the_report_leaves_nothing(work, capsys, monkeypatch):
    tmp, model = work
    real = cli._text_writer

    def full(text_fn):
        def write(staged):
            real(text_fn)(staged)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return write

    monkeypatch.setattr(cli, "_text_writer", full)
    before = _files(tmp)
    _one_line_error(capsys, main(["compress", str(model), "-o", str(tmp / "o.onnx"), "--report",
                                  str(tmp / "r.json")]), fragment="no space left")
    assert _files(tmp) == before


def test_failure_after_the_data_file_keeps_the_old_pair(tmp_path, capsys, monkeypatch):
    """Replacing model + data: when the model's rename fails after the data's, the old pair is put back."""
    src = _external_model(tmp_path)
    assert main(["compress", str(src), "-o", str(tmp_path / "o.onnx"), "-q"]) == 0
    before = _files(tmp_path)
    real = os.replace

    def replace(a, b):
        if str(b).endswith("o.onnx") and ".redpp-" in str(a) and "old" not in Path(a).name:
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        return real(a, b)

    monkeypatch.setattr(os, "replace", replace)
    _one_line_error(capsys, main(["compress", str(src), "-o", str(tmp_path / "o.onnx"), "--force",
                                  "--weight-error", "0.05"]), fragment="nothing was written")
    assert _files(tmp_path) == before


def test_sigterm_during_the_write_leaves_nothing(tmp_path):
    src = _external_model(tmp_path)
    before = _files(tmp_path)
    pid = os.fork()
    if pid == 0:
        code = 99
        try:
            real = io.write_model

            def slow(model, path, **kw):
                files = real(model, path, **kw)  # the staged files exist now
                os.kill(os.getpid(), signal.SIGTERM)
                return files

            cli_write = "write_model"
            import redpp_onnx.io as io_module

            setattr(io_module, cli_write, slow)
            fd = os.open(os.devnull, os.O_WRONLY)
            os.dup2(fd, 2)
            code = main(["compress", str(src), "-o", str(tmp_path / "o.onnx"), "--no-verify"])
        finally:
            os._exit(code)
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 128 + signal.SIGTERM
    assert _files(tmp_path) == before


# -- analyze, eval, bench ------------------------------------------------------------------------

def test_analyze_report_naming_the_input_is_refused(work, capsys):
    tmp, model = work
    before = _files(tmp)
    _one_line_error(capsys, main(["analyze", str(model), "--report", str(model)]), fragment="same file as the input")
    _one_line_error(capsys, main(["analyze", str(model), "--report", str(tmp)]), fragment="is a folder")
    assert _files(tmp) == before


@pytest.mark.parametrize("command", ["eval", "eval-ref", "bench", "bench-other", "analyze"])
def test_a_file_that_is_not_onnx_is_a_one_line_error(work, capsys, command):
    tmp, model = work
    bad = tmp / "bad.onnx"
    bad.write_bytes(b"\x08\x07garbage that is not a protobuf" * 3)
    data = str(DIGITS / "digits_test.npz")
    args = {"eval": ["eval", str(bad), "--data", data],
            "eval-ref": ["eval", str(DIGITS / "digits_cnn.onnx"), "--data", data, "--ref", str(bad)],
            "bench": ["bench", str(bad)], "bench-other": ["bench", str(model), str(bad), "--repeat", "1"],
            "analyze": ["analyze", str(bad)]}[command]
    _one_line_error(capsys, main(args), fragment="bad.onnx")


@pytest.mark.parametrize("command", ["eval", "analyze"])
def test_a_folder_as_data_is_a_one_line_error(work, capsys, command):
    tmp, model = work
    args = {"eval": ["eval", str(model), "--data", str(tmp)], "analyze": ["analyze", str(model), "--data", str(tmp)]}
    _one_line_error(capsys, main(args[command]), fragment="is a folder")


def test_internal_errors_are_one_line_and_say_so(work, capsys, monkeypatch):
    tmp, model = work
    from redpp_onnx import compress as compress_module

    def boom(*a, **k):
        raise IndexError("list index out of range")

    monkeypatch.setattr(compress_module, "_compress", boom)
    before = _files(tmp)
    assert main(["compress", str(model), "-o", str(tmp / "o.onnx")]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("redpp-onnx: internal error: IndexError") and "please report it" in err
    assert "\n" not in err and "Traceback" not in err
    assert _files(tmp) == before
    monkeypatch.setenv(cli.DEBUG_ENV, "1")
    with pytest.raises(IndexError):
        main(["compress", str(model), "-o", str(tmp / "o.onnx")])


def test_outputs_keep_the_usual_permissions(work):
    tmp, model = work
    out, report = tmp / "o.onnx", tmp / "r.json"
    assert main(["compress", str(model), "-o", str(out), "--report", str(report), "-q"]) == 0
    umask = os.umask(0)
    os.umask(umask)
    for p in (out, report):
        assert stat.S_IMODE(p.stat().st_mode) == 0o666 & ~umask
    assert np.isfinite(os.path.getsize(out))


def test_output_naming_the_verify_data_is_refused(work, capsys):
    tmp, model = work
    data = tmp / "inputs.npz"
    np.savez(data, x=np.zeros((2, 3, 8, 8), np.float32))
    before = _files(tmp)
    for args in (["-o", str(data), "--force"], ["-o", str(tmp / "o.onnx"), "--report", str(data)]):
        _one_line_error(capsys, main(["compress", str(model), "--verify-data", str(data)] + args),
                        fragment="same file as the --verify-data data")
    assert _files(tmp) == before


def _bad_model_file(kind: str, folder: Path) -> Path:
    path = folder / f"{kind}.onnx"
    if kind == "folder":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "garbage":
        path.write_bytes(b"\x00\xffnot onnx\x08" * 20)
    elif kind == "truncated":
        data = (DIGITS / "digits_cnn.onnx").read_bytes()
        path.write_bytes(data[: len(data) // 3])
    elif kind == "external-missing":
        onnx.save_model(onnx.load(str(DIGITS / "digits_cnn.onnx")), str(path), save_as_external_data=True,
                        location="gone.data", size_threshold=64)
        (folder / "gone.data").unlink()
    return path


BATTERY = ["missing", "folder", "fifo", "empty", "garbage", "truncated", "external-missing"]


@pytest.mark.parametrize("kind", BATTERY)
@pytest.mark.parametrize("command", ["compress", "analyze", "eval", "eval --ref", "bench", "bench B"])
def test_every_subcommand_refuses_a_bad_model_file_in_one_line(tmp_path, capsys, command, kind):
    bad = _bad_model_file(kind, tmp_path)
    good, data = str(DIGITS / "digits_cnn.onnx"), str(DIGITS / "digits_test.npz")
    args = {"compress": ["compress", str(bad), "-o", str(tmp_path / "o.onnx"), "--report", str(tmp_path / "r.json")],
            "analyze": ["analyze", str(bad), "--report", str(tmp_path / "r.json")],
            "eval": ["eval", str(bad), "--data", data], "eval --ref": ["eval", good, "--data", data, "--ref", str(bad)],
            "bench": ["bench", str(bad)], "bench B": ["bench", good, str(bad), "--repeat", "1"]}[command]
    before = _files(tmp_path)
    err = _one_line_error(capsys, main(args))
    assert bad.name in err
    assert _files(tmp_path) == before


@pytest.mark.parametrize("kind", ["missing", "folder", "fifo", "empty", "garbage"])
@pytest.mark.parametrize("command", ["eval", "analyze", "compress --calibrate", "compress --verify-data"])
def test_every_subcommand_refuses_a_bad_data_file_in_one_line(tmp_path, capsys, command, kind):
    bad = _bad_model_file(kind, tmp_path).rename(tmp_path / "data.npz") if kind != "missing" else tmp_path / "data.npz"
    good = str(DIGITS / "digits_cnn.onnx")
    args = {"eval": ["eval", good, "--data", str(bad)], "analyze": ["analyze", good, "--data", str(bad)],
            "compress --calibrate": ["compress", good, "-o", str(tmp_path / "o.onnx"), "--calibrate", str(bad),
                                     "--alpha", "0.1"],
            "compress --verify-data": ["compress", good, "-o", str(tmp_path / "o.onnx"), "--verify-data", str(bad)]}
    before = _files(tmp_path)
    err = _one_line_error(capsys, main(args[command]))
    assert "data.npz" in err
    assert _files(tmp_path) == before
