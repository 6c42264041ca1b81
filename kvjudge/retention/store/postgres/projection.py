"""The projection on PostgreSQL: each run's folded state, kept in ``runs``, ``run_bodies`` and ``run_tokens`` as a
cache of the log — the same rows as the SQLite store's (:mod:`..projection_rows`), upserted where events are
appended (in the same transaction), read through :mod:`.queries`. Dropping the tables and folding again from LSN 0
gives byte-identical states."""

from __future__ import annotations

from kvjudge.retention.state import LOCAL, RunState
from kvjudge.retention.store.interfaces import EventRecorder
from kvjudge.retention.store.postgres.database import PostgresDatabase
from kvjudge.retention.store.postgres.schema import PROJECTION_SQL
from kvjudge.retention.store.projection_rows import RUN_COLUMNS, body_rows, refold, run_row, storable

def storable_in_postgres(name: str) -> bool:
    """False for a name no PostgreSQL store can hold: not valid Unicode, or holding a NUL (which text refuses)."""
    return storable(name) and "\x00" not in name


_UPSERT_RUN = (f"INSERT INTO runs({', '.join(RUN_COLUMNS)}) VALUES ({', '.join(['%s'] * len(RUN_COLUMNS))}) "
               f"ON CONFLICT (id) DO UPDATE SET "
               + ", ".join(f"{column} = excluded.{column}" for column in RUN_COLUMNS[1:]))


class PostgresProjector:
    """Keeps the projection tables in step with the log: the recorder writes each run's new state here, in the
    transaction that appends its events; the token-count cache, the totals its new counts complete."""

    def __init__(self, db: PostgresDatabase) -> None:
        self._conn = db.conn
        self._transaction = db.transaction

    def state(self, run_id: str) -> RunState | None:
        """The committed state of ``run_id`` (None: no such run)."""
        if not storable_in_postgres(run_id):
            return None
        row = self._conn.execute("SELECT state_json FROM runs WHERE id = %s", (run_id,)).fetchone()
        return None if row is None else RunState.from_bytes(bytes(row[0]))

    def read_locally(self, ref: str) -> bool:
        """True while the log of some run still says ``ref`` is local there (so its body must stay)."""
        return self._conn.execute("SELECT 1 FROM run_bodies WHERE ref = %s AND status = %s LIMIT 1",
                                  (ref, LOCAL)).fetchone() is not None

    def project(self, state: RunState, last_lsn: int) -> None:
        """Write ``state`` (folded up to ``last_lsn``) as its run's projection. Inside the caller's transaction."""
        self._conn.execute(_UPSERT_RUN, run_row(state, last_lsn))
        self._conn.execute("DELETE FROM run_bodies WHERE run = %s", (state.id,))
        rows = body_rows(state)
        if rows:
            columns = list(zip(*rows))  # one array per column, unnested in one statement
            self._conn.execute(
                "INSERT INTO run_bodies(run, ref, status, summary_ref, lsn, target, manifest_ref, uses) "
                "SELECT * FROM unnest(%s::text[], %s::text[], %s::text[], %s::text[], %s::bigint[], %s::text[], "
                "%s::text[], %s::int[])", [list(column) for column in columns])
        self._conn.execute("DELETE FROM run_tokens WHERE run = %s", (state.id,))
        self._total(state.id)

    def _total(self, run_id: str, counter: str | None = None) -> None:
        """Record the tokens of ``run_id`` under each counter (or ``counter``) that has counted every body the run
        shows — the sum of their counts, repeats included (as the SQLite projection does)."""
        only, values = ("", ()) if counter is None else (" AND t.counter = %s", (counter,))
        self._conn.execute(
            "INSERT INTO run_tokens(run, counter, tokens) "
            "SELECT b.run, t.counter, SUM(b.uses * t.tokens)::bigint FROM run_bodies AS b "
            f"JOIN blob_tokens AS t ON t.ref = b.ref WHERE b.run = %s{only} GROUP BY b.run, t.counter "
            "HAVING COUNT(*) FILTER (WHERE b.uses > 0) = (SELECT COUNT(*) FROM run_bodies WHERE run = %s AND uses > 0) "
            "ON CONFLICT DO NOTHING", (run_id, *values, run_id))

    def total_runs_naming(self, refs: list[str], counter: str) -> None:
        """Record the totals under ``counter`` that new counts of ``refs`` may have completed. Inside the caller's
        transaction."""
        runs = [row[0] for row in self._conn.execute(
            "SELECT DISTINCT run FROM run_bodies WHERE ref = ANY(%s) AND run NOT IN "
            "(SELECT run FROM run_tokens WHERE counter = %s)", (refs, counter))]
        for run_id in runs:
            self._total(run_id, counter)

    def rebuild(self, events: EventRecorder) -> int:
        """Drop and re-create the projection tables, re-folding every run of ``events`` from LSN 0. Returns runs
        folded."""
        with self._transaction("rebuild"):
            self._conn.execute("DROP TABLE IF EXISTS runs, run_bodies, run_tokens")
            self._conn.execute(PROJECTION_SQL)
            count = 0
            for run_id in events.logged_runs():
                self.project(refold(events, run_id), events.event_range(run_id)[1])
                count += 1
        return count

    def reproject(self) -> int:
        """Write every run's projection again from the state it holds. Returns runs written."""
        with self._transaction("reproject"):
            rows = self._conn.execute("SELECT state_json, last_lsn FROM runs ORDER BY id").fetchall()
            for state_json, last_lsn in rows:
                self.project(RunState.from_bytes(bytes(state_json)), int(last_lsn))
        return len(rows)
