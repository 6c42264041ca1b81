"""One large JSON object read member by member, with the items of one array member yielded one at a time:
an inspect ``.json`` log of several GB is read sample by sample, never whole.

Values are decoded by the standard library's own decoder (``json.JSONDecoder.raw_decode``) over a sliding text
window, so a sample decodes exactly as every other document kvjudge reads: lone surrogates reach the untrusted-
text check, ``NaN`` reaches it too, integers keep their digits. (ijson's C backend, the usual streaming parser,
silently turns a lone surrogate into ``?`` and refuses integers beyond 64 bits; its pure-Python backend
tokenizes in Python.) A value cut by the window's end is decoded again once the window has doubled, so the work
per value stays within a small multiple of its size, and memory within twice the largest value plus one 1 MiB
read. :func:`first_item` decodes the first record of a ``.json`` array from its first bytes, for a walk's sniff.
"""

from __future__ import annotations

import codecs
import json
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from kvjudge.errors import IngestError

_CHUNK = 1 << 20
_WHITESPACE = " \t\n\r"
_DECODER = json.JSONDecoder()
_CUT_TOKEN = 16  # a token cut by the window's end fails within this many characters of it (\ud800\udc00 is 12)


class JsonObjectStream:
    """The members of the top-level object in ``handle`` (a binary file), in file order.

    ``members(stream_key)`` yields ``(key, None, value)`` for each member, except ``stream_key``: an array whose
    items come as ``(stream_key, index, item)``. ``where`` prefixes every error (the file's name).
    """

    def __init__(self, handle: IO[bytes], where: str) -> None:
        self._handle = handle
        self._where = where
        # Bytes that are not UTF-8 pass as lone surrogates, for the untrusted-text check to refuse or repair
        # (as a document read with --repair-text does).
        self._utf8 = codecs.getincrementaldecoder("utf-8")("surrogateescape")
        self._buf = ""
        self._pos = 0
        self._eof = False
        self._consumed = 0  # characters dropped from the front of the window

    def members(self, stream_key: str) -> Iterator[tuple[str, int | None, Any]]:
        self._expect("{")
        if self._peek() == "}":
            self._pos += 1
        else:
            while True:
                key = self._value()
                if not isinstance(key, str):
                    raise self._error("an object key must be a string")
                self._expect(":")
                if key == stream_key and self._peek() == "[":
                    yield from self._items(key)
                else:
                    yield key, None, self._value()
                if self._separator("}"):
                    break
        if self._peek() != "":
            raise self._error("unexpected data after the top-level object")

    def _items(self, key: str) -> Iterator[tuple[str, int | None, Any]]:
        self._expect("[")
        if self._peek() == "]":
            self._pos += 1
            return
        index = 0
        while True:
            yield key, index, self._value()
            index += 1
            if self._separator("]"):
                return

    def _separator(self, closing: str) -> bool:
        """After a member or item: True at ``closing`` (consumed), False after a comma."""
        found = self._peek()
        if found in (",", closing):
            self._pos += 1
            return found == closing
        raise self._error(f"expected ',' or {closing!r}")

    def _expect(self, char: str) -> None:
        if self._peek() != char:
            raise self._error(f"expected {char!r}")
        self._pos += 1

    def _peek(self) -> str:
        """The next non-blank character ('' at the end of the file), not consumed."""
        while True:
            while self._pos < len(self._buf) and self._buf[self._pos] in _WHITESPACE:
                self._pos += 1
            if self._pos < len(self._buf):
                return self._buf[self._pos]
            if not self._fill(_CHUNK):
                return ""

    def _value(self) -> Any:
        self._peek()
        while True:
            try:
                value, end = _DECODER.raw_decode(self._buf, self._pos)
            except json.JSONDecodeError as exc:
                cut = exc.msg.startswith("Unterminated string") or exc.pos >= len(self._buf) - _CUT_TOKEN
                if cut and self._grow():
                    continue
                raise self._error(f"not valid JSON ({exc.msg})", exc.pos) from None
            except (ValueError, RecursionError) as exc:  # an integer of > 4300 digits; nesting ~1000 deep
                raise self._error(f"not valid JSON for kvjudge ({str(exc).split(';')[0]})") from None
            # A number that ends the window may go on past it.
            if end == len(self._buf) and isinstance(value, int | float) and self._grow():
                continue
            self._pos = end
            return value

    def _grow(self) -> bool:
        """Double what the window holds past the current position (the value being decoded); False at the end."""
        return self._fill(max(_CHUNK, len(self._buf) - self._pos))

    def _fill(self, size: int) -> bool:
        if self._eof:
            return False
        if self._pos > len(self._buf) // 2:  # drop what was consumed before growing
            self._consumed += self._pos
            self._buf = self._buf[self._pos:]
            self._pos = 0
        chunk = self._handle.read(size)
        self._buf += self._utf8.decode(chunk, final=not chunk)
        self._eof = not chunk
        return bool(chunk)

    def _error(self, message: str, pos: int | None = None) -> IngestError:
        at = self._consumed + (self._pos if pos is None else pos)
        ending = " (the file ends early: is it complete?)" if self._eof and at >= self._consumed + len(self._buf) - 1 \
            else ""
        return IngestError(f"{self._where}: {message} at character {at}{ending}")


FIRST_ITEM_BYTES = 64 << 10


def first_item(path: Path) -> Any:
    """The first item of the JSON array ``path`` holds when it lies within the file's first
    :data:`FIRST_ITEM_BYTES` (a directory walk's sniff for a ``.json`` file of one run's records); None when the
    file is no array, its first item is longer, or it cannot be read."""
    try:
        with path.open("rb") as handle:
            head = handle.read(FIRST_ITEM_BYTES).decode("utf-8", "ignore").lstrip(_WHITESPACE + "\ufeff")
    except OSError:
        return None
    if not head.startswith("["):
        return None
    try:
        return _DECODER.raw_decode(head[1:].lstrip(_WHITESPACE))[0]
    except (ValueError, RecursionError):
        return None
