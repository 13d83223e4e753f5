"""Find the onnxruntime C/C++ headers for building the custom-op library.

The onnxruntime wheel ships no headers. Order of precedence:

1. ``ORT_INCLUDE_DIR`` (environment): a folder holding ``onnxruntime_cxx_api.h`` and friends.
2. The cache: ``$REDPP_ONNX_CACHE_DIR``, else ``$XDG_CACHE_HOME/redpp-onnx``, else
   ``~/.cache/redpp-onnx``; headers live in ``ort-headers/<package>-<version>/``.
3. Fetch: ``npm pack <package>@<version>`` with the machine's npm client (whatever registry
   it is configured for), then extract only the header folder into the cache.

Standard library only: ``setup.py`` imports this file before any dependency is installed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path
from typing import Callable, Mapping, Optional

NPM_PACKAGE = "com.github.asus4.onnxruntime"
NPM_VERSION = "0.4.9"  # ORT_API_VERSION 29: works with onnxruntime >= 1.29
HEADERS_IN_PACKAGE = ("package/Plugins/iOS~/onnxruntime.xcframework/ios-arm64_x86_64-simulator/"
                      "onnxruntime.framework/Headers/")
REQUIRED = ("onnxruntime_c_api.h", "onnxruntime_cxx_api.h", "onnxruntime_cxx_inline.h",
            "onnxruntime_float16.h")
_DONE_MARKER = ".complete"


class OrtHeadersError(RuntimeError):
    """The headers could not be found or fetched; the message says what to do."""


def _missing(folder: Path) -> list[str]:
    return [name for name in REQUIRED if not (folder / name).is_file()]


def cache_root(env: Mapping[str, str]) -> Path:
    if env.get("REDPP_ONNX_CACHE_DIR"):
        return Path(env["REDPP_ONNX_CACHE_DIR"]).expanduser()
    base = Path(env["XDG_CACHE_HOME"]).expanduser() if env.get("XDG_CACHE_HOME") else Path.home() / ".cache"
    return base / "redpp-onnx"


def find_ort_include_dir(env: Optional[Mapping[str, str]] = None, npm: str = "npm",
                         log: Callable[[str], None] = print) -> Path:
    """Return a folder with the onnxruntime headers, fetching them into the cache if needed."""
    env = os.environ if env is None else env
    explicit = env.get("ORT_INCLUDE_DIR")
    if explicit:
        folder = Path(explicit).expanduser()
        missing = _missing(folder)
        if missing:
            raise OrtHeadersError(
                f"ORT_INCLUDE_DIR={explicit} does not hold the onnxruntime headers "
                f"(missing: {', '.join(missing)}). Point it at the folder that contains "
                f"onnxruntime_cxx_api.h, or unset it to fetch {NPM_PACKAGE}@{NPM_VERSION} with npm.")
        return folder

    target = cache_root(env) / "ort-headers" / f"{NPM_PACKAGE}-{NPM_VERSION}"
    if (target / _DONE_MARKER).is_file() and not _missing(target):
        return target

    npm_path = shutil.which(npm, path=env.get("PATH"))
    if npm_path is None:
        raise OrtHeadersError(
            "Cannot build the redpp-onnx custom-op library: the onnxruntime C/C++ headers are "
            "needed and were not found. Either set ORT_INCLUDE_DIR to a folder holding "
            f"onnxruntime_cxx_api.h, or install npm so that the build can fetch "
            f"{NPM_PACKAGE}@{NPM_VERSION} (it carries the headers) into {target.parent}.")
    target.parent.mkdir(parents=True, exist_ok=True)
    log(f"redpp-onnx: fetching onnxruntime headers ({NPM_PACKAGE}@{NPM_VERSION}) with npm "
        f"into {target}")
    with tempfile.TemporaryDirectory(prefix="redpp-ort-", dir=target.parent) as tmp:
        tmp_path = Path(tmp)
        proc = subprocess.run([npm_path, "pack", f"{NPM_PACKAGE}@{NPM_VERSION}", "--silent"],
                              cwd=tmp_path, capture_output=True, text=True,
                              env={**os.environ, **env})
        tarballs = sorted(tmp_path.glob("*.tgz"))
        if proc.returncode != 0 or not tarballs:
            detail = (proc.stderr or proc.stdout or "").strip().splitlines()[-3:]
            raise OrtHeadersError(
                f"'npm pack {NPM_PACKAGE}@{NPM_VERSION}' failed (exit {proc.returncode}): "
                f"{' | '.join(detail) or 'no tarball produced'}. Set ORT_INCLUDE_DIR to a folder "
                "holding the onnxruntime headers to build without npm.")
        staging = tmp_path / "headers"
        staging.mkdir()
        _extract_headers(tarballs[0], staging)
        missing = _missing(staging)
        if missing:
            raise OrtHeadersError(
                f"{NPM_PACKAGE}@{NPM_VERSION} does not contain the expected headers under "
                f"{HEADERS_IN_PACKAGE} (missing: {', '.join(missing)}); set ORT_INCLUDE_DIR.")
        (staging / _DONE_MARKER).write_text(f"{NPM_PACKAGE}@{NPM_VERSION}\n")
        if target.exists():  # an incomplete earlier attempt
            shutil.rmtree(target)
        try:
            os.replace(staging, target)
        except OSError:
            if not ((target / _DONE_MARKER).is_file() and not _missing(target)):
                raise  # not a concurrent build that finished first
    return target


def _extract_headers(tarball: Path, dest: Path) -> None:
    """Extract the regular files directly under HEADERS_IN_PACKAGE, flattened, into dest."""
    with tarfile.open(tarball, "r:gz") as tar:
        for member in tar:
            if not member.isfile() or not member.name.startswith(HEADERS_IN_PACKAGE):
                continue
            name = member.name[len(HEADERS_IN_PACKAGE):]
            if not name or "/" in name or name.startswith("."):
                continue
            src = tar.extractfile(member)
            if src is not None:
                (dest / name).write_bytes(src.read())
