"""Streaming aggregation pieces of the tiered methods (FLAME, HetLoRA, FlexLoRA).

Updates arrive as an iterator; these helpers gather, in one pass, what each method's own rule needs: the
data-size-weighted mean of the tensors no special rule covers (:class:`PlainMean`), the clients' LoRA factors
per module (:func:`collect_factors`) and the mean of their training metrics (:func:`mean_metrics`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import torch

from fedpeft.adapters.expert_lora import module_key
from fedpeft.core.types import ClientUpdate, Metrics, StateDict


class PlainMean:
    """Streaming mean of tensors under linear weights (FedAvg of the tensors no special rule covers)."""

    def __init__(self) -> None:
        self.sums: dict[str, torch.Tensor] = {}
        self.weights: dict[str, float] = {}
        self.dtypes: dict[str, torch.dtype] = {}

    def add(self, key: str, tensor: torch.Tensor, weight: float) -> None:
        self.dtypes.setdefault(key, tensor.dtype)
        value = tensor.detach().to(torch.float64) * weight
        self.sums[key] = self.sums[key] + value if key in self.sums else value
        self.weights[key] = self.weights.get(key, 0.0) + weight

    def result(self, previous: StateDict) -> StateDict:
        out = {}
        for key, total in self.sums.items():
            weight = self.weights[key]
            out[key] = (total / weight).to(self.dtypes[key]) if weight > 0 else previous[key].clone()
        return out


def mean_metrics(metrics: Iterable[Metrics]) -> Metrics:
    """The mean of every numeric training metric over clients, prefixed ``train_``, and the client count."""
    sums: dict[str, float] = {}
    count = 0
    for entry in metrics:
        count += 1
        for key, value in entry.items():
            sums[key] = sums.get(key, 0.0) + float(value)
    out = {f"train_{k}": v / count for k, v in sums.items()} if count else {}
    out["clients"] = float(count)
    return out


@dataclass
class CollectedFactors:
    """One round's updates as the rank-tiered rules read them."""

    plain: PlainMean = field(default_factory=PlainMean)
    factors: dict[str, list[tuple[torch.Tensor, torch.Tensor]]] = field(default_factory=dict)
    weights: list[float] = field(default_factory=list)
    metrics: list[Metrics] = field(default_factory=list)


def collect_factors(updates: Iterable[ClientUpdate], modules: Iterable[str]) -> CollectedFactors:
    """Every update's (A, B) of each LoRA module in ``modules``, its weight and metrics, and the streaming mean
    of its tensors outside LoRA modules (a classification head)."""
    collected = CollectedFactors(factors={key: [] for key in modules})
    for update in updates:
        collected.metrics.append(update.metrics)
        collected.weights.append(float(update.weight))
        for key, tensor in update.tensors.items():
            if module_key(key) is None:
                collected.plain.add(key, tensor, float(update.weight))
        for key, pairs in collected.factors.items():
            pairs.append((update.tensors[f"{key}.lora_A.weight"], update.tensors[f"{key}.lora_B.weight"]))
    return collected
