"""The settings of FedIT (:mod:`fedpeft.methods.fedit`), importable without torch."""

from __future__ import annotations

from pydantic import model_validator

from fedpeft.settings.methods import FederatedLoraConfig
from fedpeft.settings.server import MergeConfig, ServerPart


class FedITConfig(FederatedLoraConfig):
    finetune_epochs: float = 0.0
    finetune_lr: float | None = None
    merge: MergeConfig | None = None

    @model_validator(mode="after")
    def _merge_replaces_the_mean(self) -> FedITConfig:
        if self.merge is not None and (
            self.dp is not None or self.aggregation.active or self.server_optimizer is not None
        ):
            raise ValueError(
                "`merge` replaces the weighted mean, so it cannot be combined with `aggregation.robust`, `dp` or "
                "`server_optimizer`"
            )
        return self

    def available_server_parts(self) -> tuple[ServerPart, ...]:
        """The weighted mean and every part around it, unless ``merge`` replaces the mean (then none)."""
        return () if self.merge is not None else self.server_parts
