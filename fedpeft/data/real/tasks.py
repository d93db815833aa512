"""Loaders of FedMosaic's PFL benchmarks: DRAKE (40 multi-modal tasks, 10 clients), HFLB (9 clients, VQA) and
Fed-Scope (text: coding, mathematics, general capability; 5 clients).

All read a local directory in one documented layout (docs/real-data.md), which a conversion script writes from
the released files:

```
<data.path>/
  clients.json            {"<client id>": ["<task>", "<task>", ...], ...}   tasks in arrival order
  tasks/<task>/train.jsonl
  tasks/<task>/test.jsonl
  public.jsonl            optional: public data for alignment and distillation (e.g. LLaVA-Instruct samples)
  images/...              image files, referenced relative to <data.path>
```

Every line: ``{"question": str, "answer": str, "image": "images/x.jpg" | ["images/a.jpg", ...], "choices":
[str, ...] (optional)}``; ``image`` is left out in text-only benchmarks. A question with choices lists them after
the question. Examples become ``{"image": <absolute path or list>, "prompt", "response", "task", "stage",
"group"}`` with ``stage`` the task's
position in the client's list (``options.setting: dynamic``) or 0 (``static``, tasks mixed); group = client id.
``options.train_per_task`` / ``test_per_task`` cap the examples per task (a seeded sample; null keeps all).
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any, Literal

from fedpeft.core.config import DataConfig
from fedpeft.core.errors import UserError
from fedpeft.core.registry import DATASETS
from fedpeft.core.seeds import derive_seed
from fedpeft.data.options import DatasetOptions, parse_options
from fedpeft.data.real.sources import require_directory
from fedpeft.data.types import ClientData, Example, FederatedData

LAYOUT = "<path>/clients.json and <path>/tasks/<task>/{train,test}.jsonl (docs/real-data.md)"
_EXAMPLE_PLAN = '{"client-01": ["vqa-01", "ocr-02"]}'


class Options(DatasetOptions):
    """``data.options`` of the task directories (``drake``, ``hflb``, ``fedscope``)."""

    setting: Literal["dynamic", "static"] = "dynamic"
    train_per_task: int | None = None
    test_per_task: int | None = None


def _read_lines(path: Path, root: Path, name: str, *, first_only: bool = False) -> list[dict[str, Any]]:
    """The rows of a task's (or the public) JSON Lines file, each checked, images made absolute; with
    ``first_only``, the first row alone (the rest of the file is not read)."""
    if not path.is_file():
        raise UserError(f"{name}: {path} is missing; every task directory needs train.jsonl and test.jsonl.")
    rows = []
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            rows.append(_row(line, f"{path} line {number}", root, name))
            if first_only:
                break
    return rows


def _row(line: str, where: str, root: Path, name: str) -> dict[str, Any]:
    try:
        row = json.loads(line)
    except json.JSONDecodeError:
        raise UserError(f"{name}: {where} is not valid JSON; fix or remove that line.") from None
    if not isinstance(row, dict):
        raise UserError(f"{name}: {where} is not a JSON object; see docs/real-data.md.")
    missing = [k for k in ("question", "answer") if k not in row]
    if missing:
        raise UserError(f"{name}: {where} lacks {', '.join(missing)}; see docs/real-data.md.")
    if "image" in row:
        images = row["image"] if isinstance(row["image"], list) else [row["image"]]
        for image in images:
            if not (root / image).is_file():
                raise UserError(f"{name}: image {image} of {where} does not exist under {root}.")
        row["image"] = [str(root / i) for i in images] if isinstance(row["image"], list) else str(root / images[0])
    return row


def _example(row: dict[str, Any], **fields: Any) -> Example:
    prompt = str(row["question"])
    if row.get("choices"):
        prompt += " choices : " + " , ".join(map(str, row["choices"]))
    example = {"prompt": prompt, "response": str(row["answer"]), **fields}
    if "image" in row:
        example["image"] = row["image"]
    return example


def _capped(rows: list[Example], cap: int | None, seed: int) -> list[Example]:
    if cap is None or len(rows) <= cap:
        return rows
    keep = sorted(random.Random(seed).sample(range(len(rows)), cap))
    return [rows[i] for i in keep]


def check_task_directory(cfg: DataConfig, name: str) -> None:
    """Refuse what :func:`load_task_directory` would refuse before reading the tasks: the options, the directory,
    its ``clients.json``, each task's two files and the first row of each (its fields and images)."""
    parse_options(cfg, Options)
    root, plan = _plan(cfg, name)
    for task in dict.fromkeys(task for tasks in plan.values() for task in tasks):
        for split in ("train", "test"):
            _read_lines(root / "tasks" / task / f"{split}.jsonl", root, name, first_only=True)
    if (root / "public.jsonl").is_file():
        _read_lines(root / "public.jsonl", root, name, first_only=True)


