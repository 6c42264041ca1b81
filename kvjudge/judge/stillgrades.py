"""Still grades: do reduced runs get the same verdict as the full runs?

:func:`check_still_grades` is the check, one call for every caller (``kvjudge judge --still-grades``, the demo,
the Python API): each pair judged from its full runs in a window that holds them (up to the analytic bound),
then from its reduced runs at the certified context — views reduced to a target per tenant (derived, never
stored; the target's default is the tenant's effective ceiling, :meth:`kvjudge.target.JudgeTarget.still_grades`),
or the runs as the store holds them once the caller has reduced them between the sides. :func:`split_full_cut`
names the pairs whose full runs no such window holds. The rest is arithmetic over verdicts. A comparison means
something only where the judge read the full runs uncut and the reduced views really differ from them, so a pair
is *compared* only when

- both verdicts carry a score,
- the full side was not cut to fit its window (else it is ``full_cut``: reported, kept out), and
- at least one of its two views differs between the sides (else the same text was read twice).

For one pair: the tokens of each view on each side, whether the winner held, Δp_a, and for each run how much of
its decisive evidence each side's view shows (:mod:`kvjudge.judge.evidence`): a reduced view that shows less
than the full one is flagged, whatever the verdicts did. For a batch: agreement, flips (a winner turned into the
other), lost decisions (a winner turned into no preference: what a capable judge does when reduction hid what it
decided on), Cohen's κ and Δp_a over the compared pairs; coverage and position consistency per side; evidence
figures per side and the flagged pairs.
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kvjudge.errors import UsageError
from kvjudge.judge.evidence import RunEvidence, batch, compared
from kvjudge.judge.pipeline import Judge, VerdictFn, judge_batch
from kvjudge.judge.verdict import SCORED, Verdict
from kvjudge.judge.window import Window, window_tokens

if TYPE_CHECKING:
    from kvjudge.retention import Store

Pair = tuple[str, str]
# ``progress(description, total)``: a context manager yielding ``advance()`` (one bar per side).
ProgressFactory = Callable[[str, int], contextlib.AbstractContextManager[Callable[..., None]]]

SIDES = ("full", "reduced")

# The categories κ is computed over: the outcomes that carry a score.
CATEGORIES: tuple[str, ...] = ("a", "b", "tie", "inconsistent")


@dataclass(frozen=True)
class StillGrades:
    """One pair judged full and reduced."""

    full: Verdict
    reduced: Verdict

    @property
    def comparable(self) -> bool:
        """Both verdicts carry a score (neither is overflow nor error)."""
        return self.full.scored and self.reduced.scored

    @property
    def full_cut(self) -> bool:
        """The full side did not read the full runs: a view was cut to fit, or the pair overflowed."""
        return self.full.further_reduced or self.full.outcome == "overflow"

    @property
    def views_differ(self) -> bool:
        """At least one run's reduced view is not the text its full view was."""
        return any(self.full.view_sha256.get(side) != self.reduced.view_sha256.get(side) for side in ("a", "b"))

    @property
    def compared(self) -> bool:
        """Counts in the agreement figures: both scored, full side uncut, views that differ."""
        return self.comparable and not self.full_cut and self.views_differ

    @property
    def held(self) -> bool | None:
        """The reduced outcome equals the full one (None when either has no score)."""
        return self.full.outcome == self.reduced.outcome if self.comparable else None

    def view_tokens(self) -> dict[str, dict[str, int | None]]:
        """Tokens of each run's view on each side: ``{"full": {"a", "b"}, "reduced": {"a", "b"}}``."""
        return {side: {run: verdict.tokens[run].view for run in ("a", "b")}
                for side, verdict in (("full", self.full), ("reduced", self.reduced))}

    @property
    def flipped(self) -> bool:
        """A decisive winner turned into the other decisive winner."""
        return {self.full.outcome, self.reduced.outcome} == {"a", "b"}

    @property
    def lost(self) -> bool:
        """A decisive winner that the reduced views no longer decide (a tie or an inconsistent verdict)."""
        return self.full.outcome in ("a", "b") and self.reduced.outcome in ("tie", "inconsistent")

    @property
    def delta_p_a(self) -> float | None:
        """``reduced.p_a − full.p_a`` (None when either has no score)."""
        if not self.comparable:
            return None
        assert self.full.p_a is not None and self.reduced.p_a is not None
        return self.reduced.p_a - self.full.p_a

    def run_evidence(self) -> dict[str, RunEvidence]:
        """Each run's evidence as the full side's view showed it and as the reduced side's view showed it."""
        def judged(verdict: Verdict, side: str) -> Any:
            found = verdict.evidence.get(side)
            return None if found is None else found.view

        return {side: RunEvidence(judged(self.full, side), judged(self.reduced, side)) for side in ("a", "b")}

    @property
    def evidence_hidden(self) -> bool:
        """The reduced view of a run shows less of its decisive evidence than its full view (the judge's skill
        plays no part)."""
        return any(e.hidden for e in self.run_evidence().values())

    def evidence(self) -> dict[str, dict[str, Any]]:
        """``{"a": {"full", "reduced", "hidden"}, "b": …}``: each run's evidence figures on both sides."""
        return {side: compared(e.full, e.view, SIDES) for side, e in self.run_evidence().items()}

    def to_json(self) -> dict[str, Any]:
        return {"a": self.full.a, "b": self.full.b, "full": self.full.to_json(), "reduced": self.reduced.to_json(),
                **self.comparison()}

    def comparison(self) -> dict[str, Any]:
        """What comparing the two sides says (the fields beside the two verdicts in :meth:`to_json`)."""
        return {"held": self.held, "flipped": self.flipped, "lost": self.lost, "delta_p_a": self.delta_p_a,
                "full_cut": self.full_cut,
                "views_differ": self.views_differ, "compared": self.compared, "view_tokens": self.view_tokens(),
                "evidence": self.evidence(), "evidence_hidden": self.evidence_hidden}


