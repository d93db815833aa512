"""The federated phases of a run: a method's phase on the seen pool (for a budget, where it runs one per budget),
checkpointed every round and continued from its checkpoint, with its schedule (asynchronous, or synchronous rounds
on the virtual clock where clients have speeds) and what the runner makes of every round (:class:`RoundOutputs`:
the round's evaluation, epsilon under DP, the train rows, the loggers' scalars and the progress line)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from functools import partial

from fedpeft.core.checkpoints import SUFFIX, has_checkpoint, load_checkpoint
from fedpeft.core.config import BASE_STAGE_LABEL
from fedpeft.core.costs import CostMeter
from fedpeft.core.records import ResultRecord, result_record
from fedpeft.core.types import Metrics, ServerState
from fedpeft.data.types import ClientData
from fedpeft.engine.asynchronous import AsynchronousSchedule, client_work, virtual_durations
from fedpeft.engine.phase import FederatedPhase, PhaseCheckpoint, RoundCallback, Schedule
from fedpeft.engine.rounds import SynchronousRounds
from fedpeft.engine.validation import UpdateChecks
from fedpeft.methods.base import FederatedConfig, MeanServerConfigMixin, Method
from fedpeft.runner.entries import asynchronous_labels
from fedpeft.runner.started import StartedRun


class FederatedPhases:
    """Runs the federated phases of a started run's methods, its base stage's included."""

    def __init__(self, run: StartedRun) -> None:
        self.run = run

    def federate(
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
        run = self.run
        name = f"seed{seed}" if budget is None else f"seed{seed}-r{budget}"
        ckpt = run.out / "checkpoints" / label / f"{name}{SUFFIX}"
        seen = [c.client_id for c in run.data.pool("seen")]
        method.bind_pool(seen)  # DP divides by the clients sampled per round from it
        checks = UpdateChecks({c.client_id: len(c.train) for c in run.data.clients}, run.cfg.validation.max_norm)
        outputs = RoundOutputs(
            self, method, label, seed, budget, meter, self._epsilon(method, label, seed, budget, len(seen))
        )
        checkpoint = PhaseCheckpoint(ckpt, run.worker.store(label, seed))
        phase = FederatedPhase(
            label, method, seen, seed, checks, [outputs], checkpoint, meter=meter, records=[*earlier]
        )
        if has_checkpoint(ckpt, run.out):
            phase.resume(load_checkpoint(ckpt))
        else:
            started = time.perf_counter()
            phase.state = run.engine.call_worker("init_server", run.worker, label=label, seed=seed, budget=budget)
            meter.server_init_seconds += time.perf_counter() - started
        per_budget = "" if budget is None else f", r={budget}"
        run.progress.stage(f"{label}: federated training, seed {seed}{per_budget}")
        run.progress.rounds(method.rounds, phase.state.round)
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
        engine = self.run.engine
        if schedule is not None and schedule.asynchronous:
            return AsynchronousSchedule(engine, schedule, self._durations(method, seen, seed))
        durations = self._durations(method, seen, seed) if self._virtual_clock() else None
        return SynchronousRounds(engine, min_updates=self.run.cfg.validation.min_updates, durations=durations)

    def _virtual_clock(self) -> bool:
        """Whether synchronous rounds also keep the virtual clock: when clients have speeds, or a method of the
        config runs an asynchronous schedule (its records are then comparable in virtual time)."""
        return bool(asynchronous_labels(self.run.cfg)) or self.run.cfg.clients.speed.varies

    def _durations(self, method: Method, client_ids: list[str], seed: int) -> dict[str, float]:
        """Each client's virtual duration under an asynchronous schedule of the method (docs/async.md)."""
        cfg = method.cfg
        clients = [self.run.data.client(c) for c in client_ids]
        if isinstance(cfg, FederatedConfig):
            steps, epochs, batch = cfg.local_steps, cfg.local_epochs, cfg.batch_size
        else:
            steps, epochs, batch = 1, None, 1  # a method without local steps: every client's work counts as one
        # local_epochs, when set, decides (as the local training does)
        work = partial(_client_work, None if epochs is not None else steps, epochs, batch)
        return virtual_durations(work, clients, self.run.cfg.clients.speed, seed)

    def evaluate_round(
        self, method: Method, label: str, seed: int, state: ServerState, completed: int, meter: CostMeter
    ) -> tuple[list[ResultRecord], float | None]:
        """Evaluate every client's current model after ``completed`` rounds, every ``eval.every`` rounds, counting
        its clients in the progress display; a client whose evaluation fails is left out and recorded in ``meter``,
        which also adds the evaluation's seconds and clients. Returns its records and seconds (none and None when
        no evaluation is due)."""
        run = self.run
        every = run.cfg.eval.every
        rounds = method.rounds
        if not every or label == BASE_STAGE_LABEL or (completed % every and completed != rounds):
            return [], None
        records: list[ResultRecord] = []
        ids = run.client_ids()
        run.progress.clients(len(ids), step=f"evaluation after round {completed}")
        failed = partial(meter.record_evaluation_failure, round_=completed - 1)
        started = time.perf_counter()
        for _, result in run.each_client(
            "evaluate_round", ids, failed, label=label, seed=seed, round_=completed, state=state
        ):
            records += result
        seconds = time.perf_counter() - started
        meter.evaluation_seconds += seconds
        meter.evaluated_clients += len(ids)
        return records, seconds


class RoundOutputs:
    """What the runner makes of every round of a federated phase, in this order: the evaluation of every client
    every ``eval.every`` rounds, epsilon under DP (``epsilon``), the train rows, the metric loggers' scalars and
    the progress line. The round's records (evaluation, epsilon, train rows) go to the phase, which keeps them in
    its checkpoints."""

    def __init__(
        self,
        phases: FederatedPhases,
        method: Method,
        label: str,
        seed: int,
        budget: int | None,
        meter: CostMeter,
        epsilon: RoundCallback | None = None,
    ) -> None:
        self.phases, self.method, self.label, self.seed, self.budget = phases, method, label, seed, budget
        self.meter, self.epsilon = meter, epsilon

    def after_round(self, state: ServerState, round_: int, metrics: Metrics) -> list[ResultRecord]:
        phases, label, budget, seed = self.phases, self.label, self.budget, self.seed
        records, seconds = phases.evaluate_round(self.method, label, seed, state, round_ + 1, self.meter)
        if self.epsilon is not None:
            records += self.epsilon.after_round(state, round_, metrics)
        records += train_rows(label, budget, seed, round_, metrics)
        phases.run.metric_log.round(label, budget, seed, round_ + 1, metrics)
        phases.run.progress.advance_round(metrics, seconds)
        return records

    def after_phase(self, state: ServerState) -> None:
        return None


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
