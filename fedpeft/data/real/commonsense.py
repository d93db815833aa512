"""The commonsense-reasoning suite (8 tasks), one task per client, answered in words as in LLM-Adapters.

Tasks (group ids): ``arc-c`` (ARC-Challenge), ``arc-e`` (ARC-Easy), ``boolq``, ``hellaswag``, ``obqa``
(OpenBookQA), ``piqa``, ``siqa`` (Social IQa), ``winogrande``. Every example is a generation prompt in the
template of LLM-Adapters (Hu et al., 2023; the format of the Potara paper's benchmark): the question, its
options named ``answer1`` ... (``solution1/2`` for PIQA, ``ending1..4`` for HellaSwag, ``option1/2`` for
WinoGrande, ``true/false`` for BoolQ), and "Answer format: ..."; the response is "the correct answer is
<answer>". Examples carry ``answer`` and ``options``, so the runtime scores accuracy (the first option named in
the generated response) besides ROUGE.

Sources: ``data.path`` with one directory per task (our id or the LLM-Adapters name, e.g. ``ARC-Challenge``,
``social_i_qa``) holding ``train`` and ``test`` files either in the LLM-Adapters schema (``instruction``,
``input``, ``output``, ``answer``) or in the task's original hub schema; without a path, each task's original
hub dataset (``HUB`` below; test = the labelled validation split where the test labels are hidden). Each client
gets ``train_per_group`` / ``test_per_group`` examples (1,000 / 500) drawn from its task's splits;
``options.clients_per_task: 2`` gives two clients per task with disjoint samples (the paper's 16 clients).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from fedpeft.core.config import DataConfig
from fedpeft.core.errors import UserError
from fedpeft.core.registry import DATASETS
from fedpeft.core.seeds import derive_seed
from fedpeft.data.options import DatasetOptions, parse_options, setting
from fedpeft.data.real.labels import Schema
from fedpeft.data.real.sources import (
    check_hub_splits,
    check_local_splits,
    load_hub_splits,
    load_local_splits,
    require_directory,
)
from fedpeft.data.types import ClientData, Example, FederatedData

TASKS = ("arc-c", "arc-e", "boolq", "hellaswag", "obqa", "piqa", "siqa", "winogrande")
DIRECTORY_NAMES = {
    "arc-c": "ARC-Challenge", "arc-e": "ARC-Easy", "obqa": "openbookqa", "siqa": "social_i_qa",
}  # fmt: skip
# task -> (hub id, config, train split, test split)
HUB = {
    "arc-c": ("allenai/ai2_arc", "ARC-Challenge", "train", "test"),
    "arc-e": ("allenai/ai2_arc", "ARC-Easy", "train", "test"),
    "boolq": ("google/boolq", None, "train", "validation"),
    "hellaswag": ("Rowan/hellaswag", None, "train", "validation"),
    "obqa": ("allenai/openbookqa", "main", "train", "test"),
    "piqa": ("ybisk/piqa", None, "train", "validation"),
    "siqa": ("allenai/social_i_qa", None, "train", "validation"),
    "winogrande": ("allenai/winogrande", "winogrande_xl", "train", "validation"),
}


# The columns convert() reads: of each task's hub schema, or of LLM-Adapters' (its answer named by option).
HUB_COLUMNS = {
    "arc-c": ("question", "choices", "answerKey"), "arc-e": ("question", "choices", "answerKey"),
    "boolq": ("passage", "question", "answer"), "hellaswag": ("ctx", "endings", "label"),
    "obqa": ("question_stem", "choices", "answerKey"), "piqa": ("goal", "sol1", "sol2", "label"),
    "siqa": ("context", "question", "answerA", "answerB", "answerC", "label"),
    "winogrande": ("sentence", "option1", "option2", "answer"),
}  # fmt: skip
LLM_ADAPTERS_COLUMNS = ("instruction", "answer")
LAYOUT = "<path>/<task>/{train,test}.{json,jsonl,csv,tsv,parquet}"


class Options(DatasetOptions):
    """``data.options`` of ``commonsense``."""

    clients_per_task: int = 1


DEFAULT_TRAIN, DEFAULT_TEST = 1000, 500


def _prompt(question: str, names: list[str], texts: list[str]) -> str:
    listed = " ".join(f"{n.capitalize()}: {t}" for n, t in zip(names, texts, strict=True))
    return f"{question}\n\n{listed}\n\nAnswer format: {'/'.join(names)}"


def _example(task: str, question: str, names: list[str], texts: list[str], index: int) -> Example | None:
    if not 0 <= index < len(names):
        return None
    answer = names[index]
    return {
        "prompt": _prompt(question, names, texts),
        "response": f"the correct answer is {answer}",
        "answer": answer,
        "options": names,
        "group": task,
    }


def _letter_index(key: object, labels: list[str]) -> int:
    key = str(key).strip()
    return labels.index(key) if key in labels else -1


def convert(task: str, row: dict[str, Any]) -> Example | None:
    """One row of the task's original schema (or of the LLM-Adapters schema) as an example; None if unusable."""
    if "instruction" in row and "answer" in row:
        text = str(row["instruction"]) + (f"\n\n{row['input']}" if row.get("input") else "")
        answer = str(row["answer"]).strip()
        fixed = {"boolq": ["true", "false"], "piqa": ["solution1", "solution2"], "winogrande": ["option1", "option2"]}
        options = fixed.get(task) or [f"{'ending' if task == 'hellaswag' else 'answer'}{i}" for i in range(1, 6)]
        output = str(row.get("output") or f"the correct answer is {answer}")
        return {"prompt": text, "response": output, "answer": answer, "options": options, "group": task}
    if task in ("arc-c", "arc-e", "obqa"):
        question = row["question"] if task != "obqa" else row["question_stem"]
        labels, texts = list(row["choices"]["label"]), list(row["choices"]["text"])
        names = [f"answer{i + 1}" for i in range(len(texts))]
        return _example(task, question, names, texts, _letter_index(row["answerKey"], labels))
    if task == "boolq":
        question = f"Passage: {row['passage']}\nQuestion: {row['question']}?"
        return _example(task, question, ["true", "false"], ["true", "false"], 0 if row["answer"] else 1)
    if task == "hellaswag":
        names = [f"ending{i + 1}" for i in range(len(row["endings"]))]
        label = str(row["label"]).strip()
        return _example(task, f"Complete: {row['ctx']}", names, list(row["endings"]), int(label) if label else -1)
    if task == "piqa":
        return _example(task, row["goal"], ["solution1", "solution2"], [row["sol1"], row["sol2"]], int(row["label"]))
    if task == "siqa":
        texts = [row["answerA"], row["answerB"], row["answerC"]]
        question = f"{row['context']} {row['question']}"
        return _example(task, question, ["answer1", "answer2", "answer3"], texts, int(row["label"]) - 1)
    if task == "winogrande":
        answer = str(row["answer"]).strip()
        index = int(answer) - 1 if answer else -1
        return _example(task, row["sentence"], ["option1", "option2"], [row["option1"], row["option2"]], index)
    raise ValueError(f"unknown task {task!r}")


