"""A method's server step built from the parts its config names, in their order.

The config says which parts, innermost first (``MeanServerConfigMixin.server_step_parts``: the weighted mean, then
those of ``privacy``, ``robust``, ``staleness``, ``optimizer`` it sets); :func:`build_server_step` builds them, the
mean innermost (:class:`~fedpeft.merging.server_step.WeightedMean`) and each other part, by :data:`WRAPPERS`,
around the step inside it. No part is chosen here.
"""

from __future__ import annotations

from collections.abc import Callable

from fedpeft.merging.dp import DifferentialPrivacy
from fedpeft.merging.robust import RobustRule
from fedpeft.merging.server_opt import ServerOptimizer
from fedpeft.merging.server_step import ServerStep, WeightedMean
from fedpeft.merging.staleness import StalenessMixing
from fedpeft.settings.methods import MeanServerConfigMixin
from fedpeft.settings.server import ServerPart

ClientsPerRound = Callable[[int], int | None]
"""m of a round, from the round (``Method.clients_per_round``): what DP's release divides by."""


def _privacy(inner: ServerStep, cfg: MeanServerConfigMixin, clients_per_round: ClientsPerRound) -> ServerStep:
    if cfg.dp is None:
        raise ValueError("the privacy part needs the config's `dp`")
    return DifferentialPrivacy(inner, cfg.dp, clients_per_round)


def _robust(inner: ServerStep, cfg: MeanServerConfigMixin, clients_per_round: ClientsPerRound) -> ServerStep:
    return RobustRule(inner, cfg.aggregation)


def _staleness(inner: ServerStep, cfg: MeanServerConfigMixin, clients_per_round: ClientsPerRound) -> ServerStep:
    return StalenessMixing(inner, cfg.schedule)


def _optimizer(inner: ServerStep, cfg: MeanServerConfigMixin, clients_per_round: ClientsPerRound) -> ServerStep:
    if cfg.server_optimizer is None:
        raise ValueError("the optimizer part needs the config's `server_optimizer`")
    return ServerOptimizer(inner, cfg.server_optimizer)


WRAPPERS: dict[ServerPart, Callable[[ServerStep, MeanServerConfigMixin, ClientsPerRound], ServerStep]] = {
    "privacy": _privacy,
    "robust": _robust,
    "staleness": _staleness,
    "optimizer": _optimizer,
}
"""Each part that wraps the step inside it: (that step, the config, m of a round) -> the part."""


def build_server_step(cfg: MeanServerConfigMixin, clients_per_round: ClientsPerRound) -> ServerStep | None:
    """The server step of ``cfg``'s parts (:meth:`~fedpeft.settings.methods.MeanServerConfigMixin.server_step_parts`),
    the weighted mean innermost; ``None`` where it names none (a method whose ``aggregate`` is no weighted mean).

    Raises:
        ValueError: the parts do not start with the mean.
    """
    parts = cfg.server_step_parts()
    if not parts:
        return None
    if parts[0] != "mean":
        raise ValueError(f"a server step is built around the weighted mean, so its parts start with it, not {parts}")
    step: ServerStep = WeightedMean()
    for part in parts[1:]:
        step = WRAPPERS[part](step, cfg, clients_per_round)
    return step
