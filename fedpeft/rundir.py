"""A run's output directory through its life: may a run write here, its creation, what a failed start removes, the
records of finished units (``parts/``), and marking a run of an earlier version (``fedpeft adopt``).

A directory is a run's when it carries :data:`~fedpeft.core.io.RUN_MARKER`, and only then. ``--force`` writes into
a directory without the marker beside its files, never over them: every name a run writes at its top
(:data:`RUN_WRITES`) must be absent there.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import hashlib
import json
import os
import shlex
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, cast

from fedpeft.core.config import GIVEN_CONFIG_FILE, same_run
from fedpeft.core.errors import UserError
from fedpeft.core.io import (
    RUN_MARKER,
    check_no_clash,
    check_writable_place,
    make_output_dir,
    read_marker,
    write_marker,
    write_text_atomic,
)
from fedpeft.core.records import ResultRecord

CONFIG_FILE = "config.yaml"
ENV_FILE = "env.json"  # what produced the run: versions, commit, device, command line (of its latest start)
DATA_FILE = "data.json"  # the data overview the summary's Data section renders (fedpeft.report.records.DATA_FILE)
PARTS_DIR = "parts"
CLIENTS_SUFFIX = ".clients"  # parts/<unit>.clients.jsonl: a unit's clients done so far
LOCK_FILE = ".fedpeft-lock"  # locked (flock) while a run writes the directory; names its holder
RUN_WRITES = (
    RUN_MARKER,
    LOCK_FILE,
    CONFIG_FILE,
    GIVEN_CONFIG_FILE,
    ENV_FILE,
    PARTS_DIR,
    "checkpoints",
    "base_model",
    "client_state",
    "psg",  # FedP2EFT's generators (fedpeft.methods.fedp2eft.PSG_DIR)
    "lambdas",  # clients' rank scales (fedpeft.analysis.scales.SCALES_DIR)
    "adapters",
    "results.jsonl",
    "costs.jsonl",
    DATA_FILE,
    "summary.md",
    "clients.csv",  # every client's value, beside a summary whose tables have too many groups for a column each
    "plots",
    "rehearsal.json",  # a rehearsal's measurements (fedpeft.rehearsal.driver.REHEARSAL_FILE), summed on --resume
)
"""Every name a run writes at the top of its directory (docs/outputs.md). ``--force`` writes into a directory
without a run's marker only where none of them exists, and a start that fails before its first result removes
those it created."""


class RunLock:
    """The lock a run holds on its directory while it writes there: an exclusive ``flock`` on :data:`LOCK_FILE`,
    which holds the holder's pid and start time. The operating system releases it when the process ends, however
    it ends, so a killed run leaves no stale lock behind."""

    def __init__(self, directory: Path) -> None:
        self.path = Path(directory) / LOCK_FILE
        self._handle: IO[str] | None = None

    def acquire(self) -> None:
        """Take the lock (the directory must exist), or raise :func:`locked_error` naming its holder."""
        if self._handle is not None:
            return
        handle = open(self.path, "a+", encoding="utf-8")  # noqa: SIM115  (held open as long as the lock)
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.close()
            raise locked_error(self.path.parent) from None
        started = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
        handle.seek(0)
        handle.truncate()
        handle.write(json.dumps({"pid": os.getpid(), "started": started}) + "\n")
        handle.flush()
        self._handle = handle

    def release(self) -> None:
        """Give the lock up (the file stays: removing it could let two runs lock two files)."""
        if self._handle is not None:
            self._handle.close()
            self._handle = None


def check_unlocked(directory: Path) -> None:
    """Raise :func:`locked_error` when a running process holds ``directory``'s lock; takes it for no longer than
    the test."""
    path = Path(directory) / LOCK_FILE
    if not path.is_file():
        return
    try:
        handle = open(path, encoding="utf-8")  # noqa: SIM115
    except OSError:
        return
    with handle:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            raise locked_error(Path(directory)) from None


def locked_error(directory: Path) -> UserError:
    """The refusal of a second run into ``directory`` while another process writes it, naming the holder."""
    try:
        holder = json.loads((Path(directory) / LOCK_FILE).read_text(encoding="utf-8"))
        who = f"process {int(holder['pid'])}, started {holder['started']}"
    except (OSError, ValueError, KeyError, TypeError):
        who = "another process"
    return UserError(
        f"{directory} is being written by a run that is still going ({who}); wait for it to end or stop it, or "
        "choose another --out."
    )


class RunDirectory:
    """The output directory of one run of one resolved config (``config_text``, its ``config.yaml``).

    :meth:`check` says whether the run may write there (and writes nothing), :meth:`create` makes it a run's,
    :meth:`discard` removes what this start created when it fails before its first result.
    """

    def __init__(self, path: Path, config_text: str) -> None:
        self.path = Path(path)
        self.config_text = config_text
        # What check() found: the entries there before this start, a run without results (start over).
        self._before: set[str] = set()
        self._restart = False
        self._created = False
        self._lock = RunLock(self.path)

    @property
    def config_digest(self) -> str:
        """SHA-256 of the resolved config's text, kept in the run's marker file."""
        return hashlib.sha256(self.config_text.encode("utf-8")).hexdigest()

    def check(self, *, resume: bool = False, force: bool = False) -> None:
        """Raise a :class:`UserError` unless the run may write into the directory; writes nothing.

        It may write into a new or empty directory; into a fedpeft run (its marker file) of the same config with
        ``resume`` (settings of where the work runs, :data:`~fedpeft.core.config.EXECUTION_KEYS`, may differ); into a
        fedpeft run that never wrote a result (it starts over); and, with ``force``, into a
        directory without the marker whose files it would not replace (:data:`RUN_WRITES`). A directory without
        the marker is never taken for a run, whatever it holds (one that looks like a run of an earlier version
        is refused with the command that marks it, :func:`adopt_run`).
        """
        out = self.path
        check_writable_place(out)
        self._restart = False
        # A start killed between taking the lock and writing the marker leaves the lock file alone: still empty.
        self._before = {entry.name for entry in out.iterdir()} - {LOCK_FILE} if out.is_dir() else set()
        check_unlocked(out)
        if not self._before:
            return
        marker = read_marker(out, RUN_MARKER)
        if marker is not None:
            config_path = out / CONFIG_FILE
            if os.path.lexists(config_path) and not config_path.is_file():
                raise UserError(
                    f"{config_path} is not a file, so {out} cannot hold a run; move it out of the way (the run's "
                    f"{RUN_MARKER} marker keeps its config's digest) and run again."
                )
            if not has_progress(out):  # a run that failed or was stopped before its first result
                self._restart = True
                return
            if not resume:
                raise existing_run_error(out)
            if config_path.is_file():
                same = same_run(config_path.read_text(encoding="utf-8", errors="replace"), self.config_text)
            else:
                same = marker.get("config_sha256") == self.config_digest
            if not same:
                raise UserError(f"The config differs from the one of the run in {out}; resume with the same one.")
            for part in sorted((out / PARTS_DIR).glob("*.jsonl")):
                self._part_rows(part.stem)  # a broken line before the last one is named now, before anything runs
            return
        if looks_like_unmarked_run(out):
            raise UserError(
                f"{out} has no {RUN_MARKER} marker but holds config.yaml and the outputs of a run (an earlier "
                f"fedpeft version's?); if it is a run, mark it with `fedpeft adopt {shlex.quote(str(out))}` and run "
                "again, else choose another --out."
            )
        if resume:
            raise UserError(f"{out} holds no fedpeft run to resume (no {RUN_MARKER} marker); choose a run's directory.")
        if not force:
            raise UserError(
                f"{out} is not empty and holds no fedpeft run (no {RUN_MARKER} marker); choose a new or empty "
                "directory, or pass --force to write beside its files."
            )
        check_no_clash(out, RUN_WRITES)

    def create(self, given_text: str, environment: dict[str, Any]) -> bool:
        """Make the directory a run's: its marker first, then ``config.yaml``, the config as given and
        ``env.json``. Returns whether the run starts from nothing here (a new or empty directory, or a run without
        results), so that a failure before its first result may :meth:`discard` what it wrote.

        The run's lock (:class:`RunLock`) is taken before anything is written, and kept until :meth:`release`;
        another process's lock is a :class:`UserError` that writes nothing (a directory created for the lock is
        removed)."""
        check_writable_place(self.path)
        created = not self.path.exists()
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise UserError(
                f"Cannot write to the output directory {self.path} ({err.strerror or err}); choose another place."
            ) from None
        try:
            self._lock.acquire()
        except UserError:
            if created:
                shutil.rmtree(self.path, ignore_errors=True)
            raise
        make_output_dir(self.path, RUN_MARKER, "run", config_sha256=self.config_digest)
        self._created = created
        if self._restart:
            # Nothing of the earlier attempt is a result; its base model may be of another config. (The directory
            # carries a run's marker, and --force never writes where a base_model/ was: this one is fedpeft's.)
            shutil.rmtree(self.path / "base_model", ignore_errors=True)
        (self.path / PARTS_DIR).mkdir(exist_ok=True)
        write_text_atomic(self.path / CONFIG_FILE, self.config_text)
        write_text_atomic(self.path / GIVEN_CONFIG_FILE, given_text)
        write_text_atomic(self.path / ENV_FILE, json.dumps(environment, indent=2) + "\n")
        return RUN_MARKER not in self._before or self._restart

    def discard(self) -> None:
        """Remove what this start created, when the run wrote no result, so that nothing blocks the next attempt:
        the run's files and folders that were not there before it started, and the directory itself when this
        start created it and nothing else is left in it. Nothing else is touched."""
        for name in RUN_WRITES:
            if name in self._before:
                continue
            path = self.path / name
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
        if self._created:
            with contextlib.suppress(OSError):  # left in place when it holds anything else
                self.path.rmdir()

    def release(self) -> None:
        """Give up the run's lock, once it has written what it writes (:meth:`create` took it)."""
        self._lock.release()

    def has_progress(self) -> bool:
        """Whether the directory holds anything a run resumes from (:func:`has_progress`)."""
        return has_progress(self.path)

    # ------------------------------------------------------------------ parts: the records of finished units
    def part(self, name: str) -> Path:
        """The file of unit ``name``'s records (``parts/<name>.jsonl``)."""
        return self.path / PARTS_DIR / f"{name}.jsonl"

    def write_part(self, name: str, records: list[ResultRecord], costs: list[dict], *, append: bool = False) -> None:
        """Write unit ``name``'s result records and cost rows, flushed to disk before the rename (with
        ``append``, after the lines already there)."""
        part = self.part(name)
        earlier = part.read_text() if append and part.exists() else ""
        lines = [json.dumps(r) for r in records] + [json.dumps({"_cost": c}) for c in costs]
        write_text_atomic(part, earlier + "".join(line + "\n" for line in lines), fsync=True)

    def clients_part(self, name: str) -> str:
        """The part that holds unit ``name``'s clients done so far (``parts/<name>.clients.jsonl``), one line
        each: what ``--resume`` starts a long personalization from instead of its first client."""
        return f"{name}{CLIENTS_SUFFIX}"

    def read_clients(self, name: str) -> list[dict]:
        """The whole lines of unit ``name``'s clients part (:meth:`clients_part`); a cut last line is left out and
        removed from the file, so that the lines appended next start whole."""
        rows, whole = self._part_rows(self.clients_part(name))
        if not whole:
            text = "".join(json.dumps(row) + "\n" for row in rows)
            write_text_atomic(self.part(self.clients_part(name)), text, fsync=True)
        return rows

    def append_client(self, name: str, row: dict) -> None:
        """Add one done client's line to unit ``name``'s clients part (flushed; a line cut by a crash is read as
        not there, and that client runs again)."""
        part = self.part(self.clients_part(name))
        with part.open("a", encoding="utf-8") as file:
            file.write(json.dumps(row) + "\n")
            file.flush()

    def drop_clients(self, name: str) -> None:
        """Remove unit ``name``'s clients part once the unit's own part holds its records."""
        self.part(self.clients_part(name)).unlink(missing_ok=True)

    def read_part(self, name: str) -> tuple[list[ResultRecord], list[dict]]:
        """Unit ``name``'s result records and cost rows (none when it has not finished; a cut last line, as a copy
        or a full disk may leave one, left out: :meth:`part_done` says the unit runs again)."""
        records: list[ResultRecord] = []
        costs: list[dict] = []
        for row in self._part_rows(name)[0]:
            (costs.append(row["_cost"]) if "_cost" in row else records.append(cast(ResultRecord, row)))
        return records, costs

    def part_done(self, name: str) -> bool:
        """Whether unit ``name`` finished: its part is there and whole. A part whose last line was cut (every part
        ends with a newline) is a unit not done, which ``--resume`` runs again and writes anew."""
        return self.part(name).is_file() and self._part_rows(name)[1]

    def _part_rows(self, name: str) -> tuple[list[dict], bool]:
        """The rows of unit ``name``'s part, and whether it is whole; a line other than the last that does not
        parse is a :class:`UserError` naming the file and the line."""
        part = self.part(name)
        if not part.is_file():
            return [], True
        try:
            text = part.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as err:
            raise UserError(f"Cannot read {part} ({err}); remove it so that --resume runs that unit again.") from None
        lines = text.split("\n")
        whole = text == "" or text.endswith("\n")
        rows = []
        for number, line in enumerate(lines[:-1] if whole else lines, start=1):
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                row = None
            if not isinstance(row, dict):
                if number == len(lines) and not whole:  # the cut last line
                    break
                raise UserError(
                    f"{part} line {number} is not one of the unit's records; remove that file so that --resume runs "
                    "that unit again."
                )
            rows.append(row)
        return rows, whole


