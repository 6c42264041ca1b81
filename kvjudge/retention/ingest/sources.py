"""Where runs come from: files and directories (walked in name order), ``.gz`` read transparently, and the JSON
documents in each file — one per line in JSONL, else the whole file — decoded lazily, one at a time.

Two harness layouts are sources of their own: a Harbor trial (``result.json`` beside ``agent/``: the result and
the ATIF trajectory with its continuations, read as one document; a trial not finished has its ``config.json`` in
place of the result) and an inspect eval log (``*.eval``, and a
``.json`` file that begins as inspect's logs do: one document per sample, read one at a time).

OpenHands layouts: ``llm_completions/<instance_id>/<model>-<unix time>.json`` is one file per model call, and
the calls of one instance folder are one run: the last call is the source, the earlier ones its
:attr:`Source.series`. A directory walk passes over OpenHands' side files (evaluation output
``*.swebench_eval.jsonl`` — results, for ``--results`` —, ``*.swebench.jsonl`` predictions,
``*.critic_attempt_N.jsonl`` attempts, ``maximum_retries_exceeded.jsonl``) and over an ``llm_completions``
folder beside an ``output.jsonl`` (the same runs; output.jsonl is the fuller record): name them to read them.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import gzip
import json
import os
import re
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from kvjudge.errors import IngestError
from kvjudge.retention.ingest import harbor, inspect_reader, json_stream, registry, yaml_document

#: Names a directory walk picks up (each also with ``.gz``); a file named on the command line is read whatever
#: its name. Beside them a walk reads Harbor trials, inspect ``*.eval`` archives and inspect ``.json`` logs.
RUN_SUFFIXES = (".jsonl", ".traj.json", ".traj")
_WHOLE_SUFFIXES = (".traj.json", ".traj", ".json", *yaml_document.SUFFIXES)  # one document per file
_READ_ERRORS = (OSError, EOFError, zlib.error)
#: Source kinds: a plain file, a Harbor trial (a trial directory, or an ATIF trajectory with its continuations),
#: an inspect ``.eval`` archive.
FILE, HARBOR, EVAL, EVENTS = "file", "harbor", "eval", "events"
#: An OpenHands V1 conversation persisted event by event: ``<conversation>/events/event-<n>-<id>.json``.
_EVENTS_DIR = "events"
_EVENT_FILE = re.compile(r"^event-(\d+)(?:-[^/]*)?\.json$")
#: OpenHands' files beside its output.jsonl that hold no runs (a directory walk passes over them).
_SIDE_FILES = re.compile(r"(\.swebench_eval\.jsonl|\.swebench\.jsonl|\.critic_attempt_\d+\.jsonl"
                         r"|^maximum_retries_exceeded\.jsonl)(\.gz)?$")
_COMPLETIONS_DIR = "llm_completions"
_COMPLETION_NAME = re.compile(r"^.+-(\d+(?:\.\d+)?)\.json$")


@dataclass(frozen=True)
class Source:
    """One file to import."""

    path: Path
    size: int  # bytes on disk (of every file read: a Harbor trial's, the series' files included)
    kind: str = FILE
    #: Earlier files of the same run, oldest first, read with it (OpenHands: the earlier model calls of one
    #: instance, whose usage the run's assistant turns carry).
    series: tuple[Path, ...] = ()
    #: The files a Harbor source is read from, found once by the walk: a trial's ``result.json`` (or
    #: ``config.json``) and ``agent/trajectory*.json``, or an ATIF trajectory and its continuations.
    parts: tuple[Path, ...] = ()
    #: The companion files beside it (a run directory's predictions, an evaluation's metadata), for its parser.
    companions: tuple[Path, ...] = ()
    within: str | None = None  # its path under what was pointed at (a file named: its name), for :mod:`.trials`

    @property
    def name(self) -> str:
        """The file name without ``.gz``."""
        name = self.path.name
        return name[:-3] if name.endswith(".gz") else name

    @property
    def default_instance(self) -> str | None:
        """The instance id a trajectory's file name gives (``<instance>.traj.json``, ``<instance>.traj``)."""
        for suffix in (".traj.json", ".traj", ".demo.yaml"):
            if self.name.endswith(suffix) and len(self.name) > len(suffix):
                return self.name[: -len(suffix)]
        return None


