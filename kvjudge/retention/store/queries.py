"""Named read queries across the store's tables, for what listing, tiering and verify need to know.

Each answers one question in SQL (no run decoded); the tables stay the store's own business.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from kvjudge.retention.state import LOCAL, TIERED
from kvjudge.retention.store.caches import Caches
from kvjudge.retention.store.projection import runs_where


@dataclass(frozen=True)
class RunListing:
    """What a listing shows of one run, read from the projection (the run's state is not decoded).

    ``agent`` as :func:`~kvjudge.retention.state.agent_of` names it; ``bodies_gone`` counts bodies reduced or
    dropped; ``tokens`` is the run's visible text under the counter asked for, from stored counts only (None:
    not asked, or a body it shows was never counted)."""

    id: str
    tenant: str
    agent: str
    task_id: str | None
    trial: str | None
    state: str
    grades: tuple[dict[str, Any], ...]
    reduced: bool
    branches: int
    transitions: int
    bodies: int
    bodies_gone: int
    bodies_tiered: int
    tokens: int | None = None


class Queries(Caches):
    """Read queries other parts of kvjudge need, named for what they answer."""

    def listing(self, tenant: str | None = None, *, task: str | None = None, state: str | None = None,
                agent: str | None = None, counter: str | None = None) -> list[RunListing]:
        """What a listing shows of each run, sorted by id; filters as :meth:`run_ids`. With ``counter`` (a
        counter's name) each run's tokens under it, as the projection totals them from the counts the store holds:
        one query, nothing counted."""
        where = runs_where(tenant=tenant, task=task, state=state, agent=agent)
        if where is None:
            return []
        clause, values = where
        # From the covering index alone (SQLite's planner would read each run's row, its folded state first).
        rows = self._conn.execute(
            "SELECT id, tenant, agent, task, trial, state, grades, reduced, branches, transitions, bodies, bodies_gone, "
            "bodies_tiered, t.tokens FROM runs INDEXED BY runs_listing "
            "LEFT JOIN run_tokens AS t ON t.run = runs.id AND t.counter = ?"
            f"{clause} ORDER BY id", (counter, *values))
        return [RunListing(id=run_id, tenant=run_tenant, agent=run_agent, task_id=task_id, trial=trial, state=run_state,
                           grades=tuple(json.loads(grades)), reduced=bool(reduced), branches=branches,
                           transitions=transitions, bodies=bodies, bodies_gone=gone, bodies_tiered=tiered,
                           tokens=tokens)
                for (run_id, run_tenant, run_agent, task_id, trial, run_state, grades, reduced, branches, transitions,
                     bodies, gone, tiered, tokens) in rows]

    # ------------------------------------------------------------------ tiering
    def local_body_bytes(self, run_id: str) -> int:
        """Bytes of the bodies of ``run_id`` the log says are local (what a move would upload)."""
        row = self._conn.execute(
            "SELECT COALESCE(SUM(b.size), 0) FROM run_bodies AS r JOIN blobs AS b ON b.ref = r.ref "
            "WHERE r.run = ? AND r.status = ?", (run_id, LOCAL)).fetchone()
        return int(row[0])

    def tiered_bodies_here(self, run_id: str) -> list[str]:
        """Refs the log of ``run_id`` says are tiered whose bodies are still stored here (a move to finish)."""
        return [row[0] for row in self._conn.execute(
            "SELECT r.ref FROM run_bodies AS r JOIN blobs AS b ON b.ref = r.ref "
            "WHERE r.run = ? AND r.status = ? AND typeof(b.body) != 'null'", (run_id, TIERED))]

    def runs_with_tiered_bodies_here(self) -> list[str]:
        """Runs holding a body here that their log says is tiered, sorted."""
        return [row[0] for row in self._conn.execute(
            "SELECT DISTINCT r.run FROM run_bodies AS r JOIN blobs AS b ON b.ref = r.ref "
            "WHERE r.status = ? AND typeof(b.body) != 'null' ORDER BY r.run", (TIERED,))]

    # ------------------------------------------------------------------- verify
    def unnamed_bodies(self) -> int:
        """Stored bodies no run names (e.g. summaries put before a crash)."""
        return int(self._conn.execute(
            "SELECT COUNT(*) FROM blobs WHERE body IS NOT NULL AND ref NOT IN (SELECT ref FROM run_bodies)"
        ).fetchone()[0])
