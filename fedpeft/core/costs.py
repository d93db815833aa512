"""What a phase costs: communication, client and wall time, peak memory."""

from __future__ import annotations

import ctypes
import ctypes.util
import resource
import sys
from dataclasses import dataclass, field
from functools import cache


def peak_rss_mb() -> float:
    """Peak resident set size of this process so far, in MiB."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024


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


@dataclass
class CostMeter:
    """Accumulates communication and time of one phase."""

    bytes_up: int = 0
    bytes_down: int = 0
    client_rounds: int = 0
    clients: int = 0
    client_seconds: float = 0.0
    wall_seconds: float = 0.0
    failures: list[str] = field(default_factory=list)
    # What the server did about untrusted updates: one dict per rejected update, injected fault that reached it,
    # or round that kept the previous state (``{"metric": ..., "round": ..., "client": ..., "reason": ...}``).
    events: list[dict] = field(default_factory=list)

    def record_round(self, seconds: float, bytes_down: int, bytes_up: int) -> None:
        """Account one client's round: its time and what travelled each way."""
        self.client_seconds += seconds
        self.client_rounds += 1
        self.bytes_down += bytes_down
        self.bytes_up += bytes_up

    def rows(self, method: str, seed: int, phase: str) -> list[dict]:
        """Records for ``costs.jsonl``."""
        values: dict[str, float] = {"wall_s": self.wall_seconds, "peak_rss_mb": peak_rss_mb()}
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
        if self.failures:  # client-rounds of a federated phase, clients of the other phases
            values["failed_client_rounds" if phase == "federated" else "failed_clients"] = float(len(self.failures))
        rows = [
            {"method": method, "seed": seed, "phase": phase, "metric": k, "value": float(v)} for k, v in values.items()
        ]
        return rows + [{"method": method, "seed": seed, "phase": phase, "value": 1.0, **e} for e in self.events]