def _task_dir(root: Path, task: str) -> Path:
    for name in (task, DIRECTORY_NAMES.get(task, task), task.replace("-", "_")):
        if (root / name).is_dir():
            return root / name
    raise UserError(
        f"{root} has no directory for {task} (expected {task}/ or {DIRECTORY_NAMES.get(task, task)}/ with train "
        "and test files); see docs/real-data.md."
    )


def _load(cfg: DataConfig, task: str) -> dict[str, list[Example]]:
    if cfg.path:
        splits, _ = load_local_splits(_task_dir(require_directory(cfg.path, LAYOUT), task), ("train", "test"), LAYOUT)
        datasets_by_split = {"train": splits["train"], "test": splits["test"]}
    else:
        hub_id, config, train_split, test_split = HUB[task]
        _refuse_hub_id(cfg)
        loaded = load_hub_splits(hub_id, config, (train_split, test_split))
        datasets_by_split = {"train": loaded[train_split], "test": loaded[test_split]}
    out: dict[str, list[Example]] = {}
    for split, ds in datasets_by_split.items():
        try:
            examples = [convert(task, row) for row in ds]
        except (KeyError, TypeError, ValueError) as err:
            raise UserError(
                f"The {task} {split} split does not have the columns of its hub schema or of LLM-Adapters "
                f"(instruction, input, output, answer): {err!r}; see docs/real-data.md."
            ) from None
        out[split] = [ex for ex in examples if ex is not None]
    return out


