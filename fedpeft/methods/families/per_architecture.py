"""Any homogeneous method in a heterogeneous federation: one independent copy per architecture group.

Weights of different architectures cannot be averaged, so a method written for one base model (FedIT, FedProx,
full FedAvg, ...) runs once per architecture: the server keeps one state per architecture, sends each client the
state of its architecture and aggregates each round's updates within each architecture group only (the
"Fed-ET" treatment of homogeneous baselines in the FedMosaic paper). Methods that share knowledge across
architectures themselves (FedMosaic's PQ-LoRA, the distillation baselines) set ``architecture_aware = True``
and are not wrapped.

The wrapper delegates by construction: every hook and class flag of the method contract
(:func:`fedpeft.methods.base.contract`) that it does not answer for itself, the few listed in
:attr:`ArchitectureGroups.PER_ARCHITECTURE` with their reasons, goes to the wrapped method as it is, so a hook
added to the contract reaches the wrapped method without an edit here. The hooks it answers for itself are those
that receive or give the server state, whose architecture decides which group's state is meant.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from fedpeft.base_models import ClientBase
from fedpeft.core.errors import UserError
from fedpeft.core.types import ClientUpdate, Metrics, Payload, ServerState, StateDict
from fedpeft.data.types import ClientData
from fedpeft.federation import federation_of
from fedpeft.methods.base import Budget, Method, MethodConfig, contract
from fedpeft.models.multi_lora import LoraTraining
from fedpeft.models.runtime import ClientModel, ModelRuntime


@dataclass
class ArchitectureGroupsState(ServerState):
    """The wrapped method's server state of every architecture, and each client's architecture."""

    groups: dict[str, ServerState] = field(default_factory=dict)
    assignment: dict[str, str] = field(default_factory=dict)


class ArchitectureGroups(Method[MethodConfig, ArchitectureGroupsState, object]):
    """Wraps ``inner`` so that it runs independently within each architecture group; everything of the contract
    but :attr:`PER_ARCHITECTURE` is the wrapped method's own (delegated below the class). A client's state is the
    wrapped method's, handed to it as it is."""

    PER_ARCHITECTURE: ClassVar[dict[str, str]] = {
        "architecture_aware": "the wrapper is what runs the method across architectures (not wrapped again)",
        "batchable_clients": "the batched engine trains every client on the worker's first runtime",
        "init_server": "one state per architecture, each from its own runtime",
        "init_server_for_budget": "one state per architecture for the budget, each from its own runtime",
        "should_stop": "the phase ends when every group's would; a group that would stop keeps its state",
        "payload": "the state of the client's architecture",
        "aggregate": "each group's updates into its own state",
        "prepare_personalization": "the state of the runtime's architecture",
        "personalize": "the state of the runtime's architecture",
        "personal_training": "the state of the runtime's architecture",
        "export_base": "the state of the runtime's architecture",
        "client_base": "the state of the runtime's architecture",
        "save_server_artifacts": "each architecture's own state, once per architecture (its name passed on)",
    }
    """The members of the contract the wrapper answers for itself, with the reason of each."""

    architecture_aware = True
    batchable_clients = False

    def __init__(self, inner: Method[Any, Any, Any]) -> None:
        super().__init__(inner.cfg)
        self.inner = inner

    # ------------------------------------------------------------------ federated phase
    def init_server(self, runtime: ModelRuntime, seed: int) -> ArchitectureGroupsState:
        return self._groups(runtime, lambda arch_runtime: self.inner.init_server(arch_runtime, seed))

    def init_server_for_budget(self, runtime: ModelRuntime, seed: int, budget: int) -> ArchitectureGroupsState:
        return self._groups(runtime, lambda arch_runtime: self.inner.init_server_for_budget(arch_runtime, seed, budget))

    @staticmethod
    def _groups(runtime: ModelRuntime, init: Callable[[ModelRuntime], ServerState]) -> ArchitectureGroupsState:
        federation = federation_of(runtime)
        groups = {name: init(federation.runtime(name)) for name in federation.names}
        return ArchitectureGroupsState(groups=groups, assignment=dict(federation.assignment))

    @staticmethod
    def _architecture(state: ArchitectureGroupsState, client_id: str) -> str:
        return state.assignment.get(client_id, next(iter(state.groups)))

    def should_stop(self, state: ArchitectureGroupsState) -> bool:
        return all(self.inner.should_stop(group) for group in state.groups.values())

    def payload(self, state: ArchitectureGroupsState, client_id: str) -> Payload:
        return self.inner.payload(state.groups[self._architecture(state, client_id)], client_id)

    def aggregate(
        self, state: ArchitectureGroupsState, updates: Iterable[ClientUpdate]
    ) -> tuple[ArchitectureGroupsState, Metrics]:
        by_group: dict[str, list[ClientUpdate]] = {}
        for update in updates:
            by_group.setdefault(self._architecture(state, update.client_id), []).append(update)
        groups = dict(state.groups)
        metrics: Metrics = {"clients": 0.0}
        for name, group_updates in by_group.items():
            if self.inner.should_stop(groups[name]):  # its phase has ended, as it would alone: updates left out
                continue
            group_state, group_metrics = self.inner.aggregate(groups[name], iter(group_updates))
            # Each group counts its own rounds, those it took part in (the round loop counts the wrapper's).
            groups[name] = dataclasses.replace(group_state, round=groups[name].round + 1)
            for key, value in group_metrics.items():
                metrics[f"{name}/{key}"] = value
            metrics["clients"] += group_metrics.get("clients", float(len(group_updates)))
        return dataclasses.replace(state, tensors={}, groups=groups), metrics

    # ------------------------------------------------------------------ personalization and base stage
    @staticmethod
    def _own(runtime: ModelRuntime, state: ServerState) -> ServerState:
        """The wrapped method's state of ``runtime``'s architecture (``state`` as it is when it is not the
        wrapper's: a per-budget method's placeholder, or a state of the wrapped method itself)."""
        return state.groups[runtime.architecture] if isinstance(state, ArchitectureGroupsState) else state

    def prepare_personalization(
        self, runtime: ModelRuntime, client: ClientData, state: ServerState, client_state: object, seed: int
    ) -> object:
        return self.inner.prepare_personalization(runtime, client, self._own(runtime, state), client_state, seed)

    def personalize(
        self,
        runtime: ModelRuntime,
        client: ClientData,
        state: ServerState,
        client_state: object,
        budget: Budget,
        seed: int,
    ) -> ClientModel:
        own = self._own(runtime, state)
        return self.inner.personalize(runtime, client, own, client_state, budget, seed)

    def personal_training(
        self,
        runtime: ModelRuntime,
        client: ClientData,
        state: ServerState,
        client_state: object,
        budget: Budget,
        seed: int,
    ) -> LoraTraining | None:
        own = self._own(runtime, state)
        return self.inner.personal_training(runtime, client, own, client_state, budget, seed)

    def export_base(self, runtime: ModelRuntime, state: ServerState) -> StateDict:
        return self.inner.export_base(runtime, self._own(runtime, state))

    def client_base(
        self, runtime: ModelRuntime, client: ClientData, state: ServerState, client_state: object, seed: int
    ) -> ClientBase | None:
        return self.inner.client_base(runtime, client, self._own(runtime, state), client_state, seed)

    # ------------------------------------------------------------------ outputs
    def save_server_artifacts(
        self, state: ServerState, run_dir: Path, seed: int, architecture: str | None = None
    ) -> None:
        if not isinstance(state, ArchitectureGroupsState):
            self.inner.save_server_artifacts(state, run_dir, seed, architecture)
            return
        for name, group in state.groups.items():
            self.inner.save_server_artifacts(group, run_dir, seed, name)


