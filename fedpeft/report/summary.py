"""The report's ``summary.md``: the headline (the comparison, its 95 % intervals, the Evidence note), the gain over
base, the differences with 95 % intervals, the data, the per-group result tables, methods' own sections, continual
evaluation, failures and costs, in that order."""

from __future__ import annotations

import json
import re
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path

from fedpeft.core.errors import UserError
from fedpeft.core.io import write_text_atomic
from fedpeft.core.textfiles import read_text
from fedpeft.report.continual import continual_sections, read_round_records
from fedpeft.report.costs import render_compute_table, render_cost_tables, render_failures, render_rejections
from fedpeft.report.differences import difference_sections, headline_intervals
from fedpeft.report.evidence import (
    MIN_SEEDS,
    evidence_note,
    judged_tables,
    per_client_test_examples,
    shared_base_note,
)
from fedpeft.report.export import CLIENTS_FILE, render_client_csv
from fedpeft.report.method_hooks import method_hook_calls
from fedpeft.report.privacy import privacy_sections
from fedpeft.report.records import (
    BASE_METHOD,
    DAMAGED_FIX,
    DATA_FILE,
    REHEARSAL_NOTE,
    Record,
    budget_label,
    first_seen,
    method_order,
    metric_label,
    metric_order,
    pool_label,
    pool_order,
    read_records,
    rehearsal_of,
)
from fedpeft.report.schedules import schedule_sections
from fedpeft.report.tables import (
    GENERATION_METRICS,
    GENERATION_MIN_BEST,
    MAX_GROUP_COLUMNS,
    MEAN_COLUMN,
    ResultTable,
    display_key,
    format_cell,
    gain_over_base,
    group_unit,
    markdown_table,
    render_gain_table,
    render_group_table,
)

SUMMARY_FILE = "summary.md"


def _render_scalar(value: object) -> str:
    if isinstance(value, Mapping):  # deeper than a table shows: "key: value" pairs, never a Python dict
        return "; ".join(f"{key}: {_render_scalar(inner)}" for key, inner in value.items())
    if isinstance(value, (list, tuple)):
        return ", ".join(map(_render_scalar, value)) if value else "none"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _flatten(value: Mapping[str, object], prefix: str = "") -> dict[str, object]:
    """Nested mappings as one level, their keys joined with spaces (``{"seen": {"clients": 2}}`` ->
    ``{"seen clients": 2}``)."""
    flat: dict[str, object] = {}
    for key, inner in value.items():
        name = f"{prefix}{key}"
        if isinstance(inner, Mapping) and inner:
            flat.update(_flatten(inner, f"{name} "))
        else:
            flat[name] = inner
    return flat


# A mapping of mappings with more rows than this (one per group, with thousands of groups) prints as their spread.
MAX_INFO_ROWS = 50


def _info_spread(key: str, rows: Mapping[str, Mapping[str, object]]) -> str:
    """A table of many rows as the min, median and max over them of each numeric column, the number of distinct
    values of each other one."""
    flat = [_flatten(row) for row in rows.values()]
    columns = first_seen(column for row in flat for column in row)
    cells: dict[str, list[str]] = {}
    for column in columns:
        present = [row[column] for row in flat if column in row]
        numbers = sorted(v for v in present if isinstance(v, (int, float)) and not isinstance(v, bool))
        if len(numbers) == len(present):
            cells[column] = [_render_scalar(v) for v in (numbers[0], statistics.median(numbers), numbers[-1])]
        else:
            cells[column] = [f"{len(set(map(_render_scalar, present)))} distinct", "—", "—"]
    table = markdown_table(
        ["", *map(str, columns)],
        [[stat, *(cells[c][index] for c in columns)] for index, stat in enumerate(("min", "median", "max"))],
    )
    return f"**{key}** ({len(rows):,} rows: min, median and max over them; every row in `{DATA_FILE}`)\n\n{table}"


