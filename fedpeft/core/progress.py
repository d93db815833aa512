"""Progress display over stages, rounds and clients: rich bars on a terminal, one plain line per round when the
output goes to a file (nohup, Slurm), nothing when neither is asked for."""

from __future__ import annotations

import logging
import sys
import threading

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, TaskID, TextColumn, TimeElapsedColumn
from rich.progress import Progress as RichProgress

log = logging.getLogger("fedpeft")


class _Unit(threading.local):
    """What one thread's stage shows: units that run at once (threads) each count their own stage's rounds."""

    def __init__(self) -> None:
        self.stage = ""
        self.round = 0
        self.total = 0
        self.tasks: list[TaskID] = []
        self.round_task: TaskID | None = None
        self.client_task: TaskID | None = None


class Progress:
    """Bars for the current stage: its rounds and its clients (``enabled``); or, with ``plain``, one line per
    finished round on stderr, flushed at once. A no-op when both are False. Units that run at once in threads of
    their own each have their own stage, rounds and bars."""

    def __init__(self, enabled: bool = False, console: Console | None = None, *, plain: bool = False) -> None:
        self.enabled = enabled
        self.plain = plain and not enabled
        self._unit = _Unit()
        self._bars: RichProgress | None = None
        if enabled:
            self._bars = RichProgress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=console or Console(stderr=True),
                transient=True,
            )

    def __enter__(self) -> Progress:
        if self._bars is not None:
            self._bars.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bars is not None:
            self._bars.stop()

    def stage(self, description: str) -> None:
        """Begin a stage: log ``description`` and replace this thread's previous stage's bars by one headed
        ``description``."""
        log.info(description)
        unit = self._unit
        unit.stage = description
        if self._bars is None:
            return
        for task in unit.tasks:
            self._bars.remove_task(task)
        unit.tasks = [self._bars.add_task(f"[bold]{description}", total=None)]
        unit.round_task = None
        unit.client_task = None

    def rounds(self, total: int, done: int = 0) -> None:
        """Count the stage's ``total`` rounds from ``done`` (the rounds a resumed run finished before)."""
        unit = self._unit
        unit.round, unit.total = done, total
        if self._bars is not None:
            unit.round_task = self._bars.add_task("rounds", total=total, completed=done)
            unit.tasks.append(unit.round_task)

    def clients(self, total: int) -> None:
        """Add a bar for the ``total`` clients of the current step (nothing without bars)."""
        if self._bars is not None:
            unit = self._unit
            unit.client_task = self._bars.add_task("clients", total=total)
            unit.tasks.append(unit.client_task)

    def advance_round(self, metrics: dict | None = None) -> None:
        """Count one finished round; with ``plain``, print its line (:func:`round_line` of ``metrics``) to stderr."""
        log.debug("round done: %s", metrics)
        unit = self._unit
        unit.round += 1
        if self.plain:
            print(round_line(unit.stage, unit.round, unit.total, metrics or {}), file=sys.stderr, flush=True)
        if self._bars is not None and unit.round_task is not None:
            self._bars.advance(unit.round_task)

    def advance_client(self) -> None:
        """Count one finished client on the clients bar."""
        if self._bars is not None and self._unit.client_task is not None:
            self._bars.advance(self._unit.client_task)


def round_line(stage: str, round_: int, total: int, metrics: dict) -> str:
    """One plain line for a finished round: the stage, the round, and the round's loss, clients and seconds."""
    parts = [f"{stage}: round {round_}/{total}"]
    if "train_loss" in metrics:
        parts.append(f"train loss {metrics['train_loss']:.4f}")
    if "clients" in metrics:
        parts.append(f"{int(metrics['clients'])} clients")
    if "seconds" in metrics:
        parts.append(f"{metrics['seconds']:.1f} s")
    return ", ".join(parts)
