"""PerAda: personalized adapters regularized toward a global adapter improved by distillation.

C. Xie, D.-A. Huang, W. Chu, D. Xu, C. Xiao, B. Li, A. Anandkumar, "PerAda: Parameter-Efficient Federated
Learning Personalization with Generalization Guarantees", CVPR 2024, https://arxiv.org/abs/2302.06637. Each
round a client trains a copy of the global adapter (uploaded, FedAvg within each architecture group) and its
personal adapter with the task loss plus ``lam / 2 ||v - w||^2`` toward the received global one; it also answers
the round's public examples. The server distils every architecture's averaged global adapter on those examples
toward the ensemble of all clients' answers (majority vote, across architectures). The client keeps its personal
adapter. ``compute_scale`` 2.294 (FedMosaic paper, Table 15).
"""

from __future__ import annotations

from fedpeft.core.types import ClientUpdate, Payload, StateDict
from fedpeft.data.types import ClientData
from fedpeft.methods.families.distillation import Answer, Knowledge, PublicDistillation, vote
from fedpeft.methods.perada_config import PerAdaConfig
from fedpeft.models.runtime import ModelRuntime


class PerAda(PublicDistillation[PerAdaConfig]):
    """Ditto-style personal adapters around a global adapter distilled from the clients' ensemble."""

    name = "perada"
    trainings_per_round = 2
    Config = PerAdaConfig

    def client_update(
        self,
        runtime: ModelRuntime,
        client: ClientData,
        payload: Payload,
        client_state: dict[str, StateDict] | None,
        seed: int,
    ) -> tuple[ClientUpdate, dict[str, StateDict]]:
        adapter, metrics, answers = self.train_shared(runtime, client, payload, client_state, seed)
        personal = self.train_personal(runtime, adapter, client.train, payload.tensors, self.cfg.lam, seed)
        metrics = {**metrics, "personal_loss": personal["loss"]}
        return self.shared_update(client, adapter, metrics, **answers), self.client_state(adapter)

    def distill_targets(self, architecture: str, by_architecture: dict[str, list[Knowledge]]) -> list[list[Answer]]:
        return [vote([u for uploads in by_architecture.values() for u in uploads])]