def render_info(info: Mapping[str, object]) -> str:
    """Markdown tables of descriptive facts: the scalars and lists in one ``fact | value`` table, then one small
    table per mapping, each under its key in bold.

    A mapping of scalars is a ``key | value`` table; a mapping of mappings (e.g. the per-group facts
    ``{"en": {"seen clients": 2, "script": "latin"}}``) one table with a row per outer key and a column per inner
    key, deeper mappings flattened into columns (``{"seen": {"clients": 2}}`` gives the column ``seen clients``);
    one of more than :data:`MAX_INFO_ROWS` rows (a row per group, with thousands of groups) as the min, median and
    max over its rows of each numeric column. No value is ever printed as a Python dict.
    """
    facts = []
    tables = []
    for key, value in info.items():
        if not isinstance(value, Mapping):
            facts.append([str(key), _render_scalar(value)])
        elif not value:
            continue
        elif len(value) > MAX_INFO_ROWS and all(isinstance(inner, Mapping) for inner in value.values()):
            tables.append(_info_spread(str(key), value))
        elif any(isinstance(inner, Mapping) for inner in value.values()):
            rows_of = {
                name: _flatten(inner) if isinstance(inner, Mapping) else {"value": inner}
                for name, inner in value.items()
            }
            columns = first_seen(column for row in rows_of.values() for column in row)
            rows = [
                [str(name), *(_render_scalar(row[c]) if c in row else "—" for c in columns)]
                for name, row in rows_of.items()
            ]
            tables.append(f"**{key}**\n\n" + markdown_table(["", *map(str, columns)], rows))
        else:
            rows = [[str(name), _render_scalar(inner)] for name, inner in value.items()]
            tables.append(f"**{key}**\n\n" + markdown_table(["", "value"], rows))
    parts = [markdown_table(["fact", "value"], facts)] if facts else []
    return "\n\n".join([*parts, *tables])


def data_sections(run_dirs: Sequence[Path]) -> list[str]:
    """The ``Data`` section of a report of ``run_dirs``: each run's data overview (``data.json``, written by the
    run; for runs written before it existed, the Data section of their ``summary.md``), once when the runs agree,
    else one sub-section per run. Empty when no run has one."""
    found: list[tuple[Path, str]] = []
    for run_dir in map(Path, run_dirs):
        data_file = run_dir / DATA_FILE
        if data_file.is_file():
            try:
                overview = json.loads(read_text(data_file, "utf-8", "delete it or rerun the run with --resume"))
            except json.JSONDecodeError:
                raise UserError(f"{data_file} is not valid JSON; delete it or rerun the run with --resume.") from None
            if isinstance(overview, Mapping) and overview:
                found.append((run_dir, render_info(overview)))
            continue
        summary = run_dir / SUMMARY_FILE
        text = read_text(summary, "utf-8", DAMAGED_FIX) if summary.is_file() else ""
        section = re.search(r"^## Data\n\n(.*?)(?=^## |\Z)", text, flags=re.MULTILINE | re.DOTALL)
        if section and section.group(1).strip():
            found.append((run_dir, section.group(1).strip()))
    texts = first_seen(text for _, text in found)
    if not texts:
        return []
    if len(texts) == 1:
        return ["## Data", texts[0]]
    parts = ["## Data"]
    for run_dir, text in found:
        parts += [f"### `{run_dir}`", text]
    return parts


_NOTES = (
    "Values x100: mean ± sample SD (ddof = 1) over seeds of the mean over the group's clients (no ± with one "
    "seed); Mean = the same over all clients of the pool. Rows without a budget (`base`, the base model "
    "without personalization, and budget-less methods) are budget-independent and repeat in every budget's "
    "table. `base` is the reference: it is never bold and has no Wins. Bold = the best printed value among the "
    "other methods, where the 95 % interval of its method minus the next best method (paired differences over the "
    "column's clients, as in the differences above; with no other method, minus `base`) lies above 0: a tie or a "
    "group of one client is never bold. Wins = groups where a method is best with that interval above 0{criterion}."
)


def many_groups_note(tables: Sequence[ResultTable]) -> str:
    """The note over tables of more than :data:`MAX_GROUP_COLUMNS` groups, which print the distribution over their
    groups instead of a column each, naming where every client's value is; ``""`` when no table has that many."""
    many = [t.table for t in tables if t.table.summarized]
    if not many:
        return ""
    counts = {pool_label(t.pool): (len(t.groups), group_unit(t)) for t in many}
    where = "; ".join(f"{pool} {count:,} {unit}s" for pool, (count, unit) in counts.items())
    clients = any(unit == "client" for _, unit in counts.values())
    groups = " (each group is one client, so the columns speak of clients)" if clients else ""
    return (
        f"**Many groups** ({where}): a table of more than {MAX_GROUP_COLUMNS} groups shows, instead of a column "
        f"per group{groups}, each method's `Mean` as above and the distribution of its group cells (x100, each the "
        "mean over seeds of the group's mean): the 10th percentile, median and 90th percentile over the groups, and "
        "the lowest and highest group with its value; Wins count groups as above. Every client's value, per "
        f"method and budget (mean and SD over seeds), is in `{CLIENTS_FILE}` beside this file; every group's cell "
        "in the CSV of `fedpeft report --csv`."
    )


