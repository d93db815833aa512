"""English instructions in eight categories (plus two opt-in arithmetic ones), each with one correct response (for
``synthetic-instructions``).

Words are the English glosses of the concept inventory (:mod:`concepts`); every response follows from the
instruction, its input and a small world table, and is unique, so ROUGE-L against it measures correctness:

| category | instruction (input) | response |
|---|---|---|
| ``qualities`` | What are the qualities of a dog? | loud and fast |
| ``closed_qa`` | Who sees the cat? (the old dog sees the cat in the market.) | the old dog |
| ``topic`` | Classify the topic of the headline. (doctor treats patient) | health |
| ``nouns`` | List the nouns in the sentence. (the dog sees the cat in the market.) | dog, cat, market |
| ``count`` | How many times does the word dog occur? (dog cat dog boat) | two |
| ``opposite`` | Give the opposite of the word. (big) | small |
| ``negate`` | Rewrite the sentence in the negative. (the dog sees the cat.) | the dog does not see the cat. |
| ``plural`` | Give the plural of the phrase. (the big dog) | the big dogs |
| ``add`` (opt-in) | What is seven plus five? | twelve |
| ``multiply`` (opt-in) | What is seven times eight? | fifty six |

:func:`knowledge_text` writes the facts behind them as plain sentences (a base corpus that teaches the
world table and the grammar without the instruction format).
"""

from __future__ import annotations

import random

from fedpeft.data.synthetic.concepts import (
    ADJECTIVES,
    ANIMATES,
    ANTONYMS,
    ATTRIBUTES_OF,
    NUMERALS,
    PLACES,
    THINGS,
    TOPICS,
)

CATEGORIES = ("qualities", "closed_qa", "topic", "nouns", "count", "opposite", "negate", "plural")
ARITHMETIC = ("add", "multiply")  # opt-in categories: tables of facts that combine two input words
_NOUNS = tuple(n for n in ANIMATES + THINGS if n != "bread")
_VERBS = ("see", "like", "hate", "buy", "sell", "open", "close", "find", "lose", "carry", "call", "help", "wash",
          "pull", "push", "build", "break")  # fmt: skip
_CONTRASTIVE = tuple(a for a in ADJECTIVES if a in ANTONYMS)
_IRREGULAR_PLURALS = {"child": "children", "woman": "women", "man": "men", "fish": "fish"}
_GLOSS = {"cup_trophy": "trophy"}


_UNITS = NUMERALS + ("ten", "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen",
                     "eighteen", "nineteen")  # fmt: skip