def looks_like_unmarked_run(path: Path) -> bool:
    """Whether directory ``path``, without a run's marker, holds what a run of an earlier version (before runs
    carried :data:`RUN_MARKER`) wrote: ``config.yaml`` beside ``parts/``, ``checkpoints/`` or ``results.jsonl``."""
    path = Path(path)
    outputs = (path / PARTS_DIR).is_dir() or (path / "checkpoints").is_dir() or (path / "results.jsonl").is_file()
    return (path / CONFIG_FILE).is_file() and outputs


def adopt_run(path: Path) -> bool:
    """Mark ``path``, a run written before runs carried :data:`RUN_MARKER`, as a fedpeft run (``fedpeft adopt``),
    so that ``run --resume`` and ``report`` take it; returns False when it was marked already. Writes only the
    marker; a directory that does not hold a run's ``config.yaml`` and outputs is a :class:`UserError`."""
    from fedpeft.core.config import load_config

    path = Path(path)
    if not path.is_dir():
        raise UserError(f"{path} is not a directory; pass the directory of a run.")
    if read_marker(path, RUN_MARKER) is not None:
        return False
    if not looks_like_unmarked_run(path):
        raise UserError(
            f"{path} does not hold a run (config.yaml beside parts/, checkpoints/ or results.jsonl); nothing to adopt."
        )
    load_config(str(path / CONFIG_FILE))  # a file that is not a fedpeft config is refused by name
    digest = hashlib.sha256((path / CONFIG_FILE).read_bytes()).hexdigest()
    try:
        write_marker(path, RUN_MARKER, "run", config_sha256=digest, adopted=True)
    except OSError as err:
        raise UserError(
            f"Cannot write the {RUN_MARKER} marker into {path} ({err.strerror or err}); make the directory writable "
            "and adopt it again."
        ) from None
    return True


