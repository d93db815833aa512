"""The settings of Standard FL with LoRA, FedIT merged into the weights (:mod:`fedpeft.methods.fedit_merged`),
importable without torch."""

from __future__ import annotations

from typing import Literal

from pydantic import model_validator

from fedpeft.methods.fedit_config import FedITConfig


class FedITMergedConfig(FedITConfig):
    rounds: int = 200
    rank: int = 16
    alpha: float | None = 32.0
    dropout: float = 0.05
    lr: float = 2e-5
    min_lr: float = 1e-6
    lr_schedule: Literal["cosine", "constant"] = "cosine"

    @model_validator(mode="before")
    @classmethod
    def _lr_schedule_by_its_old_name(cls, data: object) -> object:
        """``schedule: cosine | constant``, the learning-rate schedule's name before ``schedule`` named when the
        server steps, is read as ``lr_schedule``."""
        if isinstance(data, dict) and isinstance(data.get("schedule"), str) and "lr_schedule" not in data:
            data = {**data, "lr_schedule": data["schedule"]}
            del data["schedule"]
        return data

    # Wider than LoraConfigMixin's list: FedITMerged.spec resolves it (``qv``, ``all`` or a list) for FedIT.
    targets: str | list[str] = "qv"  # type: ignore[assignment]
