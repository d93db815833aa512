"""Super-NaturalInstructions with one client per task (the setup of "From Aggregation to Guidance", 2025).

Y. Wang et al., "Super-NaturalInstructions: Generalization via Declarative Instructions on 1600+ NLP Tasks",
EMNLP 2022. The ``num_tasks`` tasks with the most instances (ties: by task name) become the clients, one task
each; every client gets ``test_per_client`` test, ``validation_per_client`` validation and up to
``train_per_client`` training instances, drawn without overlap (seeded by ``data.seed`` and the task).

Two layouts are read (details in docs/real-data.md):

- the release (github.com/allenai/natural-instructions): a directory with ``tasks/taskNNN_<name>.json``, each
  holding ``Definition`` (list of strings), ``Positive Examples`` and ``Instances``
  ([{"id", "input", "output": [...]}]); the first output is the reference;
- flat records, one row per instance, as on the hub (default ``Muennighoff/natural-instructions``: columns
  ``task_name``, ``definition``, ``inputs``, ``targets``), from ``hub_id`` or local files (JSON Lines, JSON,
  Parquet, CSV; one file, a directory of files, or a ``save_to_disk`` folder). All splits are pooled.

The prompt is ``Definition: <definition>\\n\\n`` (unless ``definition: false``), up to ``positive_examples``
worked examples, then ``Input: <input>\\nOutput:``; the response is the reference output.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import TYPE_CHECKING, Literal, TypedDict

from fedpeft.core.config import DataConfig
from fedpeft.core.errors import UserError
from fedpeft.core.registry import DATASETS
from fedpeft.core.seeds import derive_seed
from fedpeft.data.hub_check import saved_parts, searched_path
from fedpeft.data.options import DatasetOptions, parse_options
from fedpeft.data.real.labels import require_schema
from fedpeft.data.real.readers import FILE_EXTENSIONS, natural_key, read_tables
from fedpeft.data.real.sources import check_file_columns, check_hub_splits
from fedpeft.data.types import ClientData, Example, FederatedData

if TYPE_CHECKING:
    import datasets

DEFAULT_HUB_ID = "Muennighoff/natural-instructions"
LAYOUT = (
    "the natural-instructions release (a directory with tasks/taskNNN_*.json) or flat records with the columns "
    "task_name, definition, inputs, targets (JSON Lines, JSON, Parquet or CSV files, or a save_to_disk folder)"
)
FIELDS: dict[str, tuple[str, ...]] = {
    "task": ("task_name", "task"),
    "definition": ("definition", "Definition", "instruction"),
    "input": ("inputs", "input"),
    "output": ("targets", "output", "outputs"),
}
SCHEMA = tuple(FIELDS.values())
EXPECTED = "the columns task_name, definition, inputs, targets"


class Options(DatasetOptions):
    """``data.options`` of ``sni``."""

    num_tasks: int = 10
    tasks: list[str] | None = None
    unseen_tasks: int = 0
    train_per_client: int = 500
    test_per_client: int = 50
    validation_per_client: int = 0
    evaluate_on: Literal["test", "validation"] = "test"
    definition: bool = True
    positive_examples: int = 0


class Task(TypedDict):
    """One task of the release: its definition, its positive examples and its instances, as (input, output)."""

    definition: str
    examples: list[tuple[str, str]]
    instances: list[tuple[str, str]]


@DATASETS.register("sni", aliases=("super-natural-instructions",))
def build(cfg: DataConfig) -> FederatedData:
    """Build the one-task-per-client federation from ``cfg.path`` or ``cfg.hub_id``.

    Options: ``num_tasks`` (10), ``tasks`` (explicit task names instead of the largest), ``unseen_tasks`` (0: the
    next-largest tasks as unseen clients; none with ``unseen_pool: false``), ``train_per_client`` (500),
    ``test_per_client`` (50), ``validation_per_client`` (0), ``evaluate_on`` (``test`` or ``validation``: which
    held-out split the clients are evaluated on, e.g. to tune alpha or beta without touching the test split),
    ``definition`` (True) and ``positive_examples`` (0).
    """
    opts = _options(cfg)
    tasks, layout, source = _read_tasks(cfg, opts)
    chosen, unseen = _choose_tasks(tasks, opts, source)
    clients = []
    for name in chosen + unseen:
        train, test = _split_task(name, tasks[name], opts, cfg.seed)
        clients.append(ClientData(name, name, "unseen" if name in unseen else "seen", train, test))
    return FederatedData(
        name="sni",
        task="generation",
        label_names=None,
        groups=chosen + unseen,
        clients=clients,
        base_train=[],
        info={
            "source": source,
            "layout": layout,
            "tasks_available": len(tasks),
            "instances_per_task": {name: len(tasks[name]["instances"]) for name in chosen + unseen},
            "evaluate_on": opts.evaluate_on,
        },
    )


def check(cfg: DataConfig) -> None:
    """Refuse what :func:`build` would refuse before reading an instance: the options, a ``data.path`` that names
    nothing, the release's task files that ``data.options`` asks for (by name or by count), the columns of flat
    records (or, offline, a hub id the ``datasets`` cache lacks)."""
    opts = _options(cfg)
    if not cfg.path:
        check_hub_splits(cfg.hub_id or DEFAULT_HUB_ID, None, (), [SCHEMA], EXPECTED)
        return
    path = _local_path(cfg.path)
    release = _release_dir(path)
    if release is not None:
        _choose_tasks({file.stem: _NO_TASK for file in release.glob("task*.json")}, opts, str(release))
        return
    if (path / "dataset_dict.json").is_file():
        parts = saved_parts(path) or []
        for part in parts[:1]:  # the splits are concatenated: they share their columns
            require_schema(part.columns, [SCHEMA], part.source, EXPECTED)
        return
    check_file_columns(_record_files(path), [SCHEMA], "SNI records", EXPECTED)


_NO_TASK: Task = {"definition": "", "examples": [], "instances": []}  # a task file's name alone: all check reads


def _options(cfg: DataConfig) -> Options:
    opts = parse_options(cfg, Options)
    if opts.evaluate_on == "validation" and opts.validation_per_client < 1:
        raise UserError("data.options.evaluate_on=validation needs data.options.validation_per_client >= 1.")
    if not cfg.unseen_pool:
        opts = opts.model_copy(update={"unseen_tasks": 0})
    return opts


def _choose_tasks(tasks: dict[str, Task], opts: Options, source: str) -> tuple[list[str], list[str]]:
    ranked = sorted(tasks, key=lambda t: (-len(tasks[t]["instances"]), natural_key(t)))
    unseen_count = opts.unseen_tasks
    if opts.tasks is not None:
        missing = [t for t in opts.tasks if t not in tasks]
        if missing:
            raise UserError(f"data.options.tasks names task(s) {', '.join(missing)} that {source} does not hold.")
        chosen = list(dict.fromkeys(opts.tasks))
    else:
        chosen = ranked[: opts.num_tasks]
    rest = [t for t in ranked if t not in chosen]
    if (opts.tasks is None and len(chosen) < opts.num_tasks) or len(rest) < unseen_count:
        raise UserError(
            f"{source} holds {len(tasks)} tasks, fewer than the {opts.num_tasks} + {unseen_count} requested; "
            "lower data.options.num_tasks or data.options.unseen_tasks."
        )
    return chosen, rest[:unseen_count]


def _split_task(name: str, task: Task, opts: Options, seed: int) -> tuple[list[Example], list[Example]]:
    """Test first, then validation, then up to ``train_per_client`` training instances, all disjoint."""
    instances = list(task["instances"])
    random.Random(derive_seed(seed, "sni", name, stream="files")).shuffle(instances)
    n_test, n_val = opts.test_per_client, opts.validation_per_client
    if len(instances) < n_test + n_val + 1:
        raise UserError(
            f"Task {name} has {len(instances)} instances, too few for {n_test} test + {n_val} validation + 1 "
            "training; lower data.options.test_per_client or choose other tasks."
        )
    test, validation = instances[:n_test], instances[n_test : n_test + n_val]
    train = instances[n_test + n_val : n_test + n_val + opts.train_per_client]
    held_out = validation if opts.evaluate_on == "validation" else test
    prefix = _prefix(task, opts)

    def example(pair: tuple[str, str]) -> Example:
        return {"prompt": f"{prefix}Input: {pair[0]}\nOutput:", "response": pair[1], "group": name}

    return [example(p) for p in train], [example(p) for p in held_out]


def _prefix(task: Task, opts: Options) -> str:
    parts = [f"Definition: {task['definition']}\n\n"] if opts.definition and task["definition"] else []
    for i, (inp, out) in enumerate(task["examples"][: opts.positive_examples], start=1):
        parts.append(f"Positive Example {i}:\nInput: {inp}\nOutput: {out}\n\n")
    return "".join(parts)


# ------------------------------------------------------------------------------------------------ sources


def _read_tasks(cfg: DataConfig, opts: Options) -> tuple[dict[str, Task], str, str]:
    if cfg.path:
        path = _local_path(cfg.path)
        task_dir = _release_dir(path)
        if task_dir is not None:
            wanted = opts.tasks if not opts.unseen_tasks else None  # unseen tasks are the next-largest
            return _read_release(task_dir, wanted), "release", str(path)
        return _from_records(_local_records(path), str(path)), "records", str(path)
    import datasets
    from datasets.exceptions import DatasetsError

    hub_id = cfg.hub_id or DEFAULT_HUB_ID
    try:
        loaded = datasets.load_dataset(hub_id)
    except (OSError, ValueError, RuntimeError, DatasetsError) as err:
        raise UserError(
            f"Could not load {hub_id} from the Hugging Face cache or the Hub ({type(err).__name__}); download it "
            "once with network access, or set data.path to a local copy (see docs/real-data.md)."
        ) from err
    splits = list(loaded.values()) if isinstance(loaded, datasets.DatasetDict) else [loaded]
    return _from_records(datasets.concatenate_datasets(splits), f"hub:{hub_id}"), "records", f"hub:{hub_id}"


def _local_path(path: str) -> Path:
    local = Path(path).expanduser()
    if not local.exists():
        raise UserError(f"data.path {path} does not exist (searched {searched_path(local)}); point it at {LAYOUT}.")
    return local


def _release_dir(path: Path) -> Path | None:
    """The release's folder of task files (``<path>/tasks``, or ``path`` itself); ``None`` for flat records."""
    task_dir = path / "tasks" if (path / "tasks").is_dir() else path
    return task_dir if path.is_dir() and any(task_dir.glob("task*.json")) else None


