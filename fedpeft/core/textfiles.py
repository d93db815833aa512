"""Text files in the encoding their user names: a byte that does not decode is one sentence naming the file, the
line and the byte offset, never a traceback and never text with the bytes' ``repr`` in it.

``utf-8`` reads files with and without a byte order mark (the mark is dropped, as ``utf-8-sig`` does; ``utf-16``
and ``utf-32`` read theirs).
"""

from __future__ import annotations

import codecs
from pathlib import Path

from fedpeft.core.errors import UserError

# Suggested in a ``fix`` (its ``{encoding}``) when the bytes give no hint of their encoding.
SOME_ENCODING = "the file's encoding (e.g. latin-1, cp1252 or utf-16)"
# Byte order marks of the encodings that UTF-8 cannot read, longest first (UTF-32 LE starts like UTF-16 LE).
_WIDE_MARKS = (
    (codecs.BOM_UTF32_LE, "utf-32"),
    (codecs.BOM_UTF32_BE, "utf-32"),
    (codecs.BOM_UTF16_LE, "utf-16"),
    (codecs.BOM_UTF16_BE, "utf-16"),
)


def codec_of(encoding: str, option: str) -> str:
    """The name of the Python codec that reads ``encoding``.

    Args:
        encoding: an encoding name Python knows (``utf-8``, ``latin-1``, ``cp1252``, ``utf-16``, ...).
        option: where the name was given (``data.encoding``, ``--encoding``), for the message.

    Returns:
        The codec's name.
    """
    try:
        name = codecs.lookup(encoding).name
    except LookupError:
        raise UserError(
            f"{option} {encoding!r} is not an encoding Python knows; use e.g. utf-8, latin-1, cp1252 or utf-16."
        ) from None
    return name


def decode_text(data: bytes, source: str | Path, encoding: str, fix: str, option: str = "the encoding") -> str:
    """``data`` decoded from ``encoding``, refusing bytes that are not text in it.

    Args:
        data: the file's bytes.
        source: the file, for the message.
        encoding: the encoding the file is expected to be in.
        fix: how to fix an undecodable file, the end of the message; ``{encoding}`` in it is replaced by the
            encoding the bytes suggest (``utf-16`` after a UTF-16 byte order mark or beside NUL bytes), else by
            :data:`SOME_ENCODING`.
        option: where ``encoding`` was given, for the message of an unknown encoding.

    Returns:
        The text, without a byte order mark.

    Raises:
        UserError: one sentence naming the file, the line and the byte offset of the first byte that does not
            decode (or of the first NUL byte, which no text file in a one-byte or UTF-8 encoding holds).
    """
    codec = codec_of(encoding, option)
    # Decoding after the mark (rather than with utf-8-sig) keeps the offsets of errors those of the file.
    skip = len(codecs.BOM_UTF8) if codec == "utf-8" and data.startswith(codecs.BOM_UTF8) else 0
    try:
        text = data[skip:].decode(codec)
    except UnicodeDecodeError as err:
        offset = skip + err.start
        wide = codec.startswith(("utf-16", "utf-32"))
        marked = next((name for mark, name in _WIDE_MARKS if data.startswith(mark)), None)
        hint = marked if marked is not None and not codec.startswith(marked) else None
        note = f": the file starts with a {hint.upper()} byte order mark" if hint else ""
        if hint is None and not wide and b"\x00" in data[: offset + 2]:
            hint, note = "utf-16", ": the file holds NUL bytes, as UTF-16 text does"
        line = _line_at(data, offset, codec)
        raise UserError(
            f"{source} line {line} has a byte that is not valid {encoding} (0x{data[offset]:02x} at byte offset "
            f"{offset}{note}); {fix.format(encoding=hint or SOME_ENCODING)}."
        ) from None
    if "\x00" in text and not codec.startswith(("utf-16", "utf-32")):
        offset = data.find(b"\x00")
        line = _line_at(data, offset, codec)
        raise UserError(
            f"{source} line {line} has a NUL byte (byte offset {offset}), which text in {encoding} does not hold "
            f"(UTF-16 text does); {fix.format(encoding='utf-16')}."
        )
    return text


def read_text(path: Path, encoding: str, fix: str, option: str = "the encoding") -> str:
    """The text of the file ``path`` (see :func:`decode_text`); an unreadable file is a ``UserError``."""
    try:
        data = path.read_bytes()
    except OSError as err:
        raise UserError(f"Could not read {path} ({err.strerror or type(err).__name__}); check the path.") from None
    return decode_text(data, path, encoding, fix, option)


def _line_at(data: bytes, offset: int, codec: str) -> int:
    """The 1-based line of the byte at ``offset``; the bytes before it decode, so their newlines can be counted."""
    return data[:offset].decode(codec, errors="replace").count("\n") + 1