@dataclass
class Walk:
    """What the directory walks found: the sources, and the files beside them — companions (read for their runs,
    or passed over as settings) and files no format reads — counted and named for the report."""

    sources: list[Source] = field(default_factory=list)
    ignored: int = 0  # files read neither as runs nor as companions
    companions_used: list[str] = field(default_factory=list)
    companions_passed: list[str] = field(default_factory=list)
    side: list[str] = field(default_factory=list)  # OpenHands' side files (results, predictions, attempts)
    others: list[str] = field(default_factory=list)  # the files no format reads (the first few named in a note)

    def notes(self) -> list[str]:
        """One line per kind of file passed over or read beside the runs."""
        notes = []
        for files, what in ((self.companions_used, "read beside the runs (companions)"),
                            (self.companions_passed, "passed over (the harness's settings, not runs)"),
                            (self.side, "passed over (OpenHands' evaluation results — give them with --results —, "
                                        "predictions and attempts: not the runs)"),
                            (self.others, "passed over (no format kvjudge reads)")):
            if files:
                named = ", ".join(files[:_NAMED]) + (f" and {len(files) - _NAMED} more" if len(files) > _NAMED else "")
                notes.append(f"{len(files)} file(s) {what}: {named}")
        return notes


_NAMED = 5


def collect_sources(paths: Iterable[str | os.PathLike[str]]) -> tuple[list[Source], int]:
    """The files to import, in a stable order, and how many other files the directory walks passed over (see
    :func:`walk`)."""
    found = walk(paths)
    return found.sources, found.ignored


def walk(paths: Iterable[str | os.PathLike[str]]) -> Walk:
    """The files to import, in a stable order, with the files beside them.

    A directory is walked recursively for run files (``*.jsonl``, ``*.traj.json``, ``*.traj``, each optionally
    ``.gz``; ``*.eval``; inspect ``.json`` logs; ATIF ``[<stem>.]trajectory[.…].json`` files, by how they open;
    the names each format adds) and Harbor trials (``result.json`` beside ``agent/``: one source, its other files
    passed over; a trial not finished — ``config.json`` beside ``agent/``, no ``result.json`` — is read from its
    config and trajectory when that is ATIF, else passed over whole). A format's companion files (SWE-agent's
    ``all_preds.jsonl``, OpenHands' ``metadata.json``) in a folder that holds its run files, or above them, go
    with the runs under that folder. A file named directly is always read (an ATIF trajectory with its trial, or
    with its continuations and subagents). A path named twice is read once.
    """
    found = Walk()
    seen: set[Path] = set()
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            first = len(found.sources)
            count = 0
            inherited: dict[Path, tuple[Path, ...]] = {}
            for root, dirs, files in os.walk(path):
                here = Path(root)
                if harbor.is_trial_dir(here) or harbor.is_unfinished_trial_dir(here):
                    dirs.clear()  # a trial is read as one source; nothing under it is a run file of its own
                    trial = _trial(here) if harbor.is_read_trial(here) else None
                    count += _add(found.sources, seen, trial) if trial is not None else 0
                    found.ignored += _files_under(here) - (len(trial.parts) if trial is not None else 0)
                    continue
                dirs.sort()
                if _COMPLETIONS_DIR in dirs and any(name in files for name in ("output.jsonl", "output.jsonl.gz")):
                    dirs.remove(_COMPLETIONS_DIR)  # the same runs as output.jsonl: passed over
                    found.ignored += sum(len(names) for _, _, names in os.walk(Path(root) / _COMPLETIONS_DIR))
                count += _walk_folder(found, seen, here, sorted(files), inherited)
            found.sources[first:] = [_within(source, path) for source in found.sources[first:]]
            if count == 0 and not any(s.path.is_relative_to(path) for s in found.sources):
                raise IngestError(f"{path}: no run files in this directory (looked for "
                                  f"{', '.join('*' + s for s in RUN_SUFFIXES)}, optionally .gz, *.eval, inspect "
                                  f"logs, ATIF trajectories, Harbor trials, OpenHands "
                                  f"{_COMPLETIONS_DIR}/<instance_id>/*.json and "
                                  f"{', '.join(registry.walked_names())})")
        elif path.is_file():
            _add(found.sources, seen, _within(_with_companions(_file(path), _companions_beside(path)), path.parent))
        else:
            raise IngestError(f"{path} does not exist; pass run files (JSONL, *.traj.json, *.traj) or directories")
    if not found.sources:
        raise IngestError("nothing to import; pass run files or directories")
    found.sources = _series(found.sources)
    return found


