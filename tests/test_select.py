"""Best-of-N selection at the library level: the strategies' rules, the selection table by hand, and the instrument
proved against a judge of known quality (kvjudge.testing.latent_judge) whose pass@pick each test predicts itself."""

from __future__ import annotations

import functools
import itertools
import math
import random
from collections.abc import Sequence

import pytest

from kvjudge.errors import UsageError
from kvjudge.judge.candidates import Candidate
from kvjudge.judge.comparators import Reading
from kvjudge.judge.metrics import wilson
from kvjudge.judge.select import ALL_PAIRS, NOTHING_TO_CHOOSE, POINTWISE, STRATEGIES, TOURNAMENT, comparisons_bound, select
from kvjudge.judge.selection_table import selection_table
from kvjudge.testing.latent_judge import LatentJudge


class Table:
    """A comparator answering from a table of p_first by pair (both orders), recording every call."""

    def __init__(self, p: dict[tuple[str, str], float | None]) -> None:
        self.p = p
        self.calls: list[list[tuple[str, str]]] = []

    def compare(self, pairs: Sequence[tuple[str, str]]) -> list[float | Reading | None]:
        self.calls.append(list(pairs))
        out: list[float | Reading | None] = []
        for a, b in pairs:
            if (a, b) in self.p:
                value = self.p[(a, b)]
            else:
                value = self.p[(b, a)]
                value = None if value is None else 1.0 - value
            out.append(Reading(value, tokens=10))
        return out


# ------------------------------------------------------------------------------------------------ the rules
def test_knockout_brackets_in_task_order_with_a_bye_and_the_tie_rule() -> None:
    # Five runs: round 1 r1 v r2 (no preference: r1, the earlier), r3 v r4 (r4 wins), r5 a bye; round 2 r1 v r4
    # (an error: r1 by the tie rule), r5 advances; final r1 v r5: r5.
    judge = Table({("r1", "r2"): 0.5, ("r3", "r4"): 0.2, ("r1", "r4"): None, ("r1", "r5"): 0.3})
    [pick] = select({"t": ["r1", "r2", "r3", "r4", "r5"]}, TOURNAMENT, comparator=judge)
    assert judge.calls == [[("r1", "r2"), ("r3", "r4")], [("r1", "r4")], [("r1", "r5")]]
    assert pick.picked == "r5" and pick.comparisons == 4 == comparisons_bound(TOURNAMENT, 5)
    assert pick.errors == 1 and pick.tokens == 40 and "1 comparison error" in pick.reason
    assert [m.winner for m in pick.matches] == ["r1", "r4", "r1", "r5"]
    assert pick.scores == {"r1": 2.0, "r2": 0.0, "r3": 0.0, "r4": 1.0, "r5": 1.0}


def test_each_round_asks_every_task_at_once_and_one_run_has_nothing_to_choose() -> None:
    judge = Table({("a1", "a2"): 0.9, ("b1", "b2"): 0.1, ("b3", "b4"): 0.8, ("b2", "b3"): 0.4})
    picks = select({"a": ["a1", "a2"], "solo": ["s1"], "b": ["b1", "b2", "b3", "b4"]}, TOURNAMENT, comparator=judge)
    assert judge.calls[0] == [("a1", "a2"), ("b1", "b2"), ("b3", "b4")] and judge.calls[1] == [("b2", "b3")]
    assert [(p.task, p.picked) for p in picks] == [("a", "a1"), ("solo", "s1"), ("b", "b3")]
    solo = picks[1]
    assert not solo.chosen and solo.reason == NOTHING_TO_CHOOSE and solo.comparisons == 0
    assert solo.to_json()["status"] == NOTHING_TO_CHOOSE


def test_pointwise_never_picks_an_error_and_breaks_ties_by_task_order() -> None:
    class Scores:
        def score_runs(self, run_ids: Sequence[str]) -> dict[str, float | None]:
            return {"x1": 0.4, "x2": None, "x3": 0.7, "x4": 0.7, "y1": None, "y2": None}

    picks = select({"x": ["x1", "x2", "x3", "x4"], "y": ["y1", "y2"]}, POINTWISE, scorer=Scores())
    assert picks[0].picked == "x3" and "tied with 1 more" in picks[0].reason and picks[0].errors == 1
    assert picks[1].picked == "y1" and "every score was an error" in picks[1].reason
    with pytest.raises(UsageError, match="pointwise scorer"):
        select({"x": ["x1", "x2"]}, POINTWISE)
    with pytest.raises(UsageError, match="unknown selection strategy"):
        select({"x": ["x1", "x2"]}, "swiss", comparator=Table({}))


