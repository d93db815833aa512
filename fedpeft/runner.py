"""An experiment end to end: base-model stage -> federated methods -> personalization -> evaluation -> outputs.

Work is cut into units (the base stage of a seed, the base row of a seed, one method for one seed). A unit writes
its records to ``parts/`` when it completes, and federated phases checkpoint every round, so ``--resume`` skips
finished units and continues a federated phase from its last completed round. Every random draw derives from
(seed, method, phase, round, client), so a resumed run ends with the numbers of an uninterrupted one.
"""

from __future__ import annotations

import contextlib
import datetime
import itertools
import json
import logging
import math
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

import torch

from fedpeft.base_models import train_centralized_base
from fedpeft.core.checkpoints import SUFFIX, has_checkpoint, load_checkpoint, save_checkpoint
from fedpeft.core.config import ExperimentConfig, ModelConfig, dump_config, dump_given
from fedpeft.core.costs import FAILED_CLIENT, CostMeter
from fedpeft.core.errors import AllClientsFailedError, MissingResultsError, UserError
from fedpeft.core.faults import check_fault_clients
from fedpeft.core.io import write_text_atomic
from fedpeft.core.method_class import MethodConfig
from fedpeft.core.progress import Progress
from fedpeft.core.records import ResultRecord, result_record
from fedpeft.core.registry import METHODS
from fedpeft.core.types import Metrics, ServerState
from fedpeft.data.types import ClientData, FederatedData
from fedpeft.engine.asynchronous import AsynchronousSchedule, client_work, flight_sizes, virtual_durations
from fedpeft.engine.phase import FederatedPhase, PhaseCheckpoint, RoundCallback, Schedule
from fedpeft.engine.pool import visible_gpus
from fedpeft.engine.resources import EngineSettings, asked_processes, check_gpu_workers, resolve_engine
from fedpeft.engine.rounds import Engine, SynchronousRounds
from fedpeft.engine.validation import UpdateChecks
from fedpeft.methods.base import (
    DropoutConfig,
    FederatedConfig,
    MeanServerConfigMixin,
    Method,
    method_class,
    method_server_step,
    serves_as_base_stage,
)
from fedpeft.models.runtime import check_device, resolve_device
from fedpeft.report.loggers import MetricLog, check_loggers
from fedpeft.rundir import DATA_FILE, RunDirectory
from fedpeft.worker import BASE_LABEL, BASE_STAGE_LABEL, Worker, base_model_dir, build_data

log = logging.getLogger("fedpeft")

CUDA_CONTEXT_BYTES = 512 * 2**20  # what a process's CUDA context takes on its GPU before any tensor
ENGINE_PART = "engine"  # parts/engine.jsonl: the engine's own cost rows
UnitWork = Callable[[], tuple[list[ResultRecord], list[dict]]]  # a unit's work: its records and cost rows
EngineFactory = Callable[[Worker], Engine]


