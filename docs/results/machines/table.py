"""The table of docs/results/machines.md: each results page's run against its rerun with other float kernels.

    python docs/results/machines/table.py

Reads the records kept beside the results pages (the references) and in this folder (the reruns), no run needed,
and prints one row per run: what `fedpeft compare REFERENCE RERUN` says about it (fedpeft.report.reproduction),
plus how far the `base` row's mean moved. Run from the project root.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

from fedpeft.report.continual import round_records
from fedpeft.report.records import BASE_METHOD, final_results, read_jsonl
from fedpeft.report.reproduction import compare_results, paired_tables
from fedpeft.report.tables import MEAN_COLUMN

RESULTS = Path("docs/results")
HERE = RESULTS / "machines"

# (results page, run, reference records, rerun records with AVX2 kernels)
RUNS = [
    ("quickstart", "quickstart", RESULTS / "quickstart/results.jsonl.gz", HERE / "quickstart.jsonl.gz"),
    (
        "potara-tasks-cpu",
        "potara-tasks-cpu",
        RESULTS / "potara-tasks-cpu/results.jsonl.gz",
        HERE / "potara-tasks-cpu.jsonl.gz",
    ),
    (
        "potara-tasks-cpu",
        "potara-tasks-cpu, from the reference's base model",
        RESULTS / "potara-tasks-cpu/results.jsonl.gz",
        HERE / "potara-tasks-cpu-same-base.jsonl.gz",
    ),
    (
        "guidance-tasks-cpu",
        "guidance-tasks-cpu",
        RESULTS / "guidance-tasks-cpu/results.jsonl.gz",
        HERE / "guidance-tasks-cpu.jsonl.gz",
    ),
    ("async", "async-cpu", RESULTS / "async/async-cpu/results.jsonl.gz", HERE / "async-cpu.jsonl.gz"),
    (
        "async",
        "async-cpu, from the reference's base model",
        RESULTS / "async/async-cpu/results.jsonl.gz",
        HERE / "async-cpu-same-base.jsonl.gz",
    ),
    (
        "async",
        "async-cpu, tiers",
        RESULTS / "async/async-cpu-tiers/results.jsonl.gz",
        HERE / "async-cpu-tiers.jsonl.gz",
    ),
    *(
        (
            "lora-aggregation",
            name,
            RESULTS / f"lora-aggregation/records/lora-aggregation-{name}/results.jsonl.gz",
            HERE / f"lora-aggregation-{name}.jsonl.gz",
        )
        for name in ("hetero-all", "potara-s012", "potara-s012-fedsvd16", "server-optimizers-s012")
    ),
    (
        "fedp2eft-xnli-cpu",
        "fedp2eft-xnli-cpu",
        RESULTS / "fedp2eft-xnli-cpu/records/fedp2eft-xnli-cpu.jsonl.gz",
        HERE / "fedp2eft-xnli-cpu.jsonl.gz",
    ),
    (
        "fedmosaic-text",
        "ablation",
        RESULTS / "fedmosaic-text/records/fedmosaic-text-ablation.jsonl.gz",
        HERE / "fedmosaic-text-ablation.jsonl.gz",
    ),
    ("flame", "flame-cpu-4", HERE / "flame-cpu-4-avx512.jsonl.gz", HERE / "flame-cpu-4.jsonl.gz"),
    (
        "async",
        "async-cpu, base.per_seed (both runs)",
        HERE / "async-cpu-per-seed-avx512.jsonl.gz",
        HERE / "async-cpu-per-seed.jsonl.gz",
    ),
]


def base_shift(reference: list[dict], rerun: list[dict]) -> str:
    """The largest move of the ``base`` row's ``Mean`` over the tables, x100 (``—`` without a base row)."""
    moves = [
        abs(other.cells[BASE_METHOD, MEAN_COLUMN].mean - table.cells[BASE_METHOD, MEAN_COLUMN].mean)
        for table, other in paired_tables(reference, rerun)
        if (BASE_METHOD, MEAN_COLUMN) in table.cells and (BASE_METHOD, MEAN_COLUMN) in other.cells
    ]
    return f"{max(moves) * 100:.2f}" if moves else "—"


def row(page: str, run: str, reference_path: Path, rerun_path: Path) -> list[str]:
    before, after = read_jsonl(reference_path), read_jsonl(rerun_path)
    reference, rerun = final_results(before), final_results(after)
    found = compare_results(reference, rerun, round_records(before), round_records(after))
    shift = found.shift
    supported = [v for v in found.verdicts if v.status in ("holds", "lost", "reversed")]
    failed = [v.margin for v in supported if v.status != "holds"]
    clear = [v for v in supported if v.margin >= 2]
    sd = "—" if shift.seed_sd is None else f"{shift.seed_sd * 100:.2f}"
    return [
        page,
        run,
        f"{shift.identical} / {shift.matched}",
        f"{shift.median * 100:.2f} / {shift.largest * 100:.2f}",
        f"{shift.cell_median * 100:.2f} / {shift.cell_largest * 100:.2f} ({sd})",
        base_shift(reference, rerun),
        f"{found.count('holds')} / {len(supported)}",
        f"{found.count('lost')} / {found.count('reversed')} / {found.count('new')}",
        "—" if not failed else f"{max(failed):.2f}",
        "—" if not clear else f"{sum(v.status == 'holds' for v in clear)} / {len(clear)}",
        f"{statistics.median(v.margin for v in supported):.2f}" if supported else "—",
    ]


HEADER = [
    "page",
    "run",
    "records identical",
    "record move, median / largest",
    "`Mean` cells moved, median / largest (seed SD)",
    "`base` moved",
    "supported differences held",
    "lost / reversed / new",
    "lost within (half-widths)",
    "held of those ≥ 2 half-widths",
    "median margin of the supported",
]


def main() -> None:
    rows = [row(*entry) for entry in RUNS if entry[2].is_file() and entry[3].is_file()]
    missing = [entry[1] for entry in RUNS if not (entry[2].is_file() and entry[3].is_file())]
    print("| " + " | ".join(HEADER) + " |")
    print("|" + "---|" * len(HEADER))
    for cells in rows:
        print("| " + " | ".join(cells) + " |")
    if missing:
        print(f"\nnot found: {', '.join(missing)}", file=sys.stderr)


if __name__ == "__main__":
    main()
