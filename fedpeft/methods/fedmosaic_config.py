"""The settings of FedMosaic (:mod:`fedpeft.methods.fedmosaic`), importable without torch."""

from __future__ import annotations

from pydantic import Field

from fedpeft.settings.methods import (
    PAPER_COMPUTE_SCALE,
    HeteroConfig,
)


class FedMosaicConfig(HeteroConfig):
    server_parts = ()  # relevance-weighted aggregation of PQ-LoRA

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
    # MiB of captured site inputs the alignment holds at once (None: a quarter of the memory free when it starts);
    # more sites than that take one forward pass per group
    align_capture_mb: int | None = Field(default=None, gt=0)
    compute_scale: float = Field(default=PAPER_COMPUTE_SCALE["fedmosaic"], gt=0)
