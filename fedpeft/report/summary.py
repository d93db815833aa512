"""The report's ``summary.md``: the sections of results, gains, methods' own sections, continual
evaluation, failures and costs, assembled in that order."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from fedpeft.core.errors import UserError
from fedpeft.core.io import write_text_atomic
from fedpeft.report.continual import continual_sections, read_round_records
from fedpeft.report.costs import render_compute_table, render_cost_tables, render_failures, render_rejections
from fedpeft.report.method_hooks import method_hook_calls
from fedpeft.report.privacy import privacy_sections
from fedpeft.report.records import (
    Record,
    budget_label,
    budget_order,
    first_seen,
    method_order,
    metric_label,
    metric_order,
    pool_label,
    pool_order,
    read_records,
)
from fedpeft.report.tables import (
    GENERATION_METRICS,
    GENERATION_MIN_BEST,
    combined_wins,
    gain_over_base,
    group_table,
    markdown_table,
    render_gain_table,
    render_group_table,
)

SUMMARY_FILE = "summary.md"


def _render_scalar(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return ", ".join(map(str, value))
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def render_info(info: Mapping[str, Any]) -> str:
    """Markdown of descriptive facts as given: scalars and lists as a bullet list, mappings as small tables.

    A mapping of mappings (e.g. ``{"sizes": {"en": {"train": 2000, "test": 500}}}``) becomes one table with a
    column per inner key.
    """
    bullets = []
    tables = []
    for key, value in info.items():
        if not isinstance(value, Mapping):
            bullets.append(f"- **{key}**: {_render_scalar(value)}")
        elif value and all(isinstance(inner, Mapping) for inner in value.values()):
            columns = first_seen(column for inner in value.values() for column in inner)
            rows = [
                [str(name), *(_render_scalar(inner[c]) if c in inner else "—" for c in columns)]
                for name, inner in value.items()
            ]
            tables.append(f"**{key}**\n\n" + markdown_table(["", *map(str, columns)], rows))
        else:
            rows = [[str(name), _render_scalar(inner)] for name, inner in value.items()]
            tables.append(f"**{key}**\n\n" + markdown_table(["", "value"], rows))
    return "\n\n".join(part for part in ["\n".join(bullets), *tables] if part)


_NOTES = (
    "Values x100: mean ± sample SD (ddof = 1) over seeds of the mean over the group's clients (no ± with one "
    "seed); Mean = the same over all clients of the pool. Rows without a budget (`base`, the base model "
    "without personalization, and budget-less methods) are budget-independent and repeat in every budget's "
    "table. `base` is the reference: it is never bold and has no Wins. Bold = best printed value among the "
    "other methods; Wins = groups where a method is best{criterion}, every tied method winning."
)


def _result_sections(results: Sequence[Record]) -> list[str]:
    metrics = metric_order(results)
    combined = list(GENERATION_METRICS) if set(GENERATION_METRICS) <= set(metrics) else []
    labels = ", ".join(map(metric_label, combined))
    criterion = f" in at least {GENERATION_MIN_BEST} of {labels}" if combined else ""
    sections = [_NOTES.format(criterion=criterion)]
    for pool in pool_order(results):
        pool_records = [r for r in results if r["pool"] == pool]
        sections.append(f"## {pool_label(pool)}")
        for budget in budget_order(pool_records) or [None]:
            tables = {m: group_table(pool_records, pool=pool, metric=m, budget=budget) for m in metrics}
            wins = combined_wins([tables[m] for m in combined]) if combined else None
            for metric, table in tables.items():
                if not table.methods:
                    continue
                heading = metric_label(metric) if budget is None else f"{budget_label(budget)} — {metric_label(metric)}"
                sections.append(f"### {heading}")
                sections.append(render_group_table(table, wins if metric in combined else None))
    return sections


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
    run_dirs: Sequence[Path], out: Path, *, title: str | None = None, info: Mapping[str, Any] | None = None
) -> str:
    """Write the paper-style ``summary.md`` of one or more runs.

    Methods add sections of their own (e.g. Potara's mixing weights) through ``Method.report_sections``
    (:func:`~fedpeft.report.method_hooks.method_hook_calls`), after the gain over base.

    Args:
        run_dirs: run directories to merge (see :func:`read_records`).
        out: a directory (the summary goes to ``out/summary.md``) or a ``.md`` file path.
        title: the heading; defaults to the run directory names.
        info: facts about the data (group sizes, samples per client, resource levels, ...), shown as given.

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
    if info:
        parts += ["## Data", render_info(info)]
    parts += ["## Results", *_result_sections(results), *_gain_sections(results)]
    for hook, records in method_hook_calls(results, run_dirs, "report_sections"):
        parts += hook(records, run_dirs)
    parts += continual_sections(read_round_records(run_dirs))
    parts += privacy_sections(results)  # methods with `dp`: the final epsilon per method and seed
    failures = render_failures(costs)
    if failures:
        parts += ["## Failed clients", failures]
    rejections = render_rejections(costs)
    if rejections:
        parts += [
            "## Rejected updates",
            "Updates the server did not aggregate (failed checks: docs/privacy.md), injected faults and dropped "
            "clients, per round (0-based).",
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
    write_text_atomic(_summary_path(Path(out)), text)  # through a temporary file and a rename
    return text
