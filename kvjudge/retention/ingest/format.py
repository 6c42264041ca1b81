"""What a run format is to kvjudge: one :class:`Format` — its name, how to recognise its documents cheaply, how to
parse one, which files a directory walk reads for it and which companion files beside them it uses.

Each format module declares one ``FORMAT`` (or a few); :mod:`.registry` holds them in detection order, with the
formats other packages add through the ``kvjudge.formats`` entry-point group. The smallest format, as a lab
would write one in its own package::

    from kvjudge.retention.ingest.format import Format

    def parse(obj, context, document):
        run = context.new_run(f"lab-agent/{obj['task']}", "lab", agent="lab-agent", grading_open=True)
        run.start(task_id=obj["task"], prompt=obj["prompt"])
        run.step(run.branch("main"), "assistant", text=obj["answer"])
        return run

    FORMAT = Format(name="lab", summary="our lab's one-line runs", recognises=lambda obj: "lab_run" in obj,
                    parse=parse)

and in its ``pyproject.toml``: ``[project.entry-points."kvjudge.formats"] lab = "lab_runs:FORMAT"``.
"""

from __future__ import annotations

import fnmatch
import functools
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvjudge.errors import IngestError
from kvjudge.retention.ingest.model import ParseContext, ParsedRun

#: ``parse(obj, context, document)``: one decoded document → ParsedRun; DocumentError naming the JSON path.
Parse = Callable[[Any, ParseContext, Any], ParsedRun]


@dataclass(frozen=True)
class Companion:
    """A file a harness writes beside its run files: ``read`` turns it into what the format's parser uses
    (None: kvjudge passes over it, saying so in a note — it holds settings, not the run)."""

    pattern: str  # a file name, or a glob (``*.swebench.jsonl``)
    holds: str  # what it holds, for the note and the docs
    read: Callable[[Path], Any] | None = None


@dataclass(frozen=True)
class Format:
    """One run format.

    ``recognises(obj)`` is the cheap sniff on a decoded JSON object's top level (its keys, a field's kind), asked
    in registry order. ``recognises_record(first)``, for a format whose run is a sequence of records (a session
    JSONL whose every line is one event, or a JSON array of events), is asked of the first record: a JSONL file
    whose first line it claims is read as one document. ``files`` are the names a directory walk reads for the
    format beside ``*.jsonl``, ``*.json`` and trajectories; ``companions`` the files beside them it uses or
    passes over; ``marks`` other names that show a folder holds its runs. ``trial_label``: its files name no trial, so ``--trial`` labels them.
    """

    name: str
    summary: str
    parse: Parse
    recognises: Callable[[dict[str, Any]], bool] | None = None
    recognises_record: Callable[[dict[str, Any]], bool] | None = None
    files: tuple[str, ...] = ()
    companions: tuple[Companion, ...] = ()
    trial_label: bool = False
    #: Names beside ``files`` that show a folder holds the format's runs (its companions then go with them) though
    #: a walk does not read them one by one (OpenHands V1's ``event-<n>-<id>.json``: a folder of them is one run).
    marks: tuple[str, ...] = ()


def companion_data(document: Any, companion: Companion) -> Any:
    """What ``companion.read`` makes of the companion file beside the document's source (None: there is none).

    A companion is shared by every run file of its directory (SWE-agent's ``all_preds.jsonl``): it is read once per
    process, and read again only when the file changed."""
    for path in getattr(document.source, "companions", ()):
        if companion.read is not None and fnmatch.fnmatchcase(path.name, companion.pattern):
            try:
                stat = path.stat()
            except OSError as exc:
                raise IngestError(f"{path}: cannot be read ({exc.strerror or exc})") from None
            return _read_once(companion.read, path, stat.st_mtime_ns, stat.st_size)
    return None


@functools.lru_cache(maxsize=16)
def _read_once(read: Callable[[Path], Any], path: Path, mtime_ns: int, size: int) -> Any:
    return read(path)


def json_object_reader(what: str) -> Callable[[Path], dict[str, Any]]:
    """A companion reader for a file holding one JSON object (``what`` it is, for the error): the object, or an
    IngestError naming the file."""
    def read(path: Path) -> dict[str, Any]:
        try:
            data = json.loads(path.read_bytes())
        except (OSError, ValueError) as exc:
            raise IngestError(f"{path}: not readable JSON ({exc}); is it a complete {path.name}?") from None
        if not isinstance(data, dict):
            raise IngestError(f"{path}: must be a JSON object ({what})")
        return data

    return read
