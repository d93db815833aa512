"""Fed-Aya (multilingual instruction tuning with natural annotator clients) from a local file.

Two layouts are read:

- the FedLLM-Bench release file (``Fed-Aya/aya_38c_25k.json``): one JSON object mapping each client (an
  Aya annotator) to the list of its samples, each with ``instruction``, ``response`` and ``language``;
- a generic JSON list or JSON Lines file of samples that carry the client id in a field (for instance the
  original Aya dataset's ``inputs``/``targets``/``language``/``user_id``).

Clients are the natural ids (``partition_examples(..., "natural")``). Clients with fewer than 2 samples
(after the ``groups`` filter) are dropped; by default the 38 largest of the others are kept, 8 of them
(drawn with ``cfg.seed``) form the unseen pool, and each client's samples are cut 80/20 into train and
test. A client's group is its predominant language; every example keeps its own language in ``"group"``.
"""

from __future__ import annotations

import random
import warnings
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, cast

from pydantic import StrictInt

from fedpeft.core.config import DataConfig
from fedpeft.core.errors import UserError
from fedpeft.core.jsontypes import JSONObject, JSONValue
from fedpeft.core.registry import DATASETS
from fedpeft.core.seeds import derive_seed
from fedpeft.data.hub_check import searched_path
from fedpeft.data.options import DatasetOptions, parse_options, setting
from fedpeft.data.partition import partition_examples, split_train_test
from fedpeft.data.real.readers import load_json_or_lines, natural_key
from fedpeft.data.types import ClientData, Example, FederatedData

FEDAYA_LANGUAGES = ("ar", "en", "es", "fr", "pt", "ru", "te", "zh")
RELEASE_FILES = ("aya_38c_25k.json", "Fed-Aya/aya_38c_25k.json")
LAYOUT = (
    "the FedLLM-Bench file Fed-Aya/aya_38c_25k.json (a JSON object mapping each client id to a list of "
    "samples with instruction, response and language), or a JSON list / JSON Lines file of samples with a "
    "client id field"
)
# Field names tried in order when the matching option is not given.
FIELD_CANDIDATES: dict[str, tuple[str, ...]] = {
    "prompt": ("instruction", "inputs", "prompt"),
    "response": ("response", "targets", "output"),
    "language": ("language", "language_code", "lang"),
    "client": ("client_id", "user_id", "annotator_id"),
}
# Spellings of the Fed-Aya languages in the original Aya release, mapped to the codes used here.
LANGUAGE_ALIASES = {
    "arabic": "ar", "standard arabic": "ar", "standard_arabic": "ar", "arb": "ar",
    "english": "en", "eng": "en",
    "spanish": "es", "spa": "es",
    "french": "fr", "fra": "fr",
    "portuguese": "pt", "por": "pt",
    "russian": "ru", "rus": "ru",
    "telugu": "te", "tel": "te",
    "chinese": "zh", "simplified chinese": "zh", "simplified_chinese": "zh", "zho": "zh",
}  # fmt: skip


class Options(DatasetOptions):
    """``data.options`` of ``fedaya`` (see :func:`build`)."""

    file: str | None = None
    num_clients: StrictInt | Literal["all"] | None = 38
    unseen_clients: StrictInt = 8
    unseen_ids: list[str | int] | None = None
    test_fraction: float = 0.2
    prompt_field: str | None = None
    response_field: str | None = None
    language_field: str | None = None
    client_field: str | None = None


def normalize_language(value: object) -> str:
    """A language code: Aya's names (``"Standard Arabic"``) and ISO 639-3 codes map to the 2-letter codes."""
    text = str(value).strip()
    return LANGUAGE_ALIASES.get(text.lower(), text.lower())


