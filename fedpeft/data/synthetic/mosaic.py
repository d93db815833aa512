"""``synthetic-mosaic``: clients with different tasks that arrive one after another (FedMosaic's PFL setting).

Every client has its own language and four instruction tasks (``options.tasks_per_client``), i.e. four
(task type, language) pairs: client i writes in the i-th language and takes task types i, i+1, ..., i+3 of
``options.task_types`` in rotation, so neighbouring clients share task types and clients of related languages
share words: task relevance is graded, as RELA assumes. With the default 10 clients and 5 task types every
(task type, language) pair is distinct: 40 tasks.

``options.setting``:

- ``dynamic`` (PFL-Dynamic): the four tasks arrive one after another; a training example's ``stage`` is its
  task's position (0-3) and the training list is in arrival order;
- ``static`` (PFL-Static): the four tasks' examples are mixed and arrive in random order (``stage`` 0).

The worker turns ``stage`` into a stream (``fedpeft.continual``): in round r of R, the stage-s examples arrive
evenly over that stage's rounds and enter an episodic memory, from which batches are drawn. Test examples carry
the same fields, so "Self" accuracy covers the tasks seen so far. The base corpus (``base_samples``, default
40 per language) mixes every task type and language: the public data of alignment and distillation, and the
corpus of a centralized base stage.
"""

from __future__ import annotations

import random
from typing import Literal

from fedpeft.core.config import DataConfig
from fedpeft.core.errors import UserError
from fedpeft.core.registry import DATASETS
from fedpeft.core.seeds import derive_seed
from fedpeft.data.options import DatasetOptions, parse_options
from fedpeft.data.partition import split_train_test
from fedpeft.data.synthetic.common import cached, rng_for, select_groups
from fedpeft.data.synthetic.instructions import TASKS, make_instruction
from fedpeft.data.synthetic.languages import Language, language, languages
from fedpeft.data.types import ClientData, Example, FederatedData

NAME = "synthetic-mosaic"
DEFAULT_LANGUAGES = ("lat1", "lat2", "lat3", "cyr1", "cyr2", "cyr3", "grk1", "lat4", "arb1", "heb1")
# "negate" answers with a whole sentence; the default keeps the short-answer types.
DEFAULT_TASK_TYPES = ("qualities", "translate", "plural", "count", "opposite")


class Options(DatasetOptions):
    """``data.options`` of ``synthetic-mosaic``."""

    num_clients: int = 10
    tasks_per_client: int = 4
    task_types: list[str] = list(DEFAULT_TASK_TYPES)
    train_per_task: int = 60
    test_per_task: int = 15
    setting: Literal["dynamic", "static"] = "dynamic"


BASE_PER_LANGUAGE = 40


def _example(rng: random.Random, lang: Language, task_type: str, targets: list[Language], **fields: str) -> Example:
    prompt, response, response_lang = make_instruction(rng, lang, task_type, targets)
    prompt_text = " ".join(":" if w == ":" else lang.write(w) for w in prompt)
    return {"prompt": prompt_text, "response": response_lang.text(response), **fields}


def client_tasks(index: int, task_types: list[str], per_client: int) -> list[str]:
    """The task types of client ``index``, in arrival order (a rotation of ``task_types``)."""
    return [task_types[(index + k) % len(task_types)] for k in range(per_client)]


def _generate(cfg: DataConfig) -> FederatedData:
    options = parse_options(cfg, Options)
    codes = select_groups(cfg, DEFAULT_LANGUAGES)
    task_types = list(options.task_types)
    unknown = [t for t in task_types if t not in TASKS]
    if unknown:
        raise UserError(f"Unknown data.options.task_types {unknown}; choose from {', '.join(TASKS)}.")
    per_client = options.tasks_per_client
    if not 1 <= per_client <= len(task_types):
        raise UserError(f"data.options.tasks_per_client must be between 1 and {len(task_types)} (the task types).")
    targets = languages(codes)
    clients = []
    tasks_of: dict[str, list[str]] = {}
    for index in range(options.num_clients):
        code = codes[index % len(codes)]
        client_id = f"client-{index:02d}"
        train: list[Example] = []
        test: list[Example] = []
        types = client_tasks(index, task_types, per_client)
        for stage, task_type in enumerate(types):
            rng = rng_for(cfg.seed, "mosaic", client_id, task_type)
            task = f"{task_type}-{code}"
            count = options.train_per_task + options.test_per_task
            rows = [_example(rng, language(code), task_type, targets, group=code, task=task) for _ in range(count)]
            fraction = options.test_per_task / count
            task_train, task_test = split_train_test(
                rows, fraction, derive_seed(cfg.seed, "split", client_id, task, stream="synthetic")
            )
            dynamic = options.setting == "dynamic"
            train += [{**ex, "stage": stage if dynamic else 0} for ex in task_train]
            test += [{**ex, "stage": stage if dynamic else 0} for ex in task_test]
        if options.setting == "static":
            rng_for(cfg.seed, "mosaic-static", client_id).shuffle(train)
        tasks_of[client_id] = [f"{t}-{code}" for t in types]
        clients.append(ClientData(client_id, code, "seen", train, test))
    base_rng = rng_for(cfg.seed, "mosaic-base")
    per_language = cfg.base_samples // len(codes) if cfg.base_samples is not None else BASE_PER_LANGUAGE
    base_train = [
        _example(base_rng, language(code), base_rng.choice(TASKS), targets, group=code, task="public")
        for code in codes
        for _ in range(per_language)
    ]
    base_rng.shuffle(base_train)
    info = {
        "setting": options.setting,
        "tasks_per_client": per_client,
        "client_tasks": {c: ", ".join(t) for c, t in tasks_of.items()},
        "stream": {"stages": per_client if options.setting == "dynamic" else 1},
        "public_examples": len(base_train),
    }
    groups = list(dict.fromkeys(c.group for c in clients))
    return FederatedData(NAME, "generation", None, groups, clients, base_train, info)


@DATASETS.register(NAME)
def build(cfg: DataConfig) -> FederatedData:
    """Build (or read from the cache) the ``synthetic-mosaic`` federation described by ``cfg``.

    Args:
        cfg: ``seed``, ``groups`` (the languages, one per client in turn), ``base_samples``; ``options``:
            ``num_clients`` (10), ``tasks_per_client`` (4), ``task_types`` (qualities, translate, plural,
            count, opposite), ``train_per_task`` (60), ``test_per_task`` (15), ``setting`` (dynamic | static).

    Returns:
        The federation (every client in the seen pool; group = the client's language).
    """
    return cached(NAME, cfg, _generate)
