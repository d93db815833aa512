"""A dataset's memory, estimated from its settings before anything is generated.

The estimate is a deliberate lower bound: every example counts :data:`BYTES_PER_EXAMPLE` (a Python dict of short
strings takes more) and every client :data:`BYTES_PER_CLIENT`, with the per-group sizes counted once (not per group
or pool). A setting is refused only when even this lower bound exceeds the memory the system reports available
(``MemAvailable`` of ``/proc/meminfo``, else the free physical pages), so sizes that merely look large pass, and
the presets are orders of magnitude below it.
"""

from __future__ import annotations

import os
from typing import Any

from fedpeft.core.config import DataConfig
from fedpeft.core.errors import UserError

BYTES_PER_EXAMPLE = 256
BYTES_PER_CLIENT = 1024
EXAMPLE_KEYS = ("train_per_group", "test_per_group", "base_samples")
CLIENT_KEYS = ("clients_per_group",)
EXAMPLE_OPTIONS = ("samples_per_client",)
CLIENT_OPTIONS = ("num_clients",)


def available_memory() -> int | None:
    """Bytes of memory available to a new allocation, as the system reports it; ``None`` when unknown."""
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (OSError, ValueError, AttributeError):
        return None


def _count(value: Any) -> int:
    try:
        return max(int(value), 0)
    except (TypeError, ValueError, OverflowError):
        return 0


def estimate_bytes(cfg: DataConfig) -> dict[str, int]:
    """The lower-bound bytes each size setting of ``cfg`` stands for, by its config key."""
    sizes: dict[str, int] = {}
    for key in EXAMPLE_KEYS:
        sizes[f"data.{key}"] = _count(getattr(cfg, key)) * BYTES_PER_EXAMPLE
    for key in CLIENT_KEYS:
        sizes[f"data.{key}"] = _count(getattr(cfg, key)) * BYTES_PER_CLIENT
    for key in EXAMPLE_OPTIONS:
        sizes[f"data.options.{key}"] = _count(cfg.options.get(key)) * BYTES_PER_EXAMPLE
    for key in CLIENT_OPTIONS:
        sizes[f"data.options.{key}"] = _count(cfg.options.get(key)) * BYTES_PER_CLIENT
    return sizes


def check_fits_in_memory(cfg: DataConfig, available: int | None = None) -> None:
    """Raise a :class:`UserError` naming the largest size setting when the estimate of ``cfg``'s dataset exceeds
    the available memory (``available`` bytes; by default what the system reports)."""
    available = available_memory() if available is None else available
    if not available:
        return
    sizes = estimate_bytes(cfg)
    needed = sum(sizes.values())
    if needed <= available:
        return
    key = max(sizes, key=lambda k: sizes[k])
    value = cfg.options.get(key.rsplit(".", 1)[1]) if key.startswith("data.options.") else getattr(cfg, key[5:])
    gib = 1024**3
    raise UserError(
        f"{key}={value} cannot fit in memory: {cfg.name} would need at least {needed / gib:,.1f} GiB, and "
        f"{available / gib:,.1f} GiB are available; lower {key}."
    )
