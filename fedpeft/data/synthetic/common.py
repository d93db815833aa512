"""What the synthetic benchmarks share: seeds, language selection, pools, base corpora and the disk cache."""

from __future__ import annotations

import hashlib
import json
import os
import random
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path

from fedpeft.core.config import DataConfig
from fedpeft.core.errors import UserError
from fedpeft.core.seeds import derive_seed
from fedpeft.data import federation_file
from fedpeft.data.memory import check_fits_in_memory
from fedpeft.data.partition import Scheme, partition_examples, split_train_test
from fedpeft.data.synthetic.languages import INVENTORY, RESOURCE_SHARE, language
from fedpeft.data.tokenizer import cache_root
from fedpeft.data.types import ClientData, Example, FederatedData

# Bump when generation changes, so that stale cached benchmarks are not reused.
GENERATOR_VERSION = 2
BASE_PER_LANGUAGE = 400


def rng_for(seed: int, *parts: object) -> random.Random:
    """An independent random stream for one (seed, purpose) pair."""
    return random.Random(derive_seed(seed, *parts, stream="synthetic"))


def select_groups(cfg: DataConfig, default: tuple[str, ...]) -> list[str]:
    """The languages to build: ``cfg.groups`` (validated) or the benchmark's ``default``."""
    if cfg.groups is None:
        return list(default)
    unknown = [g for g in cfg.groups if g not in INVENTORY]
    if unknown:
        raise UserError(
            f"Unknown language(s) {', '.join(map(repr, unknown))} for {cfg.name}; choose from: {', '.join(INVENTORY)}."
        )
    if not cfg.groups:
        raise UserError(f"data.groups is empty; list at least one of: {', '.join(INVENTORY)}.")
    return list(dict.fromkeys(cfg.groups))


def unseen_only(groups: list[str], requested: list[str] | str) -> list[str]:
    """The languages of ``requested`` that are built and reserved for the unseen pool."""
    requested = [requested] if isinstance(requested, str) else list(requested)
    unknown = [g for g in requested if g not in INVENTORY]
    if unknown:
        raise UserError(
            f"Unknown language(s) {', '.join(unknown)} in data.options.unseen_only_groups; "
            f"choose from: {', '.join(INVENTORY)}."
        )
    return [g for g in requested if g in groups]


def base_counts(groups: list[str], total: int) -> dict[str, int]:
    """Base-corpus size per language: ``total`` split in proportion to the resource shares."""
    weights = {g: RESOURCE_SHARE[language(g).resource] for g in groups}
    norm = sum(weights.values())
    return {g: round(total * w / norm) for g, w in weights.items()}


def base_corpus(
    cfg: DataConfig, groups: list[str], make_examples: Callable[[str, int], list[Example]]
) -> tuple[list[Example], dict[str, int]]:
    """The base-model corpus, drawn independently of the clients' data, and its size per language.

    ``cfg.base_samples`` (default ``BASE_PER_LANGUAGE`` per language) is split by resource level: high-resource
    languages get the share 1, mid 0.25 and low 0.03, so the base model meets low-resource languages rarely.
    """
    total = cfg.base_samples if cfg.base_samples is not None else BASE_PER_LANGUAGE * len(groups)
    counts = base_counts(groups, total)
    corpus = [ex for g in groups for ex in make_examples(g, counts[g])]
    rng_for(cfg.seed, "base-order").shuffle(corpus)
    return corpus, counts


def label_skew(cfg: DataConfig) -> str:
    """How labels are spread over the clients of one language, in words (for ``FederatedData.info``)."""
    if cfg.partition == "dirichlet":
        return f"Dirichlet({cfg.dirichlet_alpha}) over labels per client, within each language"
    return "iid: labels spread evenly over the clients of each language"


def groups_with_clients(groups: list[str], clients: list[ClientData]) -> list[str]:
    """``groups`` that have at least one client, in order."""
    present = {c.group for c in clients}
    return [g for g in groups if g in present]


def language_info(groups: list[str]) -> dict[str, object]:
    """Descriptive facts about the languages for ``FederatedData.info``."""
    langs = [language(g) for g in groups]
    return {
        "resource_level": {lang.code: lang.resource for lang in langs},
        "family": {lang.code: lang.family for lang in langs},
        "script": {lang.code: lang.script for lang in langs},
    }


def skewed_clients(
    examples: list[Example],
    *,
    group: str,
    pool: str,
    num_clients: int,
    test_fraction: float,
    alpha: float,
    scheme: Scheme,
    seed: int,
) -> list[ClientData]:
    """Split one (language, pool) set over clients, then each client's shard into train and test.

    Train and test are partitioned together so that a client's test split has the label skew of its train
    split (its own label distribution), as when a real client holds out part of its own data.
    """
    # Partition (index, label) rows only: the partitioner copies every column it is given.
    rows = [{"index": i, "label": ex["label"]} for i, ex in enumerate(examples)]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # the partitioner warns whenever it resamples
            index_shards = partition_examples(rows, num_clients, scheme, alpha=alpha, seed=seed)
    except ValueError as err:
        raise UserError(
            f"Cannot split {len(examples)} examples of {group!r} over {num_clients} clients ({err}); "
            "lower data.clients_per_group or raise data.train_per_group."
        ) from None
    clients = []
    for index, index_shard in enumerate(index_shards):
        shard = [examples[row["index"]] for row in index_shard]
        train, test = split_train_test(shard, test_fraction, derive_seed(seed, "split", index, stream="synthetic"))
        clients.append(ClientData(f"{group}-{pool}-{index:02d}", group, pool, train, test))
    return clients


