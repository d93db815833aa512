"""FedP2EFT's two federated protocols on ``fedp2eft-xnli-cpu`` (docs/results/fedp2eft-xnli-cpu.md).

Four probes:

1. ``tables``: the page's condensed tables from two runs of the preset, one with the current defaults (official
   protocol: stage 1 two epochs, stage 2 ten steps of the summed L1 loss) and one with the earlier protocol as a
   ``fedp2eft-old`` entry (``stage1_steps: 10, psg_steps: 5, psg_loss: mean``). Mean ± SD over seeds and Wins per
   pool and budget, computed by :func:`fedpeft.report.tables.group_table`, the function behind every run's
   ``summary.md``; the old-versus-official table uses only the seeds both runs completed, and its Wins are the
   languages where each protocol is the better of the two. A run still going is read from its completed units
   (``parts/``).
2. ``scales``: how much the saved rank scales differ between clients (clamped, per seed) and how many distinct
   pruned structures they give at r = 2 and 16, with the ranks per module type.
3. ``psg``: the trained PSGs' hidden layer on the seen clients' statistics (kept in the federated checkpoints):
   how many of its ReLU units are active for at least one client. With none, the PSG outputs its output bias
   for every client: one rank structure for all.
4. ``adam-eps``: one Adam step of stage 2 on a fresh PSG of the tiny BERT's size (L = 12, r_init = 32) at the
   preset's ``psg_lr``, with the mean and with the summed loss: the gradient of each layer against Adam's eps.
5. ``psg-lr``: the main table with FedP2EFT trained at the paper's ``psg_lr`` (1e-4, from the runs given after
   the first: their ``fedp2eft`` records, seeds joined) beside the first run's FedP2EFT at 0.01 and its baselines;
   Wins among LoRA, BayesTune-LoRA and FedP2EFT at 1e-4.

Usage:
  python benchmarks/fedp2eft_protocols.py tables runs/fedp2eft-xnli-cpu-official runs/fedp2eft-xnli-cpu-oldprotocol
  python benchmarks/fedp2eft_protocols.py scales runs/fedp2eft-xnli-cpu runs/fedp2eft-xnli-cpu-variants
  python benchmarks/fedp2eft_protocols.py psg runs/fedp2eft-xnli-cpu runs/fedp2eft-xnli-cpu-variants
  python benchmarks/fedp2eft_protocols.py adam-eps
  python benchmarks/fedp2eft_protocols.py psg-lr runs/fedp2eft-xnli-cpu-official runs/fedp2eft-psg-lr-probe \
      runs/fedp2eft-xnli-cpu-psglr
  python benchmarks/fedp2eft_protocols.py --quick    # every probe on a tiny run of smoke made here
"""

from __future__ import annotations

import argparse
import json
import tempfile
from collections import defaultdict
from pathlib import Path

import torch

from fedpeft.adapters.bayestune import SCALE_MAX, SCALE_MIN, prune_to_budget
from fedpeft.adapters.psg import make_generator, regression_loss
from fedpeft.analysis.scales import module_layout, read_scales
from fedpeft.core.checkpoints import load_checkpoint
from fedpeft.core.stores import MemoryStore
from fedpeft.methods.fedp2eft import psg_path
from fedpeft.report.records import read_records
from fedpeft.report.tables import MEAN_COLUMN, format_cell, group_table

BUDGETS = (2, 4, 8, 16)
METHODS = ("lora", "bayestune_lora", "fedp2eft")
OLD = "fedp2eft-old"


def run_records(run: Path) -> list[dict]:
    """A run's result records; for a run still going, those of its completed units."""
    if (run / "results.jsonl").is_file():
        return read_records([run])[0]
    lines = [line for part in sorted((run / "parts").glob("*.jsonl")) for line in part.read_text().splitlines()]
    return [record for record in map(json.loads, lines) if "_cost" not in record]


