"""One import: each file read and parsed once, its runs written together.

- Files are read in order, one document at a time (memory stays bounded by the largest document); each document
  is decoded once, its format detected from the decoded value, and parsed — on Linux, for an import of more than
  one small file where a core is idle, by a child process ahead of the writes (:mod:`.ahead`), which writes
  nothing. Held-out grades from ``--results`` are joined as each run is parsed; its content hash is compared with
  the store and the rest of the import.
- A file's runs are written in one savepoint of the open batch transaction, committed after the file that
  brings it to :data:`BATCH_RUNS` runs or :data:`BATCH_BYTES` of bodies (fault point ``ingest.txn`` before each
  COMMIT, ``ingest.committed`` after it): a file is stored whole or not at all, whatever moment a kill comes.
  A run already stored with the same content is counted as already present and left alone, so the same command
  run again after a kill finishes the import, and a third time writes nothing. (So is a Harbor trial imported
  before it finished, once it has: :func:`~kvjudge.retention.ingest.harbor.finished_since`.)
- A malformed document, or a run id already stored (or met earlier in this import) with other content, stops the
  import with one line naming the file, the line and the JSON path: nothing of the open batch is written (an
  import within one batch writes nothing), the batches committed before it stay and the line says how many runs
  they hold. With ``skip_bad`` that file alone is left out and listed at the end.
- A ``--results`` file that names no agent and grades instances is bound to an agent by its file name, and
  refused where it would grade runs of two agents: that needs every run's agent before the first grade, so only
  then are the files parsed once ahead (nothing hashed, nothing written) for what names their runs.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kvjudge.errors import IngestError
from kvjudge.retention import events as ev
from kvjudge.retention.faults import fault_point
from kvjudge.retention.ingest import registry, trials
from kvjudge.retention.ingest.ahead import parse_ahead
from kvjudge.retention.ingest.bucket import staged_inputs
from kvjudge.retention.ingest.model import DocumentError, ParseContext, ParsedRun
from kvjudge.retention.ingest.results import ResultsIndex, load_results
from kvjudge.retention.ingest.sources import Document, Source, Walk, iter_documents, walk
from kvjudge.retention.text_check import TextError, parse_checked

if TYPE_CHECKING:
    from kvjudge.retention.store import Store

BATCH_RUNS = 64
BATCH_BYTES = 8 << 20
#: The store's page cache during an import, in MiB: a batch's changed pages (its bodies, BATCH_BYTES at most,
#: and its runs' events and projections) and the index pages its inserts walk stay in memory until COMMIT.
#: SQLite's 2 MiB wrote each page of a full batch to the WAL up to twice and read index pages back: 20 % more
#: CPU in SQL, 3x the reads; a larger cache saved nothing more (measured on 40 KB and 0.2 MB runs).
IMPORT_PAGE_CACHE_MIB = 16
#: An import of one file is parsed ahead (:mod:`.ahead`) from this size on (a JSONL file, an inspect log: many
#: documents); one small file is one run, with no write to overlap its parse.
AHEAD_MIN_BYTES = 1 << 20

#: ``progress(files_done, description)`` — the CLI's progress bar advance: each file counts twice (checked,
#: then written); the description says files, MB and runs.
Progress = Callable[[int, str], None]


def formats() -> tuple[str, ...]:
    """The ``--format`` choices: ``auto`` and every registered format (:mod:`.registry`)."""
    return registry.names()


def detect_format(obj: Any) -> str | None:
    """The format of one decoded document (its top-level keys asked of each format, :func:`.registry.detect`), or
    None when it is none of them."""
    found = registry.detect(obj)
    return found.name if found is not None else None


def parse_document(document: Document, fmt: str, context: ParseContext) -> ParsedRun:
    """One document → ParsedRun in ``fmt`` (``auto``: detected); IngestError naming the file, line and JSON path.

    Its text is checked first (:func:`~kvjudge.retention.text_check.parse_checked`): text that is not Unicode
    is refused, or with ``context.repair_text`` stored as U+FFFD and noted by a TextRepaired event.
    """
    obj = document.decode(repair_text=context.repair_text)
    chosen = detect_format(obj) if fmt == registry.AUTO else fmt
    suffix = f" ({chosen} format)" if chosen else ""
    try:
        return parse_checked(obj, lambda checked: _parse_as(chosen, checked, context, document),
                             repair_text=context.repair_text)
    except DocumentError as exc:
        raise IngestError(f"{document.where}: {exc.path}: {exc.message}{suffix}") from None
    except TextError as exc:
        raise IngestError(f"{document.where}: {exc}{suffix}") from None


def _parse_as(fmt: str | None, obj: Any, context: ParseContext, document: Document) -> ParsedRun:
    found = registry.get(fmt) if fmt is not None else None
    if found is None:
        raise DocumentError("$", registry.unknown_message())
    return found.parse(obj, context, document)


@dataclass
class IngestReport:
    """What an import did. ``runs``: every run id of the input, in order (imported now or already present)."""

    store: str
    files: int = 0
    bytes: int = 0
    ignored_files: int = 0
    #: Files read beside the runs (companions such as SWE-agent's ``all_preds.jsonl``) and those passed over as the
    #: harness's settings, by path.
    companion_files: list[str] = field(default_factory=list)
    settings_files: list[str] = field(default_factory=list)
    #: One line each: what was passed over or read beside the runs, a file that held no runs, a format left out.
    notes: list[str] = field(default_factory=list)
    runs: list[str] = field(default_factory=list)
    imported: list[str] = field(default_factory=list)
    already_present: list[str] = field(default_factory=list)
    #: Of the already present: runs imported from a Harbor trial before it finished, which has finished since.
    finished_since: list[str] = field(default_factory=list)
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
                "companion_files": len(self.companion_files), "settings_files": len(self.settings_files),
                "companions": {"read": self.companion_files, "passed_over": self.settings_files},
                "notes": self.notes,
                "imported": len(self.imported), "already_present": len(self.already_present),
                "skipped": len(self.skipped), "ingested": self.imported, "already_present_ids": self.already_present,
                "skipped_files": self.skipped, "finished_since": self.finished_since, "count": len(self.imported),
                "states": dict(sorted(self.states.items())),
                "results": self.results, "unmatched_results": self.unmatched_results,
                "evaluation_errors": self.evaluation_errors, "repaired": self.repaired,
                "dedup": {"body_bytes": self.body_bytes, "stored_bytes": self.stored_bytes,
                          "saved_bytes": self.dedup_saved_bytes}}


class _Batch:
    """The open write transaction: whole files, each in a savepoint, committed every :data:`BATCH_RUNS` runs or
    :data:`BATCH_BYTES` of bodies (after the file that fills it: a file is never split over two commits)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._transaction: Any = None  # the store's transaction context, entered and not yet exited
        self.runs = 0
        self.bytes = 0
        self.committed_runs = 0

    def begin(self) -> None:
        """Begin the transaction when none is open."""
        if self._transaction is None:
            self._transaction = self.store.transaction("ingest")
            self._transaction.__enter__()

    def savepoint(self) -> Any:
        """A savepoint for one file, the transaction begun first when none is open."""
        self.begin()
        return self.store.savepoint("ingest_file")

    def add(self, runs: int, body_bytes: int) -> None:
        """Count a file's writes; commit when the batch is full."""
        self.runs += runs
        self.bytes += body_bytes
        if self.runs >= BATCH_RUNS or self.bytes >= BATCH_BYTES:
            self.commit()

    def commit(self) -> None:
        """COMMIT (fault point ``ingest.txn`` just before it, ``ingest.committed`` just after)."""
        if self._transaction is None:
            return
        transaction, self._transaction = self._transaction, None
        transaction.__exit__(None, None, None)
        self.committed_runs += self.runs
        self.runs = self.bytes = 0
        fault_point("ingest.committed")

    def abort(self, exc: BaseException) -> None:
        """ROLLBACK what the batch holds (the files since the last commit)."""
        if self._transaction is not None:
            transaction, self._transaction = self._transaction, None
            transaction.__exit__(type(exc), exc, exc.__traceback__)


