"""Every method's ``Config``, and the bases and family configs they build on, importable without torch.

A method module imports its config from here (``from fedpeft.settings.methods import XConfig``) and sets
``Config = XConfig``; the method catalogue reads that line, so ``core.config`` validates a ``methods`` entry with
this module alone. The order: the bases (:class:`MeanServerConfigMixin`, :class:`FederatedConfig`,
:class:`LoraConfigMixin`, :class:`FederatedLoraConfig` and the protocols of config fields), the family configs
(tiers, rank tiers, the FedMosaic baselines, distillation, BayesTune), then each method's own, by method name.

A config says whether its method's server step is the weighted mean of the uploads
(:meth:`MeanServerConfigMixin.mean_server_step`): ``Method.server_step`` gives none otherwise, and the config check
refuses the server step's settings such a method cannot apply (:meth:`MeanServerConfigMixin.refused_server_settings`).
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field, model_validator

from fedpeft.core.method_class import MethodConfig
from fedpeft.settings.schedule import ScheduleConfig
from fedpeft.settings.server import AggregationConfig, DPConfig, MergeConfig, ServerOptimizerConfig

# ================================================================================================== bases


class MeanServerConfigMixin(BaseModel):
    """The server step's knobs of a method whose server step is the weighted mean of the uploads
    (docs/privacy.md): a robust rule (``aggregation``) or client-level differential privacy (``dp``), not both,
    a server optimizer applied to the result (``server_optimizer``, docs/server-optimizers.md), and when the server
    steps (``schedule``: synchronous rounds, or asynchronously, docs/async.md)."""

    server_is_mean: ClassVar[bool] = True
    """Whether the method's server step is the weighted mean of the uploads; a config class whose method's
    ``aggregate`` does something else sets it False (then ``aggregation``, ``dp``, ``server_optimizer`` and secure
    aggregation do not apply)."""

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

    def mean_server_step(self) -> bool:
        """Whether the server step this config gives its method is the weighted mean (``Method.server_step`` is
        ``None`` otherwise): :attr:`server_is_mean`, unless a subclass's settings decide (FedIT's ``merge``)."""
        return self.server_is_mean

    def refused_server_settings(self) -> list[str]:
        """The server-step settings of this config that its method's server step cannot apply, as a config names
        them: all that are set (a robust ``aggregation``, ``dp``, ``server_optimizer``, an asynchronous
        ``schedule``) when :meth:`mean_server_step` is False. ``core.config.method_config`` refuses a config for
        which this is not empty."""
        used = []
        if self.schedule.asynchronous:
            used.append(f"`schedule.kind: {self.schedule.kind}`")
        if self.aggregation.active:
            used.append("`aggregation.robust`")
        if self.dp is not None:
            used.append("`dp`")
        if self.server_optimizer is not None:
            used.append("`server_optimizer`")
        return used if used and not self.mean_server_step() else []


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

    server_is_mean = False  # the mean is then distilled on the server

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


class AdaLoraBaselineConfig(MethodConfig):
    epochs: float = 2.0
    lr: float = 1e-3
    batch_size: int = 16
    init_rank_multiplier: float = 1.5
    alpha_multiplier: float = 2.0
    dropout: float = 0.0
    delta_t: int = 1
    orth_reg_weight: float = 0.1
    warmup_fraction: float = 0.1
    final_fraction: float = 0.3
    beta1: float = 0.85
    beta2: float = 0.85


class BayesTuneLoraConfig(BayesTuneSettings):
    """BayesTune-LoRA's settings; stage 1 has the same budget as FedP2EFT's (``stage1_epochs``, ``stage1_steps``)."""


class DeptSpecConfig(FederatedConfig):
    rounds: int = 100
    lr: float = 5e-5


class DittoConfig(HeteroConfig):
    lam: float = 0.1
    compute_scale: float = Field(default=PAPER_COMPUTE_SCALE["ditto"], gt=0)


class FedALTConfig(FederatedLoraConfig):
    server_is_mean = False  # the server builds each client's rest-of-world LoRA

    lr: float = 1e-4
    mixer_lr: float | None = None
    unseen_steps: int = Field(0, ge=0)


class FedAvgFullConfig(FederatedConfig):
    rounds: int = 100
    lr: float = 5e-5


class FedDATConfig(HeteroConfig):
    kd_weight: float = 1.0
    kd_temperature: float = 1.0
    compute_scale: float = Field(default=PAPER_COMPUTE_SCALE["feddat"], gt=0)


class FedDPAConfig(FederatedConfig):
    rounds: int = 100
    lr: float = 5e-5
    rank: int = 8
    alpha: float = 8.0
    dropout: float = 0.05
    targets: str | list[str] = "qv"
    local_weight: float = 0.5
    max_weight: float = 0.5
    reference_instances: int = 5
    unseen_local_epochs: float = 1.0


class FedExLoraConfig(FederatedLoraConfig):
    """FedEX-LoRA's knobs: the LoRA shape, the clients' weights in the means, optional local fine-tuning."""

    server_is_mean = False  # the residual needs the plain mean of the factors and of their products

    # uniform: 1/K per client, as the authors' aggregate_models_ours; examples: by training examples (FedAvg).
    weighting: Literal["uniform", "examples"] = "uniform"
    finetune_epochs: float = 0.0
    finetune_lr: float | None = None


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

    def mean_server_step(self) -> bool:
        """The weighted mean and the config's rules around it, unless ``merge`` replaces the mean."""
        return self.merge is None


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
    def _lr_schedule_by_its_old_name(cls, data: Any) -> Any:
        """``schedule: cosine | constant``, the learning-rate schedule's name before ``schedule`` named when the
        server steps, is read as ``lr_schedule``."""
        if isinstance(data, dict) and isinstance(data.get("schedule"), str) and "lr_schedule" not in data:
            data = {**data, "lr_schedule": data["schedule"]}
            del data["schedule"]
        return data

    # Wider than LoraConfigMixin's list: FedITMerged.spec resolves it (``qv``, ``all`` or a list) for FedIT.
    targets: str | list[str] = "qv"  # type: ignore[assignment]


