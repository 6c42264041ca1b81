"""Run text is untrusted: check a decoded JSON document before ingest parses it.

JSON can carry text that is not Unicode: a lone UTF-16 surrogate (``"\\ud800"``, common where a tool cut
a UTF-16 string) decodes to a Python str that cannot be encoded as UTF-8, so it can be neither hashed as a
body nor stored. Bytes that are not UTF-8 arrive the same way when a line is decoded with
``surrogateescape`` (ingest does that only with ``--repair-text``). Python's JSON decoder also accepts
what the store cannot hold or fold back: ``NaN``/``Infinity``, and nesting as deep as its recursion limit.

:func:`parse_checked` is called once per decoded document, around the format's parser:

- by default the first bad string is refused (:class:`TextError`, naming its JSON path);
- with ``repair`` every bad code unit becomes U+FFFD, and the run gets a
  :class:`~kvjudge.retention.events.TextRepaired` event naming the JSON paths and the bodies repaired.

Non-finite numbers and documents nested deeper than :data:`MAX_DEPTH` are refused either way.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from kvjudge.retention import events as ev

#: Deepest nesting of arrays and objects a run may have (serde_json's default limit). Deeper documents are
#: refused: the store's canonical JSON and the fold nest a few levels more, within Python's recursion limit.
MAX_DEPTH = 128

REPLACEMENT = "\ufffd"
_SURROGATE = re.compile("[\ud800-\udfff]")
# A second replacement for the comparison parse in :func:`_repaired_refs`: any character but U+FFFD works.
_MARKER = "\U0010fffd"
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_SHOWN_PATH = 120  # characters of a very deep path an error message shows


class TextError(ValueError):
    """A document holds text that is not Unicode, a number JSON does not have, or nests too deeply.

    ``str()`` is one line naming the JSON path; ingest prefixes the file and line.
    """

    def __init__(self, message: str, path: str) -> None:
        super().__init__(message)
        self.path = path


@dataclass(frozen=True)
class BadString:
    """The first bad code unit of one string: where it is (JSON path, index) and what it is."""

    path: str
    index: int
    code_unit: int
    in_key: bool

    def describe(self) -> str:
        what = "key" if self.in_key else "text"
        return (f"{what} at {_shorten(self.path)} is not valid Unicode: lone surrogate U+{self.code_unit:04X} "
                f"at character {self.index}")


class _Parsed(Protocol):
    run_id: str
    bodies: Mapping[str, bytes]  # ref → body, in the order the parser met them
    events: list[ev.Event]


ParsedT = TypeVar("ParsedT", bound=_Parsed)


def _step(key: str | int) -> str:
    if isinstance(key, int):
        return f"[{key}]"
    if _IDENTIFIER.match(key):
        return f".{key}"
    return f"[{json.dumps(key)}]"  # ASCII-escaped: a key may itself be the bad string


def _path(node: tuple[Any, str | int] | None) -> str:
    steps: list[str] = []
    while node is not None:
        node, key = node
        steps.append(_step(key))
    return "$" + "".join(reversed(steps))


def _bad_index(text: str) -> int | None:
    if text.isascii():
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return exc.start
    return None


def _shorten(path: str) -> str:
    if len(path) <= _SHOWN_PATH:
        return path
    half = _SHOWN_PATH // 2
    return f"{path[:half]}…{path[-half:]}"


def _clean(document: Any) -> bool:
    """True when :func:`scan` would find nothing (the fast path: no paths built, scalars checked in place)."""
    stack: list[tuple[Any, int]] = [([document], 0)]  # (container, depth); the document sits in a wrapper
    while stack:
        container, depth = stack.pop()
        if depth > MAX_DEPTH:
            return False
        if type(container) is dict:
            if not "".join(container).isascii() and not all(_bad_index(key) is None for key in container):
                return False
            values: Any = container.values()
        else:
            values = container
        for value in values:
            kind = type(value)
            if kind is str:
                if not value.isascii() and _bad_index(value) is not None:
                    return False
            elif kind is dict or kind is list:
                stack.append((value, depth + 1))
            elif kind is float and not math.isfinite(value):
                return False
    return True


def scan(document: Any, *, first_only: bool) -> list[BadString]:
    """Every bad string of ``document`` in document order (only the first with ``first_only``).

    Raises :class:`TextError` for a non-finite number or nesting deeper than :data:`MAX_DEPTH`, whatever
    the strings hold. Iterative: the depth of the document is never the depth of this function's stack.
    """
    found: list[BadString] = []
    # (value, path node, depth); a path node is (parent node, key), built into a string only when needed.
    stack: list[tuple[Any, tuple[Any, str | int] | None, int]] = [(document, None, 0)]
    while stack:
        value, node, depth = stack.pop()
        if isinstance(value, str):
            index = _bad_index(value)
            if index is not None:
                found.append(BadString(_path(node), index, ord(value[index]), in_key=False))
                if first_only:
                    return found
        elif isinstance(value, float):
            if not math.isfinite(value):
                raise TextError(f"number at {_shorten(_path(node))} is {value!r}, which JSON does not allow; "
                                f"write it as a string or null", _path(node))
        elif isinstance(value, dict | list):
            if depth >= MAX_DEPTH:
                raise TextError(f"value at {_shorten(_path(node))} is nested deeper than {MAX_DEPTH} levels; "
                                f"store deeply nested data as a JSON string", _path(node))
            if isinstance(value, dict):
                children: list[tuple[Any, tuple[Any, str | int]]] = []
                for key, child in value.items():
                    index = _bad_index(key)
                    if index is not None:
                        found.append(BadString(_path((node, key)), index, ord(key[index]), in_key=True))
                        if first_only:
                            return found
                    children.append((child, (node, key)))
            else:
                children = [(child, (node, position)) for position, child in enumerate(value)]
            # Reversed onto the stack, so they come off in document order.
            stack.extend((child, child_node, depth + 1) for child, child_node in reversed(children))
    return found


def repair(document: Any, replacement: str = REPLACEMENT) -> tuple[Any, int]:
    """``document`` with every lone surrogate (in values and keys) replaced; and how many were replaced.

    Call after :func:`scan` (which bounds the depth this recursion reaches). Two keys of one object that
    read the same once repaired are a :class:`TextError`: a value is never dropped quietly.
    """
    count = 0

    def fix(value: Any, node: tuple[Any, str | int] | None) -> Any:
        nonlocal count
        if isinstance(value, str):
            if _bad_index(value) is None:
                return value
            fixed, n = _SURROGATE.subn(replacement, value)
            count += n
            return fixed
        if isinstance(value, dict):
            fixed_object: dict[str, Any] = {}
            for key, child in value.items():
                new_key = fix(key, node)
                if new_key in fixed_object:
                    path = _path((node, new_key))
                    raise TextError(f"two keys of the object at {_shorten(_path(node))} both read "
                                    f"{json.dumps(new_key)} once repaired; rename one in the source", path)
                fixed_object[new_key] = fix(child, (node, key))
            return fixed_object
        if isinstance(value, list):
            return [fix(child, (node, position)) for position, child in enumerate(value)]
        return value

    return fix(document, None), count


def _repaired_refs(run: _Parsed, parse: Callable[[Any], _Parsed], document: Any) -> list[str]:
    """The refs of ``run``'s bodies that hold repaired text.

    The document is parsed once more with another replacement character: a body that differs between
    the two parses is made of repaired text; one that does not, is not. Should that parse fail or produce
    other bodies (repaired text equal to some other text by accident), every body holding U+FFFD counts.
    """
    if not run.bodies:
        return []  # a parse that stores no bodies (the check pass) has none to name
    try:
        marked = parse(repair(document, _MARKER)[0])
        pairs = list(zip(run.bodies.items(), marked.bodies.values(), strict=True))
    except Exception:  # noqa: BLE001 - the fallback below is always safe
        repaired = [ref for ref, body in run.bodies.items() if REPLACEMENT.encode("utf-8") in body]
    else:
        repaired = [ref for (ref, body), other in pairs if body != other]
    return sorted(set(repaired))  # bodies are keyed by their ref already: nothing to hash again


def parse_checked(document: Any, parse: Callable[[Any], ParsedT], *, repair_text: bool = False) -> ParsedT:
    """Check ``document``'s text, then ``parse`` it (the format's parser, document → ParsedRun).

    Bad text is a :class:`TextError` naming the first bad string's JSON path, unless ``repair_text``:
    then each bad code unit is stored as U+FFFD and a ``TextRepaired`` event, appended to the run's
    events, names every repaired JSON path and the refs of the repaired bodies (the fold keeps it).
    """
    bad = [] if _clean(document) else scan(document, first_only=not repair_text)
    if not bad:
        return parse(document)
    if not repair_text:
        first = bad[0]
        raise TextError(f"{first.describe()}; pass --repair-text to store U+FFFD in its place", first.path)
    fixed, count = repair(document)
    run = parse(fixed)
    run.events.append(ev.TextRepaired(run=run.run_id, paths=[item.path for item in bad], code_units=count,
                                      refs=_repaired_refs(run, parse, document)))
    return run


def describe_repair(note: dict[str, Any], *, paths_shown: int = 5) -> str:
    """One line for a folded ``TextRepaired`` note (``RunState.text_repairs`` entry): what was repaired, where."""
    paths = list(note["paths"])
    listed = ", ".join(_shorten(path) for path in paths[:paths_shown])
    if len(paths) > paths_shown:
        listed += f" (+{len(paths) - paths_shown} more)"
    return (f"{note['code_units']} bad code unit(s) stored as U+FFFD in {len(paths)} string(s) "
            f"(bodies repaired: {len(note['refs'])}): {listed}")
