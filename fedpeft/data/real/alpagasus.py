"""AlpaGasus (the 9k Alpaca subset rated >= 4.5 by a GPT judge) for FLAME's experiments (paper 004).

L. Chen et al., "AlpaGasus: Training a Better Alpaca with Fewer Data", ICLR 2024. Records carry ``instruction``,
``input`` (may be empty) and ``output``; each becomes an Alpaca-template prompt and its response.

AlpaGasus has no category field. ``options.category_rule`` chooses how clients get a category skew:

- ``verb`` (default): a deterministic instruction-type rule on the instruction's first word (below), then a
  Dirichlet partition over these types, as for Dolly's categories;
- ``none``: every record in one category, split IID (``data.partition`` is then ``iid``).

The ``verb`` rule: the instruction's first word, lower-cased, looked up in :data:`INSTRUCTION_TYPES` (eight
types: open_qa, classification, rewriting, summarization, extraction, brainstorming, creative_writing,
explanation; the word lists are in docs/real-data.md); an unlisted first word gives ``open_qa`` when the
instruction ends in ``?`` and ``other`` otherwise.

Sources: ``data.path`` (the release's ``alpaca_t45.json`` JSON list, or any ``.json`` / ``.jsonl`` /
``.parquet`` / ``.csv`` file or directory as for Dolly), else ``data.hub_id`` (default ``mlabonne/alpagasus``,
a parquet export of the 9,229 records). Options: ``num_clients`` (4), ``category_rule`` (``verb``),
``max_samples`` (all).
"""

from __future__ import annotations

import re
from typing import Literal

from fedpeft.core.config import DataConfig
from fedpeft.core.errors import UserError
from fedpeft.core.registry import DATASETS
from fedpeft.data.instruct import instruction_example
from fedpeft.data.options import DatasetOptions, parse_options, setting
from fedpeft.data.real.dolly import build_instruction_federation, check_max_samples, check_records, read_records
from fedpeft.data.types import FederatedData

ALPAGASUS_HUB_ID = "mlabonne/alpagasus"
ALPAGASUS_FIELDS = ("instruction", "input", "output")


class Options(DatasetOptions):
    """``data.options`` of ``alpagasus``."""

    num_clients: int = 4
    category_rule: Literal["verb", "none"] = "verb"
    max_samples: int | None = None


INSTRUCTION_TYPES: dict[str, tuple[str, ...]] = {
    "open_qa": ("what", "who", "whom", "whose", "when", "where", "why", "how", "which", "is", "are", "was", "were",
                "do", "does", "did", "can", "could", "should", "would", "will"),
    "classification": ("classify", "categorize", "categorise", "identify", "determine", "detect", "decide", "label",
                       "sort", "tell", "predict", "choose", "select"),
    "rewriting": ("rewrite", "edit", "paraphrase", "rephrase", "correct", "convert", "change", "transform",
                  "translate", "reorder", "arrange", "format", "replace", "fix"),
    "summarization": ("summarize", "summarise", "condense", "shorten", "outline"),
    "extraction": ("extract", "find", "locate", "pick", "calculate", "compute", "count", "evaluate", "solve"),
    "brainstorming": ("brainstorm", "suggest", "list", "name", "give", "provide", "recommend", "propose", "think",
                      "come", "offer"),
    "creative_writing": ("write", "compose", "create", "generate", "design", "make", "draft", "develop",
                         "construct", "invent", "imagine"),
    "explanation": ("explain", "describe", "discuss", "compare", "analyze", "analyse", "define", "illustrate",
                    "elaborate"),
}  # fmt: skip
_FIRST_WORD = {word: kind for kind, words in INSTRUCTION_TYPES.items() for word in words}


def instruction_type(instruction: str) -> str:
    """The instruction type of the ``verb`` rule (see the module docstring)."""
    words = re.findall(r"[a-z]+", instruction.lower())
    if words and words[0] in _FIRST_WORD:
        return _FIRST_WORD[words[0]]
    return "open_qa" if instruction.strip().endswith("?") else "other"


def check(cfg: DataConfig) -> None:
    """Refuse what :func:`build` would refuse before reading a record (as
    :func:`~fedpeft.data.real.dolly.check_records` does)."""
    opts = _options(cfg)
    check_max_samples(opts.max_samples)
    check_records(cfg, "AlpaGasus", ALPAGASUS_HUB_ID, ALPAGASUS_FIELDS)


def _options(cfg: DataConfig) -> Options:
    opts = parse_options(cfg, Options)
    if opts.category_rule == "none" and setting(cfg, "partition", "iid") != "iid":
        raise UserError("With data.options.category_rule=none AlpaGasus has no categories; set data.partition=iid.")
    return opts


@DATASETS.register("alpagasus")
def build(cfg: DataConfig) -> FederatedData:
    """Build the AlpaGasus federation (see the module docstring for sources, options and the category rule)."""
    opts = _options(cfg)
    rule = opts.category_rule
    rows, source = read_records(cfg, "AlpaGasus", ALPAGASUS_HUB_ID, ALPAGASUS_FIELDS)
    examples = [
        instruction_example(
            str(r["instruction"]),
            str(r["input"] or ""),
            str(r["output"]),
            instruction_type(str(r["instruction"])) if rule == "verb" else "all",
        )
        for r in rows
    ]
    if rule == "none":
        cfg = cfg.model_copy(update={"partition": "iid"})
    return build_instruction_federation(
        cfg,
        "alpagasus",
        examples,
        num_clients=opts.num_clients,
        max_samples=opts.max_samples,
        info={"source": source, "category_rule": rule},
    )
