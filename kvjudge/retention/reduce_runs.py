"""Reducing a selection of runs (``kvjudge reduce``): each to its tenant's target, with what stayed above it and why."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kvjudge.errors import RunStateError
from kvjudge.retention.plan_ahead import PlanningAhead, RememberedShortTexts
from kvjudge.retention.reduce import ReductionPlan, state_digest
from kvjudge.retention.reduce_apply import (
    ReductionResult,
    RunInColdStorage,
    StalePlan,
    apply_plan,
    plan_stored,
    reduce_run,
)
from kvjudge.retention.shared_job import SharedJob, Sharing
from kvjudge.retention.store import Store
from kvjudge.tokens import BatchCounter, TokenCounter

# What each loss step did, as ReductionPlan.steps names it.
_STEPS = (("bodies_reduced", "bodies reduced to extracts"), ("branches_reduced", "dead branches reduced to extracts"),
          ("dropped", "dead-branch texts dropped"))


def left_above(plan: ReductionPlan) -> str:
    """Why a planned run stays above its target: only the loss steps that were taken are named."""
    taken = [f"{plan.steps.get(key, 0)} {label}" for key, label in _STEPS if plan.steps.get(key, 0)]
    how = f"after every loss step ({', '.join(taken)})" if taken else "and no loss step could shrink it"
    return (f"run {plan.run_id}: {plan.tokens_after} tokens remain above the target {plan.token_target} {how}; "
            "kept: transitions, live-branch markers")


@dataclass(frozen=True)
class RunsReduction:
    """What :func:`reduce_runs` did (or, for a dry run, planned) over a selection of runs.

    ``runs``: each reducible run's outcome (``ReductionPlan.to_dict`` or ``ReductionResult.to_dict``, with its
    ``tenant``; ``in_cold_storage`` for a tiered run left alone); ``above``: every run left above its target, with
    the ``reason`` and the command that would let it reduce (``fix``, or None); ``refused``: runs whose grading has
    not terminated (only with a whole selection: a named run is refused with RunStateError).
    """

    counter: str
    dry_run: bool
    token_targets: Mapping[str, int]
    runs: tuple[dict[str, Any], ...]
    above: tuple[dict[str, Any], ...]
    refused: tuple[dict[str, str], ...]


RunFn = Callable[[str, int, int], None]


def reduce_runs(store: Store, run_ids: Sequence[str] | None, token_target_of: Callable[[str], int],
                counter: TokenCounter | Callable[[], TokenCounter], *, tenant: str | None = None,
                dry_run: bool = False, on_run: RunFn | None = None, sharing: Sharing | None = None) -> RunsReduction:
    """Reduce the runs named (None: every run of the store, or of ``tenant``) to their tenant's target.

    ``token_target_of(tenant)`` is the tenant's token target; every tenant's is asked for before anything is
    counted or written (a ceiling without a probe figure raises there). A named run whose grading has not terminated is
    refused (RunStateError); in a whole selection such runs are listed in ``refused``. With ``dry_run`` each run
    is planned and nothing is written. ``counter`` may be a function that builds it: it is called once the targets
    are known. ``on_run(run_id, done, total)`` hears of each run as it starts.

    A counter that counts batches (a served tokenizer: :class:`~kvjudge.tokens.BatchCounter`) is asked as little
    as it can be, and never waited for while there is writing to do: each run is counted (its bodies in one batch)
    and planned (its cut markers and each round of extracts in one batch) in a background thread while the run before
    is being written; a short text's count is remembered from run to run.

    With ``sharing`` (not a dry run), each run's reduction is a unit of a job other processes started on the store
    share (:mod:`kvjudge.retention.shared_job`): claimed before it is counted or written, released once its last
    step has committed. A reduction is several transactions by design (extract put → ``Reduced`` → original
    deleted), so a unit taken over from a killed worker finds the steps it committed done and finishes the rest. A
    run another worker reduced is reported as it now stands (planned again: nothing left to write).
    """
    chosen = run_ids if run_ids is not None else store.runs.run_ids(tenant)
    candidates = [store.runs.run(run_id) for run_id in chosen]
    refused = [state for state in candidates if not state.is_reducible]
    if run_ids is not None and refused:
        state = refused[0]
        raise RunStateError(f"run {state.id} is {state.state}; only graded, ungraded or archived runs can be "
                            f"reduced (finish grading first: `kvjudge mark {state.id} graded|ungraded`)")
    reducible = [state.id for state in candidates if state.is_reducible]
    tenants = sorted({state.tenant for state in candidates if state.is_reducible})
    token_targets = {name: token_target_of(name) for name in tenants}
    # A unit is a run as this job found it: once its state changes (reduced, graded again) a later job's unit is new.
    found = {state.id: f"{state_digest(state)}:{token_targets[state.tenant]}" for state in candidates
             if state.is_reducible}
    del candidates  # each run is read again as it is reduced (another process may have changed it meanwhile)
    if not isinstance(counter, TokenCounter):
        counter = counter()
    ahead: PlanningAhead | None = None
    if isinstance(counter, BatchCounter):  # a counter that asks servers: no round trip it can spare or overlap
        counter = RememberedShortTexts(counter)
        ahead = PlanningAhead(store, counter, token_targets)
    try:
        if sharing is not None and not dry_run and reducible:
            units = {run_id: f"reduce:{run_id}:{found[run_id]}:{counter.name}" for run_id in reducible}
            with sharing.job("reduce", list(units.values())) as job:
                outcomes, above = _reduce_each(store, reducible, token_targets, counter, ahead, dry_run, on_run,
                                               job, units)
        else:
            outcomes, above = _reduce_each(store, reducible, token_targets, counter, ahead, dry_run, on_run)
    finally:
        if ahead is not None:
            ahead.close()
    return RunsReduction(counter=counter.name, dry_run=dry_run, token_targets=token_targets, runs=tuple(outcomes),
                         above=tuple(above),
                         refused=tuple({"run": state.id, "state": state.state,
                                        "reason": "grading has not terminated (only graded, ungraded, archived reduce)"}
                                       for state in refused))


def _reduce_each(store: Store, reducible: Sequence[str], token_targets: Mapping[str, int], counter: TokenCounter,
                 ahead: PlanningAhead | None, dry_run: bool, on_run: RunFn | None, job: SharedJob | None = None,
                 units: Mapping[str, str] | None = None) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Each run reduced in turn (with ``job``: those this worker claims; then those others held, once done or
    taken over), the outcomes in the order of ``reducible``."""
    done_runs: dict[str, tuple[dict[str, Any], dict[str, Any] | None]] = {}
    left: list[str] = []
    if ahead is not None and reducible:
        ahead.start(reducible[0])
    for done, run_id in enumerate(reducible):
        if on_run is not None:
            on_run(run_id, done, len(reducible))
        planned = None
        if ahead is not None:
            planned = ahead.settle()
            if done + 1 < len(reducible):
                ahead.start(reducible[done + 1])
        if job is not None and units is not None and not job.take(units[run_id]):
            left.append(run_id)  # another worker holds it (or did it): waited for below
            continue
        done_runs[run_id] = _reduce_one(store, run_id, planned, token_targets, counter, dry_run)
        if job is not None and units is not None:
            with store.transaction("finish_claim"):
                job.finish(units[run_id], None, done=True)
    while job is not None and units is not None and left:
        taken, finished = job.wait([units[run_id] for run_id in left])
        for run_id in [r for r in left if units[r] in taken or units[r] in finished]:
            done_runs[run_id] = _reduce_one(store, run_id, None, token_targets, counter, dry_run)
            if units[run_id] in taken:
                with store.transaction("finish_claim"):
                    job.finish(units[run_id], None, done=True)
        left = [r for r in left if units[r] not in taken and units[r] not in finished]
    outcomes = [done_runs[run_id][0] for run_id in reducible]
    above = [item for run_id in reducible if (item := done_runs[run_id][1]) is not None]
    return outcomes, above


