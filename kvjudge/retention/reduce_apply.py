"""Applying a reduction plan to a store, in three durable steps, each committed before the next starts:

    put summary blobs → commit Reduced / BranchReduced / Dropped events → delete the original bodies

A crash anywhere leaves either an unreferenced summary blob (harmless; the re-run puts the same bytes under the
same ref) or a body the log already explains (the re-run deletes it). Never a missing body the log does not
explain. Also here: planning a stored run (:func:`plan_stored`) and reducing one (:func:`reduce_run`).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from kvjudge.errors import IntegrityError, RunStateError
from kvjudge.retention.faults import fault_point
from kvjudge.retention.reduce import ReductionPlan, plan_reduction, state_digest
from kvjudge.retention.state import DROPPED, REDUCED, RunState
from kvjudge.retention.store import Store
from kvjudge.retention.stored_tokens import StoredTexts, count_ahead, run_tokens
from kvjudge.tokens import BatchCounter, TokenCounter


@dataclass(frozen=True)
class ReductionResult:
    """What :func:`apply_plan` did."""

    plan: ReductionPlan
    appended: int  # events committed
    blobs_put: int
    bodies_deleted: int

    def to_dict(self) -> dict[str, Any]:
        return {**self.plan.to_dict(), "appended": self.appended, "blobs_put": self.blobs_put,
                "bodies_deleted": self.bodies_deleted, "reduced": self.plan.state_after.reduced}


class StalePlan(RunStateError):
    """The run changed (another process reduced or tiered it) since the plan was made: plan again."""


class RunInColdStorage(RunStateError):
    """The run's bodies are in cold storage (or on their way there): reduction reads local bodies only, so the
    run must be rehydrated first. Carries the run's visible ``tokens`` and the ``token_target`` it is above."""

    def __init__(self, state: RunState, tokens: int, token_target: int) -> None:
        tier = state.tier or {}
        where = "are in cold storage" if tier.get("status") == "tiered" else "are being moved to cold storage"
        super().__init__(f"run {state.id}: {tokens} tokens, above the target {token_target}; its bodies {where} at "
                         f"{tier.get('target')} — run `kvjudge rehydrate {state.id}`, then reduce it")
        self.run_id, self.tokens, self.token_target = state.id, tokens, token_target


def in_cold_storage(state: RunState) -> bool:
    """True when a move of the run's bodies to cold storage has started or finished (and no rehydrate since)."""
    return bool(state.tier) and state.tier["status"] in ("started", "tiered")  # type: ignore[index]


def _check_applicable(store: Store, plan: ReductionPlan, *, unchanged_only: bool = False) -> None:
    """Raise unless ``plan`` applies to the run's committed state; ``unchanged_only``: only check that the run is
    still the state it was planned from. The stored state's bytes are hashed as they are (they are its canonical
    bytes, as written); parsed and hashed again only when they differ."""
    raw = store.runs.projected_bytes(plan.run_id)
    if raw is None:
        store.runs.run(plan.run_id)  # raises: no such run
    assert raw is not None
    unchanged = hashlib.sha256(raw).hexdigest() == plan.base_digest
    if unchanged and unchanged_only:
        return
    state = RunState.from_bytes(raw)
    unchanged = unchanged or state_digest(state) == plan.base_digest
    if not state.is_reducible:
        raise RunStateError(f"run {state.id} is {state.state}; only graded, ungraded or archived runs can be reduced")
    if not unchanged:
        raise StalePlan(f"run {plan.run_id} changed since this reduction was planned; plan it again")
    if plan.events and in_cold_storage(state):
        raise RunInColdStorage(state, plan.tokens_before, plan.token_target)


