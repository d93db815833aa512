"""Federated distillation on public data, shared by the PerAda, TAKFL and FedMKT baselines.

Logits of different architectures cannot be averaged when their vocabularies differ, so knowledge travels as
hard targets (sequence-level distillation, Kim & Rush 2016): on a public subset chosen by the server each round,
a client uploads its model's answers (generated text, or class labels) and its loss on the public example's own
reference answer. The server turns the uploads into one target per example (:func:`vote` over teachers, or the
answer of the teacher with the lowest loss, :func:`lowest_loss`) and fine-tunes an architecture's global adapter
on the public prompts with those targets (:func:`distill`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, ClassVar, TypedDict, TypeVar

import torch

from fedpeft.adapters.hooked import HookedAdapter
from fedpeft.core.seeds import derive_seed
from fedpeft.core.types import ClientUpdate, Metrics, Payload, StateDict
from fedpeft.data.types import ClientData, Example
from fedpeft.federation import federation_of
from fedpeft.merging.server_step import metric_mean, weighted_mean
from fedpeft.methods.families.branched import (
    BranchedLoraBase,
    BranchedState,
    architecture_keys,
    install_adapter,
    is_shared_key,
)
from fedpeft.models.runtime import ModelRuntime
from fedpeft.settings.methods import DistillationConfig
from fedpeft.training import TrainArgs, labelled_tail

if TYPE_CHECKING:
    from fedpeft.federation import Federation

Answer = int | str
"""A model's answer to an example: a class label (classification) or a generated response (generation)."""


class Knowledge(TypedDict, total=False):
    """What a client uploads besides its tensors (none in a round without public examples): its answers on the
    round's public examples and its loss on their reference answers, one per example."""

    answers: list[Answer]
    losses: torch.Tensor


def public_indices(size: int, count: int, seed: int, round_: int) -> list[int]:
    """The public examples of one round: ``count`` of ``size``, drawn from (seed, round)."""
    generator = torch.Generator().manual_seed(derive_seed(seed, "public", round_))
    return sorted(torch.randperm(size, generator=generator)[: min(count, size)].tolist())


@torch.no_grad()
def example_losses(runtime: ModelRuntime, examples: list[Example], batch_size: int = 16) -> torch.Tensor:
    """The installed model's loss on each example's own reference answer (label or response)."""
    model = runtime._model()
    was_training = model.training
    model.eval()
    losses = []
    try:
        with runtime.forward_context():
            for start in range(0, len(examples), batch_size):
                batch = {
                    k: v.to(runtime.device) for k, v in runtime.encode(examples[start : start + batch_size]).items()
                }
                batch = labelled_tail(model, batch)
                labels = batch.pop("labels")
                logits = model(**batch).logits
                if logits.dim() == 3:  # next-token loss, averaged over each example's answer tokens
                    logits, labels = logits[:, :-1], labels[:, 1:]
                    token = torch.nn.functional.cross_entropy(
                        logits.transpose(1, 2), labels, ignore_index=-100, reduction="none"
                    )
                    mask = (labels != -100).float()
                    losses.append((token * mask).sum(1) / mask.sum(1).clamp_min(1.0))
                else:
                    losses.append(torch.nn.functional.cross_entropy(logits, labels, reduction="none"))
    finally:
        model.train(was_training)
    return torch.cat(losses).float().cpu()


def knowledge(runtime: ModelRuntime, examples: list[Example]) -> Knowledge:
    """What a client uploads: its answers on ``examples`` and its loss on their reference answers."""
    return {"answers": list(runtime.predict(examples)), "losses": example_losses(runtime, examples)}


def vote(uploads: list[Knowledge]) -> list[Answer]:
    """Per example, the answer most teachers give (ties: the one whose teachers have the lower mean loss)."""
    targets = []
    for index in range(len(uploads[0]["answers"])):
        given: dict[Answer, list[float]] = {}
        for upload in uploads:
            given.setdefault(upload["answers"][index], []).append(float(upload["losses"][index]))
        targets.append(max(given, key=lambda answer: (len(given[answer]), -sum(given[answer]) / len(given[answer]))))
    return targets


def lowest_loss(uploads: list[Knowledge]) -> list[Answer]:
    """Per example, the answer of the teacher with the lowest loss on the reference answer."""
    targets = []
    for index in range(len(uploads[0]["answers"])):
        best = min(uploads, key=partial(_loss_at, index))
        targets.append(best["answers"][index])
    return targets


def _loss_at(index: int, upload: Knowledge) -> float:
    return float(upload["losses"][index])


def with_targets(examples: list[Example], targets: list[Answer], task: str) -> list[Example]:
    """The public examples with their answers replaced by the distillation targets."""
    key = "label" if task == "classification" else "response"
    return [{**ex, key: target} for ex, target in zip(examples, targets, strict=True)]


def distill(
    runtime: ModelRuntime,
    adapter: HookedAdapter,
    branch: str,
    examples: list[Example],
    *,
    steps: int,
    lr: float,
    batch_size: int,
    seed: int,
) -> Metrics:
    """Fine-tune ``branch`` of ``adapter`` (alone) on the target-labelled public ``examples``."""
    adapter.active = (branch,)
    install_adapter(runtime, adapter)
    params = adapter.trainable([f"{branch}/"])
    try:
        return runtime.train(examples, TrainArgs(lr=lr, batch_size=batch_size, seed=seed, steps=steps), params)
    finally:
        runtime.detach_extension()