def _read_release(task_dir: Path, wanted: list[str] | None) -> dict[str, Task]:
    """Every ``taskNNN_*.json`` (or only the ``wanted`` ones) of the release's ``tasks`` directory."""
    files = sorted(task_dir.glob("task*.json"), key=lambda p: natural_key(p.stem))
    if wanted is not None:
        files = [f for f in files if f.stem in set(wanted)]
    tasks: dict[str, Task] = {}
    for file in files:
        try:
            data = json.loads(file.read_text(encoding="utf-8"))
            instances = [(str(i["input"]), _first(i["output"])) for i in data["Instances"]]
            examples = [(str(e["input"]), _first(e["output"])) for e in data.get("Positive Examples", [])]
        except (json.JSONDecodeError, KeyError, TypeError) as err:
            raise UserError(
                f"{file} is not a natural-instructions task file ({type(err).__name__}); expected Definition, "
                "Positive Examples and Instances with input and output."
            ) from err
        definition = data.get("Definition")
        definition = " ".join(map(str, definition)) if isinstance(definition, list) else str(definition or "")
        tasks[file.stem] = {"definition": definition, "examples": examples, "instances": [p for p in instances if p[1]]}
    return tasks


def _local_records(path: Path) -> datasets.Dataset:
    import datasets
    from datasets.table import InMemoryTable

    if path.is_dir() and (path / "dataset_dict.json").is_file():
        saved = datasets.load_from_disk(str(path))
        return datasets.concatenate_datasets(list(saved.values()))
    return datasets.Dataset(InMemoryTable(read_tables(_record_files(path))))


