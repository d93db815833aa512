"""The synthetic languages: lexicons, families, typology and resource levels.

Each family has a proto-language: a phoneme inventory, syllable shapes and a proto-lexicon (one word per
concept of :mod:`concepts`). A daughter language inherits the proto-lexicon through one or two regular sound
changes (``p > f``, intervocalic ``t > d``, loss of final vowels, ...) and replaces about a tenth of its content
words, so related languages share most word stems and therefore subwords; an isolate is a family of one, so
unrelated languages share nothing but the concepts. Typology (word order, adjective and adposition position,
how negation and plural are marked) is drawn per proto-language; each daughter keeps each feature with
probability 0.85.

The languages are fixed: they are drawn from constant seeds, so every data seed samples sentences of the same
languages. Codes name the script and an index (``lat1`` is the first Latin-script language); the family in
``INVENTORY`` says which are related (``arb2`` belongs to the family of ``dev1`` and ``dev2`` but is written in
Arabic script, as Urdu is to Hindi).
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from functools import cache

from fedpeft.data.synthetic.concepts import VARIANTS, all_concepts
from fedpeft.data.synthetic.scripts import CONSONANTS, VOWELS, write

# code: (family, script, resource level)
INVENTORY: dict[str, tuple[str, str, str]] = {
    "lat1": ("lumic", "latin", "high"), "lat2": ("lumic", "latin", "high"), "lat3": ("lumic", "latin", "mid"),
    "cyr1": ("borean", "cyrillic", "high"), "cyr2": ("borean", "cyrillic", "mid"),
    "cyr3": ("borean", "cyrillic", "low"),
    "arb1": ("arb1", "arabic", "high"), "arb2": ("gangic", "arabic", "low"),
    "dev1": ("gangic", "devanagari", "mid"), "dev2": ("gangic", "devanagari", "low"),
    "grk1": ("grk1", "greek", "mid"), "hng1": ("hng1", "hangul", "high"), "lat4": ("lat4", "latin", "low"),
    "geo1": ("geo1", "georgian", "low"), "eth1": ("eth1", "ethiopic", "low"),
    "arm1": ("arm1", "armenian", "low"), "heb1": ("heb1", "hebrew", "mid"),
}  # fmt: skip
RESOURCE_SHARE = {"high": 1.0, "mid": 0.25, "low": 0.03}

_SOUND_CHANGES = (
    ("p", "f"), ("(?<=[aeiou])t(?=[aeiou])", "d"), ("(?<=[aeiou])k(?=[aeiou])", "g"), ("k(?=[ie])", "c"),
    ("s(?=[ie])", "x"), ("b", "v"), ("o", "u"), ("e$", "a"), ("(?<=[^aeiou])[aeiou]$", ""), ("^h", ""),
    ("l", "r"), ("a(?=[mn]$)", "o"), ("d", "z"), ("g(?=[ie])", "j"), ("i$", "e"), ("n$", "m"), ("u", "o"),
)  # fmt: skip
_ORDERS = ("SVO", "SOV", "VSO")
_NEGATIONS = ("pre", "post", "prefix", "suffix", "final")
_PLURALS = ("suffix", "prefix", "redup", "particle")
_REPLACED_SHARE = 0.1  # share of a daughter's content words replaced by new ones
_CHANGES_PER_DAUGHTER = (1, 2)  # how many regular sound changes a daughter undergoes
_KEEP_TYPOLOGY = 0.85  # chance that a daughter keeps each typological feature of its proto-language


@dataclass(frozen=True)
class Phonology:
    """What words of one proto-language may look like."""

    consonants: str
    vowels: str
    closed_syllables: float  # probability that a syllable ends in a consonant

    def word(self, rng: random.Random, n_syllables: int) -> str:
        parts = []
        for _ in range(n_syllables):
            parts.append(rng.choice(self.consonants) + rng.choice(self.vowels))
            if rng.random() < self.closed_syllables:
                parts.append(rng.choice(self.consonants))
        return "".join(parts)


@dataclass(frozen=True)
class Language:
    """One synthetic language: lexicon (phonemes), script and grammar.

    Attributes:
        code: short id such as ``lat1``.
        family: family name; languages of one family derive from one proto-lexicon.
        script: writing system (see :mod:`scripts`).
        resource: ``high``, ``mid`` or ``low``: its share of the base-model corpus.
        name: the language's name for itself (phonemes), written in other languages' scripts as a proper noun.
        lexicon: concept -> phonemic words (several for concepts with synonyms).
        order: clause word order (``SVO``, ``SOV``, ``VSO``).
        adjective_first: adjective before the noun.
        prepositions: adposition before its noun.
        negation: how a clause is negated: particle ``pre``/``post`` verb, verb ``prefix``/``suffix``, or
            sentence-``final`` particle.
        plural: how plural nouns are formed: ``suffix``, ``prefix``, ``redup`` (first syllable doubled) or a
            ``particle`` before the noun.
    """

    code: str
    family: str
    script: str
    resource: str
    name: str
    lexicon: dict[str, tuple[str, ...]]
    order: str
    adjective_first: bool
    prepositions: bool
    negation: str
    plural: str

    def word(self, concept: str, variant: int = 0) -> str:
        """The phonemes of ``concept`` (its ``variant``-th synonym)."""
        return self.lexicon[concept][variant]

    def write(self, phonemes: str) -> str:
        return write(phonemes, self.script)

    def text(self, words: list[str]) -> str:
        """Write a list of phonemic words as a sentence."""
        return " ".join(self.write(w) for w in words)

    def pluralize(self, noun: str) -> list[str]:
        """The plural of a phonemic noun (one or two words)."""
        marker = self.word("PLURAL")
        if self.plural == "suffix":
            return [noun + marker]
        if self.plural == "prefix":
            return [marker + noun]
        if self.plural == "redup":
            return [noun[:2] + noun]
        return [marker, noun]

    def negate(self, verb: str) -> tuple[list[str], list[str]]:
        """The negated verb group and any sentence-final words (for ``final`` negation)."""
        marker = self.word("NEG")
        forms = {"pre": [marker, verb], "post": [verb, marker], "prefix": [marker + verb], "suffix": [verb + marker]}
        if self.negation == "final":
            return [verb], [marker]
        return forms[self.negation], []


def _proto_phonology(rng: random.Random) -> Phonology:
    consonants = "".join(sorted(rng.sample(CONSONANTS, rng.randint(10, 14))))
    vowels = "".join(sorted(rng.sample(VOWELS, rng.randint(3, 5))))
    return Phonology(consonants, vowels, rng.choice((0.1, 0.25, 0.4)))


def _syllable_count(concept: str, rng: random.Random) -> int:
    if concept in ("NEG", "PLURAL", "IN", "AND"):
        return 1
    return rng.choice((1, 2, 2, 2, 3)) if concept.islower() else 1


@cache
def _proto(family: str) -> tuple[Phonology, dict[str, tuple[str, ...]], dict[str, object]]:
    rng = random.Random(f"fedpeft-proto-{family}")
    phonology = _proto_phonology(rng)
    lexicon: dict[str, tuple[str, ...]] = {}
    used: set[str] = set()
    for concept in all_concepts():
        words = []
        for _ in range(VARIANTS.get(concept, 1)):
            word = phonology.word(rng, _syllable_count(concept, rng))
            while word in used:
                word += phonology.word(rng, 1)
            used.add(word)
            words.append(word)
        lexicon[concept] = tuple(words)
    typology = {
        "order": rng.choice(_ORDERS), "adjective_first": rng.random() < 0.5, "prepositions": rng.random() < 0.5,
        "negation": rng.choice(_NEGATIONS), "plural": rng.choice(_PLURALS),
    }  # fmt: skip
    return phonology, lexicon, typology


def _sound_change(word: str, rules: list[tuple[str, str]]) -> str:
    for pattern, replacement in rules:
        word = re.sub(pattern, replacement, word)
    return word or "a"


@cache
def language(code: str) -> Language:
    """The language ``code`` of ``INVENTORY`` (built once, from constant seeds)."""
    family, script, resource = INVENTORY[code]
    phonology, proto_lexicon, proto_typology = _proto(family)
    rng = random.Random(f"fedpeft-language-{code}")
    is_isolate = family == code
    rules = [] if is_isolate else rng.sample(_SOUND_CHANGES, rng.randint(*_CHANGES_PER_DAUGHTER))
    lexicon: dict[str, tuple[str, ...]] = {}
    written: set[str] = set()
    for concept, proto_words in proto_lexicon.items():
        words = []
        for proto_word in proto_words:
            replaced = not is_isolate and concept.islower() and rng.random() < _REPLACED_SHARE
            word = phonology.word(rng, _syllable_count(concept, rng)) if replaced else proto_word
            word = _sound_change(word, rules)
            # Keep the written forms distinct: a sound change or a script can merge two words.
            while write(word, script) in written:
                word += phonology.word(rng, 1)
            written.add(write(word, script))
            words.append(word)
        lexicon[concept] = tuple(words)
    typology = {
        key: value if is_isolate or rng.random() < _KEEP_TYPOLOGY else None for key, value in proto_typology.items()
    }
    choices = {"order": _ORDERS, "negation": _NEGATIONS, "plural": _PLURALS}
    for key, value in typology.items():
        if value is None:
            typology[key] = rng.choice(choices[key]) if key in choices else rng.random() < 0.5
    name = phonology.word(random.Random(f"fedpeft-name-{code}"), 2)
    return Language(code, family, script, resource, name, lexicon, **typology)  # type: ignore[arg-type]


def languages(codes: list[str] | tuple[str, ...]) -> list[Language]:
    """The languages ``codes``, in that order."""
    return [language(code) for code in codes]
