"""Where runs come from: files and directories (walked in name order), ``.gz`` read transparently, and the JSON
documents in each file — one per line in JSONL, else the whole file — decoded lazily, one at a time.

OpenHands layouts: ``llm_completions/<instance_id>/<model>-<unix time>.json`` is one file per model call, and
the calls of one instance folder are one run: the last call is the source, the earlier ones its
:attr:`Source.series`. A directory walk passes over OpenHands' side files (evaluation output
``*.swebench_eval.jsonl`` — results, for ``--results`` —, ``*.swebench.jsonl`` predictions,
``*.critic_attempt_N.jsonl`` attempts, ``maximum_retries_exceeded.jsonl``) and over an ``llm_completions``
folder beside an ``output.jsonl`` (the same runs; output.jsonl is the fuller record): name them to read them.
"""

from __future__ import annotations

import gzip
import json
import os
import re
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
#: OpenHands' files beside its output.jsonl that hold no runs (a directory walk passes over them).
_SIDE_FILES = re.compile(r"(\.swebench_eval\.jsonl|\.swebench\.jsonl|\.critic_attempt_\d+\.jsonl"
                         r"|^maximum_retries_exceeded\.jsonl)(\.gz)?$")
_COMPLETIONS_DIR = "llm_completions"
_COMPLETION_NAME = re.compile(r"^.+-(\d+(?:\.\d+)?)\.json$")


@dataclass(frozen=True)
class Source:
    """One file to import."""

    path: Path
    size: int  # bytes on disk (the series' files included)
    #: Earlier files of the same run, oldest first, read with it (OpenHands: the earlier model calls of one
    #: instance, whose usage the run's assistant turns carry).
    series: tuple[Path, ...] = ()

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
                if _COMPLETIONS_DIR in dirs and any(name in files for name in ("output.jsonl", "output.jsonl.gz")):
                    dirs.remove(_COMPLETIONS_DIR)  # the same runs as output.jsonl: passed over
                    ignored += sum(len(names) for _, _, names in os.walk(Path(root) / _COMPLETIONS_DIR))
                for name in sorted(files):
                    if _is_run_file(name) or is_completions_log(Path(root) / name):
                        found += _add(sources, seen, Path(root) / name)
                    else:
                        ignored += 1
            if found == 0 and not any(s.path.is_relative_to(path) for s in sources):
                raise IngestError(f"{path}: no run files in this directory (looked for "
                                  f"{', '.join('*' + s for s in RUN_SUFFIXES)}, optionally .gz, and OpenHands "
                                  f"{_COMPLETIONS_DIR}/<instance_id>/*.json)")
        elif path.is_file():
            _add(sources, seen, path)
        else:
            raise IngestError(f"{path} does not exist; pass run files (JSONL, *.traj.json, *.traj) or directories")
    if not sources:
        raise IngestError("nothing to import; pass run files or directories")
    return _series(sources), ignored


def _is_run_file(name: str) -> bool:
    base = name[:-3] if name.endswith(".gz") else name
    return base.endswith(RUN_SUFFIXES) and not _SIDE_FILES.search(name)


def is_completions_log(path: Path) -> bool:
    """An OpenHands completions log: ``llm_completions/<instance_id>/<model>-<unix time>.json``."""
    return path.parent.parent.name == _COMPLETIONS_DIR and _COMPLETION_NAME.match(path.name) is not None


def _series(sources: list[Source]) -> list[Source]:
    """Completions logs of one instance folder → one source: the last call, the earlier ones its series."""
    calls: dict[Path, list[Source]] = {}
    for source in sources:
        if is_completions_log(source.path):
            calls.setdefault(source.path.parent, []).append(source)
    if not calls:
        return sources
    out = []
    for source in sources:
        group = calls.get(source.path.parent) if is_completions_log(source.path) else None
        if group is None:
            out.append(source)
        elif group[0] is source:  # the group takes the place of its first file
            ordered = sorted(group, key=lambda s: (_call_time(s.path), s.path.name))
            out.append(Source(path=ordered[-1].path, size=sum(s.size for s in group),
                              series=tuple(s.path for s in ordered[:-1])))
    return out


def _call_time(path: Path) -> float:
    found = _COMPLETION_NAME.match(path.name)
    return float(found.group(1)) if found else 0.0


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

    def companions(self) -> Iterator[Any]:
        """The decoded documents of the source's series (earlier files of the same run), one at a time;
        IngestError naming the file when one is not JSON."""
        for path in self.source.series:
            try:
                raw = path.read_bytes()
            except OSError as exc:
                raise IngestError(f"{path}: cannot be read ({_reason(exc)}); is it a complete file?") from None
            yield Document(Source(path=path, size=len(raw)), None, raw).decode()


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
