"""What an append checks and folds, whatever database holds the log: each event against the state the run is in
(the events before it in the same batch included), and the run's new state, folded with the LSNs the log gave."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from kvjudge.errors import IntegrityError, StoreError, UsageError
from kvjudge.retention import events as ev
from kvjudge.retention.blobs import short
from kvjudge.retention.events import canonical_json
from kvjudge.retention.lifecycle import check_transition
from kvjudge.retention.state import DROPPED, LOCAL, RunFolder, RunState


def fold_appended(run_id: str, current: RunState | None, events: Sequence[ev.Event], lsns: Sequence[int],
                  has_body: Callable[[str], bool]) -> RunFolder | None:
    """The run's state after ``events`` (appended at ``lsns``), each checked against the state the ones before it
    left (StoreError, IntegrityError or UsageError: nothing is to be written). ``current``: the committed state
    (None: no such run yet); ``has_body`` says whether a summary an event names is stored."""
    folder = RunFolder.thaw(current) if current is not None else None
    previous: ev.Event | None = None
    for lsn, event in zip(lsns, events, strict=True):
        if event.run != run_id:
            raise UsageError(f"event for run {event.run!r} appended to run {run_id!r}")
        check_event(run_id, folder, event, has_body, after_grade=isinstance(previous, ev.GradeRecorded))
        previous = event
        if folder is None:
            folder = RunFolder(id=run_id)
        folder.apply(lsn, event)
    return folder


def check_event(run_id: str, folder: RunFolder | None, event: ev.Event, has_body: Callable[[str], bool], *,
                after_grade: bool) -> None:
    """Refuse ``event`` when the run's state (``folder``; None: no such run) does not allow it."""
    if isinstance(event, ev.RunStarted):
        if folder is not None:
            raise StoreError(f"run {run_id} already exists in the store")
        return
    if folder is None:
        raise StoreError(f"no run {run_id!r} in the store; list runs with `kvjudge runs`")
    if isinstance(event, ev.TransitionRecorded):  # first: most of a run's events
        if event.branch not in folder.branches:
            raise StoreError(f"run {run_id} has no branch {event.branch!r}")
    elif isinstance(event, ev.StateChanged):
        check_transition(run_id, folder.state, event.state, after_grade=after_grade)
    elif isinstance(event, ev.GradeRecorded):
        missing = [grade for grade in event.replaces or () if grade not in folder.grades]
        if missing:
            raise StoreError(f"run {run_id}: a grade replaces {canonical_json(missing[0])}, which the run does "
                             f"not hold")
    elif isinstance(event, ev.BranchOpened):
        if event.branch in folder.branches:
            raise StoreError(f"run {run_id} already has a branch {event.branch!r}")
    elif isinstance(event, ev.Reduced):
        location = folder.bodies.get(event.original)
        if location is None or location.status != LOCAL:
            status = location.status if location else "not named by the run"
            raise StoreError(f"run {run_id}: cannot reduce {short(event.original)}, it is {status}")
        _require_body(has_body, event.summary, "Reduced")
    elif isinstance(event, ev.BranchReduced):
        entry = folder.branches.get(event.branch)
        if entry is None or entry["branch"].status != "dead":
            raise StoreError(f"run {run_id}: only a dead branch can be read as one extract, not {event.branch!r}")
        _require_body(has_body, event.summary, "BranchReduced")
    elif isinstance(event, ev.Dropped):
        location = folder.bodies.get(event.original)
        if location is None or location.status == DROPPED:
            status = location.status if location else "not named by the run"
            raise StoreError(f"run {run_id}: cannot drop {short(event.original)}, it is {status}")


def _require_body(has_body: Callable[[str], bool], ref: str, kind: str) -> None:
    # The summary must be durable before the event that points readers at it.
    if not has_body(ref):
        raise IntegrityError(f"{kind} names summary {short(ref)} whose body is not stored; put it first")
