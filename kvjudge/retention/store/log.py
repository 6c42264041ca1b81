"""The event recorder on SQLite (the ``events`` table): appending events, each checked against the state the run is
in, with the run's projection written in the same transaction; and reading them back."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

from kvjudge.errors import IntegrityError, StoreError, UsageError
from kvjudge.retention import events as ev
from kvjudge.retention.blobs import short
from kvjudge.retention.events import canonical_json, event_from
from kvjudge.retention.lifecycle import check_state_name, check_transition
from kvjudge.retention.state import DROPPED, LOCAL, RunFolder
from kvjudge.retention.store.database import Database
from kvjudge.retention.store.projection import Projector


class SqliteEventRecorder:
    """:class:`~kvjudge.retention.store.interfaces.EventRecorder` on the ``events`` table: append-only (its
    triggers refuse UPDATE and DELETE). ``projector`` holds each run's committed state and takes its new one;
    ``has_body`` says whether a summary an event names is stored (the blob store's)."""

    def __init__(self, db: Database, projector: Projector, has_body: Callable[[str], bool]) -> None:
        self._conn = db.conn
        self._path = db.path
        self._transaction = db.transaction
        self._projected = projector.state
        self._project = projector.project
        self._has_body = has_body

    def append(self, run_id: str, event: ev.Event, *, label: str = "append") -> int:
        """Append one event in its own transaction (checked against the run's state); returns its LSN."""
        return self.append_many(run_id, [event], label=label)[0]

    def append_many(self, run_id: str, events: Sequence[ev.Event], *, label: str = "append") -> list[int]:
        """Append events of one run atomically, each checked against the state the ones before it left; the run's
        projection is written in the same transaction."""
        with self._transaction(label):
            current = self._projected(run_id)
            folder = RunFolder.thaw(current) if current is not None else None
            # AUTOINCREMENT gives each new row one more than the largest LSN the table ever had, and this
            # transaction holds the write lock: the LSNs are known before the rows go in, in one executemany.
            first = self._next_lsn()
            lsns = list(range(first, first + len(events)))
            previous: ev.Event | None = None
            for lsn, event in zip(lsns, events):
                if event.run != run_id:
                    raise UsageError(f"event for run {event.run!r} appended to run {run_id!r}")
                self._check_event(run_id, folder, event, after_grade=isinstance(previous, ev.GradeRecorded))
                previous = event
                if folder is None:
                    folder = RunFolder(id=run_id)
                folder.apply(lsn, event)
            self._conn.executemany("INSERT INTO events(run, kind, payload) VALUES (?, ?, ?)",
                                   [(run_id, event.kind, event.to_json()) for event in events])
            if lsns and self._next_lsn() != lsns[-1] + 1:
                raise IntegrityError(f"the log of {self._path} assigned unexpected LSNs; nothing was appended")
            if folder is not None and lsns:
                self._project(folder.freeze(), lsns[-1])
        return lsns

    def mark(self, run_id: str, state: str) -> int:
        """Append a lifecycle step; RunStateError when it is not a legal one. Returns its LSN."""
        new = check_state_name(state)
        return self.append(run_id, ev.StateChanged(run=run_id, state=new), label="mark")

    def _next_lsn(self) -> int:
        row = self._conn.execute(
            "SELECT max(coalesce((SELECT seq FROM sqlite_sequence WHERE name = 'events'), 0), "
            "coalesce((SELECT max(lsn) FROM events), 0))").fetchone()
        return int(row[0]) + 1

    def _check_event(self, run_id: str, folder: RunFolder | None, event: ev.Event, *, after_grade: bool) -> None:
        if isinstance(event, ev.RunStarted):
            if folder is not None:
                raise StoreError(f"run {run_id} already exists in the store")
            return
        if folder is None:
            raise StoreError(f"no run {run_id!r} in the store; list runs with `kvjudge runs`")
        if isinstance(event, ev.TransitionRecorded):  # first: most of a run's events
            if event.branch not in folder.branches:
                raise StoreError(f"run {run_id} has no branch {event.branch!r}")
        elif isinstance(event, ev.StateChanged):
            check_transition(run_id, folder.state, event.state, after_grade=after_grade)
        elif isinstance(event, ev.GradeRecorded):
            missing = [grade for grade in event.replaces or () if grade not in folder.grades]
            if missing:
                raise StoreError(f"run {run_id}: a grade replaces {canonical_json(missing[0])}, which the run does "
                                 f"not hold")
        elif isinstance(event, ev.BranchOpened):
            if event.branch in folder.branches:
                raise StoreError(f"run {run_id} already has a branch {event.branch!r}")
        elif isinstance(event, ev.Reduced):
            location = folder.bodies.get(event.original)
            if location is None or location.status != LOCAL:
                status = location.status if location else "not named by the run"
                raise StoreError(f"run {run_id}: cannot reduce {short(event.original)}, it is {status}")
            self._require_body(event.summary, "Reduced")
        elif isinstance(event, ev.BranchReduced):
            entry = folder.branches.get(event.branch)
            if entry is None or entry["branch"].status != "dead":
                raise StoreError(f"run {run_id}: only a dead branch can be read as one extract, not {event.branch!r}")
            self._require_body(event.summary, "BranchReduced")
        elif isinstance(event, ev.Dropped):
            location = folder.bodies.get(event.original)
            if location is None or location.status == DROPPED:
                status = location.status if location else "not named by the run"
                raise StoreError(f"run {run_id}: cannot drop {short(event.original)}, it is {status}")

    def _require_body(self, ref: str, kind: str) -> None:
        # The summary must be durable before the event that points readers at it.
        if not self._has_body(ref):
            raise IntegrityError(f"{kind} names summary {short(ref)} whose body is not stored; put it first")

    def iter_events(self, run_id: str | None = None, *, kind: str | None = None) -> Iterator[tuple[int, ev.Event]]:
        """``(lsn, event)`` of one run (or all runs, grouped by run), in LSN order, streamed; only events of
        ``kind`` (``"TierStarted"``, …) when given."""
        if run_id is None:
            for run in self.logged_runs():
                yield from self.iter_events(run, kind=kind)
            return
        if kind is None:
            query = self._conn.execute("SELECT lsn, kind, payload FROM events WHERE run = ? ORDER BY lsn", (run_id,))
        else:
            query = self._conn.execute("SELECT lsn, kind, payload FROM events WHERE run = ? AND kind = ? ORDER BY lsn",
                                       (run_id, kind))
        for lsn, found, payload in query:
            yield int(lsn), event_from(found, payload)

    def logged_runs(self) -> list[str]:
        """Every run the log names, sorted (whatever the projection says)."""
        return [row[0] for row in self._conn.execute("SELECT DISTINCT run FROM events ORDER BY run")]

    def event_kind(self, lsn: int) -> str | None:
        """The kind of the event at ``lsn`` (None: no such event)."""
        row = self._conn.execute("SELECT kind FROM events WHERE lsn = ?", (lsn,)).fetchone()
        return row[0] if row else None

    def event_range(self, run_id: str) -> tuple[int, int]:
        """The first and last LSN of ``run_id``'s events; StoreError when the log has none."""
        row = self._conn.execute("SELECT MIN(lsn), MAX(lsn) FROM events WHERE run = ?", (run_id,)).fetchone()
        if row is None or row[0] is None:
            raise StoreError(f"no run {run_id!r} in the store; list runs with `kvjudge runs`")
        return int(row[0]), int(row[1])

    def missing_log_triggers(self) -> list[str]:
        """The append-only triggers the ``events`` table lacks (none on an intact store)."""
        triggers = {row[0] for row in self._conn.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'")}
        return [name for name in ("events_no_update", "events_no_delete") if name not in triggers]
