"""FedSim: shared and personal parameters updated simultaneously (partial model personalization).

K. Pillutla, K. Malik, A. Mohamed, M. Rabbat, M. Sanjabi, L. Xiao, "Federated Learning with Partial Model
Personalization", ICML 2022, https://arxiv.org/abs/2204.03809. The model is the base model plus a shared LoRA
(averaged within each architecture group) plus a personal LoRA that never leaves the client; every local step
updates both at once. The client keeps both. ``compute_scale`` 1.487 (FedMosaic paper, Table 15).
"""

from __future__ import annotations

from fedpeft.core.types import ClientUpdate, Payload, StateDict
from fedpeft.data.types import ClientData
from fedpeft.methods.families.branched import BranchedLoraMethod
from fedpeft.methods.fedsim_config import FedSimConfig
from fedpeft.models.runtime import ModelRuntime


class FedSim(BranchedLoraMethod[FedSimConfig]):
    """Shared + personal LoRA summed, trained together; the shared one is averaged."""

    name = "fedsim"
    Config = FedSimConfig
    personal_view = ("global", "local")

    def client_update(
        self,
        runtime: ModelRuntime,
        client: ClientData,
        payload: Payload,
        client_state: dict[str, StateDict] | None,
        seed: int,
    ) -> tuple[ClientUpdate, dict[str, StateDict]]:
        adapter = self.client_adapter(runtime, payload.tensors, client_state)
        both = ("global", "local")
        metrics = self.train_branches(runtime, adapter, client.train, both, both, seed)
        return self.shared_update(client, adapter, metrics), self.client_state(adapter)