def _record_files(path: Path) -> list[Path]:
    """The data files of flat records: ``path`` itself, or every data file under it."""
    if path.is_file():
        files = [path]
    else:
        files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in FILE_EXTENSIONS)
        files = [p for p in files if p.name not in ("dataset_info.json", "state.json")]
    if not files:
        raise UserError(f"{path} holds no task file or data file; expected {LAYOUT}.")
    return files


def _from_records(ds: datasets.Dataset, where: str) -> dict[str, Task]:
    columns = {}
    for role, names in FIELDS.items():
        found = next((n for n in names if n in ds.column_names), None)
        if found is None:
            raise UserError(f"{where} has no {role} column (tried {', '.join(names)}); expected {LAYOUT}.")
        columns[role] = found
    tasks: dict[str, Task] = {}
    rows = zip(*(ds[columns[r]] for r in ("task", "definition", "input", "output")), strict=True)
    for task, definition, inp, out in rows:
        entry = tasks.setdefault(str(task), {"definition": _first(definition), "examples": [], "instances": []})
        target = _first(out)
        if target:
            entry["instances"].append((str(inp), target))
    return tasks


def _first(value: object) -> str:
    """The first reference of a list of outputs (or the value itself)."""
    if isinstance(value, list):
        return str(value[0]).strip() if value else ""
    return "" if value is None else str(value).strip()
