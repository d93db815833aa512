"""A client's personalization at each of its budgets: its base model put in place and the work its budgets share
prepared (:meth:`Personalization.begin`), then per budget its personalized model built from the server state of
that budget, evaluated with its variants and its adapter saved if asked (:meth:`Personalization.model_records`).
The batched engine personalizes several clients at once between the same two steps (:mod:`fedpeft.engine.batched`)."""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from fedpeft.core.config import ExperimentConfig
from fedpeft.core.io import write_text_atomic
from fedpeft.core.records import ResultRecord
from fedpeft.core.seeds import client_seed
from fedpeft.core.types import ServerState
from fedpeft.data.types import ClientData
from fedpeft.federation import Federation
from fedpeft.methods.base import Budget, Method
from fedpeft.models.runtime import ClientModel, ModelRuntime
from fedpeft.worker.bases import BaseModels, same_tensors
from fedpeft.worker.evaluation import records_of
from fedpeft.worker.files import SavedAdapters, adapter_dir
from fedpeft.worker.states import ClientStates


@runtime_checkable
class SavableExtension(Protocol):
    """An adapter PEFT lacks (PQ-LoRA, gated branches) that writes itself to a directory."""

    def save(self, directory: Path) -> Path: ...


@dataclasses.dataclass
class Personalizing:
    """A client ready to be personalized at each of its budgets (:meth:`Personalization.begin`).

    Attributes:
        client: the client.
        runtime: the runtime of its architecture, its base model in place.
        prepared: what :meth:`Method.prepare_personalization` gave it, shared by its budgets.
        budgets: the budgets it is personalized at.
        seconds: the time its preparation took.
    """

    client: ClientData
    runtime: ModelRuntime
    prepared: Any
    budgets: list[Budget]
    seconds: float


def state_at(budget: Budget, state: ServerState, budget_states: dict[int, ServerState] | None) -> ServerState:
    """The server state a client personalizes from at ``budget``: the budget's own federated phase's, for a method
    with one per budget (``budget_states``), else ``state``."""
    return budget_states[budget] if budget_states and isinstance(budget, int) else state


class Personalization:
    """The personalization of a worker's clients, and the evaluation of what it gives.

    Args:
        cfg: the experiment's config (its budgets).
        run_dir: the run directory (a method's client artifacts, adapters PEFT lacks).
        methods: the worker's methods by label.
        clients: every client by id.
        federation: the worker's architectures (the runtime of each client's).
        bases: the base models put in place.
        states: the clients' states between rounds.
        adapters: where personalized adapters are saved.
    """

    def __init__(
        self,
        cfg: ExperimentConfig,
        run_dir: Path,
        methods: Mapping[str, Method],
        clients: Mapping[str, ClientData],
        federation: Federation,
        bases: BaseModels,
        states: ClientStates,
        adapters: SavedAdapters,
    ) -> None:
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.methods = methods
        self.clients = clients
        self.federation = federation
        self.bases = bases
        self.states = states
        self.adapters = adapters

    def personalize(
        self,
        label: str,
        seed: int,
        client_id: str,
        state: ServerState,
        *,
        save_adapters: bool = False,
        budget_states: dict[int, ServerState] | None = None,
    ) -> tuple[list[ResultRecord], float]:
        """Personalize one client at every budget of the method and evaluate it.

        ``budget_states`` holds the server state of each budget for methods with one federated phase per budget.
        Returns the records and the seconds spent personalizing (evaluation excluded).
        """
        method = self.methods[label]
        ready = self.begin(label, seed, client_id, state)
        records: list[ResultRecord] = []
        seconds = ready.seconds
        for budget in ready.budgets:
            pseed = client_seed(seed, method.name, "personalize", budget, client_id)
            budget_state = state_at(budget, state, budget_states)
            started = time.perf_counter()
            model = method.personalize(ready.runtime, ready.client, budget_state, ready.prepared, budget, pseed)
            seconds += time.perf_counter() - started
            records += self.model_records(label, seed, client_id, budget, budget_state, model, save_adapters)
        return records, seconds

    def begin(self, label: str, seed: int, client_id: str, state: ServerState) -> Personalizing:
        """Everything of a client's personalization before its budgets: its base model put in place and the work
        every budget shares (:meth:`Method.prepare_personalization`, e.g. BayesTune's rank scales), timed, its
        artifacts saved."""
        method = self.methods[label]
        self.bases.use_client_base(seed, client_id)
        client = self.clients[client_id]
        runtime = self.federation.runtime_of(client_id)
        started = time.perf_counter()
        pseed = client_seed(seed, method.name, "prepare", None, client_id)
        prepared = method.prepare_personalization(
            runtime, client, state, self.states.store(label, seed).get(client_id), pseed
        )
        seconds = time.perf_counter() - started
        method.save_client_artifacts(prepared, client, self.run_dir, label, seed)
        return Personalizing(client, runtime, prepared, method.budgets_of(client, self.cfg.budgets), seconds)

    def model_records(
        self,
        label: str,
        seed: int,
        client_id: str,
        budget: Budget,
        state: ServerState,
        model: ClientModel,
        save_adapters: bool,
    ) -> list[ResultRecord]:
        """Evaluate one client's personalized ``model`` at ``budget`` (from the server ``state`` of that budget),
        its variants too, save its adapter if asked; returns the records (:meth:`personalize`'s, per budget)."""
        method = self.methods[label]
        client = self.clients[client_id]
        runtime = self.federation.runtime_of(client_id)
        rounds = method.rounds if method.federated else None
        pseed = client_seed(seed, method.name, "personalize", budget, client_id)
        metrics = method.evaluate(runtime, client, model, pseed)
        records = records_of(label, budget, client, seed, rounds, metrics)
        if save_adapters and model.lora is not None:
            shared = self._is_shared(model, state, runtime)
            target = self.adapters.save(label, budget, client_id, shared=shared)
            if model.routing is not None:  # how a mixture-of-experts model runs this adapter
                write_text_atomic(target / "routing.json", json.dumps(dataclasses.asdict(model.routing)) + "\n")
        elif save_adapters and isinstance(model.extension, SavableExtension):  # adapters PEFT lacks
            model.extension.save(adapter_dir(self.run_dir, label, budget, client_id))
        records += records_of(label, budget, client, seed, rounds, model.info, split="personalize")
        for name, variant in model.variants.items():
            runtime.install(variant, seed=pseed)
            metrics = runtime.evaluate(client.test)
            records += records_of(f"{label}-{name}", budget, client, seed, rounds, metrics)
        return records

    def _is_shared(self, model: ClientModel, state: ServerState, runtime: ModelRuntime) -> bool:
        """Whether the client's personalized model is the server's global adapter as it is (FedIT or FedProx
        without fine-tuning): the same for every client, so saved once. Decided on content: the active adapter's
        tensors equal ``state.tensors`` (same names, dtypes, shapes and values), on the shared base model."""
        if model.base is not None or model.extension is not None or self.bases.per_client_base or not state.tensors:
            return False
        if model.routing is not None:  # how the client runs the adapter (e.g. FLAME's learned rescaler) is its own
            return False
        return same_tensors(runtime.adapter_state(), state.tensors)
