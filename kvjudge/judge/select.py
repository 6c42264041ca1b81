"""Best of N: pick one run per task from its candidates, by a judge's pointwise scores or pairwise comparisons.

A task's **candidates** are its runs in the task's order: trial order (numbers numerically), then run id
(:func:`kvjudge.judge.candidates.task_candidates`). A task with one run has **nothing to choose**: it is listed,
that run is its pick, and no judge is asked. The judge is reached through two small interfaces
(:mod:`kvjudge.judge.comparators`): a :class:`~kvjudge.judge.comparators.Scorer` (``score_runs(run_ids)`` → a score
per run, None for an error) and a :class:`~kvjudge.judge.comparators.Comparator` (``compare(pairs)`` → per pair the
probability that the run named first is better, None for an error). None is never read as a score.

Strategies, and the judge readings each asks for per task of N candidates (``comparisons``):

- ``pointwise`` — every candidate scored once: N readings. The pick has the highest score; a candidate whose
  score is an error cannot be picked unless every score is one.
- ``tournament`` — a knockout: each round pairs the surviving candidates in the task's order (1st v 2nd, 3rd v
  4th, …; an odd one out advances unjudged), the winner of each match advances, and the last survivor is the pick.
  Exactly N − 1 comparisons in ⌈log₂ N⌉ rounds (≤ N·k for every k ≥ 1). A match is won by the run the judge gives
  more than 0.5; a comparison with no preference (0.5: a tie or an inconsistent verdict) or an error goes to the
  tie rule. The rounds of every task are asked together (one ``compare`` call per round), so a judge pool works
  on all tasks at once.
- ``all-pairs`` — every pair once, N(N − 1)/2 comparisons in one round, and a Bradley–Terry fit inside the task
  (:func:`kvjudge.judge.ranking.bradley_terry`; each comparison a game whose score is the probability given to the
  first run, errors left out). The pick has the highest strength. (In a complete round robin the fitted order is
  the order of the candidates' summed scores; the strengths are what the output shows.)

**Tie rule** (all strategies): of candidates equal on what decides (scores equal, strengths within
:data:`STRENGTH_TIE`, a match without a preference), the one earliest in the task's order wins. Each pick says
what decided it (``reason``) and carries the scores, wins and matches that did.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvjudge.errors import JudgeError, UsageError
from kvjudge.judge.comparators import Comparator, Reading, Scorer, reading
from kvjudge.judge.ranking import Game, bradley_terry

POINTWISE, TOURNAMENT, ALL_PAIRS = "pointwise", "tournament", "all-pairs"
STRATEGIES = (POINTWISE, TOURNAMENT, ALL_PAIRS)
PAIRWISE = (TOURNAMENT, ALL_PAIRS)
DEFAULT_STRATEGY = TOURNAMENT
# Bradley–Terry strengths closer than this are equal (the fit is numerical: equal scores give strengths a few
# 1e-9 apart, which must not decide a pick).
STRENGTH_TIE = 1e-4
NOTHING_TO_CHOOSE = "nothing to choose"


def comparisons_bound(strategy: str, n: int) -> int:
    """The judge readings ``strategy`` asks for on a task of ``n`` candidates (0 for one candidate)."""
    if n < 2:
        return 0
    return {POINTWISE: n, TOURNAMENT: n - 1, ALL_PAIRS: n * (n - 1) // 2}[strategy]


@dataclass(frozen=True)
class Match:
    """One comparison of a task: ``p_first`` the probability given to ``first`` (None: an error); ``winner`` as the
    strategy read it (a knockout's match; None in all-pairs, where every comparison is a game)."""

    first: str
    second: str
    p_first: float | None
    round: int
    tokens: int = 0
    winner: str | None = None
    note: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"first": self.first, "second": self.second, "p_first": self.p_first, "round": self.round,
                "winner": self.winner, "tokens": self.tokens, "note": self.note}


