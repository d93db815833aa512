"""MasakhaNEWS (news topic classification in 16 African languages) as a federation of per-language pools.

The quantity skew of the federation is the real one: by default every labelled sample of a language is
used, its train (and test) split cut in half between the seen and the unseen pool, so languages with more
news articles get bigger clients. Setting ``train_per_group`` / ``test_per_group`` explicitly caps each
pool instead. Each pool is split over ``clients_per_group`` clients (10 unless set) with
Dirichlet(``dirichlet_alpha``) label skew; client ids are ``"<lang>-<pool>-<index:02d>"``.
"""

from __future__ import annotations

from fedpeft.core.config import DataConfig
from fedpeft.core.errors import UserError
from fedpeft.core.registry import DATASETS
from fedpeft.core.seeds import derive_seed
from fedpeft.data.options import DatasetOptions, parse_options, setting
from fedpeft.data.real.labels import count_valid, label_ids, require_columns, text_of
from fedpeft.data.real.pools import active_pools, build_classification_clients, classification_scheme, draw_pools
from fedpeft.data.real.sources import check_splits, load_splits, resolve_source, select_languages
from fedpeft.data.types import Example, FederatedData

MASAKHANEWS_LANGUAGES = (
    "amh", "eng", "fra", "hau", "ibo", "lin", "lug", "orm",
    "pcm", "run", "sna", "som", "swa", "tir", "xho", "yor",
)  # fmt: skip
MASAKHANEWS_LABELS = ["business", "entertainment", "health", "politics", "religion", "sports", "technology"]
DEFAULT_HUB_ID = "masakhane/masakhanews"
DEFAULT_CLIENTS_PER_GROUP = 10
TEXT_FIELDS = ("headline", "text", "headline_text")
EXPECTED_COLUMNS = "label, headline, text, headline_text, url"
LAYOUT = (
    "<path>/<lang>/ saved with DatasetDict.save_to_disk, or "
    "<path>/<lang>/{train,test}.{jsonl,csv,tsv,parquet} "
    "with columns label (or category), headline, text, headline_text, url (e.g. <path>/hau/train.jsonl)"
)


class Options(DatasetOptions):
    """``data.options`` of ``masakhanews``."""

    text_field: str = "headline"
    revision: str | None = None


def check(cfg: DataConfig) -> None:
    """Refuse what :func:`build` would refuse before reading a row: the options, the source, the languages and
    each language's split files and columns (or, offline, its configuration in the ``datasets`` cache)."""
    opts = parse_options(cfg, Options)
    schema = (("label", "category"), (_text_field(opts),))
    classification_scheme(cfg, "MasakhaNEWS")
    source = resolve_source(cfg, "MasakhaNEWS", DEFAULT_HUB_ID, opts.revision)
    for lang in select_languages(cfg.groups, MASAKHANEWS_LANGUAGES, source, "MasakhaNEWS", LAYOUT):
        check_splits(source, lang, ("train", "test"), f"MasakhaNEWS {lang}", LAYOUT, [schema], EXPECTED_COLUMNS)


def _text_field(opts: Options) -> str:
    if opts.text_field not in TEXT_FIELDS:
        raise UserError(
            f"data.options.text_field={opts.text_field!r} is not a MasakhaNEWS text column; "
            f"choose one of: {', '.join(TEXT_FIELDS)}."
        )
    return opts.text_field


@DATASETS.register("masakhanews")
def build(cfg: DataConfig) -> FederatedData:
    """Build MasakhaNEWS from ``cfg.path`` or ``cfg.hub_id`` (default ``masakhane/masakhanews``).

    Options: ``text_field`` (``headline`` (default), ``text`` or ``headline_text``), ``revision``.
    """
    opts = parse_options(cfg, Options)
    text_field = _text_field(opts)
    scheme = classification_scheme(cfg, "MasakhaNEWS")
    source = resolve_source(cfg, "MasakhaNEWS", DEFAULT_HUB_ID, opts.revision)
    languages = select_languages(cfg.groups, MASAKHANEWS_LANGUAGES, source, "MasakhaNEWS", LAYOUT)
    pool_names = active_pools(cfg)
    caps = {
        "train": setting(cfg, "train_per_group", None),
        "test": setting(cfg, "test_per_group", None),
    }
    num_clients = setting(cfg, "clients_per_group", DEFAULT_CLIENTS_PER_GROUP)

    pools: dict[str, dict[str, tuple[list[Example], list[Example]]]] = {}
    sizes: dict[str, dict[str, int]] = {}
    layouts: set[str] = set()
    for lang in languages:
        splits, layout = load_splits(source, lang, ("train", "test"), "MasakhaNEWS", LAYOUT)
        layouts.add(layout)
        drawn: dict[str, list[list[Example]]] = {}
        for split, cap in caps.items():
            ds = splits[split]
            where = f"MasakhaNEWS {lang} {split} split"
            label_column = "label" if "label" in ds.column_names else "category"
            require_columns(ds, (label_column, text_field), where, EXPECTED_COLUMNS)
            labels = label_ids(ds, label_column, MASAKHANEWS_LABELS)
            per_pool = count_valid(labels) // len(pool_names)
            if cap is not None:
                per_pool = min(per_pool, cap)
            if per_pool < 1:
                raise UserError(
                    f"{where} has too few labelled samples for {len(pool_names)} pool(s); "
                    "drop the language from data.groups or check its label column."
                )
            blocks = draw_pools(
                ds, labels, len(pool_names), per_pool, derive_seed(cfg.seed, "masakhanews", lang, split, stream="files")
            )
            drawn[split] = [[_example(row, label, lang, text_field) for row, label in block] for block in blocks]
        pools[lang] = {pool: (drawn["train"][i], drawn["test"][i]) for i, pool in enumerate(pool_names)}
        sizes[lang] = {"train_per_pool": len(drawn["train"][0]), "test_per_pool": len(drawn["test"][0])}

    clients = build_classification_clients(pools, num_clients, cfg, scheme, "MasakhaNEWS")
    return FederatedData(
        name="masakhanews",
        task="classification",
        label_names=list(MASAKHANEWS_LABELS),
        groups=languages,
        clients=clients,
        base_train=[],
        info={
            "source": source.describe(),
            "layout": ",".join(sorted(layouts)),
            "pools": list(pool_names),
            "clients_per_group": num_clients,
            "text_field": text_field,
            "capped": {split: cap for split, cap in caps.items() if cap is not None},
            "group_sizes": sizes,
            "partition": scheme,
            "dirichlet_alpha": cfg.dirichlet_alpha,
        },
    )


def _example(row: dict, label: int, lang: str, text_field: str) -> Example:
    return {"text": text_of(row[text_field]), "text_pair": None, "label": label, "group": lang}
