"""Progress display over stages, epochs, rounds and clients: rich bars with totals and time left on a terminal,
where a finished stage's bars give way to one line that stays (what it counted and its time); plain lines on stderr
when the output goes to a file (nohup, Slurm): one when a stage starts, one per base-stage epoch and per federated
round, and the clients done, every tenth of them or every half minute, each with the time left; nothing when
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
from rich.text import Text

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
        self.started = 0.0  # when the stage began
        self.count = ""  # what the stage counts to its end: "epochs", "rounds" or "clients" (not a step's)
        self.epochs_started = 0.0
        self.rounds_started = 0.0
        self.rounds_from = 0  # the rounds a resumed run had finished before this sitting
        self.train_loss: float | None = None  # the last finished round's or epoch's loss, for the stage's line


class Progress:
    """Bars for the current stage: its epochs, rounds or clients, each with its total and time left (``enabled``),
    and once the stage's count reaches its total, one line above the bars that stays (:func:`stage_line`) in place
    of its bars; or, with ``plain``, lines on stderr flushed at once: the stage's name when it starts, each
    base-stage epoch and federated round, and the clients done (at most every tenth of them or half minute, and when
    the last is done: :data:`CLIENT_LINE_FRACTION`), each but a count's last with the time its count has left. A
    no-op when both are False. Units that run at once in threads of their own each have their own stage, counts and
    bars. ``clock`` gives the seconds the lines report (a test's own)."""

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
        unit.started = self.clock()
        unit.count = ""
        unit.train_loss = None
        if self._bars is None:
            return
        for task in unit.tasks:
            self._bars.remove_task(task)
        unit.tasks = []

    def note(self, line: str) -> None:
        """Say ``line`` once, outside any stage (what the run runs on): a plain line on stderr, a line above the
        bars on a terminal, else a log record."""
        if self.plain:
            self._say(line)
        elif self._bars is not None:
            self._bars.console.print(Text(line), soft_wrap=True)
        else:
            log.info(line)

    def epochs(self, total: int) -> None:
        """Count the stage's ``total`` training epochs (a centralized base stage)."""
        unit = self._unit
        unit.epoch_started = unit.epochs_started = self.clock()
        unit.count = unit.count or "epochs"
        if self._bars is not None:
            unit.epoch_task = self._add_bar("epochs", total)

    def advance_epoch(self, epoch: int, epochs: int, loss: float) -> None:
        """Count finished epoch ``epoch`` of ``epochs`` with mean loss ``loss`` (a
        :data:`~fedpeft.training.EpochHook`); with ``plain``, print its line: the epoch, the loss, its seconds and
        the time the epochs left will take at the pace so far."""
        unit = self._unit
        now = self.clock()
        if self.plain:
            line = f"{unit.stage}: epoch {epoch}/{epochs}, loss {loss:.4f}, {now - unit.epoch_started:.1f} s"
            self._say(line + time_left(now - unit.epochs_started, epoch, epochs))
        unit.epoch_started = now
        unit.train_loss = loss
        if self._bars is not None and unit.epoch_task is not None:
            self._bars.update(unit.epoch_task, completed=epoch, total=epochs)
        if unit.count == "epochs" and epoch >= epochs:
            self._finished(f"{plural(epochs, 'epoch')}, loss {loss:.4f}")

    def rounds(self, total: int, done: int = 0) -> None:
        """Count the stage's ``total`` rounds from ``done`` (the rounds a resumed run finished before)."""
        unit = self._unit
        unit.round, unit.total = done, total
        unit.rounds_from, unit.rounds_started = done, self.clock()
        unit.count = unit.count or "rounds"
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
        if not step:
            unit.count = unit.count or "clients"
        if self._bars is not None:
            if unit.client_task is not None:
                self._bars.remove_task(unit.client_task)
                unit.tasks.remove(unit.client_task)
            unit.client_task = self._add_bar(f"{step}: clients" if step else "clients", total)

    def advance_round(self, metrics: dict | None = None, evaluation_seconds: float | None = None) -> None:
        """Count one finished round; with ``plain``, print its line (:func:`round_line` of ``metrics`` and the
        seconds of the evaluation after it, if there was one, then the time the rounds left will take at this
        sitting's pace so far) to stderr."""
        log.debug("round done: %s", metrics)
        unit = self._unit
        unit.round += 1
        metrics = metrics or {}
        if "train_loss" in metrics:
            unit.train_loss = float(metrics["train_loss"])
        if self.plain:
            line = round_line(unit.stage, unit.round, unit.total, metrics, evaluation_seconds)
            done = unit.round - unit.rounds_from
            self._say(line + time_left(self.clock() - unit.rounds_started, done, unit.total - unit.rounds_from))
        if self._bars is not None and unit.round_task is not None:
            self._bars.advance(unit.round_task)
        if unit.count == "rounds" and unit.round == unit.total:
            counted = unit.total - unit.rounds_from
            rounds = plural(counted, "round") if not unit.rounds_from else f"rounds {unit.rounds_from + 1}-{unit.total}"
            loss = "" if unit.train_loss is None else f", train loss {unit.train_loss:.4f}"
            self._finished(rounds + loss)

    def advance_client(self) -> None:
        """Count one finished client of :meth:`clients` (a client of a federated round, which has no count of its
        own, is not counted); with ``plain``, print a :func:`clients_line` when a tenth of the clients or
        :data:`CLIENT_LINE_SECONDS` have passed since the last one, and when the last client is done
        (:data:`CLIENT_LINE_FRACTION`)."""
        unit = self._unit
        if unit.clients_done >= unit.clients_total:
            return
        unit.clients_done += 1
        now = self.clock()
        done, total = unit.clients_done, unit.clients_total
        if self._bars is not None and unit.client_task is not None:
            self._bars.advance(unit.client_task)
            if unit.count == "clients" and not unit.step and done == total:
                self._finished(f"{plural(total, 'client')}, {(now - unit.clients_started) / total:.2f} s per client")
        if not self.plain:
            return
        since = now - unit.clients_shown_at
        tenth = done - unit.clients_shown >= max(1, math.ceil(total * CLIENT_LINE_FRACTION))
        if done == total or (tenth and since >= CLIENT_LINE_MIN_SECONDS) or since >= CLIENT_LINE_SECONDS:
            stage = f"{unit.stage}: {unit.step}" if unit.step else unit.stage
            self._say(clients_line(stage, done, total, now - unit.clients_started))
            unit.clients_shown, unit.clients_shown_at = done, now

    def _finished(self, counted: str) -> None:
        """On a terminal, end this thread's stage: remove its bars and print, above the others, the line that stays
        (:func:`stage_line` of ``counted``, what it counted)."""
        if self._bars is None:
            return
        unit = self._unit
        for task in unit.tasks:
            self._bars.remove_task(task)
        unit.tasks = []
        unit.round_task = unit.client_task = unit.epoch_task = None
        # soft_wrap: a line wider than the terminal is wrapped by it, not broken by rich inside "2.8 s"
        self._bars.console.print(Text(stage_line(unit.stage, counted, self.clock() - unit.started)), soft_wrap=True)

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
    so far and the time the others will take at that pace or, once all are done, the stage's seconds."""
    line = f"{stage}: clients {done}/{total}, {seconds / max(done, 1):.2f} s per client"
    return line + (f", {seconds:.1f} s" if done == total else time_left(seconds, done, total))


def time_left(seconds: float, done: int, total: int) -> str:
    """``, ~3 min 12 s left``: the time the ``total - done`` still to come take at the pace of the ``done`` that
    took ``seconds``; empty once all are done (or none is, which gives no pace)."""
    if done <= 0 or done >= total:
        return ""
    return f", ~{duration(seconds / done * (total - done), whole=True)} left"


def stage_line(stage: str, counted: str, seconds: float) -> str:
    """The line a finished stage leaves on a terminal: ``fedit: federated training, seed 0: 20 rounds, train loss
    0.4123, 3 min 12 s``: the stage, what it counted (``counted``) and its time from its start."""
    return f"{stage}: {counted}, {duration(seconds)}"


def duration(seconds: float, *, whole: bool = False) -> str:
    """``12.3 s`` (``whole``: ``12 s`` from ten seconds), ``3 min 12 s`` (or ``3 min``) from a minute, ``2 h 5 min``
    from an hour."""
    if seconds < 59.5:
        return f"{seconds:.0f} s" if whole and seconds >= 9.95 else f"{seconds:.1f} s"
    if seconds < 3570:
        minutes, rest = divmod(round(seconds), 60)
        return f"{minutes} min" + (f" {rest} s" if rest else "")
    hours, minutes = divmod(round(seconds / 60), 60)
    return f"{hours} h" + (f" {minutes} min" if minutes else "")


def plural(count: int, noun: str) -> str:
    """``1 round``, ``20 rounds``."""
    return f"{count} {noun}" + ("" if count == 1 else "s")
