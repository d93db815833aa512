"""Client-level differential privacy of a weighted-mean server step (DP-FedAvg) and its privacy accounting.

DP-FedAvg (H. B. McMahan, D. Ramage, K. Talwar, L. Zhang, "Learning Differentially Private Recurrent Language
Models", ICLR 2018) with fixed uniform weights: each sampled client's update ``delta_k = u_k - g`` is clipped to
L2 norm C (all its tensors together), and the server releases

    g' = g + (sum_k clip_C(delta_k) + N(0, (z C)^2 I)) / m

where m is the fixed number of clients sampled per round (a client that fails still counts in m, so one client
changes the sum by at most C whatever happens). The privacy loss (epsilon at a given delta) of ``rounds`` such
releases is computed by the RDP accountant of Google's ``dp-accounting`` library, for a Poisson-sampled Gaussian
mechanism with noise multiplier z and sampling rate q = m / (clients in the pool), self-composed over the rounds.
fedpeft samples exactly m clients without replacement; accounting for that draw as Poisson sampling at rate q is
the usual approximation of DP-FedAvg practice.

:class:`DifferentialPrivacy` is the release as a part of a method's server step
(:mod:`fedpeft.merging.server_step`). See docs/privacy.md.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import secrets
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager

import torch

from fedpeft.core.errors import UserError
from fedpeft.core.seeds import derive_seed
from fedpeft.core.types import ClientUpdate, ServerState, StateDict
from fedpeft.merging.robust import apply_deltas, clip_update, deltas, union_keys
from fedpeft.merging.server_step import ServerStep, StepResult, float_uploads
from fedpeft.settings.server import DPConfig

_EXACT = torch.float64


def noise_generator(seed: int | None, round_: int) -> torch.Generator:
    """The generator of round ``round_``'s noise: seeded from ``derive_seed(seed, "dp", round_)``, or from the
    operating system's entropy when ``seed`` is None."""
    generator = torch.Generator()
    generator.manual_seed(derive_seed(seed, "dp", round_) if seed is not None else secrets.randbits(63))
    return generator


def dp_mean(
    states: Sequence[Mapping[str, torch.Tensor]],
    reference: Mapping[str, torch.Tensor],
    cfg: DPConfig,
    sampled: int,
    generator: torch.Generator,
) -> tuple[StateDict, float]:
    """The DP-FedAvg release ``g + (sum_k clip_C(delta_k) + N(0, (z C)^2 I)) / m``.

    Args:
        states: the uploads of the clients that answered (the same keys each; at most ``sampled`` of them).
        reference: the global tensors g the clients started from.
        cfg: C, z.
        sampled: m, the fixed number of clients sampled in the round.
        generator: the source of the noise (CPU), e.g. :func:`noise_generator`.

    Returns:
        The new global tensors (each upload's dtype) and the fraction of updates that were clipped.
    """
    if not states or sampled < len(states):
        raise ValueError(f"{len(states)} updates from {sampled} sampled clients")
    keys = union_keys(states)
    if any(set(state) != set(keys) for state in states):
        # Which tensors are released would then depend on which clients were sampled, outside the guarantee.
        raise UserError("`dp` needs every client to upload the same tensors, and this method's uploads differ.")
    clipped = [clip_update(d, cfg.clip_norm) for d in deltas(states, reference)]
    std = cfg.noise_std
    release = {}
    for key in sorted(keys):  # a fixed order of noise draws
        total = torch.stack([d[key] for d, _ in clipped]).sum(dim=0)
        if std > 0:
            noise = torch.normal(0.0, std, size=tuple(total.shape), generator=generator, dtype=_EXACT)
            total = total + noise.to(total.device)
        release[key] = total / sampled
    fraction = sum(was for _, was in clipped) / len(clipped)
    return apply_deltas(reference, {k: release[k] for k in keys}, states), fraction


@dataclasses.dataclass(frozen=True)
class DifferentialPrivacy:
    """A server step whose float tensors are the DP-FedAvg release (:func:`dp_mean`) of the updates relative to
    ``state.tensors`` instead of the mean ``inner`` gives; the other tensors, the metrics and the moments are
    ``inner``'s, the metrics plus ``dp_clipped_fraction``. Holds the round's uploads.

    Attributes:
        inner: the step whose mean the release replaces.
        cfg: C, z and the noise's seed (round r's noise: :func:`noise_generator` of ``state.round``).
        clients_per_round: m of a round, from the round (``Method.clients_per_round``); ``None`` (no bound pool):
            the number of updates.
    """

    inner: ServerStep
    cfg: DPConfig
    clients_per_round: Callable[[int], int | None]

    def __call__(self, state: ServerState, updates: Iterable[ClientUpdate]) -> StepResult:
        received = list(updates)
        mean = self.inner(state, iter(received))
        if not mean.tensors:
            return mean
        sampled = self.clients_per_round(state.round) or len(received)
        generator = noise_generator(self.cfg.seed, state.round)
        released, clipped = dp_mean(float_uploads(received), state.tensors, self.cfg, sampled, generator)
        return StepResult({**mean.tensors, **released}, {**mean.metrics, "dp_clipped_fraction": clipped}, mean.moments)


@contextmanager
def _quiet_absl() -> Iterator[None]:
    # The RDP accountant logs a warning for every fractional order its series does not converge at (it then
    # leaves that order out); those orders never give the minimum here, so the warnings say nothing.
    logger = logging.getLogger("absl")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def epsilon(noise_multiplier: float, sample_rate: float, rounds: int, delta: float) -> float:
    """Epsilon at ``delta`` of ``rounds`` Poisson-sampled Gaussian releases, by ``dp-accounting``'s RDP accountant.

    Args:
        noise_multiplier: z (noise standard deviation over the sensitivity C).
        sample_rate: q in (0, 1], the probability that a client takes part in a round.
        rounds: releases so far (0 gives 0).
        delta: in (0, 1).

    Returns:
        Epsilon (``inf`` when z = 0).
    """
    if not 0 < sample_rate <= 1:
        raise ValueError(f"sample_rate must be in (0, 1], not {sample_rate}")
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), not {delta}")
    if noise_multiplier < 0 or rounds < 0:
        raise ValueError("noise_multiplier and rounds must be 0 or more")
    if rounds == 0:
        return 0.0
    if noise_multiplier == 0:
        return math.inf
    import dp_accounting
    from dp_accounting import rdp

    event = dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(sample_rate, dp_accounting.GaussianDpEvent(noise_multiplier)), rounds
    )
    accountant = rdp.RdpAccountant()
    with _quiet_absl():
        accountant.compose(event)
        return float(accountant.get_epsilon(delta))
