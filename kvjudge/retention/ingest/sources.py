"""Where runs come from: files and directories (walked in name order), ``.gz`` read transparently, and the JSON
documents in each file — one per line in JSONL, else the whole file — decoded lazily, one at a time."""

from __future__ import annotations

import gzip
import json
import os
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from kvjudge.errors import IngestError

#: Names a directory walk picks up (each also with ``.gz``); a file named on the command line is read whatever
#: its name.
RUN_SUFFIXES = (".jsonl", ".traj.json", ".traj")
_WHOLE_SUFFIXES = (".traj.json", ".traj", ".json")  # one JSON document per file
_READ_ERRORS = (OSError, EOFError, zlib.error)


@dataclass(frozen=True)
class Source:
    """One file to import."""

    path: Path
    size: int  # bytes on disk

    @property
    def name(self) -> str:
        """The file name without ``.gz``."""
        name = self.path.name
        return name[:-3] if name.endswith(".gz") else name

    @property
    def default_instance(self) -> str | None:
        """The instance id a trajectory's file name gives (``<instance>.traj.json``, ``<instance>.traj``)."""
        for suffix in (".traj.json", ".traj"):
            if self.name.endswith(suffix) and len(self.name) > len(suffix):
                return self.name[: -len(suffix)]
        return None


def collect_sources(paths: Iterable[str | os.PathLike[str]]) -> tuple[list[Source], int]:
    """The files to import, in a stable order, and how many other files the directory walks passed over.

    A directory is walked recursively for run files (``*.jsonl``, ``*.traj.json``, ``*.traj``, each optionally
    ``.gz``); a file named directly is always read. A path named twice is read once.
    """
    sources: list[Source] = []
    seen: set[Path] = set()
    ignored = 0
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            found = 0
            for root, dirs, files in os.walk(path):
                dirs.sort()
                for name in sorted(files):
                    if _is_run_file(name):
                        found += _add(sources, seen, Path(root) / name)
                    else:
                        ignored += 1
            if found == 0 and not any(s.path.is_relative_to(path) for s in sources):
                raise IngestError(f"{path}: no run files in this directory (looked for "
                                  f"{', '.join('*' + s for s in RUN_SUFFIXES)}, optionally .gz)")
        elif path.is_file():
            _add(sources, seen, path)
        else:
            raise IngestError(f"{path} does not exist; pass run files (JSONL, *.traj.json, *.traj) or directories")
    if not sources:
        raise IngestError("nothing to import; pass run files or directories")
    return sources, ignored


def _is_run_file(name: str) -> bool:
    base = name[:-3] if name.endswith(".gz") else name
    return base.endswith(RUN_SUFFIXES)


def _add(sources: list[Source], seen: set[Path], path: Path) -> int:
    key = path.resolve()
    if key in seen:
        return 0
    seen.add(key)
    sources.append(Source(path=path, size=path.stat().st_size))
    return 1


@dataclass
class Document:
    """One JSON document of a source: its raw bytes, decoded on first use."""

    source: Source
    line: int | None  # 1-based line in a JSONL file; None for a whole-file document
    raw: bytes

    @property
    def where(self) -> str:
        return f"{self.source.path}:{self.line}" if self.line is not None else str(self.source.path)

    @property
    def text(self) -> str:
        """The document as text; bytes that are not UTF-8 become lone surrogates (``surrogateescape``)."""
        return self.raw.decode("utf-8", "surrogateescape")

    def decode(self, *, repair_text: bool = False) -> Any:
        """The decoded JSON value; IngestError (naming the file and line) when it is not UTF-8 JSON.

        With ``repair_text``, bytes that are not UTF-8 pass as lone surrogates, for
        :func:`~kvjudge.retention.text_check.parse_checked` to store as U+FFFD.
        """
        try:
            text = self.raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            if not repair_text:
                raise IngestError(f"{self.where}: not UTF-8 ({exc.reason} at byte {exc.start}; inside a string, "
                                  f"--repair-text stores U+FFFD in its place)") from None
            text = self.text
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            at = f"column {exc.colno}" if self.line is not None else f"line {exc.lineno} column {exc.colno}"
            raise IngestError(f"{self.where}: not valid JSON ({exc.msg} at {at})") from None
        except (ValueError, RecursionError) as exc:  # an integer of > 4300 digits; nesting ~1000 deep
            raise IngestError(f"{self.where}: not valid JSON for kvjudge ({str(exc).split(';')[0]})") from None


def iter_documents(source: Source) -> Iterator[Document]:
    """The documents of ``source`` in order, read as a stream (JSONL line by line)."""
    try:
        whole = _whole_file(source)
        with _open(source) as handle:
            if whole:
                yield Document(source, None, handle.read())
                return
            for number, line in enumerate(handle, start=1):
                if line.strip():
                    yield Document(source, number, line)
    except _READ_ERRORS as exc:
        raise IngestError(f"{source.path}: cannot be read ({_reason(exc)}); is it a complete file?") from None


def _open(source: Source) -> IO[bytes]:
    if source.path.name.endswith(".gz"):
        return gzip.open(source.path, "rb")
    return source.path.open("rb")


def _whole_file(source: Source) -> bool:
    """One document per file for trajectory and ``.json`` names; JSONL for ``.jsonl``; any other name is JSONL
    when its first non-blank line is a JSON value by itself (a pretty-printed document's first line is not)."""
    if source.name.endswith(".jsonl"):
        return False
    if source.name.endswith(_WHOLE_SUFFIXES):
        return True
    with _open(source) as handle:
        first = next((line for line in handle if line.strip()), b"")
    try:
        json.loads(first)
    except ValueError:
        return True
    return False


def _reason(exc: BaseException) -> str:
    if isinstance(exc, EOFError):
        return "the compressed stream ends early"
    return getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
