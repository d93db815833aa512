"""A personalization or the base model's evaluation stopped midway (Ctrl-C, a killed machine) resumes from its next
client: each client's records are kept in ``parts/<unit>.clients.jsonl`` as it ends, a resumed unit runs only the
others, and the run's records are those of a run never stopped."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fedpeft.core.config import validate
from fedpeft.runner import Experiment
from fedpeft.worker import Worker
from tests.flower_helpers import read_records, tiny_raw


def lora_raw() -> dict:
    """Per-client LoRA alone on the pretrained base, in one process: a run that is all personalization."""
    return tiny_raw(base={"kind": "pretrained"}, methods=[tiny_raw()["methods"][1]], engine={"workers": 1})


def kept_clients(run: Path) -> list[str]:
    part = run / "parts" / "lora-seed0.clients.jsonl"
    return [json.loads(line)["client"] for line in part.read_text().splitlines()]


def test_a_personalization_stopped_midway_resumes_from_its_next_client(tmp_path, monkeypatch):
    reference = Experiment(validate(lora_raw()), tmp_path / "reference").run()
    assert not (reference / "parts" / "lora-seed0.clients.jsonl").exists()  # dropped once the unit's part is written

    personalize = Worker.personalize
    ran: list[str] = []

    def stop_at_the_fourth(self, label, seed, client_id, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        if len(ran) == 3:
            raise KeyboardInterrupt
        ran.append(client_id)
        return personalize(self, label, seed, client_id, *args, **kwargs)

    run = tmp_path / "run"
    monkeypatch.setattr(Worker, "personalize", stop_at_the_fourth)
    with pytest.raises(KeyboardInterrupt):
        Experiment(validate(lora_raw()), run).run()
    assert not (run / "parts" / "lora-seed0.jsonl").exists()
    assert kept_clients(run) == ran

    resumed: list[str] = []

    def counted(self, label, seed, client_id, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        resumed.append(client_id)
        return personalize(self, label, seed, client_id, *args, **kwargs)

    monkeypatch.setattr(Worker, "personalize", counted)
    out = Experiment(validate(lora_raw()), run).run(resume=True)
    clients = {r["client"] for r in map(json.loads, (out / "results.jsonl").read_text().splitlines()) if r["client"]}
    assert set(resumed).isdisjoint(ran) and sorted(resumed + ran) == sorted(clients)
    assert read_records(out) == read_records(reference)  # the same records, in the same order of clients
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    first = [json.loads(line) for line in (reference / "results.jsonl").read_text().splitlines()]
    assert [r["client"] for r in rows] == [r["client"] for r in first]
    assert not (run / "parts" / "lora-seed0.clients.jsonl").exists()


def test_a_cut_last_line_is_a_client_to_run_again(tmp_path, monkeypatch):
    """A crash while a client's line was written leaves it cut: that client runs again on resume."""
    personalize = Worker.personalize
    ran: list[str] = []

    def stop_at_the_third(self, label, seed, client_id, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        if len(ran) == 2:
            raise KeyboardInterrupt
        ran.append(client_id)
        return personalize(self, label, seed, client_id, *args, **kwargs)

    run = tmp_path / "run"
    monkeypatch.setattr(Worker, "personalize", stop_at_the_third)
    with pytest.raises(KeyboardInterrupt):
        Experiment(validate(lora_raw()), run).run()
    part = run / "parts" / "lora-seed0.clients.jsonl"
    lines = part.read_text().splitlines()
    part.write_text(lines[0] + "\n" + lines[1][: len(lines[1]) // 2])

    resumed: list[str] = []

    def stop_again(self, label, seed, client_id, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        if len(resumed) == 2:
            raise KeyboardInterrupt
        resumed.append(client_id)
        return personalize(self, label, seed, client_id, *args, **kwargs)

    monkeypatch.setattr(Worker, "personalize", stop_again)
    with pytest.raises(KeyboardInterrupt):
        Experiment(validate(lora_raw()), run).run(resume=True)
    assert resumed[0] == ran[1]  # the client whose line was cut runs again, first
    assert kept_clients(run) == [ran[0], *resumed]  # every line whole: the cut one was removed before appending

    monkeypatch.setattr(Worker, "personalize", personalize)
    out = Experiment(validate(lora_raw()), run).run(resume=True)
    assert not (out / "parts" / "lora-seed0.clients.jsonl").exists()


def test_the_base_models_evaluation_stopped_midway_resumes_from_its_next_client(tmp_path, monkeypatch):
    reference = Experiment(validate(lora_raw()), tmp_path / "reference").run()
    evaluate = Worker.evaluate_base
    ran: list[str] = []

    def stop_at_the_third(self, seed, client_id, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        if len(ran) == 2:
            raise KeyboardInterrupt
        ran.append(client_id)
        return evaluate(self, seed, client_id, *args, **kwargs)

    run = tmp_path / "run"
    monkeypatch.setattr(Worker, "evaluate_base", stop_at_the_third)
    with pytest.raises(KeyboardInterrupt):
        Experiment(validate(lora_raw()), run).run()
    part = run / "parts" / "base-seed0.clients.jsonl"
    assert [json.loads(line)["client"] for line in part.read_text().splitlines()] == ran

    resumed: list[str] = []

    def counted(self, seed, client_id, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        resumed.append(client_id)
        return evaluate(self, seed, client_id, *args, **kwargs)

    monkeypatch.setattr(Worker, "evaluate_base", counted)
    out = Experiment(validate(lora_raw()), run).run(resume=True)
    assert resumed and set(resumed).isdisjoint(ran)
    assert read_records(out) == read_records(reference)
    assert not part.exists()