@dataclass
class DistillationState(BranchedState):
    """:class:`BranchedState` plus the run's seed (the rounds' public examples, the distillations) and the
    number of public examples."""

    seed: int = 0
    public_size: int = 0


DistillationConfigT = TypeVar("DistillationConfigT", bound=DistillationConfig)


class PublicDistillation(BranchedLoraBase[DistillationConfigT, DistillationState]):
    """A global LoRA per architecture (FedAvg within the group) improved on the server by distillation from the
    clients' answers on public data; subclasses choose the targets (:meth:`distill_targets`).

    A client trains the global branch and answers the round's public examples (:meth:`train_shared`); that is
    the whole client update unless a subclass adds a personal step."""

    shared: ClassVar[str] = "global"  # the branch the server averages and distils (never None here)
    federation: Federation | None = None

    def bind_federation(self, federation: Federation) -> None:
        """The server's federation (runtimes and public data), for distilling in :meth:`aggregate`."""
        self.federation = federation

    def init_server(self, runtime: ModelRuntime, seed: int) -> DistillationState:
        population, federation = self.population(runtime, seed)
        self.federation = federation
        return DistillationState(
            tensors=population,
            assignment=dict(federation.assignment),
            architectures=list(federation.names),
            seed=seed,
            public_size=len(federation.public),
        )

    def payload(self, state: DistillationState, client_id: str) -> Payload:
        payload = super().payload(state, client_id)
        payload.config["public"] = public_indices(state.public_size, self.cfg.kd_samples, state.seed, state.round)
        return payload

    def public_knowledge(self, runtime: ModelRuntime, adapter: HookedAdapter, payload: Payload) -> Knowledge:
        """The client's answers and losses on this round's public examples, with its shared branch."""
        indices = payload.config.get("public") or []
        if not indices:
            return {}
        public = federation_of(runtime).public
        adapter.active = (self.shared,)
        install_adapter(runtime, adapter)
        try:
            return knowledge(runtime, [public[i] for i in indices])
        finally:
            runtime.detach_extension()

    def train_shared(
        self,
        runtime: ModelRuntime,
        client: ClientData,
        payload: Payload,
        client_state: dict[str, StateDict] | None,
        seed: int,
    ) -> tuple[HookedAdapter, Metrics, Knowledge]:
        """The client's adapter with its global branch trained on the client's data, the training metrics, and
        the client's answers on the round's public examples."""
        adapter = self.client_adapter(runtime, payload.tensors, client_state)
        metrics = self.train_branches(runtime, adapter, client.train, ("global",), ("global",), seed)
        return adapter, metrics, self.public_knowledge(runtime, adapter, payload)

    def client_update(
        self,
        runtime: ModelRuntime,
        client: ClientData,
        payload: Payload,
        client_state: dict[str, StateDict] | None,
        seed: int,
    ) -> tuple[ClientUpdate, dict[str, StateDict]]:
        """Train the global branch, upload it with the answers on the public examples, keep it."""
        adapter, metrics, answers = self.train_shared(runtime, client, payload, client_state, seed)
        return self.shared_update(client, adapter, metrics, **answers), self.client_state(adapter)

    def distill_targets(self, architecture: str, by_architecture: dict[str, list[Knowledge]]) -> list[list[Answer]]:
        """Target lists to distil ``architecture``'s global adapter from; one list: plain distillation, several:
        one distillation each, merged by averaging their changes (task arithmetic)."""
        raise NotImplementedError

    def aggregate(self, state: DistillationState, updates: Iterable[ClientUpdate]) -> tuple[DistillationState, Metrics]:
        updates = list(updates)
        tensors, metrics = weighted_mean(updates), metric_mean(updates)
        if not tensors:
            return state, metrics
        by_architecture: dict[str, list[Knowledge]] = {}
        for update in updates:
            if update.extras.get("answers") is not None:
                upload = Knowledge(answers=update.extras["answers"], losses=update.extras["losses"])
                by_architecture.setdefault(self.architecture(state, update.client_id), []).append(upload)
        if by_architecture and self.federation is not None:
            cfg = self.cfg
            indices = public_indices(state.public_size, cfg.kd_samples, state.seed, state.round)
            examples = [self.federation.public[i] for i in indices]
            for architecture in self.federation.names:
                start = architecture_keys(tensors, architecture)
                start = {k: v for k, v in start.items() if not is_shared_key(k)}
                if not start:
                    continue
                runtime = self.federation.runtime(architecture)
                changes = []
                for number, targets in enumerate(self.distill_targets(architecture, by_architecture)):
                    adapter = self.adapter(runtime, 0)
                    adapter.load_branch(self.shared, start)
                    seed = derive_seed(state.seed, self.name, "distill", state.round, architecture, number)
                    distill(
                        runtime,
                        adapter,
                        self.shared,
                        with_targets(examples, targets, runtime.task),
                        steps=cfg.kd_steps,
                        lr=cfg.kd_lr or cfg.lr,
                        batch_size=cfg.kd_batch_size,
                        seed=seed,
                    )
                    changes.append({k: v - start[k] for k, v in adapter.branch(self.shared).items() if k in start})
                for key in start:
                    tensors[key] = start[key] + sum(change[key] for change in changes) / max(len(changes), 1)
            metrics["distilled"] = 1.0
        return dataclasses.replace(state, tensors=tensors), metrics
