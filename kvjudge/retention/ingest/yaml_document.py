"""YAML run files (SWE-agent's ``*.demo.yaml`` demonstrations) decoded into the JSON values every parser reads.

PyYAML's safe loader builds plain values only (no object of any class). Two more guards, as for any file kvjudge
did not write: an alias (``*name``, a node used again) is refused — a few lines of nested aliases expand into
billions of values — and what YAML has beyond JSON becomes JSON (a date or time its ISO text, a key that is not a
string its text, binary data refused), so the untrusted-text check and the content hash see what they always see.
"""

from __future__ import annotations

import datetime
import re
from pathlib import Path
from typing import Any

import yaml

from kvjudge.errors import IngestError

SUFFIXES = (".yaml", ".yml")
HEAD_BYTES = 64 << 10
_HISTORY = re.compile(rb"^history:[ \t]*(?:#.*)?\r?$", re.MULTILINE)


def holds_history(path: Path) -> bool:
    """Whether a YAML file's top level holds a ``history:`` within its first :data:`HEAD_BYTES` — a run's messages,
    as SWE-agent's demonstrations (``*.demo.yaml``, ``*_demo.yaml``) do; a directory walk reads such files and
    passes over other YAML (settings)."""
    try:
        with path.open("rb") as handle:
            return _HISTORY.search(handle.read(HEAD_BYTES)) is not None
    except OSError:
        return False


class _NoAliases(yaml.SafeLoader):
    """The safe loader, refusing aliases."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            mark = self.peek_event().start_mark
            raise yaml.YAMLError(f"an alias (a node used again) at line {mark.line + 1}: kvjudge reads none")
        return super().compose_node(parent, index)


def decode(raw: bytes, where: str) -> Any:
    """``raw`` decoded as YAML into JSON values; IngestError naming ``where`` and what is wrong, in one line."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise IngestError(f"{where}: not UTF-8 ({exc.reason} at byte {exc.start})") from None
    try:
        return _as_json(yaml.load(text, Loader=_NoAliases))  # noqa: S506 (a safe loader)
    except (yaml.YAMLError, ValueError, RecursionError) as exc:
        reason = " ".join(str(exc).split())
        raise IngestError(f"{where}: not valid YAML for kvjudge ({reason[:200]})") from None


def _as_json(value: Any) -> Any:
    if isinstance(value, dict):
        return {key if isinstance(key, str) else str(_as_json(key)): _as_json(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_as_json(item) for item in value]
    if isinstance(value, set):  # !!set: its members in one order
        return sorted((_as_json(item) for item in value), key=repr)
    if isinstance(value, datetime.date | datetime.datetime | datetime.time):
        return value.isoformat()
    if isinstance(value, bytes):
        raise ValueError("binary data (!!binary) is not a run's text")
    return value
