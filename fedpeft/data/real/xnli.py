"""XNLI (cross-lingual natural language inference) as a federation of per-language client pools.

Per language and pool (seen, unseen) the loader draws ``train_per_group`` examples from the language's
train split and ``test_per_group`` from its test split, the two pools disjoint, and splits each pool over
``clients_per_group`` clients with Dirichlet(``dirichlet_alpha``) label skew. Client ids are
``"<lang>-<pool>-<index:02d>"``.
"""

from __future__ import annotations

from fedpeft.core.config import DataConfig
from fedpeft.core.errors import UserError
from fedpeft.core.registry import DATASETS
from fedpeft.core.seeds import derive_seed
from fedpeft.data.options import DatasetOptions, parse_options
from fedpeft.data.real.labels import count_valid, label_ids, require_columns, text_of
from fedpeft.data.real.pools import active_pools, build_classification_clients, classification_scheme, draw_pools
from fedpeft.data.real.sources import check_splits, load_splits, resolve_source, select_languages
from fedpeft.data.types import Example, FederatedData

XNLI_LANGUAGES = ("ar", "bg", "de", "el", "en", "es", "fr", "hi", "ru", "sw", "th", "tr", "ur", "vi", "zh")
XNLI_LABELS = ["entailment", "neutral", "contradiction"]
DEFAULT_HUB_ID = "facebook/xnli"
COLUMNS = ("premise", "hypothesis", "label")
SCHEMA = tuple((column,) for column in COLUMNS)
LAYOUT = (
    "<path>/<lang>/ saved with DatasetDict.save_to_disk, or "
    "<path>/<lang>/{train,test}.{jsonl,csv,tsv,parquet} "
    "with columns premise, hypothesis, label (e.g. <path>/en/train.jsonl)"
)


class Options(DatasetOptions):
    """``data.options`` of ``xnli``."""

    revision: str | None = None


def check(cfg: DataConfig) -> None:
    """Refuse what :func:`build` would refuse before reading a row: the options, the source, the languages and
    each language's split files and columns (or, offline, its configuration in the ``datasets`` cache)."""
    opts = parse_options(cfg, Options)
    classification_scheme(cfg, "XNLI")
    source = resolve_source(cfg, "XNLI", DEFAULT_HUB_ID, opts.revision)
    for lang in select_languages(cfg.groups, XNLI_LANGUAGES, source, "XNLI", LAYOUT):
        check_splits(source, lang, ("train", "test"), f"XNLI {lang}", LAYOUT, [SCHEMA], "premise, hypothesis, label")


@DATASETS.register("xnli")
def build(cfg: DataConfig) -> FederatedData:
    """Build XNLI from ``cfg.path`` (a directory) or ``cfg.hub_id`` (default ``facebook/xnli``).

    Options: ``revision`` (hub revision to load).
    """
    opts = parse_options(cfg, Options)
    scheme = classification_scheme(cfg, "XNLI")
    source = resolve_source(cfg, "XNLI", DEFAULT_HUB_ID, opts.revision)
    languages = select_languages(cfg.groups, XNLI_LANGUAGES, source, "XNLI", LAYOUT)
    pool_names = active_pools(cfg)
    wanted = {"train": cfg.train_per_group, "test": cfg.test_per_group}
    if min(wanted.values()) < 1:
        raise UserError("data.train_per_group and data.test_per_group must be at least 1 for XNLI.")

    pools: dict[str, dict[str, tuple[list[Example], list[Example]]]] = {}
    layouts: set[str] = set()
    for lang in languages:
        splits, layout = load_splits(source, lang, ("train", "test"), "XNLI", LAYOUT)
        layouts.add(layout)
        drawn: dict[str, list[list[Example]]] = {}
        for split, per_pool in wanted.items():
            ds = splits[split]
            where = f"XNLI {lang} {split} split"
            require_columns(ds, COLUMNS, where, "premise, hypothesis, label")
            labels = label_ids(ds, "label", XNLI_LABELS)
            needed = per_pool * len(pool_names)
            available = count_valid(labels)
            if available < needed:
                field = "data.train_per_group" if split == "train" else "data.test_per_group"
                raise UserError(
                    f"{where} has {available} labelled samples, fewer than the {needed} needed for "
                    f"{len(pool_names)} disjoint pool(s) of {per_pool}; lower {field}"
                    + (" or set data.unseen_pool=false." if len(pool_names) > 1 else ".")
                )
            blocks = draw_pools(
                ds, labels, len(pool_names), per_pool, derive_seed(cfg.seed, "xnli", lang, split, stream="files")
            )
            drawn[split] = [[_example(row, label, lang) for row, label in block] for block in blocks]
        pools[lang] = {pool: (drawn["train"][i], drawn["test"][i]) for i, pool in enumerate(pool_names)}

    clients = build_classification_clients(pools, cfg.clients_per_group, cfg, scheme, "XNLI")
    return FederatedData(
        name="xnli",
        task="classification",
        label_names=list(XNLI_LABELS),
        groups=languages,
        clients=clients,
        base_train=[],
        info={
            "source": source.describe(),
            "layout": ",".join(sorted(layouts)),
            "pools": list(pool_names),
            "clients_per_group": cfg.clients_per_group,
            "train_per_group": cfg.train_per_group,
            "test_per_group": cfg.test_per_group,
            "partition": scheme,
            "dirichlet_alpha": cfg.dirichlet_alpha,
        },
    )


def _example(row: dict, label: int, lang: str) -> Example:
    return {
        "text": text_of(row["premise"]),
        "text_pair": text_of(row["hypothesis"]),
        "label": label,
        "group": lang,
    }