class Experiment:
    """A configured experiment bound to an output directory (the server side of every engine).

    Constructing it checks the config's entries across each other and loads nothing; :meth:`run` checks the
    output directory, builds the worker (data and model) and the engine, and hands them to the run's
    :class:`Stages`.
    """

    def __init__(
        self, cfg: ExperimentConfig, out: Path, progress: Progress | None = None, data: FederatedData | None = None
    ) -> None:
        """``data``: the federation as the server sees it, when it does not build it from the config (site-local
        data, :func:`fedpeft.engine.flower.membership.register_sites`)."""
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
        self._gpus = visible_gpus(cfg.device) if cfg.engine.name == "local" else []
        # What the engine runs on, resolved once the data is known (_load); until then, nothing runs.
        self.engine_settings = EngineSettings(state=cfg.engine.state, asked=cfg.engine.workers)
        # Every method's settings were validated with the config; what remains are facts across entries.
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
        self.cfg = cfg
        self.directory = RunDirectory(out, dump_config(cfg))
        self.progress = progress or Progress()
        self._given_data = data
        self._check_batch_clients()

    @property
    def out(self) -> Path:
        """The output directory."""
        return self.directory.path

    def check_output(self, *, resume: bool = False, force: bool = False) -> None:
        """Raise a :class:`UserError` unless this run may write into its output directory; writes nothing
        (:meth:`fedpeft.rundir.RunDirectory.check`)."""
        self.directory.check(resume=resume, force=force)

    # ------------------------------------------------------------------ entry point
    def run(self, *, resume: bool = False, force: bool = False, engine_factory: EngineFactory | None = None) -> Path:
        """Run every unit not done yet and write the outputs; returns the output directory.

        The output directory is checked first and created only once the data, the model and the methods'
        settings have passed their checks; a run that fails before its first result removes what it created.

        Args:
            resume: continue the run already in the output directory.
            force: write into a non-empty directory that holds no fedpeft run, beside its files.
            engine_factory: builds the engine from this process's worker (the Flower ServerApp passes one that
                talks to its grid); by default the engine named in the config.

        The directory is locked from its creation until the run ends (:class:`fedpeft.rundir.RunLock`): a second
        run into it meanwhile is refused.
        """
        try:
            return self._run(resume=resume, force=force, engine_factory=engine_factory)
        finally:
            self.directory.release()

    def _run(self, *, resume: bool, force: bool, engine_factory: EngineFactory | None) -> Path:
        self.directory.check(resume=resume, force=force)
        worker = self._load(flower=engine_factory is not None or self.cfg.engine.name == "flower")
        if self.cfg.engine.name == "local":
            self.progress.note(self.engine_settings.line())
        fresh = self.directory.create(dump_given(self.cfg), environment(self.cfg.device))
        try:
            metric_log = MetricLog(
                self.out,
                self.cfg.name,
                tensorboard=self.cfg.log.tensorboard,
                wandb=self.cfg.log.wandb,
                config=self.cfg.model_dump(mode="json"),
            )
            engine = engine_factory(worker) if engine_factory else self._local_engine(worker)
            if not worker.federation.loaded():  # the checks that need the model, where it is
                engine.call_worker("check_model", worker, budgets=list(self.cfg.budgets))
            stages = Stages(self.cfg, self.directory, worker, engine, metric_log, self.progress)
            try:
                stages.run()
            finally:
                engine.close()
                stages.write_engine_costs(engine.cost_rows())
                metric_log.close()
        except BaseException:
            if fresh and not self.directory.has_progress():
                self.directory.discard()
            raise
        records = stages.write_outputs()
        tested = [c for c in stages.data.clients if c.test]
        budgets = list(self.cfg.budgets)
        # A method evaluates the clients it has a budget for: a tiered method with `eval_tiers` only those tiers'.
        evaluates = {
            label: [c.client_id for c in tested if m.budgets_of(c, budgets)] for label, m in worker.methods.items()
        }
        check_result_coverage(
            records,
            [c.client_id for c in tested],
            self.cfg.validation.min_result_fraction,
            self.out / "summary.md",
            evaluates=evaluates,
        )
        return self.out

    def _load(self, *, flower: bool) -> Worker:
        """This process's worker (data, model, methods), once every check that needs them has passed; nothing is
        written before."""
        check_device(self.cfg.device)
        self._check_frozen_base()
        check_gpu_workers(self.cfg.engine, self._gpus)
        data = self._given_data if self._given_data is not None else build_data(self.cfg)
        if self.cfg.engine.name == "local":
            self.engine_settings = self._resolve_engine(data)
        settings = self.engine_settings
        load_model = flower or not settings.processes  # else its worker processes load it
        worker = Worker(self.cfg, self.out, data=data, load_model=load_model, state=settings.state)
        if not load_model and self._trains_centralized_base(worker):
            # Trained here before any client runs: loaded now, so that the checks of the model run here too and the
            # base stage starts while the worker processes start, not once one of them is ready.
            worker.runtime  # noqa: B018
        methods = [worker.methods[entry.label or entry.name] for entry in self.cfg.methods]
        data = worker.data
        seen = len(data.pool("seen"))
        if not seen:
            raise UserError("The dataset has no client in the seen pool; check the data settings.")
        entries = [(f"methods.{i}", entry) for i, entry in enumerate(self.cfg.methods)]
        if self.cfg.base.kind == "federated":
            entries.append(("base.method", self.cfg.base.method))
        for key, entry in entries:
            needed = getattr(entry, "min_clients", 1)
            if needed > seen:
                raise UserError(
                    f"Method {entry.label or entry.name!r} needs min_clients={needed} per round ({key}.min_clients), "
                    f"but only {seen} clients are in the seen pool; lower {key}.min_clients or add clients."
                )
        if worker.federation.loaded():  # else checked where the model is, once the engine has started
            worker.check_model(self.cfg.budgets)
        for method in methods:
            if method.uses_budget:
                method.check_budgets(list(self.cfg.budgets))  # e.g. budgets above what a method's rank scales serve
        self._check_secure_aggregation(worker, methods, flower=flower)
        self._check_schedules(data, worker.methods)
        self._check_batch_model(worker, flower=flower)
        check_loggers(self.cfg.log.tensorboard, self.cfg.log.wandb)
        check_fault_clients(self.cfg.faults, {c.client_id: c.pool for c in data.clients})
        return worker

    def _trains_centralized_base(self, worker: Worker) -> bool:
        """Whether this run trains a centralized base stage (in this process) that it has not trained yet."""
        if self.cfg.base.kind != "centralized":
            return False
        return not all(has_checkpoint(worker.base_checkpoint(seed), self.out) for seed in self.cfg.seeds)

    def _check_frozen_base(self) -> None:
        """Refuse full fine-tuning where the base weights cannot train: a float16 base (loss scaling cannot update
        float16 weights) or a quantized one; the trainer would refuse it at the first client, mid-run."""
        models = [self.cfg.model, *(self.cfg.models or {}).values()]
        float16 = any(model.dtype == "float16" for model in models)
        quantized = next((model.quantization for model in models if model.quantization), None)
        if not float16 and quantized is None:
            return
        entries = self.cfg.methods
        training = [f"method {e.label or e.name!r}" for e in entries if METHODS.get(e.name).trains_base_weights]
        if self.cfg.base.kind == "centralized":
            training.insert(0, "base.kind centralized")
        elif self.cfg.base.kind == "federated" and METHODS.get(self.cfg.base.method.name).trains_base_weights:
            training.insert(0, f"base.method {self.cfg.base.method.name!r}")
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

    def _resolve_engine(self, data: FederatedData) -> EngineSettings:
        """The engine's settings for this run (:func:`~fedpeft.engine.resources.resolve_engine`), with the memory
        estimate of a worker process (docs/flower.md, "Simulation on one machine", ``engine.workers``): each holds
        what this process holds now (the data: its resident size) plus, on the CPU, the model's weights (which this
        process has not loaded, or mapped without reading them: their size as the planning formulas count them from
        the model's config.json, when it is known); on a GPU, those weights plus half again for training. A number
        of processes that does not fit is refused; ``auto`` takes as many as fit."""
        import psutil

        per_process = psutil.Process().memory_info().rss
        weights = estimated_weight_bytes(self.cfg.model)
        if resolve_device(self.cfg.device) == "cpu":
            per_process += weights
        return resolve_engine(
            self.cfg.engine,
            threads=self.cfg.threads,
            clients=len(data.clients),
            gpus=self._gpus,
            per_process=per_process,
            available=psutil.virtual_memory().available,
            gpu_bytes=int(weights * 1.5) + CUDA_CONTEXT_BYTES,
            gpu_free=lambda index: torch.cuda.mem_get_info(index)[0],
        )

    def _check_secure_aggregation(self, worker: Worker, methods: list[Method], *, flower: bool) -> None:
        """Refuse ``engine.secagg`` where it cannot run: off the Flower engine, for a method whose server step is
        not a weighted mean of the uploads, and with a server step that needs the individual updates."""
        if self.cfg.engine.secagg is None:
            return
        if not flower:
            raise UserError("Secure aggregation (engine.secagg) runs on the Flower engine; add `--engine flower`.")
        federated = [m for m in methods if m.federated]
        if self.cfg.base.kind == "federated":
            federated.append(worker.methods[BASE_STAGE_LABEL])
        for method in federated:
            if method_server_step(method) is None:
                raise UserError(
                    f"Method {method.label!r} cannot run under secure aggregation (engine.secagg): its server step "
                    "is not a weighted mean of the uploads, and the server would see only their sum."
                )
            cfg = method.cfg
            if isinstance(cfg, MeanServerConfigMixin) and (cfg.dp is not None or cfg.aggregation.active):
                raise UserError(
                    f"Method {method.label!r} sets `dp` or `aggregation.robust`, which need the individual updates; "
                    "secure aggregation (engine.secagg) shows the server only their sum."
                )

    def _check_schedules(self, data: FederatedData, methods: Mapping[str, Method]) -> None:
        """Refuse asynchronous schedules with secure aggregation (which sums a cohort of updates) or with more
        clients in flight, or a larger buffer, than the seen pool serves (:func:`flight_sizes`), and speed factors
        of client groups the data does not have."""
        asynchronous = asynchronous_labels(self.cfg)
        seen = [c.client_id for c in data.pool("seen")]
        labels = [entry.label or entry.name for entry in self.cfg.methods]
        federated_base = [BASE_STAGE_LABEL] if self.cfg.base.kind == "federated" else []
        for label in labels + federated_base:
            method_cfg = methods[label].cfg
            if isinstance(method_cfg, MeanServerConfigMixin) and method_cfg.schedule.asynchronous:
                flight_sizes(label, method_cfg.schedule, len(methods[label].sample(seen, 0, 0)), len(seen))
        if asynchronous and self.cfg.engine.secagg is not None:
            raise UserError(
                f"Secure aggregation needs a cohort of updates to sum, and {', '.join(asynchronous)} set(s) an "
                "asynchronous schedule, whose server steps take updates one by one as they arrive; drop engine.secagg "
                "or set schedule.kind: sync."
            )
        groups = {c.group for c in data.clients}
        unknown = sorted(set(self.cfg.clients.speed.groups) - groups)
        if unknown:
            raise UserError(
                f"clients.speed.groups names groups the data does not have ({', '.join(unknown)}); its groups: "
                f"{', '.join(sorted(g for g in groups if g is not None))}."
            )

    def _check_batch_clients(self) -> None:
        """Refuse, from the config alone, ``engine.batch_clients`` above 1 where a batch cannot train each client
        exactly as alone: on the Flower engine, with worker processes, for methods whose clients cannot train
        together, with LoRA dropout, and with one base model per architecture."""
        cfg = self.cfg
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
            raise UserError(
                f"engine.batch_clients trains clients of one base model, not of several architectures; {fix}."
            )

    def _check_batch_model(self, worker: Worker, *, flower: bool) -> None:
        """Refuse ``engine.batch_clients`` above 1 where the loaded model or the engine cannot train clients together
        exactly as alone: the Flower engine, a base model per client, and what :func:`batching_refusal` names."""
        from fedpeft.models.multi_lora import batching_refusal

        if self.cfg.engine.batch_clients < 2:
            return
        fix = "set engine.batch_clients=1"
        if flower:
            raise UserError(f"engine.batch_clients runs on the local engine, not in a Flower ServerApp; {fix}.")
        if worker.per_client_base:
            raise UserError(
                f"engine.batch_clients trains clients that share one base model, and base.method "
                f"{self.cfg.base.method.name!r} gives every client its own; {fix}."
            )
        problem = batching_refusal(worker.runtime)
        if problem is not None:
            raise UserError(problem)

    def _local_engine(self, worker: Worker) -> Engine:
        if self.cfg.engine.name == "flower":
            raise UserError("The flower engine runs through `fedpeft run --engine flower` or `flwr run .`.")
        from fedpeft.engine.local import LocalEngine

        return LocalEngine(
            worker,
            self.engine_settings,
            on_client=self.progress.advance_client,
            data=self._given_data,
            batch_clients=self.cfg.engine.batch_clients,
        )


