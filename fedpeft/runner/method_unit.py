"""One method for one seed, the unit of a method's row: its federated phase (one per budget, for a method that
runs one per budget; none for a method that does not federate), then every client personalized at each of its
budgets and evaluated, then the unit's costs (time, memory, traffic, the method's own, merge costs)."""

from __future__ import annotations

from typing import Any

from fedpeft.core.costs import CostMeter
from fedpeft.core.records import ResultRecord
from fedpeft.core.types import ServerState
from fedpeft.methods.base import Method
from fedpeft.runner.phases import FederatedPhases, communication_rows
from fedpeft.runner.started import StartedRun, check_clients


def run_method(
    run: StartedRun, phases: FederatedPhases, method: Method, seed: int, unit: str | None = None
) -> tuple[list[ResultRecord], list[dict]]:
    """The records and cost rows of ``method``'s unit of ``seed`` (federated phases run by ``phases``). With
    ``unit`` (its name in ``parts/``), each personalized client is kept on disk as it ends, and a resumed unit
    personalizes only the clients not kept yet (:func:`personalize_clients`)."""
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
            for b in run.cfg.budgets:
                phase = phases.federate(method, method.label, seed, meter=meter, budget=b, earlier=round_records)
                extra["budget_states"][b], round_records = phase.state, phase.records
        else:
            phase = phases.federate(method, method.label, seed, meter=meter)
            state, round_records = phase.state, phase.records
        costs += run.cost_rows(meter, method.label, seed, "federated")
        costs += meter.evaluation_rows(method.label, seed)
        costs += communication_rows(method.label, seed, meter, len(run.data.pool("seen")))
        method.save_server_artifacts(state, run.out, seed)
        records += round_records
    budgets = len(run.cfg.budgets) if method.uses_budget else 1
    meter = CostMeter()
    records += personalize_clients(run, method, seed, state, extra, meter, budgets, unit)
    check_clients(f"{method.label}'s personalization (seed {seed})", len(run.client_ids()), meter.failures)
    costs += run.cost_rows(meter, method.label, seed, "personalization")
    costs += run.engine.call_worker("compute_costs", run.worker, label=method.label, seed=seed)
    costs += merge_cost_rows(method.label, seed, records, federated_meter)
    return records, costs


def personalize_clients(
    run: StartedRun,
    method: Method,
    seed: int,
    state: ServerState,
    extra: dict[str, Any],
    meter: CostMeter,
    budgets: int,
    unit: str | None,
) -> list[ResultRecord]:
    """Every client personalized at each budget and evaluated: their records in client order, ``meter`` counting
    their seconds, failures and wall time. With ``unit``, each client's records are kept as it ends and a resumed
    unit runs only the clients not kept (:meth:`~fedpeft.runner.started.StartedRun.each_client_kept`); its wall
    time adds the earlier sittings'."""
    run.progress.stage(f"{method.label}: personalization and evaluation, seed {seed}")
    save = run.cfg.output.save_adapters and seed == run.cfg.seeds[0]
    done = run.each_client_kept(
        unit,
        "personalize",
        run.client_ids(),
        meter.record_failure,
        label=method.label,
        seed=seed,
        state=state,
        save_adapters=save,
        **extra,
    )
    records: list[ResultRecord] = []
    for client_records, seconds in done.results.values():
        records += client_records
        meter.client_seconds += seconds
        meter.clients += budgets
    meter.wall_seconds = done.wall_seconds
    return records


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