def seeds_of(records: list[dict], method: str) -> list[int]:
    return sorted({r["seed"] for r in records if r["method"] == method})


def main_table(records: list[dict]) -> None:
    records = [r for r in records if r["method"] in ("base", *METHODS)]
    print("seeds:", {m: seeds_of(records, m) for m in ("base", *METHODS)})
    print("| Pool | r | base | lora | bayestune_lora | fedp2eft | Wins lora / bayestune / fedp2eft |")
    print("|---|---|---|---|---|---|---|")
    for pool in ("seen", "unseen"):
        for budget in BUDGETS:
            table = group_table(records, pool=pool, metric="accuracy", budget=budget)
            base = table.cells.get(("base", MEAN_COLUMN))
            cells = [f"{base.mean * 100:.2f}" if base else "—"]
            for method in METHODS:
                text = format_cell(table.cells.get((method, MEAN_COLUMN)))
                cells.append(f"**{text}**" if method in table.best[MEAN_COLUMN] else text)
            wins = " / ".join(str(table.wins.get(m, "—")) for m in METHODS)
            print(f"| {pool} | {budget} | {' | '.join(cells)} | {wins} |")


def versus_table(official: list[dict], old: list[dict]) -> None:
    common = set(seeds_of(official, "fedp2eft")) & set(seeds_of(old, OLD))
    pair = [r for r in official + old if r["method"] in ("fedp2eft", OLD) and r["seed"] in common]
    lora = [r for r in official if r["method"] == "lora" and r["seed"] in common]
    print("seeds both runs completed:", sorted(common))
    if not common:
        return
    header = ["Pool", "r", "fedp2eft, old protocol", "fedp2eft, official protocol", "official - old", "lora"]
    print("| " + " | ".join([*header, "Wins old / official"]) + " |")
    print("|---|---|---|---|---|---|---|")
    for pool in ("seen", "unseen"):
        for budget in BUDGETS:
            table = group_table(pair, pool=pool, metric="accuracy", budget=budget)
            lora_cell = group_table(lora, pool=pool, metric="accuracy", budget=budget).cells.get(("lora", MEAN_COLUMN))
            before, after = table.cells[OLD, MEAN_COLUMN], table.cells["fedp2eft", MEAN_COLUMN]
            print(
                f"| {pool} | {budget} | {format_cell(before)} | {format_cell(after)} | "
                f"{(after.mean - before.mean) * 100:+.2f} | {format_cell(lora_cell)} | "
                f"{table.wins[OLD]} / {table.wins['fedp2eft']} |"
            )


PAPER_LR = "fedp2eft-psg-lr-1e-4"