class Stages:
    """The stages of one started run, with everything they use given at construction: the base stage of each seed,
    its clients' bases, the base model's evaluation and every method, each a unit whose records go to ``parts/``
    once it completes (units already there are skipped), then the run's outputs."""

    def __init__(
        self,
        cfg: ExperimentConfig,
        directory: RunDirectory,
        worker: Worker,
        engine: Engine,
        metric_log: MetricLog,
        progress: Progress,
    ) -> None:
        self.cfg = cfg
        self.directory = directory
        self.out = directory.path
        self.worker = worker
        self.data = worker.data
        self.methods = [worker.methods[entry.label or entry.name] for entry in cfg.methods]
        self.engine = engine
        self.metric_log = metric_log
        self.progress = progress
        self._parts: list[str] = []  # the units of this run, in the order a one-at-a-time run lists them

    def run(self) -> None:
        """Every seed's units, in order; a unit already in ``parts/`` is skipped. Where the seeds share one base
        model (pretrained, or a centralized base stage trained once), every seed's units follow its base stage
        together, so an engine that runs units at once has them all to choose from."""
        seeds = self.cfg.seeds
        one_base = self.cfg.base.kind == "pretrained" or self.cfg.base.shared
        for group in [seeds] if one_base and not self.worker.per_client_base else [[seed] for seed in seeds]:
            evaluations, methods = [], []
            for seed in group:
                self._base_stage(seed)
                if self.worker.per_client_base:
                    self._unit(f"client-base-seed{seed}", lambda s=seed: self._client_bases(s))
                # The base model's evaluation and the methods need nothing of each other (they may run at once).
                evaluations.append((f"base-seed{seed}", self._base_evaluation_unit(seed)))
                methods.append([(f"{m.label}-seed{seed}", self._method_unit(m, seed)) for m in self.methods])
            self._units(evaluations, methods)

    def each_client(
        self,
        op: str,
        ids: list[str],
        record: Callable[[str, BaseException], None],
        **kwargs: Any,
    ) -> Iterator[tuple[str, Any]]:
        """The results of the worker operation ``op`` for clients ``ids``, in client-id order; a client whose
        work failed is passed to ``record`` (e.g. :meth:`CostMeter.record_failure`) and left out."""
        for client_id, result in self.engine.map_clients(op, ids, **kwargs):
            if isinstance(result, BaseException):
                record(client_id, result)
            else:
                yield client_id, result

    def _method_unit(self, method: Method, seed: int) -> UnitWork:
        return lambda: self._run_method(method, seed)

    def _base_evaluation_unit(self, seed: int) -> UnitWork:
        return lambda: self._evaluate_base(seed)

    def _units(self, evaluations: list[tuple[str, UnitWork]], methods: list[list[tuple[str, UnitWork]]]) -> None:
        """Run the units of one or more seeds: each seed's base model evaluation (``evaluations``), then its methods
        (``methods``), one after the other, or, where the engine runs several at once (``concurrent_units``), the
        base model's evaluations in a thread of their own beside at most ``concurrent_units - 1`` methods, each in a
        thread of its own; the threads take turns for their server code (:class:`~fedpeft.core.turns.Turns`). The
        first failure is raised once every unit has ended."""
        pairs = zip(evaluations, methods, strict=True)
        units = [unit for evaluation, seed_methods in pairs for unit in [evaluation, *seed_methods]]
        turns = self.engine.turns
        queued = [unit for seed_methods in methods for unit in seed_methods]
        if turns is None or self.engine.concurrent_units < 2 or len(units) < 2:
            for name, work in units:
                self._unit(name, work)
            return
        self._parts += [name for name, _ in units]  # in the order a one-at-a-time run lists them

        # The base model's evaluations do not take a method's place: once they end, no further method starts.
        groups = [(evaluations, 1), (queued, min(self.engine.concurrent_units - 1, len(queued)))]
        groups = [(group, slots) for group, slots in groups if group]

        def runner(count: int, slots: int) -> Callable[[str, UnitWork], None]:
            # A unit that waits for a free thread takes over the count of the unit whose thread it gets: between the
            # one ending and the other starting, the engine still counts a running unit, so no step leaves without it.
            handoffs = itertools.count(count - slots, -1)

            def run(name: str, work: UnitWork) -> None:
                try:
                    with turns.hold():
                        self._unit(name, work, listed=True)
                finally:
                    with turns.hold():
                        if next(handoffs) <= 0:
                            self.engine.unit_ended()

            return run

        # Before any thread starts: the engine waits for all of them to ask.
        self.engine.units_started(sum(slots for _, slots in groups))
        with contextlib.ExitStack() as stack:
            futures = []
            for group, slots in groups:
                pool = stack.enter_context(ThreadPoolExecutor(slots, thread_name_prefix="unit"))
                run = runner(len(group), slots)
                futures += [pool.submit(run, name, work) for name, work in group]
            try:
                errors = [future.exception() for future in futures]
            except BaseException:  # Ctrl-C, SIGTERM: this thread only; the units' threads end at their next wait
                self.engine.stop()
                raise
        for error in errors:
            if error is not None:
                raise error

    def _unit(self, name: str, work: Any, *, listed: bool = False) -> None:
        if not listed:
            self._parts.append(name)
        if self.directory.part_done(name):  # a part whose last line was cut is a unit to run again
            log.info("unit %s already done", name)
            return
        records, costs = work()
        self.directory.write_part(name, records, costs)
        self.metric_log.unit(records)

    def write_engine_costs(self, rows: list[dict[str, Any]]) -> None:
        """Keep the engine's own cost rows (a Flower engine's per-node messages, model loads and seconds) in
        ``costs.jsonl`` as method ``engine``, phase ``nodes``; each sitting of a resumed run adds its rows."""
        if not rows:
            return
        _, earlier = self.directory.read_part(ENGINE_PART)
        sittings = [cost["sitting"] for cost in earlier]
        sitting = max(sittings) + 1 if sittings else 0
        costs = [{"method": "engine", "seed": None, "phase": "nodes", "sitting": sitting, **row} for row in rows]
        self.directory.write_part(ENGINE_PART, [], costs, append=True)
        if ENGINE_PART not in self._parts:
            self._parts.append(ENGINE_PART)

    # ------------------------------------------------------------------ stages
    def _base_stage(self, seed: int) -> None:
        """Produce the base model of this seed (unless there is nothing to train or it exists already)."""
        base = self.cfg.base
        if base.kind == "pretrained":
            # Saved adapters name base_model/ as their base: it holds the loaded weights (a pretrained model's
            # fresh task head included), written once per run.
            if self.cfg.output.save_adapters and not self._base_model_saved():
                self.engine.call_worker("save_base_model", self.worker)
            return
        shared = base.shared
        name = "base-stage" if shared else f"base-stage-seed{seed}"
        path = self.worker.base_checkpoint(seed)
        if name not in self._parts:
            self._parts.append(name)
        if has_checkpoint(path, self.out):
            if (shared or seed == self.cfg.seeds[0]) and not self._base_model_saved():
                self.engine.call_worker("save_base_model", self.worker, seed=seed)  # deleted since: rebuilt
            return
        self.progress.stage(f"base model ({base.kind}), seed {seed}")
        meter = CostMeter()
        privacy: list[ResultRecord] = []
        started = time.perf_counter()
        if base.kind == "centralized":
            if not self.data.base_train:
                raise UserError(
                    f"Dataset {self.cfg.data.name} has no base corpus; use base.kind=pretrained or federated."
                )
            # Trained in this process (its model loaded here, also when worker processes run the clients).
            runtime = self.worker.runtime
            self.worker.use_base(None)
            self.progress.epochs(math.ceil(base.epochs))
            train_centralized_base(
                runtime, self.data.base_train, base, after_epoch=self.progress.advance_epoch, run_seed=seed
            )
            save_checkpoint({"tensors": runtime.base_tensors()}, path)
        else:
            method = self.worker.methods[BASE_STAGE_LABEL]
            phase = self._federate(method, BASE_STAGE_LABEL, seed, meter=meter)
            self.engine.call_worker("export_base", self.worker, seed=seed, state=phase.state)
            privacy = phase.records  # a DP base stage's epsilon per round
        meter.wall_seconds = time.perf_counter() - started
        self.directory.write_part(name, privacy, meter.rows(BASE_LABEL, seed, "base"))
        if shared or seed == self.cfg.seeds[0]:
            self.engine.call_worker("save_base_model", self.worker, seed=seed)

    def _client_bases(self, seed: int) -> tuple[list[ResultRecord], list[dict]]:
        """Every client's own base model (per-client base stages), computed where its base-stage state lives."""
        self.progress.stage(f"base model of every client, seed {seed}")
        ckpt = self.out / "checkpoints" / BASE_STAGE_LABEL / f"seed{seed}{SUFFIX}"
        state = ServerState()
        if has_checkpoint(ckpt, self.out):  # the stage's final state and client states, also after a restart
            saved = load_checkpoint(ckpt)
            self.worker.store(BASE_STAGE_LABEL, seed).restore(saved["store"])
            state = saved["state"]
        ids = [c.client_id for c in self.data.clients]
        self.progress.clients(len(ids))
        meter = CostMeter()
        started = time.perf_counter()
        for _ in self.each_client("prepare_client_base", ids, meter.record_failure, seed=seed, state=state):
            pass
        meter.wall_seconds = time.perf_counter() - started
        return [], meter.rows(BASE_LABEL, seed, "client-base")

    def _base_model_dirs(self) -> list[Path]:
        """Where the base models saved adapters load onto go: one per architecture of a heterogeneous federation."""
        federation = self.worker.federation
        if not federation.heterogeneous:
            return [base_model_dir(self.out)]
        return [base_model_dir(self.out, name) for name in federation.names]

    def _base_model_saved(self) -> bool:
        return all((directory / "model.safetensors").is_file() for directory in self._base_model_dirs())

    def _evaluate_base(self, seed: int) -> tuple[list[ResultRecord], list[dict]]:
        self.progress.stage(f"base model evaluation, seed {seed}")
        ids = [c.client_id for c in self.data.clients]
        self.progress.clients(len(ids))
        records: list[ResultRecord] = []
        meter = CostMeter()
        for _, result in self.each_client("evaluate_base", ids, meter.record_failure, seed=seed):
            records += result
        check_clients(f"the base model's evaluation (seed {seed})", len(ids), meter.failures)
        failed = ("failed_clients", FAILED_CLIENT)  # its failures, not its time and memory
        return records, [r for r in meter.rows(BASE_LABEL, seed, "evaluation") if r["metric"] in failed]

    def _federate(
        self,
        method: Method,
        label: str,
        seed: int,
        *,
        meter: CostMeter,
        budget: int | None = None,
        earlier: Sequence[ResultRecord] = (),
    ) -> FederatedPhase:
        """The federated phase of ``method`` on the seen pool (for ``budget``, if it runs one per budget),
        checkpointed every round and continued from its checkpoint; returns it run, with its final state and round
        records. ``meter`` and ``earlier`` (round records): the unit's so far, which its checkpoints keep too (a
        method with one phase per budget has them go on from one phase to the next)."""
        name = f"seed{seed}" if budget is None else f"seed{seed}-r{budget}"
        ckpt = self.out / "checkpoints" / label / f"{name}{SUFFIX}"
        seen = [c.client_id for c in self.data.pool("seen")]
        method.bind_pool(seen)  # DP divides by the clients sampled per round from it
        checks = UpdateChecks({c.client_id: len(c.train) for c in self.data.clients}, self.cfg.validation.max_norm)
        outputs = RoundOutputs(
            self, method, label, seed, budget, meter, self._epsilon(method, label, seed, budget, len(seen))
        )
        checkpoint = PhaseCheckpoint(ckpt, self.worker.store(label, seed))
        phase = FederatedPhase(
            label, method, seen, seed, checks, [outputs], checkpoint, meter=meter, records=[*earlier]
        )
        if has_checkpoint(ckpt, self.out):
            phase.resume(load_checkpoint(ckpt))
        else:
            phase.state = self.engine.call_worker("init_server", self.worker, label=label, seed=seed, budget=budget)
        per_budget = "" if budget is None else f", r={budget}"
        self.progress.stage(f"{label}: federated training, seed {seed}{per_budget}")
        self.progress.rounds(method.rounds, phase.state.round)
        phase.run(self._schedule(method, seen, seed))
        return phase

    @staticmethod
    def _epsilon(method: Method, label: str, seed: int, budget: int | None, pool: int) -> RoundCallback | None:
        """Under DP, what gives epsilon after every round (kept with the checkpoint) of ``method``, its pool of
        ``pool`` clients bound."""
        dp = method.cfg.dp if isinstance(method.cfg, MeanServerConfigMixin) else None
        if dp is None:
            return None
        from fedpeft.report.privacy import EpsilonRecorder

        return EpsilonRecorder(label, budget, seed, dp, (method.clients_per_round() or pool) / pool)

    def _schedule(self, method: Method, seen: list[str], seed: int) -> Schedule:
        """How ``method``'s federated phase runs: its asynchronous ``schedule``, or synchronous rounds (on the
        virtual clock when :meth:`_virtual_clock`)."""
        schedule = method.cfg.schedule if isinstance(method.cfg, MeanServerConfigMixin) else None
        if schedule is not None and schedule.asynchronous:
            return AsynchronousSchedule(self.engine, schedule, self._durations(method, seen, seed))
        durations = self._durations(method, seen, seed) if self._virtual_clock() else None
        return SynchronousRounds(self.engine, min_updates=self.cfg.validation.min_updates, durations=durations)

    def _virtual_clock(self) -> bool:
        """Whether synchronous rounds also keep the virtual clock: when clients have speeds, or a method of the
        config runs an asynchronous schedule (its records are then comparable in virtual time)."""
        return bool(asynchronous_labels(self.cfg)) or self.cfg.clients.speed.varies

    def _durations(self, method: Method, client_ids: list[str], seed: int) -> dict[str, float]:
        """Each client's virtual duration under an asynchronous schedule of the method (docs/async.md)."""
        cfg = method.cfg
        clients = [self.data.client(c) for c in client_ids]
        if isinstance(cfg, FederatedConfig):
            steps, epochs, batch = cfg.local_steps, cfg.local_epochs, cfg.batch_size
        else:
            steps, epochs, batch = 1, None, 1  # a method without local steps: every client's work counts as one
        # local_epochs, when set, decides (as the local training does)
        work = partial(_client_work, None if epochs is not None else steps, epochs, batch)
        return virtual_durations(work, clients, self.cfg.clients.speed, seed)

    def evaluate_round(
        self, method: Method, label: str, seed: int, state: ServerState, completed: int, meter: CostMeter
    ) -> tuple[list[ResultRecord], float | None]:
        """Evaluate every client's current model after ``completed`` rounds, every ``eval.every`` rounds, counting
        its clients in the progress display; a client whose evaluation fails is left out and recorded in ``meter``,
        which also adds the evaluation's seconds and clients. Returns its records and seconds (none and None when
        no evaluation is due)."""
        every = self.cfg.eval.every
        rounds = method.rounds
        if not every or label == BASE_STAGE_LABEL or (completed % every and completed != rounds):
            return [], None
        records: list[ResultRecord] = []
        ids = [c.client_id for c in self.data.clients]
        self.progress.clients(len(ids), step=f"evaluation after round {completed}")
        failed = partial(meter.record_evaluation_failure, round_=completed - 1)
        started = time.perf_counter()
        for _, result in self.each_client(
            "evaluate_round", ids, failed, label=label, seed=seed, round_=completed, state=state
        ):
            records += result
        seconds = time.perf_counter() - started
        meter.evaluation_seconds += seconds
        meter.evaluated_clients += len(ids)
        return records, seconds

    def _run_method(self, method: Method, seed: int) -> tuple[list[ResultRecord], list[dict]]:
        costs: list[dict] = []
        state = ServerState()
        records: list[ResultRecord] = []
        extra: dict[str, Any] = {}
        federated_meter = CostMeter()
        if method.federated:
            meter = federated_meter
            round_records: list[ResultRecord] = []  # every phase's, one phase per budget or one in all
            if method.federated_per_budget:
                extra["budget_states"] = {}
                for b in self.cfg.budgets:
                    phase = self._federate(method, method.label, seed, meter=meter, budget=b, earlier=round_records)
                    extra["budget_states"][b], round_records = phase.state, phase.records
            else:
                phase = self._federate(method, method.label, seed, meter=meter)
                state, round_records = phase.state, phase.records
            costs += meter.rows(method.label, seed, "federated")
            costs += meter.evaluation_rows(method.label, seed)
            costs += communication_rows(method.label, seed, meter, len(self.data.pool("seen")))
            method.save_server_artifacts(state, self.out, seed)
            records += round_records
        ids = [c.client_id for c in self.data.clients]
        budgets = len(self.cfg.budgets) if method.uses_budget else 1
        self.progress.stage(f"{method.label}: personalization and evaluation, seed {seed}")
        self.progress.clients(len(ids))
        meter = CostMeter()
        save = self.cfg.output.save_adapters and seed == self.cfg.seeds[0]
        started = time.perf_counter()
        for _, result in self.each_client(
            "personalize",
            ids,
            meter.record_failure,
            label=method.label,
            seed=seed,
            state=state,
            save_adapters=save,
            **extra,
        ):
            client_records, seconds = result
            records += client_records
            meter.client_seconds += seconds
            meter.clients += budgets
        meter.wall_seconds = time.perf_counter() - started
        check_clients(f"{method.label}'s personalization (seed {seed})", len(ids), meter.failures)
        costs += meter.rows(method.label, seed, "personalization")
        costs += self.engine.call_worker("compute_costs", self.worker, label=method.label, seed=seed)
        costs += merge_cost_rows(method.label, seed, records, federated_meter)
        return records, costs

    # ------------------------------------------------------------------ outputs
    def write_outputs(self) -> list[ResultRecord]:
        """Merge the parts into ``results.jsonl`` and ``costs.jsonl``, then the data overview, the summary and
        the plots; returns the run's records."""
        records, costs = [], []
        for name in self._parts:
            unit_records, unit_costs = self.directory.read_part(name)
            records += unit_records
            costs += unit_costs
        write_text_atomic(self.out / "results.jsonl", "".join(json.dumps(r) + "\n" for r in records))
        write_text_atomic(self.out / "costs.jsonl", "".join(json.dumps(c) + "\n" for c in costs))
        # The data overview, kept in the run so that `fedpeft report` prints the same Data section.
        write_text_atomic(self.out / DATA_FILE, json.dumps(data_overview(self.data), indent=2, default=str) + "\n")
        from fedpeft import report

        self.progress.stage("summary and plots")
        report.write_summary([self.out], self.out / "summary.md", title=self.cfg.name)
        if self.cfg.output.plots:
            report.write_plots([self.out], self.out / "plots", formats=self.cfg.output.plot_formats)
        return records


