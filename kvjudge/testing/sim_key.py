"""The simulated judge's answer key: which run is which, its held-out grade, and the lines that must be visible
to judge it (:mod:`kvjudge.testing.sim_judge` serves a judge that reads it).

**The answer key** (JSON, written by whoever wrote the runs; :func:`write_key`, :func:`key_entry`)::

    {"runs": [
      {"run": "agent-a/task-7",                           # optional: a label for diagnostics only
       "marker": "index 3f9a2b1..8c0d4e2 100644",         # a line of the run's text no other run has
       "grade": 1.0,                                      # the held-out grade (higher is better)
       "evidence": ["-    return field",                  # lines that must be visible to judge the run:
                    "+    return quote(field, sep)",      # its final patch's changed lines and
                    "==== 43 passed in 1.87s ===="]}]}    # its last test outcome line

Lines are compared whole, with surrounding whitespace stripped (a view may indent them), after the escaping the
judge applies to run text (runs of ``<`` or ``>``); a line cut in the middle by an elision is not visible. Markers
must be unique in the key; a line that is only ``+`` or ``-`` (a blank line added or removed) says nothing and is
left out of the evidence by :func:`changed_lines`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvjudge.errors import UsageError
from kvjudge.judge.render import escape

_KEY_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["runs"],
    "properties": {
        "runs": {"type": "array", "items": {
            "type": "object",
            "required": ["marker", "grade", "evidence"],
            "additionalProperties": False,
            "properties": {
                "run": {"type": ["string", "null"]},
                "marker": {"type": "string", "pattern": r"\S"},
                "grade": {"type": "number"},
                "quality": {"type": ["number", "null"], "minimum": 0, "maximum": 1},
                "evidence": {"type": "array", "items": {"type": "string"}},
            }}},
    },
}


@dataclass(frozen=True)
class KeyEntry:
    """One run in the answer key: how to recognise its view, its held-out grade, and what must be visible."""

    marker: str
    grade: float
    evidence: tuple[str, ...]
    run: str | None = None
    quality: float | None = None  # the latent quality the scale mode centres on (None: the grade, clipped)

    def to_json(self) -> dict[str, Any]:
        entry = {"run": self.run, "marker": self.marker, "grade": self.grade, "evidence": list(self.evidence)}
        return entry if self.quality is None else {**entry, "quality": self.quality}

    @property
    def latent(self) -> float:
        return self.quality if self.quality is not None else min(1.0, max(0.0, self.grade))


def changed_lines(patch: str) -> list[str]:
    """The changed lines of a unified diff (``+`` / ``-`` lines, not the ``+++`` / ``---`` file headers, not
    a blank line added or removed), in order."""
    lines = []
    for line in patch.splitlines():
        if line.startswith(("+++ ", "--- ")) or not line.startswith(("+", "-")) or not line[1:].strip():
            continue
        lines.append(line)
    return lines


def key_entry(*, marker: str, grade: float, patch: str, outcome: str, run: str | None = None) -> KeyEntry:
    """The key entry of a run whose decisive evidence is its final patch's changed lines and its last test
    outcome line."""
    return KeyEntry(marker=marker, grade=float(grade), evidence=(*changed_lines(patch), outcome), run=run)


def write_key(path: str | Path, entries: Iterable[KeyEntry]) -> Path:
    """Write an answer key (checked the way :func:`load_key` reads it)."""
    path = Path(path)
    payload = {"runs": [entry.to_json() for entry in entries]}
    AnswerKey.from_json(payload, str(path))  # refuse a key the server would refuse
    path.write_text(json.dumps(payload, indent=1) + "\n", encoding="utf-8")
    return path


def compared_line(text: str) -> str:
    """A line as it is compared: escaped as the judge escapes run text, surrounding whitespace stripped."""
    return escape(text).strip()


class AnswerKey:
    """The runs the server knows, by marker line."""

    def __init__(self, entries: Sequence[KeyEntry]) -> None:
        self.entries = tuple(entries)
        self.by_marker: dict[str, KeyEntry] = {}
        self.evidence: dict[str, frozenset[str]] = {}
        for entry in self.entries:
            marker = compared_line(entry.marker)
            self.by_marker[marker] = entry
            self.evidence[marker] = frozenset(line for text in entry.evidence if (line := compared_line(text)))

    @classmethod
    def from_json(cls, payload: Any, source: str = "the answer key") -> AnswerKey:
        """Checked: a one-line error names the file and the JSON path of the first problem."""
        import jsonschema

        error = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(_KEY_SCHEMA).iter_errors(payload))
        if error is not None:
            where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path) or "(top)"
            raise UsageError(f"{source}: {where.lstrip('.')}: {error.message}; see kvjudge/testing/sim_key.py "
                             f"for the key format")
        entries = [KeyEntry(marker=item["marker"], grade=float(item["grade"]), evidence=tuple(item["evidence"]),
                            run=item.get("run"), quality=item.get("quality")) for item in payload["runs"]]
        seen: dict[str, int] = {}
        for index, entry in enumerate(entries):
            marker = compared_line(entry.marker)
            if marker in seen:
                raise UsageError(f"{source}: runs[{index}].marker: the same marker as runs[{seen[marker]}] "
                                 f"({marker[:60]!r}); each run needs a line no other run has")
            seen[marker] = index
        return cls(entries)

    @classmethod
    def load(cls, path: str | Path) -> AnswerKey:
        path = Path(path)
        try:
            payload = json.loads(path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise UsageError(f"cannot read the answer key {path}: {exc.strerror or exc}") from exc
        except ValueError as exc:
            raise UsageError(f"{path}: not JSON ({exc}); see kvjudge/testing/sim_key.py for the key format") from exc
        return cls.from_json(payload, str(path))

    def digest(self) -> str:
        """A short hash of what the key says (part of the default model name: another key, another judge)."""
        text = json.dumps([e.to_json() for e in self.entries], sort_keys=True)
        return hashlib.sha256(text.encode("utf-8")).hexdigest()[:8]

    def identify(self, lines: frozenset[str]) -> KeyEntry | None:
        """The one run whose marker is among ``lines`` (None for none, or for several)."""
        found = [self.by_marker[line] for line in lines if line in self.by_marker]
        return found[0] if len(found) == 1 else None

    def visible_share(self, entry: KeyEntry, lines: frozenset[str]) -> float:
        """The share of ``entry``'s evidence lines among ``lines`` (1.0 when it has none)."""
        evidence = self.evidence[compared_line(entry.marker)]
        return len(evidence & lines) / len(evidence) if evidence else 1.0


__all__ = ["AnswerKey", "KeyEntry", "changed_lines", "key_entry", "write_key"]
