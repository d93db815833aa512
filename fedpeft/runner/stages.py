"""The stages of one started run, in order: each seed's base stage (and its clients' own bases), then its base row
and its methods, each a unit whose records go to ``parts/`` once it completes, then the run's outputs."""

from __future__ import annotations

from typing import Any

from fedpeft.core.config import ExperimentConfig
from fedpeft.core.progress import Progress
from fedpeft.core.records import ResultRecord
from fedpeft.engine.rounds import Engine
from fedpeft.methods.base import Method
from fedpeft.report.loggers import MetricLog
from fedpeft.rundir import RunDirectory
from fedpeft.runner.base_row import evaluate_base
from fedpeft.runner.base_stage import BaseStage
from fedpeft.runner.method_unit import run_method
from fedpeft.runner.outputs import write_outputs
from fedpeft.runner.phases import FederatedPhases
from fedpeft.runner.started import StartedRun
from fedpeft.runner.units import Units, UnitWork
from fedpeft.worker import Worker


def method_unit_name(method: Method, seed: int) -> str:
    """The unit of ``method`` for ``seed``, as ``parts/`` names it."""
    return f"{method.label}-seed{seed}"


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
        self.started = StartedRun(cfg, directory, worker, engine, metric_log, progress)
        self.data = worker.data
        self.methods = [worker.methods[entry.label or entry.name] for entry in cfg.methods]
        self.units = Units(directory, engine, metric_log)
        self.phases = FederatedPhases(self.started)
        self.base_stage = BaseStage(self.started, self.phases, self.units)

    def run(self) -> None:
        """Every seed's units, in order; a unit already in ``parts/`` is skipped. Where the seeds share one base
        model (pretrained, or a centralized base stage trained once), every seed's units follow its base stage
        together, so an engine that runs units at once has them all to choose from."""
        cfg, worker = self.started.cfg, self.started.worker
        seeds = cfg.seeds
        one_base = cfg.base.kind == "pretrained" or cfg.base.shared
        for group in [seeds] if one_base and not worker.bases.per_client_base else [[seed] for seed in seeds]:
            evaluations, methods = [], []
            for seed in group:
                self.base_stage.produce(seed)
                if worker.bases.per_client_base:
                    self.units.run(f"client-base-seed{seed}", lambda s=seed: self.base_stage.client_bases(s))
                # The base model's evaluation and the methods need nothing of each other (they may run at once).
                base_unit = f"base-seed{seed}"
                evaluations.append((base_unit, self._base_evaluation_unit(seed, base_unit)))
                methods.append([(method_unit_name(m, seed), self._method_unit(m, seed)) for m in self.methods])
            self.units.run_seeds(evaluations, methods)

    def _method_unit(self, method: Method, seed: int) -> UnitWork:
        return lambda: run_method(self.started, self.phases, method, seed, unit=method_unit_name(method, seed))

    def _base_evaluation_unit(self, seed: int, unit: str) -> UnitWork:
        return lambda: evaluate_base(self.started, seed, unit)

    def write_engine_costs(self, rows: list[dict[str, Any]]) -> None:
        """Keep the engine's own cost rows in ``costs.jsonl`` (:meth:`Units.write_engine_costs`)."""
        self.units.write_engine_costs(rows)

    def write_outputs(self) -> list[ResultRecord]:
        """Merge the parts into ``results.jsonl`` and ``costs.jsonl``, then the data overview, the summary and
        the plots; returns the run's records."""
        return write_outputs(self.started, self.units.parts)
