"""Run queries on PostgreSQL: each run's folded state and what listing, judging, tiering and verify ask of it, read
from the projection (:mod:`.projection`) by name — the same answers as the SQLite store's (:mod:`..queries`)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Iterator

from kvjudge.errors import StoreError
from kvjudge.retention.state import LOCAL, TIERED, RunState
from kvjudge.retention.store.interfaces import EventRecorder, Explanation, RunListing
from kvjudge.retention.store.postgres.database import PostgresDatabase
from kvjudge.retention.store.postgres.projection import PostgresProjector, storable_in_postgres
from kvjudge.retention.store.projection_rows import (
    LISTING_COLUMNS,
    explanation,
    listings,
    refold,
    runs_where,
)


class PostgresRunQueries:
    """:class:`~kvjudge.retention.store.interfaces.RunQueries` on the projection tables. ``has_body`` answers
    whether a body is here (the blob store's), ``events`` is the log."""

    def __init__(self, db: PostgresDatabase, projector: PostgresProjector, has_body: Callable[[str], bool],
                 events: EventRecorder) -> None:
        self._conn = db.conn
        self._location = db.location
        self._state = projector.state
        self._read_locally = projector.read_locally
        self._has_body = has_body
        self._events = events

    def run(self, run_id: str) -> RunState:
        """The folded state of ``run_id``; StoreError when the store has no such run."""
        state = self._state(run_id)
        if state is None:
            raise StoreError(f"no run {run_id!r} in the store {self._location}; list runs with `kvjudge runs`")
        return state

    def has_run(self, run_id: str) -> bool:
        if not storable_in_postgres(run_id):
            return False
        return self._conn.execute("SELECT 1 FROM runs WHERE id = %s", (run_id,)).fetchone() is not None

    def run_ids(self, tenant: str | None = None, *, task: str | None = None, state: str | None = None,
                agent: str | None = None) -> list[str]:
        """Run ids, sorted; only those of ``tenant``, on ``task``, in ``state`` and of ``agent`` when given."""
        where = runs_where("%s", storable_in_postgres, tenant=tenant, task=task, state=state, agent=agent)
        if where is None:
            return []
        clause, values = where
        return [row[0] for row in self._conn.execute(f"SELECT id FROM runs{clause} ORDER BY id", values)]

    def iter_runs(self, tenant: str | None = None, **filters: str | None) -> Iterator[RunState]:
        """Folded states one at a time; ``filters`` as :meth:`run_ids`."""
        for run_id in self.run_ids(tenant, **filters):
            yield self.run(run_id)

    def listing(self, tenant: str | None = None, *, task: str | None = None, state: str | None = None,
                agent: str | None = None, counter: str | None = None) -> list[RunListing]:
        """What a listing shows of each run, sorted by id (with its tokens under ``counter`` when named): one
        query, nothing decoded."""
        where = runs_where("%s", storable_in_postgres, tenant=tenant, task=task, state=state, agent=agent)
        if where is None:
            return []
        clause, values = where
        return listings(self._conn.execute(
            f"SELECT {', '.join(LISTING_COLUMNS)}, t.tokens FROM runs "
            f"LEFT JOIN run_tokens AS t ON t.run = runs.id AND t.counter = %s{clause} ORDER BY id", (counter, *values)))

    def state_digests(self, run_ids: Iterable[str]) -> dict[str, str]:
        """sha256 of each run's folded state as stored, by id; runs the store lacks are absent."""
        wanted = [run_id for run_id in dict.fromkeys(run_ids) if storable_in_postgres(run_id)]
        return {run_id: hashlib.sha256(bytes(raw)).hexdigest() for run_id, raw in self._conn.execute(
            "SELECT id, state_json FROM runs WHERE id = ANY(%s)", (wanted,))}

    def projected_bytes(self, run_id: str) -> bytes | None:
        """The projection's canonical bytes for ``run_id`` (what verify compares a re-fold against)."""
        if not storable_in_postgres(run_id):
            return None
        row = self._conn.execute("SELECT state_json FROM runs WHERE id = %s", (run_id,)).fetchone()
        return None if row is None else bytes(row[0])

    def refold(self, run_id: str) -> RunState:
        """Fold one run from LSN 0 straight from the log (ignoring projections)."""
        return refold(self._events, run_id)

    def run_ids_with_tier_status(self, status: str) -> list[str]:
        """Run ids whose projected state has ``tier.status == status``, sorted."""
        return [row[0] for row in self._conn.execute(
            "SELECT id FROM runs WHERE convert_from(state_json, 'UTF8')::jsonb -> 'tier' ->> 'status' = %s "
            "ORDER BY id", (status,))]

    def read_locally(self, ref: str) -> bool:
        """True while the log of some run still says ``ref`` is local there (so its body must stay)."""
        return self._read_locally(ref)

    def explain(self, ref: str) -> Explanation:
        """Whether ``ref``'s body is here, and if not, which event of which run says where it went."""
        rows = self._conn.execute(
            "SELECT run, status, summary_ref, lsn, target, manifest_ref FROM run_bodies WHERE ref = %s "
            "ORDER BY lsn, run", (ref,)).fetchall()
        return explanation(ref, rows, self._has_body(ref), self._events.event_kind)

    # ------------------------------------------------------------------ tiering
    def local_body_bytes(self, run_id: str) -> int:
        """Bytes of the bodies of ``run_id`` the log says are local (what a move would upload)."""
        row = self._conn.execute(
            "SELECT COALESCE(SUM(b.size), 0) FROM run_bodies AS r JOIN blobs AS b ON b.ref = r.ref "
            "WHERE r.run = %s AND r.status = %s", (run_id, LOCAL)).fetchone()
        return int(row[0]) if row else 0

    def tiered_bodies_here(self, run_id: str) -> list[str]:
        """Refs the log of ``run_id`` says are tiered whose bodies are still stored here (a move to finish)."""
        return [row[0] for row in self._conn.execute(
            "SELECT r.ref FROM run_bodies AS r JOIN blobs AS b ON b.ref = r.ref "
            "WHERE r.run = %s AND r.status = %s AND b.body IS NOT NULL", (run_id, TIERED))]

    def runs_with_tiered_bodies_here(self) -> list[str]:
        """Runs holding a body here that their log says is tiered, sorted."""
        return [row[0] for row in self._conn.execute(
            "SELECT DISTINCT r.run FROM run_bodies AS r JOIN blobs AS b ON b.ref = r.ref "
            "WHERE r.status = %s AND b.body IS NOT NULL ORDER BY r.run", (TIERED,))]

    # ------------------------------------------------------------------- verify
    def unnamed_bodies(self) -> int:
        """Stored bodies no run names (e.g. summaries put before a crash)."""
        row = self._conn.execute(
            "SELECT COUNT(*) FROM blobs AS b WHERE b.body IS NOT NULL "
            "AND NOT EXISTS (SELECT 1 FROM run_bodies AS r WHERE r.ref = b.ref)").fetchone()
        return int(row[0]) if row else 0
