"""Columns of a split: required columns (of a loaded split, or of its files before loading), labels as class ids,
cells as text."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from typing import TYPE_CHECKING

from fedpeft.core.errors import UserError

if TYPE_CHECKING:
    import datasets


def require_columns(ds: datasets.Dataset, columns: Iterable[str], where: str, expected: str) -> None:
    """Raise when ``ds`` lacks any of ``columns``."""
    missing = [c for c in columns if c not in ds.column_names]
    if missing:
        raise UserError(
            f"{where} lacks column(s) {', '.join(missing)} (it has {', '.join(ds.column_names)}); "
            f"expected the columns {expected}."
        )


Schema = tuple[tuple[str, ...], ...]
"""The columns a split needs, each as the names it may have: ``(("img", "image"), ("fine_label", "label"))``."""


def lacking(columns: Collection[str], schemas: Sequence[Schema]) -> list[str]:
    """The columns that ``columns`` lack for the closest of ``schemas`` (each with its other names: ``img (or
    image)``); empty when one of the schemas is complete, or none is given."""
    closest: list[str] | None = None
    for schema in schemas:
        missing = [
            names[0] + (f" (or {', '.join(names[1:])})" if len(names) > 1 else "")
            for names in schema
            if not any(name in columns for name in names)
        ]
        if closest is None or len(missing) < len(closest):
            closest = missing
    return closest or []


def require_schema(columns: Sequence[str], schemas: Sequence[Schema], source: str, expected: str) -> None:
    """Raise when ``columns`` (those of ``source``, a file or cached copy named in the message) complete none of
    ``schemas``; ``expected`` says what they should be."""
    missing = lacking(columns, schemas)
    if missing:
        raise UserError(
            f"{source} lacks column(s) {', '.join(missing)} (it has {', '.join(columns) or 'none'}); expected "
            f"{expected}."
        )


def label_ids(ds: datasets.Dataset, column: str, label_names: Sequence[str]) -> list[int | None]:
    """Every row's label as an index into ``label_names`` (``None`` for rows without a usable label).

    Accepts integer ids (through the dataset's ``ClassLabel`` names when it has them), digit strings and
    class names (case-insensitive).
    """
    import datasets

    feature = ds.features.get(column)
    names_in_data = list(feature.names) if isinstance(feature, datasets.ClassLabel) else None
    lookup = {name.lower(): i for i, name in enumerate(label_names)}

    def convert(value: object) -> int | None:
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


def text_of(value: object) -> str:
    """A cell as text (missing values become the empty string)."""
    if value is None or (isinstance(value, float) and value != value):
        return ""
    return str(value)


def count_valid(labels: list[int | None]) -> int:
    """How many rows have a usable label (not ``None``)."""
    return sum(label is not None for label in labels)
