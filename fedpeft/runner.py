"""An experiment end to end: base-model stage -> federated methods -> personalization -> evaluation -> outputs.

Work is cut into units (the base stage of a seed, the base row of a seed, one method for one seed). A unit writes
its records to ``parts/`` when it completes, and federated phases checkpoint every round, so ``--resume`` skips
finished units and continues a federated phase from its last completed round. Every random draw derives from
(seed, method, phase, round, client), so a resumed run ends with the numbers of an uninterrupted one.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from fedpeft.config import ExperimentConfig, dump_config
from fedpeft.data.types import ClientData, FederatedData
from fedpeft.engine.common import CostMeter, client_seed
from fedpeft.engine.state import make_store, save_atomic
from fedpeft.errors import UserError
from fedpeft.methods.base import Method
from fedpeft.models.runtime import ClientModel, ModelRuntime
from fedpeft.progress import Progress
from fedpeft.registry import DATASETS, METHODS
from fedpeft.types import Metrics, ServerState

log = logging.getLogger("fedpeft")


def build_method(entry: dict[str, Any]) -> Method:
    """Instantiate a registered method from its config mapping (``{"name": ..., **fields}``)."""
    if "name" not in entry:
        raise UserError("Every entry of `methods` needs a `name`; e.g. `- name: lora`.")
    cls = METHODS.get(str(entry["name"]))
    from pydantic import ValidationError

    try:
        cfg = cls.Config.model_validate({**entry, "name": cls.name})
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise UserError(f"Invalid setting {where!r} of method {entry['name']!r}: {first['msg']}.") from None
    if "label" not in entry and entry["name"] != cls.name:
        cfg.label = str(entry["name"])
    return cls(cfg)


def build_data(cfg: ExperimentConfig) -> FederatedData:
    """Build the federated dataset named in the config."""
    import fedpeft.data.catalog  # noqa: F401  (registers the datasets)

    return DATASETS.get(cfg.data.name)(cfg.data)


def build_runtime(cfg: ExperimentConfig, data: FederatedData) -> ModelRuntime:
    """Load the base model once for this process."""
    from fedpeft.models.zoo import load_model

    loaded = load_model(cfg.model, task=data.task, num_labels=data.num_labels, corpus=data.corpus)
    return ModelRuntime(
        loaded,
        max_length=cfg.model.max_length,
        device=cfg.device,
        eval_batch_size=cfg.eval.batch_size,
        max_new_tokens=cfg.eval.max_new_tokens,
    )


@dataclass
class Experiment:
    """A configured experiment bound to an output directory."""

    cfg: ExperimentConfig
    out: Path
    progress: Progress = field(default_factory=Progress)

    def __post_init__(self) -> None:
        self.methods = [build_method(entry) for entry in self.cfg.methods]
        labels = [m.label for m in self.methods]
        duplicated = sorted({x for x in labels if labels.count(x) > 1})
        if duplicated:
            raise UserError(f"Methods {duplicated} appear twice; give each entry a distinct `label`.")
        if "base" in labels:
            raise UserError("`base` is reserved for the base-model row; give that method another `label`.")

    # ------------------------------------------------------------------ entry point
    def run(self, *, resume: bool = False, engine: str | None = None) -> Path:
        """Run every unit not done yet and write the outputs; returns the output directory."""
        self._prepare_output(resume)
        self.data = build_data(self.cfg)
        if not self.data.pool("seen"):
            raise UserError("The dataset has no client in the seen pool; check the data settings.")
        self.runtime = build_runtime(self.cfg, self.data)
        self._pretrained = self.runtime.base_state()
        self._parts: list[str] = []
        for budget in self.cfg.budgets:
            self.runtime.check_budget(budget)
        self.engine = self._make_engine(engine or self.cfg.engine.name)
        for seed in self.cfg.seeds:
            self._base_stage(seed)
            self._unit(f"base-seed{seed}", lambda s=seed: self._evaluate_base(s))
            for method in self.methods:
                self._unit(f"{method.label}-seed{seed}", lambda m=method, s=seed: self._run_method(m, s))
        self._write_outputs()
        return self.out

    def _make_engine(self, name: str) -> Any:
        if name == "flower":
            from fedpeft.engine.flower import FlowerEngine

            return FlowerEngine(self.runtime, self.cfg, self.out, on_client=self.progress.advance_client)
        from fedpeft.engine.local import LocalEngine

        return LocalEngine(self.runtime, on_client=self.progress.advance_client)

    # ------------------------------------------------------------------ output directory
    def _prepare_output(self, resume: bool) -> None:
        config_path = self.out / "config.yaml"
        text = dump_config(self.cfg)
        if config_path.exists():
            if not resume:
                raise UserError(
                    f"{self.out} already holds a run; pass --resume to continue it or choose another --out."
                )
            if config_path.read_text() != text:
                raise UserError(
                    f"The config differs from the one of the run in {self.out}; resume with the same one."
                )
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "parts").mkdir(exist_ok=True)
        config_path.write_text(text)

    def _unit(self, name: str, work: Any) -> None:
        part = self.out / "parts" / f"{name}.jsonl"
        self._parts.append(name)
        if part.exists():
            log.info("unit %s already done", name)
            return
        records, costs = work()
        lines = [json.dumps(r) for r in records] + [json.dumps({"_cost": c}) for c in costs]
        tmp = part.with_suffix(".tmp")
        tmp.write_text("".join(line + "\n" for line in lines))
        os.replace(tmp, part)

    # ------------------------------------------------------------------ stages
    def _base_stage(self, seed: int) -> None:
        """Produce (or reload) the base model of this seed and make it the runtime's starting point."""
        base = self.cfg.base
        if base.kind == "pretrained":
            self.runtime.set_initial_base(self._pretrained)
            return
        path = self.out / "checkpoints" / f"base-seed{seed}.pt"
        if path.exists():
            self.runtime.set_initial_base(torch.load(path, weights_only=False)["tensors"])
            self._parts.append(f"base-stage-seed{seed}")
            return
        self.runtime.set_initial_base(self._pretrained)
        self.progress.stage(f"base model ({base.kind}), seed {seed}")
        meter = CostMeter()
        started = time.perf_counter()
        if base.kind == "centralized":
            if not self.data.base_train:
                raise UserError(
                    f"Dataset {self.cfg.data.name} has no base corpus; use base.kind=pretrained or federated."
                )
            self.runtime.activate(None)
            self.runtime.train(
                self.data.base_train,
                "all",
                lr=base.lr,
                batch_size=base.batch_size,
                seed=seed,
                epochs=base.epochs,
            )
            tensors = self.runtime.base_state()
        else:
            method = build_method(base.method)
            if method.name != "fedavg_full":
                raise UserError(
                    "base.method must be fedavg_full (full-weight FedAvg) for a federated base stage."
                )
            state, _ = self._federate(method, seed, tag="base", meter=meter)
            tensors = state.tensors
        meter.wall_seconds = time.perf_counter() - started
        save_atomic({"tensors": tensors}, path)
        self._write_costs_part(f"base-stage-seed{seed}", meter.rows("base", seed, "base"))
        self.runtime.set_initial_base(tensors)
        if seed == self.cfg.seeds[0]:
            self._save_base_model()

    def _write_costs_part(self, name: str, costs: list[dict]) -> None:
        part = self.out / "parts" / f"{name}.jsonl"
        self._parts.append(name)
        part.write_text("".join(json.dumps({"_cost": c}) + "\n" for c in costs))

    def _save_base_model(self) -> None:
        target = self.out / "base_model"
        self.runtime.activate(None)
        model = self.runtime.base_model
        with self.runtime._adapter_context():
            # PEFT wraps layers in place; save the plain weights under their canonical names.
            state = {k: v.detach().contiguous() for k, v in self.runtime.base_state().items()}
        target.mkdir(parents=True, exist_ok=True)
        model.config.save_pretrained(target)
        save_file(state, str(target / "model.safetensors"), metadata={"format": "pt"})
        self.runtime.tokenizer.save_pretrained(target)

    def _evaluate_base(self, seed: int) -> tuple[list[dict], list[dict]]:
        self.progress.stage(f"base model evaluation, seed {seed}")
        clients = self.data.pool("all")
        self.progress.clients(len(clients))

        def work(runtime: ModelRuntime, client: ClientData) -> Metrics:
            runtime.install(ClientModel())
            return runtime.evaluate(client.test)

        records = []
        for client, metrics in self.engine.map_clients(work, clients):
            if isinstance(metrics, BaseException):
                continue
            records += _records("base", None, client, seed, None, metrics)
        return records, []

    def _federate(self, method: Method, seed: int, *, tag: str, meter: CostMeter) -> tuple[ServerState, Any]:
        """The federated phase of ``method`` on the seen pool, checkpointed every round."""
        ckpt = self.out / "checkpoints" / tag / f"seed{seed}.pt"
        store = make_store(self.cfg.engine.state, self.out / "client_state" / tag / f"seed{seed}")
        start = 0
        if ckpt.exists():
            saved = torch.load(ckpt, weights_only=False)
            state, start = saved["state"], saved["round"]
            store.restore(saved["store"])
            store.rollback(start - 1)
            meter.__dict__.update(saved["meter"])
        else:
            state = method.init_server(self.runtime, seed)
        cfg: Any = method.cfg
        self.progress.stage(f"{tag}: federated training, seed {seed}")
        self.progress.rounds(cfg.rounds, start)

        def on_round_end(state: ServerState, round_: int, metrics: Metrics) -> None:
            save_atomic(
                {
                    "state": state,
                    "round": round_ + 1,
                    "store": store.snapshot(),
                    "meter": dict(meter.__dict__),
                },
                ckpt,
            )
            self.progress.advance_round(metrics)

        seen = self.data.pool("seen")
        return self.engine.run_rounds(
            method,
            state,
            seen,
            seed=seed,
            store=store,
            meter=meter,
            start_round=start,
            on_round_end=on_round_end,
        ), store

    def _run_method(self, method: Method, seed: int) -> tuple[list[dict], list[dict]]:
        costs: list[dict] = []
        state, store = ServerState(), make_store("memory", self.out)
        rounds = None
        if method.federated:
            meter = CostMeter()
            state, store = self._federate(method, seed, tag=method.label, meter=meter)
            rounds = int(getattr(method.cfg, "rounds", 0))
            costs += meter.rows(method.label, seed, "federated")
        budgets: list[int | None] = list(self.cfg.budgets) if method.uses_budget else [None]
        clients = self.data.pool("all")
        self.progress.stage(f"{method.label}: personalization and evaluation, seed {seed}")
        self.progress.clients(len(clients) * len(budgets))
        meter = CostMeter()
        save = self.cfg.output.save_adapters and seed == self.cfg.seeds[0]

        def work(runtime: ModelRuntime, client: ClientData) -> list[dict]:
            out = []
            for budget in budgets:
                pseed = client_seed(seed, method.name, "personalize", budget, client.client_id)
                started = time.perf_counter()
                model = method.personalize(runtime, client, state, store.get(client.client_id), budget, pseed)
                meter.client_seconds += time.perf_counter() - started
                meter.clients += 1
                runtime.install(model, seed=pseed)
                metrics = runtime.evaluate(client.test)
                out += _records(method.label, budget, client, seed, rounds, metrics)
                if save and model.lora is not None:
                    self._save_adapter(method.label, budget, client.client_id)
            return out

        started = time.perf_counter()
        records: list[dict] = []
        for client, result in self.engine.map_clients(work, clients):
            if isinstance(result, BaseException):
                meter.failures.append(f"{client.client_id}: {result!r}")
                continue
            records += result
        meter.wall_seconds = time.perf_counter() - started
        costs += meter.rows(method.label, seed, "personalization")
        return records, costs

    def _save_adapter(self, label: str, budget: int | None, client_id: str) -> None:
        """Write the active adapter in PEFT format (loadable with ``PeftModel.from_pretrained``)."""
        runtime = self.runtime
        assert runtime.active is not None and runtime.peft is not None
        target = self.out / "adapters" / label / ("global" if budget is None else f"r{budget}") / client_id
        target.mkdir(parents=True, exist_ok=True)
        config = runtime.active.to_peft(runtime.loaded.head_modules)
        config.base_model_name_or_path = str((self.out / "base_model").resolve())
        config.save_pretrained(str(target))
        tensors = {k: v.contiguous() for k, v in runtime.adapter_state().items()}
        save_file(tensors, str(target / "adapter_model.safetensors"), metadata={"format": "pt"})

    # ------------------------------------------------------------------ outputs
    def _write_outputs(self) -> None:
        records, costs = [], []
        for name in self._parts:
            part = self.out / "parts" / f"{name}.jsonl"
            if not part.exists():
                continue
            for line in part.read_text().splitlines():
                row = json.loads(line)
                (costs.append(row["_cost"]) if "_cost" in row else records.append(row))
        (self.out / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
        (self.out / "costs.jsonl").write_text("".join(json.dumps(c) + "\n" for c in costs))
        from fedpeft import report

        info = dict(self.data.info)
        report.write_summary([self.out], self.out / "summary.md", title=self.cfg.name, info=info)
        if self.cfg.output.plots:
            report.write_plots([self.out], self.out / "plots")


def _records(
    method: str, budget: int | None, client: ClientData, seed: int, round_: int | None, metrics: Metrics
) -> list[dict]:
    return [
        {
            "method": method,
            "budget": budget,
            "pool": client.pool,
            "client": client.client_id,
            "group": client.group,
            "seed": seed,
            "round": round_,
            "split": "test",
            "metric": name,
            "value": float(value),
        }
        for name, value in metrics.items()
    ]
