"""``synthetic-tasks``: a task-heterogeneous instruction benchmark, one task family per client.

Every client holds one task family; prompts end in ``=`` and the response is the one correct answer, so
ROUGE and METEOR measure correctness. The families share their surface (the words of one synthetic language,
numbers written digit by digit) and come in related groups, so that federation has something to share, while
each family's mapping is its own, so that personalization matters:

- sequences of nouns: ``copy``, ``reverse``, ``sort`` (by written form) and ``count`` (how often a noun occurs);
- numbers: ``add`` (two numbers below 100) and ``compare`` (``greater`` / ``smaller`` / ``equal``), with
  ``count`` answering in digits too;
- adjectives: ``polarity`` (``positive`` / ``negative``: three adjectives, each flipped by the language's
  negation word when it precedes it; the majority wins, so a few keywords do not decide it) and ``fact``
  (closed-book questions about a fact table drawn from the seed: where an entity lives, what it likes, what it
  is like);
- two languages: ``translate`` noun phrases from the source language into a target language of another
  script, and ``backtranslate`` the other way.

The first eight families form the default federation; ``options.num_clients`` takes the first
``num_clients / clients_per_task`` families of :data:`TASKS` (10 clients: all ten). The base corpus stands in
for pretraining: a quarter raw domain text, the rest plain statements ``input | output`` of the families'
operations without the instruction format, split over the families by a resource level (``BASE_LEVEL``: copy,
add and translate high, reverse, compare and backtranslate mid, sort, count and polarity low, the fact table
never), so that the base model is good at some families and knows nothing of others.
"""

from __future__ import annotations

import random
from typing import Literal

from fedpeft.core.config import DataConfig
from fedpeft.core.errors import UserError
from fedpeft.core.registry import DATASETS
from fedpeft.core.seeds import derive_seed
from fedpeft.data.options import DatasetOptions, parse_options, setting
from fedpeft.data.synthetic.common import cached, rng_for
from fedpeft.data.synthetic.concepts import ANIMATES, ANTONYMS, PLACES, THINGS
from fedpeft.data.synthetic.grammar import Phrase, consistent_variants, phrase_words
from fedpeft.data.synthetic.languages import INVENTORY, Language, language
from fedpeft.data.types import ClientData, Example, FederatedData

NAME = "synthetic-tasks"
TASKS = ("copy", "reverse", "sort", "add", "compare", "polarity", "fact", "translate", "count", "backtranslate")
RELATED = {
    "sequences": ("copy", "reverse", "sort", "count"),
    "numbers": ("add", "compare", "count"),
    "adjectives": ("polarity", "fact"),
    "languages": ("translate", "backtranslate"),
}
DEFAULT_TRAIN, DEFAULT_TEST, BASE_PER_TASK = 1000, 500, 300
NOUNS = ANIMATES + THINGS
POSITIVE = ("happy", "rich", "strong", "clean", "fast", "young")
ADJECTIVES = POSITIVE + tuple(ANTONYMS[a] for a in POSITIVE)
RELATIONS = {"home": "IN", "likes": "like", "is": "qualities"}
# How much of each family's operation the base corpus shows (its "pretraining" coverage).
BASE_LEVEL = {
    "copy": "high", "add": "high", "translate": "high", "reverse": "mid", "compare": "mid",
    "backtranslate": "mid", "sort": "low", "count": "low", "polarity": "low", "fact": "none",
}  # fmt: skip
RESOURCE_SHARE = {"high": 1.0, "mid": 0.25, "low": 0.03, "none": 0.0}


class Options(DatasetOptions):
    """``data.options`` of ``synthetic-tasks``."""

    num_clients: int = 8
    clients_per_task: int = 1
    task_hint: bool = True
    source_language: str = "lat1"
    target_language: str = "cyr1"
    evaluate_on: Literal["test", "validation"] = "test"


def _digits(number: int) -> list[str]:
    return list(str(number))


def fact_table(seed: int) -> dict[tuple[str, str], str]:
    """(entity, relation) -> answer concept: where each entity lives, what it likes, what it is like."""
    rng = rng_for(seed, "tasks-facts")
    table = {}
    for noun in NOUNS:
        table[noun, "home"] = rng.choice(PLACES)
        table[noun, "likes"] = rng.choice([n for n in NOUNS if n != noun])
        table[noun, "is"] = rng.choice(ADJECTIVES)
    return table