def test_all_pairs_fits_bradley_terry_and_equal_scores_tie_to_the_earliest() -> None:
    # A cycle a > b > c > a: all equal (1 of 2 each); the earliest, a, is picked by the tie rule.
    cycle = Table({("a", "b"): 1.0, ("b", "c"): 1.0, ("a", "c"): 0.0})
    [pick] = select({"t": ["a", "b", "c"]}, ALL_PAIRS, comparator=cycle)
    assert pick.picked == "a" and pick.comparisons == 3 == comparisons_bound(ALL_PAIRS, 3)
    assert max(pick.scores.values()) - min(pick.scores.values()) < 1e-4 and pick.wins == {"a": 1, "b": 1, "c": 1}
    # c wins both of its games: strongest; an error is left out of the games, counted.
    ordered = Table({("a", "b"): 0.7, ("a", "c"): 0.2, ("b", "c"): None})
    [pick] = select({"t": ["a", "b", "c"]}, ALL_PAIRS, comparator=ordered)
    assert pick.picked == "c" and pick.errors == 1 and pick.scores["c"] > pick.scores["a"] > pick.scores["b"]


# --------------------------------------------------------------------------------------- the table by hand
def _c(run: str, task: str, passed: bool | None, length: int, test_exit: int | None) -> Candidate:
    return Candidate(run, task, "agent", None, None if passed is None else float(passed), passed, length, test_exit)


def test_the_selection_table_by_hand() -> None:
    candidates = {
        # t1: pick x2 (passes); random 1/3; first x1 fails; longest x3 fails; last exit 0 is x2 (passes); oracle 1.
        "t1": [_c("x1", "t1", False, 10, 1), _c("x2", "t1", True, 20, 0), _c("x3", "t1", False, 30, 1)],
        # t2: pick y1 (fails); random 1/2; first y1 fails; longest y2 passes; no exit 0: the last, y2, passes.
        "t2": [_c("y1", "t2", False, 50, None), _c("y2", "t2", True, 60, 2)],
        "t3": [_c("z1", "t3", True, 5, 0)],                                    # nothing to choose
        "t4": [_c("w1", "t4", True, 5, 0), _c("w2", "t4", None, 5, 0)],          # an ungraded run
    }
    judge = Table({("x1", "x2"): 0.1, ("x2", "x3"): 0.9, ("y1", "y2"): 0.6, ("w1", "w2"): 0.4})
    picks = select({task: [c.run_id for c in runs] for task, runs in candidates.items()}, TOURNAMENT,
                   comparator=judge)
    assert [p.picked for p in picks] == ["x2", "y1", "z1", "w2"]
    table = selection_table(picks, candidates)
    rows = {row["name"]: row for row in table["rows"]}
    assert (table["in_table"], table["nothing_to_choose"], table["ungraded"]) == (2, 1, 1)
    assert {name: row["passed"] for name, row in rows.items()} == {
        "pick": 1.0, "random": pytest.approx(1 / 3 + 1 / 2), "first run": 0.0, "longest run": 1.0,
        "last exit 0": 2.0, "oracle": 2.0}
    assert rows["pick"]["ci95"] == wilson(1, 2)
    random_rate = (1 / 3 + 1 / 2) / 2
    assert rows["pick"]["gap_closed"] == pytest.approx((0.5 - random_rate) / (1.0 - random_rate))
    assert rows["oracle"]["gap_closed"] == pytest.approx(1.0) and rows["random"]["gap_closed"] == pytest.approx(0.0)
    assert table["spent"] == {"tasks": 3, "comparisons": 4, "per_task_mean": 4 / 3, "per_task_max": 2,
                              "bound_max": 2, "errors": 0, "tokens": 40, "tokens_per_task": 40 / 3}
    assert "nothing to choose" in table["note"] and "ungraded run" in table["note"]
    assert table["by_n"]["3"]["pick"] == 1.0 and table["by_n"]["2"]["oracle"] == 1.0


# ------------------------------------------------------------------------------- the instrument, proved
SIGMA = 0.8   # the judge's noise, in units of the quality gap between a passing and a failing run
TASKS = 400
BASE_RATE = 0.4


def _tasks(n: int, seed: int) -> tuple[dict[str, list[str]], dict[str, float]]:
    """``TASKS`` tasks of ``n`` runs, each passing with ``BASE_RATE``: quality 1 for a pass, 0 for a fail."""
    rng = random.Random(seed)
    tasks, quality = {}, {}
    for t in range(TASKS):
        runs = [f"t{t}/r{i}" for i in range(n)]
        for run in runs:
            quality[run] = float(rng.random() < BASE_RATE)
        tasks[f"t{t}"] = runs
    return tasks, quality


def _pointwise_prediction(labels: Sequence[float]) -> float:
    """P(the highest of one noisy reading per run is a passing run's): ∫ K f₁(t) F₁(t)^(K−1) F₀(t)^(N−K) dt, with f₁,
    F₁ the density and cdf of a pass's reading N(1, σ²) and F₀ the cdf of a fail's N(0, σ²)."""
    return _pointwise_integral(int(sum(labels)), len(labels))


@functools.cache
def _pointwise_integral(k: int, n: int) -> float:
    from scipy.integrate import quad

    if k in (0, n):
        return float(k == n)

    def cdf(x: float) -> float:
        return 0.5 * math.erfc(-x / (SIGMA * math.sqrt(2)))

    def pdf(x: float) -> float:
        return math.exp(-0.5 * (x / SIGMA) ** 2) / (SIGMA * math.sqrt(2 * math.pi))

    value, _ = quad(lambda t: k * pdf(t - 1) * cdf(t - 1) ** (k - 1) * cdf(t) ** (n - k), -10, 11)
    return value


