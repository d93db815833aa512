"""FlexLoRA: heterogeneous LoRA ranks through an SVD of the averaged full-size update.

J. Bai, D. Chen, B. Qian, L. Yao, Y. Li, "Federated Fine-tuning of Large Language Models under Heterogeneous
Tasks and Client Resources", NeurIPS 2024, https://arxiv.org/abs/2402.11505.

Every client trains a LoRA of its tier's rank r_i and returns its factors; the server forms each client's
full-size update B_i A_i, averages the updates weighted by data size, W = sum_i |D_i| B_i A_i / sum_i |D_i|,
and takes its SVD W = U S V^T. A client of rank r receives the rank-r truncation B = U_r S_r, A = V_r^T. The
server stores the rank-r_max truncation, whose first r components are the rank-r one. For fused expert LoRA
each expert's update is its own matrix. The SVD is computed from the stacked low-rank factors (see
:func:`fedpeft.adapters.expert_lora.svd_factors`), equal to the SVD of W without forming the (out, in)
products. Other tensors (a classification head) are averaged by data size.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from fedpeft.adapters.expert_lora import svd_factors
from fedpeft.core.types import ClientUpdate, Metrics
from fedpeft.methods.families.rank_tiered import RankTieredMethod
from fedpeft.methods.families.tier_aggregation import collect_factors, mean_metrics
from fedpeft.methods.families.tiered import TieredState
from fedpeft.methods.flexlora_config import FlexLoraConfig


class FlexLora(RankTieredMethod[FlexLoraConfig, None]):
    """Data-size-weighted average of the clients' B_i A_i, redistributed by SVD truncation to each rank."""

    name = "flexlora"
    Config = FlexLoraConfig

    def aggregate(self, state: TieredState, updates: Iterable[ClientUpdate]) -> tuple[TieredState, Metrics]:
        layout = self.modules(state.lora_layout)
        collected = collect_factors(updates, layout)
        if not collected.metrics or sum(collected.weights) <= 0:
            return state, mean_metrics(collected.metrics)
        tensors = collected.plain.result(state.tensors)
        rank = self.max_rank()
        for key, module in layout.items():
            a_key, b_key = f"{key}.lora_A.weight", f"{key}.lora_B.weight"
            a, b = svd_factors(collected.factors[key], collected.weights, module.experts, rank)
            tensors[a_key], tensors[b_key] = a.to(state.tensors[a_key].dtype), b.to(state.tensors[b_key].dtype)
        metrics = mean_metrics(collected.metrics)
        return dataclasses.replace(state, tensors=tensors), metrics
