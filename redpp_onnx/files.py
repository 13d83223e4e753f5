"""Every file a command reads and writes: checked before the work, written all at once after it.

* :func:`input_file`: a path to read must be a regular, readable file (a folder is refused, and so
  is a FIFO or a device, which would hang the read or never end).
* :class:`Outputs`: the files one command will write, checked BEFORE the work so that a long run
  never ends in an error about a path: no two of the inputs (with the input model's external data)
  and the outputs are the same file, also through a symbolic link, a hard link or ``./x``; every
  output's folder exists and takes a new file; no name is too long for its file system; an existing
  output is replaced only with ``--force`` (the report is an exception: it is replaced, as a log
  would be, unless it is one of the inputs).
* :meth:`Outputs.commit`: each output is first written in full into a hidden staging folder
  beside its destination (``.redpp-XXXXXXXX``, short, so that a legal long output name still
  fits), then all are renamed into place; files they replace are kept aside until every rename
  succeeded and put back otherwise. On any error, interruption or SIGTERM nothing of the run is
  left behind: no temporary file, no half pair of model and external data.
"""

from __future__ import annotations

import errno
import os
import shutil
import signal
import stat
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional, Tuple, Union

from .errors import RedppError

PathLike = Union[str, os.PathLike]
STAGING_PREFIX = ".redpp-"


