"""What a phase costs: communication, client and wall time, peak memory."""

from __future__ import annotations

import ctypes
import ctypes.util
import resource
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from functools import cache
from pathlib import Path

from fedpeft.core.faults import INJECTED_ERRORS

FAILED_CLIENT = "failed_client"  # the metric of a client's failure event
ROUND_EVALUATION = "round_evaluation"  # the phase of the evaluations between a federated phase's rounds
_MESSAGE_CHARS = 200  # of a failure's message kept in its event


def peak_rss_mb() -> float:
    """Peak resident set size of this process so far, in MiB."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024


def process_peak_rss_mb(pid: int) -> float | None:
    """Peak resident set size of the process ``pid`` so far, in MiB (``VmHWM`` of ``/proc/PID/status``); None
    where that cannot be read (not Linux, the process has ended)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    for line in status.splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return None


def peak_cuda_mb() -> float | None:
    """Peak GPU memory that this process's tensors took so far, in MiB (the largest over its GPUs); None when it
    has not used CUDA (torch not imported, or no GPU initialized)."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return None
    return max(torch.cuda.max_memory_allocated(index) for index in range(torch.cuda.device_count())) / 2**20


@cache
def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    if sys.platform != "linux" or name is None:
        return None
    libc = ctypes.CDLL(name)
    return libc if hasattr(libc, "malloc_trim") else None


def release_memory() -> None:
    """Hand the heap memory freed by a client's work back to the system.

    Every client allocates tensors of its own shapes; glibc keeps the freed blocks, so without this the resident
    memory of a run grows with the number of clients it has visited, not with the size of one client's work.
    """
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)


def error_class(error: BaseException) -> str:
    """The class name of what a client's work raised; an error relayed from a Flower node carries the name of
    the one raised there (``error_type``)."""
    return getattr(error, "error_type", None) or type(error).__name__


def error_summary(error: BaseException) -> str:
    """The first line of an error's message (``error_message`` for one relayed from a Flower node), cut to 200
    characters."""
    text = str(getattr(error, "error_message", None) or error).strip()
    line = text.splitlines()[0] if text else ""
    return line if len(line) <= _MESSAGE_CHARS else line[: _MESSAGE_CHARS - 1] + "…"


@dataclass
class CostMeter:
    """Accumulates communication and time of one phase."""

    bytes_up: int = 0
    bytes_down: int = 0
    client_rounds: int = 0
    clients: int = 0
    client_seconds: float = 0.0
    wall_seconds: float = 0.0
    # The evaluations between rounds (``eval.every``): their wall seconds, outside ``wall_seconds``, and the
    # clients they evaluated.
    evaluation_seconds: float = 0.0
    evaluated_clients: int = 0
    # The server's state built before the first round (``init_server``: FedMosaic's alignment of every
    # architecture's frames on public data, FedP2EFT's PSG), outside ``wall_seconds``.
    server_init_seconds: float = 0.0
    failures: list[str] = field(default_factory=list)
    # One dict per event of the phase (``{"metric": ..., "round": ..., "client": ..., ...}``, rounds counted from
    # 1 as results.jsonl counts them): a failed client
    # (:meth:`record_failure`), a rejected update, an injected fault, a dropped client, a round that kept the
    # previous state.
    events: list[dict] = field(default_factory=list)

    def snapshot(self) -> dict[str, object]:
        """What a checkpoint keeps of the meter: every field by name (:meth:`restore` takes it back)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def restore(self, snapshot: Mapping[str, object]) -> None:
        """Continue from a checkpoint's :meth:`snapshot`; a field it lacks (a checkpoint of an earlier version)
        keeps its value."""
        for f in fields(self):
            if f.name in snapshot:
                setattr(self, f.name, snapshot[f.name])

    def record_failure(
        self, client_id: str, error: BaseException, round_: int | None = None, message: str | None = None
    ) -> None:
        """Count a client whose work raised ``error`` in this phase (in round ``round_`` of a federated phase)
        and record it as a ``failed_client`` event with the error's class and message, preceded by an
        ``injected_fault`` event when the config's ``faults`` raised it.

        Args:
            client_id: the client.
            error: what its work raised (or the engine's error for it: a lost node, a dropped client).
            round_: the 0-based round, for a failure in a federated round; None in the other phases. The event
                counts rounds from 1, as results.jsonl and the progress lines do (``round_ + 1``).
            message: the line kept in ``failures`` (the run's error message names the first); default
                ``"<client>: <error>"``.
        """
        self.failures.append(message or f"{client_id}: {error!r}")
        where: dict[str, int] = {} if round_ is None else {"round": round_ + 1}
        for cls, kind in INJECTED_ERRORS.items():
            if isinstance(error, cls):
                self.events.append({"metric": "injected_fault", **where, "client": client_id, "kind": kind})
        name, summary = error_class(error), error_summary(error)
        self.events.append({"metric": FAILED_CLIENT, **where, "client": client_id, "error": name, "message": summary})

    def record_evaluation_failure(self, client_id: str, error: BaseException, round_: int) -> None:
        """Record a client whose evaluation after round ``round_`` (0-based; ``eval.every``) raised: a
        ``failed_client`` event with ``step: evaluation`` and the round counted from 1, not counted among the
        phase's failed client-rounds (its training went through)."""
        self.events.append(
            {
                "metric": FAILED_CLIENT,
                "round": round_ + 1,
                "client": client_id,
                "step": "evaluation",
                "error": error_class(error),
                "message": error_summary(error),
            }
        )

    def record_round(self, seconds: float, bytes_down: int, bytes_up: int) -> None:
        """Account one client's round: its time and what travelled each way."""
        self.client_seconds += seconds
        self.client_rounds += 1
        self.bytes_down += bytes_down
        self.bytes_up += bytes_up

    def rows(self, method: str, seed: int, phase: str, *, workers_peak_mb: float | None = None) -> list[dict]:
        """Records for ``costs.jsonl``: ``peak_rss_mb`` is this process's peak so far, ``workers_peak_rss_mb``
        (where given: ``workers_peak_mb``) the largest of the worker processes' that ran its clients."""
        values: dict[str, float] = {"wall_s": self.wall_seconds, "peak_rss_mb": peak_rss_mb()}
        if workers_peak_mb is not None:
            values["workers_peak_rss_mb"] = workers_peak_mb
        cuda = peak_cuda_mb()
        if cuda is not None:  # of this process: with worker processes, the server's share only
            values["peak_cuda_mb"] = cuda
        if self.client_rounds:
            values.update(
                bytes_up_per_client_round=self.bytes_up / self.client_rounds,
                bytes_down_per_client_round=self.bytes_down / self.client_rounds,
                bytes_up_total=float(self.bytes_up),
                bytes_down_total=float(self.bytes_down),
                wall_s_per_client_round=self.client_seconds / self.client_rounds,
            )
        if self.clients:
            values["wall_s_per_client"] = self.client_seconds / self.clients
        if self.server_init_seconds:
            values["server_init_s"] = self.server_init_seconds
        if self.failures:  # client-rounds of a federated phase, clients of the other phases
            values["failed_client_rounds" if phase == "federated" else "failed_clients"] = float(len(self.failures))
        rows = [
            {"method": method, "seed": seed, "phase": phase, "metric": k, "value": float(v)} for k, v in values.items()
        ]
        return rows + [{"method": method, "seed": seed, "phase": phase, "value": 1.0, **e} for e in self.events]

    def evaluation_rows(self, method: str, seed: int) -> list[dict]:
        """Records for ``costs.jsonl`` of the evaluations between rounds (phase ``round_evaluation``): their wall
        seconds, and those per client evaluated; none when no round was evaluated."""
        if not self.evaluated_clients:
            return []
        values = {
            "wall_s": self.evaluation_seconds,
            "wall_s_per_client": self.evaluation_seconds / self.evaluated_clients,
        }
        return [
            {"method": method, "seed": seed, "phase": ROUND_EVALUATION, "metric": k, "value": v}
            for k, v in values.items()
        ]
