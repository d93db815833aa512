"""Metrics of the benchmarks: accuracy (classification), METEOR, ROUGE-1 and ROUGE-L (generation).

Every metric is a plain function of predictions and references that returns values in [0, 1]; results.jsonl
stores them so and the summary tables print them x100.

Text metrics share one tokenizer, :class:`UnicodeTokenizer`, because the benchmarks are multilingual:
rouge-score's default tokenizer keeps only ``[a-z0-9]`` and would score every Cyrillic, Devanagari or Arabic
prediction 0. METEOR runs nltk's implementation with its synonym stage switched off (no WordNet is needed or
loaded), so it matches exact tokens and Porter stems only; see docs/outputs.md.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

CLASSIFICATION_METRICS = ["accuracy"]
GENERATION_METRICS = ["meteor", "rouge1", "rougeL"]

# Scripts written without spaces between words: each character is one token (as usual for ROUGE on Chinese and
# Japanese), otherwise a whole sentence would be a single token.
_PER_CHARACTER_RANGES = (
    (0x3040, 0x30FF),  # Hiragana, Katakana
    (0x3400, 0x4DBF),  # CJK Unified Ideographs Extension A
    (0x4E00, 0x9FFF),  # CJK Unified Ideographs
    (0xF900, 0xFAFF),  # CJK Compatibility Ideographs
    (0x20000, 0x2FA1F),  # CJK Unified Ideographs Extensions B-F and supplement
)


@lru_cache(maxsize=65536)
def _char_kind(char: str) -> str:
    """``"single"`` (a token by itself), ``"word"`` (part of a word) or ``"break"`` (between words)."""
    code = ord(char)
    if any(low <= code <= high for low, high in _PER_CHARACTER_RANGES):
        return "single"
    # Letters, digits and combining marks: Indic vowel signs and viramas are marks (Mc, Mn) inside the word.
    return "word" if unicodedata.category(char)[0] in "LNM" else "break"


class UnicodeTokenizer:
    """Lower-cased word tokens of any script; punctuation, symbols and whitespace separate words.

    Has the ``tokenize(text)`` method that ``rouge_score.rouge_scorer.RougeScorer`` expects of a tokenizer.
    No stemming: a stemmer of one language would distort the others.
    """

    def tokenize(self, text: str) -> list[str]:
        tokens: list[str] = []
        word: list[str] = []
        for char in unicodedata.normalize("NFC", text).lower():
            kind = _char_kind(char)
            if kind == "word":
                word.append(char)
                continue
            if word:
                tokens.append("".join(word))
                word = []
            if kind == "single":
                tokens.append(char)
        if word:
            tokens.append("".join(word))
        return tokens


_TOKENIZER = UnicodeTokenizer()


class _NoSynonyms:
    """Stands in for nltk's WordNet reader in METEOR: every word has no synsets.

    nltk calls ``wordnet.synsets(word)`` in its synonym stage and adds the word itself to the synonym set, so
    with this stand-in that stage can only match identical words, which the exact stage has already matched.
    """

    def synsets(self, lemma: str, *args: Any, **kwargs: Any) -> list[Any]:
        return []


_NO_SYNONYMS = _NoSynonyms()


def _check_lengths(predictions: Sequence[Any], references: Sequence[Any]) -> None:
    if len(predictions) != len(references):
        raise ValueError(f"{len(predictions)} predictions but {len(references)} references")
    if not predictions:
        raise ValueError("no predictions to score")


def accuracy(predictions: Sequence[int], labels: Sequence[int]) -> float:
    """Fraction of predictions equal to their label.

    Args:
        predictions: predicted class indices.
        labels: true class indices, same length.

    Returns:
        Accuracy in [0, 1].
    """
    _check_lengths(predictions, labels)
    return sum(int(p) == int(y) for p, y in zip(predictions, labels, strict=True)) / len(labels)


def rouge(predictions: Sequence[str], references: Sequence[str]) -> dict[str, float]:
    """ROUGE-1 and ROUGE-L F-measures with a tokenizer that keeps every script.

    Args:
        predictions: generated texts.
        references: reference texts, same length.

    Returns:
        ``{"rouge1": ..., "rougeL": ...}``, each the mean F-measure over the samples, in [0, 1].
    """
    _check_lengths(predictions, references)
    from rouge_score import rouge_scorer  # imports nltk, which takes seconds: only when scoring

    scorer = rouge_scorer.RougeScorer(["rouge1", "rougeL"], tokenizer=_TOKENIZER)
    totals = {"rouge1": 0.0, "rougeL": 0.0}
    for prediction, reference in zip(predictions, references, strict=True):
        scores = scorer.score(reference, prediction)
        for name in totals:
            totals[name] += scores[name].fmeasure
    return {name: total / len(predictions) for name, total in totals.items()}


def meteor(predictions: Sequence[str], references: Sequence[str]) -> float:
    """Mean sentence-level METEOR (nltk), exact and Porter-stem matching, no WordNet synonyms.

    Texts are tokenized with :class:`UnicodeTokenizer`. Runs offline: the WordNet corpus is never loaded.

    Args:
        predictions: generated texts.
        references: reference texts (one per prediction), same length.

    Returns:
        METEOR in [0, 1]; 0 for an empty prediction or reference.
    """
    from nltk.translate.meteor_score import meteor_score  # seconds to import: only when scoring

    _check_lengths(predictions, references)
    total = 0.0
    for prediction, reference in zip(predictions, references, strict=True):
        total += meteor_score([_TOKENIZER.tokenize(reference)], _TOKENIZER.tokenize(prediction), wordnet=_NO_SYNONYMS)
    return total / len(predictions)


def generation_metrics(predictions: Sequence[str], references: Sequence[str]) -> dict[str, float]:
    """METEOR, ROUGE-1 and ROUGE-L of generated texts.

    Returns:
        ``{"meteor": ..., "rouge1": ..., "rougeL": ...}``, each in [0, 1].
    """
    return {"meteor": meteor(predictions, references), **rouge(predictions, references)}


def metric_names(task: str) -> list[str]:
    """The metrics reported for a task kind: ``"classification"`` or ``"generation"``."""
    if task == "classification":
        return list(CLASSIFICATION_METRICS)
    if task == "generation":
        return list(GENERATION_METRICS)
    raise ValueError(f"unknown task {task!r}; expected 'classification' or 'generation'")


def answer_accuracy(predictions: Sequence[str], answers: Sequence[str], options: Sequence[Sequence[str]]) -> float:
    """Share of generated responses whose answer is right, for multiple-choice prompts answered in words.

    The predicted answer is the first of the example's ``options`` (e.g. ``answer1`` ... ``answer4``, ``true`` /
    ``false``) that occurs as a token of the response, as the commonsense benchmarks of LLM-Adapters score a
    free-form answer such as "the correct answer is answer2"; no option in the response counts as wrong.
    """
    _check_lengths(predictions, answers)
    if not predictions:
        return 0.0
    tokenizer = UnicodeTokenizer()
    correct = 0
    for prediction, answer, choices in zip(predictions, answers, options, strict=True):
        allowed = {c.lower() for c in choices}
        picked = next((t for t in tokenizer.tokenize(prediction) if t in allowed), None)
        correct += picked == answer.lower()
    return correct / len(predictions)
