"""The config bases and family configs every method's ``Config`` builds on, importable without torch.

A method's own config lives beside it, in ``fedpeft/methods/<name>_config.py``, which imports pydantic, the standard
library, :mod:`fedpeft.core` and this package only; the method catalogue (:mod:`fedpeft.catalog.methods`) names it,
so ``core.config`` validates a ``methods`` entry without importing the method (nor torch). What is here is shared:
the bases (:class:`MeanServerConfigMixin`, :class:`FederatedConfig`, :class:`LoraConfigMixin`,
:class:`FederatedLoraConfig` and the protocols of config fields), then the family configs (tiers, rank tiers, the
FedMosaic baselines, distillation, BayesTune, FedIT-then-local), and the PSG's loss, which the adapters read too.

A config names the parts its method's server step is built of, in their order
(:attr:`MeanServerConfigMixin.server_parts`; none for a method whose ``aggregate`` is no weighted mean):
``method_server_step`` builds those this config sets (:meth:`MeanServerConfigMixin.server_step_parts`) and the
config check refuses a setting whose part is not among them (:meth:`MeanServerConfigMixin.refused_server_settings`).
"""

from __future__ import annotations

from typing import ClassVar, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field, model_validator

from fedpeft.core.method_class import MethodConfig
from fedpeft.settings.schedule import ScheduleConfig
from fedpeft.settings.server import (
    SERVER_PARTS,
    AggregationConfig,
    DPConfig,
    ServerOptimizerConfig,
    ServerPart,
)

# ================================================================================================== bases


class MeanServerConfigMixin(BaseModel):
    """The server step's knobs of a method whose server step is the weighted mean of the uploads
    (docs/privacy.md): a robust rule (``aggregation``) or client-level differential privacy (``dp``), not both,
    a server optimizer applied to the result (``server_optimizer``, docs/server-optimizers.md), and when the server
    steps (``schedule``: synchronous rounds, or asynchronously, docs/async.md)."""

    server_parts: ClassVar[tuple[ServerPart, ...]] = SERVER_PARTS
    """The parts its method's server step is built of, innermost first, the weighted mean first
    (:data:`~fedpeft.settings.server.SERVER_PARTS`: all of them); each but the mean is there where the config sets
    it. A config class whose method's ``aggregate`` is no weighted mean sets ``()``, with a comment saying why (then
    ``aggregation``, ``dp``, ``server_optimizer``, an asynchronous ``schedule`` and secure aggregation do not
    apply)."""

    aggregation: AggregationConfig = Field(default_factory=AggregationConfig)
    dp: DPConfig | None = None
    server_optimizer: ServerOptimizerConfig | None = None
    schedule: ScheduleConfig = Field(default_factory=ScheduleConfig)

    @model_validator(mode="after")
    def _one_server_rule(self) -> MeanServerConfigMixin:
        if self.dp is not None and self.aggregation.active:
            raise ValueError(
                "`dp` and `aggregation.robust` cannot be combined, since DP-FedAvg's server step is its own "
                "clipped mean"
            )
        if self.dp is not None and self.schedule.asynchronous:
            raise ValueError(
                f"`dp` cannot be combined with the asynchronous schedule {self.schedule.kind}: the privacy accountant "
                "assumes synchronous rounds of sampled clients"
            )
        return self

    def available_server_parts(self) -> tuple[ServerPart, ...]:
        """The parts its method's server step may be built of: :attr:`server_parts`, unless a subclass's settings
        decide (FedIT's ``merge`` replaces the mean: none)."""
        return self.server_parts

    def server_step_parts(self) -> tuple[ServerPart, ...]:
        """The parts of the server step this config gives its method, innermost first: the mean and the available
        parts this config sets; ``()`` where its method's step is no weighted mean (``method_server_step`` is then
        ``None``)."""
        settings = self._part_settings()
        return tuple(part for part in self.available_server_parts() if part == "mean" or settings[part] is not None)

    def refused_server_settings(self) -> list[str]:
        """The server-step settings of this config that its method's server step cannot apply, as a config names
        them: those set (an asynchronous ``schedule``, a robust ``aggregation``, ``dp``, ``server_optimizer``)
        whose part is not available. ``core.config.method_config`` refuses a config for which this is not empty."""
        available = self.available_server_parts()
        return [named for part, named in self._part_settings().items() if named is not None and part not in available]

    def _part_settings(self) -> dict[ServerPart, str | None]:
        """Each part that wraps the mean -> the setting of this config that asks for it, as a config names it
        (``None``: not asked for), in the order the config check names them."""
        return {
            "staleness": f"`schedule.kind: {self.schedule.kind}`" if self.schedule.asynchronous else None,
            "robust": "`aggregation.robust`" if self.aggregation.active else None,
            "privacy": "`dp`" if self.dp is not None else None,
            "optimizer": "`server_optimizer`" if self.server_optimizer is not None else None,
        }