def classification_pools(
    cfg: DataConfig,
    groups: list[str],
    reserved: list[str],
    make_examples: Callable[[str, int, str], list[Example]],
    sizes: dict[str, tuple[int, int]],
    num_clients: int,
) -> list[ClientData]:
    """Clients of every pool and language: ``make_examples(lang, n, pool)`` split with label skew.

    ``sizes[lang]`` is (train, test) per pool; ``reserved`` languages get unseen clients only.
    """
    if cfg.partition == "natural":
        raise UserError(f"{cfg.name} has no natural client ids; set data.partition to dirichlet or iid.")
    pools = ("seen", "unseen") if cfg.unseen_pool else ("seen",)
    clients: list[ClientData] = []
    for pool in pools:
        for code in groups:
            if pool == "seen" and code in reserved:
                continue
            train, test = sizes[code]
            clients += skewed_clients(
                make_examples(code, train + test, pool),
                group=code,
                pool=pool,
                num_clients=num_clients,
                test_fraction=test / (train + test),
                alpha=cfg.dirichlet_alpha,
                scheme=cfg.partition,
                seed=derive_seed(cfg.seed, "partition", code, pool, stream="synthetic"),
            )
    if not clients:
        raise UserError(f"{cfg.name} has no clients: the selected languages are all unseen-only; add others.")
    return clients


def federation_info(groups: list[str], clients: list[ClientData], base_per_group: dict[str, int]) -> dict[str, object]:
    """The facts every synthetic benchmark reports in ``FederatedData.info``.

    Keys: ``resource_level``, ``family`` and ``script`` per language; ``group_sizes`` (per group and pool:
    clients, train and test examples, mean train examples per client); ``samples_per_client`` (mean train
    examples per client, per group); ``base_per_group`` (base-corpus examples per language).
    """
    sizes: dict[str, dict[str, dict[str, float]]] = {g: {} for g in groups}
    for c in clients:
        entry = sizes[c.group].setdefault(c.pool, {"clients": 0, "train": 0, "test": 0})
        entry["clients"] += 1
        entry["train"] += len(c.train)
        entry["test"] += len(c.test)
    per_client = {}
    for group, pools in sizes.items():
        for entry in pools.values():
            entry["train_per_client"] = round(entry["train"] / entry["clients"], 1)
        if pools:
            total = sum(e["train"] for e in pools.values()) / sum(e["clients"] for e in pools.values())
            per_client[group] = round(total, 1)
    return {
        **language_info(groups),
        "group_sizes": {g: pools for g, pools in sizes.items() if pools},
        "samples_per_client": per_client,
        "base_per_group": base_per_group,
    }


def cache_path(name: str, cfg: DataConfig) -> Path:
    """Where benchmark ``name`` built from ``cfg`` is cached: ``<cache root>/data/<name>-<hash>.npz`` (a
    :mod:`fedpeft.data.federation_file`, read without pickle)."""
    # Fields the user set explicitly matter too: a benchmark's own defaults replace the ones left unset.
    settings = json.dumps(
        {"config": cfg.model_dump(mode="json"), "set": sorted(cfg.model_fields_set), "version": GENERATOR_VERSION},
        sort_keys=True,
    )
    digest = hashlib.sha256(settings.encode()).hexdigest()[:20]
    return cache_root() / "data" / f"{name}-{digest}.npz"


def cached(name: str, cfg: DataConfig, build: Callable[[DataConfig], FederatedData]) -> FederatedData:
    """``build(cfg)`` for benchmark ``name``, read from the disk cache when present.

    An unreadable cache file (truncated, corrupted, from an incompatible version) is rebuilt and replaced. Sizes
    that cannot fit in memory are refused first, from an estimate (:func:`~fedpeft.data.memory.check_fits_in_memory`).
    The file is read without pickle (:mod:`fedpeft.data.federation_file`); the pickle an earlier fedpeft wrote for
    the same config (``.pkl``) is never read, and is removed when the new file is written.
    """
    check_fits_in_memory(cfg)
    path = cache_path(name, cfg)
    if path.exists():
        try:
            return federation_file.load(path)
        except Exception:  # any damage to the file, or another version of it, means "rebuild it"
            pass
    data = build(cfg)
    try:
        contents = federation_file.dumps(data)
    except TypeError:
        return data  # a value the file cannot hold as it is: not cached rather than read back changed
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # Write then rename, so that concurrent builders never leave a half-written file behind.
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(contents)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
        path.with_suffix(".pkl").unlink(missing_ok=True)
    except OSError:
        pass  # an unwritable cache only costs a rebuild next time
    return data