class FedL2PConfig(FederatedConfig):
    rounds: int = 150
    lr: float = 1e-4  # initial post-multiplier: the fine-tuning rate the multipliers scale
    mlp_lr: float = 1e-4
    post_lr: float = 1e-6
    hidden: int = 100
    max_multiplier: float = 1000.0
    outer_steps: int = 3
    outer_batch_size: int = 16
    neumann_steps: int = 3
    psi: float = 0.1
    clamp: float = 1.0
    val_fraction: float = 0.2
    patience: int = 50
    finetune_epochs: float = 2.0
    alpha_multiplier: float = 2.0
    dropout: float = 0.0
    default_rank: int = 8


class FedMKTConfig(DistillationConfig):
    compute_scale: float = Field(default=PAPER_COMPUTE_SCALE["fedmkt"], gt=0)


class FedMosaicConfig(HeteroConfig):
    server_is_mean = False  # relevance-weighted aggregation of PQ-LoRA

    pq_lr: float | None = None  # learning rate of P and Q (default: lr)
    blocks: int = 4  # N_B
    pq: bool = True  # False: ordinary LoRA everywhere (the "vanilla" ablation)
    rela: bool = True  # False: uniform weights over all clients
    tau: float = 0.5
    ema: float = 0.5
    noise: float = 1e-4
    keep: float = Field(default=0.4, gt=0, le=1)
    grad_every: int = 10  # m
    grad_module: str = "down_proj"
    pivot: str | None = None  # architecture of W_s and of the alignment pivot (default: the smallest)
    align: bool = True
    align_samples: int = 5000
    align_lr: float = 5e-5
    align_epochs: float = 1.0
    align_batch_size: int = 4
    align_lambda: float = 0.5
    cca_reg: float = 1e-3
    compute_scale: float = Field(default=PAPER_COMPUTE_SCALE["fedmosaic"], gt=0)


PsgLoss = Literal["sum", "mean"]
"""How the PSG's regression loss reduces over the modules (``fedpeft.adapters.psg``)."""


class FedP2EFTConfig(BayesTuneSettings, MeanServerConfigMixin):  # the PSG's server step is a weighted mean
    rounds: int = 150
    fraction: float = 0.1
    min_clients: int = 1
    psg_lr: float = 1e-4
    psg_steps: int = Field(default=10, ge=0)
    psg_loss: PsgLoss = "sum"
    psg_gain: float = 1e-6
    psg_bias: float = 1e-4
    stats_batch_size: int = 64


class FedProxConfig(FedITConfig):
    mu: float = 0.01


