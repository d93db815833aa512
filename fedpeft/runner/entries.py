"""The config's method entries read across one another: every federated method of a run, the base stage's included,
and those of them that run an asynchronous schedule (the run's checks and its federated phases both ask)."""

from __future__ import annotations

from fedpeft.core.config import ExperimentConfig
from fedpeft.core.method_class import MethodConfig
from fedpeft.methods.base import MeanServerConfigMixin


def method_entries(cfg: ExperimentConfig) -> list[MethodConfig]:
    """The config's method entries, and the base stage's method when the base stage is federated."""
    return list(cfg.methods) + ([cfg.base.method] if cfg.base.kind == "federated" else [])


def asynchronous_labels(cfg: ExperimentConfig) -> list[str]:
    """The row labels of the config's methods (base stage included) that run an asynchronous schedule."""
    return [
        e.label or e.name
        for e in method_entries(cfg)
        if isinstance(e, MeanServerConfigMixin) and e.schedule.asynchronous
    ]
