"""Worker processes of the local engine: each builds its :class:`~fedpeft.worker.Worker` once per run and runs one
client's operation at a time, so the clients of a round run side by side.

A process is a fresh interpreter (``python -m fedpeft.engine.pool FD``: no copy of the parent's model or threads,
and nothing of the script that started the run is imported again) reached over one end of a Unix socket pair,
whose first message says what to build. A task is ``(tag, operation, client, keyword arguments)``, a reply ``(tag, ok,
value or error, seconds)``, both pickled by value (tensors included), so a result is the same object the
operation returned in the process. :meth:`WorkerPool.run` hands out one client's task to each idle process and
gives the results back in the order of the clients, whichever order they finish in: the round loop consumes them
exactly as it does from one in-process worker.

A process that dies (killed, out of memory) fails the task it held, with :class:`WorkerProcessError`, and is
started again for the next task; one that dies before it was ready is not. The processes ignore SIGINT (Ctrl-C
reaches the whole process group; the parent decides), end when their pipe closes, and :meth:`WorkerPool.close`
ends what is left.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import pickle
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import TYPE_CHECKING

from fedpeft.core.costs import process_peak_rss_mb
from fedpeft.core.logs import LEVELS_VARIABLE, levels_for_children

if TYPE_CHECKING:
    from fedpeft.data.types import FederatedData

log = logging.getLogger("fedpeft")

SERVER_TASK = "(server)"  # the client of a task that is the server's own work (LocalEngine.call_worker)
CLOSE_SECONDS = 5.0  # how long a closed pool waits for a process to end before it kills it
POLL_SECONDS = 0.005  # how long a run that shares the pool with others waits between looks for its results


class WorkerProcessError(RuntimeError):
    """A worker process ended (or could not start) while it held a client's task."""


def serve(connection: Connection) -> None:
    """A worker process's life: build the worker the first message describes, say ``ready``, then answer tasks
    until the connection closes.

    The first message is ``(config_text, run_dir, threads, data)``: the experiment's config as given
    (:func:`fedpeft.core.config.dump_given`), the run directory, this process's torch threads (a config's
    ``threads`` overrides them) and the federation given to the run (None: built from the config).
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the process group: the parent decides
    import torch
    import yaml

    from fedpeft.core.config import validate
    from fedpeft.core.costs import release_memory
    from fedpeft.core.errors import UserError
    from fedpeft.engine.operations import operation
    from fedpeft.worker import Worker

    try:
        config_text, run_dir, threads, data = pickle.loads(connection.recv_bytes())
    except EOFError:
        return
    torch.set_num_threads(threads)
    try:
        # Every process serves any client: client state between rounds lives where all of them find it.
        worker = Worker(validate(yaml.safe_load(config_text)), Path(run_dir), data=data, state="disk")
    except UserError as err:  # e.g. a model that cannot load: the run ends with its sentence, not this process's
        with contextlib.suppress(OSError):
            connection.send_bytes(pickle.dumps(("refused", err)))
        return
    try:
        connection.send_bytes(pickle.dumps(("ready", os.getpid())))
    except OSError:  # the pool closed while this process was starting
        return
    while True:
        try:
            tag, op, client_id, kwargs = pickle.loads(connection.recv_bytes())
        except (EOFError, OSError):  # the engine closed the pool (a refused run: reset), or its process is gone
            return
        started = time.perf_counter()
        try:
            value, ok = operation(op)(worker, client_id=client_id, **kwargs), True
        except Exception as err:  # the client fails, not the process
            value, ok = err, False
        finally:
            release_memory()
        seconds = time.perf_counter() - started
        try:
            reply = pickle.dumps((tag, ok, value, seconds))
            pickle.loads(reply)  # an error whose class cannot be rebuilt travels as its repr
        except Exception as err:
            error = WorkerProcessError(f"{value!r} (its result could not travel: {err!r})")
            reply = pickle.dumps((tag, False, error, seconds))
        try:
            connection.send_bytes(reply)
        except OSError:
            return


def main() -> None:
    """Entry point of a worker process (started by :class:`WorkerPool`, not by users): the socket's descriptor."""
    from fedpeft.core.logs import apply_inherited_levels

    apply_inherited_levels()  # before any library is imported: their import-time warnings follow the run's -v
    serve(Connection(int(sys.argv[1])))


