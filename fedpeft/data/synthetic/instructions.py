"""Instructions whose one correct response follows from the prompt and the language.

Each task writes its instruction in the language itself (its words for "list", "negate", "translate", ...,
placed before or after their complement as the language's word order says), then ``:`` and the input. The
response is unique: it repeats the prompt's choice of synonyms and uses the first synonym of any concept the
prompt does not contain, so ROUGE and METEOR against it measure correctness:

- ``qualities``: "list qualities of X" -> the two attributes of X in the world table, joined by "and";
- ``negate``: "negate sentence : S" -> S with its polarity reversed by the language's negation;
- ``translate``: "translate into L : phrase" -> the phrase in language L (L named by its own name);
- ``plural``: "give plural : noun phrase" -> the plural with the language's morphology;
- ``count``: "count X : w1 ... wn" -> the numeral of the number of X among the words;
- ``opposite``: "give opposite of A" -> the antonym of A.
"""

from __future__ import annotations

import random

from fedpeft.data.synthetic.concepts import ADJECTIVES, ANIMATES, ANTONYMS, ATTRIBUTES_OF, NUMERALS, THINGS
from fedpeft.data.synthetic.grammar import Phrase, clause_words, consistent_variants, phrase_words
from fedpeft.data.synthetic.languages import Language
from fedpeft.data.synthetic.nli import random_clause
from fedpeft.data.types import Example

TASKS = ("qualities", "negate", "translate", "plural", "count", "opposite")
_NOUNS = ANIMATES + THINGS
_CONTRASTIVE = tuple(a for a in ADJECTIVES if a in ANTONYMS)


def _instruction(lang: Language, verb: str, complement: list[str]) -> list[str]:
    """An imperative: verb-final in verb-final (SOV) languages, verb-first otherwise."""
    head = [lang.word(verb)]
    return complement + head if lang.order == "SOV" else head + complement


def _of(lang: Language, words: list[str]) -> list[str]:
    """``of`` + words, as a preposition or a postposition."""
    return [lang.word("of"), *words] if lang.prepositions else [*words, lang.word("of")]


def _random_phrase(rng: random.Random) -> Phrase:
    return Phrase(rng.choice(_NOUNS), rng.choice(ADJECTIVES) if rng.random() < 0.5 else None)


def make_instruction(
    rng: random.Random, lang: Language, task: str, targets: list[Language]
) -> tuple[list[str], list[str], Language]:
    """Prompt words and response words (phonemes) of one ``task`` in ``lang``, and the response's language.

    ``targets`` are the languages a ``translate`` instruction may ask for (other than ``lang``).
    """
    pick = consistent_variants(lang, rng)
    if task == "qualities":
        noun = rng.choice(tuple(ATTRIBUTES_OF))
        prompt = _instruction(lang, "list", [lang.word("qualities"), *_of(lang, [lang.word(noun, pick(noun))])])
        first, second = ATTRIBUTES_OF[noun]
        return prompt, [lang.word(first), lang.word("AND"), lang.word(second)], lang
    if task == "negate":
        clause = random_clause(rng)
        prompt = _instruction(lang, "negate", [lang.word("sentence")]) + [":"] + clause_words(lang, clause, pick)
        return prompt, clause_words(lang, clause._replace(negated=not clause.negated), pick), lang
    if task == "translate":
        target = rng.choice([t for t in targets if t.code != lang.code] or [lang])
        phrase = _random_phrase(rng)
        into = [lang.word("into"), target.name] if lang.prepositions else [target.name, lang.word("into")]
        prompt = _instruction(lang, "translate", into) + [":"] + phrase_words(lang, phrase, pick)
        return prompt, phrase_words(target, phrase, pick), target
    if task == "plural":
        phrase = _random_phrase(rng)
        prompt = _instruction(lang, "give", [lang.word("plural_noun")]) + [":"] + phrase_words(lang, phrase, pick)
        return prompt, phrase_words(lang, phrase, pick, plural=True), lang
    if task == "count":
        target_noun, *others = rng.sample(_NOUNS, 3)
        count = rng.randint(0, 5)
        items = [target_noun] * count + [rng.choice(others) for _ in range(rng.randint(max(1, 3 - count), 4))]
        rng.shuffle(items)
        prompt = _instruction(lang, "count", [lang.word(target_noun)]) + [":"] + [lang.word(n) for n in items]
        return prompt, [lang.word(NUMERALS[count])], lang
    if task == "opposite":
        adjective = rng.choice(_CONTRASTIVE)
        prompt = _instruction(
            lang, "give", [lang.word("opposite"), *_of(lang, [lang.word(adjective, pick(adjective))])]
        )
        return prompt, [lang.word(ANTONYMS[adjective])], lang
    raise ValueError(f"unknown task {task!r}")


def instruction_example(rng: random.Random, lang: Language, targets: list[Language]) -> Example:
    """One prompt/response example of a random task, written in ``lang``'s script."""
    task = rng.choice(TASKS)
    prompt, response, response_lang = make_instruction(rng, lang, task, targets)
    prompt_text = " ".join(":" if w == ":" else lang.write(w) for w in prompt)
    return {"prompt": prompt_text, "response": response_lang.text(response), "group": lang.code}
