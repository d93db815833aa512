"""Writing files so that a kill never leaves half of one behind, and the output directories fedpeft writes into.

Every output file is written to a temporary sibling (a hidden name ending in ``.tmp``) and renamed over its
target, so a reader sees the old file or the new one, never a part of one; checkpoints and parts are also
flushed to disk (``fsync``) before the rename. A directory fedpeft writes in full (a run's ``base_model/``) is
built as a temporary sibling and renamed into place; a directory a user may share with other files (an adapter
directory, ``plots/``) receives its files one atomic rename at a time.

An output directory carries a marker file naming what wrote it (:data:`RUN_MARKER`, :data:`REPORT_MARKER`,
:data:`ADAPTER_MARKER`); a command writes only into a new or empty directory, or into one that holds its own
marker. A directory without it is never taken for fedpeft's: with ``--force`` a command writes beside its files,
and refuses by name any file or folder it would replace (:func:`check_output_dir`).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import BinaryIO

from fedpeft.core.errors import UserError
from fedpeft.core.jsontypes import JSONObject, JSONValue

MARKER_FORMAT = 1
"""Version of the marker files' JSON."""
RUN_MARKER = ".fedpeft-run"
"""Marker of a run directory (``fedpeft run``): ``{"format", "kind": "run", "config_sha256"}``."""
REPORT_MARKER = ".fedpeft-report"
"""Marker of a report directory (``fedpeft report --out``)."""
ADAPTER_MARKER = ".fedpeft-adapter"
"""Marker of an adapter directory written by ``fedpeft personalize --out``."""


# ---------------------------------------------------------------------------------------------- atomic writes
def _read_umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


UMASK = _read_umask()  # read once, at import, before any thread could create a file meanwhile


def with_umask_mode(path: Path) -> None:
    """Give the file ``path`` the mode a newly created file gets from the umask (writers such as safetensors create
    theirs readable by the owner only)."""
    os.chmod(path, 0o666 & ~UMASK)


def temporary_sibling(path: Path) -> Path:
    """A hidden, unique name beside ``path`` for writing it before the rename."""
    return path.with_name(f".{path.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp")


