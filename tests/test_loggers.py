"""Live metrics: TensorBoard event files and an offline Weights & Biases run written by a real experiment."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from fedpeft.core.config import validate
from fedpeft.core.errors import UserError
from fedpeft.report.loggers import check_loggers
from fedpeft.runner import Experiment
from tests.test_flower import tiny_raw


def raw(**log: str) -> dict:
    experiment = tiny_raw(base={"kind": "pretrained"}, methods=[tiny_raw()["methods"][0]])
    experiment["log"] = log
    return experiment


def test_tensorboard_gets_every_rounds_training_metrics_and_the_final_means(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = Experiment(validate(raw(tensorboard="tb")), tmp_path / "run").run()
    events = EventAccumulator(str(out / "tb"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"fedit/seed0/train_loss", "fedit/seed0/clients", "fedit/seed0/examples", "fedit/seed0/seconds"} <= tags
    assert [e.step for e in events.Scalars("fedit/seed0/train_loss")] == [1, 2]
    assert [e.value for e in events.Scalars("fedit/seed0/clients")] == [4.0, 4.0]
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    losses = [r["value"] for r in records if r["split"] == "train" and r["metric"] == "loss"]
    assert [e.value for e in events.Scalars("fedit/seed0/train_loss")] == pytest.approx(losses)
    seen = [r["value"] for r in records if r["method"] == "fedit" and r["split"] == "test" and r["pool"] == "seen"]
    assert events.Scalars("fedit/seed0/seen/accuracy")[0].value == pytest.approx(sum(seen) / len(seen))
    assert "base/seed0/unseen/accuracy" in tags


def test_wandb_offline_run_holds_the_runs_metrics(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    out = Experiment(validate(raw(wandb="fedpeft-tests")), tmp_path / "run").run()
    runs = list((out / "wandb").glob("offline-run-*"))
    assert len(runs) == 1
    # The run's records (protobuf, read back by `wandb sync`) name every metric logged and the experiment.
    data = next(runs[0].glob("run-*.wandb")).read_bytes()
    for key in ("fedit/seed0/train_loss", "fedit/seed0/round", "fedit/seed0/seen/accuracy", "base/seed0/seen/accuracy"):
        assert key.encode() in data, key
    assert b"flower-tiny" in data


@pytest.mark.parametrize("key", ["tensorboard", "wandb"])
def test_a_logger_that_is_not_installed_is_one_sentence(key, monkeypatch, tmp_path):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == key else find_spec(name, *a))
    with pytest.raises(UserError, match=rf"`log.{key}` needs the {key} package"):
        check_loggers(**{"tensorboard": None, "wandb": None, key: "x"})
    with pytest.raises(UserError, match=rf"`log.{key}` needs the {key} package"):
        Experiment(validate(raw(**{key: "x"})), tmp_path / "run").run()
    assert not (tmp_path / "run").exists()


def test_no_logger_configured_writes_nothing_extra(tmp_path):
    out = Experiment(validate(raw()), tmp_path / "run").run()
    assert not (out / "wandb").exists() and not any(Path(out).glob("events.out.tfevents*"))
