"""``synthetic-fedaya``: multilingual instruction following in the style of Fed-Aya.

Clients are annotators with natural ids (``annotator-007``): each writes mostly in one predominant language
and a little in up to three minor ones, and their sizes vary widely (log-normal around
``options.samples_per_client``). Examples are instructions from :mod:`instructions`, written in the
language of the example; the response is determined by the prompt and the language. Clients are split by
annotator id with flwr-datasets' natural-id partitioner, then 80/20 into train and test. Defaults follow
Fed-Aya: 8 languages (6 high- or mid-resource, 2 low-resource), 38 clients of which 8 form the unseen pool,
and one language (``cyr1``) that only unseen clients write, like Russian there.
"""

from __future__ import annotations

import math
import random
from functools import partial

from fedpeft.core.config import DataConfig
from fedpeft.core.errors import UserError
from fedpeft.core.registry import DATASETS
from fedpeft.core.seeds import derive_seed
from fedpeft.data.options import DatasetOptions, Names, parse_options, setting
from fedpeft.data.partition import partition_examples, split_train_test
from fedpeft.data.synthetic.common import (
    base_corpus,
    cached,
    federation_info,
    groups_with_clients,
    rng_for,
    select_groups,
    unseen_only,
)
from fedpeft.data.synthetic.instructions import TASKS, instruction_example
from fedpeft.data.synthetic.languages import RESOURCE_SHARE, Language, language, languages
from fedpeft.data.types import ClientData, Example, FederatedData

NAME = "synthetic-fedaya"
DEFAULT_LANGUAGES = ("lat1", "lat2", "lat3", "cyr1", "arb1", "hng1", "geo1", "eth1")
TEST_FRACTION = 0.2
_PREDOMINANT_SHARE = (0.7, 0.95)


class Options(DatasetOptions):
    """``data.options`` of ``synthetic-fedaya``."""

    num_clients: int = 38
    unseen_clients: int = 8
    samples_per_client: float = 125
    unseen_only_groups: Names = ["cyr1"]


def _client_languages(rng: random.Random, predominant: str, allowed: list[str]) -> dict[str, float]:
    """Share of each language in one client's data: the predominant one, then 0-3 minor ones."""
    others = [g for g in allowed if g != predominant]
    minor = rng.sample(others, min(len(others), rng.choices((0, 1, 2, 3), weights=(3, 3, 2, 2))[0]))
    main = rng.uniform(*_PREDOMINANT_SHARE) if minor else 1.0
    return {predominant: main, **{g: (1 - main) / len(minor) for g in minor}}


def _predominant(rng: random.Random, candidates: list[str], count: int) -> list[str]:
    """Predominant languages of ``count`` clients: each candidate once, then weighted by resource level."""
    if not candidates:
        return []
    chosen = list(candidates[:count])
    weights = [RESOURCE_SHARE[language(g).resource] ** 0.5 for g in candidates]
    chosen += rng.choices(candidates, weights=weights, k=count - len(chosen))
    rng.shuffle(chosen)
    return chosen


def _plan_clients(cfg: DataConfig, options: Options, groups: list[str]) -> list[tuple[str, str, dict]]:
    """(client id, pool, language shares) of every annotator."""
    num_clients, num_unseen = options.num_clients, options.unseen_clients
    if not 0 <= num_unseen < num_clients:
        raise UserError(
            f"data.options.unseen_clients ({num_unseen}) must be at least 0 and below num_clients ({num_clients})."
        )
    rng = rng_for(cfg.seed, "fedaya-clients")
    reserved = unseen_only(groups, options.unseen_only_groups)
    shared = [g for g in groups if g not in reserved]
    if not shared:
        raise UserError(f"{NAME} needs at least one language outside data.options.unseen_only_groups.")
    unseen_ids = set(rng.sample(range(num_clients), num_unseen))
    seen_langs = _predominant(rng, shared, num_clients - num_unseen)
    unseen_langs = _predominant(rng, reserved + shared, num_unseen)
    plans = []
    for index in range(num_clients):
        pool = "unseen" if index in unseen_ids else "seen"
        predominant = (unseen_langs if pool == "unseen" else seen_langs).pop()
        allowed = groups if pool == "unseen" else shared
        plans.append((f"annotator-{index:03d}", pool, _client_languages(rng, predominant, allowed)))
    return plans


def _instructions(code: str, count: int, *, targets: list[Language], seed: int) -> list[Example]:
    rng = rng_for(seed, "fedaya-base", code)
    return [instruction_example(rng, language(code), targets) for _ in range(count)]


def _generate(cfg: DataConfig) -> FederatedData:
    if setting(cfg, "partition", "natural") != "natural":
        raise UserError(f"{NAME} is split by annotator id; set data.partition to natural (or leave it unset).")
    groups = select_groups(cfg, DEFAULT_LANGUAGES)
    options = parse_options(cfg, Options)
    if not 10 <= options.samples_per_client <= 10_000:
        raise UserError("data.options.samples_per_client must be between 10 and 10000.")
    reserved = unseen_only(groups, options.unseen_only_groups)
    # Seen annotators never write in an unseen-only language, not even as a translation target.
    targets = {"seen": languages([g for g in groups if g not in reserved]), "unseen": languages(groups)}
    examples: list[Example] = []
    owners: list[dict[str, int | str]] = []  # (index, annotator) rows: the partitioner needs only these
    plans = [p for p in _plan_clients(cfg, options, groups) if cfg.unseen_pool or p[1] == "seen"]
    for client_id, pool, shares in plans:
        rng = rng_for(cfg.seed, "fedaya", client_id)
        size = round(min(max(rng.lognormvariate(math.log(options.samples_per_client), 0.6), 40), 600))
        for code in rng.choices(list(shares), weights=list(shares.values()), k=size):
            owners.append({"index": len(examples), "client_id": client_id})
            examples.append(instruction_example(rng, language(code), targets[pool]))
    shards = partition_examples(owners, 0, "natural", natural_column="client_id")
    clients = []
    for (client_id, pool, shares), shard in zip(plans, shards, strict=True):
        rows = [examples[row["index"]] for row in shard]
        train, test = split_train_test(
            rows, TEST_FRACTION, derive_seed(cfg.seed, "split", client_id, stream="synthetic")
        )
        predominant = max(shares, key=shares.__getitem__)
        clients.append(ClientData(client_id, predominant, pool, train, test))
    base_train, base_per_group = base_corpus(
        cfg, groups, partial(_instructions, targets=targets["unseen"], seed=cfg.seed)
    )
    info = {
        **federation_info(groups, clients, base_per_group),
        "client_languages": {cid: {g: round(s, 2) for g, s in shares.items()} for cid, _, shares in plans},
        "unseen_only_groups": reserved,
        "tasks": list(TASKS),
    }
    return FederatedData(NAME, "generation", None, groups_with_clients(groups, clients), clients, base_train, info)


@DATASETS.register(NAME)
def build(cfg: DataConfig) -> FederatedData:
    """Build (or read from the cache) the ``synthetic-fedaya`` federation described by ``cfg``.

    Args:
        cfg: languages, seed, unseen pool, base-corpus size; ``options``: ``num_clients`` (38),
            ``unseen_clients`` (8), ``samples_per_client`` (median size, 125), ``unseen_only_groups``
            (``["cyr1"]``). The per-language size fields of ``DataConfig`` do not apply.

    Returns:
        The federation: annotator clients (group = predominant language) and the base corpus.
    """
    return cached(NAME, cfg, _generate)