def _result_sections(results: Sequence[Record], tables: Sequence[ResultTable], evidence: str) -> list[str]:
    metrics = metric_order(results)
    combined = list(GENERATION_METRICS) if set(GENERATION_METRICS) <= set(metrics) else []
    labels = ", ".join(map(metric_label, combined))
    criterion = f" in at least {GENERATION_MIN_BEST} of {labels}" if combined else ""
    sections = [_NOTES.format(criterion=criterion)]
    many = many_groups_note(tables)
    if many:
        sections.append(many)
    if evidence:
        sections.append(evidence)
    for pool in pool_order(results):
        sections.append(f"## {pool_label(pool)}")
        for found in (t for t in tables if t.table.pool == pool):
            table = found.table
            metric, budget = table.metric, table.budget
            heading = metric_label(metric) if budget is None else f"{budget_label(budget)} — {metric_label(metric)}"
            sections.append(f"### {heading}")
            sections.append(render_group_table(table, found.wins, emphasis=found.emphasis))
    return sections


def _headline_sentence(tables: Sequence[ResultTable]) -> str:
    """The comparison the report leads with: per budget, the method(s) with the highest ``Mean`` of the first pool
    and metric, against ``base``; where none is above ``base``, the clause says so and gives the gap."""
    if not tables:
        return ""
    first = tables[0].table
    clauses = []
    for table in (t.table for t in tables if (t.table.pool, t.table.metric) == (first.pool, first.metric)):
        best = [m for m in table.methods if m in table.best.get(MEAN_COLUMN, set())]
        if not best:
            continue
        top = table.cells[best[0], MEAN_COLUMN]
        clause = f"{', '.join(best)} {format_cell(top)}"
        base = table.cells.get((BASE_METHOD, MEAN_COLUMN))
        if base is not None:
            clause += f" vs {BASE_METHOD} {format_cell(base)}"
            if display_key(top) <= display_key(base):  # as printed: a reader sees the same order
                gap = display_key(top) - display_key(base)
                clause = f"no method above {BASE_METHOD} (best: {clause}, {gap:+.2f})"
        clauses.append(clause if table.budget is None else f"{budget_label(table.budget)}: {clause}")
    if not clauses:
        return ""
    seeds = "one seed" if min(cell.seeds for cell in first.cells.values()) < MIN_SEEDS else "mean over seeds"
    return (
        f"**Highest mean {metric_label(first.metric)}, {pool_label(first.pool).lower()}** (x100, mean over the "
        f"pool's clients, {seeds}): {'; '.join(clauses)}."
    )


def _gain_sections(results: Sequence[Record]) -> list[str]:
    sections = []
    for pool in pool_order(results):
        for metric in metric_order(results):
            gains = gain_over_base(results, pool=pool, metric=metric)
            if gains:
                sections.append(f"### {pool_label(pool)} — {metric_label(metric)}")
                sections.append(render_gain_table(gains, results))
    if not sections:
        return []
    intro = (
        "Per method and budget: mean over the pool's clients of (metric - `base` metric of the same client "
        "and seed), x100, mean ± sample SD over seeds."
    )
    return ["## Gain over base", intro, *sections]


def _summary_path(out: Path) -> Path:
    return out if out.suffix == ".md" else out / SUMMARY_FILE


