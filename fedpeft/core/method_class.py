"""What core knows of a method: the config fields every method accepts, and what it reads off a method's class.

The method contract itself (``fedpeft.methods.base.Method``) sits above core; :class:`MethodClass` is the part of
it that the runner reads, so that :data:`fedpeft.core.registry.METHODS` is typed without core importing a method.
The config check reads a method's config alone (:class:`ServerStepSettings`); the configs live in
:mod:`fedpeft.settings`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, TypeGuard, runtime_checkable

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator


def _number(value: object) -> TypeGuard[int | float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


COMMON_RANGES: dict[str, tuple[Callable[[float], bool], str]] = {
    "rounds": (lambda v: v >= 0, "0 or more (0: no federated training)"),
    "fraction": (lambda v: 0 < v <= 1, "in (0, 1]"),
    "min_clients": (lambda v: v >= 1, "at least 1"),
    "batch_size": (lambda v: v >= 1, "at least 1"),
    "local_steps": (lambda v: v >= 1, "at least 1"),
    "local_epochs": (lambda v: v > 0, "above 0"),
    "epochs": (lambda v: v > 0, "above 0"),
    "finetune_epochs": (lambda v: v >= 0, "0 or more (0: no fine-tuning)"),
    "lr": (lambda v: v > 0, "above 0"),
    "finetune_lr": (lambda v: v > 0, "above 0 (or left out, to fine-tune at `lr`)"),
    "weight_decay": (lambda v: v >= 0, "0 or more"),
    "rank": (lambda v: v >= 1, "at least 1"),
    "alpha": (lambda v: v > 0, "above 0"),
    "alpha_multiplier": (lambda v: v > 0, "above 0"),
    "dropout": (lambda v: 0 <= v < 1, "in [0, 1)"),
    "lam": (lambda v: v >= 0, "0 or more"),
}
"""The ranges of the settings many methods share: setting -> (whether a value is valid, what a valid value is).

Checked by name on every method config that has the setting (``None``, where a config allows it, means "not set"
and is not checked), so that a subclass that redefines a field's default keeps its range."""


class MethodConfig(BaseModel):
    """Fields every method accepts; each method's ``Config`` (a subclass) adds its own.

    The settings of :data:`COMMON_RANGES` are checked, wherever a subclass declares them, before anything runs.
    """

    model_config = ConfigDict(extra="forbid")

    name: str
    label: str | None = None

    @field_validator(*COMMON_RANGES, check_fields=False)
    @classmethod
    def _check_common_range(cls, value: object, info: ValidationInfo) -> object:
        key = str(info.field_name)
        valid, wanted = COMMON_RANGES[key]
        if _number(value) and not valid(value):
            raise ValueError(f"`{key}` must be {wanted}, not {value}")
        return value


@runtime_checkable
class ServerStepSettings(Protocol):
    """A method config with settings of a server step (``fedpeft.settings.methods.MeanServerConfigMixin``): it
    names those of its settings its method's server step cannot apply."""

    def refused_server_settings(self) -> list[str]:
        """The server-step settings this config sets that its method's server step cannot apply, as a config names
        them (empty: none)."""
        ...


class MethodClass(Protocol):
    """What core and the runner read off a registered method's class (``Method`` subclasses have it).

    The registry's lookups return this type, so a caller reads these attributes and never ``getattr``\\ s a class.
    """

    @property
    def Config(self) -> type[MethodConfig]:  # noqa: N802  (the class attribute every method declares)
        """The pydantic class its config entries are validated into (where the catalogue names none, the registry's
        ``config_class`` reads it here)."""
        ...

    @property
    def trains_base_weights(self) -> bool:
        """Whether it fine-tunes the base model's own weights (refused on a float16 base)."""
        ...