@dataclass
class _FileOutcome:
    """What one file adds to the report, merged only once the file is kept."""

    runs: list[str] = field(default_factory=list)
    imported: list[tuple[str, str, bool]] = field(default_factory=list)  # (run id, final state, text repaired)
    present: list[str] = field(default_factory=list)
    finished_since: list[str] = field(default_factory=list)
    seen: dict[str, trials.Seen] = field(default_factory=dict)  # run id → where, content hash, work, marks
    stored_bytes: int = 0
    body_bytes: int = 0


class _Importer:
    def __init__(self, store: Store, *, fmt: str, tenant: str | None, agent: str | None, results: Sequence[str],
                 skip_bad: bool, repair_text: bool, progress: Progress | None, trial: str | None = None) -> None:
        if fmt not in registry.names():
            raise IngestError(f"unknown format {fmt!r}; use one of {', '.join(registry.names())}")
        _check_trial_label(trial)
        self.store = store
        self.fmt = fmt
        self.tenant = tenant
        self.agent = agent
        self.trial = trial
        self.results = ResultsIndex(load_results(results))
        self.skip_bad = skip_bad
        self.repair_text = repair_text
        self.progress = progress
        self.report = IngestReport(store=store.location)
        self.seen: dict[str, trials.Seen] = {}  # run id → what the runs kept so far were
        self.agents: set[str] = set()  # agents of the runs whose grading is open (results are bound to them)
        self._batch = _Batch(store)
        self._total_bytes = 0

    def context(self, source: Source, *, hashing: bool = True) -> ParseContext:
        return ParseContext(tenant=self.tenant, agent=self.agent, default_instance=source.default_instance,
                            hashing=hashing, repair_text=self.repair_text, trial=self.trial)

    def run(self, sources: list[Source]) -> None:
        self._total_bytes = sum(source.size for source in sources)
        if self.results.needs_agents():
            sources = self._bind_results(sources)
        with self.store.page_cache(IMPORT_PAGE_CACHE_MIB), self._parser(sources) as parsed:
            try:
                done = 0
                for number, source in enumerate(sources, start=1):
                    self._import_file(source, parsed(number - 1, source))
                    done += source.size
                    self._advance(1, f"importing {number}/{len(sources)} files, {self._mb(done)}, "
                                     f"{len(self.report.imported)} runs")
                self._batch.commit()
            except BaseException as exc:
                self._batch.abort(exc)
                raise
        if not self.results.needs_agents():  # bound now only for the report: no grade depended on it
            self.results.bind_agents(self.agents, strict=False)
        self.report.unmatched_results = [{"instance": instance, "results": path}
                                         for instance, path in self.results.unmatched()]
        self.report.evaluation_errors = self.results.evaluation_errors()
        self.report.results = self.results.bindings()

    # ------------------------------------------------------------------ results
    def _bind_results(self, sources: list[Source]) -> list[Source]:
        """A results file that names no agent is bound by its file name to the one agent of this import it names,
        and refused where it grades runs of two agents: every run's agent is needed before the first grade, so
        the files are parsed once ahead for what names their runs (nothing hashed, nothing written)."""
        kept, runs = [], []
        for number, source in enumerate(sources, start=1):
            try:
                found = [parse_document(document, self.fmt, self.context(source, hashing=False))
                         for document in self._documents(source)]
            except IngestError as exc:
                self._bad(source, exc)
                continue
            kept.append(source)
            runs.extend((run.agent, run.task_id, run.run_id, run.trial) for run in found if run.grading_open)
            self._advance(0, f"reading whose runs {number}/{len(sources)} files hold, for --results")
        self.results.bind_agents(agent for agent, _, _, _ in runs if agent)
        for agent, task_id, run_id, trial in runs:
            self.results.grade_for(agent, task_id, run_id, trial)
        ambiguous = self.results.ambiguities()
        if ambiguous:
            more = f" (and {len(ambiguous) - 1} more)" if len(ambiguous) > 1 else ""
            raise IngestError(ambiguous[0] + more + "; nothing was imported")
        return kept

    # ------------------------------------------------------------------ parsing
    @contextlib.contextmanager
    def _parser(self, sources: list[Source]) -> Iterator[Callable[[int, Source], Iterator[tuple[str, ParsedRun]]]]:
        """``parsed(index, source)``: the documents of ``sources[index]`` parsed, as (where, run), in order — by a
        child process parsing ahead (:mod:`.ahead`) when the import is more than one small file and a core is idle
        for it, else here as they are read."""
        ahead = parse_ahead(sources, self._parsed_ahead) \
            if len(sources) > 1 or sum(source.size for source in sources) >= AHEAD_MIN_BYTES else None
        if ahead is None:
            yield lambda _, source: self._parsed(source)
            return
        with ahead:
            yield lambda index, _: ahead.file(index)

    def _parsed(self, source: Source) -> Iterator[tuple[str, ParsedRun]]:
        """Each document of ``source``, read once and parsed: (where, run); IngestError where one is refused."""
        for document in self._documents(source):
            yield document.where, parse_document(document, self.fmt, self.context(source))

    def _documents(self, source: Source) -> Iterator[Document]:
        """The documents of ``source``; a JSONL file is one session when ``--format`` names a session format."""
        forced = registry.get(self.fmt)
        return iter_documents(source, records=forced is not None and forced.recognises_record is not None)

    def _parsed_ahead(self, source: Source) -> Iterator[tuple[str, ParsedRun]]:
        """:meth:`_parsed`, each event's canonical JSON made as well (in the child: it travels with the event, and
        the content hash and the log's rows reuse it)."""
        for where, run in self._parsed(source):
            for event in run.events:
                event.to_json()
            yield where, run

    # ------------------------------------------------------------------ one file
    def _import_file(self, source: Source, parsed: Iterator[tuple[str, ParsedRun]]) -> None:
        """Every run of ``source`` (``parsed``: its documents, parsed) written: the whole file, or none of it.

        A file's first run to write waits until the next one is checked: a file that brings only one (most do)
        is written without a savepoint, since everything that can refuse it comes before its write. Only a
        second run opens one (written before it, rolled back to when a later document is refused) — a savepoint
        copies every page the file changes to a journal of its own, as much again as the writes themselves.
        """
        outcome = _FileOutcome()
        try:
            with contextlib.ExitStack() as savepoint:
                first: ParsedRun | None = None  # the file's first run to write, until a second one comes
                for where, parsed_run in parsed:
                    run = self._checked_run(where, parsed_run, outcome, source.within)
                    if run is None:
                        continue
                    if first is None and not outcome.imported:
                        first = run
                        continue
                    if first is not None:
                        savepoint.enter_context(self._batch.savepoint())
                        self._write_run(first, outcome)
                        first = None
                    self._write_run(run, outcome)
                if first is not None:
                    self._batch.begin()
                    self._write_run(first, outcome)
        except IngestError as exc:
            self._bad(source, exc)
            return
        if not outcome.runs:
            self.report.notes.append(f"{source.path}: holds no runs (an inspect log whose eval ran no samples, an "
                                     f"empty file): nothing imported from it")
        for run_id, state, repaired in outcome.imported:
            if repaired:
                self.report.repaired[run_id] = [dict(note) for note in self.store.runs.run(run_id).text_repairs]
            self.report.imported.append(run_id)
            self.report.states[state] += 1
        self.report.already_present.extend(outcome.present)
        self.report.finished_since.extend(outcome.finished_since)
        self.report.runs.extend(outcome.runs)
        self.report.body_bytes += outcome.body_bytes
        self.report.stored_bytes += outcome.stored_bytes
        self.seen.update(outcome.seen)
        self._batch.add(len(outcome.imported), outcome.body_bytes)

    def _checked_run(self, where: str, run: ParsedRun, outcome: _FileOutcome,
                     within: str | None = None) -> ParsedRun | None:
        """``run`` (parsed from the document at ``where``, found at ``within``) checked against the store and the
        import so far: the run to write (a trial of its own where another run of its task holds its id:
        :mod:`.trials`), or None when it is here already with the same content; IngestError when it is refused."""
        if self.trial is not None and run.trial != self.trial:
            own = f"names its own trial {run.trial!r}" if run.trial is not None else "is named by its file alone"
            labelled = ", ".join(fmt.name for fmt in registry.formats() if fmt.trial_label)
            raise IngestError(f"{where}: --trial labels runs whose files name no trial ({labelled}); this "
                              f"{run.fmt} run {own}")
        if self.trial is not None:
            run.named = True  # the user named its trial: other content under it is refused, never relabelled
        if run.grading_open and run.agent:
            self.agents.add(run.agent)
        grade = self.results.grade_for(run.agent, run.task_id, run.run_id, run.trial) if run.grading_open else None
        digest = run.settle(grade)
        work = trials.work_digest(run.events)
        offered: Iterator[str] | None = None
        base = (run.run_id, run.trial)
        while True:
            earlier = outcome.seen.get(run.run_id) or self.seen.get(run.run_id)
            placed = trials.place(self.store, where, run, digest, work, earlier)
            if placed != trials.TAKEN:
                break
            offered = offered or trials.labels(run, within, work)
            label = next(offered, None)
            if label is None:  # every label taken by other work (the work digest, last, cannot be)
                raise IngestError(f"{where}: run {run.run_id!r} appears twice with different content")
            digest = trials.as_trial(run, label, base)
        if placed == trials.NEW and offered is not None:
            found = trials.twin(self.store, {**self.seen, **outcome.seen}, run, base[0], work)
            if found is not None:  # the same work under another label: that trial, found from elsewhere
                outcome.runs.append(found)
                outcome.present.append(found)
                return None
        outcome.runs.append(run.run_id)
        if earlier is None:
            outcome.seen[run.run_id] = (where, digest, work, run.marks)
        if placed == trials.FINISHED:
            outcome.finished_since.append(run.run_id)  # kept as imported: its result comes with `grade`
        if placed == trials.NEW:
            return run
        outcome.present.append(run.run_id)
        return None

    def _write_run(self, run: ParsedRun, outcome: _FileOutcome) -> None:
        # Asked again inside the write transaction: another import of the same runs into this store (several hosts
        # ingesting one bucket) may have written this run since it was checked. The same content is then here
        # already; other content is a conflict, as at the check.
        stored = trials.stored_content_hash(self.store, run.run_id, len(run.events))
        if stored is not None:
            if stored != run.content_hash:
                raise IngestError(f"run {run.run_id!r}: another import wrote it meanwhile with other content (stored "
                                  f"{stored}, this input {run.content_hash}); import it again to see which")
            outcome.present.append(run.run_id)
            return
        outcome.stored_bytes += write_parsed(self.store, run)
        outcome.body_bytes += run.body_bytes
        outcome.imported.append((run.run_id, _final_state(run),
                                 any(isinstance(event, ev.TextRepaired) for event in run.events)))

    def _bad(self, source: Source, exc: IngestError) -> None:
        if not self.skip_bad:
            committed = self._batch.committed_runs
            written = "nothing was imported" if committed == 0 else \
                f"{committed} run(s) of the files before it were imported, nothing since (the same command " \
                f"finishes the import once the file is fixed)"
            raise IngestError(f"{exc}; {written} (--skip-bad imports the other files)") from None
        self.report.skipped.append({"path": str(source.path), "error": str(exc)})

    def _advance(self, files: int, description: str) -> None:
        if self.progress is not None:
            self.progress(files, description)

    def _mb(self, done: int) -> str:
        return f"{done / 1e6:.1f}/{self._total_bytes / 1e6:.1f} MB"


