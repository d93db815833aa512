"""Progress display over stages, epochs, rounds and clients: rich bars with totals and time left on a terminal;
plain lines on stderr when the output goes to a file (nohup, Slurm): one when a stage starts, one per base-stage
epoch and per federated round, and the clients done, every tenth of them or every half minute; nothing when
neither is asked for."""

from __future__ import annotations

import logging
import math
import sys
import threading
import time
from collections.abc import Callable

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.progress import Progress as RichProgress

log = logging.getLogger("fedpeft")

CLIENT_LINE_FRACTION = 0.1
CLIENT_LINE_MIN_SECONDS = 5.0
CLIENT_LINE_SECONDS = 30.0
"""A plain clients line once a tenth of a stage's clients are done since the last one (if at least
``CLIENT_LINE_MIN_SECONDS`` have passed: a stage of a few seconds prints only its last line), or once
``CLIENT_LINE_SECONDS`` have passed (slow clients), and when the last client is done."""


class _Unit(threading.local):
    """What one thread's stage shows: units that run at once (threads) each count their own stage's rounds."""

    def __init__(self) -> None:
        self.stage = ""
        self.round = 0
        self.total = 0
        self.tasks: list[TaskID] = []
        self.round_task: TaskID | None = None
        self.client_task: TaskID | None = None
        self.epoch_task: TaskID | None = None
        self.epoch_started = 0.0
        self.clients_total = 0
        self.clients_done = 0
        self.step = ""  # what the counted clients do, where it is a step inside the stage (an evaluation)
        self.clients_started = 0.0
        self.clients_shown = 0  # clients done at the last plain line
        self.clients_shown_at = 0.0


