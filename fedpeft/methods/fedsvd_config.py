"""The settings of FedSVD (:mod:`fedpeft.methods.fedsvd`), importable without torch."""

from __future__ import annotations

from pydantic import Field, model_validator

from fedpeft.settings.methods import FederatedLoraConfig


class FedSvdConfig(FederatedLoraConfig):
    """FedSVD's knobs: the LoRA shape (alpha defaults to the rank), when the server re-factorizes, whether the head
    trains, optional local fine-tuning."""

    refactor_every: int = Field(default=1, ge=1)
    # The authors' --svd-warmup-steps, which counts rounds: no re-factorization in the first that many rounds.
    svd_warmup_rounds: int = Field(default=0, ge=0)
    train_head: bool = False
    finetune_epochs: float = 0.0
    finetune_lr: float | None = None

    @model_validator(mode="after")
    def _stateless_server_step(self) -> FedSvdConfig:
        # Each re-factorization rotates A and B, so moments kept for B would mix bases across rounds.
        if self.server_optimizer is not None and self.server_optimizer.name != "sgd":
            raise ValueError(
                "fedsvd re-factorizes B A every round, which invalidates a server optimizer's moments; use "
                "`server_optimizer: {name: sgd}` or none"
            )
        return self
