"""What core knows of a method: the config fields every method accepts, and what it reads off a method's class.

The method contract itself (``fedpeft.methods.base.Method``) sits above core; :class:`MethodClass` is the part of
it that core's config check and the runner use, so that :data:`fedpeft.core.registry.METHODS` is typed without
core importing a method.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator


def _number(value: Any) -> bool:
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
    def _check_common_range(cls, value: Any, info: ValidationInfo) -> Any:
        key = str(info.field_name)
        valid, wanted = COMMON_RANGES[key]
        if _number(value) and not valid(value):
            raise ValueError(f"`{key}` must be {wanted}, not {value}")
        return value


class ConfiguredMethod(Protocol):
    """What core asks of a method built from its config."""

    def refused_server_settings(self) -> list[str]:
        """The server-step settings of its config that its server step cannot apply, as a config names them."""
        ...


class MethodClass(Protocol):
    """What core, the runner and the worker read off a registered method's class (``Method`` subclasses have it).

    The registry's lookups return this type, so a caller reads these attributes and never ``getattr``\\ s a class.
    """

    @property
    def name(self) -> str:
        """The registered name."""
        ...

    @property
    def Config(self) -> type[MethodConfig]:  # noqa: N802  (the class attribute every method declares)
        """The pydantic class its config entries are validated into."""
        ...

    @property
    def trains_base_weights(self) -> bool:
        """Whether it fine-tunes the base model's own weights (refused on a float16 base)."""
        ...

    def __call__(self, cfg: Any) -> ConfiguredMethod:
        """The method configured by ``cfg``, an instance of its own ``Config`` (hence ``Any`` here)."""
        ...

    def serves_as_base_stage(self) -> bool:
        """Whether ``base: {kind: federated, method: <this>}`` works."""
        ...
