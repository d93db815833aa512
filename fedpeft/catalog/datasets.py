"""The datasets fedpeft ships, declared in :data:`~fedpeft.core.registry.DATASETS` (importing no builder)."""

from fedpeft.core.registry import DATASETS

_REAL = "fedpeft.data.real."
_SYNTHETIC = "fedpeft.data.synthetic."

# Real benchmarks (fedpeft/data/real, layouts in docs/real-data.md).
DATASETS.declare(
    "alpagasus",
    _REAL + "alpagasus",
    "AlpaGasus: the 9k Alpaca instructions rated >= 4.5, skewed by instruction type over clients (FLAME)",
)
DATASETS.declare(
    "cifar100",
    _REAL + "cifar100",
    "CIFAR-100 with Dirichlet label skew, each client's test split following its own labels (Potara)",
)
DATASETS.declare(
    "commonsense",
    _REAL + "commonsense",
    "Commonsense reasoning (8 tasks: ARC, BoolQ, HellaSwag, ...), one task per client, answered in words",
)
DATASETS.declare(
    "dolly",
    _REAL + "dolly",
    "Dolly-15k instructions, a Dirichlet partition over their 8 categories (FLAME)",
)
DATASETS.declare(
    "drake",
    _REAL + "tasks",
    "DRAKE: FedMosaic's 40 multi-modal tasks over 10 clients, arriving one after another (local directory)",
)
DATASETS.declare(
    "fedaya",
    _REAL + "fedaya",
    "Fed-Aya: multilingual instruction tuning with natural annotator clients (local file)",
)
DATASETS.declare(
    "fedscope",
    _REAL + "tasks",
    "Fed-Scope: text clients learning coding, mathematics or general capability (local directory)",
)
DATASETS.declare(
    "flan",
    _REAL + "flan",
    "FLAN-8: eight FLAN tasks, one per client, scored with ROUGE",
)
DATASETS.declare(
    "hflb",
    _REAL + "tasks",
    "HFLB: 7 VQA datasets over 9 clients, each split into 4 question-type tasks (local directory)",
)
DATASETS.declare(
    "masakhanews",
    _REAL + "masakhanews",
    "MasakhaNEWS: news topic classification in 16 African languages, per-language client pools",
)
DATASETS.declare(
    "sni",
    _REAL + "sni",
    "Super-NaturalInstructions: the largest tasks, one client per task",
    aliases=("super-natural-instructions",),
)
DATASETS.declare(
    "xnli",
    _REAL + "xnli",
    "XNLI: cross-lingual natural language inference, per-language client pools",
)

# Generic datasets: a user's own data (fedpeft/data/files.py, keys in docs/real-data.md).
DATASETS.declare(
    "files",
    "fedpeft.data.files",
    "Your own data: .jsonl/.json/.csv/.tsv/.parquet files (a file, directory or glob), clients by column or drawn",
)
DATASETS.declare(
    "hub",
    "fedpeft.data.files",
    "Your own data from datasets.load_dataset (a hub id read from the cache, or a local dataset directory)",
)

# Synthetic benchmarks (fedpeft/data/synthetic, generated from a seed and cached; docs/data.md).
DATASETS.declare(
    "synthetic-fedaya",
    _SYNTHETIC + "fedaya",
    "Synthetic multilingual instruction following with annotator clients, Fed-Aya-style",
)
DATASETS.declare(
    "synthetic-images",
    _SYNTHETIC + "images",
    "Synthetic small images classed by shape x colour x texture, with label skew",
)
DATASETS.declare(
    "synthetic-instructions",
    _SYNTHETIC + "instructions_en",
    "Synthetic categorized English instructions in the Alpaca template, Dolly-style (FLAME)",
)
DATASETS.declare(
    "synthetic-masakhanews",
    _SYNTHETIC + "masakhanews",
    "Synthetic multilingual headline topic classification with quantity skew, MasakhaNEWS-style",
)
DATASETS.declare(
    "synthetic-mosaic",
    _SYNTHETIC + "mosaic",
    "Synthetic: four instruction tasks per client arriving one after another (FedMosaic's PFL setting)",
)
DATASETS.declare(
    "synthetic-tasks",
    _SYNTHETIC + "tasks",
    "Synthetic task-heterogeneous instructions, one task family per client",
)
DATASETS.declare(
    "synthetic-vqa",
    _SYNTHETIC + "vqa",
    "Synthetic questions about small drawn images, four tasks per client (multi-modal FedMosaic setting)",
)
DATASETS.declare(
    "synthetic-xnli",
    _SYNTHETIC + "xnli",
    "Synthetic multilingual sentence-pair classification (entailment, neutral, contradiction), XNLI-style",
)