@dataclass
class _Slot:
    """One place in the pool: its process (None until started), the pipe to it and the task it holds."""

    index: int
    process: subprocess.Popen[bytes] | None = None
    connection: Connection | None = None
    ready: bool = False
    retired: bool = False  # its process died before it was ready: not started again
    task: tuple[int, str] | None = None  # (tag, client) of the task it holds
    pid: int | None = None

    @property
    def alive(self) -> bool:
        return self.process is not None


@dataclass
class WorkerPool:
    """``size`` worker processes for the experiment ``config_text`` in ``run_dir`` (see the module docstring).

    Attributes:
        config_text: the config as given, which every process validates and builds its worker from.
        run_dir: the run directory (the disk store of client states and the base checkpoints live in it).
        size: how many processes.
        threads: torch threads of each process.
        data: the federation given to the run (None: each process builds it from the config).
        gpus: the GPUs to pin the processes to, round-robin, as ``CUDA_VISIBLE_DEVICES`` names them (process
            ``i`` sees only ``gpus[i % len(gpus)]``); empty: the processes see what this one sees.
        stopped: set when the run is interrupted; every :meth:`run` then raises ``KeyboardInterrupt``.
    """

    config_text: str
    run_dir: Path
    size: int
    threads: int
    data: FederatedData | None = None
    gpus: list[str] = field(default_factory=list)
    _slots: list[_Slot] = field(default_factory=list)
    _tags: Iterator[int] = field(default_factory=itertools.count)
    _finished: dict[int, tuple[str, object, float]] = field(default_factory=dict)  # results not yet taken, by tag
    _abandoned: set[int] = field(default_factory=set)  # tags whose run ended before their result came
    _peaks: dict[int, float] = field(default_factory=dict)  # the largest peak memory read of each slot's processes
    stopped: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self._slots = [_Slot(index) for index in range(self.size)]

    def start(self) -> None:
        """Start every process that is not running (they build their workers side by side)."""
        for slot in self._slots:
            if not slot.alive and not slot.retired:
                self._start(slot)

    def _start(self, slot: _Slot) -> None:
        ours, theirs = socket.socketpair()
        # The process imports the fedpeft this one runs, whatever the working directory.
        root = str(Path(__file__).resolve().parents[2])
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, *filter(None, [os.environ.get("PYTHONPATH")])])}
        env[LEVELS_VARIABLE] = levels_for_children()
        if self.gpus:
            env["CUDA_VISIBLE_DEVICES"] = self.gpus[slot.index % len(self.gpus)]
        command = [sys.executable, "-m", "fedpeft.engine.pool", str(theirs.fileno())]
        process = subprocess.Popen(command, stdin=subprocess.DEVNULL, pass_fds=[theirs.fileno()], env=env)
        theirs.close()  # only the child holds its end: its death reads as end of file here
        connection = Connection(ours.detach())
        connection.send_bytes(pickle.dumps((self.config_text, str(self.run_dir), self.threads, self.data)))
        slot.process, slot.connection, slot.ready, slot.task, slot.pid = process, connection, False, None, process.pid

    def running(self) -> dict[str, int]:
        """The process id of the worker process that runs each client's task now, by client."""
        return {slot.task[1]: slot.pid for slot in self._slots if slot.task is not None and slot.pid is not None}

    def peak_rss_mb(self) -> float | None:
        """The largest peak resident memory (MiB) of the pool's processes so far: each running one read now, one
        that has ended as read after its last task; None where none could be read (not Linux, none started)."""
        for slot in self._slots:
            self._read_peak(slot)
        return max(self._peaks.values(), default=None)

    def _read_peak(self, slot: _Slot) -> None:
        if slot.alive and slot.pid is not None and (peak := process_peak_rss_mb(slot.pid)) is not None:
            self._peaks[slot.index] = max(peak, self._peaks.get(slot.index, 0.0))

    def run(
        self,
        op: str,
        client_ids: list[str],
        kwargs_of: Callable[[str], dict[str, object]],
        pause: Callable[[float], None] | None = None,
    ) -> Iterator[tuple[str, object, float]]:
        """Run the worker operation ``op`` for each of ``client_ids`` on the processes; yield ``(client, result or
        the exception its work raised, seconds)`` in the order of ``client_ids``.

        ``kwargs_of(client)`` gives the operation's keyword arguments, called in this process when the client's
        task is handed out (in the order of the clients). At most ``2 * size`` results wait to be yielded.

        ``pause``: several runs at once (units of a run in threads of their own that take turns, one touching the
        pool at a time): while no result is ready the run calls ``pause(seconds)``, which lets another thread take
        its turn, instead of blocking; results are kept by task, whichever run's thread receives them. Once
        :attr:`stopped` is set (the run was interrupted), a run raises ``KeyboardInterrupt`` at its next look.
        """
        self.start()
        pending = deque(enumerate(client_ids))
        tags: dict[int, int] = {}  # position in client_ids -> tag of its task
        next_index = 0
        try:
            while next_index < len(client_ids):
                if self.stopped.is_set():
                    raise KeyboardInterrupt("the run was interrupted")
                tag = tags.get(next_index)
                if tag is not None and tag in self._finished:
                    yield self._finished.pop(tag)
                    next_index += 1
                    continue
                while pending and pending[0][0] < next_index + 2 * self.size:
                    slot = self._idle_slot()
                    if slot is None:
                        break
                    position, client_id = pending.popleft()
                    tags[position] = self._send(slot, op, client_id, kwargs_of(client_id))
                received = self._receive(None if pause is None else 0.0)
                if received is None and pending:  # no process left to run it
                    position, client_id = pending.popleft()
                    tags[position] = next(self._tags)
                    error = WorkerProcessError("no worker process is left to run it")
                    self._finished[tags[position]] = (client_id, error, 0.0)
                elif not received and pause is not None:
                    pause(POLL_SECONDS)
        finally:
            # Results still due (the caller stopped early, or an error) belong to no later run: dropped on arrival.
            for position, tag in tags.items():
                if position >= next_index and self._finished.pop(tag, None) is None:
                    self._abandoned.add(tag)

    def readable(self, timeout: float) -> None:
        """Block until a process has a message (a result, ``ready``, its end) or ``timeout`` seconds have passed;
        reads nothing, so a thread may wait here without the turn (:class:`~fedpeft.core.turns.Turns`)."""
        connections = [slot.connection for slot in self._slots if slot.alive and slot.connection is not None]
        if connections:
            with contextlib.suppress(OSError, ValueError):  # a connection closed meanwhile: a look is due anyway
                wait(connections, timeout)
        else:
            time.sleep(timeout)

    def _idle_slot(self) -> _Slot | None:
        """A ready process without a task, else (re)start one; None when every process is busy or starting."""
        for slot in self._slots:
            if slot.alive and slot.ready and slot.task is None:
                return slot
        for slot in self._slots:
            if not slot.alive and not slot.retired:
                self._start(slot)
        return None

    def _send(self, slot: _Slot, op: str, client_id: str, kwargs: dict[str, object]) -> int:
        tag = next(self._tags)
        slot.task = (tag, client_id)
        assert slot.connection is not None
        try:
            slot.connection.send_bytes(pickle.dumps((tag, op, client_id, kwargs)))
        except OSError:
            pass  # the process died: read as end of file by _receive, which fails the task
        return tag

    def _finish(self, tag: int, result: tuple[str, object, float]) -> None:
        if tag in self._abandoned:
            self._abandoned.discard(tag)
        else:
            self._finished[tag] = result

    def _receive(self, timeout: float | None) -> bool | None:
        """Wait up to ``timeout`` seconds (``None``: until one comes) for the next messages of the processes (results,
        ``ready``, deaths) and act on them; None when no process is running or starting, else whether any came."""
        waiting = {slot.connection: slot for slot in self._slots if slot.alive and slot.connection is not None}
        if not waiting:
            return None
        ready = wait(list(waiting), timeout)
        for connection in ready:
            slot = waiting[connection]  # type: ignore[index]
            try:
                message = pickle.loads(slot.connection.recv_bytes())  # type: ignore[union-attr]
            except (EOFError, OSError):
                self._died(slot)
                continue
            if message[0] == "ready":
                slot.ready = True
                continue
            if message[0] == "refused":  # the config cannot run: every process would say so
                raise message[1]
            tag, ok, value, seconds = message
            if slot.task is None or slot.task[0] != tag:
                continue
            _, client_id = slot.task
            slot.task = None
            self._read_peak(slot)
            self._finish(tag, (client_id, value if ok else _as_error(value), seconds))
        return bool(ready)

    def _died(self, slot: _Slot) -> None:
        """``slot``'s process ended: its task fails; it starts again for the next task unless it never got ready."""
        assert slot.process is not None and slot.connection is not None
        try:
            code: int | None = slot.process.wait(timeout=CLOSE_SECONDS)
        except subprocess.TimeoutExpired:  # its socket closed, yet it runs: it cannot serve
            slot.process.kill()
            code = slot.process.wait()
        slot.connection.close()
        when = "while it ran client" if slot.ready else "before it was ready, with client"
        log.warning("worker process %s ended (exit code %s)", slot.pid, code)
        if slot.task is not None:
            tag, client_id = slot.task
            error = WorkerProcessError(f"worker process {slot.pid} ended (exit code {code}) {when} {client_id}")
            self._finish(tag, (client_id, error, 0.0))
        slot.retired = slot.retired or not slot.ready
        slot.process, slot.connection, slot.ready, slot.task = None, None, False, None

    def close(self) -> None:
        """End every process: close the connections (an idle process ends at once), then terminate, then kill."""
        for slot in self._slots:
            if slot.connection is not None:
                with contextlib.suppress(OSError):
                    slot.connection.close()
        deadline = time.monotonic() + CLOSE_SECONDS
        for slot in self._slots:
            if slot.process is not None and slot.ready and slot.task is None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    slot.process.wait(timeout=max(0.0, deadline - time.monotonic()))
            if slot.process is not None and slot.process.poll() is None:
                slot.process.terminate()
        for slot in self._slots:
            if slot.process is not None:
                try:
                    slot.process.wait(timeout=CLOSE_SECONDS)
                except subprocess.TimeoutExpired:
                    slot.process.kill()
                    slot.process.wait()
            slot.process, slot.connection, slot.ready, slot.task = None, None, False, None


