"""Any homogeneous method in a heterogeneous federation: one independent copy per architecture group.

Weights of different architectures cannot be averaged, so a method written for one base model (FedIT, FedProx,
full FedAvg, ...) runs once per architecture: the server keeps one state per architecture, sends each client the
state of its architecture and aggregates each round's updates within each architecture group only (the
"Fed-ET" treatment of homogeneous baselines in the FedMosaic paper). Methods that share knowledge across
architectures themselves (FedMosaic's PQ-LoRA, the distillation baselines) set ``architecture_aware = True``
and are not wrapped.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedpeft.core.errors import UserError
from fedpeft.core.types import ClientUpdate, Metrics, Payload, ServerState
from fedpeft.data.types import ClientData
from fedpeft.federation import federation_of
from fedpeft.merging.server_step import ServerStep
from fedpeft.methods.base import Budget, Method, MethodConfig
from fedpeft.models.runtime import ClientModel, ModelRuntime


@dataclass
class ArchitectureGroupsState(ServerState):
    """The wrapped method's server state of every architecture, and each client's architecture."""

    groups: dict[str, ServerState] = field(default_factory=dict)
    assignment: dict[str, str] = field(default_factory=dict)


class ArchitectureGroups(Method[MethodConfig, ArchitectureGroupsState, Any]):
    """Wraps ``inner`` so that it runs independently within each architecture group."""

    def __init__(self, inner: Method[Any, Any, Any]) -> None:
        super().__init__(inner.cfg)
        self.inner = inner
        # The wrapper answers for the wrapped method: its class attributes become this instance's.
        self.name = inner.name  # type: ignore[misc]
        self.Config = inner.Config  # type: ignore[misc]
        self.federated = inner.federated  # type: ignore[misc]
        self.uses_budget = inner.uses_budget  # type: ignore[misc]
        self.private_keys = inner.private_keys  # type: ignore[misc]

    # Hooks that do not depend on the server state pass through to the wrapped method.
    def server_step(self) -> ServerStep | None:
        return self.inner.server_step()  # run within each architecture group

    def bind_federation(self, federation: Any) -> None:
        self.inner.bind_federation(federation)

    def check_budgets(self, budgets: list[int]) -> None:
        self.inner.check_budgets(budgets)

    def bind_pool(self, client_ids: Sequence[str]) -> None:
        super().bind_pool(client_ids)
        self.inner.bind_pool(client_ids)

    def sample(self, client_ids: list[str], round_: int, seed: int) -> list[str]:
        return self.inner.sample(client_ids, round_, seed)

    def budgets_of(self, client: ClientData, budgets: Sequence[int]) -> list[Budget]:
        return self.inner.budgets_of(client, budgets)

    def save_client_artifacts(self, prepared: Any, client: ClientData, run_dir: Path, label: str, seed: int) -> None:
        self.inner.save_client_artifacts(prepared, client, run_dir, label, seed)

    def compute_costs(self, runtime: ModelRuntime, seed: int) -> list[dict]:
        return self.inner.compute_costs(runtime, seed)

    def init_server(self, runtime: ModelRuntime, seed: int) -> ArchitectureGroupsState:
        federation = federation_of(runtime)
        groups = {name: self.inner.init_server(federation.runtime(name), seed) for name in federation.names}
        return ArchitectureGroupsState(groups=groups, assignment=dict(federation.assignment))

    @staticmethod
    def _architecture(state: ArchitectureGroupsState, client_id: str) -> str:
        return state.assignment.get(client_id, next(iter(state.groups)))

    def payload(self, state: ArchitectureGroupsState, client_id: str) -> Payload:
        group = state.groups[self._architecture(state, client_id)]
        return self.inner.payload(group, client_id)

    def client_update(
        self, runtime: ModelRuntime, client: ClientData, payload: Payload, client_state: Any, seed: int
    ) -> tuple[ClientUpdate, Any]:
        return self.inner.client_update(runtime, client, payload, client_state, seed)

    def aggregate(
        self, state: ArchitectureGroupsState, updates: Iterable[ClientUpdate]
    ) -> tuple[ArchitectureGroupsState, Metrics]:
        by_group: dict[str, list[ClientUpdate]] = {}
        for update in updates:
            by_group.setdefault(self._architecture(state, update.client_id), []).append(update)
        groups = dict(state.groups)
        metrics: Metrics = {"clients": 0.0}
        for name, group_updates in by_group.items():
            group_state, group_metrics = self.inner.aggregate(groups[name], iter(group_updates))
            # Each group counts its own rounds, those it took part in (the round loop counts the wrapper's).
            groups[name] = dataclasses.replace(group_state, round=groups[name].round + 1)
            for key, value in group_metrics.items():
                metrics[f"{name}/{key}"] = value
            metrics["clients"] += group_metrics.get("clients", float(len(group_updates)))
        return dataclasses.replace(state, tensors={}, groups=groups), metrics

    def personalize(
        self,
        runtime: ModelRuntime,
        client: ClientData,
        state: ServerState,
        client_state: Any,
        budget: Budget,
        seed: int,
    ) -> ClientModel:
        """The wrapped method's model from the state of the client's architecture (``state`` may be a state of
        the wrapped method itself)."""
        if isinstance(state, ArchitectureGroupsState):
            state = state.groups[runtime.architecture]
        return self.inner.personalize(runtime, client, state, client_state, budget, seed)


def for_architectures(method: Method[Any, Any, Any], heterogeneous: bool) -> Method[Any, Any, Any]:
    """``method`` as it runs in a federation: wrapped per architecture group when the federation is
    heterogeneous and the method does not share across architectures itself."""
    if not heterogeneous or not method.federated or method.architecture_aware:
        return method
    if getattr(method.cfg, "dp", None) is not None:
        # Whether an architecture's state changes in a round would show whether one of its clients was sampled.
        raise UserError(
            f"Method {method.label!r} cannot use `dp` in a federation of several architectures, where it runs one "
            "copy per architecture; use one model."
        )
    return ArchitectureGroups(method)
