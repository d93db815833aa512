"""Tokenizers trained on a federation's own texts, cached on disk.

The tiny models (:mod:`fedpeft.models.tiny`) have no pretrained vocabulary: their tokenizer is trained on the
texts of the benchmark (:meth:`FederatedData.corpus`) with the ``tokenizers`` library and cached under
``<cache root>/tokenizers/``, keyed by a hash of the corpus and the settings, so that every worker and every
later run with the same data reuses it.

Two kinds:

- ``wordpiece``: BERT-style (lower-cased, accents kept so that multilingual text stays distinct), with
  ``[PAD]`` (id 0), ``[UNK]``, ``[CLS]``, ``[SEP]``, ``[MASK]`` and the ``[CLS] A [SEP] B [SEP]`` template.
- ``bpe``: byte-level BPE as in Llama-style causal LMs (no unknown tokens), with ``<pad>`` (id 0), ``<s>``
  (bos, id 1, prepended to every encoded text), ``</s>`` (eos, id 2) and ``<unk>`` (id 3).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Literal

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

from fedpeft.core.errors import UserError

TokenizerKind = Literal["wordpiece", "bpe"]

# Bump when the recipe below changes, so that stale cached tokenizers are not reused.
_RECIPE_VERSION = 1

WORDPIECE_SPECIALS = {
    "pad_token": "[PAD]",
    "unk_token": "[UNK]",
    "cls_token": "[CLS]",
    "sep_token": "[SEP]",
    "mask_token": "[MASK]",
}
BPE_SPECIALS = {"pad_token": "<pad>", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
_MIN_VOCAB = {"wordpiece": 64, "bpe": 300}


def cache_root() -> Path:
    """The root of fedpeft's on-disk caches: ``$FEDPEFT_CACHE`` or ``~/.cache/fedpeft``."""
    env = os.environ.get("FEDPEFT_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "fedpeft"


def publish_dir(build: Path, target: Path) -> Path:
    """Move a fully written directory ``build`` to ``target`` atomically.

    Several workers may build the same cache entry at once; the first rename wins and the others discard
    their copy, so a reader never sees a half-written entry.
    """
    try:
        os.rename(build, target)
    except OSError:
        if not target.exists():
            raise
        shutil.rmtree(build, ignore_errors=True)
    return target


def corpus_key(corpus: Iterable[str]) -> str:
    """A hex digest of a sequence of texts (order-sensitive, unambiguous about text boundaries)."""
    digest = hashlib.sha256()
    count = 0
    for text in corpus:
        data = text.encode("utf-8")
        digest.update(len(data).to_bytes(8, "little"))
        digest.update(data)
        count += 1
    digest.update(count.to_bytes(8, "little"))
    return digest.hexdigest()


def tokenizer_cache_dir(key: str, vocab_size: int, kind: str) -> Path:
    """Where the tokenizer of corpus ``key`` with these settings is (or will be) cached."""
    settings = f"{key}|{kind}|{vocab_size}|v{_RECIPE_VERSION}"
    digest = hashlib.sha256(settings.encode()).hexdigest()[:20]
    return cache_root() / "tokenizers" / f"{kind}-{vocab_size}-{digest}"


def _build_wordpiece(vocab_size: int) -> tuple[Tokenizer, trainers.Trainer]:
    tokenizer = Tokenizer(models.WordPiece(unk_token=WORDPIECE_SPECIALS["unk_token"]))
    tokenizer.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=False, lowercase=True
    )
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece(prefix="##")
    trainer = trainers.WordPieceTrainer(
        vocab_size=vocab_size,
        special_tokens=list(WORDPIECE_SPECIALS.values()),
        continuing_subword_prefix="##",
        show_progress=False,
    )
    return tokenizer, trainer


def _finish_wordpiece(tokenizer: Tokenizer) -> PreTrainedTokenizerFast:
    cls_id = tokenizer.token_to_id(WORDPIECE_SPECIALS["cls_token"])
    sep_id = tokenizer.token_to_id(WORDPIECE_SPECIALS["sep_token"])
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)],
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        model_input_names=["input_ids", "token_type_ids", "attention_mask"],
        **WORDPIECE_SPECIALS,
    )


def _build_bpe(vocab_size: int) -> tuple[Tokenizer, trainers.Trainer]:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(BPE_SPECIALS.values()),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    return tokenizer, trainer


def _finish_bpe(tokenizer: Tokenizer) -> PreTrainedTokenizerFast:
    bos = BPE_SPECIALS["bos_token"]
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A $B:1", special_tokens=[(bos, tokenizer.token_to_id(bos))]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        model_input_names=["input_ids", "attention_mask"],
        **BPE_SPECIALS,
    )


def train_tokenizer(
    corpus: Iterable[str],
    vocab_size: int,
    *,
    kind: TokenizerKind = "wordpiece",
    cache_key: str | None = None,
) -> PreTrainedTokenizerFast:
    """Train a tokenizer on ``corpus``, or load it from the cache if it was trained before.

    Args:
        corpus: the texts to learn the vocabulary from (e.g. ``FederatedData.corpus()``).
        vocab_size: the largest vocabulary to learn, special tokens included; a small corpus may give fewer.
        kind: ``"wordpiece"`` (BERT-style) or ``"bpe"`` (byte-level BPE with bos/eos, for causal LMs).
        cache_key: a caller-chosen name of the corpus (e.g. the dataset name and its generator settings).
            When given, the cache is keyed by it instead of a hash of the texts, and ``corpus`` is only read
            on a cache miss. When ``None``, the texts are hashed.

    Returns:
        A fast tokenizer with its pad token set (id 0); ``model_max_length`` is left for the caller to set.

    Raises:
        UserError: for an unknown ``kind``, a vocabulary too small to hold the base alphabet, or an empty
            corpus.
    """
    if kind not in _MIN_VOCAB:
        raise UserError(f"Unknown tokenizer kind {kind!r}; choose 'wordpiece' or 'bpe'.")
    if vocab_size < _MIN_VOCAB[kind]:
        raise UserError(
            f"A {kind} vocabulary needs at least {_MIN_VOCAB[kind]} tokens; raise model.vocab_size (now {vocab_size})."
        )
    if cache_key is None:
        texts = list(corpus)
        key = corpus_key(texts)
    else:
        texts = None
        key = "key:" + cache_key
    target = tokenizer_cache_dir(key, vocab_size, kind)
    if (target / "tokenizer.json").is_file():
        return PreTrainedTokenizerFast.from_pretrained(str(target))

    if texts is None:
        texts = list(corpus)
    if not any(text.strip() for text in texts):
        raise UserError("Cannot train a tokenizer on an empty corpus; check that the dataset has texts.")
    build, finish = (_build_wordpiece, _finish_wordpiece) if kind == "wordpiece" else (_build_bpe, _finish_bpe)
    backend, trainer = build(vocab_size)
    backend.train_from_iterator(texts, trainer=trainer, length=len(texts))
    tokenizer = finish(backend)

    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".building-", dir=target.parent))
    tokenizer.save_pretrained(str(staging))
    publish_dir(staging, target)
    return PreTrainedTokenizerFast.from_pretrained(str(target))
