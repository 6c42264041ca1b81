"""The event recorder on PostgreSQL (the ``events`` table): appending events, each checked against the state the run
is in, with the run's projection written in the same transaction; and reading them back.

LSNs come from the table's identity sequence, drawn inside the write transaction (which holds the store's write
lock, :mod:`.database`): they commit in the order they were drawn. They are not contiguous — a rolled-back append
leaves its numbers unused — and nothing here assumes they are.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

from kvjudge.errors import StoreError
from kvjudge.retention import events as ev
from kvjudge.retention.events import event_from
from kvjudge.retention.lifecycle import check_state_name
from kvjudge.retention.state import RunState, agent_of
from kvjudge.retention.store.appending import fold_appended
from kvjudge.retention.store.postgres.database import PostgresDatabase
from kvjudge.retention.store.postgres.projection import PostgresProjector
from kvjudge.retention.store.postgres.schema import LOG_TRIGGERS


def _refuse_nul(run_id: str, state: RunState) -> None:
    """StoreError (nothing written) when a name the projection keeps as text holds a NUL, which PostgreSQL's text
    cannot hold (a SQLite store keeps it; in the events it is JSON-escaped either way)."""
    for what, value in (("id", run_id), ("tenant", state.tenant), ("agent", agent_of(state)),
                        ("task", state.task_id), ("trial", state.trial)):
        if value and "\x00" in value:
            raise StoreError(f"run {run_id!r}: its {what} holds a NUL character, which a PostgreSQL store cannot "
                             f"keep; fix the run's {what} (or keep it in a SQLite store)")


class PostgresEventRecorder:
    """:class:`~kvjudge.retention.store.interfaces.EventRecorder` on the ``events`` table: append-only (its triggers
    refuse UPDATE, DELETE and TRUNCATE). ``projector`` holds each run's committed state and takes its new one;
    ``has_body`` says whether a summary an event names is stored (the blob store's)."""

    def __init__(self, db: PostgresDatabase, projector: PostgresProjector, has_body: Callable[[str], bool]) -> None:
        self._conn = db.conn
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
        if not events:
            return []
        with self._transaction(label):
            # The transaction holds the store's write lock (an advisory lock, which any role may take: LOCK TABLE
            # in a mode that stops other appends needs UPDATE, DELETE or TRUNCATE on the log, the very privileges a
            # lab's application role lacks), so the LSNs drawn here commit before any drawn after them. One round
            # trip for the LSNs and the run's committed state (a pipeline: the fetch sends both), one for the rows.
            with self._conn.pipeline():
                drawn = self._conn.execute(
                    "SELECT nextval(pg_get_serial_sequence('events', 'lsn')) FROM generate_series(1, %s)",
                    (len(events),))
                current = self._projected(run_id)
                lsns = [int(row[0]) for row in drawn.fetchall()]
            folder = fold_appended(run_id, current, events, lsns, self._has_body)
            if folder is not None:
                _refuse_nul(run_id, folder.freeze())
            with self._conn.pipeline():
                # One statement for the rows (arrays unnested: executemany would sync once per call).
                self._conn.execute(
                    "INSERT INTO events(lsn, run, kind, payload) SELECT lsn, %s, kind, payload "
                    "FROM unnest(%s::bigint[], %s::text[], %s::text[]) AS t(lsn, kind, payload)",
                    (run_id, lsns, [event.kind for event in events], [event.to_json() for event in events]))
                if folder is not None:
                    self._project(folder.freeze(), lsns[-1])
        return lsns

    def mark(self, run_id: str, state: str) -> int:
        """Append a lifecycle step; RunStateError when it is not a legal one. Returns its LSN."""
        new = check_state_name(state)
        return self.append(run_id, ev.StateChanged(run=run_id, state=new), label="mark")

    def iter_events(self, run_id: str | None = None, *, kind: str | None = None) -> Iterator[tuple[int, ev.Event]]:
        """``(lsn, event)`` of one run (or all runs, grouped by run), in LSN order; only events of ``kind`` when
        given."""
        if run_id is None:
            for run in self.logged_runs():
                yield from self.iter_events(run, kind=kind)
            return
        if kind is None:
            rows = self._conn.execute("SELECT lsn, kind, payload FROM events WHERE run = %s ORDER BY lsn",
                                      (run_id,)).fetchall()
        else:
            rows = self._conn.execute(
                "SELECT lsn, kind, payload FROM events WHERE run = %s AND kind = %s ORDER BY lsn",
                (run_id, kind)).fetchall()
        for lsn, found, payload in rows:
            yield int(lsn), event_from(found, payload)

    def events_after(self, lsn: int, limit: int = 1000) -> list[tuple[int, str, ev.Event]]:
        """``(lsn, run, event)`` of every run after ``lsn``, in LSN order, at most ``limit``: what a follower of the
        log reads next (committed events only; LSNs need not be contiguous)."""
        rows = self._conn.execute("SELECT lsn, run, kind, payload FROM events WHERE lsn > %s ORDER BY lsn LIMIT %s",
                                  (lsn, limit)).fetchall()
        return [(int(found_lsn), run, event_from(kind, payload)) for found_lsn, run, kind, payload in rows]

    def logged_runs(self) -> list[str]:
        """Every run the log names, sorted (whatever the projection says)."""
        return [row[0] for row in self._conn.execute("SELECT DISTINCT run FROM events ORDER BY run")]

    def event_kind(self, lsn: int) -> str | None:
        """The kind of the event at ``lsn`` (None: no such event)."""
        row = self._conn.execute("SELECT kind FROM events WHERE lsn = %s", (lsn,)).fetchone()
        return row[0] if row else None

    def event_range(self, run_id: str) -> tuple[int, int]:
        """The first and last LSN of ``run_id``'s events; StoreError when the log has none."""
        row = self._conn.execute("SELECT MIN(lsn), MAX(lsn) FROM events WHERE run = %s", (run_id,)).fetchone()
        if row is None or row[0] is None:
            raise StoreError(f"no run {run_id!r} in the store; list runs with `kvjudge runs`")
        return int(row[0]), int(row[1])

    def missing_log_triggers(self) -> list[str]:
        """The append-only triggers the ``events`` table lacks or has disabled (none on an intact store)."""
        enabled = {row[0] for row in self._conn.execute(
            "SELECT tgname FROM pg_trigger WHERE tgrelid = 'events'::regclass AND NOT tgisinternal "
            "AND tgenabled <> 'D'")}
        return [name for name in LOG_TRIGGERS if name not in enabled]
