"""What the claims' implementations share, whatever the database: a job's view from its rows, and a unit's tries as
they are kept (one cost per try, in order)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from kvjudge.retention.store.interfaces import JobView

#: A claim's row as the view reads it: (worker holding it, lease expiry, done, worker that finished it).
ClaimRow = tuple[Any, ...]


def job_view(rows: Mapping[str, ClaimRow], units: Iterable[str], worker: str, now: float) -> JobView:
    """The view of the job of ``units`` from their rows (a unit without one is free) at time ``now``."""
    done = done_here = claimed = mine = total = 0
    workers: set[str] = set()
    for unit in dict.fromkeys(units):
        total += 1
        row = rows.get(unit)
        if row is None:
            continue
        holder, expires, finished, finished_by = row
        if finished:
            done += 1
            done_here += finished_by == worker
        elif holder is not None and expires is not None and expires > now:
            claimed += 1
            mine += holder == worker
            workers.add(holder)
    return JobView(units=total, done=done, done_here=done_here, claimed=claimed, claimed_here=mine,
                   free=total - done - claimed, workers=len(workers))


def with_try(recorded: str | None, cost: Mapping[str, Any] | None) -> str:
    """A unit's tries as kept (JSON: one cost per try), ``cost`` added when given."""
    tries = json.loads(recorded) if recorded else []
    return json.dumps([*tries, dict(cost)] if cost is not None else tries, sort_keys=True)
