"""A plan timed on a device, as a rich table or as JSON (``fedpeft plan``; the columns are in docs/plan.md)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from rich.table import Table

from fedpeft.planning.devices import ASSUMED_MFU, GENERATION_BANDWIDTH_SHARE, MEMORY_ROWS_GIB, Gpu
from fedpeft.planning.plan import Phase, Plan

GIB = 2**30


def gpu_hours(phase: Phase, gpu: Gpu, gpus: int, weights: float) -> float | None:
    """Hours of one seed of ``phase`` on ``gpus`` of ``gpu``: its FLOPs at :data:`ASSUMED_MFU` of the peak, each
    decoding step one read of ``weights`` bytes, the clients that may run at once spread over the GPUs."""
    if phase.flops is None:
        return None
    seconds = phase.flops / (gpu.bf16_flops * ASSUMED_MFU)
    seconds += phase.decode_steps * weights / (gpu.bandwidth * GENERATION_BANDWIDTH_SHARE)
    return seconds / min(gpus, max(phase.parallel_clients, 1)) / 3600


def cpu_hours(phase: Phase, flops_per_s: float | None) -> float | None:
    """Hours of one seed of ``phase`` on this machine's CPU at its measured matmul rate (None: not measured)."""
    if phase.flops is None or not flops_per_s:
        return None
    return phase.flops / flops_per_s / 3600


def workers_that_fit(peak: float, memory_gib: float) -> int:
    """How many workers of ``peak`` bytes one GPU of ``memory_gib`` GiB holds."""
    return int(memory_gib * GIB // peak) if peak else 0


def plan_json(plan: Plan, gpu: Gpu, gpus: int, cpu_flops: float | None) -> dict[str, Any]:
    """The plan as JSON-ready values: phases with their hours, the totals, the federation, the assumptions."""
    weights = max(m.weights for m in plan.models)
    phases = []
    for phase in plan.phases:
        row = phase.as_dict()
        row["gpu_hours"] = gpu_hours(phase, gpu, gpus, weights)
        row["cpu_hours"] = cpu_hours(phase, cpu_flops)
        phases.append(row)

    def total(key: str) -> float:
        """Sum over the phases whose ``key`` is known, times their seeds (``unknown_phases`` counts the others)."""
        return float(sum(r[key] * r["times"] for r in phases if r[key] is not None))

    peak = plan.peak_memory
    return {
        "name": plan.name,
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
                "architecture": asdict(m.architecture),
            }
            for m in plan.models
        ],  # fmt: skip
        "federation": {**asdict(plan.federation), "total_clients": plan.federation.total_clients},
        "phases": phases,
        "total": {
            **{key: total(key) for key in ("client_trainings", "examples", "tokens", "steps", "flops")},
            "bytes_up": sum(p.bytes_up_per_round * p.rounds * p.times for p in plan.phases),
            "bytes_down": sum(p.bytes_down_per_round * p.rounds * p.times for p in plan.phases),
            "peak_memory": peak,
            "disk": plan.disk,
            "gpu_hours": total("gpu_hours"),
            "cpu_hours": total("cpu_hours") if cpu_flops else None,
            "unknown_phases": sum(1 for r in phases if r["flops"] is None),
        },
        "device": {"gpu": asdict(gpu), "gpus": gpus, "cpu_flops_per_s": cpu_flops},
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


def _count(value: float | None) -> str:
    if value is None:
        return "unknown"
    for unit, size in (("E", 1e18), ("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= size:
            return f"{value / size:.3g}{unit}"
    return f"{value:.3g}"


def _bytes(value: float) -> str:
    if value >= GIB:
        return f"{value / GIB:.2f} GiB"
    return f"{value / 2**20:.1f} MiB"


def _hours(value: float | None) -> str:
    return "unknown" if value is None else (f"{value:.3g}" if value >= 0.01 else f"{value * 3600:.2g} s")


def plan_tables(data: dict[str, Any]) -> list[Table]:
    """The phases of :func:`plan_json`'s ``data`` and their total as two rich tables: the work, and its cost."""
    gpu, gpus, cpu = data["device"]["gpu"], data["device"]["gpus"], data["device"]["cpu_flops_per_s"]
    title = f"{data['name']}: each row one seed, x the seeds it runs for"
    work = Table(title=title)
    cost = Table(title="Cost per seed (computed, not measured)")
    for header in ("method", "phase", "x", "trainings", "examples", "tokens", "steps", "FLOPs"):
        work.add_column(header, justify="left" if header in ("method", "phase") else "right", overflow="fold")
    for header in ("method", "phase", f"h {gpu['name']} x{gpus}", "h CPU", "peak/worker", "disk", "up/round",
                   "down/round"):  # fmt: skip
        cost.add_column(header, justify="left" if header in ("method", "phase") else "right", overflow="fold")
    for p in data["phases"]:
        work.add_row(p["method"], p["phase"], str(p["times"]), _count(p["client_trainings"]), _count(p["examples"]),
                     _count(p["tokens"]), _count(p["steps"]), _count(p["flops"]))  # fmt: skip
        cost.add_row(
            p["method"], p["phase"], _hours(p["gpu_hours"]), _hours(p["cpu_hours"]) if cpu else "not measured",
            _bytes(p["peak_memory"]), _bytes(p["disk"]),
            _bytes(p["bytes_up_per_round"]) if p["rounds"] else "-",
            _bytes(p["bytes_down_per_round"]) if p["rounds"] else "-",
        )  # fmt: skip
    t = data["total"]
    partial = bool(t["unknown_phases"])
    work.add_section()
    work.add_row(
        "total (at least)" if partial else "total",
        "",
        "",
        *(_count(t[key]) for key in ("client_trainings", "examples", "tokens", "steps", "flops")),
    )
    cost.add_section()
    cost.add_row(
        "total, all seeds" + (" (at least)" if partial else ""),
        "",
        _hours(t["gpu_hours"]),
        _hours(t["cpu_hours"]) if cpu else "not measured",
        _bytes(t["peak_memory"]),
        _bytes(t["disk"]),
        _bytes(t["bytes_up"]) + " in all",
        _bytes(t["bytes_down"]) + " in all",
    )
    return [work, cost]


def plan_lines(data: dict[str, Any]) -> list[str]:
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
    lines.append(
        f"Computed, not measured: {data['assumptions']['mfu']:.0%} of the GPU's peak dense bf16 FLOPs (an assumed "
        "MFU until a real run measures it); tokens are batch x max_length (upper bound). See docs/plan.md."
    )
    if data["total"]["unknown_phases"]:
        lines.append(f"{data['total']['unknown_phases']} phase(s) depend on sizes that are unknown; the totals "
                     "count the others only.")  # fmt: skip
    lines += data["notes"]
    return lines
