"""The checks of a run, before anything is written: those of the config's entries across each other
(:func:`check_config`, :func:`check_frozen_base`) and those that need the data, the methods and, where it is
loaded here, the model (:func:`check_loaded`). Each refusal is one sentence naming the fix (:class:`UserError`)."""

from __future__ import annotations

from collections.abc import Mapping

from fedpeft.core.config import BASE_STAGE_LABEL, ExperimentConfig
from fedpeft.core.errors import UserError
from fedpeft.core.faults import check_fault_clients
from fedpeft.core.registry import METHODS
from fedpeft.data.types import FederatedData
from fedpeft.engine.asynchronous import flight_sizes
from fedpeft.engine.resources import asked_processes
from fedpeft.methods.base import (
    DropoutConfig,
    MeanServerConfigMixin,
    Method,
    method_class,
    method_server_step,
    serves_as_base_stage,
)
from fedpeft.report.loggers import check_loggers
from fedpeft.runner.entries import asynchronous_labels, method_entries
from fedpeft.worker import BASE_LABEL, Worker


def check_config(cfg: ExperimentConfig, data: FederatedData | None) -> None:
    """Refuse what the config's entries cannot do together (every method's own settings were validated with the
    config); ``data``: the federation the run is given, if any (site-local data)."""
    if cfg.data.sites is not None:
        if data is None:
            raise UserError(
                "data.sites keeps the data on the sites of a deployment; run it with `fedpeft launch` or "
                "`flwr run` and SuperNodes started with --node-config \"data-path='DIR'\" (docs/flower.md)."
            )
        if cfg.base.kind == "centralized":
            raise UserError(
                "base.kind=centralized trains on a base corpus in the server, which site-local data "
                "(data.sites) does not have; use base.kind=pretrained or federated."
            )
    if cfg.base.per_seed and cfg.models:
        raise UserError(
            "base.per_seed trains one base model per run seed, but the other architectures of `models` get "
            "theirs once; drop base.per_seed for a federation of several models."
        )
    labels = [entry.label or entry.name for entry in cfg.methods]
    duplicated = sorted({x for x in labels if labels.count(x) > 1})
    if duplicated:
        raise UserError(f"Methods {duplicated} appear twice; give each entry a distinct `label`.")
    if BASE_LABEL in labels or BASE_STAGE_LABEL in labels:
        raise UserError(f"`{BASE_LABEL}` and `{BASE_STAGE_LABEL}` are reserved; give that method another `label`.")
    if cfg.base.kind == "federated" and not serves_as_base_stage(method_class(cfg.base.method.name)):
        usable = ", ".join(n for n in METHODS.names() if serves_as_base_stage(method_class(n)))
        raise UserError(
            f"base.method {cfg.base.method.name!r} cannot produce a base model (its personalized models do not "
            f"merge into base weights, or it needs a budget); use one of: {usable}."
        )
    _check_batch_clients(cfg)


def check_frozen_base(cfg: ExperimentConfig) -> None:
    """Refuse full fine-tuning where the base weights cannot train: a float16 base (loss scaling cannot update
    float16 weights) or a quantized one; the trainer would refuse it at the first client, mid-run."""
    models = [cfg.model, *(cfg.models or {}).values()]
    float16 = any(model.dtype == "float16" for model in models)
    quantized = next((model.quantization for model in models if model.quantization), None)
    if not float16 and quantized is None:
        return
    entries = cfg.methods
    training = [f"method {e.label or e.name!r}" for e in entries if METHODS.get(e.name).trains_base_weights]
    if cfg.base.kind == "centralized":
        training.insert(0, "base.kind centralized")
    elif cfg.base.kind == "federated" and METHODS.get(cfg.base.method.name).trains_base_weights:
        training.insert(0, f"base.method {cfg.base.method.name!r}")
    if not training:
        return
    if quantized is not None:
        raise UserError(
            f"model.quantization {quantized} keeps the base weights frozen (QLoRA), and {', '.join(training)} "
            "train(s) them; drop model.quantization, or leave them out (base.kind pretrained)."
        )
    raise UserError(
        f"model.dtype float16 trains adapters only (loss scaling cannot update float16 weights), and "
        f"{', '.join(training)} train(s) the base weights; use model.dtype bfloat16, or leave them out."
    )


def check_loaded(cfg: ExperimentConfig, worker: Worker, *, flower: bool) -> None:
    """The checks that need the data and the methods (and the model, where this process has it loaded; else they
    run where it is, once the engine has started): clients enough for every method, the budgets, secure
    aggregation, the schedules, clients in batches, the loggers and the injected faults."""
    methods = [worker.methods[entry.label or entry.name] for entry in cfg.methods]
    data = worker.data
    seen = len(data.pool("seen"))
    if not seen:
        raise UserError("The dataset has no client in the seen pool; check the data settings.")
    entries = [(f"methods.{i}", entry) for i, entry in enumerate(cfg.methods)]
    if cfg.base.kind == "federated":
        entries.append(("base.method", cfg.base.method))
    for key, entry in entries:
        needed = getattr(entry, "min_clients", 1)
        if needed > seen:
            raise UserError(
                f"Method {entry.label or entry.name!r} needs min_clients={needed} per round ({key}.min_clients), "
                f"but only {seen} clients are in the seen pool; lower {key}.min_clients or add clients."
            )
    if worker.federation.loaded():  # else checked where the model is, once the engine has started
        worker.check_model(cfg.budgets)
    for method in methods:
        if method.uses_budget:
            method.check_budgets(list(cfg.budgets))  # e.g. budgets above what a method's rank scales serve
    _check_secure_aggregation(cfg, worker, methods, flower=flower)
    _check_schedules(cfg, data, worker.methods)
    _check_batch_model(cfg, worker, flower=flower)
    check_loggers(cfg.log.tensorboard, cfg.log.wandb)
    check_fault_clients(cfg.faults, {c.client_id: c.pool for c in data.clients})


