"""What a dataset reads of its config beyond the shared fields: its typed ``data.options`` and the fields it defaults.

A dataset declares its options as a pydantic model, a subclass of :class:`DatasetOptions` with the defaults as
field defaults, and its builder validates ``cfg.options`` into it with :func:`parse_options`, so a misspelt key or
a value of the wrong type ends in one sentence naming it. :func:`setting` reads a shared field with the dataset's
own default for when the user left it unset.
"""

from __future__ import annotations

from typing import Annotated, TypeVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, ValidationError

from fedpeft.core.config import DataConfig
from fedpeft.core.errors import UserError


class DatasetOptions(BaseModel):
    """The base of every dataset's ``Options``: unknown keys are refused."""

    model_config = ConfigDict(extra="forbid")


OptionsT = TypeVar("OptionsT", bound=DatasetOptions)
T = TypeVar("T")


def _one_or_many(value: object) -> object:
    return [value] if isinstance(value, str) else value


Names = Annotated[list[str], BeforeValidator(_one_or_many)]
"""A list of names, where one name may be given alone (``unseen_only_groups: cyr1``)."""


def parse_options(cfg: DataConfig, options: type[OptionsT]) -> OptionsT:
    """``cfg.options`` validated into the dataset's ``options`` model (its defaults filling the keys left out).

    Raises:
        UserError: a key the model lacks (naming the valid keys) or a value it refuses (naming
            ``data.options.<key>``).
    """
    valid = list(options.model_fields)
    unknown = sorted(set(cfg.options) - set(valid))
    if unknown:
        raise UserError(
            f"Unknown data.options key(s) {', '.join(unknown)} for dataset {cfg.name}; "
            f"valid options: {', '.join(valid) or '(none)'}."
        )
    try:
        return options.model_validate(cfg.options)
    except ValidationError as err:
        errors = err.errors()
        key = str(errors[0]["loc"][0])  # the option itself, also for a nested value
        # A union (an integer or "all") fails once per member: say what each would have taken.
        messages = dict.fromkeys(e["msg"] for e in errors if str(e["loc"][0]) == key)
        reason = " or ".join(m[:1].lower() + m[1:] for m in messages)
        raise UserError(
            f"data.options.{key}={cfg.options.get(key)!r} is invalid for dataset {cfg.name}: {reason}."
        ) from None


def setting(cfg: DataConfig, field: str, default: T) -> T:
    """``cfg.<field>`` when the user set it (YAML, override or constructor), else the dataset's own ``default``."""
    return getattr(cfg, field) if field in cfg.model_fields_set else default