def _refuse_hub_id(cfg: DataConfig) -> None:
    if cfg.hub_id:
        raise UserError("data.hub_id does not apply to the commonsense suite (one hub dataset per task).")


def _tasks(cfg: DataConfig, opts: Options) -> list[str]:
    tasks = list(cfg.groups) if cfg.groups else list(TASKS)
    unknown = [t for t in tasks if t not in TASKS]
    if unknown or opts.clients_per_task < 1:
        raise UserError(f"data.groups must be commonsense tasks ({', '.join(TASKS)}); clients_per_task >= 1.")
    return tasks


def check(cfg: DataConfig) -> None:
    """Refuse what :func:`build` would refuse before reading a row: the options, the tasks, each task's directory,
    split files and columns (or, offline, each task's hub dataset in the ``datasets`` cache)."""
    tasks = _tasks(cfg, parse_options(cfg, Options))
    root = require_directory(cfg.path, LAYOUT) if cfg.path else None
    if root is None:
        _refuse_hub_id(cfg)
    for task in tasks:
        hub_schema: Schema = tuple((column,) for column in HUB_COLUMNS[task])
        expected = f"those of its hub schema, {', '.join(HUB_COLUMNS[task])}"
        if root is None:
            hub_id, config, train_split, test_split = HUB[task]
            check_hub_splits(hub_id, config, (train_split, test_split), [hub_schema], expected)
            continue
        schemas = [hub_schema, tuple((column,) for column in LLM_ADAPTERS_COLUMNS)]
        expected += ", or of LLM-Adapters, instruction, input, output, answer"
        check_local_splits(_task_dir(root, task), ("train", "test"), f"commonsense {task}", LAYOUT, schemas, expected)


@DATASETS.register("commonsense")
def build(cfg: DataConfig) -> FederatedData:
    """Build the commonsense-8 federation (one task per client).

    Args:
        cfg: ``groups`` (tasks; default all eight), ``train_per_group`` / ``test_per_group`` (per client, 1,000 /
            500), ``seed``, ``path``; ``options``: ``clients_per_task`` (1).
    """
    opts = parse_options(cfg, Options)
    per_task = opts.clients_per_task
    tasks = _tasks(cfg, opts)
    n_train = setting(cfg, "train_per_group", DEFAULT_TRAIN)
    n_test = setting(cfg, "test_per_group", DEFAULT_TEST)
    clients = []
    for task in tasks:
        splits = _load(cfg, task)
        drawn = {}
        for split, size in (("train", n_train), ("test", n_test)):
            pool = list(splits[split])
            random.Random(derive_seed(cfg.seed, "commonsense", task, split, stream="files")).shuffle(pool)
            drawn[split] = [pool[i * size : (i + 1) * size] for i in range(per_task)]
        for index in range(per_task):
            if not drawn["train"][index] or not drawn["test"][index]:
                raise UserError(f"The {task} splits are too small for {per_task} client(s); lower clients_per_task.")
            client_id = f"{task}-seen-{index:02d}"
            clients.append(ClientData(client_id, task, "seen", drawn["train"][index], drawn["test"][index]))
    info = {
        "source": cfg.path or "hub (one dataset per task)",
        "train_per_client": {c.client_id: len(c.train) for c in clients},
        "test_per_client": {c.client_id: len(c.test) for c in clients},
    }
    return FederatedData("commonsense", "generation", None, tasks, clients, [], info)