def _fsync_dir(directory: Path) -> None:
    """Make a rename in ``directory`` durable (best effort: not every platform opens directories)."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def write_atomic(path: Path, write: Callable[[BinaryIO], object], *, fsync: bool = False) -> None:
    """Call ``write(binary file)`` on a temporary sibling of ``path``, then rename it over ``path``.

    With ``fsync``, the data (and the rename) reach the disk before this returns. The temporary file is removed
    when ``write`` raises.
    """

    def to_file(tmp: Path) -> None:
        with open(tmp, "wb") as handle:
            write(handle)
            if fsync:
                handle.flush()
                os.fsync(handle.fileno())

    _replace(path, to_file, fsync=fsync)


def write_bytes_atomic(path: Path, data: bytes, *, fsync: bool = False) -> None:
    """Write ``data`` to ``path`` through a temporary file and a rename."""
    write_atomic(path, lambda handle: handle.write(data), fsync=fsync)


def write_text_atomic(path: Path, text: str, *, fsync: bool = False) -> None:
    """Write ``text`` (UTF-8) to ``path`` through a temporary file and a rename."""
    write_bytes_atomic(path, text.encode("utf-8"), fsync=fsync)


def write_file_atomic(path: Path, write: Callable[[Path], None], *, fsync: bool = False) -> None:
    """Call ``write(temporary path)`` for a writer that takes a file name (safetensors), then rename the file it
    wrote over ``path``; as :func:`write_atomic` otherwise."""

    def to_file(tmp: Path) -> None:
        write(tmp)
        with_umask_mode(tmp)
        if fsync:
            with open(tmp, "rb") as handle:
                os.fsync(handle.fileno())

    _replace(path, to_file, fsync=fsync)


def _replace(path: Path, to_file: Callable[[Path], None], *, fsync: bool) -> None:
    """``to_file(temporary sibling)``, then the rename over ``path`` (made durable with ``fsync``); the temporary
    file is removed when ``to_file`` raises."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_sibling(path)
    try:
        to_file(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if fsync:
        _fsync_dir(path.parent)


@contextlib.contextmanager
def _scratch_beside(target: Path) -> Iterator[Path]:
    """A new temporary directory beside ``target`` (its parent created), removed when the block ends."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_sibling(target)
    tmp.mkdir()
    try:
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@contextlib.contextmanager
def staged_dir(target: Path) -> Iterator[Path]:
    """Yield a temporary sibling directory of ``target``; when the block succeeds, it replaces ``target`` (a
    previous ``target`` is removed), and when it raises, it is removed. For directories fedpeft owns whole."""
    target = Path(target)
    with _scratch_beside(target) as tmp:
        yield tmp
        for written in tmp.rglob("*"):
            if written.is_file():
                with_umask_mode(written)
        if target.exists():
            old = temporary_sibling(target)
            os.replace(target, old)
            os.replace(tmp, target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, target)


@contextlib.contextmanager
def staged_files(target: Path) -> Iterator[Path]:
    """Yield a temporary sibling directory of ``target``; when the block succeeds, each file written there is
    renamed into ``target`` (created if missing; other files of ``target`` stay), and the temporary directory is
    removed either way. For directories that may hold other files."""
    target = Path(target)
    with _scratch_beside(target) as tmp:
        yield tmp
        target.mkdir(parents=True, exist_ok=True)
        for source in sorted(tmp.rglob("*")):
            if source.is_file():
                with_umask_mode(source)
                destination = target / source.relative_to(tmp)
                destination.parent.mkdir(parents=True, exist_ok=True)
                os.replace(source, destination)


# ---------------------------------------------------------------------------------------------- output directories
def relative_path(path: Path, start: Path) -> str:
    """``path`` relative to the directory ``start`` (POSIX separators), as an adapter names its base model so that
    both can move together; the absolute path where none exists (another drive)."""
    resolved = Path(path).resolve()
    try:
        return Path(os.path.relpath(resolved, Path(start).resolve())).as_posix()
    except ValueError:
        return resolved.as_posix()


def path_component(name: str) -> str:
    """``name`` as one safe path component: path separators and control characters become ``-``, then leading
    dots, dashes and spaces are dropped (no ``..``, no hidden directory, nothing that reads as an option);
    ``run`` when nothing is left. ``../x`` gives ``x``, ``a/b`` gives ``a-b``."""
    safe = re.sub(r"[/\\\x00-\x1f\x7f]", "-", str(name)).lstrip(".- ").rstrip(" ")
    return safe or "run"


def read_marker(directory: Path, marker: str) -> JSONObject | None:
    """The JSON of ``directory``'s ``marker`` file; ``None`` when there is none (an unreadable one reads ``{}``)."""
    path = Path(directory) / marker
    if not path.is_file():
        return None
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def write_marker(directory: Path, marker: str, kind: str, **fields: JSONValue) -> None:
    """Write ``directory``'s marker file (format version, kind and ``fields``)."""
    text = json.dumps({"format": MARKER_FORMAT, "kind": kind, **fields}, sort_keys=True) + "\n"
    write_text_atomic(Path(directory) / marker, text)


def is_empty_dir(path: Path) -> bool:
    """Whether ``path`` is a directory without entries."""
    return Path(path).is_dir() and not any(Path(path).iterdir())


def check_writable_place(path: Path) -> None:
    """Raise a :class:`UserError` when ``path`` cannot become an output directory: it is an existing file, or the
    nearest existing directory above it cannot be written. Writes nothing."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise UserError(f"The output path {path} is an existing file, not a directory; choose a directory.")
    probe = path
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if probe.exists() and not probe.is_dir():
        raise UserError(f"Cannot create the output directory {path}: {probe} is a file; choose another place.")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise UserError(f"Cannot write to the output directory {path} ({probe} is not writable); choose another place.")
    try:  # permissions do not tell everything (a read-only or virtual file system): try, and leave nothing
        os.rmdir(tempfile.mkdtemp(prefix=".fedpeft-probe-", dir=probe))
    except OSError as err:
        raise UserError(
            f"Cannot create the output directory {path}: writing in {probe} fails ({err.strerror or err}); "
            "choose another place."
        ) from None


def entry_label(path: Path) -> str:
    """``path``'s name as a listing shows it: a directory with a trailing ``/``."""
    return f"{path.name}/" if path.is_dir() else path.name


def check_output_dir(
    path: Path,
    command: str,
    marker: str,
    *,
    writes: Iterable[str],
    force: bool = False,
    accepted: Callable[[Path], bool] | None = None,
) -> None:
    """Raise a :class:`UserError` unless ``fedpeft <command>`` may write into ``path``; writes nothing.

    It may write into a new or empty directory, one holding its ``marker``, or one ``accepted`` takes (a run that
    ``report`` reads). A directory without the marker is never taken for one of fedpeft's, whatever it holds:
    only ``force`` writes into it, and then only where none of the top-level names the command ``writes``
    exists, so that nothing fedpeft did not write is replaced (those names are refused instead).
    """
    path = Path(path)
    check_writable_place(path)
    if not path.exists() or is_empty_dir(path):
        return
    if read_marker(path, marker) is not None or (accepted is not None and accepted(path)):
        return
    if not force:
        raise UserError(
            f"{path} is not empty and holds no {marker} marker (it was not written by `fedpeft {command}`); choose "
            "a new or empty directory, or pass --force to write beside its files."
        )
    check_no_clash(path, writes)


def check_no_clash(path: Path, writes: Iterable[str]) -> None:
    """Raise a :class:`UserError` naming every entry of ``writes`` that exists in directory ``path``: ``--force``
    writes into a directory fedpeft did not make only beside its files, never over them."""
    clashes = [entry_label(Path(path) / name) for name in writes if os.path.lexists(Path(path) / name)]
    if clashes:
        raise UserError(
            f"--force writes into {path} only beside files fedpeft does not write, and it holds "
            f"{', '.join(clashes)} of its own; move {'them' if len(clashes) > 1 else 'it'} or choose another "
            "directory."
        )


def make_output_dir(path: Path, marker: str, kind: str, **fields: JSONValue) -> bool:
    """Create ``path`` (and its parents) and write its marker first; returns whether ``path`` was created here.

    A place that cannot be written is a :class:`UserError` naming it.
    """
    path = Path(path)
    check_writable_place(path)
    created = not path.exists()
    try:
        path.mkdir(parents=True, exist_ok=True)
        write_marker(path, marker, kind, **fields)
    except OSError as err:
        raise UserError(
            f"Cannot write to the output directory {path} ({err.strerror or err}); choose another place."
        ) from None
    return created
