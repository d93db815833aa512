"""An experiment bound to an output directory: its checks, then the engine's settings resolved once, the worker and
the engine built from them, and the run's stages (:class:`~fedpeft.runner.stages.Stages`)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from fedpeft.core.checkpoints import has_checkpoint
from fedpeft.core.config import ExperimentConfig, dump_config, dump_given
from fedpeft.core.errors import UserError
from fedpeft.core.progress import Progress
from fedpeft.data.types import FederatedData
from fedpeft.engine.pool import visible_gpus
from fedpeft.engine.resources import EngineSettings, check_gpu_workers
from fedpeft.engine.rounds import Engine
from fedpeft.models.runtime import check_device
from fedpeft.report.loggers import MetricLog
from fedpeft.rundir import RunDirectory
from fedpeft.runner.checks import check_config, check_frozen_base, check_loaded
from fedpeft.runner.engine_settings import run_engine_settings
from fedpeft.runner.environment import environment
from fedpeft.runner.outputs import check_result_coverage
from fedpeft.runner.stages import Stages
from fedpeft.worker import Worker, build_data

EngineFactory = Callable[[Worker], Engine]


class Experiment:
    """A configured experiment bound to an output directory (the server side of every engine).

    Constructing it checks the config's entries across each other and loads nothing; :meth:`run` checks the
    output directory, resolves the engine's settings (:attr:`engine_settings`, once), builds the worker (data and
    model) and the engine from them, and hands them to the run's :class:`Stages`.
    """

    def __init__(
        self, cfg: ExperimentConfig, out: Path, progress: Progress | None = None, data: FederatedData | None = None
    ) -> None:
        """``data``: the federation as the server sees it, when it does not build it from the config (site-local
        data, :func:`fedpeft.engine.flower.membership.register_sites`)."""
        check_config(cfg, data)
        self.cfg = cfg
        self.directory = RunDirectory(out, dump_config(cfg))
        self.progress = progress or Progress()
        self._given_data = data

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
        worker, settings = self._load(flower=engine_factory is not None or self.cfg.engine.name == "flower")
        if self.cfg.engine.name == "local":
            self.progress.note(settings.line())
        fresh = self.directory.create(dump_given(self.cfg), environment(self.cfg.device))
        try:
            metric_log = MetricLog(
                self.out,
                self.cfg.name,
                tensorboard=self.cfg.log.tensorboard,
                wandb=self.cfg.log.wandb,
                config=self.cfg.model_dump(mode="json"),
            )
            engine = engine_factory(worker) if engine_factory else self._local_engine(worker, settings)
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

    def _load(self, *, flower: bool) -> tuple[Worker, EngineSettings]:
        """This process's worker (data, model, methods), once every check that needs them has passed, and the
        engine's settings it was built with, resolved once here; nothing is written before."""
        check_device(self.cfg.device)
        check_frozen_base(self.cfg)
        gpus = visible_gpus(self.cfg.device) if self.cfg.engine.name == "local" else []
        check_gpu_workers(self.cfg.engine, gpus)
        data = self._given_data if self._given_data is not None else build_data(self.cfg)
        settings = run_engine_settings(self.cfg, data, gpus)
        load_model = flower or not settings.processes  # else its worker processes load it
        worker = Worker(self.cfg, self.out, data=data, load_model=load_model, state=settings.state)
        if not load_model and self._trains_centralized_base(worker):
            # Trained here before any client runs: loaded now, so that the checks of the model run here too and the
            # base stage starts while the worker processes start, not once one of them is ready.
            worker.runtime  # noqa: B018
        check_loaded(self.cfg, worker, flower=flower)
        return worker, settings

    def _trains_centralized_base(self, worker: Worker) -> bool:
        """Whether this run trains a centralized base stage (in this process) that it has not trained yet."""
        if self.cfg.base.kind != "centralized":
            return False
        return not all(has_checkpoint(worker.bases.base_checkpoint(seed), self.out) for seed in self.cfg.seeds)

    def _local_engine(self, worker: Worker, settings: EngineSettings) -> Engine:
        if self.cfg.engine.name == "flower":
            raise UserError("The flower engine runs through `fedpeft run --engine flower` or `flwr run .`.")
        from fedpeft.engine.local import LocalEngine

        return LocalEngine(
            worker,
            settings,
            on_client=self.progress.advance_client,
            data=self._given_data,
            batch_clients=self.cfg.engine.batch_clients,
        )
