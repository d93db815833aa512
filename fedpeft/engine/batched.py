"""Several clients in one batch (``engine.batch_clients``): the local engine's way of running the clients of a
batchable method (:attr:`fedpeft.methods.base.Method.batchable_clients`) in groups of K.

A group's LoRA trainings run in one forward/backward per step (:func:`fedpeft.models.multi_lora.train_together`);
everything else of a client's work runs through the worker's own steps, the ones training a client alone runs
(:meth:`fedpeft.worker.ClientTraining.begin` and :meth:`~fedpeft.worker.ClientTraining.finish`: injected faults,
its base model, its state, what it sends and keeps moved to the CPU;
:meth:`~fedpeft.worker.Personalization.begin` and :meth:`~fedpeft.worker.Personalization.model_records`: its
evaluation, saving its adapter), so the two cannot drift apart. The results come back in client-id order, so the
records are those of training the clients one by one (within float rounding). A client whose work fails before
its training fails alone; a failed joint training fails its group.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from fedpeft.core.errors import UserError
from fedpeft.core.records import Budget, ResultRecord
from fedpeft.core.seeds import client_seed
from fedpeft.core.types import Metrics, Payload, ServerState, StateDict, TrainResult
from fedpeft.engine.rounds import ClientOutcome
from fedpeft.methods.base import trained_update
from fedpeft.models.multi_lora import LoraTraining, train_together
from fedpeft.models.runtime import ClientModel, ModelRuntime
from fedpeft.worker import ClientRound, Personalizing, Worker, state_at

Personalized = tuple[list[ResultRecord], float]  # what the worker's ``personalize`` returns for a client


def groups(client_ids: list[str], size: int) -> Iterator[list[str]]:
    """``client_ids`` in consecutive groups of ``size`` (the last one may be smaller)."""
    for start in range(0, len(client_ids), size):
        yield client_ids[start : start + size]


def train_group(runtime: ModelRuntime, jobs: list[LoraTraining]) -> Sequence[tuple[StateDict, Metrics] | Exception]:
    """The trained adapters and metrics of ``jobs``, trained together; if that fails, its error for each of them
    (a :class:`UserError`, a setting that cannot batch, ends the run instead)."""
    if not jobs:
        return []
    try:
        return train_together(runtime, jobs)
    except UserError:
        raise
    except Exception as err:
        return [err] * len(jobs)


def train_clients(
    worker: Worker, label: str, seed: int, round_: int, client_ids: list[str], payloads: list[Payload]
) -> list[TrainResult | Exception]:
    """:meth:`Worker.train` of each of ``client_ids`` (with its payload), their LoRA trainings in one batch: each
    client's round begins and finishes as one client's does (:meth:`ClientTraining.begin`,
    :meth:`ClientTraining.finish`), on the one base model they share (the runner refuses a base model per client)."""
    method = worker.methods[label]
    results: dict[str, TrainResult | Exception] = {}
    planned: dict[str, tuple[ClientRound, LoraTraining]] = {}
    for client_id, payload in zip(client_ids, payloads, strict=True):
        try:
            work = worker.training.begin(label, seed, round_, client_id, payload)
            job = method.client_training(work.runtime, work.client, payload, work.client_state, work.seed)
            if not job.examples:
                raise ValueError("no training examples")
            planned[client_id] = (work, job)
        except Exception as err:  # a failing client must not stop the others
            results[client_id] = err
    trained = train_group(worker.runtime, [job for _, job in planned.values()])
    for (client_id, (work, _)), outcome in zip(planned.items(), trained, strict=True):
        if isinstance(outcome, Exception):
            results[client_id] = outcome
            continue
        adapter, metrics = outcome
        try:
            update = trained_update(work.client, adapter, metrics)
            results[client_id] = worker.training.finish(work, update, work.client_state)
        except Exception as err:
            results[client_id] = err
    return [results[client_id] for client_id in client_ids]


def personalize_clients(
    worker: Worker,
    label: str,
    seed: int,
    client_ids: list[str],
    state: ServerState,
    *,
    save_adapters: bool = False,
    budget_states: dict[int, ServerState] | None = None,
) -> list[Personalized | Exception]:
    """:meth:`Worker.personalize` of each of ``client_ids``, the LoRA trainings of each budget in one batch; each
    client's seconds are its own work plus its share of the batches it trained in."""
    group = GroupPersonalization(worker, label, seed, state, budget_states)
    for client_id in client_ids:
        group.prepare(client_id)
    for budget in dict.fromkeys(b for ready in group.ready.values() for b in ready.budgets):
        group.train(budget)
    for client_id in client_ids:
        group.evaluate(client_id, save_adapters)
    return [group.results[client_id] for client_id in client_ids]


