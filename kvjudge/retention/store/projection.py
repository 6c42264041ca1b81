"""The projection on SQLite: each run's folded state, kept in ``runs``, ``run_bodies`` and ``run_tokens`` as a
cache of the log — written here, read through :mod:`.queries`.

It is written only where events are appended (in the same transaction), and derived only by folding the log:
dropping the tables and folding again from LSN 0 gives byte-identical states. Beside the state itself a run's
row keeps what a listing shows (agent, task, trial, state, grades, counts of branches, transitions and bodies),
and ``run_bodies`` how often a reader of the run sees each body (``uses``), so a listing and a run's token count
are read in SQL without decoding a run.
"""

from __future__ import annotations

from kvjudge.retention.state import LOCAL, RunState
from kvjudge.retention.store.database import REFS_PER_QUERY, Database
from kvjudge.retention.store.interfaces import EventRecorder
from kvjudge.retention.store.projection_rows import body_rows, refold, run_row, storable
from kvjudge.retention.store.schema import PROJECTION_SQL, statements


class Projector:
    """Keeps the projection tables in step with the log: the recorder writes each run's new state here, in the
    transaction that appends its events; the token-count cache, the totals its new counts complete."""

    def __init__(self, db: Database) -> None:
        self._conn = db.conn
        self._transaction = db.transaction

    def state(self, run_id: str) -> RunState | None:
        """The committed state of ``run_id`` (None: no such run)."""
        if not storable(run_id):
            return None
        row = self._conn.execute("SELECT state_json FROM runs WHERE id = ?", (run_id,)).fetchone()
        return None if row is None else RunState.from_bytes(row[0])

    def read_locally(self, ref: str) -> bool:
        """True while the log of some run still says ``ref`` is local there (so its body must stay)."""
        return self._conn.execute(
            "SELECT 1 FROM run_bodies WHERE ref = ? AND status = ? LIMIT 1", (ref, LOCAL)).fetchone() is not None

    def project(self, state: RunState, last_lsn: int) -> None:
        """Write ``state`` (folded up to ``last_lsn``) as its run's projection. Inside the caller's transaction."""
        self._conn.execute(
            "INSERT OR REPLACE INTO runs(id, tenant, state, reduced, last_lsn, state_json, agent, task, trial, grades, "
            "branches, transitions, bodies, bodies_gone, bodies_tiered) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, "
            "?, ?)", run_row(state, last_lsn))
        self._conn.execute("DELETE FROM run_bodies WHERE run = ?", (state.id,))
        self._conn.executemany(
            "INSERT INTO run_bodies(run, ref, status, summary_ref, lsn, target, manifest_ref, uses) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?)", body_rows(state))
        self._conn.execute("DELETE FROM run_tokens WHERE run = ?", (state.id,))
        self._total(state.id)

    def _total(self, run_id: str, counter: str | None = None) -> None:
        """Record the tokens of ``run_id`` under each counter (or ``counter``) that has counted every body the run
        shows — the sum of their counts, repeats included; a counter that counted none of its bodies has none.
        A total never changes until the run's view does (counts of immutable bytes do not)."""
        only, values = ("", ()) if counter is None else (" AND t.counter = ?", (counter,))
        self._conn.execute(
            "INSERT OR IGNORE INTO run_tokens(run, counter, tokens) "
            "SELECT b.run, t.counter, SUM(b.uses * t.tokens) FROM run_bodies AS b "
            f"JOIN blob_tokens AS t ON t.ref = b.ref WHERE b.run = ?{only} GROUP BY t.counter "
            "HAVING SUM(b.uses > 0) = (SELECT COUNT(*) FROM run_bodies WHERE run = ? AND uses > 0)",
            (run_id, *values, run_id))

    def total_runs_naming(self, refs: list[str], counter: str) -> None:
        """Record the totals under ``counter`` that new counts of ``refs`` may have completed. Inside the caller's
        transaction."""
        for start in range(0, len(refs), REFS_PER_QUERY):
            chunk = refs[start:start + REFS_PER_QUERY]
            marks = ",".join("?" * len(chunk))
            runs = [row[0] for row in self._conn.execute(
                f"SELECT DISTINCT run FROM run_bodies WHERE ref IN ({marks}) AND run NOT IN "
                "(SELECT run FROM run_tokens WHERE counter = ?)", (*chunk, counter))]
            for run_id in runs:
                self._total(run_id, counter)

    def rebuild(self, events: EventRecorder) -> int:
        """Drop and re-create the projection tables, re-folding every run of ``events`` from LSN 0. Returns runs
        folded."""
        with self._transaction("rebuild"):
            self._conn.execute("DROP TABLE IF EXISTS runs")
            self._conn.execute("DROP TABLE IF EXISTS run_bodies")
            self._conn.execute("DROP TABLE IF EXISTS run_tokens")
            for statement in statements(PROJECTION_SQL):
                self._conn.execute(statement)
            count = 0
            for run_id in events.logged_runs():
                self.project(refold(events, run_id), events.event_range(run_id)[1])
                count += 1
        return count

    def reproject(self) -> int:
        """Write every run's projection again from the state it holds (after a migration adds columns; the state
        itself is unchanged). Returns runs written."""
        with self._transaction("reproject"):
            rows = self._conn.execute("SELECT state_json, last_lsn FROM runs ORDER BY id").fetchall()
            for state_json, last_lsn in rows:
                self.project(RunState.from_bytes(state_json), int(last_lsn))
        return len(rows)
