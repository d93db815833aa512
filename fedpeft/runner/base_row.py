"""The base row of a seed: the base model, not personalized, evaluated on every client's test split (the client's
own base model where the base stage gives one per client)."""

from __future__ import annotations

from fedpeft.core.costs import FAILED_CLIENT, CostMeter
from fedpeft.core.records import ResultRecord
from fedpeft.runner.started import StartedRun, check_clients
from fedpeft.worker import BASE_LABEL


def evaluate_base(run: StartedRun, seed: int, unit: str | None = None) -> tuple[list[ResultRecord], list[dict]]:
    """The base row's unit of ``seed``: every client's records, and the cost rows of the clients that failed (the
    base row's time and memory are not a method's, so not counted). With ``unit`` (its name in ``parts/``), each
    client's records are kept as it ends and a resumed unit evaluates only the others."""
    run.progress.stage(f"base model evaluation, seed {seed}")
    ids = run.client_ids()
    records: list[ResultRecord] = []
    meter = CostMeter()
    for result in run.each_client_kept(unit, "evaluate_base", ids, meter.record_failure, seed=seed).results.values():
        records += result
    check_clients(f"the base model's evaluation (seed {seed})", len(ids), meter.failures)
    failed = ("failed_clients", FAILED_CLIENT)  # its failures, not its time and memory
    return records, [r for r in meter.rows(BASE_LABEL, seed, "evaluation") if r["metric"] in failed]