def _as_error(value: object) -> BaseException:
    return value if isinstance(value, BaseException) else WorkerProcessError(repr(value))


def visible_gpus(device: str) -> list[str]:
    """The GPUs worker processes are pinned to for a run on ``device``, as ``CUDA_VISIBLE_DEVICES`` names them:
    every visible GPU when ``device`` is ``cuda`` (or ``auto`` resolving to it); none for another device or a
    numbered ``cuda:N``, which every process then uses."""
    import torch

    from fedpeft.models.runtime import resolve_device

    if resolve_device(device) != "cuda" or not torch.cuda.is_available():
        return []
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [name.strip() for name in listed.split(",") if name.strip()][: torch.cuda.device_count()]
    return [str(index) for index in range(torch.cuda.device_count())]


def gpu_shares(size: int, gpus: list[str]) -> list[int]:
    """How many of ``size`` processes each of ``gpus`` holds, pinned round-robin (see :class:`WorkerPool`)."""
    return [len(range(index, size, len(gpus))) for index in range(len(gpus))]


def memory_shortfall(
    size: int, per_process: int, available: int, *, where: str, setting: str = "engine.workers"
) -> str | None:
    """One sentence refusing ``size`` worker processes of ``per_process`` bytes each where ``available`` bytes are
    free (``where``: ``memory``, ``memory of GPU 0``, ...), or None when they fit; it names the largest count that
    fits."""
    if size * per_process <= available:
        return None
    gib = 2**30
    fits = available // per_process if per_process else size
    advice = f"use {setting} {fits} or fewer" if fits >= 1 else "free memory or use a smaller model"
    return (
        f"{setting} {size} needs about {size * per_process / gib:.1f} GiB of {where} ({size} worker processes of "
        f"about {per_process / gib:.2f} GiB, each holding the run's data and model), and {available / gib:.1f} "
        f"GiB is free; {advice}."
    )


if __name__ == "__main__":
    main()