@dataclass(frozen=True)
class Pick:
    """One task's selection: the candidates (in the task's order), the run picked, and what decided it.

    ``scores``: per candidate its pointwise score, its Bradley–Terry strength, or its knockout wins; ``wins``: per
    candidate the sum of the probabilities it was given in its comparisons (pairwise strategies);
    ``comparisons``: the judge readings made (pairs compared, or runs scored); ``errors``: those that were errors;
    ``tokens``: prompt tokens those readings cost (as the judge reports them)."""

    task: str
    candidates: tuple[str, ...]
    picked: str
    strategy: str
    reason: str
    scores: dict[str, float | None] = field(default_factory=dict)
    wins: dict[str, float] = field(default_factory=dict)
    matches: tuple[Match, ...] = ()
    comparisons: int = 0
    errors: int = 0
    tokens: int = 0

    @property
    def chosen(self) -> bool:
        """A choice was made (the task had two or more candidates)."""
        return len(self.candidates) > 1

    def to_json(self) -> dict[str, Any]:
        return {"task": self.task, "picked": self.picked, "strategy": self.strategy, "n": len(self.candidates),
                "status": "picked" if self.chosen else NOTHING_TO_CHOOSE, "reason": self.reason,
                "candidates": list(self.candidates), "scores": self.scores, "wins": self.wins,
                "comparisons": self.comparisons, "errors": self.errors, "tokens": self.tokens,
                "matches": [m.to_json() for m in self.matches]}


# A strategy for one task: a generator that yields what it asks the judge (pairs, or run ids to score), receives
# the readings in that order, and returns the task's Pick.
Plan = Generator[list[Any], list[Reading], Pick]


def _first_best(candidates: Sequence[str], value: Callable[[str], float | None], close: float = 0.0) -> str:
    """The candidate with the highest value, the earliest of those within ``close`` of it (the tie rule); None
    values only when every value is None (then the earliest)."""
    known = [(run, v) for run in candidates if (v := value(run)) is not None]
    if not known:
        return candidates[0]
    best = max(v for _, v in known)
    return next(run for run, v in known if v >= best - close)


def _pointwise(task: str, candidates: Sequence[str]) -> Plan:
    readings = yield list(candidates)
    scores = {run: r.value for run, r in zip(candidates, readings)}
    errors = sum(r.value is None for r in readings)
    picked = _first_best(candidates, scores.get)
    best = scores[picked]
    if best is None:
        reason = f"every score was an error: the first run by the tie rule ({errors} error(s))"
    else:
        equal = sum(1 for v in scores.values() if v == best)
        reason = f"highest pointwise score {best:.3f}" + (f" (tied with {equal - 1} more: earliest)" if equal > 1 else "")
    return Pick(task, tuple(candidates), picked, POINTWISE, reason, scores, {}, (), len(readings), errors,
                sum(r.tokens for r in readings))


def _knockout(task: str, candidates: Sequence[str]) -> Plan:
    alive = list(candidates)
    matches: list[Match] = []
    wins = {run: 0.0 for run in candidates}
    knocked = {run: 0 for run in candidates}
    rounds = 0
    while len(alive) > 1:
        rounds += 1
        pairs = [(alive[i], alive[i + 1]) for i in range(0, len(alive) - 1, 2)]
        readings = yield pairs
        advancing = []
        for (first, second), r in zip(pairs, readings):
            p = r.value
            if p is None:
                winner, note = first, "error: the earlier run advances (tie rule)"
            elif p == 0.5:
                winner, note = first, "no preference: the earlier run advances (tie rule)"
            else:
                winner, note = (first if p > 0.5 else second), None
            if p is not None:
                wins[first] += p
                wins[second] += 1.0 - p
            knocked[winner] += 1
            matches.append(Match(first, second, p, rounds, r.tokens, winner, note))
            advancing.append(winner)
        if len(alive) % 2:
            advancing.append(alive[-1])  # the odd one out advances unjudged
        alive = advancing
    picked = alive[0]
    errors = sum(m.p_first is None for m in matches)
    reason = (f"won the knockout: {knocked[picked]} match(es) in {rounds} round(s)"
              + (f"; {errors} comparison error(s) went to the tie rule" if errors else ""))
    return Pick(task, tuple(candidates), picked, TOURNAMENT, reason, {run: float(n) for run, n in knocked.items()},
                wins, tuple(matches), len(matches), errors, sum(m.tokens for m in matches))


