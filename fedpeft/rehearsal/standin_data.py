"""Generated stand-ins for the real datasets, written in each dataset's real local layout (docs/real-data.md).

A rehearsal runs a paper preset at its true shape on this machine. Where the real data is not here (no
``data.path``, the hub id not in the local Hugging Face cache), :func:`write_standin` writes a stand-in that the
dataset's own loader reads as it would read the real copy: the same files, columns, label encoding and label set,
languages or tasks and prompt format, sized so that the federation comes out at its true shape (client counts,
pools, groups and per-client sizes). The texts are pseudo-words: each language has its own lexicon in its own
script (Latin with the language's letters, Cyrillic, Greek, Arabic, Devanagari, Ethiopic, Thai, Telugu, Han), drawn
with Zipf frequencies, at the mean lengths per field of :data:`MEAN_WORDS`; images are small generated PNGs. Nothing
written here is real data, and nothing learned on it is a result.

Sizes (what is written, per dataset):

- XNLI, FLAN, SNI: what the config draws (pools x ``train_per_group`` / ``test_per_group``, ``num_tasks`` tasks of
  test + validation + train instances) and :func:`_margin` more; the real sets hold more, which a draw never sees.
- MasakhaNEWS (per language), Dolly (15,011), AlpaGasus (9,229), commonsense (per task), CIFAR-100 (50,000 /
  10,000): the published sizes of :mod:`fedpeft.planning.federation`; a cap the config sets explicitly cuts them to
  what it draws.
- Fed-Aya: 25,000 samples over the 38 annotator clients of ``aya_38c_25k.json``, sizes log-normal (the release
  publishes only the total), languages as :data:`AYA_CLIENTS_PER_LANGUAGE`.
- DRAKE, HFLB, Fed-Scope: sizes nobody published; the assumptions of :data:`MOSAIC_SIZES`.

``scale`` (below 1) cuts the published and assumed sizes for quick checks; the rows a config draws are never cut.
Imports no torch (``datasets`` only through the AlpaGasus loader's table of instruction types, when writing it).
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TypedDict

import numpy as np

from fedpeft.core.config import ExperimentConfig
from fedpeft.core.errors import UserError
from fedpeft.core.jsontypes import JSONObject
from fedpeft.core.seeds import derive_seed
from fedpeft.data.options import setting
from fedpeft.planning.federation import (
    CIFAR100_TEST,
    CIFAR100_TRAIN,
    COMMONSENSE_SIZES,
    FEDAYA_SAMPLES,
    INSTRUCTION_RECORDS,
    MASAKHANEWS_SIZES,
    MOSAIC_CLIENTS,
    XNLI_LANGUAGES,
    XNLI_TEST,
    XNLI_TRAIN,
)

STANDIN_VERSION = 1  # raise when what is written changes: a stand-in written by another version is rewritten
TOKENIZER_TEXTS = 20_000  # at most this many texts in StandIn.texts
TEXT_CHARS = 1_000  # each of them cut to this many characters
LENGTH_SIGMA = 0.5  # words per row are log-normal around the field's mean with this sigma (of the log)
LEXICON_SIZE = 6_000  # pseudo-words per language, drawn with Zipf frequencies
ALIASES = {"super-natural-instructions": "sni"}
STANDIN_DATASETS: frozenset[str] = frozenset(
    {"xnli", "masakhanews", "fedaya", "sni", "super-natural-instructions", "dolly", "alpagasus", "commonsense",
     "flan", "cifar100", "drake", "hflb", "fedscope"}
)  # fmt: skip

# The hub ids the loaders read without data.path (fedpeft/data/real/*.py; tests/test_rehearsal_data.py checks them).
DEFAULT_HUB_IDS = {
    "xnli": "facebook/xnli",
    "masakhanews": "masakhane/masakhanews",
    "sni": "Muennighoff/natural-instructions",
    "dolly": "databricks/databricks-dolly-15k",
    "alpagasus": "mlabonne/alpagasus",
    "flan": "Muennighoff/flan",
    "cifar100": "uoft-cs/cifar100",
}
# commonsense without data.path: one hub dataset (and configuration) per task (fedpeft/data/real/commonsense.py).
COMMONSENSE_HUB: dict[str, tuple[str, str | None]] = {
    "arc-c": ("allenai/ai2_arc", "ARC-Challenge"), "arc-e": ("allenai/ai2_arc", "ARC-Easy"),
    "boolq": ("google/boolq", None), "hellaswag": ("Rowan/hellaswag", None), "obqa": ("allenai/openbookqa", "main"),
    "piqa": ("ybisk/piqa", None), "siqa": ("allenai/social_i_qa", None),
    "winogrande": ("allenai/winogrande", "winogrande_xl"),
}  # fmt: skip
LOCAL_ONLY = frozenset({"fedaya", "drake", "hflb", "fedscope"})  # read from data.path only

# Assumed mean words per field. Rounded; from the dataset papers and cards where they give lengths, else estimates
# (marked "est."): they set realistic token counts for the rehearsal's batches and tokenizer, nothing more.
MEAN_WORDS: dict[str, dict[str, float]] = {
    # MultiNLI, which XNLI translates: premises about 20 words, hypotheses about 10 (Williams et al., NAACL 2018).
    "xnli": {"premise": 20, "hypothesis": 10},
    # News headlines and article bodies (est.; articles are a few hundred words).
    "masakhanews": {"headline": 8, "text": 280},
    # Aya annotations: a question or task and its answer (est.).
    "fedaya": {"instruction": 25, "response": 60},
    # SNI: task definitions average about 56 words (Wang et al., EMNLP 2022); inputs and outputs est.
    "sni": {"definition": 55, "input": 45, "output": 6, "explanation": 15},
    # Dolly: instructions, the context of closed QA / extraction / summarization, responses per category below (est.).
    "dolly": {"instruction": 14, "context": 90},
    # Alpaca records: short instructions, an input in about 40 % of them, answers of a paragraph (est.).
    "alpagasus": {"instruction": 13, "input": 15, "output": 45},
    # The commonsense tasks' hub fields (est. from their cards' examples).
    "commonsense": {
        "arc_question": 22, "arc_choice": 4, "obqa_question": 11, "obqa_choice": 3, "boolq_question": 9,
        "boolq_passage": 105, "hellaswag_ctx": 30, "hellaswag_ending": 20, "piqa_goal": 8, "piqa_solution": 20,
        "siqa_context": 15, "siqa_question": 6, "siqa_answer": 4, "winogrande_sentence": 20,
    },
    # The source fields FLAN's templates wrap (est.; each task's own texts: NLI pairs, reviews, passages, ...).
    "flan": {
        "arc_question": 22, "arc_choice": 4, "cosmos_context": 70, "cosmos_question": 10, "cosmos_choice": 8,
        "dpr_sentence": 16, "qqp_question": 11, "hellaswag_ctx": 30, "hellaswag_ending": 20, "mnli_premise": 20,
        "mnli_hypothesis": 10, "squad_context": 120, "squad_question": 10, "sst2_sentence": 19,
    },
    # FedMosaic: VQA questions and short answers; LLaVA-Instruct-like public data; Fed-Scope's coding / math /
    # general-capability questions and worked answers (all est.).
    "mosaic": {
        "question": 12, "answer": 2, "public_question": 12, "public_answer": 60, "text_question": 60,
        "text_answer": 120, "text_public_question": 20, "text_public_answer": 80,
    },
}  # fmt: skip
# Dolly's records per category (the databricks-dolly-15k release, 15,011 in all) and the assumed mean response
# length of each (est.).
DOLLY_CATEGORIES: dict[str, tuple[int, float]] = {
    "open_qa": (3742, 45), "general_qa": (2191, 80), "classification": (2136, 20), "closed_qa": (1773, 30),
    "brainstorming": (1766, 60), "information_extraction": (1506, 45), "summarization": (1188, 65),
    "creative_writing": (709, 150),
}  # fmt: skip
DOLLY_WITH_CONTEXT = ("closed_qa", "information_extraction", "summarization")
# The assumed mix of AlpaGasus' instruction types (the first-word rule of fedpeft/data/real/alpagasus.py; est.).
ALPAGASUS_TYPES = {
    "open_qa": 0.20, "classification": 0.10, "rewriting": 0.12, "summarization": 0.04, "extraction": 0.08,
    "brainstorming": 0.12, "creative_writing": 0.18, "explanation": 0.10, "other": 0.06,
}  # fmt: skip
ALPAGASUS_WITH_INPUT = 0.4
# How many of Fed-Aya's 38 annotator clients mainly write each language (English dominates; est.), the share of a
# client's samples in another language, and the spread of client sizes (sigma of a log-normal; est.).
AYA_CLIENTS_PER_LANGUAGE = {"en": 12, "es": 5, "fr": 4, "pt": 4, "ru": 3, "ar": 4, "te": 3, "zh": 3}
AYA_OTHER_LANGUAGE = 0.05
AYA_SIZE_SIGMA = 0.8
AYA_MIN_SAMPLES = 20
MASAKHANEWS_LABELS = ("business", "entertainment", "health", "politics", "religion", "sports", "technology")
MASAKHANEWS_TOPIC_WEIGHTS = (3, 1, 2, 5, 1, 4, 1)  # politics and sports dominate the real data (est.)
XNLI_LABELS = ("entailment", "neutral", "contradiction")
# FedMosaic's benchmarks: sizes the paper does not give (assumptions). Rows per task, the questions that share one
# image (VQA sets ask several questions per image), the images' side in pixels and the public set's size.
MOSAIC_SIZES = {"train_per_task": 1000, "test_per_task": 200, "questions_per_image": 2, "image_side": 64,
                "public": 5000, "tasks_per_client": 4, "fedscope_tasks_per_client": 3}  # fmt: skip
SNI_EXTRA_TASKS = 6  # smaller tasks written besides the ones a config picks, so that the ranking by size is real
CIFAR100_FINE = (
    "apple aquarium_fish baby bear beaver bed bee beetle bicycle bottle bowl boy bridge bus butterfly camel can "
    "castle caterpillar cattle chair chimpanzee clock cloud cockroach couch crab crocodile cup dinosaur dolphin "
    "elephant flatfish forest fox girl hamster house kangaroo keyboard lamp lawn_mower leopard lion lizard lobster "
    "man maple_tree motorcycle mountain mouse mushroom oak_tree orange orchid otter palm_tree pear pickup_truck "
    "pine_tree plain plate poppy porcupine possum rabbit raccoon ray road rocket rose sea seal shark shrew skunk "
    "skyscraper snail snake spider squirrel streetcar sunflower sweet_pepper table tank telephone television tiger "
    "tractor train trout tulip turtle wardrobe whale willow_tree wolf woman worm"
).split()
# CIFAR-100's 20 superclasses and their fine classes (Krizhevsky, 2009).
CIFAR100_COARSE: dict[str, tuple[str, ...]] = {
    "aquatic_mammals": ("beaver", "dolphin", "otter", "seal", "whale"),
    "fish": ("aquarium_fish", "flatfish", "ray", "shark", "trout"),
    "flowers": ("orchid", "poppy", "rose", "sunflower", "tulip"),
    "food_containers": ("bottle", "bowl", "can", "cup", "plate"),
    "fruit_and_vegetables": ("apple", "mushroom", "orange", "pear", "sweet_pepper"),
    "household_electrical_devices": ("clock", "keyboard", "lamp", "telephone", "television"),
    "household_furniture": ("bed", "chair", "couch", "table", "wardrobe"),
    "insects": ("bee", "beetle", "butterfly", "caterpillar", "cockroach"),
    "large_carnivores": ("bear", "leopard", "lion", "tiger", "wolf"),
    "large_man-made_outdoor_things": ("bridge", "castle", "house", "road", "skyscraper"),
    "large_natural_outdoor_scenes": ("cloud", "forest", "mountain", "plain", "sea"),
    "large_omnivores_and_herbivores": ("camel", "cattle", "chimpanzee", "elephant", "kangaroo"),
    "medium_mammals": ("fox", "porcupine", "possum", "raccoon", "skunk"),
    "non-insect_invertebrates": ("crab", "lobster", "snail", "spider", "worm"),
    "people": ("baby", "boy", "girl", "man", "woman"),
    "reptiles": ("crocodile", "dinosaur", "lizard", "snake", "turtle"),
    "small_mammals": ("hamster", "mouse", "rabbit", "shrew", "squirrel"),
    "trees": ("maple_tree", "oak_tree", "palm_tree", "pine_tree", "willow_tree"),
    "vehicles_1": ("bicycle", "bus", "motorcycle", "pickup_truck", "train"),
    "vehicles_2": ("lawn_mower", "rocket", "streetcar", "tank", "tractor"),
}


@dataclass(frozen=True)
class StandIn:
    """A stand-in written to disk: what to set in ``cfg.data`` so that the real loader reads it, a sample of its
    texts (for a stand-in tokenizer) and one line saying what it is."""

    data_updates: JSONObject
    texts: list[str]
    description: str


# ---------------------------------------------------------------------------------------------- availability


def real_data_available(cfg: ExperimentConfig) -> bool:
    """Whether ``cfg.data``'s real dataset can be read here without the network.

    True for synthetic datasets, a user's ``files`` / ``hub`` data and any dataset this module has no stand-in for
    (nothing to stand in); else whether ``data.path`` exists or, without it, whether the hub id (every one the
    loader reads: each configuration of XNLI and MasakhaNEWS, each commonsense task's dataset) is in the local
    Hugging Face cache (:func:`hub_dataset_cached`). Fed-Aya and FedMosaic's benchmarks are read from a path only.
    """
    data = cfg.data
    name = ALIASES.get(data.name, data.name)
    if name not in STANDIN_DATASETS:
        return True
    if data.path:
        return Path(data.path).expanduser().exists()
    if name in LOCAL_ONLY:
        return False
    if name == "commonsense":
        tasks = data.groups or list(COMMONSENSE_HUB)
        return all(hub_dataset_cached(*COMMONSENSE_HUB[t]) for t in tasks if t in COMMONSENSE_HUB)
    hub_id = data.hub_id or DEFAULT_HUB_IDS[name]
    if name == "xnli":
        return all(hub_dataset_cached(hub_id, lang) for lang in data.groups or XNLI_LANGUAGES)
    if name == "masakhanews":
        return all(hub_dataset_cached(hub_id, lang) for lang in data.groups or MASAKHANEWS_SIZES)
    return hub_dataset_cached(hub_id)


def hub_dataset_cached(hub_id: str, config: str | None = None) -> bool:
    """Whether ``datasets.load_dataset(hub_id, config)`` can be served without the network: ``hub_id`` is a local
    directory, the hub cache holds a snapshot of the dataset repository, or the ``datasets`` cache holds a prepared
    copy (of ``config``, when given). A look at the cache folders; nothing is loaded."""
    if Path(hub_id).expanduser().is_dir():
        return True
    if hub_id.count("/") > 1:
        return False
    from huggingface_hub import constants

    snapshots = Path(constants.HF_HUB_CACHE) / f"datasets--{hub_id.replace('/', '--')}" / "snapshots"
    if snapshots.is_dir() and any(p.is_dir() and any(p.iterdir()) for p in snapshots.iterdir()):
        return True
    cache_root = Path(os.environ.get("HF_DATASETS_CACHE") or Path(constants.HF_HOME) / "datasets").expanduser()
    parts = hub_id.split("/")
    parts[-1] = _snake_case(parts[-1])
    prepared = cache_root / "___".join(parts)
    return any(p.is_dir() for p in prepared.glob(f"{config or '*'}/*/*"))


def _snake_case(name: str) -> str:
    """The folder name ``datasets`` gives a dataset in its cache (its ``camelcase_to_snakecase``)."""
    name = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1_\2", name)
    return re.sub(r"([a-z\d])([A-Z])", r"\1_\2", name).lower()


# ------------------------------------------------------------------------------------------------ the writer


def write_standin(cfg: ExperimentConfig, root: Path, *, scale: float = 1.0) -> StandIn:
    """Write a stand-in for ``cfg.data``'s real dataset under ``root`` (in ``root/<dataset>/``).

    The files follow the dataset's real local layout (docs/real-data.md), sized so that the config's federation
    comes out at its true shape (the module docstring lists the sizes), seeded from ``cfg.data.seed``. A stand-in
    that this version already wrote there for the same data config is reused.

    Args:
        cfg: the run's config; only ``cfg.data`` (and, for FedMosaic's benchmarks, ``cfg.assign``'s client count)
            is read.
        root: the folder to write under.
        scale: the share of the published or assumed sizes to write (1: all); the rows a config draws are never
            cut. Below 1 the federation is smaller than the true one: for quick checks only.

    Returns:
        The :class:`StandIn`: ``data_updates`` (``path``, ``hub_id: None``) to apply to ``cfg.data``, a sample of
        the texts, and one line describing what was written.

    Raises:
        UserError: a dataset with no stand-in, or a config naming languages or tasks the dataset does not have.
    """
    name = ALIASES.get(cfg.data.name, cfg.data.name)
    if name not in STANDIN_DATASETS:
        raise UserError(
            f"There is no generated stand-in for dataset {cfg.data.name}; rehearse it with its real data "
            f"(data.path), or use one of {', '.join(sorted(STANDIN_DATASETS))}."
        )
    if not 0 < scale <= 1:
        raise ValueError(f"scale must be in (0, 1], not {scale}")
    root = Path(root).expanduser().resolve()
    final = root / name
    key = _key(cfg, scale)
    reused = _reuse(final, key)
    if reused is not None:
        return reused
    partial = root / f".{name}-partial"
    if partial.exists():
        shutil.rmtree(partial)
    partial.mkdir(parents=True)
    gen = _Gen(cfg.data.seed, name)
    written = _WRITERS[name](cfg, partial, gen, scale)
    texts = gen.sample()
    manifest: _Manifest = {
        "key": key,
        "path": written.path,
        "updates": written.updates,
        "description": written.description,
    }
    (partial / "standin-texts.json").write_text(json.dumps(texts, ensure_ascii=False), encoding="utf-8")
    (partial / "standin.json").write_text(json.dumps(manifest, indent=1), encoding="utf-8")
    if final.exists():
        shutil.rmtree(final)
    partial.rename(final)
    return _standin(final, manifest, texts)


def _key(cfg: ExperimentConfig, scale: float) -> JSONObject:
    data = cfg.data.model_dump(mode="json", exclude={"path", "hub_id"})
    data["explicit"] = sorted(cfg.data.model_fields_set - {"path", "hub_id"})  # the fields given their own defaults
    return {"version": STANDIN_VERSION, "scale": scale, "data": data, "clients": _mosaic_clients(cfg)}


def _reuse(final: Path, key: JSONObject) -> StandIn | None:
    """The stand-in already in ``final`` for ``key``; None (and ``final`` removed) when it was written for
    another; a ``UserError`` when ``final`` holds something else."""
    if not final.exists():
        return None
    manifest_path = final / "standin.json"
    if not manifest_path.is_file():
        raise UserError(
            f"{final} exists and holds no stand-in written here; remove it or write the stand-in elsewhere."
        )
    manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    texts_path = final / "standin-texts.json"
    if manifest.get("key") != key or not texts_path.is_file():
        shutil.rmtree(final)
        return None
    return _standin(final, manifest, json.loads(texts_path.read_text(encoding="utf-8")))


def _standin(final: Path, manifest: _Manifest, texts: list[str]) -> StandIn:
    path = final / manifest["path"] if manifest["path"] else final
    return StandIn(
        data_updates={"path": str(path), **manifest["updates"]},
        texts=texts,
        description=manifest["description"].replace("{dir}", str(final)),
    )


class _Manifest(TypedDict):
    key: JSONObject  # what the stand-in was written for (:func:`_key`)
    path: str
    updates: JSONObject
    description: str


@dataclass(frozen=True)
class _Written:
    path: str  # data.path, relative to the dataset's folder ("" for the folder itself)
    updates: JSONObject  # the other keys of cfg.data to set
    description: str  # "{dir}" stands for the dataset's folder


# ------------------------------------------------------------------------------------------------------ text


# language -> (script, letters of its orthography mixed into Latin pseudo-words)
LANGUAGE_SCRIPTS: dict[str, tuple[str, str]] = {
    "en": ("latin", ""), "de": ("latin", "äöüß"), "fr": ("latin", "éèêàçù"), "es": ("latin", "áéíóúñ"),
    "pt": ("latin", "ãõçáéêó"), "tr": ("latin", "ıışğçöü"), "vi": ("latin", "ăâđêôơưạảấầệộ"), "sw": ("latin", ""),
    "ar": ("arabic", ""), "ur": ("arabic", ""), "bg": ("cyrillic", ""), "ru": ("cyrillic", ""), "el": ("greek", ""),
    "hi": ("devanagari", ""), "th": ("thai", ""), "zh": ("han", ""), "te": ("telugu", ""),
    "amh": ("ethiopic", ""), "tir": ("ethiopic", ""), "eng": ("latin", ""), "fra": ("latin", "éèêàçù"),
    "hau": ("latin", "ƙɗɓ'"), "ibo": ("latin", "ịọụṅ"), "lin": ("latin", "ɛɔ"), "lug": ("latin", "ŋ"),
    "orm": ("latin", "'"), "pcm": ("latin", ""), "run": ("latin", ""), "sna": ("latin", ""), "som": ("latin", "'"),
    "swa": ("latin", ""), "xho": ("latin", ""), "yor": ("latin", "ẹọṣàáèéìíòóùú"),
}  # fmt: skip
_NO_SPACES = frozenset({"han", "thai"})  # scripts written without spaces between words
_CASED = frozenset({"latin", "cyrillic", "greek"})
_STOPS = {"han": ("。", "？", "，"), "devanagari": ("।", "?", ","), "ethiopic": ("።", "?", "፣"),
          "arabic": (".", "؟", "،"), "greek": (".", ";", ","), "thai": ("", "?", " ")}  # fmt: skip
_THAI_CONSONANTS = dict(zip("ptkbdgmnszfvhlrwjxc", "ปตกบดคมนสซฟวหลรวยชจ", strict=True))
_TELUGU_CONSONANTS = dict(zip("ptkbdgmnszfvhlrwjxc", "పతకబదగమనసజఫవహలరవయశచ", strict=True))
_TELUGU_VOWELS = {"a": "అ", "e": "ఎ", "i": "ఇ", "o": "ఒ", "u": "ఉ"}
_TELUGU_SIGNS = {"a": "", "e": "ె", "i": "ి", "o": "ొ", "u": "ు"}


def _render(phonemes: str, script: str, extra: str, draw: Callable[[], float]) -> str:
    """A phoneme string in ``script`` (the writers of :mod:`fedpeft.data.synthetic.scripts`, and here Thai,
    Telugu and Han); in Latin, a vowel may become one of the language's own letters ``extra``."""
    from fedpeft.data.synthetic.scripts import syllables, write

    if script == "han":  # one character per syllable, from the CJK Unified Ideographs
        return "".join(chr(0x4E00 + zlib.crc32("".join(s).encode()) % 20902) for s in syllables(phonemes))
    if script == "thai":
        out = []
        for onset, vowel, coda in syllables(phonemes):
            consonant = _THAI_CONSONANTS.get(onset, "อ")  # a syllable without a consonant is carried by "อ"
            before = {"e": "เ", "o": "โ"}.get(vowel, "")
            after = {"a": "า", "i": "ิ", "u": "ุ"}.get(vowel, "")
            out.append(before + consonant + after + (_THAI_CONSONANTS[coda] if coda else ""))
        return "".join(out)
    if script == "telugu":
        out = []
        for onset, vowel, coda in syllables(phonemes):
            if onset:
                out.append(_TELUGU_CONSONANTS[onset] + (_TELUGU_SIGNS[vowel] if vowel else "్"))
            elif vowel:
                out.append(_TELUGU_VOWELS[vowel])
            if coda:
                out.append(_TELUGU_CONSONANTS[coda] + "్")
        return "".join(out)
    text = write(phonemes, script)
    if extra and draw() < 0.3:
        spots = [i for i, ch in enumerate(text) if ch in "aeiou"]
        if spots:
            i = spots[int(draw() * len(spots))]
            text = text[:i] + extra[int(draw() * len(extra))] + text[i + 1 :]
    return text


@cache
def _lexicon(lang: str) -> tuple[np.ndarray, np.ndarray]:
    """``lang``'s pseudo-words (most frequent first) and the cumulative Zipf probabilities to draw them with.

    Each language draws its own phoneme inventory, syllable shapes and words from a seed of its own (not the data
    seed), so every stand-in of a language shares its lexicon and related stand-ins share a tokenizer's view.
    """
    import random

    from fedpeft.data.synthetic.scripts import CONSONANTS, VOWELS

    script, extra = LANGUAGE_SCRIPTS[lang]
    rng = random.Random(derive_seed("standin-lexicon", lang, stream="files"))
    consonants = rng.sample(CONSONANTS, rng.randint(11, 16))
    vowels = rng.sample(VOWELS, rng.randint(3, 5))
    closed = rng.uniform(0.05, 0.4)
    shapes = (1, 2) if script == "han" else (1, 2, 2, 3, 3, 4)
    words: list[str] = []
    seen: set[str] = set()
    while len(words) < LEXICON_SIZE:
        phonemes = "".join(
            (rng.choice(consonants) if rng.random() < 0.85 else "")
            + rng.choice(vowels)
            + (rng.choice(consonants) if rng.random() < closed else "")
            for _ in range(rng.choice(shapes))
        )
        word = _render(phonemes, script, extra, rng.random)
        if word not in seen:
            seen.add(word)
            words.append(word)
    weights = 1.0 / (np.arange(LEXICON_SIZE) + 2.7)
    return np.array(words, dtype=object), np.cumsum(weights / weights.sum())


def _lengths(rng: np.random.Generator, mean: float, n: int) -> np.ndarray:
    """``n`` word counts, log-normal around ``mean`` (at least 1)."""
    mu = np.log(mean) - LENGTH_SIGMA**2 / 2
    return np.maximum(1, np.rint(rng.lognormal(mu, LENGTH_SIGMA, n))).astype(np.int64)


class _Gen:
    """The seeded randomness and text of one stand-in, and the texts kept for its tokenizer sample."""

    def __init__(self, seed: int, name: str) -> None:
        self.seed, self.name = seed, name
        self.kept: list[Sequence[str]] = []

    def rng(self, *keys: object) -> np.random.Generator:
        return np.random.default_rng(derive_seed(self.seed, "standin", self.name, *keys, stream="files"))

    def words(self, rng: np.random.Generator, lang: str, n: int) -> list[str]:
        """``n`` words of ``lang`` drawn by frequency."""
        words, cdf = _lexicon(lang)
        return words[np.minimum(np.searchsorted(cdf, rng.random(n), side="right"), len(words) - 1)].tolist()

    def texts(
        self, rng: np.random.Generator, lang: str, mean: float, n: int, end: str = ".", keep: bool = True
    ) -> list[str]:
        """``n`` sentences of ``lang`` of ``mean`` words (log-normal), capitalized where the script has case,
        with commas, ended by ``end`` (``.``, ``?`` or ``""``) in the script's own punctuation."""
        if n <= 0:
            return []
        counts = _lengths(rng, mean, n)
        words = self.words(rng, lang, int(counts.sum()))
        script = LANGUAGE_SCRIPTS[lang][0]
        stop, question, comma = _STOPS.get(script, (".", "?", ","))
        for i in np.flatnonzero(rng.random(len(words)) < 0.05):
            words[i] += comma
        sep = "" if script in _NO_SPACES else " "
        final = {".": stop, "?": question, "": ""}[end]
        out = []
        start = 0
        for count in counts.tolist():
            text = sep.join(words[start : start + count]).rstrip(",，،፣ ")
            start += count
            if script in _CASED:
                text = text[:1].upper() + text[1:]
            out.append(text + final)
        if keep:
            self.kept.append(out)
        return out

    def keep(self, texts: Sequence[str]) -> None:
        self.kept.append(texts)

    def sample(self) -> list[str]:
        """At most :data:`TOKENIZER_TEXTS` of the kept texts, drawn evenly, each cut to :data:`TEXT_CHARS`."""
        sizes = np.array([len(t) for t in self.kept], dtype=np.int64)
        total = int(sizes.sum())
        if not total:
            return []
        picks = np.sort(self.rng("tokenizer-sample").choice(total, size=min(total, TOKENIZER_TEXTS), replace=False))
        bounds = np.cumsum(sizes)
        which = np.searchsorted(bounds, picks, side="right")
        return [self.kept[w][p - (bounds[w] - sizes[w])][:TEXT_CHARS] for w, p in zip(which, picks, strict=True)]


def _margin(rows: int) -> int:
    """The rows a draw of ``rows`` needs, and a few more (2 %, at least 8)."""
    return rows + max(8, rows // 50)


def _scaled(rows: int, scale: float, least: int = 1) -> int:
    return max(least, round(rows * scale))


def _choice(rng: np.random.Generator, options: Sequence[str], n: int, p: Sequence[float] | None = None) -> list[str]:
    weights = None if p is None else np.asarray(p, dtype=float) / float(np.sum(p))
    return [options[i] for i in rng.choice(len(options), size=n, p=weights)]


# ---------------------------------------------------------------------------------------------------- files


def _features(**columns: str | list[str] | tuple[str, ...]) -> dict[str, JSONObject]:
    """``datasets`` feature declarations: a list of names is a ClassLabel, a string a Value dtype."""
    out: dict[str, JSONObject] = {}
    for column, kind in columns.items():
        if isinstance(kind, (list, tuple)):
            out[column] = {"names": list(kind), "_type": "ClassLabel"}
        elif kind == "image":
            out[column] = {"_type": "Image"}
        else:
            out[column] = {"dtype": kind, "_type": "Value"}
    return out


def _write_parquet(
    path: Path, columns: Mapping[str, Sequence[object]], features: dict[str, JSONObject] | None = None
) -> None:
    """A parquet file of ``columns`` carrying ``features`` as the hub's parquet export does (``datasets`` reads
    ClassLabel names and Image columns from it)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table(columns)
    if features is not None:
        table = table.replace_schema_metadata({b"huggingface": json.dumps({"info": {"features": features}}).encode()})
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)


def _write_jsonl(path: Path, rows: Iterable[Mapping[str, object]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")


def _known(requested: Sequence[str] | None, known: Iterable[str], what: str, field_name: str) -> list[str]:
    known = list(known)
    if requested is None:
        return known
    unknown = [g for g in requested if g not in known]
    if unknown or not requested:
        raise UserError(
            f"{field_name} names {', '.join(unknown) or 'nothing'}, which the stand-in cannot write; choose {what} "
            f"from: {', '.join(known)}."
        )
    return list(dict.fromkeys(requested))


def _plural(count: int, noun: str) -> str:
    return f"{count:,} {noun}" + ("" if count == 1 else "s")


_ABOUT = "generated stand-in data, not the real dataset"


# ---------------------------------------------------------------------------------------- classification


def _xnli(cfg: ExperimentConfig, out: Path, gen: _Gen, scale: float) -> _Written:
    data = cfg.data
    langs = _known(data.groups, XNLI_LANGUAGES, "XNLI languages", "data.groups")
    pools = 2 if data.unseen_pool else 1
    # What the config draws, and a little more; never more than the real splits hold (the loader then refuses a
    # config asking for more, as it would on the real data).
    sizes = {
        "train": min(XNLI_TRAIN, _margin(data.train_per_group * pools)),
        "test": min(XNLI_TEST, _margin(data.test_per_group * pools)),
    }
    lengths = MEAN_WORDS["xnli"]
    features = _features(premise="string", hypothesis="string", label=XNLI_LABELS)
    for lang in langs:
        for split, n in sizes.items():
            rng = gen.rng(lang, split)
            columns = {
                "premise": gen.texts(rng, lang, lengths["premise"], n),
                "hypothesis": gen.texts(rng, lang, lengths["hypothesis"], n),
                "label": rng.integers(0, 3, n).tolist(),  # MultiNLI is balanced over its three labels
            }
            _write_parquet(out / lang / f"{split}.parquet", columns, features)
    return _Written(
        "",
        {"hub_id": None},
        f"xnli: {_ABOUT}; {len(langs)} languages ({', '.join(langs)}) x {sizes['train']:,} train / "
        f"{sizes['test']:,} test pairs (what {pools} pool(s) draw, and a few more), columns premise, hypothesis, "
        "label (ClassLabel entailment/neutral/contradiction) in {dir}/<lang>/{train,test}.parquet",
    )


def _masakhanews(cfg: ExperimentConfig, out: Path, gen: _Gen, scale: float) -> _Written:
    data = cfg.data
    langs = _known(data.groups, MASAKHANEWS_SIZES, "MasakhaNEWS languages", "data.groups")
    pools = 2 if data.unseen_pool else 1
    caps = setting(data, "train_per_group", None), setting(data, "test_per_group", None)
    lengths = MEAN_WORDS["masakhanews"]
    features = _features(label=MASAKHANEWS_LABELS, headline="string", text="string", headline_text="string",
                         url="string")  # fmt: skip
    total = 0
    for lang in langs:
        for index, split in enumerate(("train", "test")):
            n = _scaled(MASAKHANEWS_SIZES[lang][index], scale)
            cap = caps[index]
            if cap is not None:
                n = min(n, _margin(cap * pools))
            total += n
            rng = gen.rng(lang, split)
            headline = gen.texts(rng, lang, lengths["headline"], n, end="")
            text = gen.texts(rng, lang, lengths["text"], n)
            columns = {
                "label": rng.choice(len(MASAKHANEWS_LABELS), n, p=_normalized(MASAKHANEWS_TOPIC_WEIGHTS)).tolist(),
                "headline": headline,
                "text": text,
                "headline_text": [f"{h} {t}" for h, t in zip(headline, text, strict=True)],
                "url": [f"https://news.example.org/{lang}/{split}/{i:05d}" for i in range(n)],
            }
            _write_parquet(out / lang / f"{split}.parquet", columns, features)
    return _Written(
        "",
        {"hub_id": None},
        f"masakhanews: {_ABOUT}; {len(langs)} languages at the published train/test sizes"
        + (f" x {scale:g}" if scale < 1 else "")
        + f" ({total:,} articles), hub columns label (ClassLabel of the 7 topics), headline, text, headline_text, "
        "url in {dir}/<lang>/{train,test}.parquet",
    )


def _normalized(weights: Sequence[float]) -> np.ndarray:
    array = np.asarray(weights, dtype=float)
    return array / array.sum()


def _cifar100(cfg: ExperimentConfig, out: Path, gen: _Gen, scale: float) -> _Written:
    from PIL import Image

    data = cfg.data
    clients = int(data.options.get("num_clients", 10))
    sizes = {}
    for split, published, field_name in (("train", CIFAR100_TRAIN, "train_per_group"),
                                         ("test", CIFAR100_TEST, "test_per_group")):  # fmt: skip
        per_client = setting(data, field_name, None)
        n = _scaled(published, scale, least=100)
        sizes[split] = min(published, _margin(clients * per_client)) if per_client is not None else n
    coarse_of = {fine: sorted(CIFAR100_COARSE).index(c) for c, fines in CIFAR100_COARSE.items() for fine in fines}
    coarse_ids = [coarse_of[f] for f in CIFAR100_FINE]
    palette = gen.rng("palette").integers(30, 226, (100, 3), dtype=np.int16)  # each class its own mean colour
    features = _features(img="image", fine_label=CIFAR100_FINE, coarse_label=sorted(CIFAR100_COARSE))
    import pyarrow as pa

    image_type = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    for split, n in sizes.items():
        rng = gen.rng("images", split)
        labels = np.arange(n) % 100  # CIFAR-100 is balanced: 500 / 100 images per class
        rng.shuffle(labels)
        images = []
        for start in range(0, n, 2000):
            chunk = labels[start : start + 2000]
            # Coarse 8 x 8 blocks of the class colour, scaled up, with a little pixel noise (PNG sizes as real).
            blocks = palette[chunk][:, None, None, :] + rng.integers(-40, 41, (len(chunk), 8, 8, 3), dtype=np.int16)
            pixels = np.repeat(np.repeat(blocks, 4, axis=1), 4, axis=2)
            pixels += rng.integers(-6, 7, pixels.shape, dtype=np.int16)
            for offset, array in enumerate(np.clip(pixels, 0, 255).astype(np.uint8)):
                buffer = io.BytesIO()
                Image.fromarray(array).save(buffer, format="PNG", compress_level=1)
                images.append({"bytes": buffer.getvalue(), "path": f"{split}_{start + offset}.png"})
        columns = {
            "img": pa.array(images, type=image_type),
            "fine_label": labels.tolist(),
            "coarse_label": [coarse_ids[i] for i in labels.tolist()],
        }
        _write_parquet(out / f"{split}.parquet", columns, features)
    return _Written(
        "",
        {"hub_id": None},
        f"cifar100: {_ABOUT}; {sizes['train']:,} train / {sizes['test']:,} test 32 x 32 PNG images (class-coloured "
        "blocks and noise, balanced over the 100 fine labels), as the hub's parquet export (img {bytes, path}, "
        "fine_label and coarse_label ClassLabels) in {dir}/{train,test}.parquet",
    )


# ------------------------------------------------------------------------------------------------ generation


def _fedaya(cfg: ExperimentConfig, out: Path, gen: _Gen, scale: float) -> _Written:
    rng = gen.rng("clients")
    lengths = MEAN_WORDS["fedaya"]
    main = [lang for lang, count in AYA_CLIENTS_PER_LANGUAGE.items() for _ in range(count)]
    total = _scaled(FEDAYA_SAMPLES, scale, least=2 * len(main))
    weights = rng.lognormal(0.0, AYA_SIZE_SIGMA, len(main))
    least = min(AYA_MIN_SAMPLES, total // len(main))
    sizes = least + np.floor(weights / weights.sum() * (total - least * len(main))).astype(np.int64)
    sizes[np.argsort(-weights)[: total - int(sizes.sum())]] += 1  # the rounding's remainder to the largest
    languages = list(AYA_CLIENTS_PER_LANGUAGE)
    sample_langs = []
    for lang, size in zip(main, sizes.tolist(), strict=True):
        other = rng.random(size) < AYA_OTHER_LANGUAGE
        drawn = _choice(rng, [x for x in languages if x != lang], size)
        sample_langs.append([d if o else lang for o, d in zip(other.tolist(), drawn, strict=True)])
    by_lang: dict[str, tuple[list[str], list[str]]] = {}
    for lang in languages:
        count = sum(s.count(lang) for s in sample_langs)
        text_rng = gen.rng("texts", lang)
        by_lang[lang] = (
            gen.texts(text_rng, lang, lengths["instruction"], count, end="?"),
            gen.texts(text_rng, lang, lengths["response"], count),
        )
    used = dict.fromkeys(languages, 0)
    release: dict[str, list[dict[str, str]]] = {}
    for client_langs in sample_langs:
        client_id = "".join(f"{x:02x}" for x in rng.integers(0, 256, 32).tolist())  # Aya's user ids: sha256 hex
        samples = []
        for lang in client_langs:
            prompts, responses = by_lang[lang]
            samples.append({"instruction": prompts[used[lang]], "response": responses[used[lang]], "language": lang})
            used[lang] += 1
        release[client_id] = samples
    folder = out / "Fed-Aya"
    folder.mkdir(parents=True)
    lines = [f"{json.dumps(c)}: {json.dumps(s, ensure_ascii=False)}" for c, s in release.items()]
    (folder / "aya_38c_25k.json").write_text("{\n" + ",\n".join(lines) + "\n}\n", encoding="utf-8")
    mix = ", ".join(f"{lang} {n}" for lang, n in AYA_CLIENTS_PER_LANGUAGE.items())
    return _Written(
        "Fed-Aya",
        {"hub_id": None},
        f"fedaya: {_ABOUT}; the FedLLM-Bench file {{dir}}/Fed-Aya/aya_38c_25k.json, {total:,} samples "
        f"(instruction, response, language) over {len(main)} annotator clients of log-normal sizes "
        f"({int(sizes.min())}-{int(sizes.max())}; the release publishes only the total), mainly writing {mix}, "
        f"{AYA_OTHER_LANGUAGE:.0%} of each client's samples in another language",
    )


SNI_CATEGORIES = (
    "question_answering", "sentiment_analysis", "text_categorization", "translation", "summarization",
    "program_execution", "question_generation", "paraphrasing", "coreference_resolution", "textual_entailment",
    "named_entity_recognition", "title_generation", "commonsense_classification", "word_analogy",
    "answer_verification", "grammar_error_detection",
)  # fmt: skip


def _sni(cfg: ExperimentConfig, out: Path, gen: _Gen, scale: float) -> _Written:
    options = cfg.data.options
    train = int(options.get("train_per_client", 500))
    test = int(options.get("test_per_client", 50))
    validation = int(options.get("validation_per_client", 0))
    unseen = int(options.get("unseen_tasks", 0)) if cfg.data.unseen_pool else 0
    explicit = options.get("tasks")
    rng = gen.rng("tasks")
    numbers = (rng.permutation(1700) + 1).tolist()
    names: list[str] = list(explicit or [])
    picked = len(names) if explicit else int(options.get("num_tasks", 10))
    while len(names) < picked + unseen + SNI_EXTRA_TASKS:
        number = numbers.pop()
        names.append(f"task{number:03d}_standin_{SNI_CATEGORIES[number % len(SNI_CATEGORIES)]}")
    need = _margin(test + validation + train)
    large = picked + unseen
    # The tasks the config picks (and its unseen ones) at what it draws and a few more, distinct sizes so that the
    # ranking by size is the one written; then smaller tasks the ranking must pass over.
    sizes = [need + 4 * (large - i) for i in range(large)]
    sizes += [max(2, need // 3 - i) for i in range(SNI_EXTRA_TASKS)]
    lengths = MEAN_WORDS["sni"]
    folder = out / "tasks"
    folder.mkdir(parents=True)
    total = 0
    for name, size in zip(names, sizes, strict=True):
        task_rng = gen.rng("task", name)
        total += size
        inputs = gen.texts(task_rng, "en", lengths["input"], size + 5)
        outputs = gen.texts(task_rng, "en", lengths["output"], size + 5, end="")
        seconds = task_rng.random(size) < 0.2  # some instances carry a second reference
        alternatives = gen.texts(task_rng, "en", lengths["output"], size, end="", keep=False)
        explanations = gen.texts(task_rng, "en", lengths["explanation"], 5)
        instances = [
            {"id": f"{name.split('_')[0]}-{task_rng.integers(1 << 62):016x}", "input": inputs[i],
             "output": [outputs[i], alternatives[i]] if seconds[i] else [outputs[i]]}
            for i in range(size)
        ]  # fmt: skip
        task = {
            "Contributors": ["stand-in"],
            "Source": ["generated"],
            "URL": ["https://example.org/standin"],
            "Categories": [name.split("_standin_")[-1].replace("_", " ").title()],
            "Reasoning": [],
            "Definition": gen.texts(task_rng, "en", lengths["definition"], 1),
            "Input_language": ["English"],
            "Output_language": ["English"],
            "Instruction_language": ["English"],
            "Domains": ["Generated"],
            "Positive Examples": [
                {"input": inputs[size + k], "output": outputs[size + k], "explanation": explanations[k]}
                for k in range(3)
            ],
            "Negative Examples": [
                {"input": inputs[size + k], "output": outputs[size + k - 1], "explanation": explanations[k]}
                for k in (3, 4)
            ],
            "Instances": instances,
            "Instance License": ["Unknown"],
        }
        (folder / f"{name}.json").write_text(json.dumps(task, ensure_ascii=False, indent=1), encoding="utf-8")
    return _Written(
        "",
        {"hub_id": None},
        f"sni: {_ABOUT}; the natural-instructions release layout {{dir}}/tasks/taskNNN_*.json (Definition, Positive "
        f"/ Negative Examples, Instances with input and output list), {len(names)} English tasks, {total:,} "
        f"instances: the {large} tasks the config reads at {need:,}-{need + 4 * large:,} instances (it draws "
        f"{test} test + {validation} validation + {train} train; the release's largest hold up to 6,500) and "
        f"{SNI_EXTRA_TASKS} smaller ones",
    )


def _dolly(cfg: ExperimentConfig, out: Path, gen: _Gen, scale: float) -> _Written:
    lengths = MEAN_WORDS["dolly"]
    rows: list[dict[str, str]] = []
    for category, (count, response_words) in DOLLY_CATEGORIES.items():
        n = _scaled(count, scale, least=3)
        rng = gen.rng(category)
        questions = category in ("open_qa", "general_qa", "closed_qa")
        instructions = gen.texts(rng, "en", lengths["instruction"], n, end="?" if questions else ".")
        contexts = gen.texts(rng, "en", lengths["context"], n) if category in DOLLY_WITH_CONTEXT else [""] * n
        responses = gen.texts(rng, "en", response_words, n)
        rows += [
            {"instruction": i, "context": c, "response": r, "category": category}
            for i, c, r in zip(instructions, contexts, responses, strict=True)
        ]
    order = gen.rng("order").permutation(len(rows))
    _write_jsonl(out / "databricks-dolly-15k.jsonl", (rows[i] for i in order.tolist()))
    return _Written(
        "databricks-dolly-15k.jsonl",
        {"hub_id": None},
        f"dolly: {_ABOUT}; {len(rows):,} records (instruction, context, response, category) in the release's 8 "
        "categories at its counts" + (f" x {scale:g}" if scale < 1 else "") + ", context in closed_qa, "
        "information_extraction and summarization, as {dir}/databricks-dolly-15k.jsonl",
    )


def _alpagasus(cfg: ExperimentConfig, out: Path, gen: _Gen, scale: float) -> _Written:
    from fedpeft.data.real.alpagasus import INSTRUCTION_TYPES

    lengths = MEAN_WORDS["alpagasus"]
    n = _scaled(INSTRUCTION_RECORDS["alpagasus"], scale, least=10)
    rng = gen.rng("records")
    kinds = _choice(rng, list(ALPAGASUS_TYPES), n, list(ALPAGASUS_TYPES.values()))
    bodies = gen.texts(rng, "en", lengths["instruction"] - 1, n, end="", keep=False)
    given = rng.random(n) < ALPAGASUS_WITH_INPUT
    inputs = gen.texts(rng, "en", lengths["input"], n)
    outputs = gen.texts(rng, "en", lengths["output"], n)
    records = []
    for i, kind in enumerate(kinds):
        if kind == "other":  # a first word no rule lists, not a question
            instruction = f"{bodies[i][:1].upper()}{bodies[i][1:]}."
        else:
            verbs = INSTRUCTION_TYPES[kind]
            first = verbs[int(rng.integers(len(verbs)))].capitalize()
            instruction = f"{first} {bodies[i][:1].lower()}{bodies[i][1:]}" + ("?" if kind == "open_qa" else ".")
        records.append({"instruction": instruction, "input": inputs[i] if given[i] else "", "output": outputs[i]})
    gen.keep([r["instruction"] for r in records])
    (out / "alpaca_t45.json").write_text(json.dumps(records, ensure_ascii=False, indent=4), encoding="utf-8")
    return _Written(
        "alpaca_t45.json",
        {"hub_id": None},
        f"alpagasus: {_ABOUT}; {n:,} records (instruction, input, output) as the release's JSON list "
        "{dir}/alpaca_t45.json, instructions opening with the words of the verb rule's types in an assumed mix, "
        f"an input in {ALPAGASUS_WITH_INPUT:.0%}",
    )


COMMONSENSE_TASKS = tuple(COMMONSENSE_SIZES)


def _commonsense(cfg: ExperimentConfig, out: Path, gen: _Gen, scale: float) -> _Written:
    tasks = _known(cfg.data.groups, COMMONSENSE_TASKS, "commonsense tasks", "data.groups")
    total = 0
    for task in tasks:
        for index, split in enumerate(("train", "test")):
            n = _scaled(COMMONSENSE_SIZES[task][index], scale)
            total += n
            rng = gen.rng(task, split)
            _write_jsonl(out / task / f"{split}.jsonl", _commonsense_rows(task, n, rng, gen))
    return _Written(
        "",
        {"hub_id": None},
        f"commonsense: {_ABOUT}; {len(tasks)} tasks ({', '.join(tasks)}) at the published train/test sizes"
        + (f" x {scale:g}" if scale < 1 else "")
        + f" ({total:,} rows), each in its hub schema (ARC/OBQA choices and answerKey, BoolQ passage, HellaSwag "
        "endings, PIQA sol1/sol2, Social IQa answerA-C, WinoGrande option1/2) as {dir}/<task>/{train,test}.jsonl",
    )


def _commonsense_rows(task: str, n: int, rng: np.random.Generator, gen: _Gen) -> Sequence[Mapping[str, object]]:
    words = MEAN_WORDS["commonsense"]

    def texts(key: str, count: int = n, end: str = ".") -> list[str]:
        return gen.texts(rng, "en", words[key], count, end=end)

    if task in ("arc-c", "arc-e", "obqa"):
        prefix = "arc" if task != "obqa" else "obqa"
        questions = texts(f"{prefix}_question", end="?")
        counts = rng.choice([3, 4, 5], n, p=[0.01, 0.98, 0.01]) if prefix == "arc" else np.full(n, 4)
        choices = texts(f"{prefix}_choice", int(counts.sum()), end="")
        numeric = rng.random(n) < (0.01 if prefix == "arc" else 0.0)
        rows, start = [], 0
        for i, count in enumerate(counts.tolist()):
            labels = [str(k + 1) for k in range(count)] if numeric[i] else list("ABCDE"[:count])
            row = {"id": f"{task}-{i:05d}", "question" if prefix == "arc" else "question_stem": questions[i],
                   "choices": {"text": choices[start : start + count], "label": labels},
                   "answerKey": labels[int(rng.integers(count))]}  # fmt: skip
            rows.append(row)
            start += count
        return rows
    if task == "boolq":
        questions = [q.lower() for q in texts("boolq_question", end="")]
        passages = texts("boolq_passage")
        answers = (rng.random(n) < 0.62).tolist()  # BoolQ is about 62 % yes
        return [
            {"question": q, "answer": a, "passage": p} for q, a, p in zip(questions, answers, passages, strict=True)
        ]
    if task == "hellaswag":
        contexts = texts("hellaswag_ctx", end="")
        endings = texts("hellaswag_ending", 4 * n)
        labels = rng.integers(0, 4, n).tolist()
        activities = gen.texts(rng, "en", 2, n, end="", keep=False)
        return [
            {"ind": i, "activity_label": activities[i], "ctx_a": contexts[i], "ctx_b": "", "ctx": contexts[i],
             "endings": endings[4 * i : 4 * i + 4], "source_id": f"standin~{i}", "split": "train",
             "split_type": "indomain", "label": str(labels[i])}
            for i in range(n)
        ]  # fmt: skip
    if task == "piqa":
        goals, solutions = texts("piqa_goal"), texts("piqa_solution", 2 * n)
        labels = rng.integers(0, 2, n).tolist()
        return [
            {"goal": goals[i], "sol1": solutions[2 * i], "sol2": solutions[2 * i + 1], "label": labels[i]}
            for i in range(n)
        ]
    if task == "siqa":
        contexts, questions = texts("siqa_context"), texts("siqa_question", end="?")
        answers = texts("siqa_answer", 3 * n, end="")
        labels = rng.integers(1, 4, n).tolist()
        return [
            {"context": contexts[i], "question": questions[i], "answerA": answers[3 * i],
             "answerB": answers[3 * i + 1], "answerC": answers[3 * i + 2], "label": str(labels[i])}
            for i in range(n)
        ]  # fmt: skip
    if task == "winogrande":
        sentences = texts("winogrande_sentence")
        names = gen.words(rng, "en", 2 * n)
        answers = rng.integers(1, 3, n).tolist()
        rows = []
        for i, sentence in enumerate(sentences):
            parts = sentence.split(" ")
            parts.insert(int(rng.integers(1, len(parts) + 1)) if len(parts) > 1 else 1, "_")
            rows.append({"sentence": " ".join(parts), "option1": names[2 * i].capitalize(),
                         "option2": names[2 * i + 1].capitalize(), "answer": str(answers[i])})  # fmt: skip
        return rows
    raise ValueError(f"unknown commonsense task {task!r}")


FLAN_TASKS = (
    "arc_challenge", "cosmos_qa", "definite_pronoun_resolution", "glue_qqp", "hellaswag", "mnli", "squad_v1", "sst2",
)  # fmt: skip


def _flan(cfg: ExperimentConfig, out: Path, gen: _Gen, scale: float) -> _Written:
    data = cfg.data
    tasks = _known(data.groups, FLAN_TASKS, "FLAN tasks", "data.groups")
    sizes = {
        "train": _margin(setting(data, "train_per_group", 2000)),
        "test": _margin(setting(data, "test_per_group", 300)),
    }
    for task in tasks:
        for split, n in sizes.items():
            rng = gen.rng(task, split)
            pairs = _flan_pairs(task, n, rng, gen)
            gen.keep([p for p, _ in pairs])
            gen.keep([t for _, t in pairs])
            _write_jsonl(out / task / f"{split}.jsonl", ({"inputs": p, "targets": t, "task": task} for p, t in pairs))
    return _Written(
        "",
        {"hub_id": None},
        f"flan: {_ABOUT}; {len(tasks)} tasks x {sizes['train']:,} train / {sizes['test']:,} test examples (what the "
        "config draws and a few more) in FLAN 2021 templates (OPTIONS lists, the task's answer set), columns "
        "inputs, targets, task in {dir}/<task>/{train,test}.jsonl",
    )


def _flan_pairs(task: str, n: int, rng: np.random.Generator, gen: _Gen) -> list[tuple[str, str]]:
    words = MEAN_WORDS["flan"]

    def texts(key: str, count: int = n, end: str = ".") -> list[str]:
        return gen.texts(rng, "en", words[key], count, end=end, keep=False)

    def options(items: Sequence[str]) -> str:
        return "OPTIONS:\n" + "\n".join(f"- {item}" for item in items)

    if task in ("arc_challenge", "cosmos_qa", "hellaswag"):
        key = {"arc_challenge": "arc_choice", "cosmos_qa": "cosmos_choice", "hellaswag": "hellaswag_ending"}[task]
        choices = texts(key, 4 * n, end="" if task == "arc_challenge" else ".")
        answers = rng.integers(0, 4, n).tolist()
        if task == "arc_challenge":
            stems = [f"{q}\n\n" for q in texts("arc_question", end="?")]
        elif task == "cosmos_qa":
            contexts, questions = texts("cosmos_context"), texts("cosmos_question", end="?")
            stems = [f"{c}\n\nQuestion: {q}\n" for c, q in zip(contexts, questions, strict=True)]
        else:
            stems = [f"What happens next in this paragraph?\n\n{c}\n" for c in texts("hellaswag_ctx", end="")]
        return [(stems[i] + options(choices[4 * i : 4 * i + 4]), choices[4 * i + answers[i]]) for i in range(n)]
    if task == "definite_pronoun_resolution":
        sentences = texts("dpr_sentence")
        names = gen.words(rng, "en", 2 * n)
        answers = rng.integers(0, 2, n).tolist()
        pairs = []
        for i, sentence in enumerate(sentences):
            pair = [names[2 * i].capitalize(), names[2 * i + 1].capitalize()]
            prompt = f'{pair[0]} and {pair[1]}: {sentence}\n\nWho is "they" in this prior sentence?\n{options(pair)}'
            pairs.append((prompt, pair[answers[i]]))
        return pairs
    if task == "glue_qqp":
        questions = texts("qqp_question", 2 * n, end="?")
        labels = _choice(rng, ["no", "yes"], n, [0.63, 0.37])  # QQP is about 37 % duplicates
        return [
            (f"Question 1: {questions[2 * i]}\nQuestion 2: {questions[2 * i + 1]}\nAre questions 1 and 2 asking the "
             f"same thing?\n{options(['no', 'yes'])}", labels[i])
            for i in range(n)
        ]  # fmt: skip
    if task == "mnli":
        premises, hypotheses = texts("mnli_premise"), texts("mnli_hypothesis")
        answer_set = ["yes", "it is not possible to tell", "no"]
        labels = _choice(rng, answer_set, n)
        return [
            (f"Premise: {p}\nHypothesis: {h}\nDoes the premise entail the hypothesis?\n{options(answer_set)}", label)
            for p, h, label in zip(premises, hypotheses, labels, strict=True)
        ]
    if task == "squad_v1":
        contexts, questions = texts("squad_context"), texts("squad_question", end="?")
        pairs = []
        for context, question in zip(contexts, questions, strict=True):
            tokens = context.split(" ")
            start = int(rng.integers(len(tokens)))
            span = " ".join(tokens[start : start + int(rng.integers(1, 5))]).rstrip(".,")
            pairs.append((f"Read this and answer the question\n\n{context}\n\n{question}", span or tokens[0]))
        return pairs
    if task == "sst2":
        sentences = [s.lower() for s in texts("sst2_sentence", end="")]
        labels = _choice(rng, ["negative", "positive"], n, [0.44, 0.56])
        return [
            (f"Review:\n{s}\nIs this movie review sentence negative or positive?\n{options(['negative', 'positive'])}",
             label)
            for s, label in zip(sentences, labels, strict=True)
        ]  # fmt: skip
    raise ValueError(f"unknown FLAN task {task!r}")


# ------------------------------------------------------------------------------------------ FedMosaic's tasks


def _mosaic_clients(cfg: ExperimentConfig) -> int:
    name = cfg.data.name
    if name not in MOSAIC_CLIENTS:
        return 0
    return sum(cfg.assign.counts.values()) or MOSAIC_CLIENTS[name]


HFLB_QUESTION_TYPES = ("yesno", "number", "attribute", "other")
FEDSCOPE_DOMAINS = {
    "code": ("python", "sql", "debugging"),
    "math": ("arithmetic", "algebra", "word-problems"),
    "general": ("qa", "writing", "reasoning"),
}
DRAKE_KINDS = ("vqa", "caption", "reasoning", "ocr", "counting", "multi-image", "choice", "grounding")


def _mosaic(cfg: ExperimentConfig, out: Path, gen: _Gen, scale: float) -> _Written:
    name = cfg.data.name
    clients = _mosaic_clients(cfg)
    plan: dict[str, list[str]] = {}
    if name == "drake":  # 4 distinct tasks per client (40 over the paper's 10), of mixed kinds
        per = MOSAIC_SIZES["tasks_per_client"]
        for c in range(clients):
            plan[f"client-{c + 1:02d}"] = [
                f"{DRAKE_KINDS[(c * per + k) % len(DRAKE_KINDS)]}-{c * per + k + 1:02d}" for k in range(per)
            ]
    elif name == "hflb":  # 7 VQA sets over the clients (the first ones split between two), 4 question types each
        for c in range(clients):
            shared = len(range(c % 7, clients, 7)) > 1
            dataset = f"set{c % 7 + 1}" + ("abcdefghijklmnopqrstuvwxyz"[c // 7] if shared else "")
            plan[f"client-{c + 1:02d}"] = [f"{dataset}-{kind}" for kind in HFLB_QUESTION_TYPES]
    else:  # Fed-Scope: each client one domain (coding, mathematics, general capability), 3 tasks of it
        domains = list(FEDSCOPE_DOMAINS)
        for c in range(clients):
            domain = domains[c % len(domains)]
            client = f"{domain}-{c // len(domains) + 1:02d}"
            plan[client] = [
                f"{client}-{kind}" for kind in FEDSCOPE_DOMAINS[domain][: MOSAIC_SIZES["fedscope_tasks_per_client"]]
            ]
    text_only = name == "fedscope"
    sizes = {"train": _scaled(MOSAIC_SIZES["train_per_task"], scale, least=2),
             "test": _scaled(MOSAIC_SIZES["test_per_task"], scale, least=1)}  # fmt: skip
    images = _Images(out, gen, MOSAIC_SIZES["image_side"])
    words = MEAN_WORDS["mosaic"]
    rows_written = 0
    for tasks in plan.values():
        for task in tasks:
            for split, n in sizes.items():
                rng = gen.rng(task, split)
                if text_only:
                    rows = _mosaic_text_rows(task, n, rng, gen)
                else:
                    rows = _mosaic_vqa_rows(f"{task}-{split}", task, n, rng, gen, images)
                rows_written += n
                _write_jsonl(out / "tasks" / task / f"{split}.jsonl", rows)
    public = _scaled(max(cfg.data.base_samples or 0, MOSAIC_SIZES["public"]), scale)
    rng = gen.rng("public")
    if text_only:
        questions = gen.texts(rng, "en", words["text_public_question"], public, end="?")
        answers = gen.texts(rng, "en", words["text_public_answer"], public)
        public_rows = [{"question": q, "answer": a} for q, a in zip(questions, answers, strict=True)]
    else:
        questions = gen.texts(rng, "en", words["public_question"], public, end="?")
        answers = gen.texts(rng, "en", words["public_answer"], public)
        pictures = images.pool("public", public, rng)
        public_rows = [
            {"question": q, "answer": a, "image": p} for q, a, p in zip(questions, answers, pictures, strict=True)
        ]
    _write_jsonl(out / "public.jsonl", public_rows)
    (out / "clients.json").write_text(json.dumps(plan, indent=1) + "\n", encoding="utf-8")
    task_count = sum(len(t) for t in plan.values())
    picture = (
        ""
        if text_only
        else f", {images.count:,} generated {images.side} x {images.side} PNG images in {{dir}}/images "
        f"(one per {MOSAIC_SIZES['questions_per_image']} questions; multi-image tasks 2-4 per question)"
    )
    return _Written(
        "",
        {"hub_id": None},
        f"{name}: {_ABOUT}; FedMosaic's layout {{dir}}/clients.json + tasks/<task>/{{train,test}}.jsonl + "
        "public.jsonl, "
        f"{len(plan)} clients x {len(next(iter(plan.values())))} tasks ({task_count} task folders), sizes assumed "
        f"(unpublished): {sizes['train']:,} train / {sizes['test']:,} test per task, {public:,} public examples"
        f"{picture}",
    )


class _Images:
    """Small generated PNGs under ``<out>/images``: a background colour and a coloured box."""

    def __init__(self, out: Path, gen: _Gen, side: int) -> None:
        self.folder, self.gen, self.side, self.count = out / "images", gen, side, 0
        self.folder.mkdir(parents=True, exist_ok=True)

    def pool(self, prefix: str, n: int, rng: np.random.Generator) -> list[str]:
        """Write ``n`` images named ``<prefix>-<k>.png``; their paths relative to the data folder."""
        from PIL import Image

        side = self.side
        colours = rng.integers(0, 256, (n, 2, 3), dtype=np.int64)
        corners = rng.integers(0, side // 2, (n, 2))
        extents = rng.integers(side // 8, side // 2, (n, 2))
        paths = []
        for k in range(n):
            pixels = np.empty((side, side, 3), np.uint8)
            pixels[:] = colours[k, 0]
            (y, x), (h, w) = corners[k], extents[k]
            pixels[y : y + h, x : x + w] = colours[k, 1]
            name = f"images/{prefix}-{k:05d}.png"
            Image.fromarray(pixels).save(self.folder.parent / name)
            paths.append(name)
        self.count += n
        return paths


class _MosaicRow(TypedDict, total=False):
    """A row of a FedMosaic-style task: a question and its answer, and for a visual task its image(s) and the
    choices of a multiple-choice question."""

    question: str
    answer: str
    choices: list[str]
    image: str | list[str]  # the image's file, or several for a multi-image question


def _mosaic_vqa_rows(
    prefix: str, task: str, n: int, rng: np.random.Generator, gen: _Gen, images: _Images
) -> list[_MosaicRow]:
    words = MEAN_WORDS["mosaic"]
    per_image = MOSAIC_SIZES["questions_per_image"]
    pictures = images.pool(prefix, max(1, -(-n // per_image)), rng)
    questions = gen.texts(rng, "en", words["question"], n, end="?")
    vocabulary = gen.words(rng, "en", 60)  # the task's answer set
    kind = task.rsplit("-", 1)[-1] if not task[-1].isdigit() else task.rsplit("-", 1)[0]
    rows = []
    for i in range(n):
        row: _MosaicRow = {"question": questions[i]}
        if kind == "yesno":
            row["answer"] = "yes" if rng.random() < 0.5 else "no"
        elif kind in ("number", "counting"):
            row["answer"] = str(int(rng.poisson(3)))
        else:
            size = max(1, int(rng.poisson(words["answer"] - 1)) + 1)
            row["answer"] = " ".join(vocabulary[j] for j in rng.integers(0, len(vocabulary), size).tolist())
        if kind == "choice":
            choices = [vocabulary[j] for j in rng.choice(len(vocabulary), 4, replace=False).tolist()]
            row["answer"] = choices[int(rng.integers(4))]
            row["choices"] = choices
        if kind == "multi-image":
            count = int(rng.integers(2, 5))
            row["image"] = [pictures[j] for j in rng.integers(0, len(pictures), count).tolist()]
        else:
            row["image"] = pictures[i // per_image]
        rows.append(row)
    gen.keep([r["answer"] for r in rows])
    return rows


def _mosaic_text_rows(task: str, n: int, rng: np.random.Generator, gen: _Gen) -> list[_MosaicRow]:
    words = MEAN_WORDS["mosaic"]
    questions = gen.texts(rng, "en", words["text_question"], n, end="?")
    if task.startswith("code"):  # code: lines of statements, indented
        answers = []
        for body in gen.texts(rng, "en", words["text_answer"], n, end="", keep=False):
            tokens = body.replace(",", "").split(" ")
            lines = [" ".join(tokens[k : k + 6]) for k in range(0, len(tokens), 6)]
            answers.append(
                f"def {tokens[0].lower()}(x):\n" + "\n".join(f"    {line}" for line in lines) + "\n    return x"
            )
        gen.keep(answers)
    else:
        answers = gen.texts(rng, "en", words["text_answer"], n)
        if task.startswith("math"):  # worked solutions ending in the answer, GSM8K style
            answers = [f"{a}\n#### {int(rng.integers(0, 1000))}" for a in answers]
    return [{"question": q, "answer": a} for q, a in zip(questions, answers, strict=True)]


_WRITERS: dict[str, Callable[[ExperimentConfig, Path, _Gen, float], _Written]] = {
    "xnli": _xnli,
    "masakhanews": _masakhanews,
    "fedaya": _fedaya,
    "sni": _sni,
    "dolly": _dolly,
    "alpagasus": _alpagasus,
    "commonsense": _commonsense,
    "flan": _flan,
    "cifar100": _cifar100,
    "drake": _mosaic,
    "hflb": _mosaic,
    "fedscope": _mosaic,
}
