"""The concept inventory every synthetic language lexicalizes.

Concepts are language-neutral ids (English glosses). A concept with synonyms has several surface forms in
every language (``VARIANTS``); antonym pairs (``ANTONYMS``) give contradictions; topics (``TOPICS``) give
topic classification its vocabulary; ``ATTRIBUTES_OF`` is the small world-knowledge table that instruction
tasks query. The same inventory is shared by all languages: languages differ in their words, scripts, word
order and morphology, never in what can be said.
"""

from __future__ import annotations

ANIMATES = ("dog", "cat", "bird", "horse", "child", "woman", "man", "teacher", "farmer", "king", "friend", "fish")
THINGS = ("house", "boat", "book", "car", "stone", "bread", "ball", "letter", "tree", "door", "cup", "rope")
PLACES = ("market", "river", "school", "city", "village", "forest", "field", "garden")

VERBS = ("see", "like", "hate", "buy", "sell", "open", "close", "find", "lose", "carry", "call", "help", "wash",
         "pull", "push", "build", "break")  # fmt: skip
ADJECTIVES = ("big", "small", "old", "young", "happy", "sad", "fast", "slow", "rich", "poor", "strong", "weak",
              "clean", "dirty", "red", "green", "loud", "quiet")  # fmt: skip

_ANTONYM_PAIRS = (
    ("like", "hate"), ("buy", "sell"), ("open", "close"), ("find", "lose"), ("pull", "push"), ("build", "break"),
    ("big", "small"), ("old", "young"), ("happy", "sad"), ("fast", "slow"), ("rich", "poor"),
    ("strong", "weak"), ("clean", "dirty"), ("loud", "quiet"),
)  # fmt: skip
ANTONYMS: dict[str, str] = {**dict(_ANTONYM_PAIRS), **{b: a for a, b in _ANTONYM_PAIRS}}

# Concepts with two interchangeable words in every language (synonyms); every other concept has one.
VARIANTS: dict[str, int] = {c: 2 for c in ("see", "like", "help", "big", "small", "happy", "fast", "strong")}

TOPICS: dict[str, dict[str, tuple[str, ...]]] = {
    "business": {"nouns": ("bank", "price", "company", "trader", "money", "tax", "shop", "factory"),
                 "verbs": ("invest", "trade", "pay")},
    "entertainment": {"nouns": ("film", "singer", "concert", "actor", "music", "dancer", "star", "show"),
                      "verbs": ("perform", "sing", "celebrate")},
    "health": {"nouns": ("doctor", "hospital", "medicine", "disease", "patient", "nurse", "clinic", "vaccine"),
               "verbs": ("heal", "treat", "infect")},
    "politics": {"nouns": ("president", "election", "parliament", "minister", "party", "law", "vote", "governor"),
                 "verbs": ("elect", "govern", "debate")},
    "religion": {"nouns": ("church", "mosque", "priest", "prayer", "festival", "god", "temple", "faith"),
                 "verbs": ("pray", "worship", "bless")},
    "sports": {"nouns": ("team", "match", "player", "goal", "coach", "stadium", "cup_trophy", "race"),
               "verbs": ("score", "train", "defeat")},
    "technology": {"nouns": ("phone", "computer", "internet", "engineer", "robot", "network", "app", "satellite"),
                   "verbs": ("launch", "code", "connect")},
}  # fmt: skip
TOPIC_NAMES = tuple(TOPICS)

NUMERALS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
FUNCTION_WORDS = ("NEG", "IN", "AND", "PLURAL")
INSTRUCTION_WORDS = ("list", "qualities", "of", "negate", "sentence", "translate", "into", "give", "plural_noun",
                     "count", "opposite", "word")  # fmt: skip

# World knowledge queried by "list the qualities of X": the same facts in every language.
ATTRIBUTES_OF: dict[str, tuple[str, str]] = {
    "dog": ("loud", "fast"), "cat": ("quiet", "clean"), "bird": ("small", "fast"), "horse": ("big", "strong"),
    "child": ("young", "happy"), "woman": ("strong", "rich"), "man": ("old", "sad"), "teacher": ("old", "quiet"),
    "farmer": ("poor", "strong"), "king": ("rich", "old"), "friend": ("happy", "young"), "fish": ("small", "slow"),
    "house": ("big", "old"), "boat": ("slow", "red"), "book": ("old", "green"), "car": ("fast", "loud"),
    "stone": ("big", "dirty"), "bread": ("small", "clean"), "ball": ("red", "small"), "letter": ("small", "old"),
    "tree": ("big", "green"), "door": ("red", "big"), "cup": ("clean", "small"), "rope": ("strong", "dirty"),
}  # fmt: skip


def all_concepts() -> tuple[str, ...]:
    """Every concept id, in a fixed order (the order lexicons are generated in)."""
    topic_words = tuple(w for topic in TOPICS.values() for kind in ("nouns", "verbs") for w in topic[kind])
    return (ANIMATES + THINGS + PLACES + VERBS + ADJECTIVES + topic_words + NUMERALS + FUNCTION_WORDS
            + INSTRUCTION_WORDS)  # fmt: skip
