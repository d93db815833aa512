"""``local`` (alias ``sft``): the purely local baseline of the federated papers (Potara, FedMosaic).

Each client trains a fixed-rank LoRA on its own data for ``rounds * local_steps`` steps, as many as a federated
run would give it, with no communication.
"""

from __future__ import annotations

from fedpeft.core.types import ServerState
from fedpeft.data.types import ClientData
from fedpeft.methods.base import Budget, Method, lora_spec
from fedpeft.methods.local_config import LocalConfig
from fedpeft.models.multi_lora import LoraTraining
from fedpeft.models.runtime import ClientModel, ModelRuntime
from fedpeft.training import TrainArgs


class Local(Method[LocalConfig, ServerState, None]):
    """Each client trains a fixed-rank LoRA alone, as many steps as a federated run would give it."""

    name = "local"
    Config = LocalConfig
    federated = False
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
        spec = lora_spec(runtime, self.cfg.rank, self.cfg.alpha, self.cfg.dropout, self.cfg.targets)
        steps = self.cfg.rounds * self.cfg.local_steps
        args = TrainArgs(lr=self.cfg.lr, batch_size=self.cfg.batch_size, seed=seed, steps=steps)
        return LoraTraining(ClientModel(lora=spec), client.train, args)