class FedSALoraConfig(FederatedLoraConfig):
    lr: float = 1e-4
    finetune_steps: int = Field(0, ge=0)


class FedSimConfig(HeteroConfig):
    compute_scale: float = Field(default=PAPER_COMPUTE_SCALE["fedsim"], gt=0)


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


class FFALoraConfig(FederatedLoraConfig):
    lr: float = 1e-4


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


class FlameConfig(TieredConfig):
    server_is_mean = False  # per-tier rescaled aggregation of the experts' LoRAs

    rank: int = Field(default=20, ge=1)
    temperature: float = Field(default=2.0, ge=0.0)
    rescaler: Literal["learned", "static", "none"] = "learned"
    rescaler_init: Literal["one", "ratio"] = "one"
    # The paper trains s_i in the client's one Adam at lr 1.5e-4; None keeps that, a value gives s_i its own rate.
    rescaler_lr: float | None = Field(default=None, gt=0.0)


class FlexLoraConfig(RankTieredConfig):
    """FlexLoRA's settings: those of every rank-tiered baseline."""

    server_is_mean = False  # SVD of the mean of the full-size updates


class FloraConfig(FederatedLoraConfig):
    """FLoRA's knobs: the LoRA shape (``rank`` for clients not given another), heterogeneous ranks, fine-tuning."""

    server_is_mean = False  # the server folds the weighted sum of the clients' products, not a mean of their factors

    ranks: list[int] | None = Field(default=None, min_length=1)
    client_ranks: dict[str, int] = Field(default_factory=dict)
    # None: each client's own alpha_k / r_k (the mean of the updates the clients trained); a number: every product
    # folded at that scaling (the authors' code: lora_alpha / lora_r, whatever the clients trained with).
    merge_scaling: float | None = Field(default=None, gt=0)
    finetune_epochs: float = 0.0
    finetune_lr: float | None = None


class GuidedConfig(FederatedLoraConfig):
    """The paper's protocol by default (Section 3): 20 rounds of every client, one local epoch per round,
    batch 32, AdamW at lr 5e-5, LoRA rank 8. ``local_steps`` given without ``local_epochs`` replaces the epoch."""

    server_is_mean = False  # a merge operator (`merge`), with ReLoRA folds

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
    def _steps_replace_the_epoch(cls, data: Any) -> Any:
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


class HetLoraConfig(RankTieredConfig):
    server_is_mean = False  # zero-padded, sparsity-weighted aggregation across ranks

    self_pruning: bool = False
    prune_gamma: float = Field(default=0.9, gt=0.0, lt=1.0)
    prune_lambda: float = Field(default=1e-3, ge=0.0)
    min_rank: int = Field(default=1, ge=1)


class LocalConfig(MethodConfig, LoraConfigMixin):
    rounds: int = 10
    local_steps: int = 10
    lr: float = 1e-4
    batch_size: int = 16


class LoraBaselineConfig(MethodConfig):
    epochs: float = 2.0
    lr: float = 1e-4
    batch_size: int = 16
    alpha_multiplier: float = 2.0
    dropout: float = 0.0


class PerAdaConfig(DistillationConfig):
    lam: float = 0.1
    compute_scale: float = Field(default=PAPER_COMPUTE_SCALE["perada"], gt=0)


GRID = [round(0.1 * i, 1) for i in range(11)]
"""Potara's mixing weights tried by ``grid_search`` (0, 0.1, ..., 1) unless ``grid`` gives others."""


class PotaraConfig(FederatedLocalConfig):
    granularity: Literal["global", "ab", "module"] = "global"
    grid_search: bool = False
    grid: list[float] = Field(default_factory=lambda: list(GRID))
    grid_holdout: float = Field(0.2, ge=0.0, lt=0.9)


Factor = Literal["A", "B"]
"""A LoRA factor: RoLoRA trains one of them each round."""


class RoLoraConfig(FederatedLoraConfig):
    """RoLoRA's knobs: the LoRA shape, the factor of the first round, optional local fine-tuning."""

    first: Factor = "B"
    finetune_epochs: float = 0.0
    finetune_lr: float | None = None


class SftRoundsConfig(HeteroConfig):
    server_is_mean = False  # nothing is aggregated


class TAKFLConfig(DistillationConfig):
    compute_scale: float = Field(default=PAPER_COMPUTE_SCALE["takfl"], gt=0)


class TrivialLoraConfig(RankTieredConfig):
    rank: int | None = None