def _check_trial_label(trial: str | None) -> None:
    """A ``--trial`` label ends a run id (``<agent>/<instance>/<trial>``): not empty, no ``/``, no surrounding
    whitespace."""
    if trial is not None and (not trial.strip() or "/" in trial or trial != trial.strip()):
        raise IngestError(f"--trial {trial!r}: a trial label is a non-empty name without '/' or surrounding spaces "
                          f"(e.g. --trial 2); it ends each run id: <agent>/<instance>/<trial>")


def _final_state(run: ParsedRun) -> str:
    states = [event.state for event in run.events if isinstance(event, ev.StateChanged)]
    return states[-1] if states else "running"


def write_parsed(store: Store, run: ParsedRun) -> int:
    """Settle a parsed run's content hash, then write its bodies and events in one transaction; the bytes of
    bodies stored (the others were stored already)."""
    if run.content_hash is None:
        run.settle(None)
    return store.write_run(run.run_id, run.bodies.items(), run.events)


def ingest_sources(store: Store, sources: list[Source], *, ignored_files: int = 0, walked: Walk | None = None,
                   fmt: str = "auto", tenant: str | None = None, agent: str | None = None,
                   results: Sequence[str] = (), skip_bad: bool = False, repair_text: bool = False,
                   trial: str | None = None, progress: Progress | None = None) -> IngestReport:
    """Import ``sources`` (see :func:`~.sources.walk`) into ``store``; the module docstring says how. ``walked``:
    the walk that found them, whose companions and passed-over files the report counts and notes.

    ``repair_text``: text that is not Unicode is stored as U+FFFD and noted on the run (else refused).
    ``trial``: the trial of every run whose format names none (mini-swe-agent, SWE-agent, OpenHands), whose id
    becomes ``<agent>/<instance>/<trial>``; a run that names a trial of its own is refused.
    """
    importer = _Importer(store, fmt=fmt, tenant=tenant, agent=agent, results=results, skip_bad=skip_bad,
                         repair_text=repair_text, progress=progress, trial=trial)
    importer.run(sources)
    report = importer.report
    report.files = len(sources)
    report.bytes = sum(source.size for source in sources)
    report.ignored_files = walked.ignored if walked is not None else ignored_files
    if walked is not None:
        report.companion_files = walked.companions_used
        report.settings_files = walked.companions_passed
        report.notes[:0] = walked.notes()
    report.notes[:0] = list(registry.load_problems())
    report.runs = list(dict.fromkeys(report.runs))
    return report


def ingest_paths(store: Store, paths: Iterable[Any], *, results: Sequence[str] = (), endpoint_url: str | None = None,
                 **options: Any) -> IngestReport:
    """Import files and directories (walked recursively), and ``s3://`` objects and prefixes (read through
    :mod:`.bucket`, at ``endpoint_url``); options as :func:`ingest_sources`."""
    with staged_inputs(list(paths), results, endpoint_url=endpoint_url) as inputs:
        walked = walk(inputs.paths)
        return inputs.with_urls(ingest_sources(store, walked.sources, walked=walked, results=inputs.results,
                                               **options))
