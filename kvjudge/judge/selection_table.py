"""What a best-of-N pick is worth: pass@pick beside the simple ways to pick, over tasks whose runs are all graded.

For the tasks with two or more candidates, every one graded (a task with an ungraded run is picked but left out
of the table, counted in ``note``; a task with one run has nothing to choose and is left out too), each row is a
way of picking one run per task, with how many tasks its pick passed, that share and its Wilson 95 % interval:

- ``pick`` — the strategy's pick (pass@pick);
- ``random`` — a uniformly random pick: its expected pass rate, the mean over tasks of the share of the task's runs
  that passed (its interval: Wilson's over those fractional passes);
- ``first run`` — the first candidate in the task's order; ``longest run`` — the run with the longest view (ties:
  the earliest); ``last exit 0`` — the last candidate whose last test command exited 0 (none did: the last
  candidate);
- ``oracle`` — the task passes if any run does.

``gap_closed`` of a row is (row − random) / (oracle − random): 0 is no better than chance, 1 is the oracle (None
when the oracle is no better than chance). Beside them: the judge readings (comparisons) and prompt tokens spent per
task on the tasks with a choice, and the figures per N (the candidates per task).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from kvjudge.judge.candidates import Candidate
from kvjudge.judge.metrics import wilson
from kvjudge.judge.select import Pick, comparisons_bound

PICK, RANDOM, FIRST, LONGEST, LAST_EXIT_ZERO, ORACLE = ("pick", "random", "first run", "longest run", "last exit 0",
                                                        "oracle")
ROWS = (PICK, RANDOM, FIRST, LONGEST, LAST_EXIT_ZERO, ORACLE)


def longest(candidates: Sequence[Candidate]) -> Candidate:
    """The candidate with the longest view, the earliest of equals (unknown lengths count as none)."""
    most = max(c.length if c.length is not None else -1 for c in candidates)
    return next(c for c in candidates if (c.length if c.length is not None else -1) == most)


def last_exit_zero(candidates: Sequence[Candidate]) -> Candidate:
    """The last candidate whose last test command exited 0; the last candidate when none did."""
    return next((c for c in reversed(candidates) if c.test_exit == 0), candidates[-1])


def _baselines(candidates: Sequence[Candidate], picked: str) -> dict[str, float]:
    """Each row's pass (1.0, 0.0, or random's expected share) on one task whose candidates are all graded."""
    passes = [float(bool(c.passed)) for c in candidates]
    by_id = {c.run_id: c for c in candidates}
    return {PICK: float(bool(by_id[picked].passed)), RANDOM: sum(passes) / len(passes),
            FIRST: passes[0], LONGEST: float(bool(longest(candidates).passed)),
            LAST_EXIT_ZERO: float(bool(last_exit_zero(candidates).passed)), ORACLE: max(passes)}


def _gap(value: float | None, random: float | None, oracle: float | None) -> float | None:
    if value is None or random is None or oracle is None or oracle - random <= 1e-12:
        return None
    return (value - random) / (oracle - random)


def _rows(outcomes: Sequence[Mapping[str, float]]) -> list[dict[str, Any]]:
    n = len(outcomes)
    totals = {name: sum(o[name] for o in outcomes) for name in ROWS}
    rate: Callable[[str], float | None] = lambda name: totals[name] / n if n else None  # noqa: E731
    return [{"name": name, "tasks": n, "passed": totals[name], "rate": rate(name), "ci95": wilson(totals[name], n),
             "gap_closed": _gap(rate(name), rate(RANDOM), rate(ORACLE))} for name in ROWS]


def _spent(picks: Sequence[Pick]) -> dict[str, Any]:
    chosen = [p for p in picks if p.chosen]
    if not chosen:
        return {"tasks": 0, "comparisons": 0, "per_task_mean": None, "per_task_max": None, "bound_max": None,
                "errors": 0, "tokens": 0, "tokens_per_task": None}
    counts = [p.comparisons for p in chosen]
    return {"tasks": len(chosen), "comparisons": sum(counts), "per_task_mean": sum(counts) / len(chosen),
            "per_task_max": max(counts),
            "bound_max": max(comparisons_bound(p.strategy, len(p.candidates)) for p in chosen),
            "errors": sum(p.errors for p in chosen), "tokens": sum(p.tokens for p in chosen),
            "tokens_per_task": sum(p.tokens for p in chosen) / len(chosen)}


def selection_table(picks: Sequence[Pick], candidates: Mapping[str, Sequence[Candidate]]) -> dict[str, Any]:
    """The table of ``picks`` (one per task, :func:`kvjudge.judge.select.select`), their candidates by task."""
    single = [p for p in picks if not p.chosen]
    chosen = [p for p in picks if p.chosen]
    graded = [p for p in chosen if all(c.passed is not None for c in candidates[p.task])]
    ungraded = len(chosen) - len(graded)
    outcomes = {p.task: _baselines(candidates[p.task], p.picked) for p in graded}
    by_n: dict[int, list[str]] = {}
    for p in graded:
        by_n.setdefault(len(p.candidates), []).append(p.task)
    notes = []
    if single:
        notes.append(f"{len(single)} task(s) with one run: nothing to choose")
    if ungraded:
        notes.append(f"{ungraded} task(s) with an ungraded run: picked, left out of the table")
    rows = _rows(list(outcomes.values()))
    return {
        "strategy": picks[0].strategy if picks else None,
        "tasks": len(picks), "chosen": len(chosen), "nothing_to_choose": len(single), "ungraded": ungraded,
        "in_table": len(graded), "candidates_per_task": {str(n): c for n, c in
                                                         sorted(Counter(len(p.candidates) for p in picks).items())},
        "rows": rows, "pass_at_pick": rows[0]["rate"], "gap_closed": rows[0]["gap_closed"],
        "by_n": {str(n): {row["name"]: row["rate"] for row in _rows([outcomes[t] for t in tasks])} | {"tasks": len(tasks)}
                 for n, tasks in sorted(by_n.items())},
        "spent": _spent(picks),
        "note": "; ".join(notes) or None,
    }


def pick_record(pick: Pick, candidates: Sequence[Candidate]) -> dict[str, Any]:
    """One task's line of the picks file: the pick as :meth:`Pick.to_json` says it, ``passed`` (the picked run's;
    None without a grade) and per candidate what the table reads of it beside its score and wins."""
    by_id = {c.run_id: c for c in candidates}
    picked = by_id.get(pick.picked)
    return {**pick.to_json(), "passed": None if picked is None else picked.passed,
            "candidates": [{**by_id[run].to_json(), "score": pick.scores.get(run), "wins": pick.wins.get(run),
                            "picked": run == pick.picked} if run in by_id else {"run": run}
                           for run in pick.candidates]}


def selection_result(picks: Sequence[Pick], candidates: Mapping[str, Sequence[Candidate]], *, strategy: str,
                     pass_score: float, judge: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Everything one selection says (``kvjudge select --json``'s object, the best-of-N section's input): how it
    picked (``rule``), the table, and every task's :func:`pick_record`. ``judge``: the judge's manifest."""
    from kvjudge import __version__
    from kvjudge.judge.select import describe

    return {"strategy": strategy, "rule": describe(strategy), "pass_score": pass_score, "judge": dict(judge or {}),
            "kvjudge_version": __version__, "table": selection_table(picks, candidates),
            "picks": [pick_record(p, candidates[p.task]) for p in picks]}
