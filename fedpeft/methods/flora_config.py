"""The settings of FLoRA (:mod:`fedpeft.methods.flora`), importable without torch."""

from __future__ import annotations

from pydantic import Field

from fedpeft.settings.methods import FederatedLoraConfig


class FloraConfig(FederatedLoraConfig):
    """FLoRA's knobs: the LoRA shape (``rank`` for clients not given another), heterogeneous ranks, fine-tuning."""

    server_parts = ()  # the server folds the weighted sum of the clients' products, not a mean of their factors

    ranks: list[int] | None = Field(default=None, min_length=1)
    client_ranks: dict[str, int] = Field(default_factory=dict)
    # None: each client's own alpha_k / r_k (the mean of the updates the clients trained); a number: every product
    # folded at that scaling (the authors' code: lora_alpha / lora_r, whatever the clients trained with).
    merge_scaling: float | None = Field(default=None, gt=0)
    finetune_epochs: float = 0.0
    finetune_lr: float | None = None
