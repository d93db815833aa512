"""``bayestune_lora``: each client learns its own LoRA rank structure with BayesTune-LoRA, no federation.

The non-federated rank-selection baseline of "Federated Learning to Personalize PEFT for Multilingual LLMs"
(FedP2EFT; Lee et al., AAAI 2026, https://arxiv.org/abs/2502.04387), Section 3.2 and Appendix A.4. Every client
trains a rank-r_init LoRA on all linear layers together with rank-wise scales lambda on Eq. 1 for ``stage1_epochs``
(2) epochs, once; then, for each budget r <= r_max, keeps the top-(r * L) scales, re-trains a fresh LoRA of that
structure with lambda frozen (2 epochs) and exports it as a plain PEFT LoRA with lambda folded into A. It uses
FedP2EFT's hyperparameters (stage 1's budget included), so it measures what learning the scales federatedly adds.
The math is in :mod:`fedpeft.adapters.bayestune`.
"""

from __future__ import annotations

import torch

from fedpeft.adapters.bayestune import ClientScales, train_scales
from fedpeft.core.types import ServerState
from fedpeft.data.types import ClientData
from fedpeft.methods.bayestune_lora_config import BayesTuneLoraConfig
from fedpeft.methods.families.bayestune import BayesTuneMethod
from fedpeft.models.runtime import ModelRuntime


class BayesTuneLora(BayesTuneMethod[BayesTuneLoraConfig, ServerState, None]):
    """Each client trains its own rank scales (Eq. 1, ``stage1_epochs`` epochs) and prunes them to every budget."""

    name = "bayestune_lora"
    Config = BayesTuneLoraConfig
    federated = False

    def client_scales(
        self,
        runtime: ModelRuntime,
        client: ClientData,
        state: ServerState,
        client_state: ClientScales | None,
        seed: int,
    ) -> ClientScales:
        modules = [name for name, _ in runtime.target_modules]
        initial = torch.full((len(modules), self.cfg.r_init), self.cfg.lambda_init)
        scales, metrics = train_scales(runtime, client.train, initial, self.cfg, seed=seed)
        return ClientScales(scales, modules, metrics)
