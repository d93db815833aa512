"""The continual setting: streams into episodic memory, the synthetic-mosaic dataset, per-round evaluation and
the Self / Others x A_last / A_AUC report."""

from __future__ import annotations

import json

import pytest

from fedpeft.continual import answer_accuracy, memory_view, normalize_answer, others_test, seen_test, stage_of_round
from fedpeft.core.config import DataConfig
from fedpeft.data.synthetic.mosaic import _generate
from fedpeft.data.types import ClientData
from fedpeft.report import continual_cells, continual_client_values, continual_sections


def stream_client(stages: int = 4, per_stage: int = 10) -> ClientData:
    train = [{"prompt": f"p{s}-{i}", "response": "r", "stage": s} for s in range(stages) for i in range(per_stage)]
    test = [{"prompt": f"t{s}", "response": "r", "stage": s} for s in range(stages)]
    return ClientData("c", "g", "seen", train, test)


def test_tasks_arrive_one_after_another_into_memory():
    client = stream_client()
    assert [stage_of_round(r, 20, 4) for r in (0, 4, 5, 19)] == [0, 0, 1, 3]
    sizes = [len(memory_view(client, r, 20).train) for r in range(20)]
    assert sizes[:6] == [2, 4, 6, 8, 10, 12] and sizes[-1] == 40
    assert {ex["stage"] for ex in memory_view(client, 4, 20).train} == {0}
    # Memory keeps everything seen: round 9 holds all of stage 0 and 1.
    assert [ex["prompt"] for ex in memory_view(client, 9, 20).train] == [ex["prompt"] for ex in client.train[:20]]
    assert [ex["stage"] for ex in seen_test(client, 5, 20)] == [0]
    assert [ex["stage"] for ex in seen_test(client, 6, 20)] == [0, 1]
    assert len(seen_test(client, 20, 20)) == 4


def test_static_stream_and_plain_clients():
    static = stream_client(stages=1, per_stage=20)
    assert [len(memory_view(static, r, 10).train) for r in (0, 4, 9)] == [2, 10, 20]
    plain = ClientData("p", "g", "seen", [{"text": "x", "label": 0}], [])
    assert memory_view(plain, 0, 5) is plain


def test_others_are_a_fixed_sample_of_the_other_clients():
    clients = [ClientData(f"c{i}", "g", "seen", [], [{"prompt": f"c{i}-{k}"} for k in range(10)]) for i in range(3)]
    first = others_test(clients, "c0", 4)
    assert len(first) == 8 and not any(ex["prompt"].startswith("c0-") for ex in first)
    assert first == others_test(clients, "c0", 4)
    assert others_test(clients, "c1", 4)[4:] == first[4:]  # c2's sample is the same for every evaluator
    assert normalize_answer("  Zona  Resho ") == "zona resho"
    assert answer_accuracy("Zona resho", "zona resho") == 1.0
    assert answer_accuracy("zona kiri shatet", "zona resho shatet") == pytest.approx(2 / 3)
    assert answer_accuracy("zona", "zona resho") == 0.5 and answer_accuracy("resho zona", "zona") == 0.0


def test_synthetic_mosaic_has_four_tasks_per_client_in_arrival_order():
    data = _generate(DataConfig(name="synthetic-mosaic"))
    assert len(data.clients) == 10 and data.task == "generation"
    tasks = [ex["task"] for c in data.clients for ex in c.train]
    assert len(set(tasks)) == 40
    first = data.clients[0]
    stages = [ex["stage"] for ex in first.train]
    assert stages == sorted(stages) and set(stages) == {0, 1, 2, 3}
    assert len({ex["task"] for ex in first.train if ex["stage"] == 2}) == 1
    assert {ex["stage"] for ex in first.test} == {0, 1, 2, 3}
    # Neighbouring clients share three task types (in another language).
    types = [{t.split("-")[0] for t in data.info["client_tasks"][c.client_id].split(", ")} for c in data.clients]
    assert len(types[0] & types[1]) == 3
    again = _generate(DataConfig(name="synthetic-mosaic"))
    assert again.clients[3].train == data.clients[3].train
    static = _generate(DataConfig(name="synthetic-mosaic", options={"setting": "static"}))
    assert {ex["stage"] for ex in static.clients[0].train} == {0}
    assert [ex["task"] for ex in static.clients[0].train] != tasks[: len(static.clients[0].train)]
    assert data.base_train and all(ex["task"] == "public" for ex in data.base_train)


