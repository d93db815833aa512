"""Which clients take part in a round."""

from __future__ import annotations

import math
import random

from fedpeft.core.seeds import derive_seed


def sample_clients(client_ids: list[str], fraction: float, min_clients: int, seed: int, round_: int) -> list[str]:
    """The clients of one round: ``max(min_clients, ceil(fraction * n))`` drawn without replacement, sorted."""
    ordered = sorted(client_ids)
    k = min(len(ordered), max(min_clients, math.ceil(fraction * len(ordered) - 1e-9)))
    chosen = random.Random(derive_seed(seed, "sample", round_)).sample(ordered, k)
    return sorted(chosen)
