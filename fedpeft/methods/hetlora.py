"""HetLoRA: heterogeneous LoRA ranks by truncation, zero-padding and norm-weighted averaging.

Y. J. Cho, L. Liu, Z. Xu, A. Fahrezi, G. Joshi, "Heterogeneous LoRA for Federated Fine-tuning of On-Device
Foundation Models", EMNLP 2024, https://arxiv.org/abs/2401.06432.

The server keeps a global LoRA of the largest tier rank r_max. Client i receives the first r_i rank
components (rows of A, columns of B; per expert for fused expert LoRA), trains them, and returns them. The
server zero-pads every returned adapter to r_max and averages it with weights proportional to the Frobenius
norm of the client's update ||B_i A_i||_F (per LoRA module, and per expert of a fused expert tensor),
normalized over the clients; other tensors are averaged by data size. Optional local rank self-pruning: the
client adds ``prune_lambda * ||B_tail A_tail||_F`` for the components beyond ``floor(prune_gamma * r_i)`` to
its loss and, when that tail norm ends a round lower than it ended the client's previous round, drops the tail
for good: its rank, kept in the client-state store, shrinks to ``floor(prune_gamma * r_i)`` (never below
``min_rank``). A client's first round never prunes (B starts at zero, so there is nothing to compare with).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import TypedDict

import torch

from fedpeft.adapters.expert_lora import (
    LogWeightedMean,
    LoraModule,
    join_a,
    join_b,
    product_norms,
    split_a,
    split_b,
    truncate,
    zero_pad,
)
from fedpeft.core.records import Budget
from fedpeft.core.types import ClientUpdate, Metrics, Payload
from fedpeft.data.types import ClientData
from fedpeft.methods.families.rank_tiered import RankTieredMethod
from fedpeft.methods.families.tier_aggregation import collect_factors, mean_metrics
from fedpeft.methods.families.tiered import TieredState
from fedpeft.methods.hetlora_config import HetLoraConfig
from fedpeft.models.runtime import ClientModel, ModelRuntime

Factors = tuple[torch.Tensor, torch.Tensor]


def hetlora_mean(factors: list[Factors], experts: int, rank: int, previous: Factors) -> Factors:
    """Zero-pad every client's (A, B) to ``rank`` and average with weights ||B_i A_i||_F per expert.

    An expert whose every update is zero keeps ``previous``.
    """
    mean_a, mean_b = LogWeightedMean(), LogWeightedMean()
    for a, b in factors:
        log_norm = torch.log(product_norms(a, b, experts))
        a_pad, b_pad = zero_pad(a, b, experts, rank)
        mean_a.add(split_a(a_pad, experts), log_norm)
        mean_b.add(split_b(b_pad, experts), log_norm)
    a_prev, b_prev = previous
    return join_a(mean_a.result(split_a(a_prev, experts))), join_b(mean_b.result(split_b(b_prev, experts)))


class HetLoraClientState(TypedDict):
    """What a self-pruning HetLoRA client keeps between rounds: its rank, and the tail norm its last round ended
    with (``None`` right after pruning: the next round compares the tail of the smaller rank)."""

    rank: int
    tail_norm: float | None


class HetLora(RankTieredMethod[HetLoraConfig, HetLoraClientState]):
    """Truncated downloads, zero-padded uploads, ||B A||_F-weighted averaging; optional rank self-pruning."""

    name = "hetlora"
    Config = HetLoraConfig

    def _rank(self, tier_rank: int, client_state: HetLoraClientState | None) -> int:
        return min(tier_rank, int(client_state.get("rank", tier_rank) if client_state else tier_rank))

    def client_update(
        self,
        runtime: ModelRuntime,
        client: ClientData,
        payload: Payload,
        client_state: HetLoraClientState | None,
        seed: int,
    ) -> tuple[ClientUpdate, HetLoraClientState | None]:
        if not self.cfg.self_pruning:
            return super().client_update(runtime, client, payload, client_state, seed)
        tier = self.tier_of(client.client_id)
        rank = self._rank(int(payload.config.get("rank", tier.rank)), client_state)
        spec = self.spec(runtime, rank)
        runtime.activate(spec)
        layout = self.modules(self.layout(runtime))
        adapter = dict(payload.tensors)
        for key, module in layout.items():
            a_key, b_key = f"{key}.lora_A.weight", f"{key}.lora_B.weight"
            adapter[a_key], adapter[b_key] = truncate(adapter[a_key], adapter[b_key], module.experts, rank)
        routing = self.routing(runtime, self.train_top_k(runtime, tier))
        runtime.install(ClientModel(lora=spec, adapter=adapter, routing=routing), seed=seed)
        keep = max(self.cfg.min_rank, int(self.cfg.prune_gamma * rank))
        params = runtime.adapter_parameters()
        pairs = _factor_pairs(params, layout, spec.key)

        def tail_norm() -> torch.Tensor:
            return torch.stack([_tail(a, b, m.experts, keep) for a, b, m in pairs]).sum()

        lam = self.cfg.prune_lambda
        metrics = self.train_local(runtime, client, seed, extra_loss=lambda model, batch, out: lam * tail_norm())
        with torch.no_grad():
            after = float(tail_norm())
        before = client_state.get("tail_norm") if client_state else None
        new_rank = keep if keep < rank and before is not None and after < before else rank
        state = runtime.adapter_state()
        if new_rank < rank:
            for key, module in layout.items():
                a_key, b_key = f"{key}.lora_A.weight", f"{key}.lora_B.weight"
                state[a_key], state[b_key] = truncate(state[a_key], state[b_key], module.experts, new_rank)
        metrics["rank"] = float(new_rank)
        update = ClientUpdate(client.client_id, state, float(len(client.train)), metrics)
        # After pruning, the next round compares the tail of the smaller rank.
        return update, {"rank": new_rank, "tail_norm": after if new_rank == rank else None}

    def aggregate(self, state: TieredState, updates: Iterable[ClientUpdate]) -> tuple[TieredState, Metrics]:
        layout = self.modules(state.lora_layout)
        rank = self.max_rank()
        collected = collect_factors(updates, layout)
        if not collected.metrics:
            return state, mean_metrics(collected.metrics)
        tensors = collected.plain.result(state.tensors)
        for key, module in layout.items():
            a_key, b_key = f"{key}.lora_A.weight", f"{key}.lora_B.weight"
            previous = (state.tensors[a_key], state.tensors[b_key])
            tensors[a_key], tensors[b_key] = hetlora_mean(collected.factors[key], module.experts, rank, previous)
        metrics = mean_metrics(collected.metrics)
        return dataclasses.replace(state, tensors=tensors), metrics

    def personalize(
        self,
        runtime: ModelRuntime,
        client: ClientData,
        state: TieredState,
        client_state: HetLoraClientState | None,
        budget: Budget,
        seed: int,
    ) -> ClientModel:
        tier = self.tier_of(client.client_id)
        rank = self._rank(tier.rank, client_state)
        routing = self.routing(runtime, self.eval_top_k(runtime, tier))
        return ClientModel(lora=self.spec(runtime, rank), adapter=self.adapter_for(state, rank), routing=routing)


def _tail(a: torch.Tensor, b: torch.Tensor, experts: int, keep: int) -> torch.Tensor:
    """sum over experts of ||B^j[:, keep:] A^j[keep:]||_F (differentiable)."""
    a_tail, b_tail = split_a(a, experts)[:, keep:], split_b(b, experts)[:, :, keep:]
    return torch.linalg.matrix_norm(b_tail @ a_tail).sum()


def _factor_pairs(
    params: dict[str, torch.nn.Parameter], layout: dict[str, LoraModule], adapter: str
) -> list[tuple[torch.nn.Parameter, torch.nn.Parameter, LoraModule]]:
    """(lora_A, lora_B, module) parameter pairs of the active adapter."""
    pairs = []
    for key, module in layout.items():
        a = params.get(f"{key}.lora_A.{adapter}.weight")
        b = params.get(f"{key}.lora_B.{adapter}.weight")
        if a is not None and b is not None:
            pairs.append((a, b, module))
    return pairs