def _check_secure_aggregation(cfg: ExperimentConfig, worker: Worker, methods: list[Method], *, flower: bool) -> None:
    """Refuse ``engine.secagg`` where it cannot run: off the Flower engine, for a method whose server step is
    not a weighted mean of the uploads, and with a server step that needs the individual updates."""
    if cfg.engine.secagg is None:
        return
    if not flower:
        raise UserError("Secure aggregation (engine.secagg) runs on the Flower engine; add `--engine flower`.")
    federated = [m for m in methods if m.federated]
    if cfg.base.kind == "federated":
        federated.append(worker.methods[BASE_STAGE_LABEL])
    for method in federated:
        if method_server_step(method) is None:
            raise UserError(
                f"Method {method.label!r} cannot run under secure aggregation (engine.secagg): its server step "
                "is not a weighted mean of the uploads, and the server would see only their sum."
            )
        settings = method.cfg
        if isinstance(settings, MeanServerConfigMixin) and (settings.dp is not None or settings.aggregation.active):
            raise UserError(
                f"Method {method.label!r} sets `dp` or `aggregation.robust`, which need the individual updates; "
                "secure aggregation (engine.secagg) shows the server only their sum."
            )


def _check_schedules(cfg: ExperimentConfig, data: FederatedData, methods: Mapping[str, Method]) -> None:
    """Refuse asynchronous schedules with secure aggregation (which sums a cohort of updates) or with more
    clients in flight, or a larger buffer, than the seen pool serves (:func:`flight_sizes`), and speed factors
    of client groups the data does not have."""
    asynchronous = asynchronous_labels(cfg)
    seen = [c.client_id for c in data.pool("seen")]
    labels = [entry.label or entry.name for entry in cfg.methods]
    federated_base = [BASE_STAGE_LABEL] if cfg.base.kind == "federated" else []
    for label in labels + federated_base:
        method_cfg = methods[label].cfg
        if isinstance(method_cfg, MeanServerConfigMixin) and method_cfg.schedule.asynchronous:
            flight_sizes(label, method_cfg.schedule, len(methods[label].sample(seen, 0, 0)), len(seen))
    if asynchronous and cfg.engine.secagg is not None:
        raise UserError(
            f"Secure aggregation needs a cohort of updates to sum, and {', '.join(asynchronous)} set(s) an "
            "asynchronous schedule, whose server steps take updates one by one as they arrive; drop engine.secagg "
            "or set schedule.kind: sync."
        )
    groups = {c.group for c in data.clients}
    unknown = sorted(set(cfg.clients.speed.groups) - groups)
    if unknown:
        raise UserError(
            f"clients.speed.groups names groups the data does not have ({', '.join(unknown)}); its groups: "
            f"{', '.join(sorted(g for g in groups if g is not None))}."
        )


def _check_batch_clients(cfg: ExperimentConfig) -> None:
    """Refuse, from the config alone, ``engine.batch_clients`` above 1 where a batch cannot train each client
    exactly as alone: on the Flower engine, with worker processes, for methods whose clients cannot train
    together, with LoRA dropout, and with one base model per architecture."""
    if cfg.engine.batch_clients < 2:
        return
    fix = "set engine.batch_clients=1"
    if cfg.engine.name == "flower":
        raise UserError(f"engine.batch_clients runs on the local engine; run without `--engine flower` or {fix}.")
    if asked_processes(cfg.engine):
        raise UserError(
            "engine.batch_clients does not combine with engine.workers of 2 or more yet; set one of them to 1."
        )
    entries = method_entries(cfg)
    refused = [entry.label or entry.name for entry in entries if not method_class(entry.name).batchable_clients]
    if refused:
        batchable = ", ".join(n for n in METHODS.names() if method_class(n).batchable_clients)
        raise UserError(
            f"engine.batch_clients trains clients together only for methods whose clients each train a plain "
            f"LoRA ({batchable}), not {', '.join(refused)}; {fix} or run those methods in a config of their own."
        )
    dropout = [entry.label or entry.name for entry in entries if isinstance(entry, DropoutConfig) and entry.dropout]
    if dropout:
        raise UserError(
            f"engine.batch_clients needs LoRA dropout 0 (each client would draw its own masks), and "
            f"{', '.join(dropout)} set(s) a dropout; set it to 0 or {fix}."
        )
    if len(cfg.models) > 1:
        raise UserError(f"engine.batch_clients trains clients of one base model, not of several architectures; {fix}.")


def _check_batch_model(cfg: ExperimentConfig, worker: Worker, *, flower: bool) -> None:
    """Refuse ``engine.batch_clients`` above 1 where the loaded model or the engine cannot train clients together
    exactly as alone: the Flower engine, a base model per client, and what :func:`batching_refusal` names."""
    from fedpeft.models.multi_lora import batching_refusal

    if cfg.engine.batch_clients < 2:
        return
    fix = "set engine.batch_clients=1"
    if flower:
        raise UserError(f"engine.batch_clients runs on the local engine, not in a Flower ServerApp; {fix}.")
    if worker.bases.per_client_base:
        raise UserError(
            f"engine.batch_clients trains clients that share one base model, and base.method "
            f"{cfg.base.method.name!r} gives every client its own; {fix}."
        )
    problem = batching_refusal(worker.runtime)
    if problem is not None:
        raise UserError(problem)