def _delegation(name: str, member: object) -> Callable[..., object] | property:
    """What the wrapper answers for the contract's ``name``: the wrapped method's own (a hook called on it, a
    property or class flag read from it)."""
    if inspect.isfunction(member) or isinstance(member, (classmethod, staticmethod)):

        def hook(self: ArchitectureGroups, *args: object, **kwargs: object) -> object:
            return getattr(self.inner, name)(*args, **kwargs)

        hook.__name__, hook.__qualname__ = name, f"ArchitectureGroups.{name}"
        hook.__doc__ = f"The wrapped method's ``{name}``."
        return hook
    return property(lambda self: getattr(self.inner, name), doc=f"The wrapped method's ``{name}``.")


def _delegate_the_contract() -> None:
    """Give :class:`ArchitectureGroups` every member of the contract it does not answer for itself."""
    members = contract()
    own = set(vars(ArchitectureGroups)) & set(members)
    listed = set(ArchitectureGroups.PER_ARCHITECTURE)
    if own != listed:  # an override without its reason, or a reason without its override
        raise TypeError(f"ArchitectureGroups defines {sorted(own)} of the contract but lists {sorted(listed)}")
    for name, member in members.items():
        if name not in own:
            setattr(ArchitectureGroups, name, _delegation(name, member))


_delegate_the_contract()


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
