"""FedEX-LoRA: FedAvg of the LoRA factors plus the aggregation residual folded into the frozen weights.

R. Singhal, K. Ponkshe, P. Vepakomma, "FedEx-LoRA: Exact Aggregation for Federated and Efficient Fine-Tuning of
Large Language Models", ACL 2025, https://arxiv.org/abs/2410.09432.

Clients train the global LoRA (A, B) on top of the current frozen weights W. The server averages A and B (and the
task head) with weights p_k, uniform 1/K over the round's K clients as the authors' code does (``weighting:
examples``: p_k = n_k / sum_j n_j, as FedIT), and adds the residual of that average to the weights:
W <- W + s (sum_k p_k B_k A_k - B_avg A_avg), s = alpha / r. The global model W + s B_avg A_avg then equals
W + s sum_k p_k B_k A_k: the exact mean of the clients' models. The server keeps the cumulative
residual of every module as one full-size tensor (``<module>.base_delta``), sent with the adapter, so any client
rebuilds the global model. Every client keeps the global model, merged into the weights, optionally fine-tuned
for ``finetune_epochs`` epochs (then the global adapter is trained on top of W0 + residual).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from typing import ClassVar

import torch

from fedpeft.core.seeds import derive_seed
from fedpeft.core.types import ClientUpdate, Metrics, Payload, ServerState, StateDict
from fedpeft.data.types import ClientData
from fedpeft.merging.server_step import metric_mean, weighted_mean
from fedpeft.methods.base import Budget, Method, local_training, lora_spec
from fedpeft.methods.families.folding import (
    A_SUFFIX,
    B_SUFFIX,
    add_deltas,
    delta_key,
    folded_weights,
    full_base,
    is_delta,
    lora_modules,
    lora_scaling,
    zero_deltas,
)
from fedpeft.methods.fedex_lora_config import FedExLoraConfig
from fedpeft.models.runtime import ClientModel, LoraSpec, ModelRuntime
from fedpeft.training import TrainArgs


@dataclasses.dataclass
class FedExLoraState(ServerState):
    """The averaged adapter (A, B, head) and every module's cumulative residual (``<module>.base_delta``), both in
    ``tensors``; ``residual_norm``: the Frobenius norm of the last round's residual over all modules."""

    residual_norm: float = 0.0


def adapter_of(tensors: StateDict) -> StateDict:
    """The adapter tensors (A, B, head) of a FedEX-LoRA state or payload, without the folded residuals."""
    return {k: v for k, v in tensors.items() if not is_delta(k)}


