"""Fisher merging of the FedIT and the local model, the merging baseline of Potara.

M. Matena, C. Raffel, "Merging Models with Fisher-Weighted Averaging", NeurIPS 2022,
https://arxiv.org/abs/2111.09832. As in Potara (``fedpeft.methods.potara``), a FedIT model (T_F rounds) and a
purely local LoRA from the same initialization (T_L rounds) are merged once per client, but every coordinate j
of the adapter (LoRA factors and task head) gets its own weight from the two diagonal empirical Fishers,
theta_j = (F_F,j theta_F,j + F_L,j theta_L,j) / (F_F,j + F_L,j), with no correlation term.
"""

from __future__ import annotations

import torch

from fedpeft.adapters.gradients import per_sample_gradients
from fedpeft.core.types import Metrics, StateDict
from fedpeft.data.types import Example
from fedpeft.methods.potara import Potara
from fedpeft.models.runtime import ClientModel, ModelRuntime
from fedpeft.settings.methods import FederatedLocalConfig


def fisher_weighted_merge(
    fed: torch.Tensor, local: torch.Tensor, fisher_fed: torch.Tensor, fisher_local: torch.Tensor, eps: float = 1e-8
) -> torch.Tensor:
    """(F_F theta_F + F_L theta_L) / (F_F + F_L) per coordinate; ``eps`` damps both Fishers (0/0 -> the mean)."""
    weight = (fisher_fed.double() + eps) / (fisher_fed.double() + fisher_local.double() + 2 * eps)
    return (weight * fed.double() + (1 - weight) * local.double()).to(fed.dtype)


class FisherMerge(Potara[FederatedLocalConfig]):
    """FedIT and local LoRA merged per coordinate with diagonal Fisher weights."""

    name = "fisher_merge"
    Config = FederatedLocalConfig

    def merge(
        self, runtime: ModelRuntime, fed: ClientModel, local: ClientModel, sample: list[Example]
    ) -> tuple[StateDict, Metrics]:
        fishers = []
        for model in (fed, local):
            runtime.activate(model.lora)
            runtime.load_adapter(model.adapter)
            grads, layout = per_sample_gradients(runtime, sample)
            fishers.append((grads.double() ** 2).mean(0))
        merged: StateDict = {}
        start = 0
        for key, shape in layout:
            stop = start + shape.numel()
            merged[key] = fisher_weighted_merge(
                fed.adapter[key],
                local.adapter[key],
                fishers[0][start:stop].reshape(shape),
                fishers[1][start:stop].reshape(shape),
                self.cfg.eps,
            )
            start = stop
        share = fishers[0] / (fishers[0] + fishers[1] + 2 * self.cfg.eps)
        return merged, {"fisher_weight_mean": float(share.mean())}
