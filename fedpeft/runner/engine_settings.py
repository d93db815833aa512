"""The engine's settings of one run, resolved once, before the worker is built (:func:`run_engine_settings`): how
many worker processes run the clients, the threads of each, their GPUs, where client states live between rounds
and how many units run at once (:class:`~fedpeft.engine.resources.EngineSettings`). The worker and the engine are
built from that one object; the config keeps what was asked, and the run's first line says what it got."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from fedpeft.core.config import ExperimentConfig, ModelConfig
from fedpeft.core.errors import UserError
from fedpeft.data.types import FederatedData
from fedpeft.engine.resources import EngineSettings, resolve_engine
from fedpeft.models.runtime import resolve_device
from fedpeft.planning.devices import CUDA_CONTEXT_BYTES


def run_engine_settings(cfg: ExperimentConfig, data: FederatedData, gpus: Sequence[str]) -> EngineSettings:
    """The engine's settings for this run on the GPUs ``gpus`` (those worker processes are pinned to).

    On the local engine, :func:`~fedpeft.engine.resources.resolve_engine` with the memory estimate of a worker
    process (docs/flower.md, "Simulation on one machine", ``engine.workers``): each holds what this process holds
    now (the data: its resident size) plus, on the CPU, the model's weights (which this process has not loaded, or
    mapped without reading them: their size as the planning formulas count them from the model's config.json, when
    it is known); on a GPU, those weights plus half again for training. A number of processes that does not fit is
    refused; ``auto`` takes as many as fit. On the Flower engine, where the nodes run the clients in processes of
    their own, the config's store of client states and no worker process here.
    """
    if cfg.engine.name != "local":
        return EngineSettings.as_asked(cfg.engine)
    import psutil

    per_process = psutil.Process().memory_info().rss
    weights = estimated_weight_bytes(cfg.model)
    if resolve_device(cfg.device) == "cpu":
        per_process += weights
    return resolve_engine(
        cfg.engine,
        threads=cfg.threads,
        clients=len(data.clients),
        gpus=gpus,
        per_process=per_process,
        available=psutil.virtual_memory().available,
        gpu_bytes=int(weights * 1.5) + CUDA_CONTEXT_BYTES,
        gpu_free=lambda index: torch.cuda.mem_get_info(index)[0],
    )


def estimated_weight_bytes(model: ModelConfig) -> int:
    """The base weights of ``model`` in its dtype (or quantization), counted by the planning formulas from its
    config.json (``fedpeft plan``); 0 when no config.json of it is known (a hub model not downloaded yet)."""
    from fedpeft.planning.architecture import weight_bytes
    from fedpeft.planning.plan import model_architecture

    try:
        architecture = model_architecture(model)
    except UserError:
        return 0
    return int(weight_bytes(architecture)[model.quantization or model.dtype])
