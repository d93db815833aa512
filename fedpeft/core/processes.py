"""The processes a process started, directly or not, and how to end them (Linux ``/proc``; elsewhere none)."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path


def _stat(pid: int | str) -> list[str]:
    """The fields of ``/proc/<pid>/stat`` after the command name (state first); raises OSError, IndexError."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    if not fields:
        raise IndexError(pid)
    return fields


def process_age() -> float | None:
    """Seconds since this process started, or None where that cannot be read."""
    try:
        started = int(_stat("self")[19]) / os.sysconf("SC_CLK_TCK")
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, IndexError, ValueError):
        return None
    return uptime - started


def descendants(pid: int | None = None) -> list[int]:
    """Process ids of every process below ``pid`` (default: this process), children first."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            parents[int(entry.name)] = int(_stat(entry.name)[1])
    found: list[int] = []
    frontier = [os.getpid() if pid is None else pid]
    while frontier:
        children = [child for child, parent in parents.items() if parent in frontier and child not in found]
        found += children
        frontier = children
    return found


def end_descendants(grace: float = 3.0) -> list[int]:
    """SIGTERM every process below this one, then SIGKILL those still there after ``grace`` seconds; returns
    their ids."""
    pids = descendants()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(process_alive(pid) for pid in pids):
        time.sleep(0.1)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    return pids


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie, ended but not yet reaped, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie (ended, not yet reaped by its parent) counts as gone.
    with contextlib.suppress(OSError, IndexError):
        return _stat(pid)[0] != "Z"
    return False
