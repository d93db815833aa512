"""RoLoRA: federated LoRA by alternating optimization: rounds train and average only B, then only A.

S. Chen, Y. Guo, Y. Ju, H. Dalal, Z. Zhu, A. Khisti, "Robust Federated Finetuning of LLMs via Alternating
Optimization of LoRA", NeurIPS 2025, https://arxiv.org/abs/2502.01755.

In a B round every client freezes the global A and trains B (and the task head); the server averages the uploaded
B by data size and keeps A, so the global product is sum_k p_k B_k A exactly. In an A round B is frozen and A
trained and averaged, B (sum_k p_k A_k) likewise exact. Rounds alternate, starting with B (``first``): with the
usual LoRA initialization (B = 0) the gradient of A is zero until B has moved. A client uploads only the factor
it trained (and the head): half of the LoRA bytes of FedIT. Local training builds a fresh AdamW every round over
the round's trainable tensors only, so Adam's step count and moments are per round and per factor: the first step
of every round (of B in B rounds, of A in A rounds) is bias-corrected as step 1, and no moment carries over from
the factor's previous round. Every client keeps the global adapter, optionally fine-tuned locally for
``finetune_epochs`` epochs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import ClassVar

import torch

from fedpeft.core.seeds import derive_seed
from fedpeft.core.types import ClientUpdate, Metrics, Payload, ServerState, StateDict
from fedpeft.data.types import ClientData
from fedpeft.methods.base import Budget, Method, fine_tune_if_asked, local_training, lora_spec, method_server_step
from fedpeft.methods.rolora_config import Factor, RoLoraConfig
from fedpeft.models.runtime import ClientModel, LoraSpec, ModelRuntime


@dataclasses.dataclass
class RoLoraState(ServerState):
    """The global adapter (``tensors``: A, B and the head)."""


def frozen_in(factor: str, key: str) -> bool:
    """Whether tensor ``key`` stays frozen (and home) in a round that trains ``factor``: the other factor."""
    other = "B" if factor == "A" else "A"
    return f".lora_{other}." in key


class RoLora(Method[RoLoraConfig, RoLoraState, None]):
    """Alternating optimization of LoRA: even rounds train B (A frozen), odd rounds A (B frozen)."""

    name = "rolora"
    Config: ClassVar[type[RoLoraConfig]] = RoLoraConfig

    def spec(self, runtime: ModelRuntime) -> LoraSpec:
        return lora_spec(runtime, self.cfg.rank, self.cfg.alpha, self.cfg.dropout, self.cfg.targets)

    def factor(self, round_: int) -> Factor:
        """The factor trained and averaged in ``round_`` (0-based): ``first`` in even rounds, the other in odd."""
        other: Factor = "A" if self.cfg.first == "B" else "B"
        return self.cfg.first if round_ % 2 == 0 else other

    def init_server(self, runtime: ModelRuntime, seed: int) -> RoLoraState:
        runtime.install(ClientModel(lora=self.spec(runtime)), seed=derive_seed(seed, self.name, "init"))
        return RoLoraState(tensors=runtime.adapter_state())

    def payload(self, state: RoLoraState, client_id: str) -> Payload:
        return Payload(tensors=state.tensors, config={"factor": self.factor(state.round)})

    def update_spec(self, payload: Payload) -> dict[str, torch.Size]:
        """The trained factor and the head."""
        factor = str(payload.config["factor"])
        return {k: v.shape for k, v in payload.tensors.items() if not frozen_in(factor, k)}

    def client_update(
        self, runtime: ModelRuntime, client: ClientData, payload: Payload, client_state: None, seed: int
    ) -> tuple[ClientUpdate, None]:
        factor = str(payload.config["factor"])
        runtime.install(ClientModel(lora=self.spec(runtime), adapter=payload.tensors), seed=seed)
        trainable = {n: p for n, p in runtime.adapter_parameters().items() if not frozen_in(factor, n)}
        metrics = runtime.train(client.train, local_training(self.cfg, seed), trainable)
        upload = {k: v for k, v in runtime.adapter_state().items() if not frozen_in(factor, k)}
        return ClientUpdate(client.client_id, upload, float(len(client.train)), metrics), None

    def aggregate(self, state: RoLoraState, updates: Iterable[ClientUpdate]) -> tuple[RoLoraState, Metrics]:
        step = method_server_step(self)
        assert step is not None  # the weighted mean of the trained factor
        result = step(state, updates)
        if not result.tensors:
            return state, result.metrics
        tensors: StateDict = {**state.tensors, **result.tensors}
        state = dataclasses.replace(state, tensors=tensors, server_optimizer=result.moments)
        return state, result.metrics

    def personalize(
        self,
        runtime: ModelRuntime,
        client: ClientData,
        state: RoLoraState,
        client_state: None,
        budget: Budget,
        seed: int,
    ) -> ClientModel:
        model = ClientModel(lora=self.spec(runtime), adapter=state.tensors)
        return fine_tune_if_asked(runtime, model, client.train, self.cfg, seed=seed)
