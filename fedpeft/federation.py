"""Heterogeneous federations: clients of one run on base models of different architectures.

An experiment config with ``models`` (architecture name -> model) and ``assign`` (which client gets which) makes
the federation heterogeneous. A :class:`Federation` knows the architectures, the client -> architecture map and
the public data, and hands out one :class:`~fedpeft.models.runtime.ModelRuntime` per architecture, built the
first time it is asked for and kept for the life of the process: a worker that serves only small-model clients
never loads the large model.

Every runtime of a worker points back to its federation (``runtime.federation``) and knows its architecture
(``runtime.architecture``), so a method reaches the other architectures from the runtime it is given
(:func:`federation_of`). A homogeneous run is a federation of one architecture, ``default``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from fedpeft.core.config import ExperimentConfig
from fedpeft.core.errors import UserError
from fedpeft.data.types import ClientData, Example

if TYPE_CHECKING:
    from fedpeft.models.runtime import ModelRuntime

DEFAULT_ARCHITECTURE = "default"


def assign_architectures(cfg: ExperimentConfig, clients: Iterable[ClientData]) -> dict[str, str]:
    """Client id -> architecture under ``cfg.assign`` (first match: clients, groups, counts, default).

    Raises:
        UserError: a client no rule covers, counts that exceed the clients, or a client id that does not exist.
    """
    clients = sorted(clients, key=lambda c: c.client_id)
    rules = cfg.assign
    known = {c.client_id for c in clients}
    strangers = sorted(set(rules.clients) - known)
    if strangers:
        raise UserError(f"assign.clients names clients that do not exist ({', '.join(strangers[:3])}); fix the ids.")
    by_count: list[str] = [name for name, count in rules.counts.items() for _ in range(count)]
    if len(by_count) > len(clients):
        raise UserError(f"assign.counts gives out {len(by_count)} clients but there are {len(clients)}; lower them.")
    assignment: dict[str, str] = {}
    position = 0
    for client in clients:
        if client.client_id in rules.clients:
            assignment[client.client_id] = rules.clients[client.client_id]
        elif client.group in rules.groups:
            assignment[client.client_id] = rules.groups[client.group]
        elif position < len(by_count):
            assignment[client.client_id] = by_count[position]
            position += 1
        elif rules.default is not None:
            assignment[client.client_id] = rules.default
        else:
            raise UserError(
                f"Client {client.client_id} gets no architecture; add assign.default or cover it in "
                "assign.clients, assign.groups or assign.counts."
            )
    return assignment


class Federation:
    """The architectures of a federation, their runtimes (built on first use) and the client assignment.

    Args:
        assignment: client id -> architecture name.
        build: builds the runtime of an architecture (called at most once per name).
        architectures: every architecture name, in the config's order (default: those of ``assignment``).
        public: public examples (the dataset's base corpus), for methods that align or distil on public data.
    """

    def __init__(
        self,
        assignment: dict[str, str],
        build: Callable[[str], ModelRuntime],
        *,
        architectures: list[str] | None = None,
        public: list[Example] | None = None,
    ) -> None:
        self.assignment = dict(assignment)
        self.names = list(architectures or dict.fromkeys(assignment.values()))
        self.public = list(public or [])
        self._build = build
        self._runtimes: dict[str, ModelRuntime] = {}
        self.builds: dict[str, int] = {name: 0 for name in self.names}

    @property
    def heterogeneous(self) -> bool:
        return len(self.names) > 1

    def architecture_of(self, client_id: str) -> str:
        """The architecture of ``client_id`` (clients the assignment does not know get the first one)."""
        return self.assignment.get(client_id, self.names[0])

    def clients_of(self, name: str) -> list[str]:
        """The clients of architecture ``name``, sorted."""
        return sorted(c for c, a in self.assignment.items() if a == name)

    def adopt(self, name: str, runtime: ModelRuntime) -> ModelRuntime:
        """Register an already loaded runtime as the one of architecture ``name``."""
        runtime.architecture = name
        runtime.federation = self
        self._runtimes[name] = runtime
        return runtime

    def runtime(self, name: str) -> ModelRuntime:
        """The runtime of architecture ``name``, loaded on first use and kept."""
        if name not in self._runtimes:
            if name not in self.names:
                raise KeyError(f"unknown architecture {name!r}")
            self.builds[name] += 1
            self.adopt(name, self._build(name))
        return self._runtimes[name]

    def runtime_of(self, client_id: str) -> ModelRuntime:
        """The runtime of ``client_id``'s architecture."""
        return self.runtime(self.architecture_of(client_id))

    def loaded(self) -> list[str]:
        """Architectures whose runtime this process has built so far."""
        return [name for name in self.names if name in self._runtimes]

    def parameter_counts(self) -> dict[str, int]:
        """Base-model parameters of every architecture (loads them all)."""
        return {name: sum(p.numel() for p in self.runtime(name).base_params.values()) for name in self.names}

    def smallest(self) -> str:
        """The architecture with the fewest base-model parameters (the first on a tie)."""
        counts = self.parameter_counts()
        return min(self.names, key=lambda name: (counts[name], self.names.index(name)))


def federation_of(runtime: ModelRuntime) -> Federation:
    """The federation ``runtime`` belongs to; a runtime used on its own is a federation of one architecture."""
    if runtime.federation is None:
        solo = Federation({}, lambda name: runtime, architectures=[runtime.architecture])
        solo.adopt(runtime.architecture, runtime)
    return runtime.federation


def build_federation(
    cfg: ExperimentConfig,
    clients: list[ClientData],
    primary: ModelRuntime | None,
    build: Callable[[str], ModelRuntime],
    public: list[Example] | None = None,
) -> Federation:
    """The federation of an experiment; ``primary`` (already loaded) serves the first architecture.

    Args:
        cfg: the experiment config (``models`` and ``assign``; homogeneous without ``models``).
        clients: every client of every pool.
        primary: the worker's runtime, loaded from the first architecture of ``models`` (or from ``model``); None:
            ``build`` loads it too, on first use.
        build: builds the runtime of an architecture.
        public: public examples for alignment and distillation.
    """
    if not cfg.models:
        assignment = {c.client_id: DEFAULT_ARCHITECTURE for c in clients}
        federation = Federation(assignment, build, architectures=[DEFAULT_ARCHITECTURE], public=public)
        if primary is not None:
            federation.adopt(DEFAULT_ARCHITECTURE, primary)
        return federation
    names = list(cfg.models)
    federation = Federation(assign_architectures(cfg, clients), build, architectures=names, public=public)
    if primary is not None:
        federation.adopt(names[0], primary)
    return federation
