"""``lora``: the fixed-rank LoRA baseline, every client trains alone with rank = budget.

``lora`` is the fixed-rank LoRA baseline of "Federated Learning to Personalize PEFT for Multilingual LLMs"
(FedP2EFT, 2025): every client fine-tunes a rank-r LoRA on all linear layers
of the base model, alpha = 2r, 2 epochs, lr 1e-4. There is no federated phase; the budget is the rank.
"""

from __future__ import annotations

from fedpeft.core.types import ServerState
from fedpeft.data.types import ClientData
from fedpeft.methods.base import Budget, Method, lora_spec
from fedpeft.methods.lora_config import LoraBaselineConfig
from fedpeft.models.multi_lora import LoraTraining
from fedpeft.models.runtime import ClientModel, ModelRuntime
from fedpeft.training import TrainArgs


class LoraBaseline(Method[LoraBaselineConfig, ServerState, None]):
    """Each client fine-tunes a LoRA of rank = budget on its own data."""

    name = "lora"
    Config = LoraBaselineConfig
    federated = False
    uses_budget = True
    batchable_clients = True

    def personal_training(
        self,
        runtime: ModelRuntime,
        client: ClientData,
        state: ServerState,
        client_state: None,
        budget: Budget,
        seed: int,
    ) -> LoraTraining:
        rank = int(budget or 8)
        spec = lora_spec(runtime, rank, self.cfg.alpha_multiplier * rank, self.cfg.dropout)
        cfg = self.cfg
        args = TrainArgs(lr=cfg.lr, batch_size=cfg.batch_size, seed=seed, epochs=cfg.epochs)
        return LoraTraining(ClientModel(lora=spec), client.train, args)