def _reduce_one(store: Store, run_id: str, planned: ReductionPlan | None, token_targets: Mapping[str, int],
                counter: TokenCounter, dry_run: bool) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """One run reduced (or planned, ``dry_run``): its outcome, and why it stays above its target (None: it fits)."""
    above = None
    state = store.runs.run(run_id)
    token_target = token_targets[state.tenant]
    try:
        if dry_run:
            if planned is None or planned.base_digest != state_digest(state):
                planned = plan_stored(store, state, token_target, counter)
            plan, outcome = planned, {**planned.to_dict(), "dry_run": True}
        else:
            result = _applied_ahead(store, planned) if planned is not None else None
            if result is None:
                result = reduce_run(store, run_id, token_target, counter)
            plan, outcome = result.plan, result.to_dict()
        if not plan.fits:
            above = {"run": run_id, "tokens": plan.tokens_after, "target": token_target,
                     "reason": left_above(plan), "fix": None}
    except RunInColdStorage as exc:
        outcome = {"run": run_id, "counter": counter.name, "target_tokens": token_target,
                   "tokens_before": exc.tokens, "tokens_after": exc.tokens, "fits": False, "events": 0,
                   "in_cold_storage": True}
        above = {"run": run_id, "tokens": exc.tokens, "target": token_target, "reason": str(exc),
                 "fix": f"kvjudge rehydrate {run_id}"}
    outcome["tenant"] = state.tenant
    return outcome, above


def _applied_ahead(store: Store, plan: ReductionPlan) -> ReductionResult | None:
    """``plan``, made ahead, applied; None when its run changed since (it is then planned again in its turn)."""
    try:
        return apply_plan(store, plan)
    except StalePlan:
        return None
