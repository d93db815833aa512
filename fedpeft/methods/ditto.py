"""Ditto: a global adapter by FedAvg and a personal adapter pulled toward it.

T. Li, S. Hu, A. Beirami, V. Smith, "Ditto: Fair and Robust Federated Learning Through Personalization",
ICML 2021, https://arxiv.org/abs/2012.04221. Each round a client (1) trains a copy of the global LoRA on its
data and uploads it (FedAvg within each architecture group) and (2) trains its personal LoRA with the task loss
plus ``lam / 2 ||v - w||^2`` toward the global LoRA w it received. It keeps the personal LoRA. Two training
passes per step: ``compute_scale`` 2 (FedMosaic paper, Table 15).
"""

from __future__ import annotations

from fedpeft.core.types import ClientUpdate, Payload, StateDict
from fedpeft.data.types import ClientData
from fedpeft.methods.ditto_config import DittoConfig
from fedpeft.methods.families.branched import BranchedLoraMethod
from fedpeft.models.runtime import ModelRuntime


class Ditto(BranchedLoraMethod[DittoConfig]):
    """Global LoRA by FedAvg; personal LoRA with a proximal term toward the received global one."""

    name = "ditto"
    trainings_per_round = 2
    Config = DittoConfig

    def client_update(
        self,
        runtime: ModelRuntime,
        client: ClientData,
        payload: Payload,
        client_state: dict[str, StateDict] | None,
        seed: int,
    ) -> tuple[ClientUpdate, dict[str, StateDict]]:
        adapter = self.client_adapter(runtime, payload.tensors, client_state)
        metrics = self.train_branches(runtime, adapter, client.train, ("global",), ("global",), seed)
        personal = self.train_personal(runtime, adapter, client.train, payload.tensors, self.cfg.lam, seed)
        metrics = {**metrics, "personal_loss": personal["loss"]}
        return self.shared_update(client, adapter, metrics), self.client_state(adapter)
