"""Where a real dataset is read from: a local directory (``data.path``) or a Hugging Face hub id, per language.

Every function that can fail because of the user's input (a path, a hub id, a config value) raises
:class:`~fedpeft.core.errors.UserError` with one sentence that names the fix. The ``check_*`` functions refuse
what the ``load_*`` functions would, before ``datasets`` is imported (:mod:`fedpeft.data.real.early`): from the
folders, the start of the data files and the ``datasets`` cache's metadata.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from fedpeft.core.config import DataConfig
from fedpeft.core.errors import UserError
from fedpeft.data.hub_check import (
    HUB_ID_PATTERN,
    cache_folder,
    datasets_offline_reason,
    read_info,
    saved_parts,
    searched_path,
)
from fedpeft.data.real.labels import Schema, lacking, require_schema
from fedpeft.data.real.readers import find_split_files, quick_columns, read_tables

if TYPE_CHECKING:
    import datasets

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
                f"data.path {cfg.path} does not exist (searched {searched_path(path)}); point it at your local "
                f"copy of {title} (layouts in docs/real-data.md) or remove it to read the hub id "
                f"{cfg.hub_id or default_hub_id}."
            )
        if not path.is_dir():
            raise UserError(
                f"data.path {cfg.path} is a file, but {title} is read from a directory with one "
                "sub-directory per language; point data.path at that directory."
            )
        return Source("path", str(path))
    return Source("hub", cfg.hub_id or default_hub_id, revision)


def require_directory(path: str, layout: str) -> Path:
    """``data.path`` (``path``) as a directory; refused, naming where it was searched, where it is none."""
    folder = Path(path).expanduser()
    if not folder.is_dir():
        found = "is a file" if folder.exists() else f"does not exist (searched {searched_path(folder)})"
        raise UserError(f"data.path {path} {found}; expected {layout}.")
    return folder


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
    import datasets
    from datasets.exceptions import DatasetsError

    kwargs: dict[str, str] = {"revision": revision} if revision else {}
    try:
        try:
            loaded = datasets.load_dataset(hub_id, config_name, **kwargs)
        except RuntimeError as err:
            if _SCRIPT_ERROR not in str(err) or revision:
                raise
            loaded = datasets.load_dataset(hub_id, config_name, revision="refs/convert/parquet")
    except (OSError, ValueError, RuntimeError, DatasetsError) as err:  # neither cached nor reachable, or no dataset
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
    import datasets
    from datasets.table import InMemoryTable

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


# ------------------------------------------------------------------------------------- checked before loading


def check_splits(
    source: Source, lang: str, splits: Sequence[str], where: str, layout: str, schemas: Sequence[Schema], expected: str
) -> None:
    """Refuse what :func:`load_splits` would for one language, reading no rows (``where`` names the language in
    messages, ``schemas`` the columns each split needs, ``expected`` says them)."""
    if source.kind == "hub":
        check_hub_splits(source.location, lang, splits, schemas, expected)
    else:
        check_local_splits(Path(source.location) / lang, splits, where, layout, schemas, expected)


def check_local_splits(
    folder: Path, splits: Sequence[str], where: str, layout: str, schemas: Sequence[Schema], expected: str
) -> None:
    """Refuse what :func:`load_local_splits` would from the folder alone: a split without its files (or, in a
    ``save_to_disk`` folder, without its split) and a column ``schemas`` need that a split lacks."""
    if (folder / "dataset_dict.json").is_file():
        parts = saved_parts(folder)
        if parts is None:
            return  # not as save_to_disk writes it: load_from_disk says what is wrong
        saved = {part.split: part for part in parts}
        missing = [split for split in splits if split not in saved]
        if missing:
            raise UserError(f"{folder} (save_to_disk) has no {', '.join(missing)} split; expected {layout}.")
        for split in splits:
            require_schema(saved[split].columns, schemas, f"{saved[split].source} ({where} {split} split)", expected)
        return
    for split in splits:
        files = find_split_files(folder, split)
        if not files:
            raise UserError(f"{folder} has no {split} file; expected {layout}.")
        check_file_columns(files, schemas, f"{where} {split} split", expected)


def check_file_columns(files: Sequence[Path], schemas: Sequence[Schema], where: str, expected: str) -> None:
    """Refuse data files (concatenated, as :func:`read_tables` reads them) whose columns complete none of
    ``schemas``. Their start usually tells (:func:`quick_columns`); only where it does not, or shows a column
    missing, are the files read, as the loader reads them."""
    quick = [quick_columns(path) for path in files]
    if all(columns is not None for columns in quick):
        if not lacking({name for columns in quick for name in columns or ()}, schemas):
            return
    columns = list(read_tables(files).column_names)
    shown = str(files[0]) if len(files) == 1 else f"{files[0].parent} ({len(files)} files)"
    require_schema(columns, schemas, f"{shown} ({where})", expected)


def check_hub_splits(
    hub_id: str,
    config: str | None,
    splits: Sequence[str] = (),
    schemas: Sequence[Schema] = (),
    expected: str = "",
) -> None:
    """Refuse what :func:`load_hub_splits` would, told from the ``datasets`` cache while the hub is not asked (as
    :mod:`fedpeft.data.hub_check` reads it): a hub id, or its configuration ``config``, that the cache lacks, or
    a split or column its cached copy lacks. A local directory given as the hub id, and every hub id while the hub
    answers, are left to ``load_dataset``."""
    local = Path(hub_id).expanduser()
    if local.is_dir():
        return
    if local.is_absolute() or not HUB_ID_PATTERN.fullmatch(hub_id):
        raise UserError(
            f"data.hub_id {hub_id} is no directory (searched {searched_path(local)}) and no hub id; set data.path "
            "to a local copy (layouts in docs/real-data.md) or give a hub id such as my-org/my-copy."
        )
    offline = datasets_offline_reason()
    if offline is None:
        return
    root = cache_folder(hub_id)
    copies = [folder for folder in root.glob("*/*/*") if folder.is_dir()]
    cached = sorted({folder.parts[-3] for folder in copies})
    named = f"{hub_id} (config {config})" if config else hub_id
    if not cached or (config is not None and config not in cached):
        held = f", which holds only the configuration(s) {', '.join(cached)}" if cached else ""
        call = f"{hub_id!r}, {config!r}" if config else repr(hub_id)
        raise UserError(
            f"{named} is not in the datasets cache (searched {root}{held}), and "
            f"{offline}; download it once with network access (datasets.load_dataset({call}), then copy the cache "
            "over) or set data.path to a local copy (layouts in docs/real-data.md)."
        )
    if config is None and len(cached) > 1:
        return  # load_dataset cannot tell which: it says so
    latest = max((f for f in copies if config is None or f.parts[-3] == config), key=lambda f: f.stat().st_mtime)
    info = read_info(latest / "dataset_info.json")
    features, held_splits = (info.get("features"), info.get("splits")) if info else (None, None)
    if not isinstance(features, dict) or not isinstance(held_splits, dict):
        return
    missing = [split for split in splits if split not in held_splits]
    if missing:
        raise UserError(
            f"{named} has no {', '.join(missing)} split in the datasets cache ({latest}); set data.hub_id to a copy "
            "with the original splits or use data.path."
        )
    require_schema(list(features), schemas, f"The cached copy of {named} ({latest})", expected)