class GroupPersonalization:
    """The personalization of a group of clients, step by step: each client's preparation, each budget's
    trainings together, each client's evaluation; a client whose step fails keeps its error and leaves the group.
    A client begins as one client's personalization does (:meth:`Personalization.begin`)."""

    def __init__(
        self,
        worker: Worker,
        label: str,
        seed: int,
        state: ServerState,
        budget_states: dict[int, ServerState] | None,
    ) -> None:
        self.worker, self.label, self.seed = worker, label, seed
        self.method = worker.methods[label]
        self.state, self.budget_states = state, budget_states
        self.results: dict[str, Personalized | Exception] = {}
        self.ready: dict[str, Personalizing] = {}
        self.seconds: dict[str, float] = {}
        self.models: dict[tuple[str, Budget], ClientModel] = {}

    def prepare(self, client_id: str) -> None:
        """The work every budget of the client shares (:meth:`Personalization.begin`), timed."""
        try:
            ready = self.worker.personalization.begin(self.label, self.seed, client_id, self.state)
            self.ready[client_id], self.seconds[client_id] = ready, ready.seconds
        except Exception as err:
            self.results[client_id] = err

    def train(self, budget: Budget) -> None:
        """Every remaining client's model at ``budget``: the trainings together, a client without one alone."""
        method = self.method
        state = state_at(budget, self.state, self.budget_states)
        jobs: dict[str, LoraTraining] = {}
        for client_id, ready in self.ready.items():
            if client_id in self.results or budget not in ready.budgets:
                continue
            pseed = client_seed(self.seed, method.name, "personalize", budget, client_id)
            try:
                started = time.perf_counter()
                job = method.personal_training(ready.runtime, ready.client, state, ready.prepared, budget, pseed)
                if job is None:  # nothing to train: the method personalizes the client as it does alone
                    self.models[client_id, budget] = method.personalize(
                        ready.runtime, ready.client, state, ready.prepared, budget, pseed
                    )
                elif not job.examples:
                    raise ValueError("no training examples")
                else:
                    jobs[client_id] = job
                self.seconds[client_id] += time.perf_counter() - started
            except Exception as err:
                self.results[client_id] = err
        started = time.perf_counter()
        trained = train_group(self.worker.runtime, list(jobs.values()))
        share = (time.perf_counter() - started) / max(len(jobs), 1)
        for (client_id, job), outcome in zip(jobs.items(), trained, strict=True):
            if isinstance(outcome, Exception):
                self.results[client_id] = outcome
                continue
            self.models[client_id, budget] = ClientModel(lora=job.model.lora, adapter=outcome[0])
            self.seconds[client_id] += share

    def evaluate(self, client_id: str, save_adapters: bool) -> None:
        """The client's records at every budget (:meth:`Personalization.model_records`), unless a step failed."""
        if client_id in self.results:
            return
        try:
            records: list[ResultRecord] = []
            for budget in self.ready[client_id].budgets:
                model, state = self.models[client_id, budget], state_at(budget, self.state, self.budget_states)
                records += self.worker.personalization.model_records(
                    self.label, self.seed, client_id, budget, state, model, save_adapters
                )
            self.results[client_id] = (records, self.seconds[client_id])
        except Exception as err:
            self.results[client_id] = err


def batched_training(
    worker: Worker,
    size: int,
    label: str,
    seed: int,
    round_: int,
    client_ids: list[str],
    payload_of: Callable[[str], Payload],
) -> Iterator[ClientOutcome]:
    """The outcomes of a round's clients, trained ``size`` at a time, in client-id order; each client's seconds
    are its share of its group's."""
    for group in groups(client_ids, size):
        started = time.perf_counter()
        results = train_clients(worker, label, seed, round_, group, [payload_of(c) for c in group])
        share = (time.perf_counter() - started) / len(group)
        for client_id, result in zip(group, results, strict=True):
            yield ClientOutcome.of_training(client_id, result, share)


def batched_personalization(
    worker: Worker, size: int, client_ids: list[str], **kwargs: Any
) -> Iterator[tuple[str, Personalized | Exception]]:
    """The personalization of ``client_ids``, ``size`` at a time, in client-id order (a failure as its error)."""
    for group in groups(client_ids, size):
        yield from zip(group, personalize_clients(worker, client_ids=group, **kwargs), strict=True)
