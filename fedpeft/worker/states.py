"""The per-client states of a worker's methods between rounds: one store per method and seed, in this process's
memory or on disk under the run directory (``client_state/<label>/seed<seed>/``), as the engine's settings say."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from fedpeft.core.stores import ClientStateStore, make_store


class ClientStates:
    """The client-state stores of one worker, made on first use.

    Args:
        kind: where the states live: ``memory`` (this process) or ``disk`` (any process serving the client finds
            them; worker processes and Flower nodes).
        run_dir: the run directory a disk store writes under.
    """

    def __init__(self, kind: Literal["memory", "disk"], run_dir: Path) -> None:
        self.kind: Literal["memory", "disk"] = kind
        self.run_dir = Path(run_dir)
        self._stores: dict[tuple[str, int], ClientStateStore] = {}

    def store(self, label: str, seed: int) -> ClientStateStore:
        """The store of method ``label``'s client states for ``seed``."""
        key = (label, seed)
        if key not in self._stores:
            root = self.run_dir / "client_state" / label / f"seed{seed}"
            self._stores[key] = make_store(self.kind, root)
        return self._stores[key]
