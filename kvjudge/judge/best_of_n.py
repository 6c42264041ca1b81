"""Best of N over a store, in one call: each task's candidates (:mod:`kvjudge.judge.candidates`), the judge as the
strategy's comparator (:class:`~kvjudge.judge.comparators.JudgeComparator`, a pairwise protocol) or scorer
(:class:`~kvjudge.judge.comparators.CriticScorer` over :func:`~kvjudge.judge.pointwise.score_runs`, a pointwise
protocol), the picks
(:func:`kvjudge.judge.select.select`) and what they are worth (:func:`~kvjudge.judge.selection_table.selection_result`)
— what ``kvjudge select`` prints and the report's best-of-N section shows.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from kvjudge.errors import UsageError
from kvjudge.judge.candidates import DEFAULT_PASS_SCORE, Candidate, candidate_ids, task_candidates
from kvjudge.judge.comparators import CriticScorer, JudgeComparator, Scorer
from kvjudge.judge.pointwise import RunScore, score_runs
from kvjudge.judge.select import DEFAULT_STRATEGY, POINTWISE, select
from kvjudge.judge.selection_table import selection_result

if TYPE_CHECKING:
    from kvjudge.judge.pipeline import Judge
    from kvjudge.judge.verdict import Verdict
    from kvjudge.retention import Store


def candidates_of(store: Store, *, task: str | None = None, agent: str | None = None,
                  pass_score: float = DEFAULT_PASS_SCORE, use_cache: bool = True,
                  states: dict[str, Any] | None = None) -> dict[str, list[Candidate]]:
    """:func:`~kvjudge.judge.candidates.task_candidates`, refused in one line when there is nothing to select from
    (before any judge is opened)."""
    candidates = task_candidates(store, task=task, agent=agent, pass_score=pass_score, use_cache=use_cache,
                                 states=states)
    if not candidates:
        where = f"task {task!r}" if task else "the store"
        raise UsageError(f"{where} holds no runs with a task{' by agent ' + repr(agent) if agent else ''}; ingest "
                         f"runs first")
    return candidates


def protocol_kind(strategy: str) -> str:
    """The kind of protocol a strategy's judge needs: ``pointwise`` (a critic) or ``pairwise``."""
    return "pointwise" if strategy == POINTWISE else "pairwise"


def check_protocol(strategy: str, protocol: str, kind: str) -> None:
    """A one-line error when the judge's protocol (``protocol``, of ``kind``) cannot serve ``strategy``."""
    if kind != protocol_kind(strategy):
        fix = "--protocol pointwise" if strategy == POINTWISE else "--protocol letter or pairwise-scale"
        raise UsageError(f"the {strategy} strategy needs a {protocol_kind(strategy)} protocol, not {protocol} "
                         f"({kind}); use {fix}, or another --strategy")


def best_of_n(store: Store, judge: Judge, candidates: Mapping[str, Sequence[Candidate]],
              strategy: str = DEFAULT_STRATEGY, *, pass_score: float = DEFAULT_PASS_SCORE,
              scorer: Scorer | None = None, states: dict[str, Any] | None = None,
              judge_pairs: Callable[[Sequence[tuple[str, str]]], list[Verdict]] | None = None,
              score: Callable[[Sequence[str]], Sequence[RunScore]] | None = None,
              on_round: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    """Pick one run per task of ``candidates`` (:func:`candidates_of`) with ``judge`` by ``strategy``: the
    selection's result. ``pointwise`` needs a judge of a pointwise protocol (each run scored once by
    :func:`~kvjudge.judge.pointwise.score_runs`, cached per run), the pairwise strategies one of a pairwise protocol
    (``letter`` or ``pairwise-scale``: a verdict's p_a). ``scorer``: another pointwise critic; ``score``: how runs
    are scored (default ``score_runs``, a command's progress bar); ``judge_pairs``: how the comparator judges a batch
    of pairs (default :func:`~kvjudge.judge.judge_batch`); ``states``: folded runs by id, shared."""
    folded = states if states is not None else {}
    if scorer is None:
        check_protocol(strategy, judge.protocol.name, judge.protocol.kind)
        if strategy == POINTWISE:
            if score is None:
                def score(run_ids: Sequence[str]) -> Sequence[RunScore]:
                    return score_runs(judge, store, run_ids, states=folded)

            scorer = CriticScorer(score)
    comparator = JudgeComparator(judge, store, folded, judge_pairs)
    picks = select(candidate_ids(candidates), strategy, scorer=scorer, comparator=comparator, on_round=on_round)
    return selection_result(picks, candidates, strategy=strategy, pass_score=pass_score, judge=judge.manifest())