def run_holding(path: Path) -> Path | None:
    """The run directory that ``path`` is, or whose own files (:data:`RUN_WRITES`, and what lies below them) it is
    one of; ``None`` when it is neither. Symbolic links are followed: a link to a run's file is that file."""
    resolved = Path(path).resolve()
    if read_marker(resolved, RUN_MARKER) is not None:
        return resolved
    for owner in resolved.parents:
        if read_marker(owner, RUN_MARKER) is not None:
            return owner if resolved.relative_to(owner).parts[0] in RUN_WRITES else None
    return None


def refuse_run_files(path: Path, option: str, *, run: Path | None = None) -> None:
    """Raise a :class:`UserError` when ``option``'s ``path`` is a run's directory (other than ``run``, the one run
    whose outputs a command may rebuild there) or one of a run's own files: no command but the run writes them."""
    owner = run_holding(path)
    if owner is None or (run is not None and owner == Path(run).resolve() and owner == Path(path).resolve()):
        return
    what = "the directory of the run" if owner == Path(path).resolve() else "among the files of the run"
    raise UserError(f"{option} {path} is {what} in {owner}, which only that run writes; choose another place.")


def check_output_file(path: Path, option: str, command: str, written_here: Callable[[str], bool]) -> None:
    """Raise a :class:`UserError` unless ``fedpeft <command> <option>`` may write the file ``path``; writes nothing.

    It may write a new file in a place that can be written, or replace a file whose first line ``written_here``
    takes for one it wrote; never a directory, a run's own files (:func:`refuse_run_files`) nor any other file."""
    path = Path(path)
    refuse_run_files(path, option)
    if path.is_dir():
        raise UserError(f"{option} {path} is a directory; name the file to write.")
    probe = path.parent
    while not probe.exists() and probe.parent != probe:
        probe = probe.parent
    if not probe.is_dir():
        raise UserError(f"{option} {path} lies below {probe}, which is a file; choose a file in a directory.")
    check_writable_place(path.parent)
    if os.path.lexists(path) and not (path.is_file() and written_here(first_line(path))):
        raise UserError(
            f"{option} {path} exists and was not written by `fedpeft {command}`; choose a new file (nothing was "
            "overwritten)."
        )


