"""The federation's shape without its data: clients per pool and examples per client.

A synthetic dataset is built (seconds, no torch) and its clients counted. A real dataset is not read: its shape
follows from the dataset's published sizes (the tables below, each with its source) and its loader's partition
rules (fedpeft/data/real, docs/real-data.md). A size nobody published, or data in a local directory that is not
there, stays ``None``: the plan says "unknown" rather than guess.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from fedpeft.core.config import DataConfig, ExperimentConfig
from fedpeft.core.registry import DATASETS
from fedpeft.data.options import setting


@dataclass(frozen=True)
class Federation:
    """Clients per pool (``seen`` trains, ``unseen`` is evaluated only) and their training and test examples in
    total per pool (``None``: unknown); ``labels``: classes of a classification task (None: generation)."""

    dataset: str
    clients: dict[str, int]
    train_rows: dict[str, int | None]
    test_rows: dict[str, int | None]
    task: str
    rule: str
    source: str
    labels: int | None = None
    base_rows: int = 0
    notes: list[str] = field(default_factory=list)
    # Image-text data read here: per client, its training examples by how many images each holds (index n: the
    # examples with n images); empty where unknown (an image-text model then counts one an example).
    images: list[list[float]] = field(default_factory=list)

    @property
    def total_clients(self) -> int:
        return sum(self.clients.values())

    def train_per_client(self, pool: str) -> float | None:
        """The mean training examples of a client of ``pool`` (None: unknown)."""
        rows, count = self.train_rows.get(pool), self.clients.get(pool, 0)
        return None if rows is None or not count else rows / count

    def test_per_client(self, pool: str) -> float | None:
        rows, count = self.test_rows.get(pool), self.clients.get(pool, 0)
        return None if rows is None or not count else rows / count


def _pools(cfg: DataConfig) -> tuple[str, ...]:
    return ("seen", "unseen") if cfg.unseen_pool else ("seen",)


def _even(
    name: str, clients: int, train: int | None, test: int | None, task: str, rule: str, source: str, **more: object
) -> Federation:
    """One pool of ``clients`` holding ``train`` / ``test`` examples in all."""
    return Federation(name, {"seen": clients}, {"seen": train}, {"seen": test}, task, rule, source, **more)  # type: ignore[arg-type]


# XNLI: 392,702 training pairs (MultiNLI, machine-translated) and 5,010 test pairs in each of 15 languages
# (Conneau et al., "XNLI: Evaluating Cross-lingual Sentence Representations", EMNLP 2018; facebook/xnli card).
XNLI_LANGUAGES = ("ar", "bg", "de", "el", "en", "es", "fr", "hi", "ru", "sw", "th", "tr", "ur", "vi", "zh")
XNLI_TRAIN, XNLI_TEST = 392_702, 5_010


def xnli(cfg: ExperimentConfig) -> Federation:
    data, pools = cfg.data, _pools(cfg.data)
    languages = len(data.groups or XNLI_LANGUAGES)
    train = min(data.train_per_group, XNLI_TRAIN // len(pools))
    test = min(data.test_per_group, XNLI_TEST // len(pools))
    return Federation(
        "xnli",
        {pool: languages * data.clients_per_group for pool in pools},
        {pool: languages * train for pool in pools},
        {pool: languages * test for pool in pools},
        "classification",
        f"{languages} languages x {len(pools)} pool(s) x {data.clients_per_group} clients, "
        f"{train} train / {test} test per language and pool, {data.partition} label skew",
        "published sizes (Conneau et al., EMNLP 2018)",
        labels=3,
    )


# MasakhaNEWS: (train, test) rows per language (Adelani et al., "MasakhaNEWS: News Topic Classification for African
# languages", IJCNLP-AACL 2023; the masakhane/masakhanews dataset card, "Data Splits").
MASAKHANEWS_SIZES: dict[str, tuple[int, int]] = {
    "amh": (1311, 376), "eng": (3309, 948), "fra": (1476, 422), "hau": (2219, 637),
    "ibo": (1356, 390), "lin": (608, 175), "lug": (771, 223), "orm": (1015, 292),
    "pcm": (1060, 305), "run": (1117, 322), "sna": (1288, 369), "som": (1021, 294),
    "swa": (1658, 476), "tir": (947, 272), "xho": (1032, 297), "yor": (1433, 411),
}  # fmt: skip


def masakhanews(cfg: ExperimentConfig) -> Federation:
    data, pools = cfg.data, _pools(cfg.data)
    languages = list(data.groups or MASAKHANEWS_SIZES)
    per_group = setting(data, "clients_per_group", 10)
    caps = setting(data, "train_per_group", None), setting(data, "test_per_group", None)

    def rows(split: int) -> int:
        per_pool = [MASAKHANEWS_SIZES[lang][split] // len(pools) for lang in languages if lang in MASAKHANEWS_SIZES]
        cap = caps[split]
        return sum(min(n, cap) if cap is not None else n for n in per_pool)

    return Federation(
        "masakhanews",
        {pool: len(languages) * per_group for pool in pools},
        {pool: rows(0) for pool in pools},
        {pool: rows(1) for pool in pools},
        "classification",
        f"{len(languages)} languages x {len(pools)} pool(s) x {per_group} clients, each language's splits halved "
        f"between the pools (real size skew), {data.partition} label skew",
        "published sizes (Adelani et al., 2023; dataset card)",
        labels=7,
    )


# Fed-Aya: the FedLLM-Bench release file aya_38c_25k.json, 38 annotator clients and about 25,000 samples (Ye et al.,
# "FedLLM-Bench: Realistic Benchmarks for Federated Learning of Large Language Models", 2024): only the total.
FEDAYA_SAMPLES = 25_000


def fedaya(cfg: ExperimentConfig) -> Federation:
    options = cfg.data.options
    kept = options.get("num_clients", 38)
    kept = 38 if kept in (None, "all", 0) else int(kept)
    unseen = int(options.get("unseen_clients", 8)) if cfg.data.unseen_pool else 0
    test_fraction = float(options.get("test_fraction", 0.2))
    total = FEDAYA_SAMPLES * min(kept, 38) / 38
    share = {"seen": (kept - unseen) / kept, "unseen": unseen / kept}
    return Federation(
        "fedaya",
        {"seen": kept - unseen, "unseen": unseen},
        {pool: round(total * s * (1 - test_fraction)) for pool, s in share.items()},
        {pool: round(total * s * test_fraction) for pool, s in share.items()},
        "generation",
        f"the {kept} largest annotators, {unseen} of them unseen, each cut {1 - test_fraction:.0%} / "
        f"{test_fraction:.0%}",
        "published total only (FedLLM-Bench, about 25,000 samples over 38 clients); clients assumed equal",
        notes=["Fed-Aya's clients differ in size; the plan spreads the published total evenly over them."],
    )


def sni(cfg: ExperimentConfig) -> Federation:
    options = cfg.data.options
    tasks = options.get("tasks")
    seen = len(tasks) if tasks else int(options.get("num_tasks", 10))
    unseen = int(options.get("unseen_tasks", 0)) if cfg.data.unseen_pool else 0
    train, test = int(options.get("train_per_client", 500)), int(options.get("test_per_client", 50))
    # The largest tasks of the release hold thousands of instances (the release caps a task at 6,500), so every
    # client gets its full train_per_client (Wang et al., "Super-NaturalInstructions", EMNLP 2022).
    return Federation(
        "sni",
        {"seen": seen, "unseen": unseen},
        {"seen": seen * train, "unseen": unseen * train},
        {"seen": seen * test, "unseen": unseen * test},
        "generation",
        f"one client per task: the {seen} largest tasks (+{unseen} unseen), {train} train / {test} test each",
        "configured per-client counts (the largest tasks hold more)",
    )


# Dolly-15k: 15,011 records (databricks/databricks-dolly-15k card); AlpaGasus: 9,229 (Chen et al., ICLR 2024;
# mlabonne/alpagasus). Both split over num_clients clients, then 80 / 10 / 10 per client (fedpeft.data.instruct).
INSTRUCTION_RECORDS = {"dolly": 15_011, "alpagasus": 9_229}


def instructions(cfg: ExperimentConfig) -> Federation:
    name, options = cfg.data.name, cfg.data.options
    clients = int(options.get("num_clients", 4))
    records = min(INSTRUCTION_RECORDS[name], int(options.get("max_samples") or INSTRUCTION_RECORDS[name]))
    return _even(
        name,
        clients,
        round(records * 0.8),
        round(records * 0.1),
        "generation",
        f"{records} records over {clients} clients ({cfg.data.partition} over categories), 80/10/10 per client",
        "published size (dataset card)",
    )


# The commonsense suite: (train, test) rows per task, test being the labelled validation split where the test
# labels are hidden (the tasks' hub cards, as tabulated by Hu et al., "LLM-Adapters", EMNLP 2023).
COMMONSENSE_SIZES: dict[str, tuple[int, int]] = {
    "arc-c": (1119, 1172), "arc-e": (2251, 2376), "boolq": (9427, 3270), "hellaswag": (39905, 10042),
    "obqa": (4957, 500), "piqa": (16113, 1838), "siqa": (33410, 1954), "winogrande": (40398, 1267),
}  # fmt: skip


def commonsense(cfg: ExperimentConfig) -> Federation:
    data = cfg.data
    tasks = list(data.groups or COMMONSENSE_SIZES)
    per_task = int(data.options.get("clients_per_task", 1))
    want = setting(data, "train_per_group", 1000), setting(data, "test_per_group", 500)
    train = sum(per_task * min(want[0], COMMONSENSE_SIZES[t][0] // per_task) for t in tasks)
    test = sum(per_task * min(want[1], COMMONSENSE_SIZES[t][1] // per_task) for t in tasks)
    return _even(
        "commonsense",
        len(tasks) * per_task,
        train,
        test,
        "generation",
        f"{len(tasks)} tasks x {per_task} client(s), {want[0]} train / {want[1]} test per client (fewer where the task "
        "has fewer)",
        "published sizes (LLM-Adapters, EMNLP 2023)",
    )


FLAN_TASKS = 8


def flan(cfg: ExperimentConfig) -> Federation:
    tasks = len(cfg.data.groups or range(FLAN_TASKS))
    train, test = setting(cfg.data, "train_per_group", 2000), setting(cfg.data, "test_per_group", 300)
    return _even(
        "flan",
        tasks,
        tasks * train,
        tasks * test,
        "generation",
        f"one client per FLAN task ({tasks}), {train} train / {test} test each",
        "configured per-client counts (FLAN's tasks hold more)",
    )


# CIFAR-100: 50,000 training and 10,000 test images (Krizhevsky, "Learning Multiple Layers of Features from Tiny
# Images", 2009).
CIFAR100_TRAIN, CIFAR100_TEST = 50_000, 10_000


def cifar100(cfg: ExperimentConfig) -> Federation:
    clients = int(cfg.data.options.get("num_clients", 10))
    train, test = setting(cfg.data, "train_per_group", None), setting(cfg.data, "test_per_group", None)
    return _even(
        "cifar100",
        clients,
        min(CIFAR100_TRAIN, clients * train) if train else CIFAR100_TRAIN,
        min(CIFAR100_TEST, clients * test) if test else CIFAR100_TEST,
        "classification",
        f"the whole splits over {clients} clients, Dirichlet({cfg.data.dirichlet_alpha}) label skew",
        "published sizes (Krizhevsky, 2009)",
        labels=100,
    )


# FedMosaic's benchmarks are read from a local directory; without it, the clients the paper gives (DRAKE: 10,
# HFLB: 9, Fed-Scope: 5; Seo et al., "FedMosaic", 2025) and unknown sizes.
MOSAIC_CLIENTS = {"drake": 10, "hflb": 9, "fedscope": 5}


def mosaic_tasks(cfg: ExperimentConfig) -> Federation:
    name, data = cfg.data.name, cfg.data
    directory = Path(data.path).expanduser() if data.path else None
    cap: tuple[int | None, int | None] = (data.options.get("train_per_task"), data.options.get("test_per_task"))
    if directory is not None and (directory / "clients.json").is_file():
        listing: dict[str, list[str]] = json.loads((directory / "clients.json").read_text())
        rows, images = [0, 0], []
        for tasks in listing.values():
            held: list[float] = []
            for task in tasks:
                for i, split in enumerate(("train", "test")):
                    path = directory / "tasks" / task / f"{split}.jsonl"
                    lines = [line for line in path.open() if line.strip()] if path.is_file() else []
                    limit = cap[i]
                    kept = min(len(lines), limit) if limit else len(lines)
                    rows[i] += kept
                    if split == "train" and lines:  # a capped task keeps a seeded sample: the same shares
                        for line in lines:
                            n = _images_of(line)
                            held += [0.0] * (n + 1 - len(held))
                            held[n] += kept / len(lines)
            images.append(held)
        return _even(name, len(listing), rows[0], rows[1], "generation", f"{len(listing)} clients of "
                     f"{directory / 'clients.json'}, their tasks' rows", f"counted in {directory}",
                     images=images)  # fmt: skip
    clients = sum(cfg.assign.counts.values()) or MOSAIC_CLIENTS[name]
    known = [cap[0] * 4 * clients if cap[0] else None, cap[1] * 4 * clients if cap[1] else None]
    return _even(
        name,
        clients,
        known[0],
        known[1],
        "generation",
        f"{clients} clients, their tasks from {data.path or 'data.path'}/clients.json",
        "unknown: the local directory is not here",
        notes=[f"{name}'s sizes are unknown until data.path ({data.path}) holds it; epoch-based work is unknown."],
    )


def _images_of(line: str) -> int:
    """The images of one row of an image-text task's JSON Lines file (``image``: a path or a list of them)."""
    image = json.loads(line).get("image")
    if image is None:
        return 0
    return len(image) if isinstance(image, list) else 1


