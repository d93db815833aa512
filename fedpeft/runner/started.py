"""A started run as its stages see it: its config, output directory, worker, engine, metric loggers and progress
display, given once (:class:`StartedRun`), and the one way a stage runs a worker operation for many clients."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedpeft.core.config import ExperimentConfig
from fedpeft.core.costs import CostMeter
from fedpeft.core.errors import AllClientsFailedError
from fedpeft.core.progress import Progress
from fedpeft.data.types import FederatedData
from fedpeft.engine.rounds import Engine
from fedpeft.report.loggers import MetricLog
from fedpeft.rundir import RunDirectory
from fedpeft.worker import Worker


@dataclass(frozen=True)
class StartedRun:
    """Everything the stages of a started run use, given at construction.

    Attributes:
        cfg: the experiment's config.
        directory: the run's output directory (its ``parts/``, checkpoints and outputs).
        worker: this process's worker: the data, the methods and, where it runs here, the model.
        engine: what runs the clients' work.
        metric_log: the metric loggers (TensorBoard, W&B) of the run.
        progress: the progress display.
    """

    cfg: ExperimentConfig
    directory: RunDirectory
    worker: Worker
    engine: Engine
    metric_log: MetricLog
    progress: Progress

    @property
    def out(self) -> Path:
        """The output directory."""
        return self.directory.path

    @property
    def data(self) -> FederatedData:
        """The federation as this process sees it."""
        return self.worker.data

    def client_ids(self) -> list[str]:
        """Every client of every pool, in the data's order."""
        return [c.client_id for c in self.data.clients]

    def cost_rows(self, meter: CostMeter, label: str, seed: int, phase: str) -> list[dict]:
        """``meter``'s rows of ``phase`` for ``costs.jsonl``, with the peak memory so far of the engine's worker
        processes (``workers_peak_rss_mb``, where the clients run in worker processes of this machine)."""
        return meter.rows(label, seed, phase, workers_peak_mb=self.engine.workers_peak_rss_mb())

    def each_client_kept(
        self, unit: str | None, op: str, ids: list[str], record: Callable[[str, BaseException], None], **kwargs: Any
    ) -> KeptResults:
        """The results of :meth:`each_client` for clients ``ids``, with ``unit`` (its name in ``parts/``) each kept
        in the unit's clients part as it ends (:meth:`~fedpeft.rundir.RunDirectory.append_client`): a resumed unit
        reads those back and runs only the other clients; counts the clients to run on the progress display."""
        return _each_client_kept(self, unit, op, ids, record, **kwargs)

    def each_client(
        self,
        op: str,
        ids: list[str],
        record: Callable[[str, BaseException], None],
        **kwargs: Any,
    ) -> Iterator[tuple[str, Any]]:
        """The results of the worker operation ``op`` for clients ``ids``, in client-id order; a client whose
        work failed is passed to ``record`` (e.g. :meth:`CostMeter.record_failure`) and left out."""
        for client_id, result in self.engine.map_clients(op, ids, **kwargs):
            if isinstance(result, BaseException):
                record(client_id, result)
            else:
                yield client_id, result


@dataclass
class KeptResults:
    """What :meth:`StartedRun.each_client_kept` gives: every client's result that did not fail (a kept one read
    back as JSON gives lists for tuples), keyed by client in the order asked, and the seconds its unit ran, this
    sitting's and the earlier sittings' of a resumed unit."""

    results: dict[str, Any]
    wall_seconds: float


def _each_client_kept(
    run: StartedRun, unit: str | None, op: str, ids: list[str], record: Callable[[str, BaseException], None],
    **kwargs: Any,
) -> KeptResults:  # fmt: skip
    kept = {row["client"]: row for row in run.directory.read_clients(unit)} if unit else {}
    todo = [client_id for client_id in ids if client_id not in kept]
    if kept:
        run.progress.note(f"{len(ids) - len(todo)} of {len(ids)} clients done in an earlier sitting")
    run.progress.clients(len(todo))
    earlier = max((float(row["elapsed"]) for row in kept.values()), default=0.0)
    found = {client_id: row["result"] for client_id, row in kept.items()}
    started = time.perf_counter()
    for client_id, result in run.each_client(op, todo, record, **kwargs):
        found[client_id] = result
        if unit:
            row = {"client": client_id, "elapsed": earlier + time.perf_counter() - started, "result": result}
            run.directory.append_client(unit, row)
    ordered = {client_id: found[client_id] for client_id in ids if client_id in found}
    return KeptResults(ordered, earlier + time.perf_counter() - started)


def check_clients(step: str, clients: int, failures: list[str]) -> None:
    """Stop the run when every one of ``clients`` failed ``step`` (``failures``: one message each): results from
    nobody would read as a method's result."""
    if clients and len(failures) >= clients:
        raise AllClientsFailedError(f"every one of the {clients} clients failed {step}; the first: {failures[0]}")
