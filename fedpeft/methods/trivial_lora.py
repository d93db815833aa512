"""Trivial LoRA: FedAvg of one small LoRA that every compute tier can afford.

The "trivial" baseline of K. Le et al., "FLAME: Towards Federated Fine-Tuning Large Language Models Through
Adaptive SMoE", 2025 (https://arxiv.org/abs/2506.16600): instead of compressing a large global LoRA for weak
clients, every client trains the same LoRA at the smallest tier's rank (FedIT-style averaging of A and B
weighted by data size). On a mixture-of-experts model clients train at the model's own top-k (``train_top_k``)
and each client is evaluated at its tier's compute: its tier's top-k.
"""

from __future__ import annotations

from fedpeft.methods.families.rank_tiered import RankTieredMethod
from fedpeft.methods.families.tiered import TierConfig
from fedpeft.methods.trivial_lora_config import TrivialLoraConfig


class TrivialLora(RankTieredMethod[TrivialLoraConfig, None]):
    """One rank for every tier (the smallest tier's unless ``rank`` is set); FedAvg of the adapter."""

    name = "trivial_lora"
    Config = TrivialLoraConfig

    def max_rank(self) -> int:
        return self.cfg.rank or min(t.rank for t in self.cfg.tiers)

    def rank_for(self, tier: TierConfig) -> int:
        return self.max_rank()
