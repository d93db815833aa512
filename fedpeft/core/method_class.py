"""What core knows of a method: the config fields every method accepts, and what it reads off a method's class.

The method contract itself (``fedpeft.methods.base.Method``) sits above core; :class:`MethodClass` is the part of
it that core's config check and the runner use, so that :data:`fedpeft.core.registry.METHODS` is typed without
core importing a method.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, model_validator


class MethodConfig(BaseModel):
    """Fields every method accepts; each method's ``Config`` (a subclass) adds its own."""

    model_config = ConfigDict(extra="forbid")

    name: str
    label: str | None = None

    @model_validator(mode="after")
    def _check_common_ranges(self) -> MethodConfig:
        # Checked by name here, so that a subclass that redefines a field's default keeps its range.
        ranges: dict[str, tuple[Callable[[Any], bool], str]] = {
            "rounds": (lambda v: v >= 0, "0 or more (0: no federated training)"),
            "fraction": (lambda v: 0 < v <= 1, "in (0, 1]"),
            "min_clients": (lambda v: v >= 1, "at least 1"),
            "batch_size": (lambda v: v >= 1, "at least 1"),
            "local_steps": (lambda v: v is None or v >= 1, "at least 1"),
            "local_epochs": (lambda v: v is None or v > 0, "above 0"),
        }
        values = dict(self)  # the fields this config class has
        for key, (valid, wanted) in ranges.items():
            value = values.get(key)
            if value is not None and not valid(value):
                raise ValueError(f"`{key}` must be {wanted}, not {value}")
        return self


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