class Progress:
    """Bars for the current stage: its epochs, rounds or clients, each with its total and time left (``enabled``);
    or, with ``plain``, lines on stderr flushed at once: the stage's name when it starts, each base-stage epoch and
    federated round, and the clients done (at most every tenth of them or half minute, and when the last is done:
    :data:`CLIENT_LINE_FRACTION`). A no-op when both are False. Units that run at once in threads of their own
    each have their own stage, counts and bars. ``clock`` gives the seconds the lines report (a test's own)."""

    def __init__(
        self,
        enabled: bool = False,
        console: Console | None = None,
        *,
        plain: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.enabled = enabled
        self.plain = plain and not enabled
        self.clock = clock
        self._unit = _Unit()
        self._bars: RichProgress | None = None
        if enabled:
            self._bars = RichProgress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TextColumn("left"),
                TimeRemainingColumn(),
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
        """Begin a stage: say ``description`` (a plain line, else a log record) and remove this thread's previous
        stage's bars; the stage's bars (:meth:`epochs`, :meth:`rounds`, :meth:`clients`) are headed by it."""
        if self.plain:
            self._say(description)
        else:
            log.info(description)
        unit = self._unit
        unit.stage = description
        unit.round_task = unit.client_task = unit.epoch_task = None
        unit.clients_total = unit.clients_done = 0
        unit.step = ""
        if self._bars is None:
            return
        for task in unit.tasks:
            self._bars.remove_task(task)
        unit.tasks = []

    def epochs(self, total: int) -> None:
        """Count the stage's ``total`` training epochs (a centralized base stage)."""
        unit = self._unit
        unit.epoch_started = self.clock()
        if self._bars is not None:
            unit.epoch_task = self._add_bar("epochs", total)

    def advance_epoch(self, epoch: int, epochs: int, loss: float) -> None:
        """Count finished epoch ``epoch`` of ``epochs`` with mean loss ``loss`` (a
        :data:`~fedpeft.training.EpochHook`); with ``plain``, print its line: the epoch, the loss and its seconds."""
        unit = self._unit
        now = self.clock()
        if self.plain:
            self._say(f"{unit.stage}: epoch {epoch}/{epochs}, loss {loss:.4f}, {now - unit.epoch_started:.1f} s")
        unit.epoch_started = now
        if self._bars is not None and unit.epoch_task is not None:
            self._bars.update(unit.epoch_task, completed=epoch, total=epochs)

    def rounds(self, total: int, done: int = 0) -> None:
        """Count the stage's ``total`` rounds from ``done`` (the rounds a resumed run finished before)."""
        unit = self._unit
        unit.round, unit.total = done, total
        if self._bars is not None:
            unit.round_task = self._add_bar("rounds", total, done)

    def clients(self, total: int, step: str = "") -> None:
        """Count the ``total`` clients of the current step (personalization, evaluation, clients' bases);
        ``step`` names a step inside the stage whose clients these are (the evaluation after a federated round),
        in their lines and bar, which replaces the stage's previous clients bar."""
        unit = self._unit
        unit.clients_total, unit.clients_done, unit.clients_shown = total, 0, 0
        unit.clients_started = unit.clients_shown_at = self.clock()
        unit.step = step
        if self._bars is not None:
            if unit.client_task is not None:
                self._bars.remove_task(unit.client_task)
                unit.tasks.remove(unit.client_task)
            unit.client_task = self._add_bar(f"{step}: clients" if step else "clients", total)

    def advance_round(self, metrics: dict | None = None, evaluation_seconds: float | None = None) -> None:
        """Count one finished round; with ``plain``, print its line (:func:`round_line` of ``metrics`` and the
        seconds of the evaluation after it, if there was one) to stderr."""
        log.debug("round done: %s", metrics)
        unit = self._unit
        unit.round += 1
        if self.plain:
            self._say(round_line(unit.stage, unit.round, unit.total, metrics or {}, evaluation_seconds))
        if self._bars is not None and unit.round_task is not None:
            self._bars.advance(unit.round_task)

    def advance_client(self) -> None:
        """Count one finished client of :meth:`clients` (a client of a federated round, which has no count of its
        own, is not counted); with ``plain``, print a :func:`clients_line` when a tenth of the clients or
        :data:`CLIENT_LINE_SECONDS` have passed since the last one, and when the last client is done
        (:data:`CLIENT_LINE_FRACTION`)."""
        unit = self._unit
        if unit.clients_done >= unit.clients_total:
            return
        unit.clients_done += 1
        if self._bars is not None and unit.client_task is not None:
            self._bars.advance(unit.client_task)
        if not self.plain:
            return
        now = self.clock()
        done, total = unit.clients_done, unit.clients_total
        since = now - unit.clients_shown_at
        tenth = done - unit.clients_shown >= max(1, math.ceil(total * CLIENT_LINE_FRACTION))
        if done == total or (tenth and since >= CLIENT_LINE_MIN_SECONDS) or since >= CLIENT_LINE_SECONDS:
            stage = f"{unit.stage}: {unit.step}" if unit.step else unit.stage
            self._say(clients_line(stage, done, total, now - unit.clients_started))
            unit.clients_shown, unit.clients_shown_at = done, now

    def _add_bar(self, what: str, total: int, done: int = 0) -> TaskID:
        assert self._bars is not None
        unit = self._unit
        task = self._bars.add_task(f"[bold]{unit.stage}[/bold] {what}", total=total, completed=done)
        unit.tasks.append(task)
        return task

    @staticmethod
    def _say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)


def round_line(stage: str, round_: int, total: int, metrics: dict, evaluation_seconds: float | None = None) -> str:
    """One plain line for a finished round: the stage, the round, and the round's loss, clients and seconds (its
    clients' work and the server step), then the seconds of the evaluation after it (``eval.every``), if any."""
    parts = [f"{stage}: round {round_}/{total}"]
    if "train_loss" in metrics:
        parts.append(f"train loss {metrics['train_loss']:.4f}")
    if "clients" in metrics:
        parts.append(f"{int(metrics['clients'])} clients")
    if "seconds" in metrics:
        parts.append(f"{metrics['seconds']:.1f} s")
    if evaluation_seconds is not None:
        parts.append(f"evaluation {evaluation_seconds:.1f} s")
    return ", ".join(parts)


def clients_line(stage: str, done: int, total: int, seconds: float) -> str:
    """One plain line for the clients of a stage: how many are done of how many, the mean wall seconds per client
    so far and, once all are done, the stage's seconds."""
    line = f"{stage}: clients {done}/{total}, {seconds / max(done, 1):.2f} s per client"
    return line + (f", {seconds:.1f} s" if done == total else "")
