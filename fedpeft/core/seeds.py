"""The one way fedpeft derives seeds: a stable hash of a base seed and the keys of one random draw.

Every random draw of a run comes from ``derive_seed(seed, *keys)`` with keys that name it (method, phase, round,
client), so the same draw gets the same seed in every process, on every engine and after a resume.

Data generation derives its seeds with the hash it was introduced with (``stream``), so that the generated
benchmarks, their cache files and every number recorded on them stay exactly as they are:

- ``"run"`` (default): blake2b, 31 bits, for training, sampling and initialization;
- ``"synthetic"``: sha256, 32 bits, for the synthetic benchmarks;
- ``"files"``: crc32, for splits and samples of real datasets read from files.
"""

from __future__ import annotations

import hashlib
import zlib
from typing import Literal

SeedStream = Literal["run", "synthetic", "files"]


def derive_seed(seed: int | str, *keys: object, stream: SeedStream = "run") -> int:
    """A seed determined by ``seed`` and ``keys`` (stable across processes, unlike ``hash``).

    Args:
        seed: the base seed (or, for ``files``, the first key).
        keys: what the draw is for (purpose, round, client id, ...).
        stream: which family of draws this seed belongs to (see the module docstring).

    Returns:
        A non-negative int below 2**31 - 1 (``run``) or 2**32 (``synthetic``, ``files``).
    """
    text = "|".join(str(part) for part in (seed, *keys)).encode("utf-8")
    if stream == "run":
        return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little") % (2**31 - 1)
    if stream == "synthetic":
        return int.from_bytes(hashlib.sha256(text).digest()[:4], "little")
    return zlib.crc32(text)


def client_seed(seed: int, method: str, phase: str, round_: int | str | None, client_id: str) -> int:
    """The seed of one client's work in one round (or, with a budget in place of the round, personalization)."""
    return derive_seed(seed, method, phase, round_, client_id)
