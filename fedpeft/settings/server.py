"""The settings of a server step: client-level DP, a robust rule, a server optimizer, a merge of LoRA adapters.

The steps themselves are in :mod:`fedpeft.merging` (:mod:`~fedpeft.merging.dp`, :mod:`~fedpeft.merging.robust`,
:mod:`~fedpeft.merging.server_opt`, :mod:`~fedpeft.merging.lora`), which import their settings from here; this
module needs no torch, so a config is checked before torch is imported.
"""

from __future__ import annotations

from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, model_validator

# -------------------------------------------------------------------------------------------------- parts

ServerPart = Literal["mean", "privacy", "robust", "staleness", "optimizer"]
"""A part of a weighted-mean server step (:mod:`fedpeft.merging.parts` builds each): ``mean`` the data-size weighted
mean of the uploads, innermost; ``privacy`` the ``dp`` release (clipped updates, noise) or ``robust`` the
``aggregation`` rule in its place; ``staleness`` an asynchronous ``schedule``'s weighting of stale updates and
mixing; ``optimizer`` the ``server_optimizer`` taking the result as a pseudo-gradient."""

SERVER_PARTS: tuple[ServerPart, ...] = get_args(ServerPart)
"""Every part, innermost first: the server step of a method whose ``aggregate`` is the weighted mean."""

# -------------------------------------------------------------------------------------------------- dp


class DPConfig(BaseModel):
    """Client-level DP of the server's mean (the ``dp`` key of methods whose server step is a weighted mean).

    Attributes:
        clip_norm: C > 0, the largest L2 norm of one client's update.
        noise_multiplier: z >= 0; the Gaussian noise on the sum of clipped updates has standard deviation z * C
            (0: no noise and no privacy guarantee, epsilon = inf).
        delta: the delta at which epsilon is reported, in (0, 1).
        seed: the seed of the noise; ``None`` (the default, what a deployment must use) draws it from the
            operating system's entropy. A fixed seed makes the noise reproducible, for simulations only.
    """

    model_config = ConfigDict(extra="forbid")

    clip_norm: float = Field(gt=0.0)
    noise_multiplier: float = Field(default=1.0, ge=0.0)
    delta: float = Field(default=1e-5, gt=0.0, lt=1.0)
    seed: int | None = None

    @property
    def noise_std(self) -> float:
        """The standard deviation z * C of the noise on the sum of clipped updates."""
        return self.noise_multiplier * self.clip_norm


# ---------------------------------------------------------------------------------------- robust rules


class AggregationConfig(BaseModel):
    """The server's aggregation rule for methods whose server step is a weighted mean (the ``aggregation`` key).

    Attributes:
        robust: ``none`` (the weighted mean), ``clip`` (clip each update's norm to ``clip_norm``, then the weighted
            mean), ``median`` (coordinate-wise median) or ``trimmed_mean`` (coordinate-wise trimmed mean).
        clip_norm: C, the largest L2 norm of one client's update (``clip`` only; required there).
        trim_fraction: beta in [0, 0.5): the fraction of clients dropped at each end by ``trimmed_mean``.
    """

    model_config = ConfigDict(extra="forbid")

    robust: Literal["none", "clip", "median", "trimmed_mean"] = "none"
    clip_norm: float | None = Field(default=None, gt=0.0)
    trim_fraction: float = Field(default=0.1, ge=0.0, lt=0.5)

    @model_validator(mode="after")
    def _consistent(self) -> AggregationConfig:
        if self.robust == "clip" and self.clip_norm is None:
            raise ValueError("`aggregation.robust: clip` needs `aggregation.clip_norm`, the largest update norm")
        if self.robust != "clip" and self.clip_norm is not None:
            raise ValueError("`aggregation.clip_norm` applies only to `aggregation.robust: clip`")
        return self

    @property
    def active(self) -> bool:
        """Whether the rule differs from the plain weighted mean."""
        return self.robust != "none"


# ----------------------------------------------------------------------------------- server optimizers

OptimizerName = Literal["sgd", "avgm", "adam", "yogi", "adagrad"]
ADAPTIVE = ("adam", "yogi", "adagrad")
# The server learning rate when the config gives none (Flower's FedAvgM, FedAdam, FedYogi, FedAdagrad defaults).
DEFAULT_LR: dict[str, float] = {"sgd": 1.0, "avgm": 1.0, "adam": 0.1, "yogi": 0.01, "adagrad": 0.1}
DEFAULT_BETAS = (0.9, 0.99)
DEFAULT_TAU = 1e-3
DEFAULT_MOMENTUM = 0.9