def cohen_kappa(first: Sequence[str], second: Sequence[str], categories: Sequence[str] = CATEGORIES) -> float | None:
    """Cohen's κ between two raters' labels of the same items.

    None when there are no items, or when chance agreement is total (both raters used one and the
    same category throughout: κ is undefined there, and 1.0 would overstate what was shown).
    """
    if len(first) != len(second):
        raise UsageError(f"cohen_kappa needs two label lists of one length, got {len(first)} and {len(second)}")
    n = len(first)
    if n == 0:
        return None
    observed = sum(x == y for x, y in zip(first, second)) / n
    count_first, count_second = Counter(first), Counter(second)
    labels = set(categories) | set(count_first) | set(count_second)
    expected = sum(count_first[c] * count_second[c] for c in labels) / (n * n)
    if expected >= 1.0:
        return None
    return (observed - expected) / (1.0 - expected)


def summarize_verdicts(verdicts: Sequence[Verdict]) -> dict[str, Any]:
    """Batch summary of plain verdicts: outcome counts, coverage, position consistency, tokens saved."""
    outcomes = Counter(v.outcome for v in verdicts)
    scored = [v for v in verdicts if v.scored]
    consistent = [v for v in scored if v.position_consistent is not None]
    return {
        "pairs": len(verdicts),
        "outcomes": {name: outcomes.get(name, 0) for name in ("a", "b", "tie", "inconsistent", "overflow", "error")},
        "coverage": len(scored) / len(verdicts) if verdicts else None,
        "position_consistency": (sum(bool(v.position_consistent) for v in consistent) / len(consistent)
                                 if consistent else None),
        "further_reduced": sum(v.further_reduced for v in verdicts),
        "cached": sum(v.cached for v in verdicts),
        "tokens_saved": sum(v.tokens_saved for v in verdicts),
        "seconds": sum(v.seconds for v in verdicts),
    }


def still_grades_summary(results: Sequence[StillGrades]) -> dict[str, Any]:
    """Batch summary of full-vs-reduced: agreement, flips, lost decisions, κ and Δp_a over the compared pairs (both
    scored, full side uncut, views that differ); coverage, position consistency and outcomes per side."""
    compared = [r for r in results if r.compared]
    deltas = [r.delta_p_a for r in compared if r.delta_p_a is not None]
    full = summarize_verdicts([r.full for r in results])
    reduced = summarize_verdicts([r.reduced for r in results])
    return {
        "pairs": len(results),
        "comparable": sum(r.comparable for r in results),
        "full_cut": sum(r.full_cut for r in results),
        "same_views": sum(not r.views_differ for r in results),
        "compared": len(compared),
        "agreement": sum(bool(r.held) for r in compared) / len(compared) if compared else None,
        "flips": sum(r.flipped for r in compared),
        "lost": sum(r.lost for r in compared),
        "kappa": cohen_kappa([r.full.outcome for r in compared], [r.reduced.outcome for r in compared]),
        "mean_abs_delta_p_a": sum(abs(d) for d in deltas) / len(deltas) if deltas else None,
        "max_abs_delta_p_a": max((abs(d) for d in deltas), default=None),
        "coverage": {"full": full["coverage"], "reduced": reduced["coverage"]},
        "position_consistency": {"full": full["position_consistency"], "reduced": reduced["position_consistency"]},
        "outcomes": {"full": full["outcomes"], "reduced": reduced["outcomes"]},
        "evidence": batch([(r.full.a, r.full.b, list(r.run_evidence().values())) for r in results], SIDES),
    }


def still_grades(full: Sequence[Verdict], reduced: Sequence[Verdict]) -> tuple[list[StillGrades], dict[str, Any]]:
    """Pair up full and reduced verdicts (same order, same runs) and summarise them."""
    if len(full) != len(reduced):
        raise UsageError(f"still_grades needs one reduced verdict per full verdict, got {len(full)} and {len(reduced)}")
    results = []
    for f, r in zip(full, reduced):
        if (f.a, f.b) != (r.a, r.b):
            raise UsageError(f"verdict pairs do not line up: full ({f.a}, {f.b}) vs reduced ({r.a}, {r.b})")
        results.append(StillGrades(f, r))
    return results, still_grades_summary(results)


