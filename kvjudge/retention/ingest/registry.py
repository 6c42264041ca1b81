"""The one door: every run format kvjudge reads, in detection order — its own, then those other packages add
through the ``kvjudge.formats`` entry-point group (each entry point names a :class:`~.format.Format`).

Detection, the ``--format`` choices, ``kvjudge ingest --help``, the formats section of ``docs/ingest.md`` (a
test compares them) and the "none of the formats" error are all made from :func:`formats`. A format other
packages add is asked before the two broad ones (native and OpenAI chat, which claim any object with an ``id``
or ``messages``); an entry point that cannot be loaded, or that reuses a name, is left out and said in
:func:`load_problems` (the ingest command prints it), never a traceback.
"""

from __future__ import annotations

import fnmatch
import functools
from typing import Any

from kvjudge.plugins import load_group
from kvjudge.retention.ingest import (
    claude_code,
    cline,
    codex,
    harbor,
    inspect_log,
    mini_swe_agent,
    native,
    openai,
    openhands,
    openhands_export,
    openhands_v1,
    swe_agent,
)
from kvjudge.retention.ingest.format import Companion, Format

ENTRY_POINT_GROUP = "kvjudge.formats"
AUTO = "auto"
#: kvjudge's own formats, most specific first; the broad ones (:data:`_FALLBACK`) come after any added format.
_OWN = (mini_swe_agent.FORMAT, swe_agent.FORMAT, openhands.FORMAT, harbor.FORMAT, inspect_log.FORMAT,
        claude_code.FORMAT, codex.FORMAT, openhands_v1.FORMAT, openhands_export.FORMAT, cline.FORMAT)
_FALLBACK = (native.FORMAT, openai.FORMAT)


@functools.cache
def _loaded() -> tuple[tuple[Format, ...], tuple[str, ...]]:
    added, problems = load_group(ENTRY_POINT_GROUP, "format", Format,
                                 {fmt.name for fmt in (*_OWN, *_FALLBACK)} | {AUTO})
    return (*_OWN, *added, *_FALLBACK), tuple(problems)


def formats() -> tuple[Format, ...]:
    """Every format, in detection order."""
    return _loaded()[0]


def load_problems() -> tuple[str, ...]:
    """One line per entry point of ``kvjudge.formats`` left out (it did not load, or reused a name)."""
    return _loaded()[1]


def names() -> tuple[str, ...]:
    """The ``--format`` choices: ``auto`` and every format's name."""
    return (AUTO, *(fmt.name for fmt in formats()))


def get(name: str) -> Format | None:
    return next((fmt for fmt in formats() if fmt.name == name), None)


def detect(obj: Any) -> Format | None:
    """The format of one decoded document: an object by each format's sniff, a sequence of records (a JSON array,
    a session's lines) by its first record; None when no format claims it."""
    if isinstance(obj, dict):
        return next((fmt for fmt in formats() if fmt.recognises is not None and fmt.recognises(obj)), None)
    if isinstance(obj, list) and obj and isinstance(obj[0], dict):
        return record_format(obj[0])
    return None


def record_format(first: Any) -> Format | None:
    """The format whose run is a sequence of records starting with ``first`` (None: none claims it)."""
    if not isinstance(first, dict):
        return None
    return next((fmt for fmt in formats() if fmt.recognises_record is not None and fmt.recognises_record(first)),
                None)


def companion(name: str) -> tuple[Format, Companion] | None:
    """The format and companion a file of this name is, beside run files (None: none names it)."""
    for fmt in formats():
        for found in fmt.companions:
            if fnmatch.fnmatchcase(name, found.pattern):
                return fmt, found
    return None


def walked_names() -> tuple[str, ...]:
    """The file names formats ask a directory walk to read, beyond kvjudge's run suffixes."""
    return tuple(dict.fromkeys(pattern for fmt in formats() for pattern in fmt.files))


def unknown_message() -> str:
    """The error for a document no format recognises."""
    return f"is none of the formats kvjudge reads ({', '.join(fmt.name for fmt in formats())}); name one with --format"


def help_text() -> str:
    """``--format``'s help: every choice with its one line."""
    return "format of every document (default: auto, detected per document): " + "; ".join(
        f"{fmt.name}: {fmt.summary.replace('`', '')}" for fmt in formats())


def docs_section() -> str:
    """The formats list of ``docs/ingest.md`` (between its ``formats:begin``/``formats:end`` markers)."""
    lines = []
    for fmt in formats():
        line = f"- `{fmt.name}` — {fmt.summary}"
        if fmt.files:
            line += "; a walk reads " + ", ".join(f"`{pattern}`" for pattern in fmt.files)
        if fmt.companions:
            line += "; beside its files: " + ", ".join(
                f"`{c.pattern}` ({c.holds}{'' if c.read else ', passed over'})" for c in fmt.companions)
        lines.append(line + ".")
    return "\n".join(lines)
