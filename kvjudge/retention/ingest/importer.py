"""One import: check every document first, then write the runs in batches.

- **Check** (nothing written): every file is read and every document parsed; held-out grades from
  ``--results`` are joined; each run's content hash is compared with the store and the rest of the import. A
  malformed document, or a run id already stored (or imported earlier in this batch) with other content, stops
  the import with one line naming the file, the line and the JSON path — or, with ``skip_bad``, drops that
  file and lists it at the end.
- **Write**: the files are read again, one document at a time (memory stays bounded by the largest document),
  and the runs are committed in batches of :data:`BATCH_RUNS` runs or :data:`BATCH_BYTES` of bodies. A run
  already stored with the same content is counted as already present and left alone, so the same command run
  again after a kill finishes the import, and a third time writes nothing.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kvjudge.errors import IngestError
from kvjudge.retention import events as ev
from kvjudge.retention.ingest.harbor import is_harbor, parse_harbor
from kvjudge.retention.ingest.inspect_log import is_inspect_sample, parse_inspect_sample
from kvjudge.retention.ingest.mini_swe_agent import is_mini_swe_agent, parse_mini_swe_agent
from kvjudge.retention.ingest.model import DocumentError, ParseContext, ParsedRun, settle_events
from kvjudge.retention.ingest.native import parse_native
from kvjudge.retention.ingest.openai import parse_openai
from kvjudge.retention.ingest.openhands import is_openhands, parse_openhands
from kvjudge.retention.ingest.results import ResultsIndex, load_results
from kvjudge.retention.ingest.sources import Document, Source, collect_sources, iter_documents
from kvjudge.retention.ingest.swe_agent import is_swe_agent, parse_swe_agent
from kvjudge.retention.text_check import TextError, parse_checked

if TYPE_CHECKING:
    from kvjudge.retention.store import Store

FORMATS = ("auto", "native", "openai", "mini-swe-agent", "swe-agent", "openhands", "harbor", "inspect")
BATCH_RUNS = 64
BATCH_BYTES = 8 << 20

#: ``progress(files_done, description)`` — the CLI's progress bar advance: each file counts twice (checked,
#: then written); the description says files, MB and runs.
Progress = Callable[[int, str], None]


def detect_format(obj: Any) -> str | None:
    """The format of one decoded document, or None when it is none of them."""
    if not isinstance(obj, dict):
        return None
    if is_mini_swe_agent(obj):
        return "mini-swe-agent"
    if is_swe_agent(obj):
        return "swe-agent"
    if is_openhands(obj):
        return "openhands"
    if is_harbor(obj):
        return "harbor"
    if is_inspect_sample(obj):
        return "inspect"
    if "branches" in obj or ("id" in obj and "messages" not in obj):
        return "native"
    if "messages" in obj:
        return "openai"
    return None


def parse_document(document: Document, fmt: str, context: ParseContext) -> ParsedRun:
    """One document → ParsedRun in ``fmt`` (``auto``: detected); IngestError naming the file, line and JSON path.

    Its text is checked first (:func:`~kvjudge.retention.text_check.parse_checked`): text that is not Unicode
    is refused, or with ``context.repair_text`` stored as U+FFFD and noted by a TextRepaired event.
    """
    obj = document.decode(repair_text=context.repair_text)
    chosen = detect_format(obj) if fmt == "auto" else fmt
    suffix = f" ({chosen} format)" if chosen else ""
    try:
        return parse_checked(obj, lambda checked: _parse_as(chosen, checked, context, document),
                             repair_text=context.repair_text)
    except DocumentError as exc:
        raise IngestError(f"{document.where}: {exc.path}: {exc.message}{suffix}") from None
    except TextError as exc:
        raise IngestError(f"{document.where}: {exc}{suffix}") from None


def _parse_as(fmt: str | None, obj: Any, context: ParseContext, document: Document) -> ParsedRun:
    if fmt is None:
        raise DocumentError("$", "is none of the formats kvjudge reads (native, openai, mini-swe-agent, swe-agent, "
                                 "openhands, harbor, inspect); name one with --format")
    if fmt == "native":
        return parse_native(obj, context)
    if fmt == "openai":
        return parse_openai(obj, context, document.text)
    if fmt == "mini-swe-agent":
        return parse_mini_swe_agent(obj, context)
    if fmt == "openhands":
        return parse_openhands(obj, context, document)
    if fmt == "harbor":
        return parse_harbor(obj, context)
    if fmt == "inspect":
        return parse_inspect_sample(obj, context)
    return parse_swe_agent(obj, context)


@dataclass
class IngestReport:
    """What an import did. ``runs``: every run id of the input, in order (imported now or already present)."""

    store: str
    files: int = 0
    bytes: int = 0
    ignored_files: int = 0
    runs: list[str] = field(default_factory=list)
    imported: list[str] = field(default_factory=list)
    already_present: list[str] = field(default_factory=list)
    skipped: list[dict[str, str]] = field(default_factory=list)  # {"path", "error"}
    states: Counter[str] = field(default_factory=Counter)  # lifecycle state of the imported runs
    results: list[dict[str, Any]] = field(default_factory=list)  # {"results", "agent", "agent_from", "graded"}
    repaired: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # run → its TextRepaired notes
    unmatched_results: list[dict[str, str]] = field(default_factory=list)  # {"instance", "results"}
    evaluation_errors: int = 0
    body_bytes: int = 0  # bytes of every body occurrence in the imported runs
    stored_bytes: int = 0  # bytes of bodies this import really stored

    @property
    def dedup_saved_bytes(self) -> int:
        """Bytes deduplication saved: bodies named again (in this import or already stored) are stored once."""
        return self.body_bytes - self.stored_bytes

    def to_dict(self) -> dict[str, Any]:
        return {"store": self.store, "files": self.files, "bytes": self.bytes, "ignored_files": self.ignored_files,
                "imported": len(self.imported), "already_present": len(self.already_present),
                "skipped": len(self.skipped), "ingested": self.imported, "already_present_ids": self.already_present,
                "skipped_files": self.skipped, "count": len(self.imported), "states": dict(sorted(self.states.items())),
                "results": self.results, "unmatched_results": self.unmatched_results,
                "evaluation_errors": self.evaluation_errors, "repaired": self.repaired,
                "dedup": {"body_bytes": self.body_bytes, "stored_bytes": self.stored_bytes,
                          "saved_bytes": self.dedup_saved_bytes}}


@dataclass
class _Planned:
    """What the check pass keeps of one run (never its bodies)."""

    run_id: str
    agent: str | None
    task_id: str | None
    grading_open: bool
    where: str
    n_events: int
    content_hash: str = ""  # computed only for a run whose id is stored already or repeats in this import
    present: bool = False


@dataclass
class _PlannedSource:
    source: Source
    runs: list[_Planned]


class _Importer:
    def __init__(self, store: Store, *, fmt: str, tenant: str | None, agent: str | None, results: Sequence[str],
                 skip_bad: bool, repair_text: bool, progress: Progress | None) -> None:
        if fmt not in FORMATS:
            raise IngestError(f"unknown format {fmt!r}; use one of {', '.join(FORMATS)}")
        self.store = store
        self.fmt = fmt
        self.tenant = tenant
        self.agent = agent
        self.results = ResultsIndex(load_results(results))
        self.skip_bad = skip_bad
        self.repair_text = repair_text
        self.progress = progress
        self.report = IngestReport(store=str(store.path))
        self.grades: dict[str, dict[str, Any]] = {}
        self._total_bytes = 0

    def context(self, source: Source, *, hashing: bool = True) -> ParseContext:
        return ParseContext(tenant=self.tenant, agent=self.agent, default_instance=source.default_instance,
                            hashing=hashing, repair_text=self.repair_text)

    # ------------------------------------------------------------------ check
    def check(self, sources: list[Source]) -> list[_PlannedSource]:
        planned: list[_PlannedSource] = []
        runs = 0
        self._total_bytes = sum(source.size for source in sources)
        done = 0
        for number, source in enumerate(sources, start=1):
            try:
                entries = []
                # Validation only: bodies are neither hashed nor kept (the write pass does that once).
                for document in iter_documents(source):
                    run = parse_document(document, self.fmt, self.context(source, hashing=False))
                    entries.append(_Planned(run.run_id, run.agent, run.task_id, run.grading_open, document.where,
                                            len(run.events)))
                planned.append(_PlannedSource(source, entries))
                runs += len(entries)
            except IngestError as exc:
                self._bad(source, exc)
            done += source.size
            self._advance(1, f"checking {number}/{len(sources)} files, {self._mb(done)}, {runs} runs")
        self._join_results(planned)
        self._hash_known_ids(planned)
        return self._against_store(planned)

    def _bad(self, source: Source, exc: IngestError) -> None:
        if not self.skip_bad:
            raise IngestError(f"{exc}; nothing was imported (--skip-bad imports the other files)") from None
        self.report.skipped.append({"path": str(source.path), "error": str(exc)})

    def _join_results(self, planned: list[_PlannedSource]) -> None:
        """Held-out grades from --results (a run's grade is part of its content)."""
        runs = [run for source in planned for run in source.runs]
        self.results.bind_agents(run.agent for run in runs if run.grading_open and run.agent)
        for run in runs:
            grade = self.results.grade_for(run.agent, run.task_id, run.run_id) if run.grading_open else None
            if grade is not None:
                self.grades[run.run_id] = grade
            run.n_events += len(settle_events(run.run_id, run.grading_open, grade))
        ambiguous = self.results.ambiguities()
        if ambiguous:
            more = f" (and {len(ambiguous) - 1} more)" if len(ambiguous) > 1 else ""
            raise IngestError(ambiguous[0] + more + "; nothing was imported")
        self.report.unmatched_results = [{"instance": instance, "results": path}
                                         for instance, path in self.results.unmatched()]
        self.report.evaluation_errors = self.results.evaluation_errors()
        self.report.results = self.results.bindings()

    def _hash_known_ids(self, planned: list[_PlannedSource]) -> None:
        """Content hashes of the runs whose ids the store holds or this import repeats (the rest are new)."""
        counts = Counter(run.run_id for source in planned for run in source.runs)
        for planned_source in planned:
            wanted = {index for index, run in enumerate(planned_source.runs)
                      if counts[run.run_id] > 1 or self.store.has_run(run.run_id)}
            if not wanted:
                continue
            source = planned_source.source
            self._advance(0, f"comparing {len(wanted)} run(s) of {source.path.name} with the store")
            for index, document in enumerate(iter_documents(source)):
                if index in wanted:
                    run = parse_document(document, self.fmt, self.context(source))
                    if index >= len(planned_source.runs) or run.run_id != planned_source.runs[index].run_id:
                        raise _changed(source)
                    planned_source.runs[index].content_hash = run.settle(self.grades.get(run.run_id))

    def _against_store(self, planned: list[_PlannedSource]) -> list[_PlannedSource]:
        """Mark runs already stored (or earlier in this import) with the same content; refuse other content."""
        seen: dict[str, _Planned] = {}
        kept = []
        for planned_source in planned:
            mine: dict[str, _Planned] = {}
            try:
                for run in planned_source.runs:
                    earlier = mine.get(run.run_id) or seen.get(run.run_id)
                    if earlier is not None:
                        if earlier.content_hash != run.content_hash:
                            raise IngestError(f"{run.where}: run {run.run_id!r} appears twice with different content "
                                              f"({earlier.where}: {earlier.content_hash}; here: {run.content_hash})")
                        run.present = True
                        continue
                    stored = stored_content_hash(self.store, run.run_id, run.n_events)
                    if stored is not None:
                        if stored != run.content_hash:
                            raise _conflict(run.where, run.run_id, stored, run.content_hash)
                        run.present = True
                    mine[run.run_id] = run
            except IngestError as exc:
                self._bad(planned_source.source, exc)
                continue
            seen.update(mine)
            kept.append(planned_source)
        return kept

    # ------------------------------------------------------------------ write
    def write(self, planned: list[_PlannedSource]) -> None:
        batch: list[tuple[ParsedRun, str]] = []
        batch_bytes = 0
        done = 0
        skipped = len(self.report.skipped)  # files dropped by the check still count on the bar
        if skipped:
            self._advance(skipped, "importing")
        for number, planned_source in enumerate(planned, start=1):
            source = planned_source.source
            if all(run.present for run in planned_source.runs):
                self.report.already_present.extend(run.run_id for run in planned_source.runs)
            else:
                documents = iter_documents(source)
                for run_plan, document in itertools.zip_longest(planned_source.runs, documents):
                    if run_plan is None or document is None:
                        raise _changed(source)
                    if run_plan.present:
                        self.report.already_present.append(run_plan.run_id)
                        continue
                    run = parse_document(document, self.fmt, self.context(source))
                    digest = run.settle(self.grades.get(run.run_id))
                    if run.run_id != run_plan.run_id or run_plan.content_hash not in ("", digest):
                        raise _changed(source)
                    batch.append((run, document.where))
                    batch_bytes += run.body_bytes
                    if len(batch) >= BATCH_RUNS or batch_bytes >= BATCH_BYTES:
                        self._commit(batch)
                        batch, batch_bytes = [], 0
            done += source.size
            self._advance(1, f"importing {number}/{len(planned)} files, {self._mb(done)}, "
                             f"{len(self.report.imported) + len(batch)} runs")
        self._commit(batch)

    def _commit(self, batch: list[tuple[ParsedRun, str]]) -> None:
        """One transaction for the batch (fault point ``ingest.txn`` before its COMMIT)."""
        if not batch:
            return
        written: list[ParsedRun] = []
        stored_bytes = 0
        with self.store.transaction("ingest"):
            for run, where in batch:
                # Decided on the committed state: another import may have written the run since the check.
                stored = stored_content_hash(self.store, run.run_id, len(run.events))
                if stored is not None:
                    if stored != run.content_hash:  # written by another import since the check
                        raise IngestError(f"{_conflict(where, run.run_id, stored, run.content_hash or '')}; "
                                          f"nothing of this batch was written")
                    self.report.already_present.append(run.run_id)
                    continue
                stored_bytes += self.store.write_parsed(run)
                written.append(run)
        self.report.stored_bytes += stored_bytes
        for run in written:
            if any(isinstance(event, ev.TextRepaired) for event in run.events):
                self.report.repaired[run.run_id] = [dict(note) for note in self.store.run(run.run_id).text_repairs]
            self.report.imported.append(run.run_id)
            self.report.body_bytes += run.body_bytes
            self.report.states[_final_state(run)] += 1

    def _advance(self, files: int, description: str) -> None:
        if self.progress is not None:
            self.progress(files, description)

    def _mb(self, done: int) -> str:
        return f"{done / 1e6:.1f}/{self._total_bytes / 1e6:.1f} MB"


def _final_state(run: ParsedRun) -> str:
    states = [event.state for event in run.events if isinstance(event, ev.StateChanged)]
    return states[-1] if states else "running"


def _conflict(where: str, run_id: str, stored: str, new: str) -> IngestError:
    return IngestError(f"{where}: run {run_id!r} is already in the store with other content (stored {stored}, "
                       f"this input {new}) — a run id names one content, and --results grades, --agent and "
                       f"--tenant are part of it (grades that came later: kvjudge grade RUN --results FILE)")


def _changed(source: Source) -> IngestError:
    return IngestError(f"{source.path} changed while it was being imported; run the same command again to finish "
                       f"the import")


def stored_content_hash(store: Store, run_id: str, n_events: int) -> str | None:
    """The content hash of ``run_id`` as imported, or None when the store has no such run.

    Runs imported since content hashes exist carry theirs in RunStarted. For an older run it is computed over
    its first ``n_events`` logged events — the length of the run it is compared with.
    """
    if not store.has_run(run_id):
        return None
    first = next(iter(store.iter_events(run_id)))[1]
    if isinstance(first, ev.RunStarted) and first.content_hash:
        return first.content_hash
    return ev.content_hash(event for _, event in itertools.islice(store.iter_events(run_id), n_events))


def ingest_sources(store: Store, sources: list[Source], *, ignored_files: int = 0, fmt: str = "auto",
                   tenant: str | None = None, agent: str | None = None, results: Sequence[str] = (),
                   skip_bad: bool = False, repair_text: bool = False,
                   progress: Progress | None = None) -> IngestReport:
    """Import ``sources`` (see :func:`collect_sources`) into ``store``; the module docstring says how.

    ``repair_text``: text that is not Unicode is stored as U+FFFD and noted on the run (else refused).
    """
    importer = _Importer(store, fmt=fmt, tenant=tenant, agent=agent, results=results, skip_bad=skip_bad,
                         repair_text=repair_text, progress=progress)
    planned = importer.check(sources)
    importer.write(planned)
    report = importer.report
    report.files = len(sources)
    report.bytes = sum(source.size for source in sources)
    report.ignored_files = ignored_files
    report.runs = list(dict.fromkeys(run.run_id for source in planned for run in source.runs))
    return report


def ingest_paths(store: Store, paths: Iterable[Any], **options: Any) -> IngestReport:
    """Import files and directories (walked recursively); options as :func:`ingest_sources`."""
    sources, ignored = collect_sources(paths)
    return ingest_sources(store, sources, ignored_files=ignored, **options)
