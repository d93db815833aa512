"""Every failed client is a record: a ``failed_client`` row in costs.jsonl (client, round, phase, error class and
message) and a row of summary.md's "Failed clients" table, whatever made it fail, on either engine; an injected
fault that raises is also an ``injected_fault`` row."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from fedpeft.core.config import validate
from fedpeft.core.costs import FAILED_CLIENT, CostMeter
from fedpeft.core.faults import InjectedDropError, InjectedFaultError
from fedpeft.engine.flower.codec import ClientTaskError, client_error, error_details
from fedpeft.report import write_summary
from fedpeft.runner import Experiment
from fedpeft.worker import Worker
from tests.test_flower import tiny_raw
from tests.test_report import COSTS, classification_records, cost, write_run

CRASHED = "lat1-seen-00"


def cheap_raw(**changes: object) -> dict:
    """FedIT alone, two rounds, on the pretrained base: the cheapest run with federated rounds."""
    return tiny_raw(base={"kind": "pretrained"}, methods=[tiny_raw()["methods"][0]], **changes)


def costs_of(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "costs.jsonl").read_text().splitlines()]


def failed_rows(run_dir: Path) -> list[dict]:
    return [r for r in costs_of(run_dir) if r["metric"] == FAILED_CLIENT]


def failures_section(summary: str) -> str:
    return summary.split("## Failed clients")[1].split("\n## ")[0]


# ---------------------------------------------------------------------------------------------- injected
def test_an_injected_crash_is_a_failed_client_and_an_injected_fault_and_survives_resume(tmp_path, monkeypatch):
    """The run is interrupted in round 2, after round 1's crash is checkpointed, and resumed: the crash's rows
    come from the checkpointed cost meter."""
    from fedpeft.methods.fedit import FedIT

    raw = cheap_raw(faults=[{"kind": "raise", "clients": [CRASHED], "rounds": [1]}])
    aggregate = FedIT.aggregate

    def stop_in_round_two(self, state, updates):  # noqa: ANN001, ANN202
        if state.round == 1:  # the state after one round: round 2 aggregates
            raise KeyboardInterrupt
        return aggregate(self, state, updates)

    monkeypatch.setattr(FedIT, "aggregate", stop_in_round_two)
    with pytest.raises(KeyboardInterrupt):
        Experiment(validate(raw), tmp_path / "run").run()
    monkeypatch.setattr(FedIT, "aggregate", aggregate)
    out = Experiment(validate(raw), tmp_path / "run").run(resume=True)

    rows = costs_of(out)
    assert [r for r in rows if r["metric"] == FAILED_CLIENT] == [
        {
            "method": "fedit",
            "seed": 0,
            "phase": "federated",
            "value": 1.0,
            "metric": FAILED_CLIENT,
            "round": 1,  # the first round, as results.jsonl and the progress lines count it
            "client": CRASHED,
            "error": "InjectedFaultError",
            "message": "injected fault: the client's work raised",
        }
    ]
    faults = [(r["phase"], r["round"], r["client"], r["kind"]) for r in rows if r["metric"] == "injected_fault"]
    assert faults == [("federated", 1, CRASHED, "raise")]
    aggregates = {(r["method"], r["phase"], r["metric"]): r["value"] for r in rows}
    assert aggregates["fedit", "federated", "failed_client_rounds"] == 1.0  # the count stays as it was
    section = failures_section((out / "summary.md").read_text())
    assert "- **fedit**, seed 0, federated: 1 client-round(s) failed" in section
    assert "| Method | Seed | Phase | Round | Client | Error | Message |" in section
    assert f"| fedit | 0 | federated | 1 | {CRASHED} | `InjectedFaultError` | injected fault:" in section


def test_a_fault_in_round_1_strikes_the_first_round_as_the_log_and_the_records_count_it(tmp_path, caplog):
    """`faults` counts rounds as the log, results.jsonl, costs.jsonl and summary.md do: `rounds: [1]` is the
    first round in each of them, and the second round goes untouched."""
    bad = "lat1-seen-01"
    caplog.set_level(logging.WARNING, logger="fedpeft")
    raw = cheap_raw(faults=[{"kind": "nan", "clients": [bad], "rounds": [1]}])
    out = Experiment(validate(raw), tmp_path / "run").run()

    warnings = [r.getMessage() for r in caplog.records if bad in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].startswith(f"round 1: the update of client(s) {bad} was rejected")
    events = {(r["metric"], r["round"], r.get("client")) for r in costs_of(out) if "round" in r}
    assert events == {("injected_fault", 1, bad), ("rejected_update", 1, bad)}
    results = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    aggregated = {r["round"]: r["value"] for r in results if r["split"] == "train" and r["metric"] == "clients"}
    assert aggregated == {1: 3, 2: 4}  # the first round aggregated the three other clients
    summary = (out / "summary.md").read_text()
    assert f"| fedit | 0 | 1 | {bad} | fault injected | nan |" in summary
    assert f"| fedit | 0 | 1 | {bad} | rejected |" in summary


# ---------------------------------------------------------------------------------------------- real errors
def test_real_errors_of_every_phase_are_failed_clients_without_injected_faults(tmp_path, monkeypatch):
    """A client's training, personalization and base-model evaluation raise (not through `faults`): a row each,
    with its phase, round (federated only), error class and the first line of its message."""
    train, personalize, evaluate_base = Worker.train, Worker.personalize, Worker.evaluate_base

    def flaky_train(self, label, seed, round_, client_id, payload):  # noqa: ANN001, ANN202
        if client_id == "lat1-seen-01" and round_ == 1:
            raise RuntimeError("CUDA error: device lost\nthe traceback's second line")
        return train(self, label, seed, round_, client_id, payload)

    def flaky_personalize(self, label, seed, client_id, state, **kwargs):  # noqa: ANN001, ANN202
        if client_id == "lat2-seen-01":
            raise ValueError("x" * 500)
        return personalize(self, label, seed, client_id, state, **kwargs)

    def flaky_evaluate_base(self, seed, client_id):  # noqa: ANN001, ANN202
        if client_id == "lat2-seen-00":
            raise OSError("disk full")
        return evaluate_base(self, seed, client_id)

    def flaky_evaluate_round(self, label, seed, round_, client_id, state):  # noqa: ANN001, ANN202
        if client_id == "lat1-seen-00" and round_ == 2:
            raise MemoryError("out of memory")
        return evaluate_round(self, label, seed, round_, client_id, state)

    evaluate_round = Worker.evaluate_round
    monkeypatch.setattr(Worker, "train", flaky_train)
    monkeypatch.setattr(Worker, "personalize", flaky_personalize)
    monkeypatch.setattr(Worker, "evaluate_base", flaky_evaluate_base)
    monkeypatch.setattr(Worker, "evaluate_round", flaky_evaluate_round)
    accepted = {"min_result_fraction": 0.5}  # two clients have no final result: the run still completes
    out = Experiment(validate(cheap_raw(eval={"every": 1}, validation=accepted)), tmp_path / "run").run()

    rows = {(r["method"], r["phase"], r.get("round"), r["client"]): r for r in failed_rows(out)}
    assert set(rows) == {
        ("fedit", "federated", 2, "lat1-seen-01"),  # round 2, as the progress line says it
        ("fedit", "federated", 2, "lat1-seen-00"),  # its evaluation after round 2 (eval.every)
        ("fedit", "personalization", None, "lat2-seen-01"),
        ("base", "evaluation", None, "lat2-seen-00"),
    }
    evaluation = rows["fedit", "federated", 2, "lat1-seen-00"]
    assert evaluation["step"] == "evaluation" and evaluation["error"] == "MemoryError"
    assert "step" not in rows["fedit", "federated", 2, "lat1-seen-01"]
    assert rows["fedit", "federated", 2, "lat1-seen-01"]["error"] == "RuntimeError"
    assert rows["fedit", "federated", 2, "lat1-seen-01"]["message"] == "CUDA error: device lost"
    long = rows["fedit", "personalization", None, "lat2-seen-01"]
    assert long["error"] == "ValueError" and len(long["message"]) == 200 and long["message"].endswith("…")
    assert rows["base", "evaluation", None, "lat2-seen-00"]["message"] == "disk full"
    assert not [r for r in costs_of(out) if r["metric"] == "injected_fault"]
    section = failures_section((out / "summary.md").read_text())
    assert "| fedit | 0 | federated | 2 | lat1-seen-01 | `RuntimeError` | CUDA error: device lost |" in section
    assert "| fedit | 0 | personalization | — | lat2-seen-01 | `ValueError` |" in section
    assert "| base | 0 | evaluation | — | lat2-seen-00 | `OSError` | disk full |" in section
    assert "| fedit | 0 | federated (evaluation) | 2 | lat1-seen-00 | `MemoryError` | out of memory |" in section
    aggregates = {(r["method"], r["phase"], r["metric"]): r["value"] for r in costs_of(out)}
    assert aggregates["fedit", "federated", "failed_client_rounds"] == 1.0  # training's failures only


# ---------------------------------------------------------------------------------------------- Flower replies
@pytest.mark.parametrize(
    ("error", "dropped", "expected", "injected"),
    [
        (InjectedFaultError("injected fault: the client's work raised"), False, "InjectedFaultError", "raise"),
        (InjectedDropError("injected fault: the client dropped out"), True, "InjectedDropError", "drop"),
        (KeyError("lora_A"), False, "KeyError", None),
    ],
)
def test_a_nodes_error_report_becomes_the_record_the_local_engine_writes(error, dropped, expected, injected):
    """What a Flower node reports of a client's error (its repr, class name and message) gives the server the
    same rows as the error itself on the local engine."""
    reported = client_error(repr(error), {"client": "c1", **error_details(error)}, dropped=dropped)
    remote, local = CostMeter(), CostMeter()
    remote.record_failure("c1", reported, round_=3)
    local.record_failure("c1", error, round_=3)
    assert remote.events == local.events
    assert remote.events[-1] == {
        "metric": FAILED_CLIENT,
        "round": 4,  # the 0-based round 3, counted from 1
        "client": "c1",
        "error": expected,
        "message": str(error),
    }
    assert [e["kind"] for e in remote.events if e["metric"] == "injected_fault"] == ([injected] if injected else [])
    assert len(remote.failures) == 1


def test_a_node_that_names_no_error_class_gives_the_engine_error():
    meter = CostMeter()
    meter.record_failure("c1", client_error("RuntimeError('boom')", {}))
    meter.record_failure("c2", ClientTaskError("no SuperNode serves its partition now (its node was lost)"))
    rows = [r for r in meter.rows("fedit", 0, "personalization") if r["metric"] == FAILED_CLIENT]
    assert [(r["client"], r["error"], r["message"]) for r in rows] == [
        ("c1", "ClientTaskError", "RuntimeError('boom')"),
        ("c2", "ClientTaskError", "no SuperNode serves its partition now (its node was lost)"),
    ]
    assert all("round" not in r for r in rows)
    failed = {r["metric"]: r["value"] for r in meter.rows("fedit", 0, "personalization")}["failed_clients"]
    assert failed == 2.0


# ---------------------------------------------------------------------------------------------- the summary
def test_the_summary_lists_twenty_failed_clients_and_counts_the_others(tmp_path):
    failures = [
        {
            **cost("lora", 0, "federated", FAILED_CLIENT, 1.0),
            "round": i // 5,
            "client": f"en-{i % 5}",
            "error": "RuntimeError",
            "message": "a | b",
        }
        for i in range(25)
    ]
    run = write_run(
        tmp_path / "run",
        classification_records(),
        [*COSTS, cost("lora", 0, "federated", "failed_client_rounds", 25.0), *failures],
    )
    section = failures_section(write_summary([run], tmp_path / "summary.md"))
    table = [line for line in section.splitlines() if line.startswith("| lora |")]
    assert len(table) == 20 and table[0] == "| lora | 0 | federated | 0 | en-0 | `RuntimeError` | a \\| b |"
    assert "and 5 more failed client(s)" in section
