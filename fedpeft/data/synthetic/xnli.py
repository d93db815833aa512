"""``synthetic-xnli``: multilingual sentence-pair classification in the style of XNLI.

Fifteen synthetic languages by default (as XNLI), in ten scripts, with three families of related languages and
several isolates; labels entailment / neutral / contradiction follow from the content of the pair
(:mod:`nli`). Per pool (seen, unseen) and language, ``train_per_group + test_per_group`` pairs are split over
``clients_per_group`` clients with Dirichlet label skew; the base corpus gives high-resource languages many
pairs and low-resource ones few. See ``docs/data.md``.
"""

from __future__ import annotations

from functools import partial

from fedpeft.core.config import DataConfig
from fedpeft.core.registry import DATASETS
from fedpeft.data.options import DatasetOptions, Names, parse_options
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
from fedpeft.data.synthetic.grammar import random_variants, render
from fedpeft.data.synthetic.languages import language
from fedpeft.data.synthetic.nli import EDITS, LABEL_NAMES, sample_pair
from fedpeft.data.types import Example, FederatedData

NAME = "synthetic-xnli"
DEFAULT_LANGUAGES = ("lat1", "lat2", "lat3", "cyr1", "cyr2", "cyr3", "arb1", "arb2", "dev1", "dev2", "grk1",
                     "hng1", "lat4", "geo1", "eth1")  # fmt: skip


class Options(DatasetOptions):
    """``data.options`` of ``synthetic-xnli``."""

    unseen_only_groups: Names = ["cyr1"]


def nli_examples(code: str, count: int, pool: str, *, seed: int) -> list[Example]:
    """``count`` labelled pairs in language ``code`` for ``pool`` (or ``"base"``), labels balanced, shuffled."""
    lang = language(code)
    rng = rng_for(seed, "nli", code, pool)
    examples = []
    for index in range(count):
        label = index % len(LABEL_NAMES)
        premise, hypothesis, _ = sample_pair(rng, label)
        pick = random_variants(lang, rng)
        text, text_pair = render(lang, premise, pick), render(lang, hypothesis, pick)
        examples.append({"text": text, "text_pair": text_pair, "label": label, "group": code})
    rng.shuffle(examples)
    return examples


def _generate(cfg: DataConfig) -> FederatedData:
    groups = select_groups(cfg, DEFAULT_LANGUAGES)
    options = parse_options(cfg, Options)
    reserved = unseen_only(groups, options.unseen_only_groups)
    sizes = {code: (cfg.train_per_group, cfg.test_per_group) for code in groups}
    clients = classification_pools(
        cfg, groups, reserved, partial(nli_examples, seed=cfg.seed), sizes, cfg.clients_per_group
    )
    base_train, base_per_group = base_corpus(cfg, groups, partial(nli_examples, seed=cfg.seed, pool="base"))
    info = {
        **federation_info(groups, clients, base_per_group),
        "unseen_only_groups": reserved,
        "label_skew": label_skew(cfg),
        "edits": {LABEL_NAMES[label]: dict(edits) for label, edits in EDITS.items()},
    }
    return FederatedData(
        NAME, "classification", list(LABEL_NAMES), groups_with_clients(groups, clients), clients, base_train, info
    )


@DATASETS.register(NAME)
def build(cfg: DataConfig) -> FederatedData:
    """Build (or read from the cache) the ``synthetic-xnli`` federation described by ``cfg``.

    Args:
        cfg: languages (``groups``), clients and examples per language and pool, Dirichlet alpha, whether to
            build the unseen pool, base-corpus size, ``options.unseen_only_groups``.

    Returns:
        The federation: seen and unseen clients per language and the base corpus with the resource imbalance.
    """
    return cached(NAME, cfg, _generate)
