"""``synthetic-masakhanews``: headline topic classification in the style of MasakhaNEWS.

Seven topics (business, entertainment, health, politics, religion, sports, technology), each a distribution
over concepts: its own nouns and verbs, plus general vocabulary and, sometimes, a distractor noun of another
topic. A headline is a clause sampled from that distribution and rendered in one of 16 languages by default.
Languages have very different amounts of data (quantity skew): ranked by resource level, their sizes fall
geometrically from ``sqrt(quantity_skew)`` times ``train_per_group`` / ``test_per_group`` for the first to
``1 / sqrt(quantity_skew)`` times for the last, so with the default ``quantity_skew`` of 8 the largest
language has 8 times the examples per client of the smallest. Inside each language, Dirichlet label skew
over ``clients_per_group`` clients (default 10).
"""

from __future__ import annotations

import random
from functools import partial

from fedpeft.core.config import DataConfig
from fedpeft.core.errors import UserError
from fedpeft.core.registry import DATASETS
from fedpeft.data.options import DatasetOptions, Names, parse_options, setting
from fedpeft.data.synthetic.common import (
    base_corpus,
    cached,
    classification_pools,
    federation_info,
    groups_with_clients,
    label_skew,
    rng_for,
    select_groups,
    unseen_only,
)
from fedpeft.data.synthetic.concepts import ADJECTIVES, ANIMATES, PLACES, THINGS, TOPIC_NAMES, TOPICS, VERBS
from fedpeft.data.synthetic.grammar import Clause, Phrase, random_variants, render
from fedpeft.data.synthetic.languages import RESOURCE_SHARE, language
from fedpeft.data.types import Example, FederatedData

NAME = "synthetic-masakhanews"
DEFAULT_LANGUAGES = ("lat1", "lat2", "lat3", "cyr1", "cyr2", "cyr3", "arb1", "arb2", "dev1", "dev2", "grk1",
                     "hng1", "lat4", "geo1", "eth1", "arm1")  # fmt: skip
DEFAULTS = {"clients_per_group": 10, "train_per_group": 1000, "test_per_group": 250}
_DISTRACTOR_SHARE = 0.3


class Options(DatasetOptions):
    """``data.options`` of ``synthetic-masakhanews``."""

    unseen_only_groups: Names = []
    quantity_skew: float = 8.0


def sample_headline(rng: random.Random, topic: str) -> Clause:
    """A headline of ``topic``: mostly the topic's own words, some general words, sometimes a distractor."""
    nouns, verbs = TOPICS[topic]["nouns"], TOPICS[topic]["verbs"]
    subject = rng.choice(nouns) if rng.random() < 0.7 else rng.choice(ANIMATES)
    verb = rng.choice(verbs) if rng.random() < 0.5 else rng.choice(VERBS)
    obj = rng.choice(nouns) if rng.random() < 0.5 else rng.choice(THINGS)
    if subject not in nouns and verb not in verbs:
        obj = rng.choice(nouns)  # every headline says something about its topic
    if rng.random() < _DISTRACTOR_SHARE:
        # A noun of another topic, never replacing the headline's last word of its own topic.
        distractor = rng.choice(TOPICS[rng.choice([t for t in TOPIC_NAMES if t != topic])]["nouns"])
        own_words = (subject in nouns) + (verb in verbs) + (obj in nouns)
        if rng.random() < 0.5 and not (subject in nouns and own_words == 1):
            subject = distractor
        elif not (obj in nouns and own_words == 1):
            obj = distractor
    adjectives = [rng.choice(ADJECTIVES) if rng.random() < 0.3 else None for _ in range(2)]
    place = rng.choice(PLACES) if rng.random() < 0.3 else None
    return Clause(Phrase(subject, adjectives[0]), verb, Phrase(obj, adjectives[1]), place, rng.random() < 0.15)


def headline_examples(code: str, count: int, pool: str, *, seed: int) -> list[Example]:
    """``count`` labelled headlines in language ``code`` for ``pool`` (or ``"base"``), topics balanced, shuffled."""
    lang = language(code)
    rng = rng_for(seed, "headline", code, pool)
    examples = []
    for index in range(count):
        label = index % len(TOPIC_NAMES)
        clause = sample_headline(rng, TOPIC_NAMES[label])
        examples.append({"text": render(lang, clause, random_variants(lang, rng)), "text_pair": None,
                         "label": label, "group": code})  # fmt: skip
    rng.shuffle(examples)
    return examples


def quantity_factors(groups: list[str], skew: float) -> dict[str, float]:
    """Size multiplier per language: geometric from ``sqrt(skew)`` (most resourced) to ``1/sqrt(skew)``.

    Languages are ranked by resource level (high first), ties in inventory order.
    """
    if skew < 1:
        raise UserError(f"data.options.quantity_skew must be at least 1 (got {skew}); 1 means no quantity skew.")
    ranked = sorted(groups, key=lambda g: -RESOURCE_SHARE[language(g).resource])
    steps = max(len(ranked) - 1, 1)
    return {g: skew ** (0.5 - i / steps) if len(ranked) > 1 else 1.0 for i, g in enumerate(ranked)}


def _generate(cfg: DataConfig) -> FederatedData:
    groups = select_groups(cfg, DEFAULT_LANGUAGES)
    options = parse_options(cfg, Options)
    reserved = unseen_only(groups, options.unseen_only_groups)
    train = setting(cfg, "train_per_group", DEFAULTS["train_per_group"])
    test = setting(cfg, "test_per_group", DEFAULTS["test_per_group"])
    factors = quantity_factors(groups, options.quantity_skew)
    sizes = {g: (max(round(train * f), 1), max(round(test * f), 1)) for g, f in factors.items()}
    num_clients = setting(cfg, "clients_per_group", DEFAULTS["clients_per_group"])
    clients = classification_pools(cfg, groups, reserved, partial(headline_examples, seed=cfg.seed), sizes, num_clients)
    base_train, base_per_group = base_corpus(cfg, groups, partial(headline_examples, seed=cfg.seed, pool="base"))
    info = {
        **federation_info(groups, clients, base_per_group),
        "quantity_factor": {g: round(f, 3) for g, f in factors.items()},
        "unseen_only_groups": reserved,
        "label_skew": label_skew(cfg),
    }
    return FederatedData(
        NAME, "classification", list(TOPIC_NAMES), groups_with_clients(groups, clients), clients, base_train, info
    )


@DATASETS.register(NAME)
def build(cfg: DataConfig) -> FederatedData:
    """Build (or read from the cache) the ``synthetic-masakhanews`` federation described by ``cfg``.

    Args:
        cfg: languages, clients per language (default 10), train and test examples per language before the
            quantity factor (defaults 1,000 and 250), Dirichlet alpha, unseen pool, base-corpus size;
            ``options.quantity_skew`` (largest / smallest language size, default 8) and
            ``options.unseen_only_groups`` (default none).

    Returns:
        The federation: seen and unseen clients per language and the base corpus with the resource imbalance.
    """
    return cached(NAME, cfg, _generate)
