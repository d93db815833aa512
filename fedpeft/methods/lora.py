"""Personalization baselines that train each client alone: ``lora`` (rank = budget) and ``local``.

``lora`` is the fixed-rank LoRA baseline of "Federated Learning to Personalize PEFT for Multilingual LLMs"
(FedP2EFT, 2025): every client fine-tunes a rank-r LoRA on all linear layers
of the base model, alpha = 2r, 2 epochs, lr 1e-4. There is no federated phase; the budget is the rank.

``local`` (alias ``sft``) is the purely local baseline of the federated papers (Potara, FedMosaic): each client
trains a fixed-rank LoRA on its own data for ``rounds * local_steps`` steps, with no communication.
"""

from __future__ import annotations

from typing import Any

from fedpeft.core.registry import METHODS
from fedpeft.core.types import ServerState
from fedpeft.data.types import ClientData
from fedpeft.methods.base import LoraConfigMixin, Method, MethodConfig, fine_tune, lora_spec
from fedpeft.models.runtime import ClientModel, ModelRuntime


class LoraBaselineConfig(MethodConfig):
    epochs: float = 2.0
    lr: float = 1e-4
    batch_size: int = 16
    alpha_multiplier: float = 2.0
    dropout: float = 0.0


@METHODS.register("lora")
class LoraBaseline(Method):
    """Each client fine-tunes a LoRA of rank = budget on its own data."""

    name = "lora"
    Config = LoraBaselineConfig
    federated = False
    uses_budget = True

    def personalize(
        self,
        runtime: ModelRuntime,
        client: ClientData,
        state: ServerState,
        client_state: Any,
        budget: int | None,
        seed: int,
    ) -> ClientModel:
        rank = int(budget or 8)
        spec = lora_spec(runtime, rank, self.cfg.alpha_multiplier * rank, self.cfg.dropout)
        return fine_tune(
            runtime,
            ClientModel(lora=spec),
            client.train,
            seed=seed,
            lr=self.cfg.lr,
            batch_size=self.cfg.batch_size,
            epochs=self.cfg.epochs,
        )


class LocalConfig(MethodConfig, LoraConfigMixin):
    rounds: int = 10
    local_steps: int = 10
    lr: float = 1e-4
    batch_size: int = 16


@METHODS.register("local", aliases=("sft",))
class Local(Method):
    """Each client trains a fixed-rank LoRA alone, as many steps as a federated run would give it."""

    name = "local"
    Config = LocalConfig
    federated = False

    def personalize(
        self,
        runtime: ModelRuntime,
        client: ClientData,
        state: ServerState,
        client_state: Any,
        budget: int | None,
        seed: int,
    ) -> ClientModel:
        spec = lora_spec(runtime, self.cfg.rank, self.cfg.alpha, self.cfg.dropout, self.cfg.targets)
        steps = self.cfg.rounds * self.cfg.local_steps
        return fine_tune(
            runtime,
            ClientModel(lora=spec),
            client.train,
            seed=seed,
            lr=self.cfg.lr,
            batch_size=self.cfg.batch_size,
            steps=steps,
        )