@DATASETS.register("fedaya")
def build(cfg: DataConfig) -> FederatedData:
    """Build the Fed-Aya federation from the local file or directory ``cfg.path``.

    Options: ``file`` (file name inside a ``cfg.path`` directory), ``num_clients`` (38; ``"all"`` keeps
    every client), ``unseen_clients`` (8), ``unseen_ids`` (explicit unseen client ids), ``test_fraction``
    (0.2) and ``prompt_field`` / ``response_field`` / ``language_field`` / ``client_field`` (source field
    names; tried in order otherwise: instruction|inputs|prompt, response|targets|output,
    language|language_code|lang, client_id|user_id|annotator_id).
    """
    selection = _select(cfg)
    file, records, unseen, test_fraction = selection.file, selection.records, selection.unseen, selection.test_fraction
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        shards = partition_examples(records, len(selection.kept), "natural", natural_column="client")
    clients: list[ClientData] = []
    for shard in sorted(shards, key=lambda s: natural_key(s[0]["client"])):
        client_id = str(shard[0]["client"])
        examples = [{k: v for k, v in e.items() if k != "client"} for e in shard]
        counts = Counter(e["group"] for e in examples)
        group = min(counts, key=lambda lang: (-counts[lang], lang))
        train, test = split_train_test(
            examples, test_fraction, derive_seed(cfg.seed, "fedaya", client_id, stream="files")
        )
        pool = "unseen" if client_id in unseen else "seen"
        clients.append(ClientData(client_id, group, pool, train, test))
    clients.sort(key=lambda c: (c.pool != "seen", natural_key(c.client_id)))

    language_counts = Counter(r["group"] for r in records)
    return FederatedData(
        name="fedaya",
        task="generation",
        label_names=None,
        groups=_ordered_languages(language_counts),
        clients=clients,
        base_train=[],
        info={
            "source": str(file),
            "layout": selection.layout,
            "num_clients": len(clients),
            "unseen_clients": sorted(unseen, key=natural_key),
            "dropped_clients": selection.dropped,
            "test_fraction": test_fraction,
            "samples_per_language": dict(sorted(language_counts.items())),
            "samples_per_client": {c.client_id: len(c.train) + len(c.test) for c in clients},
        },
    )


@dataclass(frozen=True)
class _Selection:
    """What :func:`_select` reads of the file and keeps: the records of the clients kept (``{"prompt", "response",
    "group", "client"}``), those clients, the ones dropped (fewer than 2 samples), the unseen ones, and the test
    fraction of each client."""

    file: Path
    layout: str
    records: list[Example]
    kept: set[str]
    dropped: list[str]
    unseen: set[str]
    test_fraction: float


def check(cfg: DataConfig) -> None:
    """Refuse what :func:`build` would refuse before partitioning: the options, the file, its fields, the languages
    of ``data.groups`` and the clients kept and held out (it reads the file, as the build does)."""
    _select(cfg)


def _select(cfg: DataConfig) -> _Selection:
    opts = parse_options(cfg, Options)
    test_fraction = _fraction(opts.test_fraction)
    if setting(cfg, "partition", "natural") != "natural":
        raise UserError("Fed-Aya clients are its natural annotator ids; set data.partition=natural or remove it.")
    if cfg.hub_id and not cfg.path:
        raise UserError("Fed-Aya is distributed as a file, not a hub dataset; set data.path instead of data.hub_id.")
    if not cfg.path:
        raise UserError(f"Fed-Aya needs data.path; set it to {LAYOUT}.")
    file = _find_file(Path(cfg.path).expanduser(), opts.file)
    records, layout = _read_records(file, opts)
    languages_present = Counter(r["group"] for r in records)
    if cfg.groups is not None:
        wanted = [normalize_language(g) for g in cfg.groups]
        unknown = [g for g, w in zip(cfg.groups, wanted, strict=True) if w not in languages_present]
        if not wanted or unknown:
            raise UserError(
                f"data.groups names language(s) {', '.join(unknown) or '(none)'} that {file} does not "
                f"contain; choose from: {', '.join(_ordered_languages(languages_present))}."
            )
        records = [r for r in records if r["group"] in set(wanted)]

    kept, dropped = _keep_clients(records, opts.num_clients, file)
    records = [r for r in records if r["client"] in kept]
    unseen = _unseen_clients(sorted(kept, key=natural_key), opts, cfg)
    return _Selection(file, layout, records, kept, dropped, unseen, test_fraction)


def _find_file(path: Path, name: str | None) -> Path:
    if not path.exists():
        raise UserError(f"data.path {path} does not exist (searched {searched_path(path)}); point it at {LAYOUT}.")
    if path.is_file():
        return path
    if name:
        candidate = path / name
        if not candidate.is_file():
            raise UserError(f"data.options.file={name} is not a file in {path}; give the name of the Fed-Aya file.")
        return candidate
    for rel in RELEASE_FILES:
        if (path / rel).is_file():
            return path / rel
    files = sorted(p for p in path.iterdir() if p.is_file() and p.suffix in (".json", ".jsonl"))
    if len(files) == 1:
        return files[0]
    found = f"{len(files)} JSON files" if files else "no JSON file"
    raise UserError(
        f"{path} holds {found} and no aya_38c_25k.json; point data.path at the file or set data.options.file "
        f"(expected {LAYOUT})."
    )