def psg_lr_table(official_run: Path, paper_runs: list[Path]) -> None:
    official = [r for r in run_records(official_run) if r["method"] in ("base", *METHODS)]
    paper = [dict(r, method=PAPER_LR) for run in paper_runs for r in run_records(run) if r["method"] == "fedp2eft"]
    seeds = set(seeds_of(paper, PAPER_LR))
    official = [r for r in official if r["seed"] in seeds]
    compared = [r for r in official if r["method"] != "fedp2eft"] + paper
    methods = ("lora", "bayestune_lora", PAPER_LR)
    print("seeds:", sorted(seeds), {m: seeds_of(official + paper, m) for m in ("base", *METHODS, PAPER_LR)})
    print(
        "| Pool | r | base | lora | bayestune_lora | fedp2eft, psg_lr 0.01 | fedp2eft, psg_lr 1e-4 | Wins lora / "
        "bayestune / fedp2eft 1e-4 |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for pool in ("seen", "unseen"):
        for budget in BUDGETS:
            table = group_table(compared, pool=pool, metric="accuracy", budget=budget)
            raised = group_table(official, pool=pool, metric="accuracy", budget=budget)
            base = table.cells.get(("base", MEAN_COLUMN))
            cells = [f"{base.mean * 100:.2f}" if base else "—"]
            for method in methods:
                text = format_cell(table.cells.get((method, MEAN_COLUMN)))
                cells.append(f"**{text}**" if method in table.best[MEAN_COLUMN] else text)
            cells.insert(3, format_cell(raised.cells.get(("fedp2eft", MEAN_COLUMN))))
            wins = " / ".join(str(table.wins.get(m, "—")) for m in methods)
            print(f"| {pool} | {budget} | {' | '.join(cells)} | {wins} |")


def tables(official_run: Path, old_run: Path) -> None:
    official, old = run_records(official_run), run_records(old_run)
    print(f"## {official_run}")
    main_table(official)
    print(f"\n## {old_run} against {official_run}")
    versus_table(official, old)


def scales(runs: list[Path]) -> None:
    for run in runs:
        by_method = defaultdict(list)
        for record in read_scales(run):
            by_method[record.method].append(record)
        for method, records in sorted(by_method.items()):
            for seed in sorted({r.seed for r in records}):
                mine = [r for r in records if r.seed == seed]
                scales = [torch.from_numpy(r.scales).clamp(SCALE_MIN, SCALE_MAX) for r in mine]
                values = torch.stack(scales)  # (clients, L, r_init)
                relative_sd = (values.std(0) / values.mean(0)).mean()
                print(
                    f"{run.name} {method} seed {seed}: {len(mine)} clients, clamped scales in "
                    f"[{values.min():.4g}, {values.max():.4g}], mean {values.mean():.4g}; "
                    f"SD across clients / mean, averaged over the scales: {relative_sd:.3g}"
                )
                for budget in (2, 16):
                    structures, kinds = set(), defaultdict(float)
                    for r in mine:
                        kept = prune_to_budget(dict(zip(r.modules, torch.from_numpy(r.scales), strict=True)), budget)
                        structures.add(tuple(sorted((name, tuple(idx.tolist())) for name, idx in kept.items())))
                        for name, idx in kept.items():
                            kinds[module_layout(name)[1]] += idx.numel() / len(mine)
                    ranks = ", ".join(f"{kind} {count:.1f}" for kind, count in sorted(kinds.items()))
                    print(f"  r = {budget}: {len(structures)} distinct structures; ranks per client by type: {ranks}")


def seen_statistics(checkpoint: Path) -> torch.Tensor:
    """The seen clients' statistics from a federated checkpoint's client-state store, one row per client: the
    store's versions kept in the checkpoint, or, for a run that kept client states on disk, in the files of
    ``client_state/<label>/seed<seed>`` (where the worker keeps them)."""
    run, label, seed = checkpoint.parents[2], checkpoint.parent.name, checkpoint.stem
    store = MemoryStore(run / "client_state" / label / seed)
    store.restore(load_checkpoint(checkpoint)["store"])
    # Each client's entries are (round, state) pairs; the statistics never change (the base model is frozen).
    return torch.stack([entries[-1][1]["statistics"] for entries in store.snapshot().values()])


def psg_units(runs: list[Path]) -> None:
    from safetensors.torch import load_file

    for run in runs:
        for checkpoint in sorted((run / "checkpoints").glob("*/seed*.safetensors")):
            label, seed = checkpoint.parent.name, int(checkpoint.stem.removeprefix("seed"))
            weights = psg_path(run, label, seed)
            if not weights.is_file():  # its federated phase is still going
                continue
            statistics, psg = seen_statistics(checkpoint), load_file(weights)
            hidden = statistics @ psg["hidden.weight"].T + psg["hidden.bias"]
            active = int((hidden > 0).any(0).sum())
            print(
                f"{run.name} {label} seed {seed}: {active} of {hidden.shape[1]} hidden units active for at least one "
                f"of {len(statistics)} seen clients (largest pre-activation {float(hidden.max()):.3g}); "
                f"output bias mean {float(psg['output.bias'].mean()):.3g}"
            )


def adam_eps(psg_lr: float = 0.01) -> None:
    generator = make_generator(12, 32, seed=0)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        # LayerNorm-like statistics (means near 0, SDs near 1) and scales of the size stage 1 reaches.
        statistics = torch.stack([torch.randn(12) * 0.05, 1 + 0.5 * torch.rand(12)], dim=1).reshape(-1)
        target = 0.03 + 0.01 * torch.rand(12, 32)
    initial = {k: v.detach().clone() for k, v in generator.state_dict().items()}
    for reduction in ("mean", "sum"):
        generator.load_state_dict(initial)
        generator.zero_grad()
        regression_loss(generator.scales(statistics), target, reduction).backward()
        gradients = {k: float(p.grad.abs().median()) for k, p in generator.named_parameters()}
        torch.optim.Adam(generator.parameters(), lr=psg_lr).step()
        steps = {k: float((v - initial[k]).abs().mean()) for k, v in generator.state_dict().items()}
        for name in gradients:
            print(
                f"{reduction:4s} {name:14s} median |gradient| {gradients[name]:.2e}  "
                f"mean |first Adam step| {steps[name]:.2e} (lr {psg_lr})"
            )


QUICK = [
    "seeds=[0]",
    # one seen and one unseen client per language, 8 training and 4 test rows each, a base stage of 100 rows
    "data.groups=[lat1, lat4]",
    "data.clients_per_group=1",
    "data.train_per_group=16",
    "data.test_per_group=8",
    "data.base_samples=100",
    f"budgets={list(BUDGETS)}",
    "output.plots=false",
    "methods=[{name: lora, lr: 0.005, epochs: 1}, "
    "{name: bayestune_lora, r_max: 16, r_init: 16, stage1_epochs: 1, lr: 0.005, finetune_epochs: 1}, "
    "{name: fedp2eft, rounds: 1, fraction: 1.0, r_max: 16, r_init: 16, stage1_steps: 2, psg_steps: 2, lr: 0.005, "
    "finetune_epochs: 1}, "
    f"{{name: fedp2eft, label: {OLD}, rounds: 1, fraction: 1.0, r_max: 16, r_init: 16, stage1_steps: 2, "
    "psg_steps: 2, psg_loss: mean, lr: 0.005, finetune_epochs: 1}]",
]


def quick() -> None:
    """Every probe on one tiny run of smoke (its ``fedp2eft-old`` entry standing for the earlier protocol's run)."""
    from fedpeft.core.config import load_config
    from fedpeft.runner import Experiment

    with tempfile.TemporaryDirectory(prefix="fedp2eft-protocols-") as tmp:
        run = Path(tmp) / "run"
        Experiment(load_config("smoke", QUICK), run).run()
        tables(run, run)
        scales([run])
        psg_units([run])
        adam_eps()
        psg_lr_table(run, [run])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="every probe on a tiny run made here")
    sub = parser.add_subparsers(dest="probe")
    table_args = sub.add_parser("tables")
    table_args.add_argument("official", type=Path)
    table_args.add_argument("old", type=Path)
    scale_args = sub.add_parser("scales")
    scale_args.add_argument("runs", type=Path, nargs="+")
    psg_args = sub.add_parser("psg")
    psg_args.add_argument("runs", type=Path, nargs="+")
    sub.add_parser("adam-eps")
    lr_args = sub.add_parser("psg-lr")
    lr_args.add_argument("official", type=Path)
    lr_args.add_argument("paper", type=Path, nargs="+")
    args = parser.parse_args(argv)
    if args.quick:
        quick()
    elif args.probe is None:
        parser.error("name a probe (tables, scales, psg, adam-eps, psg-lr) or give --quick")
    elif args.probe == "tables":
        tables(args.official, args.old)
    elif args.probe == "scales":
        scales(args.runs)
    elif args.probe == "psg":
        psg_units(args.runs)
    elif args.probe == "psg-lr":
        psg_lr_table(args.official, args.paper)
    else:
        adam_eps()


if __name__ == "__main__":
    main()
