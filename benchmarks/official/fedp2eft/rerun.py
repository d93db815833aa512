"""Rerunning steps of a finished ``compare.py run`` folder as a variant: their own commands, changed.

A variant (``psg_float32.py``, ``head_variant.py``) takes each step's command from its log, changes it (a patched
copy of their code, the variant's model folder, the step's name, more arguments) and runs it under ``measure.py``
into a folder of its own, skipping the steps whose outputs are there already.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import compare

HERE = Path(__file__).resolve().parent


def their_command(log: Path) -> list[str]:
    """The command line a step's log starts with (``Command ran: ...``), as its words."""
    for line in log.read_text(errors="replace").splitlines():
        if "Command ran: " in line:
            return line.split("Command ran: ", 1)[1].split()
    raise SystemExit(f"{log} does not say the command it ran; rerun that step with compare.py first")


def replaced(words: list[str], pairs: list[tuple[str, str]]) -> list[str]:
    """Each of a command's ``words`` with every ``(old, new)`` of ``pairs`` replaced, in their order."""
    out = []
    for word in words:
        for old, new in pairs:
            word = word.replace(old, new)
        out.append(word)
    return out


def patched_copy(source: Path, copy: Path, patch: Path) -> Path:
    """``copy``: their code at ``source`` with ``patch`` applied (made once; kept for the variant's later steps)."""
    if not copy.exists():
        shutil.copytree(source, copy, symlinks=True)
        subprocess.run(["git", "-C", str(copy), "apply", str(patch)], check=True)
    return copy


def rerun_steps(
    run: Path, out: Path, steps: Iterable[str], prefix: str, python: Path, change: Callable[[list[str]], list[str]]
) -> None:
    """Run each of ``steps`` (the authors' step names in ``run``) again as ``<prefix>-...`` into ``out/authors``,
    its command ``change``d, unless its outputs (results, or a federated step's last PSG) are there."""
    authors, logs = out / "authors", out / "logs"
    (authors / "models").mkdir(parents=True, exist_ok=True)
    for step in steps:
        name = step.replace("authors-", f"{prefix}-", 1)
        if compare.results_of(authors, name) or (authors / "models" / name / "weights_round_60.pkl").exists():
            print(f"[skip] {name}: its outputs exist")
            continue
        command = [str(python), *change(their_command(run / "logs" / f"{step}.log"))]
        print(f"[run ] {name}", flush=True)
        record = compare.measured(out, name, command, authors, compare.OFFLINE_ENV)
        print(f"       {record.get('wall_s')} s, exit {record.get('returncode')}", flush=True)
        (logs / f"{name}.record.json").write_text(json.dumps(record, indent=1) + "\n")


def compare_cells(
    run: Path,
    out: Path,
    prefix: str,
    methods: tuple[str, str],
    seeds: tuple[int, int],
    cells: Iterable[str],
    keys: tuple[str, str, str],
) -> list[dict]:
    """Per cell (``r2-seen``, ...) the paired differences, client by client, between the variant, their unchanged
    pipeline and fedpeft: ``keys`` name variant - unchanged, fedpeft - variant and fedpeft - unchanged.
    ``methods``: their steps' method name and fedpeft's; ``seeds``: theirs and fedpeft's."""
    return compare_pooled(run, [(*seeds, out)], prefix, methods, cells, keys)


def compare_pooled(
    run: Path,
    pairs: Sequence[tuple[int, int, Path]],
    prefix: str,
    methods: tuple[str, str],
    cells: Iterable[str],
    keys: tuple[str, str, str],
) -> list[dict]:
    """:func:`compare_cells` over several seed pairs, ``(their seed, fedpeft's seed, the variant's folder)`` each:
    a client's value is its mean over the pairs both sides of a difference have."""
    import comparison

    theirs_name, ours_name = methods
    clients = json.loads((run / "federation" / "clients.json").read_text())
    fedpeft_seeds = [fedpeft_seed for _, fedpeft_seed, _ in pairs]
    records = [
        record
        for seed in fedpeft_seeds
        for record in compare.read_jsonl(run / "fedpeft" / ours_name / f"seed{seed}" / "results.jsonl")
    ]
    rows = []
    for cell in cells:
        budget, pool = int(cell.split("-")[0].removeprefix("r")), cell.split("-")[1]
        ours = comparison.fedpeft_values(records, ours_name, pool, budget, fedpeft_seeds)
        unchanged, changed = {}, {}
        for position, (seed, _, out) in enumerate(pairs):
            unchanged[position] = compare.results_of(run / "authors", f"authors-{theirs_name}-s{seed}-{cell}")
            changed[position] = compare.results_of(out / "authors", f"{prefix}-{theirs_name}-s{seed}-{cell}")
        theirs = comparison.authors_values(unchanged, clients)
        variant = comparison.authors_values(changed, clients)
        rows.append(
            {
                "pool": pool,
                "budget": budget,
                keys[0]: comparison.compare_accuracies(variant, theirs),
                keys[1]: comparison.compare_accuracies(ours, variant),
                keys[2]: comparison.compare_accuracies(ours, theirs),
            }
        )
    return rows


def write_table(path: Path, result: dict, keys: tuple[str, str, str], headers: tuple[str, str, str]) -> None:
    """Write ``result`` to ``path`` and print its rows as a Markdown table, one column per key of ``keys``."""
    import comparison

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1) + "\n")
    print("| pool | r | " + " | ".join(headers) + " |")
    print("|---|---|---|---|---|")
    for row in result["rows"]:
        cells = [comparison.format_difference(row[key]) for key in keys]
        print(f"| {row['pool']} | {row['budget']} | " + " | ".join(cells) + " |")


def variant_arguments(parser: argparse.ArgumentParser, default_out: Path) -> None:
    """The options every variant takes: the run folder, its own folder, the seed pair, the cells, the work folder."""
    parser.add_argument("--run", type=Path, required=True, help="a compare.py run folder")
    parser.add_argument("--out", type=Path, default=default_out)
    parser.add_argument("--position", type=int, default=0, help="which seed pair (0: their 42, fedpeft's first)")
    parser.add_argument("--cells", nargs="+", default=["r2-seen"], help="personalization steps, e.g. r2-seen")
    parser.add_argument("--work", type=Path, default=HERE / ".work", help="setup.sh's work folder")
    parser.add_argument("--report-only", action="store_true", help="only compare what has run")
