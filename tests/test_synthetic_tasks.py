"""The task-heterogeneous synthetic benchmark, and Potara end to end on it (outputs, communication, plot)."""

from __future__ import annotations

import json
import re
from collections import defaultdict

import pytest

from fedpeft.core.config import DataConfig, load_config
from fedpeft.core.errors import UserError
from fedpeft.data.synthetic.tasks import BASE_LEVEL, TASKS, _generate
from fedpeft.runner import Experiment


def build(**fields):
    settings = {"train_per_group": 40, "test_per_group": 10, **fields}
    return _generate(DataConfig(name="synthetic-tasks", **settings))


def test_default_federation_has_one_family_per_client_and_is_deterministic():
    data = build()
    assert [c.group for c in data.clients] == list(TASKS[:8]) == data.groups
    assert data.task == "generation" and {c.pool for c in data.clients} == {"seen"}
    assert all(len(c.train) == 40 and len(c.test) == 10 for c in data.clients)
    again = build()
    assert [(c.client_id, c.train, c.test) for c in data.clients] == [
        (c.client_id, c.train, c.test) for c in again.clients
    ]
    other = build(seed=1)
    assert data.clients[0].train != other.clients[0].train
    assert data.info["samples_per_client"]["copy"] == 40 and data.info["resource_level"]["fact"] == "none"


def test_client_count_options():
    assert [c.group for c in build(options={"num_clients": 10}).clients] == list(TASKS)
    paired = build(options={"clients_per_task": 2})
    assert [c.client_id for c in paired.clients][:2] == ["copy-seen-00", "copy-seen-01"]
    assert len(paired.clients) == 8 and paired.groups == list(TASKS[:4])
    assert paired.clients[0].train != paired.clients[1].train
    assert [c.group for c in build(groups=["fact", "add"]).clients] == ["fact", "add"]
    assert {c.pool for c in build(groups=["add"], unseen_pool=True).clients} == {"seen", "unseen"}
    for bad in ({"num_clients": 11}, {"num_clients": 7, "clients_per_task": 2}, {"colour": 1}):
        with pytest.raises(UserError):
            build(options=bad)
    with pytest.raises(UserError):
        build(groups=["juggle"])


def test_validation_split_replaces_the_test_examples_and_keeps_the_training_data():
    data = build()
    held_out = build(options={"evaluate_on": "validation"})
    assert held_out.info["evaluate_on"] == "validation"
    for plain, tuned in zip(data.clients, held_out.clients, strict=True):
        assert tuned.train == plain.train and len(tuned.test) == len(plain.test)
        assert tuned.test != plain.test
    with pytest.raises(UserError, match="evaluate_on"):
        build(options={"evaluate_on": "train"})


def _numbers(words: list[str]) -> list[int]:
    return [int("".join(part.split())) for part in " ".join(words).split(" , " if "," in words else " + ")]


def test_every_answer_follows_from_the_prompt():
    data = build(options={"num_clients": 10}, train_per_group=60)
    answers: dict[tuple[str, str], set[str]] = defaultdict(set)
    for client in data.clients:
        for ex in client.train + client.test:
            task, colon, *body, equals = ex["prompt"].split(" ")
            assert (task, colon, equals) == (client.group, ":", "=")
            response = ex["response"].split(" ")
            if task == "copy":
                assert response == body
            elif task == "reverse":
                assert response == body[::-1]
            elif task == "sort":
                assert response == sorted(body)
            elif task == "count":
                target, _, *items = body
                assert response == list(str(items.count(target)))
            elif task == "add":
                a, b = _numbers(body)
                assert response == list(str(a + b))
            elif task == "compare":
                a, b = _numbers(body)
                assert response == ["greater" if a > b else "smaller" if a < b else "equal"]
            elif task == "polarity":
                assert response[0] in ("positive", "negative")
            else:  # fact, translate, backtranslate: the same question always gets the same answer
                answers[task, " ".join(body)].add(ex["response"])
    assert all(len(v) == 1 for v in answers.values())
    assert 40 < len({q for t, q in answers if t == "fact"}) <= 72  # a table of 24 entities x 3 relations
    scripts = {t: {bool(re.search("[а-я]", a)) for (task, _), v in answers.items() if task == t for a in v} for t in
               ("translate", "backtranslate")}  # fmt: skip
    assert scripts == {"translate": {True}, "backtranslate": {False}}