def write_summary(
    run_dirs: Sequence[Path], out: Path, *, title: str | None = None, info: Mapping[str, object] | None = None
) -> str:
    """Write the paper-style ``summary.md`` of one or more runs.

    It leads with the headline: the method(s) with the highest pool mean per budget against ``base``, their 95 %
    intervals against the runner-up and ``base`` (:mod:`fedpeft.report.differences`), the Evidence note when the
    results rest on too little (:mod:`fedpeft.report.evidence`: one seed, or fewer than ``MIN_TEST_EXAMPLES`` test
    examples per client in the runs' ``data.json``; those tables then mark no winner); then the gain over base, the
    differences with 95 % intervals, the data and the per-group tables (bold and Wins only where the interval
    against the next best method lies above 0; a table of more than ``MAX_GROUP_COLUMNS`` groups as the
    distribution over its groups, every client's value then in ``clients.csv`` beside the summary). Methods add
    sections of their own (e.g.
    Potara's mixing weights) through their declared ``report_sections``
    (:func:`~fedpeft.report.method_hooks.method_hook_calls`), after the result tables.

    Args:
        run_dirs: run directories to merge (see :func:`read_records`).
        out: a directory (the summary goes to ``out/summary.md``) or a ``.md`` file path.
        title: the heading; defaults to the run directory names.
        info: facts about the data (group sizes, samples per client, resource levels, ...), rendered as tables
            (:func:`render_info`); by default the runs' own data overviews (:func:`data_sections`).

    Returns:
        The markdown text written.
    """
    run_dirs = [Path(d) for d in run_dirs]
    results, costs = read_records(run_dirs)
    if not results:
        raise UserError(f"No results in {', '.join(map(str, run_dirs))}; run `fedpeft run` to completion first.")
    title = title or "fedpeft results: " + ", ".join(d.name for d in run_dirs)
    seeds = ", ".join(map(str, first_seen(r["seed"] for r in results)))
    runs = ", ".join(f"`{d}`" for d in run_dirs)
    parts = [f"# {title}", f"Runs: {runs}. Seeds: {seeds}. Methods: {', '.join(method_order(results))}."]
    rehearsal = any(rehearsal_of(d) is not None for d in run_dirs)
    if rehearsal:  # no headline: nothing of a rehearsal is a result
        parts.append(f"**{REHEARSAL_NOTE}**")
    test_per_client = per_client_test_examples(run_dirs)
    tables = judged_tables(results, test_per_client)
    evidence = evidence_note(tables, test_per_client)
    # The headline first: the comparison, its intervals, how much it rests on, then the gain over base and the
    # differences; the long tables after.
    shared_base = shared_base_note(run_dirs, len(first_seen(r["seed"] for r in results)))
    headline = [
        text for text in (_headline_sentence(tables), headline_intervals(tables), evidence, shared_base) if text
    ]
    if headline and not rehearsal:
        parts += ["## Headline", *headline]
    parts += _gain_sections(results)
    parts += difference_sections(tables)
    if info is None:
        parts += data_sections(run_dirs)
    elif info:
        parts += ["## Data", render_info(info)]
    parts += ["## Results", *_result_sections(results, tables, evidence)]
    for hook, records in method_hook_calls(results, run_dirs, "report_sections"):
        parts += hook(records, run_dirs)
    round_records = read_round_records(run_dirs)
    parts += continual_sections(round_records)
    parts += schedule_sections(round_records)  # methods on the virtual clock
    parts += privacy_sections(results)  # methods with `dp`: the final epsilon per method and seed
    failures = render_failures(costs)
    if failures:
        parts += ["## Failed clients", failures]
    rejections = render_rejections(costs)
    if rejections:
        parts += [
            "## Rejected updates",
            "Updates the server did not aggregate (failed checks: docs/privacy.md), injected faults and dropped "
            "clients, per round (counted from 1, as the log and the config's `faults` count them).",
            rejections,
        ]
    if costs:
        parts += [
            "## Costs",
            "Mean over seeds (± sample SD where the seeds differ). Federated training per client and round, "
            "personalization per client; then totals per phase.",
            render_cost_tables(costs),
        ]
        compute = render_compute_table(costs)
        if compute:
            parts += [
                "## Compute per budget",
                "Per compute tier, the forward pass of one sequence (`compute_tokens`, default 128): analytic "
                "FLOPs = 2 x active parameters x tokens (LoRA unmerged) and measured wall milliseconds (median, "
                "LoRA merged: the base model at the tier's top-k); mean over seeds.",
                compute,
            ]
    text = "\n\n".join(parts) + "\n"
    target = _summary_path(Path(out))
    if any(found.table.summarized for found in tables):  # the tables print no column per client: the file has them
        write_text_atomic(target.parent / CLIENTS_FILE, render_client_csv(results))
    write_text_atomic(target, text)  # through a temporary file and a rename
    return text