class TaskWriter:
    """Writes examples of every family in the source language ``src`` (and ``tgt`` for translation)."""

    def __init__(self, src: Language, tgt: Language, facts: dict[tuple[str, str], str], hint: bool) -> None:
        self.src, self.tgt, self.facts, self.hint = src, tgt, facts, hint

    def noun(self, concept: str) -> str:
        return self.src.write(self.src.word(concept))

    def make(self, rng: random.Random, task: str) -> tuple[list[str], list[str]]:
        """Prompt words (before ``=``) and response words of one example of ``task``."""
        if task in ("copy", "reverse", "sort"):
            items = [self.noun(n) for n in rng.choices(NOUNS, k=rng.randint(3, 6))]
            answer = {"copy": items, "reverse": items[::-1], "sort": sorted(items)}[task]
            return items, answer
        if task == "count":
            target, *others = rng.sample(NOUNS, 3)
            items = [target] * rng.randint(0, 4) + rng.choices(others, k=rng.randint(2, 5))
            rng.shuffle(items)
            return [self.noun(target), ":", *map(self.noun, items)], _digits(items.count(target))
        if task in ("add", "compare"):
            a, b = rng.randrange(100), rng.randrange(100)
            if task == "add":
                return [*_digits(a), "+", *_digits(b)], _digits(a + b)
            if rng.random() < 0.15:
                b = a
            return [*_digits(a), ",", *_digits(b)], ["greater" if a > b else "smaller" if a < b else "equal"]
        if task == "polarity":
            words, score = [self.noun(rng.choice(NOUNS))], 0
            for adjective in rng.choices(ADJECTIVES, k=3):
                negated = rng.random() < 0.35
                words += [self.src.write(self.src.word("NEG"))] * negated + [self.noun(adjective)]
                score += (1 if adjective in POSITIVE else -1) * (-1 if negated else 1)
            return words, ["positive" if score > 0 else "negative"]
        if task == "fact":
            entity, relation = rng.choice(NOUNS), rng.choice(tuple(RELATIONS))
            prompt = [self.noun(entity), self.noun(RELATIONS[relation])]
            return prompt, [self.noun(self.facts[entity, relation])]
        if task in ("translate", "backtranslate"):
            phrase = Phrase(rng.choice(NOUNS), rng.choice(ADJECTIVES) if rng.random() < 0.6 else None)
            plural = rng.random() < 0.3
            origin, destination = (self.src, self.tgt) if task == "translate" else (self.tgt, self.src)
            pick = consistent_variants(origin, rng)
            words = [origin.write(w) for w in phrase_words(origin, phrase, pick, plural)]
            return words, [destination.write(w) for w in phrase_words(destination, phrase, plural=plural)]
        raise ValueError(f"unknown task {task!r}")

    def example(self, rng: random.Random, task: str) -> Example:
        prompt, response = self.make(rng, task)
        head = [task, ":"] if self.hint else []
        return {"prompt": " ".join([*head, *prompt, "="]), "response": " ".join(response), "group": task}

    def base_text(self, rng: random.Random, task: str | None) -> Example:
        """One base-corpus text: a family's operation as a plain statement ``input | output`` without the
        instruction format (``task`` None: raw domain words)."""
        if task is not None:
            prompt, response = self.make(rng, task)
            return {"prompt": "", "response": " ".join([*prompt, "|", *response]), "group": task}
        kind = rng.randrange(3)
        if kind == 0:
            words = [self.noun(n) for n in rng.choices(NOUNS + ADJECTIVES + PLACES, k=rng.randint(3, 8))]
        else:
            lang = self.src if kind == 1 else self.tgt
            phrase = Phrase(rng.choice(NOUNS), rng.choice(ADJECTIVES))
            words = [lang.write(w) for w in phrase_words(lang, phrase, consistent_variants(lang, rng))]
        return {"prompt": "", "response": " ".join(words), "group": "raw"}


def base_corpus(
    writer: TaskWriter, tasks: list[str], total: int, rng: random.Random
) -> tuple[list[Example], dict[str, int]]:
    """The base corpus: raw texts (a quarter) and plain statements of each family's operation, split over the
    families by resource level (high 1, mid 0.25, low 0.03, none 0); the fact table never appears."""
    weights = {t: RESOURCE_SHARE[BASE_LEVEL[t]] for t in tasks}
    norm = sum(weights.values()) or 1.0
    counts = {t: round(0.75 * total * w / norm) for t, w in weights.items()}
    corpus = [writer.base_text(rng, t) for t, n in counts.items() for _ in range(n)]
    corpus += [writer.base_text(rng, None) for _ in range(total - len(corpus))]
    rng.shuffle(corpus)
    return corpus, counts