REAL: dict[str, Callable[[ExperimentConfig], Federation]] = {
    "xnli": xnli,
    "masakhanews": masakhanews,
    "fedaya": fedaya,
    "sni": sni,
    "super-natural-instructions": sni,
    "dolly": instructions,
    "alpagasus": instructions,
    "commonsense": commonsense,
    "flan": flan,
    "cifar100": cifar100,
    "drake": mosaic_tasks,
    "hflb": mosaic_tasks,
    "fedscope": mosaic_tasks,
}


def built(cfg: ExperimentConfig) -> Federation:
    """The shape of a dataset fedpeft builds here (synthetic, or files that are present): its clients counted."""
    data = DATASETS.get(cfg.data.name)(cfg.data)
    pools = sorted({c.pool for c in data.clients}, key=lambda p: (p != "seen", p))
    return Federation(
        data.name,
        {p: sum(1 for c in data.clients if c.pool == p) for p in pools},
        {p: sum(len(c.train) for c in data.clients if c.pool == p) for p in pools},
        {p: sum(len(c.test) for c in data.clients if c.pool == p) for p in pools},
        data.task,
        f"{len(data.clients)} clients built from the config",
        "built (synthetic or local files)",
        labels=len(data.label_names) if data.label_names else None,
        base_rows=len(data.base_train),
    )


def federation_of(cfg: ExperimentConfig) -> Federation:
    """The shape of ``cfg``'s federation (see the module docstring)."""
    if cfg.data.name in REAL:
        return REAL[cfg.data.name](cfg)
    if cfg.data.name == "hub" or (cfg.data.name == "files" and not (cfg.data.path and Path(cfg.data.path).exists())):
        return _even(cfg.data.name, cfg.data.num_clients or 0, None, None, cfg.data.task or "classification",
                     "clients from the data", "unknown: the data is not read by a plan")  # fmt: skip
    return built(cfg)