class Interrupted(BaseException):
    """SIGTERM / SIGHUP arrived: unwind (cleaning up on the way) like KeyboardInterrupt."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


@contextmanager
def signals_interrupt() -> Iterator[None]:
    """Within the block, SIGTERM and SIGHUP raise :class:`Interrupted` (so ``finally`` clauses
    remove temporary files); outside the main thread this does nothing."""
    def handler(signum, frame):  # noqa: ARG001
        raise Interrupted(signum)

    old = {}
    try:
        for sig in (signal.SIGTERM, signal.SIGHUP):
            old[sig] = signal.signal(sig, handler)
    except ValueError:  # not the main thread
        pass
    try:
        yield
    finally:
        for sig, h in old.items():
            signal.signal(sig, h)


def _describe_os_error(err: OSError) -> str:
    return err.strerror or str(err)


def input_file(path: PathLike, what: str = "file") -> Path:
    """``path`` as a Path after checking it is a regular file this process can read."""
    p = Path(path)
    try:
        st = os.stat(p)
    except FileNotFoundError:
        raise RedppError(f"{p}: no such file") from None
    except OSError as err:
        raise RedppError(f"{p}: cannot read the {what} ({_describe_os_error(err)})") from None
    if stat.S_ISDIR(st.st_mode):
        raise RedppError(f"{p}: is a folder, not a {what}")
    if not stat.S_ISREG(st.st_mode):
        kind = "a FIFO" if stat.S_ISFIFO(st.st_mode) else "a device or socket"
        raise RedppError(f"{p}: is {kind}, not a regular file; give the {what} as a file")
    try:
        with open(p, "rb") as f:
            f.read(1)
    except OSError as err:
        raise RedppError(f"{p}: cannot read the {what} ({_describe_os_error(err)})") from None
    return p


def _identity(p: Path) -> Tuple:
    """What makes two paths the same file: device and inode when it exists (hard and symbolic
    links), else the resolved path."""
    try:
        st = os.stat(p)
        return ("inode", st.st_dev, st.st_ino)
    except OSError:
        return ("path", os.path.realpath(p))


def external_data_files(model_path: PathLike) -> List[Path]:
    """The external data files an ONNX file names (empty when it is not ONNX or has none)."""
    import onnx

    p = Path(model_path)
    try:
        model = onnx.load(str(p), load_external_data=False)
    except Exception:  # noqa: BLE001 - not ONNX: the loader reports it properly
        return []
    names = set()
    graphs = [model.graph]
    while graphs:
        g = graphs.pop()
        for t in g.initializer:
            if t.data_location == onnx.TensorProto.EXTERNAL:
                names.update(e.value for e in t.external_data if e.key == "location")
        for node in g.node:
            for a in node.attribute:
                graphs.extend([a.g] if a.HasField("g") else [])
                graphs.extend(a.graphs)
    return [p.parent / n for n in sorted(names)]


class Outputs:
    """The files one command reads (``inputs``) and writes, checked by :meth:`check` before the
    work and written together by :meth:`commit`."""

    def __init__(self, force: bool = False):
        self.force = force
        self.inputs: List[Tuple[str, Path]] = []
        self.outputs: List[Tuple[str, Path, bool]] = []  # (label, path, replace without --force)
        self.folders: List[Tuple[str, Path]] = []

    def read(self, label: str, path: Optional[PathLike]) -> None:
        if path is not None:
            self.inputs.append((label, Path(path)))

    def write(self, label: str, path: Optional[PathLike], *, replace: bool = False) -> None:
        """``replace``: an existing file is replaced without ``--force`` (reports)."""
        if path is not None:
            self.outputs.append((label, Path(path), replace))

    def folder(self, label: str, path: Optional[PathLike]) -> None:
        """A folder the command writes files into (created if missing)."""
        if path is not None:
            self.folders.append((label, Path(path)))

    def check(self) -> None:
        """Refuse, before any work, what would fail or destroy a file later."""
        for label, p in self.folders:
            if p.exists() and not p.is_dir():
                raise RedppError(f"{p}: {label} must be a folder, but a file of that name exists")
            parent = p if p.is_dir() else p.parent
            self._check_name(label, p)
            self._check_folder(label, p, parent)
        for label, p, replace in self.outputs:
            self._check_name(label, p)
            if p.is_dir():
                raise RedppError(f"{p}: is a folder; give a file name for the {label}")
            if p.exists() or p.is_symlink():
                if not (p.is_file() or p.is_symlink()):
                    raise RedppError(f"{p}: exists and is not a regular file; choose another {label} path")
                if not (self.force or replace):
                    raise RedppError(f"{p}: already exists ({label}); pass --force to overwrite")
            planned = any(p.parent == f for _, f in self.folders)  # created at commit when missing
            if not (planned and not p.parent.exists()):
                self._check_folder(label, p, p.parent)
        seen: Dict[Tuple, Tuple[str, bool]] = {}  # identity -> (label, is an output)
        for label, p, is_output in ([(label, p, False) for label, p in self.inputs]
                                    + [(label, p, True) for label, p, _ in self.outputs]):
            key = _identity(p)
            if key in seen and (is_output or seen[key][1]):  # two inputs may be one file
                raise RedppError(f"{p}: the {label} is the same file as the {seen[key][0]}; "
                                 "give them different paths")
            seen.setdefault(key, (label, is_output))

    @staticmethod
    def _check_name(label: str, p: Path) -> None:
        folder = p.parent if p.parent.is_dir() else None
        limit = 255
        if folder is not None:
            try:
                limit = os.pathconf(folder, "PC_NAME_MAX")
            except (OSError, ValueError):
                pass
        if len(os.fsencode(p.name)) > limit:
            raise RedppError(f"{p.name[:40]}...: the {label} name has {len(os.fsencode(p.name))} bytes; "
                             f"this file system allows {limit}")

    @staticmethod
    def _check_folder(label: str, p: Path, folder: Path) -> None:
        if not folder.is_dir():
            raise RedppError(f"{p}: the folder {folder} does not exist ({label})")
        try:  # os.access says yes to root on a read-only file system: try it
            probe = tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=folder)
            os.rmdir(probe)
        except OSError as err:
            raise RedppError(f"{p}: cannot write the {label} into {folder} ({_describe_os_error(err)})") from None

    def commit(self, writers: List[Tuple[Path, Callable[[Path], List[Path]]]]) -> List[Path]:
        """Write each ``(destination, writer)``: ``writer(staged_path)`` writes the file (and any
        companion files named after it, which it returns) into a staging folder; then everything
        is renamed into place. Returns the destinations written. All or nothing."""
        staging: Dict[Path, Path] = {}
        moves: List[Tuple[Path, Path]] = []  # (staged file, destination)
        done: List[Tuple[Path, Optional[Path]]] = []  # (destination, kept-aside old file)
        try:
            for dest, writer in writers:
                folder = dest.parent
                if folder not in staging:
                    staging[folder] = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=folder))
                staged = staging[folder] / dest.name
                companions = [Path(x) for x in (writer(staged) or []) if Path(x) != staged]
                for f in companions + [staged]:  # a model's data file before the model
                    if f.exists():
                        moves.append((f, folder / f.name))
            for i, (src, dest) in enumerate(moves):
                old = None
                if dest.exists() or dest.is_symlink():
                    old = staging[dest.parent] / f"old{i}"
                    os.replace(dest, old)
                done.append((dest, old))
                os.replace(src, dest)
            written = [dest for _, dest in moves]
            done = []  # committed: the kept-aside files are dropped with the staging folders
            return written
        except BaseException:
            for dest, old in reversed(done):  # put back what was there
                try:
                    if old is not None:
                        os.replace(old, dest)
                    else:
                        dest.unlink(missing_ok=True)
                except OSError:
                    pass
            raise
        finally:
            for folder in staging.values():
                shutil.rmtree(folder, ignore_errors=True)


def write_error(err: OSError, what: PathLike) -> RedppError:
    """An OSError while writing, as a one-line user error."""
    if err.errno == errno.ENOSPC:
        return RedppError(f"{what}: no space left on the device; nothing was written")
    return RedppError(f"{what}: cannot write ({_describe_os_error(err)}); nothing was written")
