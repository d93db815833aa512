"""``synthetic-instructions``: categorized English instructions in the Alpaca template, Dolly-style.

A CPU-scale stand-in for Dolly-15k and AlpaGasus in FLAME's experiments (paper 004). ``options.samples``
instructions are drawn evenly from ``options.categories`` (by default the eight of :mod:`categories`; ``add``
and ``multiply`` on request; every response determined by the instruction), written in the Alpaca prompt
template, split over ``options.num_clients`` clients by a Dirichlet partition over the categories
(``data.dirichlet_alpha``, default 5) and cut 80/10/10 per client (:func:`fedpeft.data.instruct.category_clients`).

The base corpus (``base_samples``, default 4000) stands in for pretraining: ``options.knowledge_share`` of it are
plain sentences stating the facts and grammar behind every category ("a dog is loud and fast.", "the opposite
of big is small."), the rest instructions of ``options.base_categories`` only (half of the categories by
default), in the template. So the base model knows the world, the template and half of the tasks; federated
instruction tuning has to teach the other categories and each client's mix.
"""

from __future__ import annotations

from fedpeft.core.config import DataConfig
from fedpeft.core.errors import UserError
from fedpeft.core.registry import DATASETS
from fedpeft.core.seeds import derive_seed
from fedpeft.data.instruct import category_clients, instruction_example
from fedpeft.data.options import DatasetOptions, Names, parse_options, setting
from fedpeft.data.synthetic.categories import ARITHMETIC, CATEGORIES, knowledge_text, make_example
from fedpeft.data.synthetic.common import cached, rng_for
from fedpeft.data.types import Example, FederatedData

NAME = "synthetic-instructions"
BASE_SAMPLES = 4000
VERSION = 2  # bump when generation changes: it names the cache entries


class Options(DatasetOptions):
    """``data.options`` of ``synthetic-instructions``."""

    num_clients: int = 4
    samples: int = 2000
    categories: Names = list(CATEGORIES)
    base_categories: Names = ["qualities", "closed_qa", "negate", "plural"]
    knowledge_share: float = 0.5


def _categories(names: list[str], key: str) -> list[str]:
    known = CATEGORIES + ARITHMETIC
    unknown = [c for c in names if c not in known]
    if unknown:
        raise UserError(f"Unknown categories {unknown} in data.options.{key}; choose from: {', '.join(known)}.")
    return list(dict.fromkeys(names))


def _base_corpus(cfg: DataConfig, options: Options, categories: list[str]) -> list[Example]:
    total = cfg.base_samples if cfg.base_samples is not None else BASE_SAMPLES
    rng = rng_for(cfg.seed, "instructions-base")
    share = options.knowledge_share
    if not 0.0 <= share <= 1.0:
        raise UserError("data.options.knowledge_share must lie between 0 and 1.")
    base_categories = [c for c in _categories(options.base_categories, "base_categories") if c in categories]
    arithmetic = tuple(c for c in categories if c in ARITHMETIC)
    corpus: list[Example] = []
    for index in range(total):
        if rng.random() < share or not base_categories:
            corpus.append({"prompt": "", "response": knowledge_text(rng, arithmetic), "group": "knowledge"})
            continue
        category = base_categories[index % len(base_categories)]
        corpus.append(instruction_example(*make_example(rng, category), category))
    return corpus


def _generate(cfg: DataConfig) -> FederatedData:
    options = parse_options(cfg, Options)
    categories = _categories(options.categories, "categories")
    samples = options.samples
    if samples < 10 * len(categories):
        raise UserError(f"data.options.samples must be at least {10 * len(categories)} (10 per category).")
    rng = rng_for(cfg.seed, "instructions")
    examples = []
    for index in range(samples):
        category = categories[index % len(categories)]
        examples.append(instruction_example(*make_example(rng, category), category))
    rng.shuffle(examples)
    clients, facts = category_clients(
        examples,
        options.num_clients,
        scheme=setting(cfg, "partition", "dirichlet"),
        alpha=float(setting(cfg, "dirichlet_alpha", 5.0)),
        seed=derive_seed(cfg.seed, "instructions-partition", stream="synthetic"),
        where=NAME,
    )
    info = {
        "categories": categories,
        "partition": f"{setting(cfg, 'partition', 'dirichlet')} over categories "
        f"(alpha {setting(cfg, 'dirichlet_alpha', 5.0)}), then 80/10/10 per client",
        "base_categories": [c for c in options.base_categories if c in categories],
        **facts,
    }
    groups = [c for c in categories if any(client.group == c for client in clients)]
    return FederatedData(NAME, "generation", None, groups, clients, _base_corpus(cfg, options, categories), info)


@DATASETS.register(NAME)
def build(cfg: DataConfig) -> FederatedData:
    """Build (or read from the cache) the ``synthetic-instructions`` federation described by ``cfg``.

    Args:
        cfg: seed, partition (``dirichlet``, default alpha 5, or ``iid``), ``base_samples``; ``options``:
            ``num_clients`` (4), ``samples`` (2000), ``categories`` (the 8 default ones; ``add``, ``multiply`` opt-in),
            ``base_categories`` (4 of them) and ``knowledge_share`` (0.5). The per-language size fields of
            ``DataConfig`` do not apply.
    """
    return cached(f"{NAME}-v{VERSION}", cfg, _generate)
