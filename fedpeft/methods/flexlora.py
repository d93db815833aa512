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

from collections.abc import Iterable

import torch

from fedpeft.adapters.expert_lora import module_key, svd_factors
from fedpeft.methods.tiers import PlainMean, RankTieredConfig, RankTieredMethod, mean_metrics
from fedpeft.registry import METHODS
from fedpeft.types import ClientUpdate, Metrics, ServerState


@METHODS.register("flexlora")
class FlexLora(RankTieredMethod):
    """Data-size-weighted average of the clients' B_i A_i, redistributed by SVD truncation to each rank."""

    name = "flexlora"
    Config = RankTieredConfig

    def aggregate(self, state: ServerState, updates: Iterable[ClientUpdate]) -> tuple[ServerState, Metrics]:
        layout = self.modules(state.extra["lora_layout"])
        plain = PlainMean()
        factors: dict[str, list[tuple[torch.Tensor, torch.Tensor]]] = {k: [] for k in layout}
        weights: list[float] = []
        metrics: list[Metrics] = []
        for update in updates:
            metrics.append(update.metrics)
            weights.append(float(update.weight))
            for key, tensor in update.tensors.items():
                if module_key(key) is None:
                    plain.add(key, tensor, float(update.weight))
            for key in layout:
                factors[key].append((update.tensors[f"{key}.lora_A.weight"], update.tensors[f"{key}.lora_B.weight"]))
        if not metrics or sum(weights) <= 0:
            return state, mean_metrics(metrics)
        tensors = plain.result(state.tensors)
        rank = self.max_rank()
        for key, module in layout.items():
            a_key, b_key = f"{key}.lora_A.weight", f"{key}.lora_B.weight"
            a, b = svd_factors(factors[key], weights, module.experts, rank)
            tensors[a_key], tensors[b_key] = a.to(state.tensors[a_key].dtype), b.to(state.tensors[b_key].dtype)
        return ServerState(tensors=tensors, round=state.round + 1, extra=state.extra), mean_metrics(metrics)
