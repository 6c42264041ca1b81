"""The event recorder on SQLite (the ``events`` table): appending events, each checked against the state the run is
in, with the run's projection written in the same transaction; and reading them back."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

from kvjudge.errors import IntegrityError, StoreError
from kvjudge.retention import events as ev
from kvjudge.retention.events import event_from
from kvjudge.retention.lifecycle import check_state_name
from kvjudge.retention.store.appending import fold_appended
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
            # AUTOINCREMENT gives each new row one more than the largest LSN the table ever had, and this
            # transaction holds the write lock: the LSNs are known before the rows go in, in one executemany.
            first = self._next_lsn()
            lsns = list(range(first, first + len(events)))
            folder = fold_appended(run_id, self._projected(run_id), events, lsns, self._has_body)
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

    def events_after(self, lsn: int, limit: int = 1000) -> list[tuple[int, str, ev.Event]]:
        """``(lsn, run, event)`` of every run after ``lsn``, in LSN order, at most ``limit``: what a follower of the
        log reads next."""
        rows = self._conn.execute("SELECT lsn, run, kind, payload FROM events WHERE lsn > ? ORDER BY lsn LIMIT ?",
                                  (lsn, limit)).fetchall()
        return [(int(found_lsn), run, event_from(kind, payload)) for found_lsn, run, kind, payload in rows]

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
