"""The evaluation between a federated phase's rounds (``eval.every``): each client's "Others" sample is the one
drawn per evaluator before it was drawn once per worker, its clients are counted in the progress lines, its
seconds are on the round line and in ``costs.jsonl``, and the cost table shows them."""

from __future__ import annotations

import json
import random

from flower_helpers import tiny_raw

from fedpeft import continual
from fedpeft.continual import OthersSample
from fedpeft.core.costs import ROUND_EVALUATION
from fedpeft.data.types import ClientData


def drawn_per_evaluator(clients: list[ClientData], client_id: str, per_client: int, seed: int) -> list[dict]:
    """The "Others" sample as every evaluator drew it for itself: the sorted other clients, a seeded draw each."""
    chosen: list[dict] = []
    for other in sorted(clients, key=lambda c: c.client_id):
        if other.client_id == client_id or not other.test:
            continue
        rng = random.Random(f"{seed}|others|{other.client_id}")
        chosen += rng.sample(other.test, min(per_client, len(other.test)))
    return chosen


def test_the_others_sample_drawn_once_is_each_evaluators_own_draw():
    rng = random.Random(3)
    clients = [
        ClientData(f"c{i:03d}", "g", "seen", [], [{"text": f"c{i}-{k}"} for k in range(rng.randint(0, 7))])
        for i in rng.sample(range(300), 60)  # not in id order, some without test examples
    ]
    sample = OthersSample(clients, 3, seed=5)
    for client in [*clients, ClientData("elsewhere", "g", "seen", [], [])]:
        assert sample.without(client.client_id) == drawn_per_evaluator(clients, client.client_id, 3, 5)


def test_others_clients_caps_each_evaluators_sample_at_a_fixed_draw_of_other_clients():
    clients = [
        ClientData(f"c{i:04d}", "g", "seen", [], [{"text": f"c{i:04d}-{k}"} for k in range(4)]) for i in range(400)
    ]
    everyone = OthersSample(clients, 2, seed=5)
    assert OthersSample(clients, 2, seed=5, max_clients=399).without("c0007") == everyone.without("c0007")
    capped = OthersSample(clients, 2, seed=5, max_clients=10)
    owners = {}
    for evaluator in ("c0000", "c0007", "c0399", "elsewhere"):
        examples = capped.without(evaluator)
        drawn = [ex["text"][:5] for ex in examples[::2]]
        # 10 other clients, never the evaluator, each with its examples of the full sample, in client-id order
        assert len(examples) == 20 and evaluator not in drawn and drawn == sorted(set(drawn))
        assert all(ex in everyone.without(evaluator) for ex in examples)
        assert capped.without(evaluator) == examples  # a fixed draw: the same at every round
        owners[evaluator] = drawn
    assert len({tuple(d) for d in owners.values()}) == 4  # each evaluator its own draw
    # the sample of an evaluator does not grow with the federation: linear time over every evaluator
    many = [ClientData(f"c{i:05d}", "g", "seen", [], [{"text": str(i)}] * 4) for i in range(5000)]
    assert len(OthersSample(many, 2, seed=5, max_clients=10).without("c00042")) == 20


def test_a_round_evaluation_scores_each_client_on_the_same_examples(tmp_path, monkeypatch):
    """Every client's own test examples and the rest of the one "Others" sample, the same examples and order as
    its own draw, so its records are those of that draw (the model is the client's, whatever the sample)."""
    from fedpeft.core.config import validate
    from fedpeft.runner import Experiment
    from fedpeft.worker import build_data

    scored: list[list[dict]] = []
    accuracy = continual.accuracy

    def recording(runtime, examples):  # noqa: ANN001, ANN202
        scored.append(examples)
        return accuracy(runtime, examples)

    monkeypatch.setattr(continual, "accuracy", recording)
    raw = tiny_raw(base={"kind": "pretrained"}, methods=[tiny_raw()["methods"][0]], eval={"every": 1})
    raw["eval"]["others_per_client"] = 3
    cfg = validate(raw)
    data = build_data(cfg)
    out = Experiment(cfg, tmp_path / "run", data=data).run()
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    others = [r for r in rows if r["split"] == continual.OTHERS_SPLIT]
    assert len(others) == len(scored) == 2 * len(data.clients)  # every client, after each round
    assert scored == [drawn_per_evaluator(data.clients, r["client"], 3, cfg.data.seed) for r in others]


def test_a_round_evaluation_is_counted_in_progress_lines_and_costs(tmp_path, capsys):
    from fedpeft.core.config import validate
    from fedpeft.core.progress import Progress
    from fedpeft.runner import Experiment

    raw = tiny_raw(base={"kind": "pretrained"}, methods=[tiny_raw()["methods"][0]], eval={"every": 1})
    out = Experiment(validate(raw), tmp_path / "run", progress=Progress(plain=True)).run()
    lines = capsys.readouterr().err.splitlines()
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    clients = len({r["client"] for r in rows if r["split"] == continual.OTHERS_SPLIT})
    stage = "fedit: federated training, seed 0"
    for round_ in (1, 2):
        evaluation = f"{stage}: evaluation after round {round_}: clients {clients}/{clients}, "
        done = next(i for i, line in enumerate(lines) if line.startswith(evaluation))
        round_line = lines[done + 1]  # the round's line follows its evaluation, with the evaluation's seconds
        assert round_line.startswith(f"{stage}: round {round_}/2, ") and ", evaluation " in round_line
        assert round_line.endswith(" s" if round_ == 2 else " s left")  # the first with the time the second takes

    costs = [json.loads(line) for line in (out / "costs.jsonl").read_text().splitlines()]
    evaluation = {c["metric"]: c["value"] for c in costs if c["phase"] == ROUND_EVALUATION}
    assert set(evaluation) == {"wall_s", "wall_s_per_client"}
    assert evaluation["wall_s"] > 0
    assert abs(evaluation["wall_s_per_client"] * 2 * clients - evaluation["wall_s"]) < 1e-9
    federated = {c["metric"]: c["value"] for c in costs if c["phase"] == "federated" and c["method"] == "fedit"}
    assert "wall_s" in federated  # the rounds' own seconds, the evaluations not among them
    summary = (out / "summary.md").read_text()
    assert "Round eval. s / client" in summary and f"| fedit | {ROUND_EVALUATION} |" in summary


def test_a_round_evaluation_scores_the_first_batches_only_when_eval_max_batches_cuts_them(tmp_path, monkeypatch):
    """``eval.max_batches`` (a rehearsal's cut) holds between rounds as at the end: each client's own test examples
    and its "Others" sample, each on its first batch of ``eval.batch_size``."""
    from fedpeft.core.config import validate
    from fedpeft.models.runtime import ModelRuntime
    from fedpeft.runner import Experiment

    predicted: list[int] = []
    predict = ModelRuntime.predict

    def recording(self, examples):  # noqa: ANN001, ANN202
        predicted.append(len(examples))
        return predict(self, examples)

    monkeypatch.setattr(ModelRuntime, "predict", recording)
    raw = tiny_raw(base={"kind": "pretrained"}, methods=[tiny_raw()["methods"][0]], eval={"every": 1})
    raw["eval"] |= {"others_per_client": 3, "max_batches": 1, "batch_size": 2}
    Experiment(validate(raw), tmp_path / "run").run()
    rows = [json.loads(line) for line in (tmp_path / "run" / "results.jsonl").read_text().splitlines()]
    assert any(r["split"] == continual.OTHERS_SPLIT for r in rows)
    assert predicted and max(predicted) == 2  # without the cut: every test example, and 3 per other client