def _walk_folder(found: Walk, seen: set[Path], here: Path, files: list[str],
                 inherited: dict[Path, tuple[Path, ...]]) -> int:
    """One folder of a walk: its run files become sources (with the companions here and above), its companions
    are kept for them, the rest counted. Returns how many sources it added."""
    runs = []
    companions: list[Path] = list(inherited.get(here.parent, ()))
    events = _events_source(here, files, companions + _companions_beside(here))
    if events is not None:  # one run: the conversation's events, one per file
        found.ignored += len(files) - len(events.parts)
        return _add(found.sources, seen, events)
    added = 0
    for name in files:
        known = registry.companion(_base(name))
        if known is not None and _holds_runs_of(here, known[0]):
            companions.append(here / name)
            (found.companions_used if known[1].read else found.companions_passed).append(str(here / name))
        elif _is_walked_run(here, name):
            runs.append(name)
        else:
            found.ignored += 1
            (found.side if _SIDE_FILES.search(name) else found.others).append(str(here / name))
    inherited[here] = tuple(companions)
    for name in runs:
        added += _add(found.sources, seen, _with_companions(_file(here / name), companions))
    return added


def _events_source(folder: Path, files: list[str], companions: list[Path]) -> Source | None:
    """An OpenHands V1 conversation persisted event by event (``event-<n>-<id>.json`` files) as one source, its
    events in order: an ``events/`` folder, or a folder of event files and companions only (the CLI's)."""
    beside = [folder / name for name in files if not _EVENT_FILE.match(name)]
    if folder.name != _EVENTS_DIR and (len(beside) == len(files) or any(registry.companion(p.name) is None
                                                                         for p in beside)):
        return None
    companions = [*companions, *(path for path in beside if registry.companion(path.name) is not None)]
    parts = sorted((folder / name for name in files if _EVENT_FILE.match(name)),
                   key=lambda path: (int(_EVENT_FILE.match(path.name).group(1)), path.name))  # type: ignore[union-attr]
    if not parts:
        return None
    return Source(path=folder, size=sum(p.stat().st_size for p in parts), kind=EVENTS, parts=tuple(parts),
                  companions=tuple(dict.fromkeys(companions)))


def _is_walked_run(here: Path, name: str) -> bool:
    return _is_run_file(name) or is_completions_log(here / name) \
        or (harbor.is_trajectory_name(name) and harbor.is_atif_file(here / name)) \
        or (name.endswith(".json") and (inspect_reader.is_json_log(here / name)
                                        or registry.record_format(json_stream.first_item(here / name)) is not None)) \
        or (name.endswith(yaml_document.SUFFIXES) and yaml_document.holds_history(here / name))


def _holds_runs_of(folder: Path, fmt: Any) -> bool:
    """Whether ``folder`` (or a folder under it) holds a file named as ``fmt``'s run files are."""
    patterns = (*fmt.files, *fmt.marks)
    if not patterns:
        return False
    for _, _, files in os.walk(folder):
        if any(fnmatch.fnmatchcase(_base(name), pattern) for name in files for pattern in patterns):
            return True
    return False


def _companions_beside(path: Path) -> list[Path]:
    """The companions of a file named directly: those beside it, and one folder up those of its format (by its
    name: a SWE-agent 1.x run keeps ``preds.json`` above its instances' folders). Each parser reads only its own."""
    found = []
    for folder in (path.parent, path.parent.parent):
        try:
            names = sorted(os.listdir(folder))
        except OSError:
            continue
        for name in names:
            known = registry.companion(_base(name))
            if known is None or not (folder / name).is_file():
                continue
            if folder == path.parent or any(fnmatch.fnmatchcase(_base(path.name), p) for p in known[0].files):
                found.append(folder / name)
    return found


def _with_companions(source: Source, companions: Iterable[Path]) -> Source:
    companions = tuple(companions)
    return dataclasses.replace(source, companions=companions) if companions else source


