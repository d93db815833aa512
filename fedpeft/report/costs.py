"""The cost tables of a report: per-client and total costs per method and phase, failed clients, compute per
budget (from ``costs.jsonl``)."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence

from fedpeft.core.costs import FAILED_CLIENT, ROUND_EVALUATION
from fedpeft.core.records import Budget
from fedpeft.report.records import Record, budget_label, first_seen, method_order
from fedpeft.report.tables import Cell, markdown_table, over_seeds


def _format_bytes(value: float) -> str:
    units = ("B", "KiB", "MiB", "GiB")
    power = 0
    while abs(value) >= 1024 and power < len(units) - 1:
        value /= 1024
        power += 1
    return f"{value:.0f} B" if power == 0 else f"{value:.2f} {units[power]}"


def _format_seconds(value: float) -> str:
    return f"{value:.3f}"


def _format_megabytes(value: float) -> str:
    return f"{value:.1f}"


def _format_count(value: float) -> str:
    return f"{value:,.0f}"


def _format_share(value: float) -> str:
    return f"{value * 100:.2f} %"


# (phase, metric, header, formatter) of the per-client cost table (paper Table 5) and of the totals table.
_COST_COLUMNS = (
    ("federated", "wall_s_per_client_round", "Fed. s / client-round", _format_seconds),
    ("federated", "bytes_up_per_client_round", "Fed. up / client-round", _format_bytes),
    ("federated", "bytes_down_per_client_round", "Fed. down / client-round", _format_bytes),
    ("federated", "peak_rss_mb", "Fed. peak RSS MB", _format_megabytes),
    ("federated", "peak_cuda_mb", "Fed. peak CUDA MB", _format_megabytes),
    ("personalization", "wall_s_per_client", "Pers. s / client", _format_seconds),
    ("personalization", "peak_rss_mb", "Pers. peak RSS MB", _format_megabytes),
    ("personalization", "peak_cuda_mb", "Pers. peak CUDA MB", _format_megabytes),
    ("federated", "floats_up_per_client_round", "Floats up / client-round", _format_count),
    ("federated", "bytes_up_per_client", "Up / client (all rounds)", _format_bytes),
    ("personalization", "merge_s_per_client", "Merge s / client", _format_seconds),
    ("personalization", "merge_share", "Merge / training time", _format_share),
    (ROUND_EVALUATION, "wall_s_per_client", "Round eval. s / client", _format_seconds),
)
_TOTAL_COLUMNS = (
    ("bytes_up_total", "Up total", _format_bytes),
    ("bytes_down_total", "Down total", _format_bytes),
    ("wall_s", "Wall s", _format_seconds),
    ("peak_rss_mb", "Peak RSS MB", _format_megabytes),
    ("workers_peak_rss_mb", "Workers' peak RSS MB", _format_megabytes),
    ("peak_cuda_mb", "Peak CUDA MB", _format_megabytes),
)
_PHASES = ("base", "federated", ROUND_EVALUATION, "personalization")


def cost_cells(costs: Sequence[Record]) -> dict[tuple[str, str, str], Cell]:
    """``(method, phase, metric) -> Cell`` over seeds of the cost records."""
    per_seed: dict[tuple[str, str, str], list[float]] = {}
    for record in costs:
        if record.get("value") is not None:
            key = (record["method"], record["phase"], record["metric"])
            per_seed.setdefault(key, []).append(float(record["value"]))
    return {key: over_seeds(values) for key, values in per_seed.items()}


def _format_cost(cell: Cell | None, formatter: Callable[[float], str]) -> str:
    if cell is None:
        return "—"
    # Byte counts are deterministic, so an SD of 0 would only add noise.
    if cell.sd:
        return f"{formatter(cell.mean)} ± {formatter(cell.sd)}"
    return formatter(cell.mean)


def render_cost_tables(costs: Sequence[Record]) -> str:
    """Markdown of the per-client cost table and the totals table; columns without data are left out."""
    cells = cost_cells(costs)
    methods = method_order(costs)
    columns = [c for c in _COST_COLUMNS if any((m, c[0], c[1]) in cells for m in methods)]
    parts = []
    if columns:
        rows = [
            [
                method,
                *(_format_cost(cells.get((method, phase, metric)), fmt) for phase, metric, _, fmt in columns),
            ]
            for method in methods
            if any((method, phase, metric) in cells for phase, metric, _, _ in columns)
        ]
        parts.append(markdown_table(["Method", *(c[2] for c in columns)], rows))
    totals = [c for c in _TOTAL_COLUMNS if any(key[2] == c[0] for key in cells)]
    total_rows = [
        [method, phase, *(_format_cost(cells.get((method, phase, metric)), fmt) for metric, _, fmt in totals)]
        for method in methods
        for phase in _PHASES
        if any((method, phase, metric) in cells for metric, _, _ in totals)
    ]
    if total_rows:
        parts.append(markdown_table(["Method", "Phase", *(c[1] for c in totals)], total_rows))
    return "\n\n".join(parts)


_FAILURE_TEXT = {
    "federated": "client-round(s) failed and were left out of the aggregation; its numbers come from fewer updates "
    "than configured",
    "personalization": "client(s) failed personalization and have no results",
    "evaluation": "client(s) failed the base model's evaluation and have no base results",
    "client-base": "client(s) failed to build their own base model",
}
FAILED_CLIENT_ROWS = 20  # the failed clients the summary lists; costs.jsonl has them all


def render_failures(costs: Sequence[Record]) -> str:
    """A warning line per method, seed and phase that left clients out because they failed, in that phase's words,
    then a table of the failed clients (``failed_client`` events: method, seed, phase, round, client and the
    error's class and message), its first 20 rows and a count of the others."""
    lines = [
        f"- **{c['method']}**, seed {c['seed']}, {c.get('phase', 'federated')}: {int(c['value'])} "
        + _FAILURE_TEXT.get(str(c.get("phase")), "client(s) failed")
        + "."
        for c in costs
        if c.get("metric") in ("failed_client_rounds", "failed_clients") and c.get("value", 0) > 0
    ]
    failed = [c for c in costs if c.get("metric") == FAILED_CLIENT]
    if not failed:
        return "\n".join(lines)
    rows = [
        [
            str(c["method"]),
            str(c["seed"]),
            str(c.get("phase", "")) + (f" ({c['step']})" if c.get("step") else ""),
            str(c.get("round", "—")),
            str(c.get("client", "—")),
            f"`{c.get('error', '')}`",
            _table_text(str(c.get("message", ""))),
        ]
        for c in failed[:FAILED_CLIENT_ROWS]
    ]
    header = ["Method", "Seed", "Phase", "Round", "Client", "Error", "Message"]
    parts = [text for text in ("\n".join(lines), markdown_table(header, rows)) if text]
    if len(failed) > FAILED_CLIENT_ROWS:
        more = len(failed) - FAILED_CLIENT_ROWS
        parts.append(f"... and {more} more failed client(s) (`costs.jsonl` lists every one as `{FAILED_CLIENT}`).")
    return "\n\n".join(parts)


def _table_text(text: str) -> str:
    """Text that stays inside its markdown table cell."""
    return text.replace("|", "\\|").replace("`", "'")


def render_rejections(costs: Sequence[Record]) -> str:
    """Markdown table of the server's actions on untrusted updates (costs events): rejected updates with their
    reason, injected faults, dropped clients and rounds that kept the previous state. Empty when there are none."""
    kinds = {
        "rejected_update": "rejected",
        "injected_fault": "fault injected",
        "dropped_client": "dropped",
        "kept_previous_state": "round kept the previous state",
    }
    rows = [
        [
            str(c["method"]),
            str(c["seed"]),
            str(c.get("round", "")),
            str(c.get("client") or "—"),
            kinds[c["metric"]],
            str(c.get("reason") or c.get("kind") or ""),
        ]
        for c in costs
        if c.get("metric") in kinds
    ]
    if not rows:
        return ""
    return markdown_table(["Method", "Seed", "Round", "Client", "What", "Reason"], rows)


def render_compute_table(costs: Sequence[Record]) -> str:
    """Markdown of the per-budget compute records (phase ``compute``): per method and budget (a compute tier),
    experts per token, LoRA rank, active parameters, analytic forward FLOPs, their share of the method's first
    budget, and the measured forward milliseconds; mean over seeds. Empty when there are none."""
    values: dict[tuple[str, Budget, str], list[float]] = {}
    for record in costs:
        if record.get("phase") == "compute" and record.get("value") is not None:
            values.setdefault((record["method"], record.get("budget"), record["metric"]), []).append(record["value"])
    if not values:
        return ""
    keys = first_seen((method, budget) for method, budget, _ in values)
    rows = []
    for method, budget in keys:
        cell = {m: statistics.fmean(v) for (me, b, m), v in values.items() if (me, b) == (method, budget)}
        first = next(b for me, b in keys if me == method)
        reference = statistics.fmean(values.get((method, first, "forward_flops"), [float("nan")]))
        flops = cell.get("forward_flops")
        rows.append([
            method,
            budget_label(budget),
            f"{cell['top_k']:.0f}" if "top_k" in cell else "—",
            f"{cell['lora_rank']:.0f}" if "lora_rank" in cell else "—",
            f"{cell['active_params'] / 1e6:.3f} M" if "active_params" in cell else "—",
            f"{flops / 1e9:.4g} G" if flops is not None else "—",
            f"{100 * flops / reference:.1f} %" if flops is not None and reference > 0 else "—",
            f"{cell['forward_ms']:.2f}" if "forward_ms" in cell else "—",
        ])  # fmt: skip
    header = ["Method", "Budget", "top-k", "LoRA rank", "Active params", "Forward FLOPs", "vs first", "Forward ms"]
    return markdown_table(header, rows)
