"""Continual personalization: client data as a stream into an episodic memory, and per-round evaluation.

A dataset whose examples carry ``stage`` (``synthetic-mosaic``, the DRAKE and HFLB loaders) is a stream: with S
stages and R rounds, stage s takes rounds [s R / S, (s + 1) R / S), its training examples arrive evenly over
those rounds in list order, and every arrived example stays in the client's memory (the "memory-infinite"
setting). In each round a method trains on the memory only (:func:`memory_view`). PFL-Static is one stage.

Evaluation during federated training (``eval.every``): the client's current model on its own test examples of
the stages seen so far ("Self", ``split: test``) and on a fixed sample of every other client's test examples
("Others", ``split: others``; of at most ``eval.others_clients`` other clients, drawn per evaluator). Accuracy
is the share of the reference answer's words generated at their position (case and spacing ignored; 1 for an
exact match) for generation, and label accuracy for classification; on its own test examples a generation model
also gets METEOR, ROUGE-1 and ROUGE-L of the same responses.
"""

from __future__ import annotations

import math
import random
import unicodedata
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from fedpeft.data.types import ClientData, Example

SELF_SPLIT = "test"
OTHERS_SPLIT = "others"


def is_stream(client: ClientData) -> bool:
    """Whether the client's training data is a stream (its examples carry ``stage``)."""
    return bool(client.train) and "stage" in client.train[0]


def stage_of_round(round_: int, rounds: int, stages: int) -> int:
    """The stage that round ``round_`` (0-indexed) of ``rounds`` belongs to."""
    return min(stages - 1, round_ * stages // max(rounds, 1))


def memory_view(client: ClientData, round_: int, rounds: int) -> ClientData:
    """The client as it trains in round ``round_``: ``train`` is its memory after that round's arrivals.

    A client without a stream is returned unchanged.
    """
    if not is_stream(client):
        return client
    stages = max(int(ex["stage"]) for ex in client.train) + 1
    current = stage_of_round(round_, rounds, stages)
    arrived = min(1.0, (round_ + 1) * stages / max(rounds, 1) - current)
    memory = [ex for ex in client.train if int(ex["stage"]) < current]
    incoming = [ex for ex in client.train if int(ex["stage"]) == current]
    memory += incoming[: max(1, math.ceil(arrived * len(incoming) - 1e-9))]
    return replace(client, train=memory)


def seen_test(client: ClientData, completed: int, rounds: int) -> list[Example]:
    """The client's test examples of the stages it has met after ``completed`` rounds."""
    if not client.test or "stage" not in client.test[0] or not is_stream(client):
        return list(client.test)
    stages = max(int(ex["stage"]) for ex in client.train) + 1
    current = stage_of_round(max(completed - 1, 0), rounds, stages)
    return [ex for ex in client.test if int(ex["stage"]) <= current]


class OthersSample:
    """The fixed sample of ``per_client`` test examples of every client, in client-id order, that the "Others"
    evaluation takes: drawn once (a pass over the clients), then each evaluator's sample is that of the other
    clients (:meth:`without`), so evaluating every client draws nothing again.

    ``max_clients``: at most this many other clients per evaluator, a fixed draw for each evaluator (from ``seed``
    and its id), so an evaluation of every client costs linear time in the clients; ``None``, or at least as many
    as there are other clients: every other client (the same sample)."""

    def __init__(
        self, clients: Sequence[ClientData], per_client: int, seed: int = 0, max_clients: int | None = None
    ) -> None:
        self._examples: list[Example] = []
        self._spans: list[tuple[int, int]] = []  # where each client's examples are in ``_examples``, by id order
        self._index: dict[str, int] = {}  # client -> its position in ``_spans``
        self._seed, self._max_clients = seed, max_clients
        for other in sorted(clients, key=lambda c: c.client_id):
            if not other.test:
                continue
            rng = random.Random(f"{seed}|others|{other.client_id}")
            start = len(self._examples)
            self._examples += rng.sample(other.test, min(per_client, len(other.test)))
            self._index[other.client_id] = len(self._spans)
            self._spans.append((start, len(self._examples)))

    def without(self, client_id: str) -> list[Example]:
        """The sample of the clients other than ``client_id``: every one of them, or a draw of ``max_clients``
        (in client-id order)."""
        own = self._index.get(client_id)
        others = len(self._spans) - (own is not None)
        if self._max_clients is None or self._max_clients >= others:
            if own is None:
                return list(self._examples)
            start, end = self._spans[own]
            return self._examples[:start] + self._examples[end:]
        rng = random.Random(f"{self._seed}|others-clients|{client_id}")
        drawn = sorted(rng.sample(range(others), self._max_clients))
        examples: list[Example] = []
        for position in drawn:  # the evaluator's own position is skipped
            start, end = self._spans[position + (own is not None and position >= own)]
            examples += self._examples[start:end]
        return examples


def others_test(
    clients: Sequence[ClientData], client_id: str, per_client: int, seed: int = 0, max_clients: int | None = None
) -> list[Example]:
    """A fixed sample of ``per_client`` test examples of every client other than ``client_id`` (or of
    ``max_clients`` of them; for many evaluators, draw it once with :class:`OthersSample`)."""
    return OthersSample(clients, per_client, seed, max_clients).without(client_id)


def normalize_answer(text: str) -> str:
    """Lower-cased, NFC-normalized, single-spaced."""
    return " ".join(unicodedata.normalize("NFC", text).lower().split())


def answer_accuracy(prediction: str, reference: str) -> float:
    """The share of the reference answer's words that the prediction has at the same position (1 for an exact
    match; "correct tokens compared to the ground-truth answer", FedMosaic's open-ended accuracy)."""
    predicted, expected = normalize_answer(prediction).split(), normalize_answer(reference).split()
    if not expected:
        return float(not predicted)
    return sum(p == e for p, e in zip(predicted, expected, strict=False)) / len(expected)


def accuracy(runtime: Any, examples: list[Example]) -> float:
    """Answer accuracy (generation, :func:`answer_accuracy`) or label accuracy (classification) of the
    installed model, on the examples an evaluation scores (``eval.max_batches`` may cut them)."""
    examples = runtime.evaluation_examples(examples)
    if not examples:
        return float("nan")
    return _accuracy(runtime.task, runtime.predict(examples), examples)


def scores(runtime: Any, examples: list[Example]) -> dict[str, float]:
    """:func:`accuracy` of the installed model, and for generation also METEOR, ROUGE-1 and ROUGE-L of the same
    responses (one generation pass), so that a curve over rounds has the metrics of the final evaluation; on the
    examples an evaluation scores (``eval.max_batches`` may cut them)."""
    examples = runtime.evaluation_examples(examples)
    if not examples:
        return {"accuracy": float("nan")}
    predictions = runtime.predict(examples)
    found = {"accuracy": _accuracy(runtime.task, predictions, examples)}
    if runtime.task != "classification":
        from fedpeft.evaluation import generation_metrics

        found.update(generation_metrics(predictions, [ex["response"] for ex in examples]))
    return found


def _accuracy(task: str, predictions: list[Any], examples: list[Example]) -> float:
    if task == "classification":
        hits = [float(int(p) == int(ex["label"])) for p, ex in zip(predictions, examples, strict=True)]
    else:
        hits = [answer_accuracy(p, ex["response"]) for p, ex in zip(predictions, examples, strict=True)]
    return sum(hits) / len(hits)
