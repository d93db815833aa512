"""Writing systems: from a word's phonemes to real Unicode text.

Every synthetic word is first a string of phonemes over one small alphabet (consonants ``CONSONANTS``, vowels
``VOWELS``; ``x`` stands for "sh", ``c`` for "ch", ``j`` for "y"). A script turns that string into text in its
own Unicode block, so that a tokenizer sees genuinely different characters for different scripts: alphabets
map phoneme by phoneme (Latin, Cyrillic, Greek, Georgian, Armenian), abjads write consonants and long-vowel
letters (Arabic, Hebrew), abugidas write consonants with vowel signs (Devanagari) and syllabaries write one
character per syllable (Hangul blocks, Ethiopic fidel).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache

CONSONANTS = "ptkbdgmnszfvhlrwjxc"
VOWELS = "aeiou"

_ALPHABETS: dict[str, dict[str, str]] = {
    "latin": {**{p: p for p in "ptkbdgmnszfvhlrwaeiou"}, "j": "y", "x": "sh", "c": "ch"},
    "cyrillic": dict(zip("ptkbdgmnszfvhlrwjxcaeiou", "пткбдгмнсзфвхлрўйшчаеиоу", strict=True)),
    "greek": dict(zip("ptkbdgmnszfvhlrwjxcaeiou", "πτκβδγμνσζφϐχλρϝιξψαειου", strict=True)),
    "georgian": dict(zip("ptkbdgmnszfvhlrwjxcaeiou", "პტკბდგმნსზფვჰლრწჯშჩაეიოუ", strict=True)),
    "armenian": dict(zip("ptkbdgmnszfvhlrwjxcaeiou", [*"պտկբդգմնսզֆվհլրւյշչաեիօ", "ու"], strict=True)),
    "arabic": dict(zip("ptkbdgmnszfvhlrwjxcaeiou", "پتکبدگمنسزفڤهلرۋيشچاېىۆو", strict=True)),
    "hebrew": dict(zip("ptkbdgmnszfvhlrwjxcaeiou", "פטקבדגמנסזףוחלרװישצאעיױו", strict=True)),
}

# Devanagari: consonant letters, independent vowels and dependent vowel signs ("a" is inherent).
_DEVA_CONS = {
    "p": "प", "t": "त", "k": "क", "b": "ब", "d": "द", "g": "ग", "m": "म", "n": "न", "s": "स", "z": "ज़",
    "f": "फ़", "v": "व", "h": "ह", "l": "ल", "r": "र", "w": "व", "j": "य", "x": "श", "c": "च",
}  # fmt: skip
_DEVA_VOWEL = {"a": "अ", "e": "ए", "i": "इ", "o": "ओ", "u": "उ"}
_DEVA_SIGN = {"a": "", "e": "े", "i": "ि", "o": "ो", "u": "ु"}
_VIRAMA = "्"

# Hangul: indices of initial consonants, medial vowels and final consonants in the syllable-block formula.
_HANGUL_INITIAL = dict(
    zip("ptkbdgmnszfvhlrwjxc", [17, 16, 15, 7, 3, 0, 6, 2, 9, 12, 17, 7, 18, 5, 5, 11, 12, 10, 14], strict=True)
)
_HANGUL_VOWEL = {"a": 0, "e": 5, "i": 20, "o": 8, "u": 13}
_HANGUL_FINAL = {"k": 1, "g": 1, "n": 4, "t": 7, "d": 7, "l": 8, "r": 8, "m": 16, "p": 17, "b": 17, "s": 19, "x": 19}
_HANGUL_FINAL_DEFAULT = 21  # written as the "ng" final when a consonant has no final form of its own

# Ethiopic: first syllable of each consonant's row, then the vowel's order within the row.
_ETHIOPIC_ROW = dict(
    zip(
        "ptkbdgmnszfvhlrwjxc",
        [
            0x1350,
            0x1270,
            0x12A8,
            0x1260,
            0x12F0,
            0x1308,
            0x1218,
            0x1290,
            0x1230,
            0x12D8,
            0x1348,
            0x1268,
            0x1200,
            0x1208,
            0x1228,
            0x12C8,
            0x12E8,
            0x1238,
            0x1278,
        ],
        strict=True,
    )
)
_ETHIOPIC_ORDER = {"a": 0, "u": 1, "i": 2, "e": 4, "o": 6, "": 5}
_ETHIOPIC_GLOTTAL = 0x12A0


def syllables(phonemes: str) -> list[tuple[str, str, str]]:
    """Split a phoneme string into (onset, vowel, coda) syllables; a consonant before a vowel opens a syllable."""
    result: list[tuple[str, str, str]] = []
    i = 0
    while i < len(phonemes):
        onset = ""
        if phonemes[i] in CONSONANTS and i + 1 < len(phonemes) and phonemes[i + 1] in VOWELS:
            onset, i = phonemes[i], i + 1
        if phonemes[i] in VOWELS:
            vowel, i = phonemes[i], i + 1
            coda = ""
            if (
                i < len(phonemes)
                and phonemes[i] in CONSONANTS
                and not (i + 1 < len(phonemes) and phonemes[i + 1] in VOWELS)
            ):
                coda, i = phonemes[i], i + 1
            result.append((onset, vowel, coda))
        else:  # a consonant that neither opens nor closes a syllable stands alone
            result.append((phonemes[i], "", ""))
            i += 1
    return result


def _devanagari(phonemes: str) -> str:
    out = []
    for onset, vowel, coda in syllables(phonemes):
        if onset:
            out.append(_DEVA_CONS[onset] + (_DEVA_SIGN[vowel] if vowel else _VIRAMA))
        elif vowel:
            out.append(_DEVA_VOWEL[vowel])
        if coda:
            out.append(_DEVA_CONS[coda] + _VIRAMA)
    return "".join(out)


def _hangul(phonemes: str) -> str:
    out = []
    for onset, vowel, coda in syllables(phonemes):
        vowel = vowel or "u"  # a lone consonant is written with the neutral vowel
        initial = _HANGUL_INITIAL.get(onset, 11)  # 11 is the silent initial
        final = _HANGUL_FINAL.get(coda, _HANGUL_FINAL_DEFAULT) if coda else 0
        out.append(chr(0xAC00 + (initial * 21 + _HANGUL_VOWEL[vowel]) * 28 + final))
    return "".join(out)


def _ethiopic(phonemes: str) -> str:
    out = []
    for onset, vowel, coda in syllables(phonemes):
        row = _ETHIOPIC_ROW[onset] if onset else _ETHIOPIC_GLOTTAL
        out.append(chr(row + _ETHIOPIC_ORDER[vowel]))
        if coda:
            out.append(chr(_ETHIOPIC_ROW[coda] + _ETHIOPIC_ORDER[""]))
    return "".join(out)


def _alphabet(table: dict[str, str]) -> Callable[[str], str]:
    def write(phonemes: str) -> str:
        return "".join(table[p] for p in phonemes)

    return write


WRITERS: dict[str, Callable[[str], str]] = {
    **{name: _alphabet(table) for name, table in _ALPHABETS.items()},
    "devanagari": _devanagari,
    "hangul": _hangul,
    "ethiopic": _ethiopic,
}
SCRIPTS = tuple(WRITERS)


@lru_cache(maxsize=1 << 16)
def write(phonemes: str, script: str) -> str:
    """Render a phoneme string in ``script``."""
    return WRITERS[script](phonemes)
