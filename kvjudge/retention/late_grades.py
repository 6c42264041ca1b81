"""Grades that arrive after the import (``kvjudge grade``): evaluation results joined to stored runs and appended to
their logs as new facts.

The results are read as ``ingest --results`` reads them (:mod:`kvjudge.retention.ingest.results`: SWE-bench
reports, OpenHands evaluation output, and whatever shapes that module reads), and each stored run takes the
grade that names it — its exact run id first, else its agent and task id. What was imported is never changed:
the grade is a ``GradeRecorded`` appended after the run's other events, so ``RunStarted.content_hash`` still
names the content as imported and the same import run again still finds its runs already present.

Per run, decided inside one ``BEGIN IMMEDIATE`` transaction on the committed state, before anything is
written:

- the run holds this grade already → unchanged (``kvjudge grade`` run again changes nothing);
- the run holds no grade → the grade is appended, and the lifecycle moves on to graded (an ungraded run may:
  see :mod:`kvjudge.retention.lifecycle`; a running run goes through grading; an archived run stays archived);
- the run holds another grade → a conflict: the whole command is refused and nothing is written, unless
  ``replace``: then ``GradeRecorded{grade, replaces: [the grades it held]}`` — the old grades stay in the log,
  the fold drops them from the run's grades;
- no result names the run, or its evaluation errored → left alone (counted).

One run named that has no task, and results holding exactly one result, for another run id (a Harbor trial's
``result.json`` for a trajectory imported alone, whose run is named by its ATIF session: nothing in ATIF links it
to the trial or the task) → that result grades the run named (``bound`` in the report), unless the store holds the
run it names.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvjudge.errors import IngestError, RunStateError
from kvjudge.retention import events as ev
from kvjudge.retention.events import canonical_json
from kvjudge.retention.ingest.results import ResultsIndex, load_results
from kvjudge.retention.lifecycle import ARCHIVED, GRADED, GRADING, RUNNING
from kvjudge.retention.state import RunState
from kvjudge.retention.store import Store

LABEL = "grade"  # the transaction's fault point is grade.txn


@dataclass
class GradeReport:
    """What ``kvjudge grade`` did (or, refused, would have done: nothing)."""

    store: str
    graded: list[dict[str, Any]] = field(default_factory=list)  # {"run", "grade", "state"}: graded now
    replaced: list[dict[str, Any]] = field(default_factory=list)  # {"run", "grade", "replaces", "state"}
    unchanged: list[str] = field(default_factory=list)  # held this grade already
    no_result: list[str] = field(default_factory=list)  # no result names them (or their evaluation errored)
    results: list[dict[str, Any]] = field(default_factory=list)  # per results file: whose runs, how many graded
    unmatched_results: list[dict[str, str]] = field(default_factory=list)  # {"instance", "results"}
    evaluation_errors: int = 0
    bound: dict[str, str] | None = None  # {"run", "result_for", "results"}: one result bound to the run named

    def to_dict(self) -> dict[str, Any]:
        return {"store": self.store, "graded": self.graded, "replaced": self.replaced, "unchanged": self.unchanged,
                "no_result": self.no_result, "counts": {"graded": len(self.graded), "replaced": len(self.replaced),
                                                        "unchanged": len(self.unchanged),
                                                        "no_result": len(self.no_result)},
                "results": self.results, "unmatched_results": self.unmatched_results,
                "evaluation_errors": self.evaluation_errors, "bound": self.bound}


def attach_grades(store: Store, results: Sequence[str], run_ids: Sequence[str] | None = None, *,
                  tenant: str | None = None, trial: str | None = None, replace: bool = False) -> GradeReport:
    """Attach the grades ``results`` (``[AGENT=]FILE`` values, as ``--results``) give to the runs ``run_ids``
    (None: every run, or ``tenant``'s, or those of trial ``trial``); the module docstring says how. Raises before
    writing anything: an unknown run (StoreError), unreadable or ambiguous results (IngestError), a conflicting
    grade without ``replace`` (RunStateError)."""
    if not results:
        raise IngestError("no results to attach; pass --results [AGENT=]FILE (repeatable)")
    index = ResultsIndex(load_results(results))  # read before the write lock is taken
    report = GradeReport(store=store.location)
    with store.transaction(LABEL):
        states = [store.runs.run(run_id) for run_id in dict.fromkeys(run_ids)] if run_ids is not None \
            else [state for state in store.runs.iter_runs(tenant) if trial is None or state.trial == trial]
        index.bind_agents(state.agent for state in states if state.agent)
        plans = [(state, index.grade_for(state.agent, state.task_id, state.id, state.trial)) for state in states]
        if run_ids is not None and len(plans) == 1 and plans[0][1] is None and plans[0][0].task_id is None:
            plans = [(plans[0][0], _bind_sole_result(store, index, plans[0][0], report))]
        ambiguous = index.ambiguities()
        if ambiguous:
            more = f" (and {len(ambiguous) - 1} more)" if len(ambiguous) > 1 else ""
            raise IngestError(ambiguous[0] + more + "; nothing was graded")
        conflicts = [(state, grade) for state, grade in plans
                     if grade is not None and state.grades and grade not in state.grades]
        if conflicts and not replace:
            state, grade = conflicts[0]
            more = f" (and {len(conflicts) - 1} more run(s))" if len(conflicts) > 1 else ""
            raise RunStateError(f"run {state.id} is graded {_grades(state.grades)} and these results say "
                                f"{canonical_json(grade)}{more}; nothing was written (--replace records the new "
                                f"grade in place of the old one; the old one stays in the run's log)")
        for state, grade in plans:
            _apply(store, report, state, grade)
    report.results = index.bindings()
    report.unmatched_results = [{"instance": name, "results": path} for name, path in index.unmatched()]
    report.evaluation_errors = index.evaluation_errors()
    return report


def _bind_sole_result(store: Store, index: ResultsIndex, state: RunState, report: GradeReport) -> dict[str, Any] | None:
    """The grade of the one result ``index`` holds, for the one run named (see the module docstring), or None."""
    sole = index.sole_run_result()
    if sole is None:
        return None
    file, run_id = sole
    path = index.files[file].path
    if store.runs.has_run(run_id):
        raise IngestError(f"--results {path}: is the result of run {run_id}, which the store holds; grade that run "
                          f"(kvjudge grade {run_id} --results {path}); nothing was graded")
    report.bound = {"run": state.id, "result_for": run_id, "results": str(path)}
    return index.take(file, run_id)


def _apply(store: Store, report: GradeReport, state: RunState, grade: dict[str, Any] | None) -> None:
    if grade is None:
        report.no_result.append(state.id)
        return
    if grade in state.grades:
        report.unchanged.append(state.id)
        return
    events = _events(state, grade)
    store.events.append_many(state.id, events, label=LABEL)
    entry = {"run": state.id, "grade": grade, "state": store.runs.run(state.id).state}
    if state.grades:
        report.replaced.append({**entry, "replaces": list(state.grades)})
    else:
        report.graded.append(entry)


def _events(state: RunState, grade: dict[str, Any]) -> list[ev.Event]:
    """The events that attach ``grade`` to ``state``: the grade (replacing what it holds), and the lifecycle
    steps to graded a run that is not graded (nor archived) yet takes."""
    out: list[ev.Event] = []
    if state.state == RUNNING:
        out.append(ev.StateChanged(run=state.id, state=GRADING))
    out.append(ev.GradeRecorded(run=state.id, grade=grade, replaces=list(state.grades) or None))
    if state.state not in (GRADED, ARCHIVED):
        out.append(ev.StateChanged(run=state.id, state=GRADED))
    return out


def _grades(grades: Iterable[dict[str, Any]]) -> str:
    return ", ".join(canonical_json(grade) for grade in grades)
