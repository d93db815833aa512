"""A personalization or the base model's evaluation stopped midway (Ctrl-C, a killed machine) resumes from its next
client: each client's records are kept in ``parts/<unit>.clients.jsonl`` as it ends, a resumed unit runs only the
others, and the run's records are those of a run never stopped."""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from fedpeft.core.config import validate
from fedpeft.runner import Experiment
from fedpeft.worker import Worker
from tests.flower_helpers import read_records, tiny_raw


def lora_raw() -> dict:
    """Per-client LoRA alone on the pretrained base, in one process: a run that is all personalization."""
    return tiny_raw(base={"kind": "pretrained"}, methods=[tiny_raw()["methods"][1]], engine={"workers": 1})


def kept_clients(part: Path) -> list[str]:
    return [json.loads(line)["client"] for line in part.read_text().splitlines()]


def counting(operation: Callable[..., Any], ran: list[str], stop_at: int | None = None) -> Callable[..., Any]:
    """``operation`` (a worker's per-client method) that appends each client it runs to ``ran`` and raises
    ``KeyboardInterrupt`` (as Ctrl-C does) instead of running client number ``stop_at`` (counted from 0)."""

    def operation_of(self: Worker, *args: Any, **kwargs: Any) -> Any:
        client_id = inspect.signature(operation).bind(self, *args, **kwargs).arguments["client_id"]
        if len(ran) == stop_at:
            raise KeyboardInterrupt
        ran.append(client_id)
        return operation(self, *args, **kwargs)

    return operation_of


def stopped_run(
    run: Path, monkeypatch: pytest.MonkeyPatch, name: str, stop_at: int, *, resume: bool = False
) -> list[str]:
    """Start (or resume) the run in ``run`` and stop it at the ``stop_at``-th client of the worker's ``name``;
    the clients it ran."""
    ran: list[str] = []
    monkeypatch.setattr(Worker, name, counting(getattr(Worker, name), ran, stop_at))
    with pytest.raises(KeyboardInterrupt):
        Experiment(validate(lora_raw()), run).run(resume=resume)
    monkeypatch.undo()
    return ran


def resumed_run(run: Path, monkeypatch: pytest.MonkeyPatch, name: str) -> tuple[Path, list[str]]:
    """Resume the run in ``run`` to its end; its output directory and the clients the worker's ``name`` ran."""
    ran: list[str] = []
    monkeypatch.setattr(Worker, name, counting(getattr(Worker, name), ran))
    out = Experiment(validate(lora_raw()), run).run(resume=True)
    monkeypatch.undo()
    return out, ran


def test_a_personalization_stopped_midway_resumes_from_its_next_client(tmp_path, monkeypatch):
    reference = Experiment(validate(lora_raw()), tmp_path / "reference").run()
    assert not (reference / "parts" / "lora-seed0.clients.jsonl").exists()  # dropped once the unit's part is written

    run = tmp_path / "run"
    ran = stopped_run(run, monkeypatch, "personalize", 3)
    assert not (run / "parts" / "lora-seed0.jsonl").exists()
    assert kept_clients(run / "parts" / "lora-seed0.clients.jsonl") == ran

    out, resumed = resumed_run(run, monkeypatch, "personalize")
    clients = {r["client"] for r in map(json.loads, (out / "results.jsonl").read_text().splitlines()) if r["client"]}
    assert set(resumed).isdisjoint(ran) and sorted(resumed + ran) == sorted(clients)
    assert read_records(out) == read_records(reference)
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    first = [json.loads(line) for line in (reference / "results.jsonl").read_text().splitlines()]
    assert [r["client"] for r in rows] == [r["client"] for r in first]  # the same order of clients
    assert not (run / "parts" / "lora-seed0.clients.jsonl").exists()


def test_a_cut_last_line_is_a_client_to_run_again(tmp_path, monkeypatch):
    """A crash while a client's line was written leaves it cut: that client runs again on resume, and the lines
    appended after it start whole."""
    run = tmp_path / "run"
    ran = stopped_run(run, monkeypatch, "personalize", 2)
    part = run / "parts" / "lora-seed0.clients.jsonl"
    lines = part.read_text().splitlines()
    part.write_text(lines[0] + "\n" + lines[1][: len(lines[1]) // 2])

    resumed = stopped_run(run, monkeypatch, "personalize", 2, resume=True)
    assert resumed[0] == ran[1]  # the client whose line was cut runs again, first
    assert kept_clients(part) == [ran[0], *resumed]  # every line whole: the cut one was removed before appending

    out = Experiment(validate(lora_raw()), run).run(resume=True)
    assert not (out / "parts" / "lora-seed0.clients.jsonl").exists()


def test_the_base_models_evaluation_stopped_midway_resumes_from_its_next_client(tmp_path, monkeypatch):
    reference = Experiment(validate(lora_raw()), tmp_path / "reference").run()
    run = tmp_path / "run"
    ran = stopped_run(run, monkeypatch, "evaluate_base", 2)
    part = run / "parts" / "base-seed0.clients.jsonl"
    assert kept_clients(part) == ran

    out, resumed = resumed_run(run, monkeypatch, "evaluate_base")
    assert resumed and set(resumed).isdisjoint(ran)
    assert read_records(out) == read_records(reference)
    assert not part.exists()
