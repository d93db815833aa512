"""The settings of FedALT (:mod:`fedpeft.methods.fedalt`), importable without torch."""

from __future__ import annotations

from pydantic import Field

from fedpeft.settings.methods import FederatedLoraConfig


class FedALTConfig(FederatedLoraConfig):
    server_parts = ()  # the server builds each client's rest-of-world LoRA

    lr: float = 1e-4
    mixer_lr: float | None = None
    unseen_steps: int = Field(0, ge=0)