def first_line(path: Path) -> str:
    """The first line of file ``path`` (at most 4 KiB of it, decoded leniently; empty when it cannot be read)."""
    try:
        with open(path, "rb") as handle:
            return handle.readline(4096).decode("utf-8", errors="replace").rstrip("\r\n")
    except OSError:
        return ""


def existing_run_error(out: Path) -> UserError:
    """The refusal of a start without ``--resume`` in ``out``, a run with results: a finished one names its summary."""
    summary = out / "summary.md"
    if (out / "results.jsonl").is_file() and summary.is_file():
        return UserError(
            f"{out} holds a finished run (its summary: {summary}); pass --resume to write its outputs again, or "
            "choose another --out."
        )
    return UserError(f"{out} already holds a run; pass --resume to continue it or choose another --out.")


def refuse_existing_run(out: Path) -> None:
    """Raise :func:`existing_run_error` if ``out`` holds a run with results; reads only the directory, so a start
    without ``--resume`` is told at once, before its config is validated (and torch imported); so is a start into
    a directory another run is writing (:func:`check_unlocked`)."""
    if Path(out).is_dir():
        check_unlocked(out)
    if read_marker(out, RUN_MARKER) is not None and has_progress(out):
        raise existing_run_error(out)


def has_progress(run_dir: Path) -> bool:
    """Whether ``run_dir`` holds anything a run resumes from: a finished unit, a checkpoint or results."""
    run_dir = Path(run_dir)
    if (run_dir / "results.jsonl").is_file() or any((run_dir / PARTS_DIR).glob("*.jsonl")):
        return True
    checkpoints = run_dir / "checkpoints"
    return checkpoints.is_dir() and any(p.is_file() and p.suffix != ".tmp" for p in checkpoints.rglob("*"))
