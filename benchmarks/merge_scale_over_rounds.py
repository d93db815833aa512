"""Scale of the merged global update over rounds of hard initialization, per merge operator, space and alpha.

Under hard initialization every client starts a round from the global adapter and uploads it plus its own
update, so a summing operator (task arithmetic, Iso-C) sums the previous global K times. This simulation runs
that loop without a model: one LoRA module (64 x 64, rank 8), 10 clients whose round update is Gaussian noise
on the global factors (0.1 on B, 0.01 on A, seeded per client and round), merged for 20 rounds; it prints the
norm of the final global product s B_G A_G. The mean is the reference; an alpha whose norm is far above it makes
the global grow every round (and a model trained from it collapse), one far below it erases the updates.

Usage: python benchmarks/merge_scale_over_rounds.py [--rounds 20] [--out benchmarks/results/merge_scale.json] [--quick]
       (--quick: 3 rounds, alphas 0.5 and 1.0)
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from fedpeft.merging import MergeConfig, merge_lora_states

CLIENTS, WIDTH, RANK = 10, 64, 8
ALPHAS = (0.1, 0.2, 0.3, 0.5, 0.6, 0.7, 0.75, 0.8, 1.0)
A_KEY, B_KEY = "m.lora_A.weight", "m.lora_B.weight"


def final_norm(cfg: MergeConfig, rounds: int) -> float:
    """||s B_G A_G|| after ``rounds`` merges of clients that start from the global and add seeded noise."""
    torch.manual_seed(0)
    global_ = {A_KEY: torch.randn(RANK, WIDTH) / WIDTH**0.5, B_KEY: torch.zeros(WIDTH, RANK)}
    for round_ in range(rounds):
        uploads = []
        for client in range(CLIENTS):
            gen = torch.Generator().manual_seed(100 * round_ + client)
            uploads.append(
                {
                    A_KEY: global_[A_KEY] + 0.01 * torch.randn(RANK, WIDTH, generator=gen),
                    B_KEY: global_[B_KEY] + 0.1 * torch.randn(WIDTH, RANK, generator=gen),
                }
            )
        global_ = merge_lora_states(uploads, [1.0] * CLIENTS, cfg, scaling=2.0)
    return float(2.0 * (global_[B_KEY] @ global_[A_KEY]).norm())


def main(argv: list[str] | None = None) -> list[dict]:
    """Print (and optionally save) the final norms for the mean and the summing operators at several alphas."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--quick", action="store_true", help="3 rounds, alphas 0.5 and 1.0: checks that it runs")
    args = parser.parse_args(argv)
    alphas = (0.5, 1.0) if args.quick else ALPHAS
    if args.quick:
        args.rounds = 3
    torch.set_num_threads(1)
    rows = []
    for space in ("ab", "knots"):
        rows.append({"operator": "mean", "space": space, "alpha": 1.0})
        for operator in ("task_arithmetic", "iso_c"):
            for alpha in alphas:
                rows.append({"operator": operator, "space": space, "alpha": alpha})
    for row in rows:
        row["norm"] = final_norm(MergeConfig(**row), args.rounds)
        print(f"{row['operator']:>15} {row['space']:>5} alpha {row['alpha']:<5} ||Delta_G|| {row['norm']:.4g}")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"rounds": args.rounds, "clients": CLIENTS, "rows": rows}, indent=1) + "\n")
    return rows


if __name__ == "__main__":
    main()
