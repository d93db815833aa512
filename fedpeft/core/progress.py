"""Progress display over stages, rounds and clients (rich), quiet unless asked."""

from __future__ import annotations

import logging

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, TaskID, TextColumn, TimeElapsedColumn
from rich.progress import Progress as RichProgress

log = logging.getLogger("fedpeft")


class Progress:
    """Bars for the current stage: its rounds and its clients. A no-op when ``enabled`` is False."""

    def __init__(self, enabled: bool = False, console: Console | None = None) -> None:
        self.enabled = enabled
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
        log.info(description)
        if self._bars is None:
            return
        for task in list(self._bars.task_ids):
            self._bars.remove_task(task)
        self._bars.add_task(f"[bold]{description}", total=None)
        self._round_task = None
        self._client_task = None

    def rounds(self, total: int, done: int = 0) -> None:
        if self._bars is not None:
            self._round_task = self._bars.add_task("rounds", total=total, completed=done)

    def clients(self, total: int) -> None:
        if self._bars is not None:
            self._client_task = self._bars.add_task("clients", total=total)

    def advance_round(self, metrics: dict | None = None) -> None:
        log.debug("round done: %s", metrics)
        if self._bars is not None and self._round_task is not None:
            self._bars.advance(self._round_task)

    def advance_client(self) -> None:
        if self._bars is not None and self._client_task is not None:
            self._bars.advance(self._client_task)
