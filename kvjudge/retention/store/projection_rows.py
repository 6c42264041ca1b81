"""What the projection holds, whatever database holds it: a run's folded state as the values of its ``runs`` row and
its ``run_bodies`` rows, the fold of one run from LSN 0, the names no run can have, and what the run queries make of
the rows they read (a listing, an explanation). The SQLite and PostgreSQL projections write and read these same
values, so both stores fold the same runs to the same bytes and answer the same."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

from kvjudge.errors import StoreError
from kvjudge.retention.events import canonical_json
from kvjudge.retention.state import DROPPED, LOCAL, REDUCED, TIERED, BodyLocation, RunState, agent_of, fold, view_refs
from kvjudge.retention.store.interfaces import EventRecorder, Explanation, RunListing

#: The ``runs`` columns, in the order of :func:`run_row`.
RUN_COLUMNS = ("id", "tenant", "state", "reduced", "last_lsn", "state_json", "agent", "task", "trial", "grades",
               "branches", "transitions", "bodies", "bodies_gone", "bodies_tiered")
#: The listing's columns (the ``runs`` columns a listing shows), in the order of :func:`listings`, before the tokens.
LISTING_COLUMNS = ("id", "tenant", "agent", "task", "trial", "state", "grades", "reduced", "branches", "transitions",
                   "bodies", "bodies_gone", "bodies_tiered")
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
    hands over as a lone surrogate): it names no run, rather than raising UnicodeEncodeError. (PostgreSQL's text
    also refuses a NUL: :func:`~kvjudge.retention.store.postgres.projection.storable_in_postgres`.)"""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def runs_where(mark: str = "?", can_hold: Callable[[str], bool] = storable,
               **filters: str | None) -> tuple[str, list[str]] | None:
    """A WHERE clause on the ``runs`` columns named by ``filters`` (those not None), with ``mark`` for each bound
    value (``?`` for SQLite, ``%s`` for PostgreSQL), and its values; None when a value is one no run can have (one
    the store ``can_hold`` not)."""
    where, values = [], []
    for column, value in filters.items():
        if value is not None:
            if not can_hold(value):
                return None
            where.append(f"{column} = {mark}")
            values.append(value)
    return (f" WHERE {' AND '.join(where)}" if where else "", values)


def listings(rows: Iterable[tuple[Any, ...]]) -> list[RunListing]:
    """What a listing shows, from rows of :data:`LISTING_COLUMNS` followed by the run's tokens (or None)."""
    return [RunListing(id=run_id, tenant=tenant, agent=agent, task_id=task_id, trial=trial, state=state,
                       grades=tuple(json.loads(grades)), reduced=bool(reduced), branches=branches,
                       transitions=transitions, bodies=bodies, bodies_gone=gone, bodies_tiered=tiered,
                       tokens=None if tokens is None else int(tokens))
            for (run_id, tenant, agent, task_id, trial, state, grades, reduced, branches, transitions, bodies, gone,
                 tiered, tokens) in rows]


def explanation(ref: str, rows: Iterable[tuple[Any, ...]], present: bool,
                event_kind: Callable[[int], str | None]) -> Explanation:
    """Whether ``ref``'s body is here (``present``), and if not, which event says where it went: from its
    ``run_bodies`` rows (run, status, summary_ref, lsn, target, manifest_ref) in LSN order."""
    locations = tuple((run, BodyLocation(ref=ref, status=status, summary_ref=summary, lsn=int(lsn), target=target,
                                         manifest_ref=manifest))
                      for run, status, summary, lsn, target, manifest in rows)
    if not locations:
        return Explanation(ref, present, "unknown", None, None, None, None, None, ())
    local = [item for item in locations if item[1].status == LOCAL]
    # A body any run still reads here is "local"; otherwise the latest fact about it explains it.
    run, loc = local[0] if local else locations[-1]
    kind = None if loc.status == LOCAL else event_kind(loc.lsn)
    return Explanation(ref=ref, body_present=present, status=loc.status, summary_ref=loc.summary_ref, run=run,
                       lsn=loc.lsn, event=kind, target=loc.target, locations=locations)
