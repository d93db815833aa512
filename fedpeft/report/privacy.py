"""Privacy accounting in the outputs: the ``privacy`` records of a DP federated phase and summary.md's section.

After every round of a method with ``dp`` (:mod:`fedpeft.merging.dp`), :class:`EpsilonRecorder` appends to
``results.jsonl`` records of split ``privacy`` (pool ``seen``, no client or group): ``dp_epsilon``, the epsilon
at ``delta`` of the rounds so far (``null`` when unbounded, z = 0), and the accountant's inputs
``dp_noise_multiplier``, ``dp_clip_norm``, ``dp_sample_rate`` and ``dp_delta``. Result tables read only the
``test`` split, so these records never enter them. See docs/privacy.md.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from fedpeft.core.records import Budget, ResultRecord, result_record
from fedpeft.report.records import Record, budget_label, first_seen
from fedpeft.report.tables import markdown_table

if TYPE_CHECKING:
    from fedpeft.core.types import Metrics, ServerState
    from fedpeft.merging.dp import DPConfig

PRIVACY_SPLIT = "privacy"
EPSILON = "dp_epsilon"
_INPUTS = ("dp_noise_multiplier", "dp_clip_norm", "dp_sample_rate", "dp_delta")


def privacy_records(
    method: str, budget: Budget, seed: int, rounds: int, dp: DPConfig, sample_rate: float
) -> list[ResultRecord]:
    """The ``privacy`` records of ``method`` after ``rounds`` rounds: epsilon at ``dp.delta`` and its inputs."""
    from fedpeft.merging.dp import epsilon  # a run's accounting: the report itself needs no torch

    eps = epsilon(dp.noise_multiplier, sample_rate, rounds, dp.delta)
    values = {
        EPSILON: eps if math.isfinite(eps) else None,
        "dp_noise_multiplier": dp.noise_multiplier,
        "dp_clip_norm": dp.clip_norm,
        "dp_sample_rate": sample_rate,
        "dp_delta": dp.delta,
    }
    return [
        result_record(
            method,
            budget,
            pool="seen",
            client=None,
            group=None,
            seed=seed,
            round_=rounds,
            split=PRIVACY_SPLIT,
            metric=metric,
            value=value,
        )
        for metric, value in values.items()
    ]


class EpsilonRecorder:
    """A round callback (``fedpeft.engine.phase.RoundCallback``) that gives :func:`privacy_records` after every
    round of one federated phase."""

    def __init__(self, method: str, budget: Budget, seed: int, dp: DPConfig, sample_rate: float) -> None:
        self.method, self.budget, self.seed = method, budget, seed
        self.dp, self.sample_rate = dp, sample_rate

    def after_round(self, state: ServerState, round_: int, metrics: Metrics) -> list[ResultRecord]:
        """Epsilon after round ``round_`` (0-based), i.e. of ``round_ + 1`` rounds."""
        return privacy_records(self.method, self.budget, self.seed, round_ + 1, self.dp, self.sample_rate)

    def after_phase(self, state: ServerState) -> None:
        """Nothing: every round was recorded."""


def _number(value: float | None) -> str:
    return "∞" if value is None else f"{float(value):.4g}"


def privacy_sections(results: Sequence[Record]) -> list[str]:
    """summary.md's "Privacy" section: per method, budget and seed, the final epsilon and its inputs.

    Args:
        results: merged result records (:func:`~fedpeft.report.records.read_records`: the latest round of each).

    Returns:
        ``[]`` without ``privacy`` records, else the heading, a note and the table.
    """
    chosen = [r for r in results if r.get("split") == PRIVACY_SPLIT]
    finals = [r for r in chosen if r["metric"] == EPSILON]
    if not finals:
        return []
    inputs = {(r["method"], r.get("budget"), r["seed"], r["metric"]): r.get("value") for r in chosen}
    rows = []
    methods = first_seen(r["method"] for r in finals)
    for record in sorted(finals, key=lambda r: (methods.index(r["method"]), str(r.get("budget")), r["seed"])):
        key = (record["method"], record.get("budget"), record["seed"])
        label = record["method"] if key[1] is None else f"{record['method']} ({budget_label(key[1])})"
        z, c, q, delta = (inputs.get((*key, name)) for name in _INPUTS)
        cells = [_number(v) for v in (z, c, q, delta)]
        rows.append([label, str(record["seed"]), str(record["round"]), *cells, _number(record.get("value"))])
    note = (
        "Client-level DP (DP-FedAvg): epsilon at delta after the rounds run, from dp-accounting's RDP accountant "
        "for a Poisson-sampled Gaussian mechanism with noise multiplier z and sampling rate q (clients sampled per "
        "round / seen pool), composed over the rounds; C is the clipping norm. ∞: no noise (z = 0). See "
        "docs/privacy.md for the assumptions."
    )
    header = ["Method", "Seed", "Rounds", "z", "C", "q", "delta", "epsilon"]
    return ["## Privacy", note, markdown_table(header, rows)]