def _record(method, split, round_, value, client="c0", seed=0):
    return {"method": method, "budget": None, "pool": "seen", "client": client, "group": "g", "seed": seed,
            "round": round_, "split": split, "metric": "accuracy", "value": value}  # fmt: skip


def test_a_last_and_a_auc_by_hand():
    records = [
        _record("m", "test", 5, 0.2), _record("m", "test", 5, 0.4, client="c1"),
        _record("m", "test", 10, 0.6), _record("m", "test", 10, 0.8, client="c1"),
        _record("m", "others", 5, 0.1), _record("m", "others", 10, 0.3),
        _record("m", "test", 5, 0.5, seed=1), _record("m", "test", 10, 0.7, seed=1),
        _record("m", "others", 5, 0.2, seed=1), _record("m", "others", 10, 0.2, seed=1),
        _record("plain", "test", 10, 0.9),  # no per-round "others": not a continual row
    ]  # fmt: skip
    cells = continual_cells(records)
    # seed 0: Self curve 0.3 -> 0.7 (A_last 0.7, A_AUC 0.5); seed 1: 0.5 -> 0.7 (0.7, 0.6).
    assert cells["m", "test", "last"].mean == pytest.approx(0.7)
    assert cells["m", "test", "auc"].mean == pytest.approx(0.55)
    assert cells["m", "others", "last"].mean == pytest.approx(0.25)
    assert cells["m", "others", "auc"].mean == pytest.approx(0.2)
    assert not any(key[0] == "plain" for key in cells)
    text = "\n".join(continual_sections(records))
    # One method: nothing to compare it with, so no value is bold and no differences are listed.
    assert "| m | 70.00 ± 0.00 | 55.00 ± 7.07 | 25.00 ± 7.07 | 20.00 ± 0.00 |" in text and " vs " not in text


def test_continual_differences_are_paired_over_clients_and_bold_only_where_supported():
    """Two methods, four clients, two seeds: "a" is ahead of "b" on Self by 0.2 for every client (supported:
    bold, and an interval of zero width), and on Others by +0.1 for two clients and -0.1 for two (not supported)."""
    records = []
    for seed in (0, 1):
        for i in range(4):
            client = f"c{i}"
            for round_ in (5, 10):
                self_b = 0.1 * i + 0.01 * round_
                records.append(_record("a", "test", round_, self_b + 0.2, client=client, seed=seed))
                records.append(_record("b", "test", round_, self_b, client=client, seed=seed))
                records.append(_record("a", "others", round_, 0.5 + (0.1 if i < 2 else -0.1), client=client, seed=seed))
                records.append(_record("b", "others", round_, 0.5, client=client, seed=seed))
    text = "\n".join(continual_sections(records))
    values = continual_client_values(records)
    assert values["a", "test", "last"]["c1", 0] == pytest.approx(0.1 + 0.1 + 0.2)
    assert values["a", "test", "auc"]["c1", 0] == pytest.approx(0.1 + 0.075 + 0.2)
    assert "| a | **" in text and "| b | **" not in text
    row_a = next(line for line in text.splitlines() if line.startswith("| a |") and "vs b" in line)
    assert row_a.startswith("| a | +20.00 [+20.00, +20.00] vs b | +20.00 [+20.00, +20.00] vs b | +0.00 [")
    # Others: the means tie at 50.00, so neither is bold.
    table_a = next(line for line in text.splitlines() if line.startswith("| a |") and "vs b" not in line)
    assert table_a.endswith("| 50.00 ± 0.00 | 50.00 ± 0.00 |")


