"""The records of ``results.jsonl``: one value of one metric, and where it comes from (docs/outputs.md)."""

from __future__ import annotations

from typing import TypedDict

Budget = int | str | None
"""A rank budget, a tier name, or none."""


class ResultRecord(TypedDict):
    """One line of ``results.jsonl``; its keys in this order, as written."""

    method: str
    budget: Budget
    pool: str
    client: str | None
    group: str | None
    seed: int
    round: int | None
    split: str
    metric: str
    value: float | None


def result_record(
    method: str,
    budget: Budget,
    *,
    pool: str,
    client: str | None,
    group: str | None,
    seed: int,
    round_: int | None,
    split: str,
    metric: str,
    value: float | None,
) -> ResultRecord:
    """The record of one ``value`` (kept as a float; ``None`` for a value that does not exist, such as an
    unbounded epsilon).

    Args:
        method: the method's label (``base`` for the base model's row).
        budget: the budget it was personalized at, or ``None``.
        pool: ``seen`` or ``unseen`` (the clients of the federated phase, or the others).
        client: the client's id; ``None`` for a record of the whole federation (a round's training facts).
        group: the client's group (language, task, ...), or ``None``.
        seed: the experiment seed.
        round_: the rounds done when it was measured; ``None`` for the base model.
        split: what it measures: ``test`` (the result tables read only these), ``train``, ``personalize``,
            ``privacy``, ...
        metric: the metric's name.
        value: the value.
    """
    return {
        "method": method,
        "budget": budget,
        "pool": pool,
        "client": client,
        "group": group,
        "seed": seed,
        "round": round_,
        "split": split,
        "metric": metric,
        "value": None if value is None else float(value),
    }