class ServerOptimizerConfig(BaseModel):
    """The server optimizer of a method whose server step is a weighted mean (the ``server_optimizer`` key).

    Attributes:
        name: ``sgd``, ``avgm`` (FedAvgM), ``adam`` (FedAdam), ``yogi`` (FedYogi) or ``adagrad`` (FedAdagrad).
        lr: the server learning rate (eta); default 1 for ``sgd`` and ``avgm``, 0.1 for ``adam`` and ``adagrad``,
            0.01 for ``yogi``.
        betas: (b1, b2), each in [0, 1), the moment decays of ``adam`` and ``yogi`` (default (0.9, 0.99)).
        tau: > 0, the adaptivity of ``adam``, ``yogi`` and ``adagrad`` (default 1e-3).
        momentum: mu in [0, 1), the server momentum of ``avgm`` (default 0.9).

    A key that does not apply to ``name`` is refused, and the defaults are filled in when the config is read.
    """

    model_config = ConfigDict(extra="forbid")

    name: OptimizerName
    lr: float | None = Field(default=None, gt=0.0)
    betas: tuple[float, float] | None = None
    tau: float | None = Field(default=None, gt=0.0)
    momentum: float | None = Field(default=None, ge=0.0, lt=1.0)

    @model_validator(mode="after")
    def _keys_of_the_optimizer(self) -> ServerOptimizerConfig:
        if self.momentum is not None and self.name != "avgm":
            raise ValueError("`server_optimizer.momentum` applies only to `name: avgm`")
        if self.betas is not None and self.name not in ("adam", "yogi"):
            raise ValueError("`server_optimizer.betas` applies only to `name: adam` and `name: yogi`")
        if self.tau is not None and self.name not in ADAPTIVE:
            raise ValueError("`server_optimizer.tau` applies only to `name: adam`, `yogi` and `adagrad`")
        if self.betas is not None and not all(0.0 <= b < 1.0 for b in self.betas):
            raise ValueError("`server_optimizer.betas` must both be in [0, 1)")
        if self.lr is None:
            self.lr = DEFAULT_LR[self.name]
        if self.name in ("adam", "yogi") and self.betas is None:
            self.betas = DEFAULT_BETAS
        if self.name in ADAPTIVE and self.tau is None:
            self.tau = DEFAULT_TAU
        if self.name == "avgm" and self.momentum is None:
            self.momentum = DEFAULT_MOMENTUM
        return self

    @property
    def identity(self) -> bool:
        """Whether the step gives the aggregate itself: ``sgd``, or ``avgm`` without momentum, at ``lr`` 1."""
        return self.lr == 1.0 and (self.name == "sgd" or (self.name == "avgm" and self.momentum == 0.0))


# --------------------------------------------------------------------------------------------- merging

OperatorName = Literal["mean", "task_arithmetic", "ties", "dare_linear", "dare_ties", "iso_c"]
OPERATOR_NAMES: tuple[str, ...] = get_args(OperatorName)
"""The merge operators of :mod:`fedpeft.merging.operators`, by name."""
Split = Literal["sqrt", "a", "b"]


class MergeConfig(BaseModel):
    """How a server merges LoRA adapters (the ``merge`` key of ``guided`` and ``fedit``).

    Attributes:
        operator: one of mean, task_arithmetic, ties, dare_linear, dare_ties, iso_c.
        space: ``ab`` (A and B merged separately) or ``knots`` (shared SVD basis, then truncated SVD).
        alpha: global merge coefficient: Delta_G = alpha * M(...).
        weighting: ``data`` (client weights proportional to training samples) or ``uniform``.
        density: fraction of entries kept by ties / dare.
        majority_sign: TIES's sign election: ``total`` (by sum) or ``frequency``.
        split: where the truncated SVD puts the singular values: ``sqrt`` (sqrt(S) on each of B and A), ``b`` or
            ``a`` (all on that factor).
        tol: singular values of the stacked updates at or below this are dropped (knots); in the truncation,
            directions at or below it are re-initialized like a fresh LoRA (A random, B zero).
    """

    model_config = ConfigDict(extra="forbid")

    operator: OperatorName = "mean"
    space: Literal["ab", "knots"] = "ab"
    alpha: float = Field(default=1.0, ge=0.0)
    weighting: Literal["data", "uniform"] = "data"
    density: float = Field(default=0.2, gt=0.0, le=1.0)
    majority_sign: Literal["total", "frequency"] = "total"
    split: Split = "sqrt"
    tol: float = Field(default=1e-5, ge=0.0)