class RoundOutputs:
    """What the runner makes of every round of a federated phase, in this order: the evaluation of every client
    every ``eval.every`` rounds, epsilon under DP (``epsilon``), the train rows, the metric loggers' scalars and
    the progress line. The round's records (evaluation, epsilon, train rows) go to the phase, which keeps them in
    its checkpoints."""

    def __init__(
        self,
        stages: Stages,
        method: Method,
        label: str,
        seed: int,
        budget: int | None,
        meter: CostMeter,
        epsilon: RoundCallback | None = None,
    ) -> None:
        self.stages, self.method, self.label, self.seed, self.budget = stages, method, label, seed, budget
        self.meter, self.epsilon = meter, epsilon

    def after_round(self, state: ServerState, round_: int, metrics: Metrics) -> list[ResultRecord]:
        stages, label, budget, seed = self.stages, self.label, self.budget, self.seed
        records, seconds = stages.evaluate_round(self.method, label, seed, state, round_ + 1, self.meter)
        if self.epsilon is not None:
            records += self.epsilon.after_round(state, round_, metrics)
        records += train_rows(label, budget, seed, round_, metrics)
        stages.metric_log.round(label, budget, seed, round_ + 1, metrics)
        stages.progress.advance_round(metrics, seconds)
        return records

    def after_phase(self, state: ServerState) -> None:
        return None


