"""FedMKT: mutual knowledge transfer between large and small models on public data.

T. Fan, G. Ma, Y. Kang, H. Gu, Y. Song, L. Fan, K. Chen, Q. Yang, "FedMKT: Federated Mutual Knowledge Transfer
for Large and Small Language Models", COLING 2025, https://arxiv.org/abs/2406.02224. Clients of each
architecture average their adapters (FedAvg within the group) and answer the round's public examples with their
loss on the reference answer. Knowledge flows both ways between architectures: each architecture's adapter is
distilled from the other architectures' answers, per example the answer of the teacher with the lowest loss
(FedMKT's min-CE selection); in a federation of one architecture, from all clients. Clients keep their group's
adapter. ``compute_scale`` 1.574 (FedMosaic paper, Table 15).
"""

from __future__ import annotations

from fedpeft.methods.families.distillation import Answer, Knowledge, PublicDistillation, lowest_loss
from fedpeft.methods.fedmkt_config import FedMKTConfig


class FedMKT(PublicDistillation[FedMKTConfig]):
    """Per-group FedAvg and min-loss mutual distillation across architectures."""

    name = "fedmkt"
    Config = FedMKTConfig
    branches = ("global",)
    personal_view = ("global",)

    def distill_targets(self, architecture: str, by_architecture: dict[str, list[Knowledge]]) -> list[list[Answer]]:
        others = [u for name, uploads in by_architecture.items() if name != architecture for u in uploads]
        return [lowest_loss(others or [u for uploads in by_architecture.values() for u in uploads])]
