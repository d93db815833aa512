"""FedP2EFT's PSG trained federatedly in float32 and in bfloat16: does it learn client-specific scales?

The authors' client moves the PSG to bfloat16 before its first use and trains it there (royson/fedp2eft,
``src/apps/clients/fedp2eft_seqcls_client.py``); fedpeft trains it in float32. This runs fedpeft's own PSG
(:class:`fedpeft.adapters.psg.StrategyGenerator`, its initialization and :func:`regress_toward`, stage 2) through
the same federated schedule in each dtype: every round ``--per-round`` clients start from the global PSG (cast to
the dtype), take ``--steps`` Adam steps at ``--lr`` toward their own target scales, and the server averages their
parameters in float32 (as their server does on numpy arrays).

The clients are stand-ins, the same for both dtypes: statistics (2L values, positive, of order 1) and target scales
(L x r, a pattern shared by all clients times a client's own factors, a fixed function of its statistics, so a PSG
can learn them and the structures differ between clients) from
``--seed``. The shape is their tiny BERT's: L = 14 adapted modules, r = 32, so the PSG is 28 -> 56 -> 448.

Reported per dtype, after the last round: the share of parameters whose magnitude stopped within one bfloat16
spacing of 2^-5 = 0.03125 (where an Adam step of 1e-4 is less than half a spacing and rounds away), the spread of
one client's scales over modules and ranks (its standard deviation), the distance to the targets, and how many
distinct rank structures the clients get at budget r (each module's ranks kept by the largest scales, as
fedpeft's pruning ranks them) and how many clients' scales tie at the cut.

Usage: python benchmarks/psg_precision.py [--rounds 60] [--clients 84] [--per-round 9] [--steps 10] [--lr 1e-4]
       [--budget 2] [--seed 0] [--out benchmarks/results/psg_precision.json] [--quick]

``--quick``: 6 rounds of 3 clients out of 12: checks that it runs.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
from pathlib import Path

import torch

from fedpeft.adapters.psg import make_generator, regress_toward

MODULES, RANK = 14, 32
CAP = 2.0**-5


def stand_in_clients(count: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Statistics (count x 2L) and target scales (count x L x r) of ``count`` clients."""
    generator = torch.Generator().manual_seed(seed)
    stats = 0.5 + torch.rand(count, 2 * MODULES, generator=generator)
    shared = torch.exp(0.5 * torch.randn(MODULES, RANK, generator=generator))
    # a client's own factors follow its statistics (a fixed random map), so a PSG can learn them
    mixing = torch.randn(2 * MODULES, MODULES * RANK, generator=generator) / (2 * MODULES) ** 0.5
    own = torch.exp((stats - stats.mean(0)) @ mixing * 2.0).reshape(count, MODULES, RANK)
    return stats, shared * own


def structures(scales: torch.Tensor, budget: int) -> tuple[set[tuple], int]:
    """The distinct rank structures at ``budget`` ranks a module (the largest scales of each module's row), and
    how many clients have a tie at the cut (the budget-th and the next scale equal in some module)."""
    found, ties = set(), 0
    for client in scales:
        ordered = client.float().sort(dim=1, descending=True)
        found.add(tuple(tuple(sorted(row[:budget].tolist())) for row in ordered.indices))
        ties += int((ordered.values[:, budget - 1] == ordered.values[:, budget]).any())
    return found, ties


def train(dtype: torch.dtype, args: argparse.Namespace, stats: torch.Tensor, targets: torch.Tensor) -> dict:
    """The federated PSG training in ``dtype``; its state and what it gives every client after the last round."""
    global_state = {k: v.float() for k, v in make_generator(MODULES, RANK, seed=args.seed).state_dict().items()}
    sampler = torch.Generator().manual_seed(args.seed + 1)
    losses = []
    for _ in range(args.rounds):
        chosen = torch.randperm(len(stats), generator=sampler)[: args.per_round].tolist()
        states = []
        for client in chosen:
            model = make_generator(MODULES, RANK, seed=args.seed, state=global_state).to(dtype)
            _, after = regress_toward(
                model, stats[client : client + 1].to(dtype), targets[client], steps=args.steps, lr=args.lr
            )
            losses.append(after / targets[client].numel())
            states.append({k: v.float() for k, v in model.state_dict().items()})
        global_state = {k: torch.stack([s[k] for s in states]).mean(0) for k in global_state}
    model = make_generator(MODULES, RANK, seed=args.seed, state=global_state).to(dtype)
    with torch.no_grad():
        scales = torch.stack([model.scales(stats[i : i + 1].to(dtype)).float() for i in range(len(stats))])
    flat = torch.cat([v.flatten() for v in global_state.values()]).abs()
    spacing = 2.0**-12  # bfloat16's spacing in [2^-5, 2^-4)
    found, ties = structures(scales, args.budget)
    return {
        "dtype": str(dtype).removeprefix("torch."),
        "parameters": flat.numel(),
        "at_cap_share": float(((flat - CAP).abs() <= spacing).float().mean()),
        "largest_parameter": float(flat.max()),
        "scale_spread": statistics.fmean(float(s.std()) for s in scales),
        "mean_scale": float(scales.mean()),
        "mean_abs_error": float((scales - targets.clamp(1e-4, 1000)).abs().mean()),
        "last_round_loss": statistics.fmean(losses[-args.per_round :]),
        "structures": len(found),
        "clients_tied_at_cut": ties,
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--clients", type=int, default=84)
    parser.add_argument("--per-round", type=int, default=9)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--budget", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/psg_precision.json"))
    parser.add_argument("--quick", action="store_true", help="6 rounds of 3 clients out of 12")
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.clients, args.per_round = 6, 12, 3
    torch.set_num_threads(1)
    stats, targets = stand_in_clients(args.clients, args.seed)
    rows = [train(dtype, args, stats, targets) for dtype in (torch.float32, torch.bfloat16)]
    result = {
        "shape": {"modules": MODULES, "rank": RANK, "psg": f"{2 * MODULES} -> {4 * MODULES} -> {MODULES * RANK}"},
        "settings": {k: v for k, v in vars(args).items() if k not in ("out", "quick")},
        "quick": args.quick,
        "torch": torch.__version__,
        "machine": platform.processor() or platform.machine(),
        "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(
        "| dtype | parameters at 2^-5 | largest parameter | scale spread | mean scale | mean abs error "
        f"| structures at r = {args.budget} | clients tied at the cut |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['dtype']} | {r['at_cap_share']:.1%} | {r['largest_parameter']:.5f} | {r['scale_spread']:.4f} | "
            f"{r['mean_scale']:.4f} | {r['mean_abs_error']:.4f} | {r['structures']} of {args.clients} | "
            f"{r['clients_tied_at_cut']} |"
        )
    return result


if __name__ == "__main__":
    main()
