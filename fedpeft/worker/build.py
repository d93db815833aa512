"""What a worker builds once per process: the methods of the config, the federated data and the model runtime of
each architecture (a centralized base stage of an architecture other than the first trained once and reused)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fedpeft.base_models import train_centralized_base
from fedpeft.core.checkpoints import SUFFIX, load_checkpoint, save_checkpoint
from fedpeft.core.config import ExperimentConfig, MethodConfig, ModelConfig, method_config
from fedpeft.core.registry import DATASETS
from fedpeft.data.types import FederatedData
from fedpeft.methods.base import Method, method_class
from fedpeft.methods.families.per_architecture import for_architectures
from fedpeft.models.runtime import ModelRuntime


def build_method(entry: MethodConfig | dict[str, Any], experiment: ExperimentConfig | None = None) -> Method:
    """Instantiate a registered method from its typed config (or a config mapping ``{"name": ..., **fields}``).

    With the ``experiment`` config of a heterogeneous federation, a method that cannot share across
    architectures runs once per architecture group (:mod:`fedpeft.methods.families.per_architecture`).
    """
    cfg = method_config(entry)
    method: Method = method_class(cfg.name)(cfg)
    if experiment is not None:
        method = for_architectures(method, len(experiment.models) > 1)
    return method


def build_data(cfg: ExperimentConfig) -> FederatedData:
    """Build the federated dataset named in the config."""
    import fedpeft.data.catalog  # noqa: F401  (registers the datasets)

    return DATASETS.get(cfg.data.name)(cfg.data)


def build_runtime(cfg: ExperimentConfig, data: FederatedData, model: ModelConfig | None = None) -> ModelRuntime:
    """Load the base model once for this process (``model``: another architecture's; default: the first one)."""
    from fedpeft.models.runtime import resolve_device
    from fedpeft.models.table import load_model

    model = model or (next(iter(cfg.models.values())) if cfg.models else cfg.model)
    device = resolve_device(cfg.device)
    loaded = load_model(model, task=data.task, num_labels=data.num_labels, corpus=data.corpus, device=device)
    runtime_class = ModelRuntime
    if getattr(loaded.model.config, "vision_config", None) is not None:  # image-text models (LLaVA)
        from fedpeft.models.multimodal import MultimodalRuntime

        runtime_class = MultimodalRuntime
    return runtime_class(
        loaded,
        max_length=model.max_length,
        device=device,
        eval_batch_size=cfg.eval.batch_size,
        max_new_tokens=cfg.eval.max_new_tokens,
        dtype=model.dtype,
        grad_accum_steps=cfg.train.grad_accum_steps,
        chat_template=model.chat_template,
        max_steps=cfg.train.max_steps,
        eval_max_batches=cfg.eval.max_batches,
        statistics_max_batches=cfg.train.max_statistics_batches,
    )


def build_architecture(
    cfg: ExperimentConfig, data: FederatedData, run_dir: Path, name: str, *, first: bool
) -> ModelRuntime:
    """Load architecture ``name``; with a centralized base stage, its base model is trained once on the base
    corpus like the first architecture's (``checkpoints/base-centralized-<name>.safetensors``) and reused; the
    ``first`` architecture is loaded as it is (its base stage is the run's own)."""
    if first:
        return build_runtime(cfg, data)
    runtime = build_runtime(cfg, data, cfg.models[name])
    base = cfg.base
    if base.kind == "centralized":
        path = run_dir / "checkpoints" / f"base-centralized-{name}{SUFFIX}"
        if not path.exists():
            train_centralized_base(runtime, data.base_train, base)
            save_checkpoint({"tensors": runtime.base_state()}, path)
        runtime.set_initial_base(load_checkpoint(path)["tensors"])
    return runtime
