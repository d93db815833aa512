"""Standard FL with LoRA: FedIT on the attention query and value projections, merged into the weights.

The LoRA recipe of FedLLM-Bench (R. Ye et al., "FedLLM-Bench: Realistic Benchmarks for Federated Learning of
Large Language Models", NeurIPS 2024 Datasets and Benchmarks, https://arxiv.org/abs/2406.04845) that FedP2EFT
(2025) uses to build its "Standard FL (LoRA)" base model: FedIT (J. Zhang et al., ICASSP 2024) with LoRA r = 16,
alpha = 32, dropout 0.05 on q and v, 200 rounds, a cosine learning-rate decay over the rounds from 2e-5 to 1e-6;
the final global adapter is merged into the weights, W' = W + (alpha / r) B A (and the trained task head replaces
the base one).

Registered as ``fedit_merged`` (alias ``standard_fl_lora``). As a compared method every client keeps the merged
global model; as ``base.method`` of a federated base stage the merged model is the base that personalization
starts from.
"""

from __future__ import annotations

import math

from fedpeft.base_models import merged_base, resolve_targets
from fedpeft.core.records import Budget
from fedpeft.core.types import Payload, StateDict
from fedpeft.data.types import ClientData
from fedpeft.methods.fedit import FedIT, FedITState
from fedpeft.methods.fedit_merged_config import FedITMergedConfig
from fedpeft.models.runtime import ClientModel, LoraSpec, ModelRuntime


def cosine_lr(round_: int, rounds: int, lr: float, min_lr: float) -> float:
    """Learning rate of ``round_`` (0-based) under a cosine decay from ``lr`` to ``min_lr`` over ``rounds``."""
    progress = min(max(round_ / max(rounds, 1), 0.0), 1.0)
    return min_lr + 0.5 * (lr - min_lr) * (1.0 + math.cos(math.pi * progress))


class FedITMerged(FedIT[FedITMergedConfig]):
    """FedIT with q,v LoRA and a cosine learning-rate schedule; every client keeps the merged global model."""

    name = "fedit_merged"
    Config = FedITMergedConfig
    base_stage = True

    def spec(self, runtime: ModelRuntime) -> LoraSpec:
        rank = self.cfg.rank
        alpha = float(self.cfg.alpha if self.cfg.alpha is not None else 2 * rank)
        targets = resolve_targets(runtime, self.cfg.targets)
        return LoraSpec(rank=rank, alpha=alpha, targets=targets, dropout=self.cfg.dropout)

    def payload(self, state: FedITState, client_id: str) -> Payload:
        cfg = self.cfg
        lr = cosine_lr(state.round, cfg.rounds, cfg.lr, cfg.min_lr) if cfg.lr_schedule == "cosine" else cfg.lr
        return Payload(tensors=state.tensors, config={"lr": lr})

    def export_base(self, runtime: ModelRuntime, state: FedITState) -> StateDict:
        return merged_base(runtime, self.spec(runtime), state.tensors)

    def personalize(
        self,
        runtime: ModelRuntime,
        client: ClientData,
        state: FedITState,
        client_state: None,
        budget: Budget,
        seed: int,
    ) -> ClientModel:
        return ClientModel(base=self.export_base(runtime, state))

    def personal_training(
        self,
        runtime: ModelRuntime,
        client: ClientData,
        state: FedITState,
        client_state: None,
        budget: Budget,
        seed: int,
    ) -> None:
        return None  # every client keeps the merged global model: nothing to train
