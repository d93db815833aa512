"""Where a real dataset is read from: a local directory (``data.path``) or a Hugging Face hub id, per language.

Every function that can fail because of the user's input (a path, a hub id, a config value) raises
:class:`~fedpeft.core.errors.UserError` with one sentence that names the fix.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import datasets
from datasets.exceptions import DatasetsError
from datasets.table import InMemoryTable

from fedpeft.core.config import DataConfig
from fedpeft.core.errors import UserError
from fedpeft.data.real.readers import find_split_files, read_tables

# What ``datasets.load_dataset`` raises when a hub id is neither cached nor reachable (or not a dataset).
_HUB_ERRORS: tuple[type[BaseException], ...] = (OSError, ValueError, RuntimeError, DatasetsError)
_SCRIPT_ERROR = "scripts are no longer supported"


@dataclass(frozen=True)
class Source:
    """Where a per-language dataset is read from: a local directory or a Hugging Face hub id."""

    kind: Literal["path", "hub"]
    location: str
    revision: str | None = None

    def describe(self) -> str:
        return self.location if self.kind == "path" else f"hub:{self.location}"


def resolve_source(cfg: DataConfig, title: str, default_hub_id: str, revision: str | None = None) -> Source:
    """``cfg.path`` when given (it must exist), else ``cfg.hub_id`` or ``default_hub_id``."""
    if cfg.path:
        path = Path(cfg.path).expanduser()
        if not path.exists():
            raise UserError(
                f"data.path {cfg.path} does not exist; point it at your local copy of {title} "
                "(layouts in docs/real-data.md) or remove it to read the hub id "
                f"{cfg.hub_id or default_hub_id}."
            )
        if not path.is_dir():
            raise UserError(
                f"data.path {cfg.path} is a file, but {title} is read from a directory with one "
                "sub-directory per language; point data.path at that directory."
            )
        return Source("path", str(path))
    return Source("hub", cfg.hub_id or default_hub_id, revision)


def select_languages(
    requested: list[str] | None, known: Sequence[str], source: Source, title: str, layout: str
) -> list[str]:
    """The languages to build: ``requested`` (validated) or every language the source offers."""
    if requested is not None:
        if not requested:
            raise UserError(f"data.groups is empty; list {title} languages or remove data.groups to use all.")
        unknown = [lang for lang in requested if lang not in known]
        if unknown:
            raise UserError(
                f"Unknown {title} language(s) {', '.join(unknown)} in data.groups; choose from: {', '.join(known)}."
            )
        langs = list(dict.fromkeys(requested))
    elif source.kind == "hub":
        langs = list(known)
    else:
        langs = [lang for lang in known if (Path(source.location) / lang).is_dir()]
        if not langs:
            raise UserError(f"{source.location} holds no {title} language directory; expected {layout}.")
    if source.kind == "path":
        missing = [lang for lang in langs if not (Path(source.location) / lang).is_dir()]
        if missing:
            raise UserError(
                f"{source.location} has no directory for language(s) {', '.join(missing)}; expected {layout}."
            )
    return langs


def load_splits(
    source: Source, lang: str, splits: Sequence[str], title: str, layout: str
) -> tuple[dict[str, datasets.Dataset], str]:
    """The requested splits of one language and their layout (``save_to_disk``, ``files`` or ``hub``)."""
    if source.kind == "hub":
        return load_hub_splits(source.location, lang, splits, source.revision), "hub"
    return load_local_splits(Path(source.location) / lang, splits, layout)


def load_hub_splits(
    hub_id: str, config_name: str | None, splits: Sequence[str], revision: str | None = None
) -> dict[str, datasets.Dataset]:
    """Load ``hub_id``/``config_name`` with :func:`datasets.load_dataset` (from the cache when offline).

    Hub repositories that still ship a loading script are retried on their parquet export
    (``refs/convert/parquet``), which current ``datasets`` releases can read without running code.
    """
    kwargs: dict[str, Any] = {"revision": revision} if revision else {}
    try:
        try:
            loaded = datasets.load_dataset(hub_id, config_name, **kwargs)
        except RuntimeError as err:
            if _SCRIPT_ERROR not in str(err) or revision:
                raise
            loaded = datasets.load_dataset(hub_id, config_name, revision="refs/convert/parquet")
    except _HUB_ERRORS as err:
        raise UserError(
            f"Could not load {hub_id} (config {config_name}) from the Hugging Face cache or the Hub "
            f"({type(err).__name__}); download it once with network access, or set data.path to a local copy "
            "(see docs/real-data.md)."
        ) from err
    missing = [s for s in splits if s not in loaded]
    if missing:
        raise UserError(
            f"{hub_id} (config {config_name}) has no {', '.join(missing)} split; "
            "set data.hub_id to a copy with the original splits or use data.path."
        )
    return {s: loaded[s] for s in splits}


def load_local_splits(lang_dir: Path, splits: Sequence[str], layout: str) -> tuple[dict[str, datasets.Dataset], str]:
    """Read one language directory: a ``DatasetDict.save_to_disk`` folder or plain split files."""
    if (lang_dir / "dataset_dict.json").is_file():
        saved = datasets.load_from_disk(str(lang_dir))
        if not isinstance(saved, datasets.DatasetDict):
            raise UserError(f"{lang_dir} was not saved from a DatasetDict; expected {layout}.")
        missing = [s for s in splits if s not in saved]
        if missing:
            raise UserError(f"{lang_dir} (save_to_disk) has no {', '.join(missing)} split; expected {layout}.")
        return {s: saved[s] for s in splits}, "save_to_disk"
    out: dict[str, datasets.Dataset] = {}
    for split in splits:
        files = find_split_files(lang_dir, split)
        if not files:
            raise UserError(f"{lang_dir} has no {split} file; expected {layout}.")
        out[split] = datasets.Dataset(InMemoryTable(read_tables(files)))
    return out, "files"