def cpu_description() -> dict[str, Any]:
    """The CPU a run's float kernels ran on: its model name (from /proc/cpuinfo on Linux, else the platform's),
    its logical cores and the vector kernels PyTorch chose for it (``AVX512``, ``AVX2``, ...). Records made on two
    CPUs with different kernels need not be identical (docs/outputs.md)."""
    model = platform.processor() or None
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("model name"):
                model = line.partition(":")[2].strip() or model
                break
    kernels = None
    with contextlib.suppress(AttributeError, RuntimeError):
        kernels = torch.backends.cpu.get_cpu_capability()
    return {"model": model, "cores": os.cpu_count(), "kernels": kernels}


def environment(device: str) -> dict[str, Any]:
    """The software and machine a run starts on: Python and library versions, fedpeft's git commit when it runs
    from a checkout, the device, the CPU (:func:`cpu_description`), the command line and the start time (UTC)."""
    from importlib.metadata import PackageNotFoundError, version

    versions: dict[str, str | None] = {}
    for package in ("fedpeft", "torch", "transformers", "peft", "flwr", "datasets", "bitsandbytes"):
        try:
            versions[package] = version(package)
        except PackageNotFoundError:
            versions[package] = None
    commit = None
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        done = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent, capture_output=True, text=True, timeout=10
        )
        commit = (done.stdout.strip() or None) if done.returncode == 0 else None
        if commit is not None:  # a checkout with uncommitted changes does not run that commit's code
            status = ["git", "status", "--porcelain", "--untracked-files=no"]
            dirty = subprocess.run(status, cwd=Path(__file__).parent, capture_output=True, text=True, timeout=10)
            commit += "+changes" if dirty.stdout.strip() else ""
    accelerator = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {
        "python": platform.python_version(),
        "versions": versions,
        "git_commit": commit,
        "device": device,
        "accelerator": accelerator,
        "cpu": cpu_description(),
        "platform": platform.platform(),
        "command": sys.argv,
        "started_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


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


def method_entries(cfg: ExperimentConfig) -> list[MethodConfig]:
    """The config's method entries, and the base stage's method when the base stage is federated."""
    return list(cfg.methods) + ([cfg.base.method] if cfg.base.kind == "federated" else [])


def asynchronous_labels(cfg: ExperimentConfig) -> list[str]:
    """The row labels of the config's methods (base stage included) that run an asynchronous schedule."""
    return [
        e.label or e.name
        for e in method_entries(cfg)
        if isinstance(e, MeanServerConfigMixin) and e.schedule.asynchronous
    ]


def _client_work(steps: int | None, epochs: float | None, batch: int, client: ClientData) -> float:
    return client_work(steps, epochs, batch, len(client.train))


def train_rows(label: str, budget: int | None, seed: int, round_: int, metrics: Metrics) -> list[ResultRecord]:
    """``results.jsonl`` records (split ``train``) of one federated round (0-based ``round_``): the clients' mean
    training loss where the method reports one, the clients and examples aggregated, and the round's seconds."""
    names = {"train_loss": "loss", "clients": "clients", "examples": "examples", "seconds": "seconds"}
    names |= {"virtual_time": "virtual_time", "staleness": "staleness"}  # asynchronous schedules' server steps
    return [
        result_record(
            label,
            budget,
            pool="seen",
            client=None,
            group=None,
            seed=seed,
            round_=round_ + 1,
            split="train",
            metric=name,
            value=metrics[key],
        )
        for key, name in names.items()
        if key in metrics
    ]


def check_result_coverage(
    records: list[ResultRecord],
    clients: list[str],
    min_fraction: float,
    summary: Path,
    *,
    evaluates: Mapping[str, Collection[str]] | None = None,
) -> None:
    """Raise :class:`MissingResultsError` when, for some method, seed and rank budget with results (the tiers of a
    tiered method together), fewer than ``min_fraction`` of the clients it evaluates have a final test record;
    names how many and where the failures are listed (``summary``).

    Args:
        clients: the clients with test data, which a method evaluates unless ``evaluates`` says otherwise.
        evaluates: method label -> the clients it evaluates (e.g. a tiered method's ``eval_tiers``' clients).
    """
    if not clients:
        return
    have: dict[tuple[str, int, Any], set[str]] = {}
    for record in records:
        if record["split"] == "test" and record["client"] is not None:
            # A rank budget evaluates every client; a tier (a named budget) only its own clients: pooled.
            budget = record["budget"] if isinstance(record["budget"], int) else None
            have.setdefault((record["method"], record["seed"], budget), set()).add(record["client"])
    short = []
    for (method, seed, budget), present in have.items():
        expected = set(clients if evaluates is None else evaluates.get(method, clients))
        if len(present & expected) < min_fraction * len(expected):
            at = f", budget {budget}" if budget is not None else ""
            short.append(f"{len(expected - present)} of {len(expected)} clients for {method} (seed {seed}{at})")
    if short:
        more = f" and {len(short) - 1} more" if len(short) > 1 else ""
        raise MissingResultsError(
            f"the run completed without final results of {short[0]}{more}, fewer than validation.min_result_fraction="
            f"{min_fraction:g} asks; the failures are listed under Failed clients in {summary}."
        )


def check_clients(step: str, clients: int, failures: list[str]) -> None:
    """Stop the run when every one of ``clients`` failed ``step`` (``failures``: one message each): results from
    nobody would read as a method's result."""
    if clients and len(failures) >= clients:
        raise AllClientsFailedError(f"every one of the {clients} clients failed {step}; the first: {failures[0]}")


def communication_rows(label: str, seed: int, meter: CostMeter, clients: int) -> list[dict]:
    """What one client uploads over the whole federated phase (mean over the ``clients`` of the seen pool), and
    per round in float32 numbers (4 bytes each: the runtime keeps adapters in float32)."""
    if not meter.client_rounds or clients <= 0:
        return []
    values = {
        "bytes_up_per_client": meter.bytes_up / clients,
        "floats_up_per_client": meter.bytes_up / 4 / clients,
        "floats_up_per_client_round": meter.bytes_up / 4 / meter.client_rounds,
    }
    return [{"method": label, "seed": seed, "phase": "federated", "metric": k, "value": v} for k, v in values.items()]


def _personalize_facts(records: list[ResultRecord], metric: str) -> list[float]:
    """The values of ``metric`` among the ``personalize`` facts in ``records``."""
    return [
        r["value"] for r in records if r["split"] == "personalize" and r["metric"] == metric and r["value"] is not None
    ]


def merge_cost_rows(label: str, seed: int, records: list[ResultRecord], federated: CostMeter) -> list[dict]:
    """The cost of a personalization-time merge, from the ``merge_s`` / ``train_s`` facts a method reports.

    ``merge_share`` = all clients' merge seconds / all their training seconds (the federated phase's client
    seconds plus the personalization-time training), the paper's "merge cost relative to training".
    """
    merge = _personalize_facts(records, "merge_s")
    if not merge:
        return []
    training = federated.client_seconds + sum(_personalize_facts(records, "train_s"))
    values = {"merge_s_per_client": sum(merge) / len(merge)}
    if training > 0:
        values["merge_share"] = sum(merge) / training
    return [
        {"method": label, "seed": seed, "phase": "personalization", "metric": k, "value": float(v)}
        for k, v in values.items()
    ]


def data_overview(data: FederatedData) -> dict[str, Any]:
    """The data facts a summary states (the run's ``data.json``): the dataset, task and class names, the dataset's
    scalar facts; ``groups``: one row per group (clients and samples per pool, and every per-group fact the dataset
    reports, such as resource level or script); then the dataset's other tables (e.g. the generator's edit mix).
    Keys read as words (``resource level``, not ``resource_level``)."""
    per_group: dict[str, dict[str, Any]] = {g: {} for g in data.groups}
    for pool in ("seen", "unseen"):
        for group in data.groups:
            clients = [c for c in data.pool(pool) if c.group == group]
            row = per_group[group]
            row[f"{pool} clients"] = len(clients)
            if clients:
                row[f"{pool} train/client"] = round(sum(len(c.train) for c in clients) / len(clients), 1)
                row[f"{pool} test/client"] = round(sum(len(c.test) for c in clients) / len(clients), 1)
    overview: dict[str, Any] = {"dataset": data.name, "task": data.task}
    if data.label_names:
        overview["labels"] = list(data.label_names)
    tables: dict[str, Any] = {}
    for key, value in data.info.items():
        name = key.replace("_", " ")
        if isinstance(value, dict) and value and set(value) <= set(data.groups):
            if all(not isinstance(v, dict) for v in value.values()):
                for group, fact in value.items():
                    per_group[group][name] = fact
                continue
        if isinstance(value, dict):
            if value:
                tables[name] = value
        else:
            overview[name] = value
    return {**overview, "groups": per_group, **tables}