class FederatedConfig(MethodConfig, MeanServerConfigMixin):
    """The usual knobs of a federated phase: rounds, client sampling, local training, the server step's rule."""

    rounds: int = 10
    fraction: float = 0.1
    min_clients: int = 1
    local_steps: int | None = 10
    local_epochs: float | None = None
    batch_size: int = 16
    lr: float = 1e-4
    weight_decay: float = 0.0


class LoraConfigMixin(BaseModel):
    """LoRA shape knobs (rank, scaling, dropout; ``targets``: module-name suffixes, all linear layers if unset)."""

    rank: int = 8
    alpha: float | None = None
    dropout: float = 0.0
    targets: list[str] | None = None


class FederatedLoraConfig(FederatedConfig, LoraConfigMixin):
    """A federated phase that trains a LoRA: the knobs of both."""


@runtime_checkable
class SamplingConfig(Protocol):
    """The config fields client sampling reads (every federated method's config has them)."""

    fraction: float
    min_clients: int


@runtime_checkable
class DropoutConfig(Protocol):
    """The config field of a method whose LoRA may drop its inputs (``dropout``, a probability)."""

    dropout: float


class FineTuneSettings(Protocol):
    """The config fields of optional local fine-tuning at personalization (FedIT and the methods like it)."""

    finetune_epochs: float
    finetune_lr: float | None
    lr: float
    batch_size: int


# ================================================================================================== families


class TierConfig(BaseModel):
    """One compute budget: experts per token, LoRA rank of the rank-compressing methods, participation."""

    model_config = ConfigDict(extra="forbid")

    name: str
    top_k: int | None = Field(default=None, ge=1)
    rank: int = Field(default=8, ge=1)
    participation: float | None = Field(default=None, gt=0.0, le=1.0)


def default_tiers() -> list[TierConfig]:
    """FLAME's budgets beta_1 (richest) .. beta_4: top-k 8 / 4 / 2 / 1, baseline ranks 20 / 12 / 8 / 6."""
    budgets = ((8, 20), (4, 12), (2, 8), (1, 6))
    return [TierConfig(name=f"tier{i + 1}", top_k=k, rank=r) for i, (k, r) in enumerate(budgets)]


class TieredConfig(FederatedConfig):
    """A federated LoRA phase with compute tiers; defaults follow paper 004 (Adam, lr 1.5e-4, batch 16, one
    local epoch per round, 2 rounds, every client every round, alpha 16)."""

    rounds: int = 2
    fraction: float = Field(default=1.0, gt=0.0, le=1.0)
    local_steps: int | None = None
    local_epochs: float | None = 1.0
    lr: float = 1.5e-4
    alpha: float = 16.0
    tiers: list[TierConfig] = Field(default_factory=default_tiers)
    client_tiers: dict[str, str] = Field(default_factory=dict)
    eval_tiers: list[str] | None = None
    lora_router: bool = False
    compute_tokens: int = Field(default=128, ge=1)
    compute_repeats: int = Field(default=5, ge=1)

    @model_validator(mode="after")
    def _check_tiers(self) -> TieredConfig:
        names = [t.name for t in self.tiers]
        if not names or len(set(names)) != len(names):
            raise ValueError("tiers must be a non-empty list with distinct names")
        unknown = sorted({*self.client_tiers.values(), *(self.eval_tiers or [])} - set(names))
        if unknown:
            raise ValueError(f"unknown tier(s) {unknown}; the tiers are {names}")
        return self


