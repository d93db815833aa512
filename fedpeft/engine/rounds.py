"""The round loop both engines share: sampling, dispatch, failures, aggregation."""

from __future__ import annotations

from typing import Any

from fedpeft.core.sampling import sample_clients


def sample_round(method: Any, client_ids: list[str], seed: int, round_: int) -> list[str]:
    """The clients of one round of ``method``: its own ``sample(client_ids, round_, seed)`` when it defines one
    (e.g. per-tier participation rates), else :func:`sample_clients` with its ``fraction`` and ``min_clients``."""
    custom = getattr(method, "sample", None)
    if custom is not None:
        return sorted(custom(client_ids, round_, seed))
    cfg = method.cfg
    return sample_clients(client_ids, cfg.fraction, cfg.min_clients, seed, round_)


def check_round(round_: int, sampled: int, failures: list[str]) -> None:
    """Stop the run when every client sampled in round ``round_`` failed (``failures``: that round's messages):
    a round without a single update means the method cannot train (a configuration or code error), and going
    on would report the untrained model as the method's result."""
    if sampled and len(failures) >= sampled:
        raise RuntimeError(f"round {round_}: all {sampled} sampled clients failed; the first: {failures[0]}")
