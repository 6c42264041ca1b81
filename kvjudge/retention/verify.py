"""Verify a store: every surviving body re-hashes to its ref, every run re-folds byte-identically from
LSN 0, and every missing body is explained by the log.

Re-hashing is the only check that sees a body rewritten under its ref (it still *resolves* fine).
Tiering adds its own checks (e.g. "every Tiered manifest exists remotely") through ``extra_checks``:
callables ``(store, state) -> iterable of Violation`` run once per run, without editing this module.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvjudge.retention import events as ev
from kvjudge.retention.blobs import REF_PREFIX, short
from kvjudge.retention.state import DROPPED, LOCAL, REDUCED, TIERED, RunState
from kvjudge.retention.store import Store


@dataclass(frozen=True)
class Violation:
    """One broken invariant: which check, which run and ref, and what is wrong."""

    check: str  # rehash | refold | explained | summary | log | <extra check name>
    run: str | None
    ref: str | None
    message: str

    def to_dict(self) -> dict[str, Any]:
        return {"check": self.check, "run": self.run, "ref": self.ref, "message": self.message}


#: An extra check: called once per run with the store and the run's folded state.
Check = Callable[[Store, RunState], Iterable[Violation]]


@dataclass
class VerifyReport:
    """The outcome of :func:`verify`; ``ok`` is False when any violation was found."""

    runs: int = 0
    blobs_rehashed: int = 0
    violations: list[Violation] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # not violations: e.g. bodies a crashed reduction left
    #: Bodies a run's log says are reduced or dropped, kept because another run still reads them (not a problem).
    shared_bodies: int = 0

    @property
    def ok(self) -> bool:
        return not self.violations

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "runs": self.runs, "blobs_rehashed": self.blobs_rehashed,
                "violations": [v.to_dict() for v in self.violations], "notes": list(self.notes),
                "shared_bodies": self.shared_bodies}


def _rehash(ref: str, body: bytes) -> Violation | None:
    digest = REF_PREFIX + hashlib.sha256(body).hexdigest()
    if digest != ref:
        return Violation("rehash", None, ref, f"body stored under {ref} hashes to {digest}: it was rewritten")
    return None


def _first_difference(a: bytes, b: bytes) -> int:
    for index, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return index
    return min(len(a), len(b))


def verify(store: Store, run_ids: Sequence[str] | None = None, *, extra_checks: Sequence[Check] = (),
           progress: Callable[[int], None] | None = None) -> VerifyReport:
    """Check ``run_ids`` (all runs when None; then every body in the store is re-hashed too)."""
    report = VerifyReport()
    for name in store.events.missing_log_triggers():
        report.violations.append(Violation("log", None, None, f"trigger {name} is missing: the event log is "
                                                              f"no longer protected against edits"))
    whole_store = run_ids is None
    if run_ids is None:
        # Whole store: stream every body once.
        for ref, body in store.blobs.iter_bodies():
            report.blobs_rehashed += 1
            if (violation := _rehash(ref, body)) is not None:
                report.violations.append(violation)
        # A copied store keeps tier manifests as bodies no run's state names (see kvjudge.retention.store_copy).
        manifests = {event.manifest_ref for _, event in store.events.iter_events(kind=ev.TierStarted.kind)
                     if isinstance(event, ev.TierStarted)}
        orphans = store.runs.unnamed_bodies() - sum(store.blobs.has_body(ref) for ref in manifests)
        if orphans:
            report.notes.append(f"{orphans} stored bodies are named by no run (e.g. summaries put before a crash); "
                                f"harmless")
        run_ids = store.events.logged_runs()
    shared: set[str] = set()
    for run_id in run_ids:
        # A whole-store check has re-hashed every body already; a per-run check re-hashes the run's bodies.
        _verify_run(store, run_id, report, shared, rehash_bodies=not whole_store, extra_checks=extra_checks)
        report.runs += 1
        if progress is not None:
            progress(1)
    report.shared_bodies = len(shared)
    return report


def _verify_run(store: Store, run_id: str, report: VerifyReport, shared: set[str], *, rehash_bodies: bool,
                extra_checks: Sequence[Check]) -> None:
    refolded = store.runs.refold(run_id)  # from LSN 0, straight from the log
    projected = store.runs.projected_bytes(run_id)
    fresh = refolded.canonical_bytes()
    if projected is None:
        report.violations.append(Violation("refold", run_id, None, "the log has this run but the projection does "
                                                                   "not; rebuild it (reopen the store)"))
    elif projected != fresh:
        report.violations.append(Violation(
            "refold", run_id, None,
            f"re-folding from LSN 0 differs from the stored state at byte {_first_difference(projected, fresh)}"))
    state = refolded
    pending = 0
    for ref, location in state.bodies.items():
        body = store.blobs.get(ref)
        if body is not None and rehash_bodies:
            report.blobs_rehashed += 1
            if (violation := _rehash(ref, body)) is not None:
                report.violations.append(Violation("rehash", run_id, ref, violation.message))
        if location.status == LOCAL and body is None:
            report.violations.append(Violation(
                "explained", run_id, ref, f"body of {short(ref)} is missing and no Reduced, Dropped or Tiered event "
                                          f"explains it"))
        elif location.status in (REDUCED, DROPPED) and body is not None:
            # Content-addressed bodies are shared: one another run still reads here is kept on purpose. Only a
            # body no run reads any more is a deletion a reduction left unfinished, noted once: for the run
            # whose event came last (the reduction that stopped).
            explanation = store.runs.explain(ref)
            if explanation.status == LOCAL:
                shared.add(ref)
            elif explanation.run == run_id and explanation.status in (REDUCED, DROPPED):
                pending += 1
        if location.status == REDUCED:
            summary = location.summary_ref
            summary_location = state.bodies.get(summary) if summary else None
            if summary_location is None:
                report.violations.append(Violation("summary", run_id, ref, f"{short(ref)} is reduced to "
                                                                           f"{summary}, which the run does not name"))
            elif summary_location.status == LOCAL and not store.blobs.has_body(summary):
                report.violations.append(Violation("summary", run_id, ref, f"summary {short(summary)} of "
                                                                           f"{short(ref)} does not resolve"))
        if location.status == TIERED and not location.target:
            report.violations.append(Violation("explained", run_id, ref, f"{short(ref)} is tiered to no target"))
    if pending:
        report.notes.append(f"run {run_id}: {pending} bodies the log says are gone are still stored (a reduction "
                            f"stopped before deleting them); run `kvjudge reduce {run_id}` to finish")
    for check in extra_checks:
        report.violations.extend(check(store, state))
