"""A client's local work in a federated round: the injected faults that strike it, its base model, data, state and
seed set up (:meth:`ClientTraining.begin`), its method's ``client_update``, then its update and new state kept and
handed back as the faults leave them (:meth:`ClientTraining.finish`). The batched engine runs the method's part for
several clients at once between the same two steps (:mod:`fedpeft.engine.batched`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from fedpeft.continual import memory_view
from fedpeft.core.config import BASE_STAGE_LABEL, ExperimentConfig
from fedpeft.core.faults import FaultConfig, before_work, corrupt, reaching_faults
from fedpeft.core.seeds import client_seed
from fedpeft.core.stores import ClientStateStore
from fedpeft.core.types import ClientUpdate, Payload, TrainResult, on_cpu
from fedpeft.data.types import ClientData
from fedpeft.federation import Federation
from fedpeft.methods.base import Method
from fedpeft.models.runtime import ModelRuntime
from fedpeft.worker.bases import BaseModels
from fedpeft.worker.states import ClientStates


@dataclasses.dataclass
class ClientRound:
    """One client's round of local work, set up by :meth:`ClientTraining.begin` and closed by
    :meth:`ClientTraining.finish`; what the method computes between the two is the only part that differs between
    training one client (:meth:`ClientTraining.train`) and a batch of them (:mod:`fedpeft.engine.batched`).

    Attributes:
        client: the client as it trains this round (a stream's episodic memory so far).
        runtime: the runtime of its architecture, its base model in place.
        payload: what the server sent it.
        client_state: its own state from earlier rounds (``None``: none yet).
        seed: its seed of this round.
        round_: the round (from 0).
        store: where its new state is kept.
        faults: the injected faults that strike it this round.
    """

    client: ClientData
    runtime: ModelRuntime
    payload: Payload
    client_state: Any
    seed: int
    round_: int
    store: ClientStateStore
    faults: list[FaultConfig]


class ClientTraining:
    """The clients' local work of a worker's federated rounds.

    Args:
        cfg: the experiment's config (its injected faults).
        methods: the worker's methods by label.
        clients: every client by id.
        federation: the worker's architectures (the runtime of each client's).
        bases: the base models put in place.
        states: the clients' states between rounds.
    """

    def __init__(
        self,
        cfg: ExperimentConfig,
        methods: Mapping[str, Method],
        clients: Mapping[str, ClientData],
        federation: Federation,
        bases: BaseModels,
        states: ClientStates,
    ) -> None:
        self.cfg = cfg
        self.methods = methods
        self.clients = clients
        self.federation = federation
        self.bases = bases
        self.states = states

    def train(self, label: str, seed: int, round_: int, client_id: str, payload: Payload) -> TrainResult:
        """One client's local work in one federated round (with the config's injected faults, if any strike):
        its update, and the faults that struck it."""
        work = self.begin(label, seed, round_, client_id, payload)
        update, client_state = self.methods[label].client_update(
            work.runtime, work.client, payload, work.client_state, work.seed
        )
        return self.finish(work, update, client_state)

    def begin(self, label: str, seed: int, round_: int, client_id: str, payload: Payload) -> ClientRound:
        """Everything of a client's round before its method's work: the injected faults that strike it (one that
        crashes or delays the client does so here), its base model put in place, its data, state and seed."""
        faults = [fault for fault in self.cfg.faults if fault.applies(label, client_id, round_)]
        before_work(faults)
        method = self.methods[label]
        if label == BASE_STAGE_LABEL:
            self.bases.use_base(None)
        else:
            self.bases.use_client_base(seed, client_id)
        store = self.states.store(label, seed)
        return ClientRound(
            client=memory_view(self.clients[client_id], round_, method.rounds),
            runtime=self.federation.runtime_of(client_id),
            payload=payload,
            client_state=store.get(client_id),
            seed=client_seed(seed, method.name, "train", round_, client_id),
            round_=round_,
            store=store,
            faults=faults,
        )

    def finish(self, work: ClientRound, update: ClientUpdate, client_state: Any) -> TrainResult:
        """Everything of a client's round after its method's work: its update and new state moved to the CPU, the
        state kept, the update as the injected faults leave it."""
        if work.runtime.device.type != "cpu":  # what travels and stays between rounds lives on the CPU
            update, client_state = on_cpu((update, client_state))
        if client_state is not None:
            work.store.put(work.client.client_id, client_state, work.round_)
        return TrainResult(corrupt(work.faults, update, work.payload), reaching_faults(work.faults))
