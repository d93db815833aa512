"""Progress display over stages, rounds and clients: rich bars on a terminal, one plain line per round when the
output goes to a file (nohup, Slurm), nothing when neither is asked for."""

from __future__ import annotations

import logging
import sys

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, TaskID, TextColumn, TimeElapsedColumn
from rich.progress import Progress as RichProgress

log = logging.getLogger("fedpeft")


class Progress:
    """Bars for the current stage: its rounds and its clients (``enabled``); or, with ``plain``, one line per
    finished round on stderr, flushed at once. A no-op when both are False."""

    def __init__(self, enabled: bool = False, console: Console | None = None, *, plain: bool = False) -> None:
        self.enabled = enabled
        self.plain = plain and not enabled
        self._stage = ""
        self._round = 0
        self._total = 0
        self._bars: RichProgress | None = None
        self._round_task: TaskID | None = None
        self._client_task: TaskID | None = None
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
        """Begin a stage: log ``description`` and replace the previous stage's bars by one headed ``description``."""
        log.info(description)
        self._stage = description
        if self._bars is None:
            return
        for task in list(self._bars.task_ids):
            self._bars.remove_task(task)
        self._bars.add_task(f"[bold]{description}", total=None)
        self._round_task = None
        self._client_task = None

    def rounds(self, total: int, done: int = 0) -> None:
        """Count the stage's ``total`` rounds from ``done`` (the rounds a resumed run finished before)."""
        self._round, self._total = done, total
        if self._bars is not None:
            self._round_task = self._bars.add_task("rounds", total=total, completed=done)

    def clients(self, total: int) -> None:
        """Add a bar for the ``total`` clients of the current step (nothing without bars)."""
        if self._bars is not None:
            self._client_task = self._bars.add_task("clients", total=total)

    def advance_round(self, metrics: dict | None = None) -> None:
        """Count one finished round; with ``plain``, print its line (:func:`round_line` of ``metrics``) to stderr."""
        log.debug("round done: %s", metrics)
        self._round += 1
        if self.plain:
            print(round_line(self._stage, self._round, self._total, metrics or {}), file=sys.stderr, flush=True)
        if self._bars is not None and self._round_task is not None:
            self._bars.advance(self._round_task)

    def advance_client(self) -> None:
        """Count one finished client on the clients bar."""
        if self._bars is not None and self._client_task is not None:
            self._bars.advance(self._client_task)


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
