"""``python -m fedpeft.apps.superlink [flower-superlink options]``: Flower's SuperLink, waiting longer for a busy
SQLite database.

With ``--database``, Flower 1.42's SuperLink keeps its state in SQLite and gives each connection a busy timeout of
5 s (``SQLITE_PRAGMAS`` in ``flwr.supercore.constant``, no option changes it). A write that waits longer for
another of its own connections (a loaded machine, a large message being stored) fails with "database is locked",
which the SuperLink answers with HTTP 500; its SuperExec, its SuperNodes and the ServerApp treat a 500 as final
and exit, so one such wait ends the run and every later launch waits for a SuperExec that is gone (measured on
loopback: a write lock held 8 s ended the SuperExec, both SuperNodes and the run). This module runs the same
``flower-superlink`` command in this process with a busy timeout of :data:`BUSY_TIMEOUT_SECONDS` (environment
variable ``FEDPEFT_SQLITE_BUSY_TIMEOUT``, in seconds), so that such a wait delays the request instead of failing
it. Everything else (options, APIs, the SuperExec it starts) is Flower's.
"""

from __future__ import annotations

import os
import sys

BUSY_TIMEOUT_SECONDS = 60.0
"""Seconds a SuperLink connection waits for SQLite's write lock before failing (Flower's own: 5)."""


def busy_timeout_seconds() -> float:
    """The busy timeout to set: ``FEDPEFT_SQLITE_BUSY_TIMEOUT`` seconds, else :data:`BUSY_TIMEOUT_SECONDS`."""
    text = os.environ.get("FEDPEFT_SQLITE_BUSY_TIMEOUT", "").strip()
    if not text:
        return BUSY_TIMEOUT_SECONDS
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not seconds > 0:
        raise SystemExit(f"error: FEDPEFT_SQLITE_BUSY_TIMEOUT={text!r} is not a number of seconds above 0.")
    return seconds


def set_busy_timeout(seconds: float) -> bool:
    """Make every SQLite connection Flower's state opens from now on wait ``seconds`` for a lock; whether this
    Flower version has the setting fedpeft changes (``flwr.supercore.sql_mixin.SQLITE_PRAGMAS``)."""
    from flwr.supercore import sql_mixin

    pragmas = getattr(sql_mixin, "SQLITE_PRAGMAS", None)
    if not isinstance(pragmas, tuple) or "busy_timeout" not in dict(pragmas):
        return False
    milliseconds = str(round(seconds * 1000))
    sql_mixin.SQLITE_PRAGMAS = tuple(  # type: ignore[assignment]
        (name, milliseconds if name == "busy_timeout" else value) for name, value in pragmas
    )
    return True


def main() -> None:
    """Run ``flower-superlink`` with the arguments of this command and the longer busy timeout."""
    seconds = busy_timeout_seconds()
    if not set_busy_timeout(seconds):
        print(
            "warning: this Flower version sets no SQLite busy timeout where fedpeft looks for it; the SuperLink runs "
            "with Flower's own.",
            file=sys.stderr,
        )
    from flwr.superlink.cli import flower_superlink

    sys.argv[0] = "flower-superlink"  # its usage lines and its own checks of the command's name
    flower_superlink()


if __name__ == "__main__":
    main()
