"""The local engine's settings resolved once, at a run's start, against this machine and this run: how many worker
processes run the clients, the torch threads of each, the GPUs they are pinned to, where client states live
between rounds and how many units run at once (:class:`EngineSettings`). Every part of the run reads them from
here; the config keeps what was asked (``engine.workers: auto``, a number), the run says on one line what it got
(:meth:`EngineSettings.line`)."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from fedpeft.core.config import EngineConfig
from fedpeft.core.errors import UserError
from fedpeft.engine.pool import gpu_shares, memory_shortfall

log = logging.getLogger("fedpeft")

WORKERS_VARIABLE = "FEDPEFT_WORKERS"
"""An environment variable that sets what ``engine.workers: auto`` resolves to (a number of worker processes, still
capped by the clients), e.g. ``FEDPEFT_WORKERS=1`` on a machine shared with others; the test suite sets it."""


METHODS_AT_ONCE = 2
"""How many methods run at once on worker processes where ``engine.concurrent_methods`` is not set: one more fills
the processes that a method's rounds leave idle (a round of fewer clients than processes, its server step); each
method at once keeps its server state in the run's process."""


def cpu_cores() -> int:
    """The CPU cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


@dataclass(frozen=True)
class EngineSettings:
    """What the local engine runs on.

    Attributes:
        processes: worker processes that run the clients (0: every client runs in this process).
        threads: torch threads of each worker process (the config's ``threads``, else this machine's cores shared
            out among the processes); in this process, the config's ``threads`` (None: torch's default).
        state: where per-client state lives between rounds: ``disk`` with worker processes (each serves any client),
            else the config's ``engine.state``; :meth:`line` says so where the config asked ``memory``.
        gpus: the GPUs the worker processes are pinned to, round-robin (empty: those this process sees).
        concurrent_units: how many units run at once, each in a thread of its own: the base model's evaluations
            beside ``engine.concurrent_methods`` methods (else :data:`METHODS_AT_ONCE`), of every seed that shares
            one base model; 1 without worker processes (one unit after the other).
        asked: the config's ``engine.workers``.
        asked_state: the config's ``engine.state``.
        cores: the CPU cores this process may use.
        limit: what capped an ``auto`` count below the cores or GPUs (the clients, the memory), if anything.
    """

    processes: int = 0
    threads: int | None = None
    state: Literal["memory", "disk"] = "memory"
    gpus: tuple[str, ...] = ()
    concurrent_units: int = 1
    asked: int | Literal["auto"] = 1
    asked_state: Literal["memory", "disk"] = "memory"
    cores: int = 1
    limit: str = ""

    @property
    def workers(self) -> int:
        """The processes that run clients, this one counted when there are no worker processes."""
        return self.processes or 1

    @classmethod
    def as_asked(cls, engine: EngineConfig) -> EngineSettings:
        """The settings ``engine`` asks for, resolved against nothing: no worker process here, the config's store
        of client states (an engine whose clients run elsewhere, the Flower engine's nodes)."""
        return cls(state=engine.state, asked=engine.workers, asked_state=engine.state)

    def line(self) -> str:
        """The line a run starts with: what it runs on, where client states live when that is not what
        ``engine.state`` says, what capped it, and the setting that changes it."""
        limit = f", {self.limit}" if self.limit else ""
        if self.processes:
            each = f"{self.threads} torch thread{'' if self.threads == 1 else 's'} each"
            store = f", client states on {self.state}" if self.state != self.asked_state else ""
            change = "--set engine.workers=1 for one process"
            return f"Running on {self.processes} worker processes ({each}{store}{limit}; {change})"
        threads = "torch's default threads" if self.threads is None else f"{self.threads} torch thread"
        threads += "" if self.threads in (None, 1) else "s"
        return f"Running in one process ({threads}{limit}; --set engine.workers=N for N worker processes)"


def asked_processes(engine: EngineConfig) -> int:
    """The worker processes a number in ``engine.workers`` asks for on the local engine (0: one process, or
    ``auto``, which fits itself to the machine and the run: :func:`resolve_engine`)."""
    workers = engine.workers
    return workers if engine.name == "local" and workers != "auto" and workers >= 2 else 0


def check_gpu_workers(engine: EngineConfig, gpus: Sequence[str]) -> None:
    """Refuse, from the config alone, more worker processes than ``gpus`` take at ``engine.workers_per_gpu``."""
    if gpus and asked_processes(engine) > len(gpus) * engine.workers_per_gpu:
        raise UserError(
            f"engine.workers {engine.workers} is more worker processes than the {len(gpus)} visible GPU(s) take at "
            f"engine.workers_per_gpu {engine.workers_per_gpu}; lower engine.workers or raise engine.workers_per_gpu."
        )


def requested_processes(engine: EngineConfig, threads: int | None, gpus: int) -> int:
    """What ``engine.workers`` asks for before the run's clients and memory are known: a number as given; ``auto``:
    ``workers_per_gpu`` per GPU where the run has ``gpus`` GPUs to pin them to, else one process per ``threads``
    cores (the config's ``threads``, else one), or what :data:`WORKERS_VARIABLE` says; one where clients train
    in batches (``engine.batch_clients``, which runs in this process)."""
    if engine.workers != "auto":
        return engine.workers
    if engine.batch_clients >= 2:
        return 1
    given = os.environ.get(WORKERS_VARIABLE, "").strip()
    if given:
        if not given.isdigit() or int(given) < 1:
            raise UserError(f"{WORKERS_VARIABLE}={given!r} is not a number of worker processes, 1 or more.")
        return int(given)
    if gpus:
        return gpus * engine.workers_per_gpu
    return max(1, cpu_cores() // (threads or 1))


def resolve_engine(
    engine: EngineConfig,
    *,
    threads: int | None,
    clients: int,
    gpus: Sequence[str] = (),
    per_process: int = 0,
    available: int | None = None,
    gpu_bytes: int = 0,
    gpu_free: Callable[[int], int] | None = None,
) -> EngineSettings:
    """The settings of a local-engine run of ``clients`` clients (every client runs at once in an evaluation, so
    no more processes than that), with the config's ``threads``, on ``gpus``.

    ``per_process``: the bytes of memory each worker process is estimated to hold, of ``available`` free (None:
    not checked); ``gpu_bytes`` per process of GPU ``i``'s ``gpu_free(i)`` free bytes. An ``auto`` count is lowered
    to what fits; a number that does not fit is refused (:class:`UserError`, naming the count that fits).
    """
    asked = engine.workers
    cores = cpu_cores()
    count = requested_processes(engine, threads, len(gpus))
    limit = ""
    if count > clients:
        if asked != "auto":
            message = "engine.workers %d: the federation has %d clients, so %d worker processes run"
            log.warning(message, count, clients, clients)
        else:
            limit = "as many as the run's clients"
        count = clients
    if count >= 2 and per_process and available is not None:
        problem = memory_shortfall(count, per_process, available, where="memory")
        if problem is not None:
            if asked != "auto":
                raise UserError(problem)
            count, limit = max(1, available // per_process), "as many as fit in memory"
    if count >= 2 and gpus and gpu_bytes and gpu_free is not None:
        frees = [gpu_free(index) for index in range(len(gpus))]
        for index, share in enumerate(gpu_shares(count, list(gpus))):
            where = f"memory of GPU {gpus[index]}"
            problem = memory_shortfall(share, gpu_bytes, frees[index], where=where, setting="engine.workers_per_gpu")
            if problem is not None and asked != "auto":
                raise UserError(problem)
            if problem is not None:
                fits = len(gpus) * min(free // gpu_bytes for free in frees)
                count, limit = max(1, min(count, fits)), "as many as fit in GPU memory"
                break
    processes = count if count >= 2 else 0
    return EngineSettings(
        processes=processes,
        threads=(threads or max(1, cores // processes)) if processes else threads,
        state="disk" if processes else engine.state,
        gpus=tuple(gpus),
        concurrent_units=(engine.concurrent_methods or METHODS_AT_ONCE) + 1 if processes else 1,
        asked=asked,
        asked_state=engine.state,
        cores=cores,
        limit=limit,
    )
