"""TAKFL: knowledge of every architecture group distilled separately and merged by task arithmetic.

M. Morafah, V. Kungurtsev, H. Chang, C. Chen, B. Lin, "Towards Diverse Device Heterogeneous Federated Learning
via Task Arithmetic Knowledge Integration", NeurIPS 2024, https://arxiv.org/abs/2409.18461. Clients of one
architecture (device prototype) average their adapters (FedAvg within the group) and answer the round's public
examples. For every architecture the server distils its averaged adapter once from each group's ensemble
(majority vote within that group), takes each distillation's change as a task vector and adds their mean
(uniform merging coefficients; TAKFL learns them adaptively). Clients keep their group's adapter.
``compute_scale`` 1.294 (FedMosaic paper, Table 15).
"""

from __future__ import annotations

from fedpeft.methods.families.distillation import Answer, Knowledge, PublicDistillation, vote
from fedpeft.methods.takfl_config import TAKFLConfig


class TAKFL(PublicDistillation[TAKFLConfig]):
    """Per-group FedAvg, per-group distillation into every architecture, merged by task arithmetic."""

    name = "takfl"
    Config = TAKFLConfig
    branches = ("global",)
    personal_view = ("global",)

    def distill_targets(self, architecture: str, by_architecture: dict[str, list[Knowledge]]) -> list[list[Answer]]:
        return [vote(uploads) for _, uploads in sorted(by_architecture.items())]