_TENS = ("", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety")


def number_words(n: int) -> str:
    """``56`` -> ``fifty six`` (0 to 99)."""
    if n < 20:
        return _UNITS[n]
    tens, units = divmod(n, 10)
    return _TENS[tens] + (f" {_UNITS[units]}" if units else "")


def _arithmetic(rng: random.Random, category: str) -> tuple[str, str]:
    """("seven times eight", "fifty six"): an ``add`` (0-9 plus 0-9) or ``multiply`` (2-9 times 2-9) fact."""
    low = 0 if category == "add" else 2
    a, b = rng.randint(low, 9), rng.randint(low, 9)
    word = "plus" if category == "add" else "times"
    result = a + b if category == "add" else a * b
    return f"{NUMERALS[a]} {word} {NUMERALS[b]}", number_words(result)


def plural(noun: str) -> str:
    """The English plural of a concept noun."""
    if noun in _IRREGULAR_PLURALS:
        return _IRREGULAR_PLURALS[noun]
    return noun + ("es" if noun.endswith(("s", "sh", "ch", "x")) else "s")


def third_person(verb: str) -> str:
    """``see`` -> ``sees``, ``carry`` -> ``carries``, ``wash`` -> ``washes``."""
    if verb.endswith("y") and verb[-2] not in "aeiou":
        return verb[:-1] + "ies"
    return verb + ("es" if verb.endswith(("s", "sh", "ch", "x")) else "s")


def _phrase(rng: random.Random, noun: str) -> str:
    return f"the {rng.choice(ADJECTIVES)} {noun}" if rng.random() < 0.4 else f"the {noun}"


def _clause(rng: random.Random) -> tuple[str, str, str, str | None, str, str]:
    """(subject phrase, verb, object phrase, place or None, subject noun, object noun)."""
    subject, obj = rng.sample(ANIMATES, 1)[0], rng.choice(_NOUNS)
    place = rng.choice(PLACES) if rng.random() < 0.5 else None
    return _phrase(rng, subject), rng.choice(_VERBS), _phrase(rng, obj), place, subject, obj


def _sentence(subject: str, verb: str, obj: str, place: str | None, negated: bool = False) -> str:
    action = f"does not {verb}" if negated else third_person(verb)
    where = f" in the {place}" if place else ""
    return f"{subject} {action} {obj}{where}."


def make_example(rng: random.Random, category: str) -> tuple[str, str, str]:
    """(instruction, input, response) of one ``category`` instruction (input may be empty)."""
    if category == "qualities":
        noun = rng.choice(tuple(ATTRIBUTES_OF))
        first, second = ATTRIBUTES_OF[noun]
        return f"What are the qualities of a {noun}?", "", f"{first} and {second}"
    if category == "closed_qa":
        subject, verb, obj, place, _, _ = _clause(rng)
        context = _sentence(subject, verb, obj, place)
        asks = ["who", "what"] + (["where"] if place else [])
        ask = rng.choice(asks)
        if ask == "who":
            return f"Who {third_person(verb)} {obj}?", context, subject
        if ask == "what":
            return f"What does {subject} {verb}?", context, obj
        return f"Where does {subject} {verb} {obj}?", context, f"in the {place}"
    if category == "topic":
        topic = rng.choice(tuple(TOPICS))
        first, second = rng.sample(TOPICS[topic]["nouns"], 2)
        verb = rng.choice(TOPICS[topic]["verbs"])
        headline = f"{_GLOSS.get(first, first)} {third_person(verb)} {_GLOSS.get(second, second)}"
        return "Classify the topic of the headline.", headline, topic
    if category == "nouns":
        subject, verb, obj, place, subject_noun, obj_noun = _clause(rng)
        nouns = [subject_noun, obj_noun] + ([place] if place else [])
        return "List the nouns in the sentence.", _sentence(subject, verb, obj, place), ", ".join(nouns)
    if category == "count":
        target, *others = rng.sample(_NOUNS, 3)
        count = rng.randint(0, 5)
        items = [target] * count + [rng.choice(others) for _ in range(rng.randint(max(1, 3 - count), 4))]
        rng.shuffle(items)
        return f"How many times does the word {target} occur?", " ".join(items), NUMERALS[count]
    if category == "opposite":
        adjective = rng.choice(_CONTRASTIVE)
        return "Give the opposite of the word.", adjective, ANTONYMS[adjective]
    if category == "negate":
        subject, verb, obj, place, _, _ = _clause(rng)
        return (
            "Rewrite the sentence in the negative.",
            _sentence(subject, verb, obj, place),
            _sentence(subject, verb, obj, place, negated=True),
        )
    if category in ARITHMETIC:
        question, result = _arithmetic(rng, category)
        return f"What is {question}?", "", result
    if category == "plural":
        noun = rng.choice(_NOUNS)
        adjective = f"{rng.choice(ADJECTIVES)} " if rng.random() < 0.5 else ""
        return "Give the plural of the phrase.", f"the {adjective}{noun}", f"the {adjective}{plural(noun)}"
    raise ValueError(f"unknown category {category!r}")


def knowledge_text(rng: random.Random, arithmetic: tuple[str, ...] = ()) -> str:
    """One plain sentence (or two) of the facts and grammar behind the categories.

    ``arithmetic`` names the opt-in :data:`ARITHMETIC` categories whose facts ("seven times eight is fifty six.")
    join the six kinds of sentence, one kind each.
    """
    kind = rng.randrange(6 + len(arithmetic))
    if kind >= 6:
        question, result = _arithmetic(rng, arithmetic[kind - 6])
        return f"{question} is {result}."
    if kind == 0:
        noun = rng.choice(tuple(ATTRIBUTES_OF))
        first, second = ATTRIBUTES_OF[noun]
        return f"a {noun} is {first} and {second}."
    if kind == 1:
        adjective = rng.choice(_CONTRASTIVE)
        return f"the opposite of {adjective} is {ANTONYMS[adjective]}."
    if kind == 2:
        noun = rng.choice(_NOUNS)
        count = rng.randint(2, 9)
        return f"one {noun}, {NUMERALS[count]} {plural(noun)}."
    if kind == 3:
        subject, verb, obj, place, _, _ = _clause(rng)
        return f"{_sentence(subject, verb, obj, place)} then {_sentence(subject, verb, obj, place, negated=True)}"
    if kind == 4:
        topic = rng.choice(tuple(TOPICS))
        word = rng.choice(TOPICS[topic]["nouns"] + TOPICS[topic]["verbs"])
        return f"{_GLOSS.get(word, word)} is a word about {topic}."
    subject, verb, obj, place, _, _ = _clause(rng)
    return _sentence(subject, verb, obj, place)
