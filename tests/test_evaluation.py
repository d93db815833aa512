"""Metrics: accuracy, ROUGE on any script, METEOR offline without WordNet."""

from __future__ import annotations

import nltk
import pytest
from rouge_score import rouge_scorer

from fedpeft.evaluation import (
    UnicodeTokenizer,
    accuracy,
    generation_metrics,
    meteor,
    metric_names,
    rouge,
)

RUSSIAN = "Кошка сидит на ковре и смотрит в окно"
HINDI = "बिल्ली चटाई पर बैठी है"


def test_accuracy():
    assert accuracy([1, 0, 2, 2], [1, 1, 2, 0]) == 0.5
    assert accuracy([3], [3]) == 1.0
    with pytest.raises(ValueError, match="3 predictions but 2 references"):
        accuracy([1, 0, 1], [1, 0])
    with pytest.raises(ValueError, match="no predictions"):
        accuracy([], [])


def test_tokenizer_keeps_every_script_and_whole_indic_words():
    tokenizer = UnicodeTokenizer()
    assert tokenizer.tokenize("Привет, МИР!") == ["привет", "мир"]
    # Vowel signs and the virama are combining marks: they stay inside the word.
    assert tokenizer.tokenize("नमस्ते दुनिया।") == ["नमस्ते", "दुनिया"]
    assert tokenizer.tokenize("你好 world_2") == ["你", "好", "world", "2"]


def test_rouge_on_non_latin_text():
    # rouge-score's own tokenizer drops non-ASCII text entirely, which is why the project passes its own.
    default = rouge_scorer.RougeScorer(["rouge1"]).score(RUSSIAN, RUSSIAN)["rouge1"].fmeasure
    assert default == 0.0
    assert rouge([RUSSIAN, HINDI], [RUSSIAN, HINDI]) == {"rouge1": 1.0, "rougeL": 1.0}
    # 2 of 3 Hindi words shared: P = R = F = 2/3; reordered Cyrillic: all unigrams, LCS of 2 of 3.
    scores = rouge(["बिल्ली पर बैठी"], ["बिल्ली पर सोई"])
    assert scores["rouge1"] == pytest.approx(2 / 3) and scores["rougeL"] == pytest.approx(2 / 3)
    scores = rouge(["мир кошка дом"], ["кошка дом мир"])
    assert scores["rouge1"] == pytest.approx(1.0) and scores["rougeL"] == pytest.approx(2 / 3)
    assert rouge(["a b"], ["c d"]) == {"rouge1": 0.0, "rougeL": 0.0}


def test_meteor_identical_exact_value():
    # 3 matches in 1 chunk: F = 1, penalty = 0.5 * (1 / 3) ** 3.
    assert meteor(["the cat sat"], ["the cat sat"]) == pytest.approx(1 - 0.5 / 27)
    assert (
        meteor(
            [RUSSIAN, "a long sentence that is the same on both sides"],
            [RUSSIAN, "a long sentence that is the same on both sides"],
        )
        > 0.99
    )


def test_meteor_runs_offline_without_synonyms(monkeypatch, tmp_path):
    # An empty nltk data path: any attempt to load WordNet would raise LookupError.
    monkeypatch.setattr(nltk.data, "path", [str(tmp_path)])
    # WordNet would match car/automobile; without it only exact and stem matches count.
    assert meteor(["car"], ["automobile"]) == 0.0
    assert meteor(["the dogs were running"], ["the dog was running"]) > meteor(["the cats were"], ["the dog was"])
    assert meteor(["running"], ["runs"]) == pytest.approx(0.5)  # one stem match in one chunk
    assert meteor([""], ["something"]) == 0.0


def test_generation_metrics_and_names():
    scores = generation_metrics([HINDI], [HINDI])
    assert list(scores) == ["meteor", "rouge1", "rougeL"]
    assert scores["rouge1"] == 1.0 and 0.99 < scores["meteor"] <= 1.0
    assert metric_names("classification") == ["accuracy"]
    assert metric_names("generation") == ["meteor", "rouge1", "rougeL"]
    with pytest.raises(ValueError, match="unknown task"):
        metric_names("regression")
