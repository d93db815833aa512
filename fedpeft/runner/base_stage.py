"""The base stage of a run: the base model of each seed (none to train for a pretrained one; trained here for a
centralized one; a federated phase of the base method, exported, for a federated one), every client's own base
model where the base method gives one per client, and ``base_model/``, the base saved adapters name."""

from __future__ import annotations

import math
import time
from pathlib import Path

from fedpeft.base_models import train_centralized_base
from fedpeft.core.checkpoints import SUFFIX, has_checkpoint, load_checkpoint, save_checkpoint
from fedpeft.core.config import BASE_STAGE_LABEL
from fedpeft.core.costs import CostMeter
from fedpeft.core.errors import UserError
from fedpeft.core.records import ResultRecord
from fedpeft.core.types import ServerState
from fedpeft.runner.phases import FederatedPhases
from fedpeft.runner.started import StartedRun
from fedpeft.runner.units import Units
from fedpeft.worker import BASE_LABEL, base_model_dir


class BaseStage:
    """Produces the base models of a started run, seed by seed, and the clients' own ones."""

    def __init__(self, run: StartedRun, phases: FederatedPhases, units: Units) -> None:
        self.run = run
        self.phases = phases
        self.units = units

    def produce(self, seed: int) -> None:
        """Produce the base model of this seed (unless there is nothing to train or it exists already)."""
        run, worker = self.run, self.run.worker
        base = run.cfg.base
        if base.kind == "pretrained":
            # Saved adapters name base_model/ as their base: it holds the loaded weights (a pretrained model's
            # fresh task head included), written once per run.
            if run.cfg.output.save_adapters and not self._base_model_saved():
                run.engine.call_worker("save_base_model", worker)
            return
        shared = base.shared
        name = "base-stage" if shared else f"base-stage-seed{seed}"
        path = worker.bases.base_checkpoint(seed)
        self.units.add(name)
        if has_checkpoint(path, run.out):
            if (shared or seed == run.cfg.seeds[0]) and not self._base_model_saved():
                run.engine.call_worker("save_base_model", worker, seed=seed)  # deleted since: rebuilt
            return
        run.progress.stage(f"base model ({base.kind}), seed {seed}")
        meter = CostMeter()
        privacy: list[ResultRecord] = []
        started = time.perf_counter()
        if base.kind == "centralized":
            if not run.data.base_train:
                raise UserError(
                    f"Dataset {run.cfg.data.name} has no base corpus; use base.kind=pretrained or federated."
                )
            # Trained in this process (its model loaded here, also when worker processes run the clients).
            runtime = worker.runtime
            worker.bases.use_base(None)
            run.progress.epochs(math.ceil(base.epochs))
            train_centralized_base(
                runtime, run.data.base_train, base, after_epoch=run.progress.advance_epoch, run_seed=seed
            )
            save_checkpoint({"tensors": runtime.base_tensors()}, path)
        else:
            method = worker.methods[BASE_STAGE_LABEL]
            phase = self.phases.federate(method, BASE_STAGE_LABEL, seed, meter=meter)
            run.engine.call_worker("export_base", worker, seed=seed, state=phase.state)
            privacy = phase.records  # a DP base stage's epsilon per round
        meter.wall_seconds = time.perf_counter() - started
        run.directory.write_part(name, privacy, run.cost_rows(meter, BASE_LABEL, seed, "base"))
        if shared or seed == run.cfg.seeds[0]:
            run.engine.call_worker("save_base_model", worker, seed=seed)

    def client_bases(self, seed: int) -> tuple[list[ResultRecord], list[dict]]:
        """Every client's own base model (per-client base stages), computed where its base-stage state lives."""
        run = self.run
        run.progress.stage(f"base model of every client, seed {seed}")
        ckpt = run.out / "checkpoints" / BASE_STAGE_LABEL / f"seed{seed}{SUFFIX}"
        state = ServerState()
        if has_checkpoint(ckpt, run.out):  # the stage's final state and client states, also after a restart
            saved = load_checkpoint(ckpt)
            run.worker.store(BASE_STAGE_LABEL, seed).restore(saved["store"])
            state = saved["state"]
        ids = run.client_ids()
        run.progress.clients(len(ids))
        meter = CostMeter()
        started = time.perf_counter()
        for _ in run.each_client("prepare_client_base", ids, meter.record_failure, seed=seed, state=state):
            pass
        meter.wall_seconds = time.perf_counter() - started
        return [], run.cost_rows(meter, BASE_LABEL, seed, "client-base")

    def _base_model_dirs(self) -> list[Path]:
        """Where the base models saved adapters load onto go: one per architecture of a heterogeneous federation."""
        federation = self.run.worker.federation
        if not federation.heterogeneous:
            return [base_model_dir(self.run.out)]
        return [base_model_dir(self.run.out, name) for name in federation.names]

    def _base_model_saved(self) -> bool:
        return all((directory / "model.safetensors").is_file() for directory in self._base_model_dirs())
