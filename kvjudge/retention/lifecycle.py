"""The run lifecycle: Running → Grading → Graded | Ungraded → Archived.

Only runs whose grading has terminated (Graded, Ungraded, Archived) may be reduced; everything else is
refused with :class:`~kvjudge.errors.RunStateError`, never skipped.

**Late grades.** Results often arrive after a run was imported and settled as Ungraded. A grade attached then
(``kvjudge grade``: a ``GradeRecorded`` appended to the run's log) takes it one more step, Ungraded → Graded
(:data:`LATE_GRADED`) — legal only directly after that grade, in the same append, so ``kvjudge mark`` cannot
take it: a run becomes graded by getting a grade. A late grade for a Running run takes it through Grading; an
Archived run keeps its state (its grades change, its lifecycle is over). Nothing before the grade is changed.
"""

from __future__ import annotations

from kvjudge.errors import RunStateError, UsageError

RUNNING, GRADING, GRADED, UNGRADED, ARCHIVED = "running", "grading", "graded", "ungraded", "archived"
STATES = (RUNNING, GRADING, GRADED, UNGRADED, ARCHIVED)

#: state → the states a run may move to next.
LEGAL_NEXT: dict[str, frozenset[str]] = {
    RUNNING: frozenset({GRADING}),
    GRADING: frozenset({GRADED, UNGRADED}),
    GRADED: frozenset({ARCHIVED}),
    UNGRADED: frozenset({ARCHIVED}),
    ARCHIVED: frozenset(),
}

REDUCIBLE = frozenset({GRADED, UNGRADED, ARCHIVED})

#: The step a grade that arrives after the run was settled allows: ungraded → graded, directly after the grade.
LATE_GRADED = (UNGRADED, GRADED)


def is_reducible(state: str) -> bool:
    """True only when grading has terminated: Graded, Ungraded or Archived."""
    return state in REDUCIBLE


def check_state_name(state: str) -> str:
    """``state`` lower-cased, or a UsageError naming the valid states."""
    name = state.strip().lower()
    if name not in STATES:
        raise UsageError(f"unknown run state {state!r}; use one of {', '.join(STATES)}")
    return name


def check_transition(run_id: str, current: str, new: str, *, after_grade: bool = False) -> None:
    """Raise RunStateError unless ``current → new`` is a legal lifecycle step (``after_grade``: the step directly
    follows a grade recorded in the same append, which makes :data:`LATE_GRADED` legal too)."""
    if after_grade and (current, new) == LATE_GRADED:
        return
    if new not in LEGAL_NEXT.get(current, frozenset()):
        allowed = ", ".join(sorted(LEGAL_NEXT.get(current, frozenset()))) or "nothing (it is final)"
        late = (" (an ungraded run becomes graded by getting a grade: kvjudge grade RUN --results FILE)"
                if (current, new) == LATE_GRADED else "")
        raise RunStateError(f"run {run_id} is {current}; it cannot become {new} (from {current} it may become "
                            f"{allowed}){late}")


def check_path(states: list[str]) -> None:
    """Check a whole lifecycle list (as ingested): it starts at running and every step is legal."""
    if not states or states[0] != RUNNING:
        raise RunStateError(f"a lifecycle must start with {RUNNING!r}, got {states[:1]!r}")
    for current, new in zip(states, states[1:]):
        if new not in LEGAL_NEXT[current]:
            raise RunStateError(f"lifecycle step {current} → {new} is not allowed")
