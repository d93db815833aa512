"""How much a report's results rest on, and the summary's Evidence note when it is too little to call a winner.

A per-group table is *thin* when one of its cells rests on a single seed (no spread over seeds to measure a
difference between methods against) or when its pool's clients have fewer than :data:`MIN_TEST_EXAMPLES` test
examples on average (read from the runs' ``data.json``; a client's score then moves in steps of several points). A
thin table keeps its numbers but marks no cell bold and heads its Wins ``Wins (n.s.)`` (not significant); the
Evidence note above the tables says which tables are thin and why. This comes on top of the 95 % intervals
(:mod:`.intervals`), which decide bold and Wins in the tables that are not thin: they are over clients, so they
exist with one seed too, but they do not measure how another seed moves every client together.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from pathlib import Path

from fedpeft.report.differences import comparisons
from fedpeft.report.intervals import format_interval
from fedpeft.report.records import (
    BASE_METHOD,
    CONFIG_FILE,
    DATA_FILE,
    Record,
    budget_label,
    first_seen,
    pool_label,
)
from fedpeft.report.tables import MEAN_COLUMN, GroupTable, ResultTable, result_tables, wins_header

MIN_SEEDS = 2
# Test examples per client, on average over a pool's clients, below which a table is thin: with fewer, one example
# moves a client's score by more than 3 points.
MIN_TEST_EXAMPLES = 30
ONE_SEED = "one seed"
FEW_TEST_EXAMPLES = "few test examples"
DATA_POOLS = ("seen", "unseen")  # the pools of data.json's group rows (fedpeft.runner.data_overview)


def per_client_test_examples(run_dirs: Sequence[Path]) -> dict[str, float]:
    """``pool -> test examples per client`` (mean over the pool's clients) from the runs' ``data.json``.

    Each group row of ``data.json`` gives ``<pool> clients`` and ``<pool> test/client``; ``all`` counts every pool.
    Over several runs the smallest value is kept. Pools no run has the counts of (runs without ``data.json``, or
    a damaged one) are left out: the report cannot tell, and does not guess.
    """
    found: dict[str, float] = {}
    for run_dir in map(Path, run_dirs):
        try:
            overview = json.loads((run_dir / DATA_FILE).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        groups = overview.get("groups") if isinstance(overview, Mapping) else None
        if not isinstance(groups, Mapping):
            continue
        totals: dict[str, list[float]] = {}  # pool -> [clients, test examples]
        for row in (row for row in groups.values() if isinstance(row, Mapping)):
            for pool in DATA_POOLS:
                clients, per_client = row.get(f"{pool} clients"), row.get(f"{pool} test/client")
                if isinstance(clients, (int, float)) and isinstance(per_client, (int, float)) and clients > 0:
                    for name in (pool, "all"):
                        total = totals.setdefault(name, [0.0, 0.0])
                        total[0] += clients
                        total[1] += clients * per_client
        for pool, (clients, examples) in totals.items():
            found[pool] = min(found.get(pool, examples / clients), examples / clients)
    return found


def thin_reasons(table: GroupTable, test_per_client: Mapping[str, float]) -> tuple[str, ...]:
    """Why ``table`` rests on too little to call a winner (:data:`ONE_SEED`, :data:`FEW_TEST_EXAMPLES`); empty
    when it does not."""
    reasons = []
    if min((cell.seeds for cell in table.cells.values()), default=0) < MIN_SEEDS:
        reasons.append(ONE_SEED)
    examples = test_per_client.get(table.pool)
    if examples is not None and examples < MIN_TEST_EXAMPLES:
        reasons.append(FEW_TEST_EXAMPLES)
    return tuple(reasons)


def judged_tables(results: Sequence[Record], test_per_client: Mapping[str, float] | None = None) -> list[ResultTable]:
    """:func:`~fedpeft.report.tables.result_tables` with each table's ``thin`` reasons (:func:`thin_reasons`).

    Args:
        results: result records.
        test_per_client: :func:`per_client_test_examples` of the runs; ``None`` judges on the seeds alone.
    """
    counts = test_per_client or {}
    return [dataclasses.replace(found, thin=thin_reasons(found.table, counts)) for found in result_tables(results)]


def _where(tables: Sequence[ResultTable]) -> str:
    """``Seen pool, r = 4; Unseen pool, r = 4``: the pools and budgets of ``tables``."""
    places = first_seen(
        pool_label(t.table.pool) + ("" if t.table.budget is None else f", {budget_label(t.table.budget)}")
        for t in tables
    )
    return "; ".join(places)


def supported_over_clients(tables: Sequence[ResultTable]) -> list[str]:
    """The differences of the headline (per budget of the first pool and metric, the method with the highest
    ``Mean`` minus the runner-up and minus ``base``) whose 95 % interval excludes 0, in the tables of ``tables``
    that rest on one seed, one item per budget: ``r = 4: lora minus base +17.93 [+12.56, +23.30] (n = 40)``."""
    if not tables:
        return []
    first = tables[0].table
    found = []
    for table in (t.table for t in tables if ONE_SEED in t.thin):
        if (table.pool, table.metric) != (first.pool, first.metric):
            continue
        top = next((m for m in table.methods if m in table.best.get(MEAN_COLUMN, set())), None)
        comparison = next((c for c in comparisons(table) if c.method == top), None)
        if comparison is None:
            continue
        differences = [
            f"minus {other} {format_interval(interval)} (n = {interval.clients})"
            for other, interval in (
                (comparison.best_other, comparison.over_best_other),
                (BASE_METHOD, comparison.over_base),
            )
            if interval is not None and interval.excludes_zero
        ]
        if differences:
            where = "" if table.budget is None else f"{budget_label(table.budget)}: "
            found.append(f"{where}{top} {', '.join(differences)}")
    return found


def evidence_note(tables: Sequence[ResultTable], test_per_client: Mapping[str, float] | None = None) -> str:
    """The summary's Evidence note on the thin tables among ``tables`` (:func:`judged_tables`); ``""`` when none is.

    It names what is thin (one seed, in which tables unless all; the pools with fewer than
    :data:`MIN_TEST_EXAMPLES` test examples per client, with their averages) and says that those tables mark no
    winner. On one seed, the headline's differences the clients support (:func:`supported_over_clients`) are named,
    with what their intervals leave out: the seed's own draw.
    """
    thin = [t for t in tables if t.thin]
    if not thin:
        return ""
    findings = []
    one_seed = [t for t in thin if ONE_SEED in t.thin]
    supported = supported_over_clients(tables)
    if one_seed:
        where = "" if len(one_seed) == len(tables) else f" (in {_where(one_seed)})"
        if supported:
            findings.append(
                f"one seed{where}: no spread over seeds. Over that seed's clients the 95 % intervals support "
                f"{'; '.join(supported)}; the seed's own draw, which moves every client together, is not in these "
                "intervals"
            )
        else:
            findings.append(
                f"one seed{where}: no spread over seeds; the 95 % intervals are over the clients of that one seed "
                "and leave out how much another seed moves every client together"
            )
    pools = first_seen(t.table.pool for t in thin if FEW_TEST_EXAMPLES in t.thin)
    if pools:
        counts = test_per_client or {}
        averages = ", ".join(f"{pool_label(p)} {counts[p]:.3g}" for p in pools)
        step = 100 / max(min(counts[p] for p in pools), 1.0)
        findings.append(
            f"fewer than {MIN_TEST_EXAMPLES} test examples per client on average ({averages}): one test example "
            f"moves a client's score by about {step:.0f} points"
        )
    items = ";\n".join(f"- {finding}" for finding in findings) + "."
    seeds_alone = bool(supported) and not pools  # more seeds would settle it
    heading = "supported over the clients, not over seeds" if seeds_alone else "too little to call a winner"
    reading = (
        "more `seeds` tell whether these differences hold beyond this seed"
        if seeds_alone
        else "read them as measurements, not findings"
    )
    return (
        f"**Evidence: {heading}.** These results rest on\n\n{items}\n\n"
        f"Those tables keep the numbers but mark no cell bold and head the Wins column `{wins_header(False)}` "
        f"(not significant): {reading}."
    )


SHARED_BASE_NOTE = (
    "**One base model for every seed.** The seeds started from one centrally trained base model (`base.kind: "
    "centralized`), so neither the ± SD over seeds nor the intervals include that model's draw; on another machine "
    "the float kernels train another one, and every row moves with it (docs/results/machines.md). Read the levels "
    "as this machine's and the supported differences as the result; `base.per_seed: true` trains one base model "
    "per seed."
)


def shared_base_note(run_dirs: Sequence[Path], seeds: int) -> str:
    """:data:`SHARED_BASE_NOTE` when results of several seeds come from a run whose ``config.yaml`` trains one
    centralized base stage for all its seeds (``base.kind: centralized`` without ``per_seed``); ``""`` otherwise
    (one seed: the Evidence note speaks of it; runs without a readable ``config.yaml``: the report cannot tell)."""
    import yaml

    if seeds < MIN_SEEDS:
        return ""
    for run_dir in map(Path, run_dirs):
        try:
            config = yaml.safe_load((run_dir / CONFIG_FILE).read_text(encoding="utf-8"))
        except (OSError, ValueError, yaml.YAMLError):
            continue
        base = config.get("base") if isinstance(config, Mapping) else None
        if isinstance(base, Mapping) and base.get("kind") == "centralized" and not base.get("per_seed"):
            return SHARED_BASE_NOTE
    return ""
