"""Saving the report's figures in every requested format (``png``, ``pdf``, ``svg``).

:func:`fedpeft.report.write_plots` sets the formats for the time it draws (:func:`plot_formats`), so that every
plot, the methods' own included (their ``report_plots`` hooks), is written once per format by :func:`save_figure`.
It sits in ``core`` so that every layer that draws (``adapters``, ``methods``, ``report``) may use it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import TYPE_CHECKING

from fedpeft.core.errors import UserError

if TYPE_CHECKING:  # matplotlib is imported only where a figure is drawn
    from matplotlib.figure import Figure

PLOT_FORMATS = ("png", "pdf", "svg")
DEFAULT_FORMATS = ("png",)
_FORMATS: ContextVar[tuple[str, ...]] = ContextVar("fedpeft_plot_formats", default=DEFAULT_FORMATS)


def parse_formats(formats: str | Iterable[str]) -> tuple[str, ...]:
    """Plot formats from ``"png,pdf"`` or a list, lower-cased and in given order without repeats.

    Raises:
        UserError: for an empty list or a format other than png, pdf and svg.
    """
    items = formats.split(",") if isinstance(formats, str) else list(formats)
    chosen = tuple(dict.fromkeys(str(item).strip().lower().lstrip(".") for item in items if str(item).strip()))
    unknown = [f for f in chosen if f not in PLOT_FORMATS]
    if unknown or not chosen:
        given = ", ".join(unknown) if unknown else "none"
        raise UserError(f"Plot format {given} is not supported; choose among {', '.join(PLOT_FORMATS)} (e.g. png,pdf).")
    return chosen


@contextmanager
def plot_formats(formats: str | Iterable[str]) -> Iterator[tuple[str, ...]]:
    """Within the block, :func:`save_figure` writes each figure in every one of ``formats``."""
    token = _FORMATS.set(parse_formats(formats))
    try:
        yield _FORMATS.get()
    finally:
        _FORMATS.reset(token)


def current_formats() -> tuple[str, ...]:
    """The formats :func:`save_figure` writes now (``("png",)`` outside :func:`plot_formats`)."""
    return _FORMATS.get()


def save_figure(figure: Figure, path: Path, *, dpi: int = 120, formats: Sequence[str] | None = None) -> list[Path]:
    """Write a matplotlib ``figure`` as ``path`` with its suffix replaced by each format; returns the files.

    Args:
        figure: a ``matplotlib.figure.Figure``.
        path: the file's path (its suffix, e.g. ``.png``, is replaced).
        dpi: resolution of raster formats.
        formats: the formats to write; by default the current ones (:func:`current_formats`).
    """
    written = []
    for fmt in parse_formats(formats) if formats is not None else current_formats():
        target = Path(path).with_suffix(f".{fmt}")
        # Fixed metadata, so that a redrawn vector file is byte-identical (no creation date).
        metadata = {"CreationDate": None} if fmt == "pdf" else {"Date": None} if fmt == "svg" else None
        figure.savefig(target, dpi=dpi, format=fmt, metadata=metadata)
        written.append(target)
    return written