class RankTieredConfig(TieredConfig):
    """Tiered LoRA whose clients differ in rank; ``train_top_k``: experts per token in local training (``model``:
    the model's own, as the paper runs the baselines; ``tier``: the tier's)."""

    train_top_k: Literal["model", "tier"] = "model"


# Compute per local step relative to SFT, FedMosaic paper Table 15.
PAPER_COMPUTE_SCALE = {
    "sft": 1.0,
    "fedit": 1.0,
    "ditto": 2.0,
    "fedsim": 1.487,
    "takfl": 1.294,
    "perada": 2.294,
    "feddat": 2.564,
    "feddpa": 2.051,
    "fedmkt": 1.574,
    "fedmosaic": 1.098,
}


class HeteroConfig(FederatedLoraConfig):
    """Knobs shared by FedMosaic and its baselines (paper defaults for text-only runs)."""

    rounds: int = 20
    fraction: float = 1.0
    local_steps: int | None = 100
    batch_size: int = 4
    lr: float = 3e-4
    rank: int = 16
    compute_scale: float = Field(default=1.0, gt=0)


class DistillationConfig(HeteroConfig):
    """Knobs of distillation on public data (per round, per architecture)."""

    server_parts = ()  # the mean is then distilled on the server

    kd_samples: int = 32
    kd_steps: int = 10
    kd_lr: float | None = None
    kd_batch_size: int = 4


class BayesTuneSettings(MethodConfig):
    """BayesTune-LoRA's knobs, shared by ``bayestune_lora`` and ``fedp2eft``.

    Defaults: the paper (arXiv:2502.04387, Appendix A.4) and the authors' reference code. ``r_init`` is the rank of
    every module before pruning (the paper: alpha_r_mul 2 x r_max 16 = 32; the reference XNLI config: 16).
    Stage 1, the training of the scales, runs ``stage1_epochs`` epochs, at most ``stage1_steps`` optimizer steps
    when that is set.
    """

    r_max: int = Field(default=16, ge=1)
    r_init: int = Field(default=32, ge=1)
    alpha_multiplier: float = 2.0
    dropout: float = 0.0
    lr: float = 1e-4
    lambda_lr: float = 1e-2
    lambda_init: float = 1e-4
    alpha_s: float = 100.0
    alpha_p: float = 0.01
    batch_size: int = 16
    stage1_epochs: float = Field(default=2.0, gt=0)
    stage1_steps: int | None = Field(default=None, ge=1)
    finetune_epochs: float = 2.0
    finetune_lr: float | None = None

    @model_validator(mode="after")
    def _check_initial_rank(self) -> BayesTuneSettings:
        if self.r_init < self.r_max:
            raise ValueError(
                f"`r_init` ({self.r_init}) must be at least `r_max` ({self.r_max}): the largest budget keeps "
                f"r_max ranks per module on average out of r_init; raise r_init or lower r_max"
            )
        return self


# ================================================================================================== methods


PsgLoss = Literal["sum", "mean"]
"""How the PSG's regression loss reduces over the modules (``fedpeft.adapters.psg``)."""


class FederatedLocalConfig(FederatedLoraConfig):
    """FedIT (T_F = ``rounds``) then local (T_L = ``local_rounds``) then a merge from ``merge_samples`` samples."""

    rounds: int = 50
    fraction: float = 1.0
    local_steps: int | None = 4
    batch_size: int = 4
    lr: float = 1e-4
    dropout: float = 0.05
    local_rounds: int = Field(300, ge=0)
    merge_samples: int = Field(30, ge=2)
    eps: float = Field(1e-8, gt=0)
    parts: bool = True
    uniform_weights: bool = False
