"""Paired differences between two rows of results and their 95 % confidence interval, clients as the unit.

For a method M against a reference R (the base model, or another method) at one pool, metric and budget, each
client that both were measured on gives one number: the mean over the seeds both have of M - R. The interval is
Student's t interval over those per-client numbers (the interval of :func:`scipy.stats.ttest_1samp`, its t
quantile from ``scipy.special.stdtrit``), with n - 1 degrees of freedom for n clients:

    mean(d) +- t(0.975, n - 1) * sd(d) / sqrt(n)

Why clients and not (client, seed) pairs: a client's seeds share its data, so its differences on several seeds are
not independent draws; averaging them first gives one independent number per client, and the interval speaks about
clients like these. Why a t interval and not a bootstrap: tables often rest on 2 to 10 clients per group, where the
percentile bootstrap covers the difference far less often than 95 % (with 2 clients it has three distinct resampled
means), while the t interval is exact for normal differences, wider (honest) for few clients, and deterministic.
What it leaves out: a shift that a seed gives every client together (one training run's luck) is averaged, not
measured; the ± SD over seeds of the tables shows that spread.
"""

from __future__ import annotations

import functools
import math
import statistics
from collections.abc import Collection, Hashable, Iterable, Mapping
from dataclasses import dataclass

CONFIDENCE = 0.95
# Spreads below this (values are in [0, 1]) are rounding noise: the interval is the single value of the differences.
ZERO_SPREAD = 1e-12

PairKey = tuple[str, Hashable]
"""``(client, seed)``: what two rows of results are paired on."""


@dataclass(frozen=True)
class Interval:
    """The mean paired difference M - R over clients and its :data:`CONFIDENCE` interval, in metric units.

    Attributes:
        mean: the mean over clients of each client's mean difference over seeds.
        low, high: the interval's bounds; ``None`` with a single client (no spread to measure).
        clients: n, the clients with at least one seed measured for both rows (the interval's unit).
        pairs: the (client, seed) pairs behind it.
    """

    mean: float
    low: float | None
    high: float | None
    clients: int
    pairs: int

    @property
    def above_zero(self) -> bool:
        """Whether the whole interval lies above 0: M is higher than R beyond the clients' spread."""
        return self.low is not None and self.low > 0

    @property
    def excludes_zero(self) -> bool:
        """Whether the interval lies on one side of 0 (the difference is significant at the 5 % level)."""
        return self.low is not None and self.high is not None and (self.low > 0 or self.high < 0)


@dataclass(frozen=True)
class ClientDifference:
    """One client's number in a paired difference: its mean over seeds of M - R, and how many seeds paired."""

    mean: float
    pairs: int


def paired_clients(values: Mapping[PairKey, float], reference: Mapping[PairKey, float]) -> dict[str, ClientDifference]:
    """``client -> ClientDifference`` over the (client, seed) keys both rows have, in one pass over ``values``:
    what every column's interval of the same two rows is taken from (:func:`interval_over`)."""
    per_client: dict[str, list[float]] = {}
    for (client, seed), value in values.items():
        paired = reference.get((client, seed))
        if paired is not None:
            per_client.setdefault(client, []).append(value - paired)
    return {client: ClientDifference(statistics.fmean(found), len(found)) for client, found in per_client.items()}


def client_differences(
    values: Mapping[PairKey, float], reference: Mapping[PairKey, float], clients: Collection[str] | None = None
) -> dict[str, float]:
    """``client -> mean over seeds of (value - reference)`` over the (client, seed) keys both have.

    Args:
        values, reference: ``(client, seed) -> value`` of the two rows.
        clients: only these clients (a group's); ``None`` for all.
    """
    wanted = None if clients is None else set(clients)
    return {
        client: found.mean
        for client, found in paired_clients(values, reference).items()
        if wanted is None or client in wanted
    }


def t_interval(differences: Collection[float], confidence: float = CONFIDENCE) -> tuple[float | None, float | None]:
    """Student's t interval of the mean of ``differences`` (``scipy.stats.ttest_1samp``'s, tested against it);
    ``(None, None)`` with fewer than two values, the single value twice when they do not spread."""
    values = list(differences)
    if len(values) < 2:
        return None, None
    mean = statistics.fmean(values)
    if max(values) - min(values) <= ZERO_SPREAD:  # no spread: the interval is the value
        return mean, mean
    half = _t_quantile(len(values) - 1, confidence) * statistics.stdev(values) / math.sqrt(len(values))
    return mean - half, mean + half


@functools.cache
def _t_quantile(degrees: int, confidence: float) -> float:
    """Student's t quantile of a two-sided ``confidence`` interval (``scipy.special.stdtrit``, the inverse of the
    t distribution's CDF that ``scipy.stats.t.ppf`` also evaluates), once per degrees of freedom."""
    from scipy.special import stdtrit  # here, and not scipy.stats: the report imports in a fraction of the time

    return float(stdtrit(degrees, 0.5 + confidence / 2))


def interval_over(per_client: Mapping[str, ClientDifference], clients: Iterable[str] | None = None) -> Interval | None:
    """The :class:`Interval` of :func:`paired_clients`' numbers, over ``clients`` (a group's; ``None`` for all);
    ``None`` when none of them is paired. Its cost grows with ``clients``, not with the row's clients."""
    found = list(per_client.values()) if clients is None else [per_client[c] for c in clients if c in per_client]
    if not found:
        return None
    differences = [client.mean for client in found]
    low, high = t_interval(differences)
    # fmean sums exactly (math.fsum), so the order of the clients never changes the mean.
    return Interval(statistics.fmean(differences), low, high, len(found), sum(client.pairs for client in found))


def paired_interval(
    values: Mapping[PairKey, float], reference: Mapping[PairKey, float], clients: Collection[str] | None = None
) -> Interval | None:
    """The :class:`Interval` of ``values - reference`` paired on (client, seed), clients as the unit; ``None`` when
    no (client, seed) has both.

    Args:
        values, reference: ``(client, seed) -> value`` of the method and of its reference.
        clients: only these clients (a group's); ``None`` for all. For several groups of the same two rows, pair
            them once (:func:`paired_clients`) and take each group's :func:`interval_over`.
    """
    return interval_over(paired_clients(values, reference), None if clients is None else set(clients))


def format_interval(interval: Interval | None) -> str:
    """x100 with a sign and two decimals: ``+12.30 [+10.10, +14.60]``; the mean alone with one client; ``—``
    without data."""
    if interval is None:
        return "—"
    text = f"{interval.mean * 100:+.2f}"
    if interval.low is not None and interval.high is not None:
        text += f" [{interval.low * 100:+.2f}, {interval.high * 100:+.2f}]"
    return text
