"""Sentence pairs whose label follows from their content (the semantics behind ``synthetic-xnli``).

A premise is a random :class:`Clause`; the hypothesis is the premise after one edit, and the edit decides the
label:

- entailment: the same clause (each word may switch to a synonym) or the premise minus a modifier (an
  adjective or the place); under a negated premise, the hypothesis may instead *add* a modifier (negation
  reverses what is more specific);
- neutral: an added modifier (unrelated content), another subject or object; under a negated premise, a
  dropped modifier;
- contradiction: the opposite polarity (the language's negation marker added or removed), or an adjective or
  verb swapped for its antonym.

Every word of every label occurs in premises and hypotheses alike, so a bag of words reveals little: the
label depends on which words align with which, and on the polarity of both sentences together.
"""

from __future__ import annotations

import random

from fedpeft.data.synthetic.concepts import ANIMATES, ANTONYMS, PLACES, THINGS, VERBS
from fedpeft.data.synthetic.grammar import Clause, Phrase

LABEL_NAMES = ["entailment", "neutral", "contradiction"]
ENTAILMENT, NEUTRAL, CONTRADICTION = range(3)

# (edit, weight) per label. Edits that need a word-by-word alignment (another entity, an antonym) are the
# hardest for a small model; the weights keep them a minority so that a small transformer can learn the task
# from 2,000 examples, while polarity and monotonicity keep a bag of words near chance (docs/data.md).
EDITS: dict[int, tuple[tuple[str, float], ...]] = {
    ENTAILMENT: (("paraphrase", 0.3), ("drop", 0.4), ("negated_add", 0.3)),
    NEUTRAL: (("add", 0.45), ("negated_drop", 0.35), ("other_entity", 0.2)),
    CONTRADICTION: (("flip", 0.5), ("antonym_verb", 0.3), ("antonym_adjective", 0.2)),
}
# The part of the concept inventory sentence pairs use: small enough (about 50 words per language) that a
# client's 100 examples show most words several times.
SUBJECTS = ANIMATES[:8]
OBJECTS = ANIMATES[:8] + THINGS[:8]
NLI_PLACES = PLACES[:5]
NLI_VERBS = ("see", "carry", *(v for v in VERBS if v in ANTONYMS))
NLI_ADJECTIVES = ("big", "small", "old", "young", "happy", "sad", "fast", "slow", "rich", "poor", "red")
_SLOTS = ("subject_adjective", "object_adjective", "place")
_NEGATED_SHARE = 0.3
_CONTRASTIVE = tuple(a for a in NLI_ADJECTIVES if a in ANTONYMS)
_CONTRASTIVE_VERBS = tuple(v for v in NLI_VERBS if v in ANTONYMS)


def _phrase_key(slot: str) -> str:
    return "subject" if slot == "subject_adjective" else "obj"


def _has(clause: Clause, slot: str) -> bool:
    if slot == "place":
        return clause.place is not None
    return getattr(clause, _phrase_key(slot)).adjective is not None


def _set(clause: Clause, slot: str, value: str | None) -> Clause:
    if slot == "place":
        return clause._replace(place=value)
    if _phrase_key(slot) == "subject":
        return clause._replace(subject=Phrase(clause.subject.noun, value))
    return clause._replace(obj=Phrase(clause.obj.noun, value))


def _adjective(clause: Clause, slot: str) -> str:
    return getattr(clause, _phrase_key(slot)).adjective


def _fresh(slot: str, rng: random.Random) -> str:
    return rng.choice(NLI_PLACES if slot == "place" else NLI_ADJECTIVES)


def random_clause(rng: random.Random, negated: bool | None = None) -> Clause:
    """A random premise; ``negated=None`` draws the polarity."""
    subject = rng.choice(SUBJECTS)
    obj = rng.choice([n for n in OBJECTS if n != subject])
    clause = Clause(Phrase(subject), rng.choice(NLI_VERBS), Phrase(obj))
    for slot in _SLOTS:
        if rng.random() < (0.4 if slot == "place" else 0.5):
            clause = _set(clause, slot, _fresh(slot, rng))
    polarity = rng.random() < _NEGATED_SHARE if negated is None else negated
    return clause._replace(negated=polarity)


def _drop(clause: Clause, rng: random.Random, keep: str | None = None) -> Clause:
    present = [s for s in _SLOTS if _has(clause, s) and s != keep]
    return _set(clause, rng.choice(present), None) if present else clause


def _add(clause: Clause, rng: random.Random) -> Clause:
    missing = [s for s in _SLOTS if not _has(clause, s)]
    if not missing:
        return clause
    slot = rng.choice(missing)
    return _set(clause, slot, _fresh(slot, rng))


def _edit(name: str, rng: random.Random) -> tuple[Clause, Clause]:
    if name == "paraphrase":
        premise = random_clause(rng)
        return premise, premise
    if name in ("drop", "negated_drop"):
        premise = random_clause(rng, negated=name == "negated_drop")
        premise = premise if any(_has(premise, s) for s in _SLOTS) else _add(premise, rng)
        return premise, _drop(premise, rng)
    if name in ("add", "negated_add"):
        premise = _drop(random_clause(rng, negated=name == "negated_add"), rng)
        return premise, _add(premise, rng)
    if name == "other_entity":
        premise = random_clause(rng)
        key = rng.choice(("subject", "obj"))
        phrase: Phrase = getattr(premise, key)
        pool = SUBJECTS if key == "subject" else OBJECTS
        taken = {premise.subject.noun, premise.obj.noun}
        swapped = Phrase(rng.choice([n for n in pool if n not in taken]), phrase.adjective)
        hypothesis = premise._replace(subject=swapped) if key == "subject" else premise._replace(obj=swapped)
        return premise, _drop(hypothesis, rng) if rng.random() < 0.3 else hypothesis
    if name == "flip":
        premise = random_clause(rng, negated=rng.random() < 0.7)
        hypothesis = premise._replace(negated=not premise.negated)
        if rng.random() < 0.5:  # positive -> a negated generalization; negated -> a positive specialization
            hypothesis = _add(hypothesis, rng) if premise.negated else _drop(hypothesis, rng)
        return premise, hypothesis
    if name == "antonym_adjective":
        slot = rng.choice(("subject_adjective", "object_adjective"))
        premise = _set(random_clause(rng, negated=False), slot, rng.choice(_CONTRASTIVE))
        hypothesis = _set(premise, slot, ANTONYMS[_adjective(premise, slot)])
        return premise, _drop(hypothesis, rng, keep=slot) if rng.random() < 0.3 else hypothesis
    if name == "antonym_verb":
        premise = random_clause(rng, negated=False)._replace(verb=rng.choice(_CONTRASTIVE_VERBS))
        hypothesis = premise._replace(verb=ANTONYMS[premise.verb])
        return premise, _drop(hypothesis, rng) if rng.random() < 0.3 else hypothesis
    raise ValueError(f"unknown edit {name!r}")


def sample_pair(rng: random.Random, label: int) -> tuple[Clause, Clause, str]:
    """A (premise, hypothesis, edit name) triple with ``label`` (0 entailment, 1 neutral, 2 contradiction)."""
    edits = EDITS[label]
    name = rng.choices([n for n, _ in edits], weights=[w for _, w in edits])[0]
    premise, hypothesis = _edit(name, rng)
    return premise, hypothesis, name
