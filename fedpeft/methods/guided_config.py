"""The settings of aggregation to guidance (:mod:`fedpeft.methods.guided`), importable without torch."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from fedpeft.settings.methods import FederatedLoraConfig
from fedpeft.settings.server import MergeConfig


class GuidedConfig(FederatedLoraConfig):
    """The paper's protocol by default (Section 3): 20 rounds of every client, one local epoch per round,
    batch 32, AdamW at lr 5e-5, LoRA rank 8. ``local_steps`` given without ``local_epochs`` replaces the epoch."""

    server_parts = ()  # a merge operator (`merge`), with ReLoRA folds

    rounds: int = 20
    fraction: float = 1.0
    local_steps: int | None = None
    local_epochs: float | None = 1.0
    batch_size: int = 32
    lr: float = 5e-5
    merge: MergeConfig = Field(default_factory=MergeConfig)
    relora: bool = False
    guidance: Literal["hard_init", "l2", "kd"] = "hard_init"
    beta: float = Field(0.5, ge=0.0, le=1.0)
    similarity: Literal["none", "cosine", "cosine_products", "sar"] = "none"
    sar_energy: float = Field(0.95, gt=0.0, le=1.0)
    start: Literal["local", "global"] = "local"
    temperature: float = Field(2.0, gt=0.0)
    kd_direction: Literal["student_teacher", "teacher_student"] = "student_teacher"
    targets: list[str] | None = None

    @model_validator(mode="before")
    @classmethod
    def _steps_replace_the_epoch(cls, data: object) -> object:
        if isinstance(data, dict) and data.get("local_steps") is not None and "local_epochs" not in data:
            return {**data, "local_epochs": None}
        return data

    @model_validator(mode="after")
    def _consistent(self) -> GuidedConfig:
        if self.relora and self.guidance != "hard_init":
            raise ValueError("relora re-initializes the LoRA every round, so it combines only with guidance hard_init")
        if self.similarity != "none" and self.guidance == "hard_init":
            raise ValueError("similarity scales beta, which only l2 and kd guidance use")
        return self