def _read_records(file: Path, opts: Options) -> tuple[list[Example], str]:
    """Flatten the file into ``{"prompt", "response", "group", "client"}`` records."""
    data = load_json_or_lines(file)
    samples: list[tuple[str | None, JSONValue]]
    if isinstance(data, dict) and data and all(isinstance(v, list) for v in data.values()):
        layout = "fedllm-bench"
        by_client = cast(dict[str, list[JSONValue]], data)  # every value a list, as checked
        samples = [(str(client), sample) for client, items in by_client.items() for sample in items]
    elif isinstance(data, list) and data:
        layout = "records"
        samples = [(None, sample) for sample in data]
    else:
        raise UserError(f"{file} does not hold Fed-Aya samples; expected {LAYOUT}.")
    if not all(isinstance(s, dict) for _, s in samples):
        raise UserError(f"{file} holds samples that are not JSON objects; expected {LAYOUT}.")
    objects = cast("list[tuple[str | None, JSONObject]]", samples)
    first = objects[0][1]
    roles = ("prompt", "response", "language") + (("client",) if layout == "records" else ())
    fields = {role: _field(role, getattr(opts, f"{role}_field"), first, file) for role in roles}

    records: list[Example] = []
    for index, (client, sample) in enumerate(objects):
        for role, field in fields.items():
            if field not in sample:
                raise UserError(
                    f"Sample {index} of {file.name} has no field {field!r}; "
                    f"set data.options.{role}_field to the name your file uses."
                )
        records.append(
            {
                "prompt": str(sample[fields["prompt"]]),
                "response": str(sample[fields["response"]]),
                "group": normalize_language(sample[fields["language"]]),
                "client": client if client is not None else str(sample[fields["client"]]),
            }
        )
    return records, layout


def _field(role: str, option: str | None, sample: dict, file: Path) -> str:
    if option:
        return option
    for name in FIELD_CANDIDATES[role]:
        if name in sample:
            return name
    raise UserError(
        f"{file.name} has no {role} field (tried {', '.join(FIELD_CANDIDATES[role])}); "
        f"set data.options.{role}_field to the name your file uses."
    )


def _keep_clients(
    records: list[Example], num_clients: int | Literal["all"] | None, file: Path
) -> tuple[set[str], list[str]]:
    """The ``num_clients`` largest clients with at least 2 samples, and the clients dropped for having fewer."""
    all_counts = Counter(r["client"] for r in records)
    counts = {c: n for c, n in all_counts.items() if n >= 2}  # a client needs one train and one test sample
    dropped = sorted((c for c in all_counts if c not in counts), key=natural_key)
    if num_clients in (None, "all", 0):
        num_clients = len(counts)
    elif not isinstance(num_clients, int) or isinstance(num_clients, bool) or num_clients < 1:
        raise UserError(f"data.options.num_clients={num_clients!r} must be a positive integer or 'all'.")
    if num_clients > len(counts) or not counts:
        raise UserError(
            f"{file.name} holds {len(counts)} clients with at least 2 samples (after the data.groups filter), "
            f"fewer than the {num_clients or 1} requested; lower data.options.num_clients or set it to 'all'."
        )
    ranked = sorted(counts, key=lambda c: (-counts[c], natural_key(c)))
    return set(ranked[:num_clients]), dropped


def _unseen_clients(client_ids: list[str], opts: Options, cfg: DataConfig) -> set[str]:
    if not cfg.unseen_pool:
        return set()
    explicit = opts.unseen_ids
    if explicit is not None:
        ids = [str(i) for i in explicit]
        missing = [i for i in ids if i not in client_ids]
        if missing:
            raise UserError(
                f"data.options.unseen_ids names client(s) {', '.join(missing)} that are not among the kept "
                "Fed-Aya clients; use ids from the file or raise data.options.num_clients."
            )
        chosen = set(ids)
    else:
        k = opts.unseen_clients
        if not isinstance(k, int) or isinstance(k, bool) or k < 0:
            raise UserError(f"data.options.unseen_clients={k!r} must be a non-negative integer.")
        if k >= len(client_ids):
            raise UserError(
                f"data.options.unseen_clients={k} leaves no seen client among {len(client_ids)}; "
                "lower it or raise data.options.num_clients."
            )
        chosen = set(random.Random(cfg.seed).sample(client_ids, k))
    if len(chosen) >= len(client_ids):
        raise UserError("Every Fed-Aya client is unseen; leave at least one client out of data.options.unseen_ids.")
    return chosen


def _fraction(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1:
        raise UserError(f"data.options.test_fraction={value!r} must be a number between 0 and 1, e.g. 0.2.")
    return float(value)


def _ordered_languages(counts: Counter) -> list[str]:
    known = [lang for lang in FEDAYA_LANGUAGES if lang in counts]
    return known + sorted(lang for lang in counts if lang not in FEDAYA_LANGUAGES)
