"""A worker's evaluations of one client: the base model on its test split (the base row) and, during a federated
phase, its current model after a round on the test examples it has seen so far and on a sample of the other
clients' (``split: others``); and the one constructor of a client's ``results.jsonl`` records."""

from __future__ import annotations

from collections.abc import Mapping

from fedpeft import continual
from fedpeft.continual import OthersSample, memory_view
from fedpeft.core.config import ExperimentConfig
from fedpeft.core.records import ResultRecord, result_record
from fedpeft.core.seeds import client_seed
from fedpeft.core.types import Metrics, ServerState
from fedpeft.data.types import ClientData, FederatedData
from fedpeft.federation import Federation
from fedpeft.methods.base import Budget, Method
from fedpeft.models.runtime import ClientModel
from fedpeft.worker.bases import BaseModels
from fedpeft.worker.states import ClientStates

BASE_LABEL = "base"  # the method label of the base row


def records_of(
    method: str,
    budget: Budget,
    client: ClientData,
    seed: int,
    round_: int | None,
    metrics: Metrics,
    split: str = "test",
) -> list[ResultRecord]:
    """Tidy ``results.jsonl`` records of one client's evaluation (or, with another ``split``, other facts)."""
    return [
        result_record(
            method,
            budget,
            pool=client.pool,
            client=client.client_id,
            group=client.group,
            seed=seed,
            round_=round_,
            split=split,
            metric=name,
            value=value,
        )
        for name, value in metrics.items()
    ]


class Evaluation:
    """The evaluations of a worker's clients outside personalization.

    Args:
        cfg: the experiment's config (budgets, ``eval`` settings, the data seed).
        data: the federation (every client, for the "Others" sample).
        methods: the worker's methods by label.
        federation: the worker's architectures (the runtime of each client's).
        bases: the base models put in place.
        states: the clients' states between rounds.
    """

    def __init__(
        self,
        cfg: ExperimentConfig,
        data: FederatedData,
        methods: Mapping[str, Method],
        federation: Federation,
        bases: BaseModels,
        states: ClientStates,
    ) -> None:
        self.cfg = cfg
        self.data = data
        self.clients = {c.client_id: c for c in data.clients}
        self.methods = methods
        self.federation = federation
        self.bases = bases
        self.states = states
        self._others: OthersSample | None = None  # the round evaluation's "Others" sample, drawn on first use

    def evaluate_base(self, seed: int, client_id: str) -> list[ResultRecord]:
        """The base model (no personalization) on one client's test split (the client's own, if it has one)."""
        self.bases.use_client_base(seed, client_id)
        client = self.clients[client_id]
        runtime = self.federation.runtime_of(client_id)
        runtime.install(ClientModel())
        return records_of(BASE_LABEL, None, client, seed, None, runtime.evaluate(client.test))

    def evaluate_round(
        self, label: str, seed: int, round_: int, client_id: str, state: ServerState
    ) -> list[ResultRecord]:
        """A client's current model after ``round_`` completed rounds of a federated phase: accuracy on its own
        test examples seen so far (``split: test``; for generation also METEOR, ROUGE-1 and ROUGE-L) and on the
        other clients' (``split: others``)."""
        method = self.methods[label]
        self.bases.use_base(seed)
        rounds = method.rounds
        client = memory_view(self.clients[client_id], max(round_ - 1, 0), rounds)
        budget = self.cfg.budgets[0] if method.uses_budget else None
        pseed = client_seed(seed, method.name, "evaluate", round_, client_id)
        client_state = self.states.store(label, seed).get(client_id)
        runtime = self.federation.runtime_of(client_id)
        model = method.personalize(runtime, client, state, client_state, budget, pseed)
        runtime.install(model, seed=pseed)
        own = continual.seen_test(self.clients[client_id], round_, rounds)
        others = self._others_sample().without(client_id)
        records = records_of(label, budget, client, seed, round_, continual.scores(runtime, own))
        if others:
            value = {"accuracy": continual.accuracy(runtime, others)}
            records += records_of(label, budget, client, seed, round_, value, split=continual.OTHERS_SPLIT)
        return records

    def _others_sample(self) -> OthersSample:
        """The "Others" sample of the round evaluation, drawn once for this worker (its clients do not change)."""
        if self._others is None:
            evaluation = self.cfg.eval
            self._others = OthersSample(
                self.data.clients, evaluation.others_per_client, self.cfg.data.seed, evaluation.others_clients
            )
        return self._others