def apply_plan(store: Store, plan: ReductionPlan) -> ReductionResult:
    """Execute ``plan`` on ``store``: put summaries → commit events → delete bodies, each durable first.

    Also finishes a crashed earlier reduction: a body the log already explains is deleted here. Whether the
    events commit is decided inside their own write transaction, on the committed state: a plan made from a
    state the run no longer has (another process reduced or tiered it meanwhile) raises :class:`StalePlan`,
    and nothing of it is appended.
    """
    _check_applicable(store, plan, unchanged_only=True)  # early: no summaries put for a plan already stale
    put = 0
    if plan.blobs or plan.new_counts:
        # Not waited for on disk: the commit of the events below syncs the log, and these pages are before them in
        # it; lost at a power cut before that, the summaries were named by nothing and the counts are redone.
        with store.transaction("put_summary", durable=False):
            for text in plan.blobs.values():
                store.blobs.put(text.encode("utf-8"))
                put += 1
            store.caches.put_counts(plan.counter, plan.new_counts)
        if plan.blobs:
            fault_point("after_put_summary")
    appended = 0
    if plan.events:
        with store.transaction("commit_reduction"):
            _check_applicable(store, plan)
            appended = len(store.events.append_many(plan.run_id, list(plan.events), label="commit_reduction"))
        fault_point("after_commit_reduction")
    # The run's statuses as just committed (a later change by another process can only reduce, drop or tier more).
    deleted = finish_deletions(store, plan.run_id, plan.state_after)
    return ReductionResult(plan=plan, appended=appended, blobs_put=put, bodies_deleted=deleted)


def finish_deletions(store: Store, run_id: str, state: RunState | None = None) -> int:
    """Delete every local body the run's log says is reduced or dropped (and no other run reads). Idempotent.
    ``state``: the run's state when the caller has just read or committed it (else it is read here)."""
    state = state if state is not None else store.runs.run(run_id)
    pending = [ref for ref, loc in state.bodies.items()
               if loc.status in (REDUCED, DROPPED) and store.blobs.has_body(ref)]
    if not pending:
        return 0
    deleted = store.blobs.release(pending, label="delete_body", durable=False)
    fault_point("after_delete_body")
    return len(deleted)


def plan_stored(store: StoredTexts, state: RunState, token_target: int, counter: TokenCounter) -> ReductionPlan:
    """:func:`plan_reduction` of a stored run (its texts, its stored counts).

    A run in cold storage is never planned from its cold bodies: RunInColdStorage when it is above
    ``token_target`` (counted from stored counts, reading through the store's fallback only for bodies never
    counted), else the no-op plan.
    """
    if in_cold_storage(state):
        tokens = run_tokens(store, state, counter)
        if tokens > token_target:
            raise RunInColdStorage(state, tokens, token_target)
    if isinstance(counter, BatchCounter):  # the run's bodies counted in one batch, not one request each
        count_ahead(store, state, counter)
    counts = store.caches.cached_counts(state.bodies.keys(), counter.name)  # planning recounts nothing counted
    return plan_reduction(state, store.blobs.text, counter, token_target, counts=counts)


def reduce_run(store: Store, run_id: str, token_target: int, counter: TokenCounter, *,
               attempts: int = 5) -> ReductionResult:
    """Plan and apply the reduction of one run (a no-op when it already fits; resumes a crashed one).

    When another process changes the run between planning and committing, the reduction is planned again from
    the new state (up to ``attempts`` times). A run in cold storage above the target is refused
    (:class:`RunInColdStorage`: ``kvjudge rehydrate`` it first); the deletions a crashed reduction left are
    finished first all the same.
    """
    for _ in range(attempts):
        state = store.runs.run(run_id)
        try:
            plan = plan_stored(store, state, token_target, counter)
        except RunInColdStorage:
            finish_deletions(store, run_id)
            raise
        except IntegrityError:
            if state_digest(store.runs.run(run_id)) != state_digest(state):
                continue  # a body went with another process's reduction while this one read it: plan again
            raise
        try:
            return apply_plan(store, plan)
        except StalePlan:
            continue
    raise RunStateError(f"run {run_id} changed {attempts} times while its reduction was planned; run `kvjudge "
                        f"reduce {run_id}` again")


