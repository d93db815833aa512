"""FedIT: federated averaging of LoRA adapters.

FedIT — J. Zhang et al., "Towards Building the Federated GPT: Federated Instruction Tuning", ICASSP 2024,
https://arxiv.org/abs/2305.05644. Clients fine-tune the global LoRA locally; the server averages A and B
separately, weighted by data size. Registered as ``fedit`` (alias ``fedavg``).

Personalization: every client, seen or unseen, keeps the global adapter, optionally fine-tuned locally for
``finetune_epochs`` epochs (0 by default: plain FedIT).

An optional ``merge`` block (:class:`fedpeft.merging.MergeConfig`: operator, space, alpha, ...) replaces the
average by another merge of the uploaded adapters, e.g. ``merge: {operator: ties}`` is FedIT with TIES-Merging.
Without one, a robust ``aggregation`` rule or client-level ``dp`` may replace the average (docs/privacy.md), and a
``server_optimizer`` (FedAdam, FedYogi, FedAdagrad, FedAvgM) may step along it (docs/server-optimizers.md).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from typing import ClassVar, TypeVar

from fedpeft.core.seeds import derive_seed
from fedpeft.core.types import ClientUpdate, Metrics, Payload, ServerState, StateDict
from fedpeft.data.types import ClientData
from fedpeft.merging import MergeConfig, merge_lora_states
from fedpeft.merging.server_step import metric_mean
from fedpeft.methods.base import (
    Budget,
    FederatedLoraConfig,
    Method,
    fine_tune_job,
    fine_tuning,
    local_training,
    lora_spec,
    trained_update,
)
from fedpeft.methods.fedit_config import FedITConfig
from fedpeft.models.multi_lora import LoraTraining
from fedpeft.models.runtime import ClientModel, LoraSpec, ModelRuntime
from fedpeft.training import LossHook


@dataclass
class FedITState(ServerState):
    """FedIT's global adapter (``tensors``) and the run's seed, which seeds a merge operator's random drops."""

    seed: int = 0


LoraConfigT = TypeVar("LoraConfigT", bound=FederatedLoraConfig)
FedITConfigT = TypeVar("FedITConfigT", bound=FedITConfig)
FedITStateT = TypeVar("FedITStateT", bound=FedITState)


class FedITBase(Method[LoraConfigT, FedITStateT, None]):
    """The federated phase of FedIT, shared with the methods built on it (FedProx, Potara, ...): clients
    fine-tune the global LoRA, the server averages (or merges) what they upload."""

    def spec(self, runtime: ModelRuntime) -> LoraSpec:
        return lora_spec(runtime, self.cfg.rank, self.cfg.alpha, self.cfg.dropout, self.cfg.targets)

    @property
    def merge_config(self) -> MergeConfig | None:
        """The server's merge of the uploaded adapters (``None``: the streaming weighted mean)."""
        return None

    def initial_adapter(self, runtime: ModelRuntime, seed: int) -> StateDict:
        """The global adapter before the first round (fresh LoRA weights from the run's ``seed``)."""
        runtime.activate(self.spec(runtime))
        runtime.reset_adapter(derive_seed(seed, self.name, "init"))
        return runtime.adapter_state()

    def aggregate(self, state: FedITStateT, updates: Iterable[ClientUpdate]) -> tuple[FedITStateT, Metrics]:
        merge = self.merge_config
        if merge is None:
            return super().aggregate(state, updates)
        received = list(updates)
        metrics = metric_mean(received)
        if not received:
            return state, metrics
        rank = self.cfg.rank
        scaling = float(self.cfg.alpha if self.cfg.alpha is not None else 2 * rank) / rank
        tensors = merge_lora_states(
            [u.tensors for u in received],
            [u.weight for u in received],
            merge,
            scaling=scaling,
            seed=derive_seed(state.seed, self.name, "merge", state.round),
        )
        return dataclasses.replace(state, tensors=tensors), metrics

    def extra_loss(self, runtime: ModelRuntime, payload: Payload) -> LossHook | None:
        return None

    def client_training(
        self, runtime: ModelRuntime, client: ClientData, payload: Payload, client_state: None, seed: int
    ) -> LoraTraining:
        model = ClientModel(lora=self.spec(runtime), adapter=payload.tensors)
        lr = float(payload.config.get("lr", self.cfg.lr))  # a server-side schedule may set the round's lr
        return LoraTraining(model, client.train, local_training(self.cfg, seed, lr=lr))

    def client_update(
        self, runtime: ModelRuntime, client: ClientData, payload: Payload, client_state: None, seed: int
    ) -> tuple[ClientUpdate, None]:
        job = self.client_training(runtime, client, payload, client_state, seed)
        runtime.install(job.model, seed=job.seed)
        extra_loss = self.extra_loss(runtime, payload)  # built on the installed adapter (FedProx's anchors)
        metrics = runtime.train(job.examples, dataclasses.replace(job.args, extra_loss=extra_loss))
        return trained_update(client, runtime.adapter_state(), metrics), client_state


class FedIT(FedITBase[FedITConfigT, FedITState]):
    """FedAvg of LoRA A and B (and the task head) over the seen pool."""

    name = "fedit"
    Config: ClassVar[type[FedITConfig]] = FedITConfig
    batchable_clients = True

    @property
    def merge_config(self) -> MergeConfig | None:
        return self.cfg.merge

    def init_server(self, runtime: ModelRuntime, seed: int) -> FedITState:
        return FedITState(tensors=self.initial_adapter(runtime, seed), seed=seed)

    def personalize(
        self,
        runtime: ModelRuntime,
        client: ClientData,
        state: FedITState,
        client_state: None,
        budget: Budget,
        seed: int,
    ) -> ClientModel:
        job = self.personal_training(runtime, client, state, client_state, budget, seed)
        if job is None:  # plain FedIT: the client keeps the global adapter
            return ClientModel(lora=self.spec(runtime), adapter=state.tensors)
        return fine_tune_job(runtime, job)

    def personal_training(
        self,
        runtime: ModelRuntime,
        client: ClientData,
        state: FedITState,
        client_state: None,
        budget: Budget,
        seed: int,
    ) -> LoraTraining | None:
        model = ClientModel(lora=self.spec(runtime), adapter=state.tensors)
        return fine_tuning(model, client.train, self.cfg, seed=seed)


def _state_key(param_name: str, runtime: ModelRuntime) -> str:
    """PEFT parameter name -> key of ``get_peft_model_state_dict`` (adapter name dropped)."""
    assert runtime.active is not None
    key = runtime.active.key
    # The task head is a PEFT ``modules_to_save`` copy: ``classifier.modules_to_save.<adapter>.weight``.
    return param_name.replace(f".modules_to_save.{key}", "").replace(f".{key}", "")