def test_polarity_needs_the_negations():
    data = build(groups=["polarity"], train_per_group=300)
    negated = [ex for ex in data.clients[0].train if len(ex["prompt"].split()) > 7]
    flipped = {ex["response"] for ex in negated}
    assert len(negated) > 100 and flipped == {"positive", "negative"}


def test_base_corpus_follows_the_resource_levels_and_never_shows_the_instructions():
    data = build(base_samples=2000)
    groups = defaultdict(int)
    for ex in data.base_train:
        assert ex["prompt"] == "" and "=" not in ex["response"]
        assert not any(ex["response"].startswith(t + " ") for t in TASKS)
        groups[ex["group"]] += 1
    assert groups["fact"] == 0 and data.info["base_per_group"]["fact"] == 0
    assert groups["copy"] > 10 * groups["sort"] > 0
    assert groups["raw"] >= 0.24 * 2000
    assert set(BASE_LEVEL) == set(TASKS)


def test_task_hint_can_be_left_out():
    data = build(groups=["copy", "reverse"], options={"task_hint": False})
    assert not any(ex["prompt"].startswith(("copy", "reverse")) for c in data.clients for ex in c.train)


# ----------------------------------------------------------------------------------------------- end to end

TINY = [
    "seeds=[0]",
    "data.name=synthetic-tasks",
    "data.groups=[copy, add, fact]",
    "data.train_per_group=12",
    "data.test_per_group=3",
    "data.base_samples=60",
    "data.options={}",
    "model.vocab_size=300",
    "model.max_length=32",
    "eval.max_new_tokens=4",
    "base.epochs=1",
    "methods=[{name: potara, rounds: 2, local_rounds: 1, local_steps: 2, batch_size: 4, lr: 0.01, merge_samples: 4,"
    " grid_search: true, grid: [0.0, 1.0]}, {name: fedsa_lora, rounds: 1, fraction: 1.0, local_steps: 1},"
    " {name: ffa_lora, rounds: 1, fraction: 1.0, local_steps: 1}]",
]


def test_potara_run_reports_parts_weights_costs_and_the_mixing_weight_plot(tmp_path):
    out = Experiment(load_config("potara-tasks-cpu", TINY), tmp_path / "run").run()
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    tested = {r["method"] for r in records if r["split"] == "test"}
    assert tested == {"base", "potara", "potara-fedit", "potara-local", "potara-grid", "fedsa_lora", "ffa_lora"}
    alphas = [r["value"] for r in records if r["split"] == "personalize" and r["metric"] == "alpha"]
    assert len(alphas) == 3 and all(0 <= a <= 1 for a in alphas)
    costs = defaultdict(dict)
    for line in (out / "costs.jsonl").read_text().splitlines():
        c = json.loads(line)
        costs[c["method"], c["phase"]][c["metric"]] = c["value"]
    potara = costs["potara", "federated"]
    # Only the T_F = 2 FedIT rounds of the 3 clients communicate; personalization (local phase, merge) never.
    assert potara["bytes_up_total"] == 2 * 3 * potara["bytes_up_per_client_round"]
    assert potara["bytes_up_per_client"] == 2 * potara["bytes_up_per_client_round"]
    assert not any(k.startswith(("bytes", "floats")) for k in costs["potara", "personalization"])
    assert costs["potara", "personalization"]["merge_share"] > 0  # (tiny training here: no bound on the share)
    # |A| + |B| per client-round for Potara; FedSA uploads |A| only, FFA-LoRA |B| only.
    fedsa = costs["fedsa_lora", "federated"]["bytes_up_per_client_round"]
    ffa = costs["ffa_lora", "federated"]["bytes_up_per_client_round"]
    assert fedsa + ffa == potara["bytes_up_per_client_round"] and fedsa > 0 and ffa > 0
    assert costs["potara", "federated"]["floats_up_per_client_round"] * 4 == potara["bytes_up_per_client_round"]
    assert (out / "plots" / "mixing_weight_potara.png").is_file()
    summary = (out / "summary.md").read_text()
    assert "## Mixing weights" in summary and "Merge / training time" in summary and "Up / client" in summary
