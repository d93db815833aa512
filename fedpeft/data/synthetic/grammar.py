"""Language-neutral clauses and their rendering in a synthetic language.

A :class:`Clause` says who does what to whom (and where), in concepts; :func:`clause_words` puts it into one
language's words with that language's word order, adjective and adposition placement and negation.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import NamedTuple

from fedpeft.data.synthetic.languages import Language

# Chooses which synonym of a concept to use: random for varied data, always 0 for canonical answers.
VariantPicker = Callable[[str], int]


class Phrase(NamedTuple):
    """A noun phrase: a noun concept and an optional adjective concept."""

    noun: str
    adjective: str | None = None


class Clause(NamedTuple):
    """Subject, verb, object, optional place, and polarity, all as concepts (``_replace`` edits one)."""

    subject: Phrase
    verb: str
    obj: Phrase
    place: str | None = None
    negated: bool = False


def canonical(_concept: str) -> int:
    """Always the first synonym (answers that must be unique)."""
    return 0


def random_variants(lang: Language, rng: random.Random) -> VariantPicker:
    """Each occurrence of a concept draws one of its synonyms at random."""
    lexicon = lang.lexicon

    def pick(concept: str) -> int:
        count = len(lexicon[concept])
        return rng.randrange(count) if count > 1 else 0

    return pick


def consistent_variants(lang: Language, rng: random.Random) -> VariantPicker:
    """A concept draws one synonym at random the first time and keeps it (a prompt and its answer agree)."""
    fresh = random_variants(lang, rng)
    chosen: dict[str, int] = {}

    def pick(concept: str) -> int:
        if concept not in chosen:
            chosen[concept] = fresh(concept)
        return chosen[concept]

    return pick


def phrase_words(lang: Language, phrase: Phrase, pick: VariantPicker = canonical, plural: bool = False) -> list[str]:
    """A noun phrase in ``lang`` (phonemic words)."""
    noun = lang.word(phrase.noun, pick(phrase.noun))
    nouns = lang.pluralize(noun) if plural else [noun]
    if phrase.adjective is None:
        return nouns
    adjective = lang.word(phrase.adjective, pick(phrase.adjective))
    return [adjective, *nouns] if lang.adjective_first else [*nouns, adjective]


def clause_words(lang: Language, clause: Clause, pick: VariantPicker = canonical) -> list[str]:
    """A clause in ``lang`` (phonemic words), negated with the language's own marker when ``clause.negated``."""
    subject = phrase_words(lang, clause.subject, pick)
    obj = phrase_words(lang, clause.obj, pick)
    verb = lang.word(clause.verb, pick(clause.verb))
    verb_group, tail = lang.negate(verb) if clause.negated else ([verb], [])
    if lang.order == "SVO":
        core = subject + verb_group + obj
    elif lang.order == "SOV":
        core = subject + obj + verb_group
    else:
        core = verb_group + subject + obj
    place: list[str] = []
    if clause.place is not None:
        place_word, adposition = lang.word(clause.place, pick(clause.place)), lang.word("IN")
        place = [adposition, place_word] if lang.prepositions else [place_word, adposition]
    return core + place + tail


def render(lang: Language, clause: Clause, pick: VariantPicker = canonical) -> str:
    """A clause as text in ``lang``'s script."""
    return lang.text(clause_words(lang, clause, pick))