def _plan(cfg: DataConfig, name: str) -> tuple[Path, dict[str, list[str]]]:
    """The directory and its ``clients.json``: each client id's tasks in arrival order."""
    if not cfg.path:
        raise UserError(f"{name} reads a local directory; set data.path (layout: docs/real-data.md).")
    root = require_directory(cfg.path, LAYOUT)
    manifest = root / "clients.json"
    if not manifest.is_file():
        raise UserError(f"{name}: {manifest} is missing; it maps each client id to its list of tasks.")
    try:
        plan = json.loads(manifest.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise UserError(
            f"{name}: {manifest} is not valid JSON ({err}); it maps each client id to its list of tasks."
        ) from None
    if not isinstance(plan, dict) or not all(
        isinstance(tasks, list) and all(isinstance(task, str) for task in tasks) for tasks in plan.values()
    ):
        raise UserError(f"{name}: {manifest} must map each client id to its list of tasks, e.g. {_EXAMPLE_PLAN}.")
    return root, plan


def load_task_directory(cfg: DataConfig, name: str) -> FederatedData:
    """Build a federation from a directory in the layout of the module docstring."""
    options = parse_options(cfg, Options)
    root, plan = _plan(cfg, name)
    clients = []
    for client_id, tasks in plan.items():
        train: list[Example] = []
        test: list[Example] = []
        for stage, task in enumerate(tasks):
            folder = root / "tasks" / task
            stage_value = stage if options.setting == "dynamic" else 0
            fields = {"task": task, "stage": stage_value, "group": client_id}
            seed = derive_seed(cfg.seed, name, client_id, task, stream="files")
            rows = [_example(r, **fields) for r in _read_lines(folder / "train.jsonl", root, name)]
            train += _capped(rows, options.train_per_task, seed)
            rows = [_example(r, **fields) for r in _read_lines(folder / "test.jsonl", root, name)]
            test += _capped(rows, options.test_per_task, seed + 1)
        if options.setting == "static":
            random.Random(derive_seed(cfg.seed, name, client_id, "static", stream="files")).shuffle(train)
        clients.append(ClientData(client_id, client_id, "seen", train, test))
    public_path = root / "public.jsonl"
    public = (
        [_example(r, task="public", group="public") for r in _read_lines(public_path, root, name)]
        if public_path.is_file()
        else []
    )
    if cfg.base_samples is not None:
        public = _capped(public, cfg.base_samples, derive_seed(cfg.seed, name, "public", stream="files"))
    info = {
        "setting": options.setting,
        "client_tasks": {c: ", ".join(t) for c, t in plan.items()},
        "public_examples": len(public),
    }
    return FederatedData(name, "generation", None, [c.client_id for c in clients], clients, public, info)


@DATASETS.register("drake")
def build_drake(cfg: DataConfig) -> FederatedData:
    """DRAKE (FedMosaic's benchmark: 40 multi-modal tasks over 10 clients) from a local directory."""
    return load_task_directory(cfg, "drake")


@DATASETS.register("hflb")
def build_hflb(cfg: DataConfig) -> FederatedData:
    """HFLB (7 VQA datasets over 9 clients, split into 4 question-type tasks each) from a local directory."""
    return load_task_directory(cfg, "hflb")


@DATASETS.register("fedscope")
def build_fedscope(cfg: DataConfig) -> FederatedData:
    """Fed-Scope (text: coding, mathematics, general capability; each client one of them) from a local directory."""
    return load_task_directory(cfg, "fedscope")
