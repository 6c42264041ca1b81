"""The projection: each run's folded state, kept in ``runs`` and ``run_bodies`` as a cache of the log.

It is written only where events are appended (in the same transaction), and derived only by folding the log:
dropping the tables and folding again from LSN 0 gives byte-identical states. Beside the state itself a run's
row keeps what a listing shows (agent, task, trial, state, grades, counts of branches, transitions and bodies),
and ``run_bodies`` how often a reader of the run sees each body (``uses``), so a listing and a run's token count
are read in SQL without decoding a run.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from kvjudge.errors import StoreError
from kvjudge.retention import events as ev
from kvjudge.retention.events import canonical_json
from kvjudge.retention.lifecycle import check_state_name
from kvjudge.retention.state import (
    DROPPED,
    LOCAL,
    REDUCED,
    TIERED,
    BodyLocation,
    RunState,
    agent_of,
    fold,
    view_refs,
)
from kvjudge.retention.store.database import REFS_PER_QUERY, storable
from kvjudge.retention.store.log import EventLog
from kvjudge.retention.store.schema import PROJECTION_SQL, statements


@dataclass(frozen=True)
class Explanation:
    """What the log says about a ref: whether its body is here and, if not, which event says why.

    ``status`` is ``local`` when any run still reads the body here, else the status the log gives
    (``reduced``, ``dropped``, ``tiered``), or ``unknown`` when no run names the ref.
    """

    ref: str
    body_present: bool
    status: str
    summary_ref: str | None
    run: str | None
    lsn: int | None
    event: str | None  # kind of the explaining event ("Reduced", "Dropped", "Tiered", …)
    target: str | None
    locations: tuple[tuple[str, BodyLocation], ...]

    @property
    def explained(self) -> bool:
        """True when the body is here or the log says where it went."""
        return self.body_present or self.status in (REDUCED, DROPPED, TIERED)

    def to_dict(self) -> dict[str, Any]:
        return {"ref": self.ref, "body_present": self.body_present, "status": self.status,
                "summary_ref": self.summary_ref, "run": self.run, "lsn": self.lsn, "event": self.event,
                "target": self.target, "explained": self.explained}


class Projection(EventLog):
    """Reading runs from the projection, and keeping it in step with the log."""

    def _projected(self, run_id: str) -> RunState | None:
        if not storable(run_id):
            return None
        row = self._conn.execute("SELECT state_json FROM runs WHERE id = ?", (run_id,)).fetchone()
        return None if row is None else RunState.from_bytes(row[0])

    def _project(self, state: RunState, last_lsn: int) -> None:
        statuses = Counter(loc.status for loc in state.bodies.values())
        self._conn.execute(
            "INSERT OR REPLACE INTO runs(id, tenant, state, reduced, last_lsn, state_json, agent, task, trial, grades, "
            "branches, transitions, bodies, bodies_gone, bodies_tiered) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, "
            "?, ?)",
            (state.id, state.tenant, state.state, int(state.reduced), last_lsn, state.canonical_bytes(),
             agent_of(state), state.task_id, state.trial, canonical_json(list(state.grades)), len(state.branches),
             sum(len(branch.transitions) for branch in state.branches), len(state.bodies),
             statuses[REDUCED] + statuses[DROPPED], statuses[TIERED]))
        self._conn.execute("DELETE FROM run_bodies WHERE run = ?", (state.id,))
        uses = Counter(view_refs(state))
        self._conn.executemany(
            "INSERT INTO run_bodies(run, ref, status, summary_ref, lsn, target, manifest_ref, uses) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            [(state.id, loc.ref, loc.status, loc.summary_ref, loc.lsn, loc.target, loc.manifest_ref, uses[loc.ref])
             for loc in state.bodies.values()])
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

    def _total_runs_naming(self, refs: list[str], counter: str) -> None:
        """Record the totals under ``counter`` that new counts of ``refs`` may have completed."""
        for start in range(0, len(refs), REFS_PER_QUERY):
            chunk = refs[start:start + REFS_PER_QUERY]
            marks = ",".join("?" * len(chunk))
            runs = [row[0] for row in self._conn.execute(
                f"SELECT DISTINCT run FROM run_bodies WHERE ref IN ({marks}) AND run NOT IN "
                "(SELECT run FROM run_tokens WHERE counter = ?)", (*chunk, counter))]
            for run_id in runs:
                self._total(run_id, counter)

    def refold(self, run_id: str) -> RunState:
        """Fold one run from LSN 0 straight from the log (ignoring projections)."""
        states = fold(self.iter_events(run_id))
        if run_id not in states:
            raise StoreError(f"no run {run_id!r} in the store; list runs with `kvjudge runs`")
        return states[run_id]

    def rebuild_projection(self) -> int:
        """Drop and re-create the projection tables, re-folding every run from LSN 0. Returns runs folded."""
        with self.transaction("rebuild"):
            self._conn.execute("DROP TABLE IF EXISTS runs")
            self._conn.execute("DROP TABLE IF EXISTS run_bodies")
            self._conn.execute("DROP TABLE IF EXISTS run_tokens")
            for statement in statements(PROJECTION_SQL):
                self._conn.execute(statement)
            count = 0
            for run_id in self.logged_runs():
                self._project(self.refold(run_id), self.event_range(run_id)[1])
                count += 1
        return count

    def reproject(self) -> int:
        """Write every run's projection again from the state it holds (after a migration adds columns; the state
        itself is unchanged). Returns runs written."""
        with self.transaction("reproject"):
            rows = self._conn.execute("SELECT state_json, last_lsn FROM runs ORDER BY id").fetchall()
            for state_json, last_lsn in rows:
                self._project(RunState.from_bytes(state_json), int(last_lsn))
        return len(rows)

    def projected_bytes(self, run_id: str) -> bytes | None:
        """The projection's canonical bytes for ``run_id`` (what verify compares a re-fold against)."""
        row = self._conn.execute("SELECT state_json FROM runs WHERE id = ?", (run_id,)).fetchone()
        return None if row is None else bytes(row[0])

    def run(self, run_id: str) -> RunState:
        """The folded state of ``run_id``; StoreError when the store has no such run."""
        state = self._projected(run_id)
        if state is None:
            raise StoreError(f"no run {run_id!r} in the store {self.path}; list runs with `kvjudge runs`")
        return state

    def state_digests(self, run_ids: Iterable[str]) -> dict[str, str]:
        """sha256 of each run's folded state as stored (its canonical bytes), by id; runs the store lacks are
        absent. Equal digests are equal states, and any event that changes a run changes its digest: what is
        derived from a state alone may be kept under it (nothing is decoded here)."""
        wanted = [run_id for run_id in dict.fromkeys(run_ids) if storable(run_id)]
        digests: dict[str, str] = {}
        for start in range(0, len(wanted), REFS_PER_QUERY):
            chunk = wanted[start:start + REFS_PER_QUERY]
            marks = ",".join("?" * len(chunk))
            for run_id, raw in self._conn.execute(f"SELECT id, state_json FROM runs WHERE id IN ({marks})", chunk):
                digests[run_id] = hashlib.sha256(raw).hexdigest()
        return digests

    def has_run(self, run_id: str) -> bool:
        if not storable(run_id):
            return False
        return self._conn.execute("SELECT 1 FROM runs WHERE id = ?", (run_id,)).fetchone() is not None

    def run_ids(self, tenant: str | None = None, *, task: str | None = None, state: str | None = None,
                agent: str | None = None) -> list[str]:
        """Run ids, sorted; only those of ``tenant``, on ``task`` (its id), in lifecycle ``state`` and of ``agent``
        (as :func:`~kvjudge.retention.state.agent_of` names it) when given (read in SQL, no run decoded)."""
        where = runs_where(tenant=tenant, task=task, state=state, agent=agent)
        if where is None:
            return []
        clause, values = where
        return [row[0] for row in self._conn.execute(f"SELECT id FROM runs{clause} ORDER BY id", values)]

    def run_ids_with_tier_status(self, status: str) -> list[str]:
        """Run ids whose projected state has ``tier.status == status``, sorted (read in SQL, no run decoded)."""
        return [row[0] for row in self._conn.execute(
            "SELECT id FROM runs WHERE json_extract(CAST(state_json AS TEXT), '$.tier.status') = ? ORDER BY id",
            (status,))]

    def iter_runs(self, tenant: str | None = None, **filters: str | None) -> Iterator[RunState]:
        """Folded states one at a time (never the whole store in memory); ``filters`` as :meth:`run_ids`."""
        for run_id in self.run_ids(tenant, **filters):
            yield self.run(run_id)

    def mark(self, run_id: str, state: str) -> RunState:
        """Append a lifecycle step; RunStateError when it is not a legal one."""
        new = check_state_name(state)
        self.append(run_id, ev.StateChanged(run=run_id, state=new), label="mark")
        return self.run(run_id)

    def read_locally(self, ref: str) -> bool:
        """True while the log of some run still says ``ref`` is local there (so its body must stay)."""
        return self._conn.execute(
            "SELECT 1 FROM run_bodies WHERE ref = ? AND status = ? LIMIT 1", (ref, LOCAL)).fetchone() is not None

    def explain(self, ref: str) -> Explanation:
        """Whether ``ref``'s body is here, and if not, which event of which run says where it went."""
        rows = self._conn.execute(
            "SELECT run, status, summary_ref, lsn, target, manifest_ref FROM run_bodies WHERE ref = ? ORDER BY lsn, run",
            (ref,)).fetchall()
        locations = tuple((run, BodyLocation(ref=ref, status=status, summary_ref=summary, lsn=int(lsn), target=target,
                                             manifest_ref=manifest))
                          for run, status, summary, lsn, target, manifest in rows)
        present = self.blobs.has_body(ref)
        if not locations:
            return Explanation(ref, present, "unknown", None, None, None, None, None, ())
        local = [item for item in locations if item[1].status == LOCAL]
        # A body any run still reads here is "local"; otherwise the latest fact about it explains it.
        run, loc = local[0] if local else locations[-1]
        kind = None if loc.status == LOCAL else self.event_kind(loc.lsn)
        return Explanation(ref=ref, body_present=present, status=loc.status, summary_ref=loc.summary_ref, run=run,
                           lsn=loc.lsn, event=kind, target=loc.target, locations=locations)


def runs_where(**filters: str | None) -> tuple[str, list[str]] | None:
    """A WHERE clause on the ``runs`` columns named by ``filters`` (those not None) and its values; None when a
    value is one no run can have (see :func:`~kvjudge.retention.store.database.storable`)."""
    where, values = [], []
    for column, value in filters.items():
        if value is not None:
            if not storable(value):
                return None
            where.append(f"{column} = ?")
            values.append(value)
    return (f" WHERE {' AND '.join(where)}" if where else "", values)
