"""A plan timed on a device, as a rich table or as JSON (``fedpeft plan``; the columns are in docs/plan.md)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Literal, cast

from rich import box
from rich.table import Table

from fedpeft.planning.cpu_time import DEFAULT_BANDWIDTH, flops_rates, timed
from fedpeft.planning.devices import ASSUMED_MFU, GENERATION_BANDWIDTH_SHARE, MEMORY_ROWS_GIB, Gpu
from fedpeft.planning.plan import Phase, Plan
from fedpeft.planning.shapes import ArchitectureData, FederationData, GpuData, PhaseRow, PlanData

GIB = 2**30

Count = Literal["client_trainings", "examples", "tokens", "steps", "flops"]
COUNTS: tuple[Count, ...] = ("client_trainings", "examples", "tokens", "steps", "flops")
"""What a plan counts of each phase, and in all: the work columns of its table."""


def gpu_hours(phase: Phase, gpu: Gpu, gpus: int, weights: float) -> float | None:
    """Hours of one seed of ``phase`` on ``gpus`` of ``gpu``: its FLOPs at :data:`ASSUMED_MFU` of the peak, each
    decoding step one read of ``weights`` bytes, the clients that may run at once spread over the GPUs."""
    if phase.flops is None:
        return None
    seconds = phase.flops / (gpu.bf16_flops * ASSUMED_MFU)
    seconds += phase.decode_steps * weights / (gpu.bandwidth * GENERATION_BANDWIDTH_SHARE)
    return seconds / min(gpus, max(phase.parallel_clients, 1)) / 3600


def workers_that_fit(peak: float, memory_gib: float) -> int:
    """How many workers of ``peak`` bytes one GPU of ``memory_gib`` GiB holds."""
    return int(memory_gib * GIB // peak) if peak else 0


def plan_json(plan: Plan, gpu: Gpu, gpus: int, cpu_flops: float | None) -> PlanData:
    """The plan as JSON-ready values: phases with their hours, the totals, the federation, the assumptions; the CPU
    hours (:mod:`fedpeft.planning.cpu_time`) where ``cpu_flops`` (this CPU's measured matmul rate) is given."""
    weights = max(m.weights for m in plan.models)
    phases: list[PhaseRow] = []
    for phase in plan.phases:
        row: PhaseRow = {**phase.as_dict(), "gpu_hours": gpu_hours(phase, gpu, gpus, weights), "cpu_hours": None}
        phases.append(row)

    def total(key: Literal["client_trainings", "examples", "tokens", "steps", "flops", "gpu_hours"]) -> float:
        """Sum over the phases whose ``key`` is known, times their seeds (``unknown_phases`` counts the others)."""
        return float(sum(value * r["times"] for r in phases if (value := r[key]) is not None))

    peak = plan.peak_memory
    data: PlanData = {
        "name": plan.name,
        "rehearsal": plan.rehearsal,
        "seeds": plan.seeds,
        "models": [
            {
                "label": m.label,
                "name": m.name,
                "dtype": m.dtype,
                "quantization": m.quantization,
                "max_length": m.max_length,
                "share": m.share,
                "source": m.architecture.source,
                "weights_bytes": m.weights,
                "architecture": cast(ArchitectureData, asdict(m.architecture)),
                "tokens_per_example": m.tokens_per_example,
            }
            for m in plan.models
        ],  # fmt: skip
        "federation": cast(FederationData, {**asdict(plan.federation), "total_clients": plan.federation.total_clients}),
        "phases": phases,
        "cpu": {**plan.cpu, "bandwidth": DEFAULT_BANDWIDTH, "flops_per_s": cpu_flops},
        "total": {
            "client_trainings": total("client_trainings"),
            "examples": total("examples"),
            "tokens": total("tokens"),
            "steps": total("steps"),
            "flops": total("flops"),
            "bytes_up": sum(p.bytes_up_per_round * p.rounds * p.times for p in plan.phases),
            "bytes_down": sum(p.bytes_down_per_round * p.rounds * p.times for p in plan.phases),
            "peak_memory": peak,
            "disk": plan.disk,
            "gpu_hours": total("gpu_hours"),
            "cpu_hours": None,
            "unknown_phases": sum(1 for r in phases if r["flops"] is None),
        },
        "device": {"gpu": cast(GpuData, asdict(gpu)), "gpus": gpus, "cpu_flops_per_s": cpu_flops},
        "fits": {
            "workers": plan.workers,
            "workers_per_gpu": plan.workers_per_gpu,
            "workers_per_gpu_that_fit": {str(g): workers_that_fit(peak, g) for g in (*MEMORY_ROWS_GIB, gpu.memory_gib)},
            "configured_fits": plan.workers_per_gpu * peak <= gpu.memory_gib * GIB,
        },
        "assumptions": {
            "mfu": ASSUMED_MFU,
            "generation_bandwidth_share": GENERATION_BANDWIDTH_SHARE,
            "measured": False,
        },  # fmt: skip
        "notes": plan.notes,
    }
    rates = flops_rates(data["models"], cpu_flops)
    if rates is not None:
        cpu = timed(data, rates)
        for row, seconds in zip(phases, cpu["seconds"], strict=True):
            row["cpu_hours"] = None if seconds is None else seconds / 3600
        data["total"]["cpu_hours"] = cpu["total_s"] / 3600
        data["cpu"]["timed"] = cpu
    return data


def _count(value: float | None) -> str:
    if value is None:
        return "unknown"
    for unit, size in (("E", 1e18), ("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= size:
            return f"{value / size:.3g}{unit}"
    return f"{value:.3g}"


def _number(value: float) -> str:
    """Three significant digits, without an exponent: ``0.214``, ``52.8``, ``2,937``."""
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def _bytes(value: float) -> str:
    if value >= GIB:
        return f"{_number(value / GIB)} GiB"
    return f"{_number(value / 2**20)} MiB" if value >= 2**20 / 10 else "0 MiB"


def _traffic(up: float, down: float) -> str:
    """Bytes up and down in one unit: ``0.214 / 0.214 MiB``."""
    unit, scale = ("GiB", GIB) if max(up, down) >= GIB else ("MiB", 2**20)
    return f"{_number(up / scale)} / {_number(down / scale)} {unit}"


def _duration(hours: float | None) -> str:
    """``hours`` as the unit a reader takes in at a glance: ``<0.1 s``, ``4.2 s``, ``42 s``, ``3.5 min``, ``2.1 h``,
    ``4.2 d``."""
    if hours is None:
        return "unknown"
    seconds = hours * 3600
    if seconds < 0.1:
        return "<0.1 s"
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{seconds / 60:.2g} min"
    return f"{_number(hours)} h" if hours < 48 else f"{_number(hours / 24)} d"


def _table(title: str, headers: list[str], rows: list[list[str]], total: list[str], width: int | None) -> Table:
    """A table whose cells never wrap or cut: columns are left out from the right (the first two are always kept)
    while the table is wider than ``width`` columns, and its caption names them."""
    widths = [max(len(h), *(len(r[k]) for r in [*rows, total])) for k, h in enumerate(headers)]
    kept = list(range(len(headers)))
    while width is not None and len(kept) > 2 and sum(widths[k] for k in kept) + 2 * (len(kept) - 1) > width:
        kept.pop()
    left_out = [headers[k] for k in range(len(headers)) if k not in kept]
    caption = f"left out to fit {width} columns: {', '.join(left_out)} (--json has every value)" if left_out else None
    table = Table(title=title, caption=caption, box=box.SIMPLE_HEAD, pad_edge=False)
    for k in kept:
        table.add_column(headers[k], justify="left" if k < 2 else "right", no_wrap=True, min_width=widths[k])
    for row in rows:
        table.add_row(*(row[k] for k in kept))
    table.add_section()
    table.add_row(*(total[k] for k in kept))
    return table


def plan_tables(data: PlanData, width: int | None = None) -> list[Table]:
    """The phases of :func:`plan_json`'s ``data`` and their total as two rich tables: the work, and its cost.

    No cell wraps or is cut: a table wider than ``width`` columns leaves out its last columns and says so; the CPU
    time column is there only where it was measured."""
    gpu, gpus, cpu = data["device"]["gpu"], data["device"]["gpus"], data["device"]["cpu_flops_per_s"]
    rehearsed = data.get("rehearsed")
    cpu_hours = [p["cpu_hours"] for p in data["phases"]]
    cpu_total = data["total"]["cpu_hours"]
    if rehearsed is not None:  # this CPU's time from the rehearsal's measured step
        cpu, cpu_hours = True, [None if s is None else s / 3600 for s in rehearsed["phases"]]
        cpu_total = rehearsed["cpu_hours"]
    work_rows, cost_rows = [], []
    for p, hours in zip(data["phases"], cpu_hours, strict=True):
        counts = (p[key] for key in COUNTS)
        work_rows.append([p["method"], p["phase"], str(p["times"]), *map(_count, counts)])
        traffic = _traffic(p["bytes_up_per_round"], p["bytes_down_per_round"]) if p["rounds"] else "-"
        cpu_time = [_duration(hours)] if cpu else []
        cost_rows.append(
            [p["method"], p["phase"], _duration(p["gpu_hours"]), *cpu_time]
            + [_bytes(p["peak_memory"]), _bytes(p["disk"]), traffic]
        )
    t = data["total"]
    total = "total (at least)" if t["unknown_phases"] else "total"
    counts = (t[key] for key in COUNTS)
    work_total = [total, "", "", *map(_count, counts)]
    cost_total = [total, "all seeds", _duration(t["gpu_hours"]), *([_duration(cpu_total)] if cpu else [])]
    cost_total += [_bytes(t["peak_memory"]), _bytes(t["disk"]), _traffic(t["bytes_up"], t["bytes_down"]) + " in all"]
    work_headers = ["method", "phase", "x", "trainings", "examples", "tokens", "steps", "FLOPs"]
    cpu_header = "CPU (rehearsed)" if rehearsed is not None else "CPU"
    cost_headers = ["method", "phase", f"{gpu['name']} x{gpus}", *([cpu_header] if cpu else [])]
    cost_headers += ["peak/worker", "disk", "up / down per round"]
    work_title = f"{data['name']}: each row one seed, x the seeds it runs for"
    return [
        _table(work_title, work_headers, work_rows, work_total, width),
        _table("Cost per seed (computed, not measured)", cost_headers, cost_rows, cost_total, width),
    ]


def plan_lines(data: PlanData) -> list[str]:
    """The lines under the table: the federation, the models, what fits in GPU memory, the assumptions."""
    fed = data["federation"]
    pools = ", ".join(f"{pool} {count}" for pool, count in fed["clients"].items())
    per_client = []
    for pool, count in fed["clients"].items():
        rows = fed["train_rows"].get(pool)
        per_client.append(f"{pool} {rows / count:.0f}" if rows is not None and count else f"{pool} unknown")
    lines = [
        f"Federation: {fed['dataset']}, {fed['total_clients']} clients ({pools}); training examples per client: "
        f"{', '.join(per_client)}. {fed['rule']}. Sizes: {fed['source']}.",
    ]
    for m in data["models"]:
        label = f"{m['label']}: " if m["label"] else ""
        lines.append(f"Model {label}{m['name']} ({m['source']}), weights {_bytes(m['weights_bytes'])} "
                     f"({m['quantization'] or m['dtype']}), {m['max_length']} tokens.")  # fmt: skip
    fits, peak = data["fits"], data["total"]["peak_memory"]
    for gib in MEMORY_ROWS_GIB:
        n = fits["workers_per_gpu_that_fit"][str(gib)]
        verdict = "fits" if fits["workers_per_gpu"] <= n else "does not fit"
        lines.append(f"{gib} GB GPU: {n} worker(s) of {_bytes(peak)} fit; workers_per_gpu {fits['workers_per_gpu']} "
                     f"{verdict}.")  # fmt: skip
    if not data["device"]["cpu_flops_per_s"] and "rehearsed" not in data:
        lines.append("CPU time: not measured (--no-measure-cpu).")
    lines.append(
        f"Computed, not measured: {data['assumptions']['mfu']:.0%} of the GPU's peak dense bf16 FLOPs (an assumed "
        "MFU until a real run measures it); tokens are batch x max_length (upper bound). See docs/plan.md."
    )
    if data["total"]["unknown_phases"]:
        lines.append(f"{data['total']['unknown_phases']} phase(s) depend on sizes that are unknown; the totals "
                     "count the others only.")  # fmt: skip
    lines += data["notes"]
    return lines