class FedExLora(Method[FedExLoraConfig, FedExLoraState, None]):
    """FedAvg of LoRA factors; the mean of the products minus the product of the means goes into the weights."""

    name = "fedex_lora"
    Config: ClassVar[type[FedExLoraConfig]] = FedExLoraConfig
    base_stage = True  # the shared base is the global model merged into the weights

    @property
    def scaling(self) -> float:
        return lora_scaling(self.cfg.alpha, self.cfg.rank)

    def spec(self, runtime: ModelRuntime) -> LoraSpec:
        return lora_spec(runtime, self.cfg.rank, self.cfg.alpha, self.cfg.dropout, self.cfg.targets)

    def init_server(self, runtime: ModelRuntime, seed: int) -> FedExLoraState:
        runtime.install(ClientModel(lora=self.spec(runtime)), seed=derive_seed(seed, self.name, "init"))
        adapter = runtime.adapter_state()
        return FedExLoraState(tensors={**adapter, **zero_deltas(runtime, lora_modules(adapter))})

    def update_spec(self, payload: Payload) -> dict[str, torch.Size]:
        """The adapter the client trained: the payload's tensors without the residuals."""
        return {k: v.shape for k, v in adapter_of(payload.tensors).items()}

    def client_update(
        self, runtime: ModelRuntime, client: ClientData, payload: Payload, client_state: None, seed: int
    ) -> tuple[ClientUpdate, None]:
        base = folded_weights(runtime, payload.tensors)
        runtime.install(ClientModel(base=base, lora=self.spec(runtime), adapter=adapter_of(payload.tensors)), seed=seed)
        metrics = runtime.train(client.train, local_training(self.cfg, seed))
        return ClientUpdate(client.client_id, runtime.adapter_state(), float(len(client.train)), metrics), None

    def client_weights(self, updates: list[ClientUpdate]) -> list[float]:
        """Each client's weight in the means of A, B, the head and the products, before normalizing by their sum:
        1 (``weighting: uniform``) or its training examples (``examples``)."""
        return [1.0 if self.cfg.weighting == "uniform" else float(u.weight) for u in updates]

    def aggregate(self, state: FedExLoraState, updates: Iterable[ClientUpdate]) -> tuple[FedExLoraState, Metrics]:
        received = list(updates)
        weights = self.client_weights(received)
        mean = weighted_mean(dataclasses.replace(u, weight=w) for u, w in zip(received, weights, strict=True))
        metrics, total = metric_mean(received), sum(weights)
        if not mean or total <= 0:
            return state, metrics
        residuals: dict[str, torch.Tensor] = {}
        for module in lora_modules(mean):
            a_key, b_key = module + A_SUFFIX, module + B_SUFFIX
            products = sum(
                (w / total) * (u.tensors[b_key].to(torch.float64) @ u.tensors[a_key].to(torch.float64))
                for u, w in zip(received, weights, strict=True)
            )
            # The product of the means the clients will receive (in their dtype), so the sum is exact for them.
            of_means = mean[b_key].to(torch.float64) @ mean[a_key].to(torch.float64)
            residuals[module] = self.scaling * (products - of_means)
        norm = math.sqrt(sum(float((r**2).sum()) for r in residuals.values()))
        metrics["residual_norm"] = norm
        tensors = {**add_deltas(state.tensors, residuals), **mean}
        return dataclasses.replace(state, tensors=tensors, residual_norm=norm), metrics

    def global_deltas(self, state: FedExLoraState) -> StateDict:
        """Every module's update of the global model in float64: cumulative residual + s B_avg A_avg."""
        out = {}
        for module in lora_modules(adapter_of(state.tensors)):
            product = state.tensors[module + B_SUFFIX].to(torch.float64) @ state.tensors[module + A_SUFFIX].to(
                torch.float64
            )
            out[delta_key(module)] = state.tensors[delta_key(module)].to(torch.float64) + self.scaling * product
        return out

    def global_weights(self, runtime: ModelRuntime, state: FedExLoraState) -> StateDict:
        """The base tensors the global model changes: W0 + residual + s B_avg A_avg, and the global head."""
        head = {k: v for k, v in adapter_of(state.tensors).items() if ".lora_A." not in k and ".lora_B." not in k}
        return folded_weights(runtime, {**head, **self.global_deltas(state)}, head=True)

    def export_base(self, runtime: ModelRuntime, state: FedExLoraState) -> StateDict:
        return full_base(runtime, self.global_weights(runtime, state))

    def personalize(
        self,
        runtime: ModelRuntime,
        client: ClientData,
        state: FedExLoraState,
        client_state: None,
        budget: Budget,
        seed: int,
    ) -> ClientModel:
        if self.cfg.finetune_epochs <= 0:
            return ClientModel(base=self.global_weights(runtime, state))
        base = folded_weights(runtime, state.tensors)
        spec = self.spec(runtime)
        runtime.install(ClientModel(base=base, lora=spec, adapter=adapter_of(state.tensors)), seed=seed)
        lr = self.cfg.finetune_lr or self.cfg.lr
        runtime.train(
            client.train, TrainArgs(lr=lr, batch_size=self.cfg.batch_size, seed=seed, epochs=self.cfg.finetune_epochs)
        )
        return ClientModel(base=base, lora=spec, adapter=runtime.adapter_state())