# ------------------------------------------------------------------------------------------------ the check
@dataclass(frozen=True)
class FullCut:
    """Pairs split by whether a window up to the analytic bound holds their full runs uncut."""

    uncut: list[Pair]
    cut: dict[Pair, int]  # each pair the window cannot hold whole, and the n_ctx its full runs need


def split_full_cut(judge: Judge, store: Store, pairs: Sequence[Pair]) -> FullCut:
    """The pairs whose full runs fit uncut in the largest window the full side may open (the analytic bound), and
    the n_ctx each of the others needs: judged, such a pair is ``full_cut`` and compares nothing."""
    bound = judge.window_cap("analytic")
    needed = {(a, b): window_tokens(judge.needed_tokens(judge.base(store, a, full=True),
                                                        judge.base(store, b, full=True))) for a, b in pairs}
    return FullCut([pair for pair in pairs if needed[pair] <= bound],
                   {pair: tokens for pair, tokens in needed.items() if tokens > bound})


@dataclass(frozen=True)
class StillGradesCheck:
    """What one still-grades check judged: each pair from its full runs and from its reduced runs, the summary,
    the window each side was read in, the reduced side's target per tenant, and the seconds each side took (and
    ``reduce_stored``, the caller's reduction between them)."""

    results: list[StillGrades]
    summary: dict[str, Any]
    full_window: Window | None
    reduced_window: Window | None
    reduce_to: dict[str, int]
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def reduced(self) -> list[Verdict]:
        """The reduced side's verdicts, in pair order."""
        return [result.reduced for result in self.results]


def check_still_grades(judge: Judge, store: Store, pairs: Sequence[Pair], reduce_to: Mapping[str, int], *,
                       reduce_stored: Callable[[Mapping[str, int]], None] | None = None,
                       on_call: Callable[[], None] | None = None, on_verdict: VerdictFn | None = None,
                       progress: ProgressFactory | None = None) -> StillGradesCheck:
    """Judge ``pairs`` from their full runs (in a window up to the analytic bound), then from their reduced runs
    (at the certified context), and compare the two sides (:func:`still_grades`).

    ``reduce_to`` is the reduced side's target in tokens per tenant (a pair's is its first run's tenant's): views
    reduced that far, derived and never stored. With ``reduce_stored`` the runs are reduced in the store instead:
    ``reduce_stored(reduce_to)`` is called once the full side is judged, and the reduced side reads the runs as
    the store then holds them. ``on_call`` and ``on_verdict`` hear of both sides (``2 × 2 × len(pairs)`` calls);
    ``progress``, where given, opens a bar for each side."""
    for tokens in reduce_to.values():
        if tokens <= 0:
            raise UsageError(f"--reduce-to must be a positive number of tokens, got {tokens}")
    seconds: dict[str, float] = {}
    with _side(progress, "judging full runs", len(pairs), seconds, "full") as advance:
        full = judge_batch(judge, store, pairs, full=True, bound="analytic", on_call=_both(on_call, advance),
                           on_verdict=on_verdict)
    full_window = judge.window
    if reduce_stored is not None:
        started = time.perf_counter()
        reduce_stored(reduce_to)
        seconds["reduce_stored"] = round(time.perf_counter() - started, 2)
        per_pair = None
    else:
        per_pair = {(a, b): reduce_to[store.runs.run(a).tenant] for a, b in pairs}
    with _side(progress, "judging reduced runs", len(pairs), seconds, "reduced") as advance:
        reduced = judge_batch(judge, store, pairs, reduce_to=per_pair, on_call=_both(on_call, advance),
                              on_verdict=on_verdict)
    results, summary = still_grades(full, reduced)
    return StillGradesCheck(results, summary, full_window, judge.window, dict(reduce_to), seconds)


@contextlib.contextmanager
def _side(progress: ProgressFactory | None, description: str, pairs: int, seconds: dict[str, float],
          side: str) -> Iterator[Callable[..., None] | None]:
    """One side's bar (two calls a pair; None without ``progress``), its seconds kept in ``seconds[side]``."""
    started = time.perf_counter()
    try:
        if progress is None:
            yield None
        else:
            with progress(description, pairs * 2) as advance:
                yield advance
    finally:
        seconds[side] = round(time.perf_counter() - started, 2)


def _both(on_call: Callable[[], None] | None, advance: Callable[..., None] | None) -> Callable[[], None] | None:
    """What hears of each call: the caller's ``on_call``, the side's bar, both or neither."""
    if advance is None:
        return on_call
    if on_call is None:
        return advance

    def called() -> None:
        on_call()
        advance()

    return called


__all__ = ["CATEGORIES", "SCORED", "FullCut", "StillGrades", "StillGradesCheck", "check_still_grades", "cohen_kappa",
           "split_full_cut", "still_grades", "still_grades_summary", "summarize_verdicts"]