def test_per_round_evaluation_end_to_end(tmp_path):
    from fedpeft.core.config import validate
    from fedpeft.runner import Experiment

    raw = {
        "name": "mosaic-tiny",
        "seeds": [0],
        "threads": 1,
        "data": {
            "name": "synthetic-mosaic",
            "base_samples": 40,
            "options": {"num_clients": 3, "train_per_task": 4, "test_per_task": 2, "tasks_per_client": 2},
        },  # fmt: skip
        "model": {"name": "tiny-llama", "max_length": 32, "vocab_size": 400, "overrides": {"num_hidden_layers": 4}},
        "eval": {"every": 2, "others_per_client": 2, "max_new_tokens": 4},
        "budgets": [2],
        "output": {"plots": False, "save_adapters": True},
        "methods": [{"name": "fedmosaic", "rounds": 3, "local_steps": 2, "rank": 2, "grad_every": 1}],
    }
    out = Experiment(validate(raw), tmp_path / "run").run()
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    evaluated = {(r["round"], r["split"]) for r in rows if r["metric"] == "accuracy"}
    assert evaluated == {(2, "test"), (2, "others"), (3, "test"), (3, "others")}
    assert len([r for r in rows if r["metric"] == "accuracy" and r["split"] == "others"]) == 6
    # A generation model's own test examples also get the final evaluation's metrics, from the same responses.
    at_round_two = {(r["split"], r["metric"]) for r in rows if r["round"] == 2 and r["split"] != "train"}
    assert at_round_two == {("others", "accuracy")} | {("test", m) for m in ("accuracy", "meteor", "rouge1", "rougeL")}
    assert "## Continual personalization" in (out / "summary.md").read_text()
    from fedpeft.adapters.hooked import HookedAdapter

    saved = HookedAdapter.load_file(out / "adapters" / "fedmosaic" / "clients" / "client-01" / "adapter.safetensors")
    assert any(k.startswith("local/pq1.") for k in saved.tensors) and any(k.startswith("gate/") for k in saved.tensors)

    # Interrupted after round 2 (its evaluation is in the checkpoint), then resumed: the same records.
    from fedpeft.methods.fedmosaic import FedMosaic

    original = FedMosaic.aggregate

    def stop_in_round_three(self, state, updates):
        if state.round == 2:
            raise KeyboardInterrupt
        return original(self, state, updates)

    FedMosaic.aggregate = stop_in_round_three  # type: ignore[method-assign]
    try:
        with pytest.raises(KeyboardInterrupt):
            Experiment(validate(raw), tmp_path / "resumed").run()
    finally:
        FedMosaic.aggregate = original  # type: ignore[method-assign]
    Experiment(validate(raw), tmp_path / "resumed").run(resume=True)
    again = [json.loads(line) for line in (tmp_path / "resumed" / "results.jsonl").read_text().splitlines()]
    timing = lambda r: r["split"] == "train" and r["metric"] == "seconds"  # noqa: E731  (not reproducible)
    assert sorted((r for r in again if not timing(r)), key=json.dumps) == sorted(
        (r for r in rows if not timing(r)), key=json.dumps
    )


PRESETS = ["fedmosaic-text", "fedmosaic-text-static", "fedmosaic-vqa", "fedmosaic-drake", "fedmosaic-hflb"]


@pytest.mark.parametrize("preset", [*PRESETS, "fedmosaic-fedscope"])
def test_fedmosaic_presets_validate(preset):
    from fedpeft.core.config import load_config
    from fedpeft.worker import build_method

    cfg = load_config(preset)
    assert len(cfg.models) >= 2 and cfg.eval.every == 5
    methods = [build_method(entry, cfg) for entry in cfg.methods]
    assert {m.name for m in methods} == {
        "sft_rounds",
        "fedit",
        "ditto",
        "fedsim",
        "feddat",
        "perada",
        "takfl",
        "fedmkt",
        "fedmosaic",
    }
    assert all(getattr(m.cfg, "rounds", 20) == 20 for m in methods)
