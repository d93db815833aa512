"""FLAME: resource-adaptive federated LoRA on a sparse mixture of experts.

K. Le, T. Tran, T. Hua, N. V. Chawla, "FLAME: Towards Federated Fine-Tuning Large Language Models Through
Adaptive SMoE", 2025, https://arxiv.org/abs/2506.16600.

Every client trains the full global LoRA (rank 20 on attention and on every expert) and adapts its compute by
the number of experts its router activates per token: its tier's top-k. In each MoE layer the client computes
h = s_i * sum_j TopK(p, k_i)_j (W^j x + B^j A^j x) with a scalar rescaler s_i (``rescaler``: ``learned`` from
1.0 or k / k_i, trained with the LoRA by the same Adam at the LoRA's learning rate unless ``rescaler_lr`` is
set; ``static`` k / k_i; ``none``), which stays on the client. The client uploads its LoRA, |D_i| and, per
layer and expert, the number of tokens routed to the expert during local training. The server averages expert
j's LoRA with weights gamma_i^j = (f_i^j)^t * |D_i|, f = the token-level activation frequency (tokens routed to
j / tokens the layer processed), in log space; an expert no sampled client activated keeps its previous value;
attention LoRA is averaged by |D_i| (FedAvg). t = 0 is FedAvg.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import TypedDict

import torch

from fedpeft.adapters.expert_lora import (
    LogWeightedMean,
    activation_log_weights,
    join_a,
    join_b,
    module_key,
    split_a,
    split_b,
)
from fedpeft.core.errors import UserError
from fedpeft.core.records import Budget
from fedpeft.core.seeds import derive_seed
from fedpeft.core.types import ClientUpdate, Metrics, Payload
from fedpeft.data.types import ClientData
from fedpeft.methods.families.tier_aggregation import PlainMean, mean_metrics
from fedpeft.methods.families.tiered import TierConfig, TieredMethod, TieredState
from fedpeft.methods.flame_config import FlameConfig
from fedpeft.models.moe import MoeControl
from fedpeft.models.runtime import ClientModel, ModelRuntime

COUNTS = "expert_counts"
TOKENS = "expert_tokens"


class FlameClientState(TypedDict):
    """What a FLAME client keeps between rounds: its rescaler s_i."""

    rescaler: float


class Flame(TieredMethod[FlameConfig, FlameClientState]):
    """Full-rank expert LoRA at each tier's top-k, rescaled MoE output, activation-aware averaging."""

    name = "flame"
    Config = FlameConfig
    private_keys = ("rescaler",)

    def max_rank(self) -> int:
        return self.cfg.rank

    def rank_for(self, tier: TierConfig) -> int:
        return self.cfg.rank

    def _require_moe(self, runtime: ModelRuntime) -> MoeControl:
        if runtime.moe is None:
            raise UserError(f"flame needs a sparse mixture-of-experts model (e.g. tiny-olmoe); {runtime.loaded.name} "
                            "is dense.")  # fmt: skip
        return runtime.moe

    def init_server(self, runtime: ModelRuntime, seed: int) -> TieredState:
        self._require_moe(runtime)
        self.check_model(runtime)
        runtime.activate(self.spec(runtime, self.cfg.rank))
        runtime.reset_adapter(derive_seed(seed, self.name, "init"))
        return TieredState(tensors=runtime.adapter_state(), lora_layout=self.layout(runtime))

    def rescaler(self, runtime: ModelRuntime, tier: TierConfig, client_state: FlameClientState | None) -> float:
        """s_i of a client: its learned value when it has one, else the mode's start value."""
        moe = self._require_moe(runtime)
        ratio = moe.default_top_k / (tier.top_k or moe.default_top_k)
        if self.cfg.rescaler == "none":
            return 1.0
        if self.cfg.rescaler == "static":
            return ratio
        if client_state and "rescaler" in client_state:
            return float(client_state["rescaler"])
        return ratio if self.cfg.rescaler_init == "ratio" else 1.0

    def client_update(
        self,
        runtime: ModelRuntime,
        client: ClientData,
        payload: Payload,
        client_state: FlameClientState | None,
        seed: int,
    ) -> tuple[ClientUpdate, FlameClientState]:
        moe = self._require_moe(runtime)
        tier = self.tier_of(client.client_id)
        scale = self.rescaler(runtime, tier, client_state)
        model = ClientModel(lora=self.spec(runtime, self.cfg.rank), adapter=payload.tensors,
                            routing=self.routing(runtime, tier.top_k, scale))  # fmt: skip
        runtime.install(model, seed=seed)
        groups = []
        if self.cfg.rescaler == "learned":
            lr = self.cfg.lr if self.cfg.rescaler_lr is None else self.cfg.rescaler_lr
            groups = [{"params": [moe.trainable_scale()], "lr": lr}]
        with moe.counting() as counts:
            metrics = self.train_local(runtime, client, seed, optimizer_groups=groups)
        scale = float(moe.scale.detach())
        moe.configure(None)
        metrics["rescaler"] = scale
        extras = {COUNTS: counts.counts, TOKENS: counts.tokens}
        update = ClientUpdate(client.client_id, runtime.adapter_state(), float(len(client.train)), metrics, extras)
        return update, {"rescaler": scale}

    def aggregate(self, state: TieredState, updates: Iterable[ClientUpdate]) -> tuple[TieredState, Metrics]:
        layout = self.modules(state.lora_layout)
        plain = PlainMean()
        experts: dict[str, tuple[LogWeightedMean, LogWeightedMean]] = {}
        metrics: list[Metrics] = []
        for update in updates:
            metrics.append(update.metrics)
            if COUNTS not in update.extras:
                raise ValueError(f"client {update.client_id} sent no expert activation counts")
            for key, tensor in update.tensors.items():
                module = layout.get(module_key(key) or "")
                if module is None or module.block is None:
                    plain.add(key, tensor, float(update.weight))
            for key, module in layout.items():
                if module.block is None:
                    continue
                counts = update.extras[COUNTS][module.block]
                tokens = float(update.extras[TOKENS][module.block])
                freqs = counts / tokens if tokens > 0 else torch.zeros_like(counts)
                log_w = activation_log_weights(freqs, float(update.weight), self.cfg.temperature)
                mean_a, mean_b = experts.setdefault(key, (LogWeightedMean(), LogWeightedMean()))
                mean_a.add(split_a(update.tensors[f"{key}.lora_A.weight"], module.experts), log_w)
                mean_b.add(split_b(update.tensors[f"{key}.lora_B.weight"], module.experts), log_w)
        if not metrics:
            return state, mean_metrics(metrics)
        tensors = plain.result(state.tensors)
        for key, (mean_a, mean_b) in experts.items():
            n = layout[key].experts
            a_key, b_key = f"{key}.lora_A.weight", f"{key}.lora_B.weight"
            tensors[a_key] = join_a(mean_a.result(split_a(state.tensors[a_key], n)))
            tensors[b_key] = join_b(mean_b.result(split_b(state.tensors[b_key], n)))
        return dataclasses.replace(state, tensors=tensors), mean_metrics(metrics)

    def personalize(
        self,
        runtime: ModelRuntime,
        client: ClientData,
        state: TieredState,
        client_state: FlameClientState | None,
        budget: Budget,
        seed: int,
    ) -> ClientModel:
        self._require_moe(runtime)
        tier = self.tier_of(client.client_id)
        routing = self.routing(runtime, tier.top_k, self.rescaler(runtime, tier, client_state))
        return ClientModel(lora=self.spec(runtime, self.cfg.rank), adapter=state.tensors, routing=routing)