def _tasks(cfg: DataConfig, options: Options) -> tuple[list[str], int]:
    per_task = options.clients_per_task
    if per_task < 1:
        raise UserError("data.options.clients_per_task must be at least 1.")
    if cfg.groups is not None:
        unknown = [t for t in cfg.groups if t not in TASKS]
        if unknown or not cfg.groups:
            raise UserError(f"data.groups must list task families of {NAME}; choose from: {', '.join(TASKS)}.")
        return list(dict.fromkeys(cfg.groups)), per_task
    count, rest = divmod(options.num_clients, per_task)
    if rest or not 1 <= count <= len(TASKS):
        raise UserError(
            f"data.options.num_clients must be a multiple of clients_per_task ({per_task}) and at most "
            f"{len(TASKS) * per_task}; {NAME} has {len(TASKS)} task families."
        )
    return list(TASKS[:count]), per_task


def _generate(cfg: DataConfig) -> FederatedData:
    options = parse_options(cfg, Options)
    for key, code in (("source_language", options.source_language), ("target_language", options.target_language)):
        if code not in INVENTORY:
            raise UserError(f"data.options.{key} {code!r} is unknown; choose from: {', '.join(INVENTORY)}.")
    if options.source_language == options.target_language:
        raise UserError("data.options.source_language and target_language must differ.")
    tasks, per_task = _tasks(cfg, options)
    n_train = int(setting(cfg, "train_per_group", DEFAULT_TRAIN))
    n_test = int(setting(cfg, "test_per_group", DEFAULT_TEST))
    if n_train < 1 or n_test < 1:
        raise UserError("data.train_per_group and data.test_per_group must be at least 1 (examples per client).")
    writer = TaskWriter(
        language(options.source_language),
        language(options.target_language),
        fact_table(cfg.seed),
        options.task_hint,
    )
    pools = ("seen", "unseen") if setting(cfg, "unseen_pool", False) else ("seen",)
    clients = []
    for pool in pools:
        for task in tasks:
            for index in range(per_task):
                client_id = f"{task}-{pool}-{index:02d}"
                rng = random.Random(derive_seed(cfg.seed, NAME, client_id, stream="synthetic"))
                train = [writer.example(rng, task) for _ in range(n_train)]
                test = [writer.example(rng, task) for _ in range(n_test)]
                if options.evaluate_on == "validation":
                    # A held-out stream of the same size: tune on it without touching the test examples.
                    held_out = random.Random(derive_seed(cfg.seed, NAME, client_id, "validation", stream="synthetic"))
                    test = [writer.example(held_out, task) for _ in range(n_test)]
                clients.append(ClientData(client_id, task, pool, train, test))
    base_total = cfg.base_samples if cfg.base_samples is not None else BASE_PER_TASK * len(tasks)
    base_train, base_per_group = base_corpus(writer, tasks, base_total, rng_for(cfg.seed, "tasks-base"))
    info = {
        "samples_per_client": {t: n_train for t in tasks},
        "test_per_client": {t: n_test for t in tasks},
        "clients_per_task": per_task,
        "related_families": {k: ", ".join(t for t in v if t in tasks) for k, v in RELATED.items()},
        "languages": f"{options.source_language} -> {options.target_language}",
        "task_hint": options.task_hint,
        "resource_level": {t: BASE_LEVEL[t] for t in tasks},
        "base_per_group": base_per_group,
        "evaluate_on": options.evaluate_on,
    }
    return FederatedData(NAME, "generation", None, tasks, clients, base_train, info)


@DATASETS.register(NAME)
def build(cfg: DataConfig) -> FederatedData:
    """Build (or read from the cache) the ``synthetic-tasks`` federation described by ``cfg``.

    Args:
        cfg: ``groups`` (task families; default: the first ``num_clients / clients_per_task`` of :data:`TASKS`),
            ``train_per_group`` / ``test_per_group`` (examples per client; 1,000 / 500), ``seed``,
            ``unseen_pool`` (off unless set: one more client per family, evaluated only), ``base_samples``
            (300 per family); ``options``: ``num_clients`` (8), ``clients_per_task`` (1), ``task_hint`` (the
            family's name starts the prompt; true), ``source_language`` (lat1), ``target_language`` (cyr1),
            ``evaluate_on`` (``test``, or ``validation``: the clients are evaluated on a held-out stream of
            ``test_per_group`` examples instead, to tune alpha or beta without touching the test split).

    Returns:
        The federation (generation task, group = task family) and its raw-text base corpus.
    """
    return cached(NAME, cfg, _generate)
