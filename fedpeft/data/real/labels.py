"""Columns of a loaded split: required columns, labels as class ids, cells as text."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import datasets

from fedpeft.core.errors import UserError


def require_columns(ds: datasets.Dataset, columns: Iterable[str], where: str, expected: str) -> None:
    """Raise when ``ds`` lacks any of ``columns``."""
    missing = [c for c in columns if c not in ds.column_names]
    if missing:
        raise UserError(
            f"{where} lacks column(s) {', '.join(missing)} (it has {', '.join(ds.column_names)}); "
            f"expected the columns {expected}."
        )


def label_ids(ds: datasets.Dataset, column: str, label_names: Sequence[str]) -> list[int | None]:
    """Every row's label as an index into ``label_names`` (``None`` for rows without a usable label).

    Accepts integer ids (through the dataset's ``ClassLabel`` names when it has them), digit strings and
    class names (case-insensitive).
    """
    feature = ds.features.get(column)
    names_in_data = list(feature.names) if isinstance(feature, datasets.ClassLabel) else None
    lookup = {name.lower(): i for i, name in enumerate(label_names)}

    def convert(value: Any) -> int | None:
        if value is None or isinstance(value, bool):
            return None
        if isinstance(value, float):
            if value != value or not value.is_integer():  # NaN or fractional
                return None
            value = int(value)
        if isinstance(value, str):
            text = value.strip()
            if text.lstrip("-").isdigit():
                value = int(text)
            else:
                return lookup.get(text.lower())
        if isinstance(value, int):
            if names_in_data is not None:
                if not 0 <= value < len(names_in_data):
                    return None
                return lookup.get(names_in_data[value].lower())
            return value if 0 <= value < len(label_names) else None
        return None

    return [convert(v) for v in ds[column]]


def text_of(value: Any) -> str:
    """A cell as text (missing values become the empty string)."""
    if value is None or (isinstance(value, float) and value != value):
        return ""
    return str(value)


def count_valid(labels: list[int | None]) -> int:
    """How many rows have a usable label (not ``None``)."""
    return sum(label is not None for label in labels)