def _within(source: Source, root: Path) -> Source:
    """``source`` with its path within ``root`` (what was pointed at) recorded."""
    within = source.path.relative_to(root).as_posix() if source.path.is_relative_to(root) else None
    return dataclasses.replace(source, within=within if within != "." else source.path.name) if within else source


def _base(name: str) -> str:
    return name[:-3] if name.endswith(".gz") else name


def _is_run_file(name: str) -> bool:
    base = _base(name)
    return ((base.endswith(RUN_SUFFIXES) or any(fnmatch.fnmatchcase(base, p) for p in registry.walked_names()))
            and not _SIDE_FILES.search(name)) or name.endswith(inspect_reader.EVAL_SUFFIX)


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
                              series=tuple(s.path for s in ordered[:-1]), within=ordered[-1].within))
    return out


def _call_time(path: Path) -> float:
    found = _COMPLETION_NAME.match(path.name)
    return float(found.group(1)) if found else 0.0


def _file(path: Path) -> Source:
    """A file as a source: an ATIF trajectory becomes its trial (or its group of continuations)."""
    if harbor.is_trajectory_name(path.name):
        trial = path.parent.parent
        in_trial = harbor.is_trial_dir(trial) or harbor.is_unfinished_trial_dir(trial)
        if path.parent.name == harbor.AGENT_DIR and in_trial:
            return _trial(trial)
        stem = harbor.trajectory_stem(path.name)
        main = path.parent / f"{stem}trajectory.json"
        parts = harbor.trajectory_files(path.parent, stem) if main.is_file() else [path]
        return Source(path=parts[0], size=sum(p.stat().st_size for p in parts), kind=HARBOR, parts=tuple(parts))
    kind = EVAL if path.name.endswith(inspect_reader.EVAL_SUFFIX) else FILE
    return Source(path=path, size=path.stat().st_size, kind=kind)


def _trial(folder: Path) -> Source:
    parts = harbor.trial_parts(folder)
    return Source(path=folder, size=sum(p.stat().st_size for p in parts), kind=HARBOR, parts=tuple(parts))


def _files_under(folder: Path) -> int:
    return sum(len(files) for _, _, files in os.walk(folder))


def _add(sources: list[Source], seen: set[Path], source: Source) -> int:
    key = source.path.resolve()
    if key in seen:
        return 0
    seen.add(key)
    sources.append(source)
    return 1


def harbor_parts(source: Source) -> dict[str, bytes]:
    """The files of a Harbor source (:attr:`Source.parts`, as the walk found them), by name: ``result.json`` and
    ``agent/trajectory*.json`` of a trial, or an ATIF trajectory and its continuations."""
    if source.path.is_dir():
        head, *trajectories = source.parts
        parts = {head.name: head.read_bytes()}
        parts.update({f"{harbor.AGENT_DIR}/{p.name}": p.read_bytes() for p in trajectories})
        return parts
    return {p.name: p.read_bytes() for p in source.parts}


@dataclass
class Document:
    """One JSON document of a source: its raw bytes, decoded on first use."""

    source: Source
    line: int | None  # 1-based line in a JSONL file; None for a whole-file document
    raw: bytes
    member: str | None = None  # the archive member or log position this document is (``samples/1_epoch_1.json``)
    #: A document of several parts (a Harbor trial's files; an eval's spec and one sample), decoded into one
    #: object: part name → its raw JSON bytes, or a value already decoded.
    parts: dict[str, Any] | None = None
    #: A session file whose every line is one record of one run (Claude Code, Codex CLI): decoded into the list
    #: of its lines' values, a line that is not JSON refusing the whole file.
    records: bool = False

    @property
    def where(self) -> str:
        where = f"{self.source.path}:{self.line}" if self.line is not None else str(self.source.path)
        return f"{where}:{self.member}" if self.member is not None else where

    @property
    def text(self) -> str:
        """The document as text; bytes that are not UTF-8 become lone surrogates (``surrogateescape``)."""
        raw = self.raw if self.parts is None else b"".join(p for p in self.parts.values() if isinstance(p, bytes))
        return raw.decode("utf-8", "surrogateescape")

    def decode(self, *, repair_text: bool = False) -> Any:
        """The decoded JSON value; IngestError (naming the file and line) when it is not UTF-8 JSON.

        With ``repair_text``, bytes that are not UTF-8 pass as lone surrogates, for
        :func:`~kvjudge.retention.text_check.parse_checked` to store as U+FFFD.
        """
        if self.records and self.parts is not None:
            return [decode_json(part, f"{self.source.path}/{name}", repair_text=repair_text)
                    for name, part in self.parts.items()]
        if self.records:
            return [decode_json(line, f"{self.source.path}:{number}", line=number, repair_text=repair_text)
                    for number, line in enumerate(self.raw.split(b"\n"), start=1) if line.strip()]
        if self.parts is None and self.source.name.endswith(yaml_document.SUFFIXES):
            return yaml_document.decode(self.raw, self.where)
        if self.parts is None:
            return decode_json(self.raw, self.where, line=self.line, repair_text=repair_text)
        return {name: decode_json(part, self.where if self.member else f"{self.where}:{name}",
                                  repair_text=repair_text) if isinstance(part, bytes) else part
                for name, part in self.parts.items()}


    def companions(self) -> Iterator[Any]:
        """The decoded documents of the source's series (earlier files of the same run), one at a time;
        IngestError naming the file when one is not JSON."""
        for path in self.source.series:
            try:
                raw = path.read_bytes()
            except OSError as exc:
                raise IngestError(f"{path}: cannot be read ({_reason(exc)}); is it a complete file?") from None
            yield Document(Source(path=path, size=len(raw)), None, raw).decode()


