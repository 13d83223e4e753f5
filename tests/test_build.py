"""The build's header lookup (ORT_INCLUDE_DIR, cache, npm) and the installed library."""

from __future__ import annotations

import ctypes
from pathlib import Path

import pytest

import redpp_onnx
from redpp_onnx._build import ort_headers


def _fake_headers(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name in ort_headers.REQUIRED:
        (folder / name).write_text("// fake\n")
    return folder


def test_ort_include_dir_wins(tmp_path):
    folder = _fake_headers(tmp_path / "inc")
    found = ort_headers.find_ort_include_dir(env={"ORT_INCLUDE_DIR": str(folder), "PATH": ""})
    assert found == folder


def test_bad_ort_include_dir_is_a_clear_error(tmp_path):
    with pytest.raises(ort_headers.OrtHeadersError, match="does not hold the onnxruntime headers"):
        ort_headers.find_ort_include_dir(env={"ORT_INCLUDE_DIR": str(tmp_path), "PATH": ""})


def test_cache_is_used_without_npm(tmp_path):
    target = tmp_path / "ort-headers" / f"{ort_headers.NPM_PACKAGE}-{ort_headers.NPM_VERSION}"
    _fake_headers(target)
    (target / ".complete").write_text("x")
    env = {"REDPP_ONNX_CACHE_DIR": str(tmp_path), "PATH": ""}  # no npm reachable
    assert ort_headers.find_ort_include_dir(env=env) == target


def test_no_headers_and_no_npm_is_a_clear_error(tmp_path):
    env = {"REDPP_ONNX_CACHE_DIR": str(tmp_path), "PATH": str(tmp_path)}
    with pytest.raises(ort_headers.OrtHeadersError) as info:
        ort_headers.find_ort_include_dir(env=env)
    message = str(info.value)
    assert "ORT_INCLUDE_DIR" in message and "npm" in message


def test_failing_npm_is_a_clear_error(tmp_path):
    fake_npm = tmp_path / "bin" / "npm"
    fake_npm.parent.mkdir()
    fake_npm.write_text("#!/bin/sh\necho 'npm error 404 Not Found' >&2\nexit 1\n")
    fake_npm.chmod(0o755)
    env = {"REDPP_ONNX_CACHE_DIR": str(tmp_path / "cache"), "PATH": str(fake_npm.parent)}
    with pytest.raises(ort_headers.OrtHeadersError, match="npm pack .* failed .*404"):
        ort_headers.find_ort_include_dir(env=env)
    assert not list((tmp_path / "cache" / "ort-headers").glob("*/*.h"))  # nothing half-written


def test_library_exports_only_register_custom_ops():
    path = redpp_onnx.get_library_path()
    lib = ctypes.CDLL(path)
    assert hasattr(lib, "RegisterCustomOps")
    assert not hasattr(lib, "_ZN5redpp13PlanSplitConvERKNS_15SplitConvInputsERKNS_14SplitConvAttrsEPNS_13SplitConvPlanE")
