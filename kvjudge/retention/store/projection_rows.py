"""What the projection holds, whatever database holds it: a run's folded state as the values of its ``runs`` row and
its ``run_bodies`` rows, the fold of one run from LSN 0, and the names no run can have. The SQLite and PostgreSQL
projections write these same values, so both stores fold the same runs to the same bytes."""

from __future__ import annotations

from collections import Counter
from typing import Any

from kvjudge.errors import StoreError
from kvjudge.retention.events import canonical_json
from kvjudge.retention.state import DROPPED, REDUCED, TIERED, RunState, agent_of, fold, view_refs
from kvjudge.retention.store.interfaces import EventRecorder

#: The ``runs`` columns, in the order of :func:`run_row`.
RUN_COLUMNS = ("id", "tenant", "state", "reduced", "last_lsn", "state_json", "agent", "task", "trial", "grades",
               "branches", "transitions", "bodies", "bodies_gone", "bodies_tiered")
#: The ``run_bodies`` columns, in the order of :func:`body_rows`.
BODY_COLUMNS = ("run", "ref", "status", "summary_ref", "lsn", "target", "manifest_ref", "uses")


def run_row(state: RunState, last_lsn: int) -> tuple[Any, ...]:
    """The ``runs`` row of ``state`` folded up to ``last_lsn`` (its listing's columns beside the state itself)."""
    statuses = Counter(loc.status for loc in state.bodies.values())
    return (state.id, state.tenant, state.state, int(state.reduced), last_lsn, state.canonical_bytes(),
            agent_of(state), state.task_id, state.trial, canonical_json(list(state.grades)), len(state.branches),
            sum(len(branch.transitions) for branch in state.branches), len(state.bodies),
            statuses[REDUCED] + statuses[DROPPED], statuses[TIERED])


def body_rows(state: RunState) -> list[tuple[Any, ...]]:
    """The ``run_bodies`` rows of ``state``: where each body is, and how often a reader of the run sees it."""
    uses = Counter(view_refs(state))
    return [(state.id, loc.ref, loc.status, loc.summary_ref, loc.lsn, loc.target, loc.manifest_ref, uses[loc.ref])
            for loc in state.bodies.values()]


def refold(events: EventRecorder, run_id: str) -> RunState:
    """Fold one run from LSN 0 straight from the log (ignoring the projection)."""
    states = fold(events.iter_events(run_id))
    if run_id not in states:
        raise StoreError(f"no run {run_id!r} in the store; list runs with `kvjudge runs`")
    return states[run_id]


def storable(name: str) -> bool:
    """False for a name no store can hold (not valid Unicode, e.g. a stray byte on a command line, which Python
    hands over as a lone surrogate; or a NUL, which PostgreSQL's text refuses): it names no run, rather than
    raising an encoding error."""
    if "\x00" in name:
        return False
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def runs_where(mark: str = "?", **filters: str | None) -> tuple[str, list[str]] | None:
    """A WHERE clause on the ``runs`` columns named by ``filters`` (those not None), with ``mark`` for each bound
    value (``?`` for SQLite, ``%s`` for PostgreSQL), and its values; None when a value is one no run can have."""
    where, values = [], []
    for column, value in filters.items():
        if value is not None:
            if not storable(value):
                return None
            where.append(f"{column} = {mark}")
            values.append(value)
    return (f" WHERE {' AND '.join(where)}" if where else "", values)
