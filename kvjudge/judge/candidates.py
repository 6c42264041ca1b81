"""Which runs compete for each task in best-of-N selection, in what order, and what the selection baselines read.

A task's candidates are every run of the store on that task (several trials of one agent, or the runs of several
agents pooled; ``agent`` narrows them to one agent's), in the **task's order**: trial order (numbers numerically,
:func:`kvjudge.judge.pairing.trial_order`; a run without a trial first), then run id. "The first run" of a
task is the first in this order and "the last" the last.

Per candidate: its best held-out grade and whether it **passed** (grade score ≥ ``pass_score``; None without a
grade), the characters of its view as the judge would read it (``length``: the longest-run baseline), and the exit
code of its last test command (``test_exit``: the last tool call on the live branch whose command runs tests, as
:func:`kvjudge.retention.evidence.find_evidence` finds it; None when it ran none or no exit code was recorded: the
last-exit-0 baseline). The last two are kept under each run's state digest
(:class:`~kvjudge.judge.runfacts.RunFacts`): a second selection folds no run.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kvjudge.judge.pairing import trial_order
from kvjudge.judge.render import body_resolver, render_parts
from kvjudge.judge.runfacts import RunFacts
from kvjudge.judge.verdict import VIEW_MODULES, code_digest
from kvjudge.retention.evidence import find_evidence
from kvjudge.retention.state import RunState, agent_of, best_grade

if TYPE_CHECKING:
    from kvjudge.retention import Store

DEFAULT_PASS_SCORE = 1.0


@dataclass(frozen=True)
class Candidate:
    """One run competing for its task."""

    run_id: str
    task: str
    agent: str
    trial: str | None
    grade: float | None
    passed: bool | None
    length: int | None = None
    test_exit: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {"run": self.run_id, "agent": self.agent, "trial": self.trial, "grade": self.grade,
                "passed": self.passed, "length": self.length, "test_exit": self.test_exit}


def task_order(run: Any) -> tuple[Any, ...]:
    """Sort key of a run within its task: trial order, then run id."""
    return (trial_order(run.trial), run.id)


def grouped(runs: Iterable[Any], *, task: str | None = None, agent: str | None = None) -> dict[str, list[Any]]:
    """Runs (folded states or listings) by task, each task's in the task's order, tasks sorted; runs without a task
    are left out."""
    by_task: dict[str, list[Any]] = {}
    for run in runs:
        if run.task_id is None or (task is not None and run.task_id != task):
            continue
        if agent is not None and agent_of(run) != agent:
            continue
        by_task.setdefault(run.task_id, []).append(run)
    return {name: sorted(by_task[name], key=task_order) for name in sorted(by_task)}


def passed(run: Any, pass_score: float = DEFAULT_PASS_SCORE) -> tuple[float | None, bool | None]:
    """The run's best grade score and whether it reaches ``pass_score`` (None, None without a grade)."""
    grade = best_grade(run)
    if grade is None:
        return None, None
    score = float(grade["score"])
    return score, score >= pass_score


def selection_inputs(store: Store, run_ids: Iterable[str], state: Callable[[str], RunState], *,
                     use_cache: bool = True) -> dict[str, dict[str, Any]]:
    """Per run id: ``length`` (characters of its view, everything held out hidden) and ``test_exit`` (the exit code
    of its last test command), kept under the run's state digest."""
    def compute(folded: RunState) -> tuple[dict[str, Any], bool]:
        parts = render_parts(folded, body_resolver(folded, store.blobs.text))
        evidence = find_evidence(folded, store.blobs.text)
        test_exit = evidence.verification.exit_code if evidence.verification is not None else None
        return {"length": len(parts.text), "test_exit": test_exit}, not parts.missing

    facts = RunFacts("selection_inputs", compute, code_digest((*VIEW_MODULES, __name__)))
    return facts.of(store, run_ids, state, use_cache=use_cache)


def task_candidates(store: Store, *, task: str | None = None, agent: str | None = None,
                    pass_score: float = DEFAULT_PASS_SCORE, use_cache: bool = True,
                    states: dict[str, RunState] | None = None) -> dict[str, list[Candidate]]:
    """Every task of the store (or ``task``) → its candidates in the task's order (:func:`grouped` of the store's
    listing: nothing decoded but what :func:`selection_inputs` has not kept). ``states``: folded runs by id, the
    runs folded here added to it."""
    folded = states if states is not None else {}

    def run(run_id: str) -> RunState:
        if run_id not in folded:
            folded[run_id] = store.runs.run(run_id)
        return folded[run_id]

    by_task = grouped(store.runs.listing(task=task), task=task, agent=agent)
    inputs = selection_inputs(store, (r.id for runs in by_task.values() for r in runs), run, use_cache=use_cache)
    return {name: [Candidate(r.id, name, agent_of(r), r.trial, *passed(r, pass_score), inputs[r.id]["length"],
                             inputs[r.id]["test_exit"]) for r in runs]
            for name, runs in by_task.items()}


def candidate_ids(candidates: Mapping[str, Sequence[Candidate]]) -> dict[str, list[str]]:
    """Task → its candidates' run ids (what :func:`kvjudge.judge.select.select` takes)."""
    return {name: [c.run_id for c in runs] for name, runs in candidates.items()}