def _all_pairs(task: str, candidates: Sequence[str]) -> Plan:
    pairs = list(itertools.combinations(candidates, 2))
    readings = yield pairs
    matches = tuple(Match(a, b, r.value, 1, r.tokens) for (a, b), r in zip(pairs, readings))
    games = [Game(m.first, m.second, m.p_first) for m in matches if m.p_first is not None]
    wins = {run: 0.0 for run in candidates}
    for g in games:
        wins[g.first] += g.score
        wins[g.second] += 1.0 - g.score
    strengths: dict[str, float | None] = (dict(bradley_terry(games, list(candidates), newton=True)) if games
                                          else {run: None for run in candidates})
    picked = _first_best(candidates, strengths.get, STRENGTH_TIE)
    errors = len(matches) - len(games)
    if not games:
        reason = f"every comparison was an error: the first run by the tie rule ({errors} error(s))"
    else:
        reason = (f"highest Bradley-Terry strength {strengths[picked]:+.2f} ({wins[picked]:.1f} of "
                  f"{len(candidates) - 1} won)" + (f"; {errors} comparison error(s) left out" if errors else ""))
    return Pick(task, tuple(candidates), picked, ALL_PAIRS, reason, strengths, wins, matches, len(matches), errors,
                sum(m.tokens for m in matches))


_PLANS: dict[str, Callable[[str, Sequence[str]], Plan]] = {POINTWISE: _pointwise, TOURNAMENT: _knockout,
                                                          ALL_PAIRS: _all_pairs}


def select(tasks: Mapping[str, Sequence[str]], strategy: str = DEFAULT_STRATEGY, *, scorer: Scorer | None = None,
           comparator: Comparator | None = None,
           on_round: Callable[[int, int], None] | None = None) -> list[Pick]:
    """One :class:`Pick` per task of ``tasks`` (task → its candidates in the task's order), in task order.

    ``pointwise`` needs ``scorer``, the pairwise strategies ``comparator``. Every task's requests of a round are
    sent in one call; ``on_round(round, readings)`` hears of each call before it is made."""
    if strategy not in _PLANS:
        raise UsageError(f"unknown selection strategy {strategy!r}; use one of {', '.join(STRATEGIES)}")
    if strategy == POINTWISE and scorer is None:
        raise UsageError("the pointwise strategy needs a pointwise scorer; use --strategy tournament or all-pairs")
    if strategy in PAIRWISE and comparator is None:
        raise UsageError(f"the {strategy} strategy needs a pairwise judge")
    picks: dict[str, Pick] = {}
    running: dict[str, tuple[Plan, list[Any]]] = {}
    for task, runs in tasks.items():
        candidates = list(dict.fromkeys(runs))
        if not candidates:
            continue
        if len(candidates) == 1:
            picks[task] = Pick(task, tuple(candidates), candidates[0], strategy, NOTHING_TO_CHOOSE)
            continue
        plan = _PLANS[strategy](task, candidates)
        running[task] = (plan, next(plan))
    number = 0
    while running:
        number += 1
        asked = [(task, item) for task, (_, items) in running.items() for item in items]
        if on_round is not None:
            on_round(number, len(asked))
        if strategy == POINTWISE:
            assert scorer is not None
            scored = scorer.score_runs([run for _, run in asked])
            answers = [reading(scored.get(run)) for _, run in asked]
        else:
            assert comparator is not None
            answers = [reading(value) for value in comparator.compare([pair for _, pair in asked])]
        if len(answers) != len(asked):
            raise JudgeError(f"the judge answered {len(answers)} of {len(asked)} requests; each needs an answer "
                             f"(None for an error)")
        by_task: dict[str, list[Reading]] = {}
        for (task, _), answer in zip(asked, answers):
            by_task.setdefault(task, []).append(answer)
        for task in list(running):
            plan, _ = running[task]
            try:
                running[task] = (plan, plan.send(by_task[task]))
            except StopIteration as done:
                picks[task] = done.value
                del running[task]
    return [picks[task] for task in tasks if task in picks]


def describe(strategy: str) -> str:
    """One sentence: how ``strategy`` picks, what it costs per task of N runs, and the tie rule."""
    how = {POINTWISE: "each run scored once by a pointwise critic, the highest score picked (N readings per task)",
           TOURNAMENT: "a knockout in the task's order, the winner of each match advancing (N - 1 comparisons "
                       "per task)",
           ALL_PAIRS: "every pair compared once and a Bradley-Terry fit inside the task, the strongest picked "
                      "(N(N - 1)/2 comparisons per task)"}[strategy]
    return f"{strategy}: {how}; ties, no preference and errors go to the run earliest in the task's order."