def _knockout_prediction(labels: Sequence[float]) -> float:
    """The documented bracket for N a power of two is halves within halves: a block's winner passes when both
    halves' winners do, or when one does and wins the match (probability a = Φ(1 / (σ√2)))."""
    from scipy.stats import norm

    a = norm.cdf(1 / (SIGMA * math.sqrt(2)))
    if len(labels) == 1:
        return labels[0]
    half = len(labels) // 2
    left, right = _knockout_prediction(labels[:half]), _knockout_prediction(labels[half:])
    return left * right + a * (left * (1 - right) + right * (1 - left))


def _all_pairs_prediction(labels: Sequence[float], draws: int = 4_000) -> float:
    """Monte Carlo integration over the comparisons' outcomes (seeded numpy, none of select's code): in a complete
    round robin the Bradley–Terry order is the order of wins, ties to the earliest run."""
    import numpy as np

    rng = np.random.default_rng(int(sum(2**i * v for i, v in enumerate(labels))))
    n = len(labels)
    q = np.asarray(labels, dtype=float)
    wins = np.zeros((draws, n))
    for i, j in itertools.combinations(range(n), 2):
        first_wins = q[i] - q[j] + rng.normal(0, SIGMA * math.sqrt(2), draws) > 0  # two readings' noise
        wins[:, i] += first_wins
        wins[:, j] += ~first_wins
    winner = np.argmax(wins, axis=1)  # argmax returns the first of equal maxima: the tie rule
    return float(q[winner].mean())


PREDICTIONS = {POINTWISE: _pointwise_prediction, TOURNAMENT: _knockout_prediction, ALL_PAIRS: _all_pairs_prediction}


@pytest.mark.parametrize("n", [2, 4, 8])
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_pass_at_pick_reads_back_what_a_judge_of_known_quality_predicts(strategy: str, n: int) -> None:
    tasks, quality = _tasks(n, seed=100 + n)
    judge = LatentJudge(quality, SIGMA, seed=7 * n)
    picks = select(tasks, strategy, scorer=judge, comparator=judge)
    candidates = {task: [Candidate(run, task, "a", None, quality[run], bool(quality[run]), 0, None) for run in runs]
                  for task, runs in tasks.items()}
    table = selection_table(picks, candidates)
    pick = table["rows"][0]
    cache: dict[tuple[float, ...], float] = {}
    predicted = sum(cache.setdefault(key, PREDICTIONS[strategy](key))
                    for key in (tuple(quality[run] for run in runs) for runs in tasks.values())) / TASKS
    low, high = pick["ci95"]
    assert low <= predicted <= high, (strategy, n, pick["rate"], predicted)
    # The judge beats chance and never the oracle; it was asked exactly what the strategy documents.
    rows = {row["name"]: row["rate"] for row in table["rows"]}
    assert rows["random"] < pick["rate"] <= rows["oracle"]
    assert table["spent"]["comparisons"] == TASKS * comparisons_bound(strategy, n) == judge.scored + judge.compared


def test_the_best_of_n_page_writes_run_text_as_text(tmp_path) -> None:
    from html import unescape

    from kvjudge.judge.selection_table import selection_result
    from kvjudge.report.selection import write_selection

    task = "<script>alert(1)</script>"
    candidates = {task: [_c("<img src=x onerror=alert(2)>", task, True, 5, 0), _c("b", task, False, 9, 1)]}
    picks = select({task: [c.run_id for c in candidates[task]]}, TOURNAMENT,
                   comparator=Table({("<img src=x onerror=alert(2)>", "b"): 0.9}))
    page = write_selection(selection_result(picks, candidates, strategy=TOURNAMENT, pass_score=1.0),
                           tmp_path / "best.html").read_text()
    assert "<script" not in page and "<img" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert unescape(page).count("<img src=x onerror=alert(2)>") == 2  # the picked column, and marked among the candidates
    assert "default-src 'none'" in unescape(page) and "script-src" not in unescape(page)
    with pytest.raises(UsageError, match="not an .html file"):
        write_selection({}, tmp_path)


def test_a_critics_run_scores_pick_pointwise_and_its_errors_are_never_scores() -> None:
    from types import SimpleNamespace

    from kvjudge.judge.comparators import CriticScorer

    def score(run_ids: Sequence[str]) -> list[SimpleNamespace]:
        table = {"a": ("scored", 0.4), "b": ("overflow", None), "c": ("scored", 0.9), "d": ("error", 0.99)}
        return [SimpleNamespace(run_id=r, outcome=table[r][0], scored=table[r][0] == "scored",
                                p_success=table[r][1], readings=[SimpleNamespace(prompt_tokens=7)]) for r in run_ids]

    [pick] = select({"t": ["a", "b", "c", "d"]}, POINTWISE, scorer=CriticScorer(score))
    assert pick.picked == "c" and pick.errors == 2 and pick.tokens == 28
    assert pick.scores == {"a": 0.4, "b": None, "c": 0.9, "d": None}  # d's 0.99 came with an error: not a score