def decode_json(raw: bytes, where: str, *, line: int | None = None, repair_text: bool = False) -> Any:
    """``raw`` decoded as UTF-8 JSON; IngestError naming ``where`` (and the column, or line and column)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        if not repair_text:
            raise IngestError(f"{where}: not UTF-8 ({exc.reason} at byte {exc.start}; inside a string, "
                              f"--repair-text stores U+FFFD in its place)") from None
        text = raw.decode("utf-8", "surrogateescape")
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        at = f"column {exc.colno}" if line is not None else f"line {exc.lineno} column {exc.colno}"
        raise IngestError(f"{where}: not valid JSON ({exc.msg} at {at})") from None
    except (ValueError, RecursionError) as exc:  # an integer of > 4300 digits; nesting ~1000 deep
        raise IngestError(f"{where}: not valid JSON for kvjudge ({str(exc).split(';')[0]})") from None


def iter_documents(source: Source, *, records: bool = False) -> Iterator[Document]:
    """The documents of ``source`` in order, read as a stream (JSONL line by line; a log sample by sample).
    ``records``: a JSONL file is one document of records (``--format`` named a session format)."""
    try:
        if source.kind == HARBOR:
            yield Document(source, None, b"", parts=harbor_parts(source))
            return
        if source.kind == EVENTS:  # the events in order, decoded into the list a saved trajectory is
            yield Document(source, None, b"", parts={path.name: path.read_bytes() for path in source.parts},
                           records=True)
            return
        if source.kind == EVAL:
            for member, parts in inspect_reader.eval_samples(source.path):
                yield Document(source, None, b"", member=member, parts=parts)
            return
        sniffed = source.path.suffix == ".json"  # an inspect log (streamed) or one document, by its first bytes
        whole = sniffed or _whole_file(source)
        with _open(source) as handle:
            if whole:
                head = handle.read(inspect_reader.HEAD_BYTES) if sniffed else b""
                if sniffed and inspect_reader.is_json_log_head(head):
                    handle.seek(0)
                    for where, parts in inspect_reader.json_log_samples(source.path, handle):
                        yield Document(source, None, b"", member=where, parts=parts)
                    return
                yield Document(source, None, head + handle.read())
                return
            first = b""
            for number, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                if not first:
                    first = line
                    if records or _is_session(first):  # one run in every line: the file is one document
                        yield Document(source, None, first + handle.read(), records=True)
                        return
                yield Document(source, number, line)
    except _READ_ERRORS as exc:
        raise IngestError(f"{source.path}: cannot be read ({_reason(exc)}); is it a complete file?") from None


def _is_session(first_line: bytes) -> bool:
    """Whether a JSONL file whose first line is ``first_line`` is a session: one run, a record per line (the sniff:
    one line decoded, asked of the formats whose runs are records)."""
    try:
        return registry.record_format(json.loads(first_line)) is not None
    except (ValueError, RecursionError):
        return False


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
