"""FedProx: FedIT plus a proximal term on the adapter.

T. Li et al., "Federated Optimization in Heterogeneous Networks", MLSys 2020, https://arxiv.org/abs/1812.06127.
Every local step adds (mu / 2) ||w - w_global||^2 over the adapter's trained parameters (the task head
included) to the loss; everything else is FedIT (:mod:`fedpeft.methods.fedit`).
"""

from __future__ import annotations

import torch

from fedpeft.core.types import Payload
from fedpeft.methods.fedit import FedIT, _state_key
from fedpeft.methods.fedprox_config import FedProxConfig
from fedpeft.models.runtime import ModelRuntime
from fedpeft.training import Batch, LossHook


class FedProx(FedIT[FedProxConfig]):
    """FedIT with a proximal term pulling the local adapter toward the global one."""

    name = "fedprox"
    Config = FedProxConfig
    batchable_clients = False  # the proximal term is a loss of each client's own

    def extra_loss(self, runtime: ModelRuntime, payload: Payload) -> LossHook:
        params = runtime.adapter_parameters()
        anchors: dict[str, torch.Tensor] = {}
        for pname, param in params.items():
            key = _state_key(pname, runtime)
            if key in payload.tensors:
                anchors[pname] = payload.tensors[key].to(param.device, param.dtype)
        mu = self.cfg.mu

        def proximal(model: torch.nn.Module, batch: Batch, outputs: object) -> torch.Tensor:
            terms = [((params[n] - a) ** 2).sum() for n, a in anchors.items()]
            return 0.5 * mu * torch.stack(terms).sum()

        return proximal
