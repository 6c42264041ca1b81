"""Still grades: do reduced runs get the same verdict as the full runs?

Pure arithmetic over verdicts: the judging happens elsewhere (the full pair before reduction, the
reduced pair after). For one pair: whether the winner held and Δp_a. For a batch: agreement rate,
flips, Cohen's κ between full and reduced outcomes, position consistency and coverage.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kvjudge.errors import UsageError
from kvjudge.judge.verdict import SCORED, Verdict

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
    def held(self) -> bool | None:
        """The reduced outcome equals the full one (None when either has no score)."""
        return self.full.outcome == self.reduced.outcome if self.comparable else None

    @property
    def flipped(self) -> bool:
        """A decisive winner turned into the other decisive winner."""
        return {self.full.outcome, self.reduced.outcome} == {"a", "b"}

    @property
    def delta_p_a(self) -> float | None:
        """``reduced.p_a − full.p_a`` (None when either has no score)."""
        if not self.comparable:
            return None
        assert self.full.p_a is not None and self.reduced.p_a is not None
        return self.reduced.p_a - self.full.p_a

    def to_json(self) -> dict[str, Any]:
        return {"a": self.full.a, "b": self.full.b, "full": self.full.to_json(), "reduced": self.reduced.to_json(),
                "held": self.held, "flipped": self.flipped, "delta_p_a": self.delta_p_a}


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
    """Batch summary of full-vs-reduced: agreement, flips, κ, position consistency, coverage, Δp_a."""
    comparable = [r for r in results if r.comparable]
    deltas = [r.delta_p_a for r in comparable if r.delta_p_a is not None]
    full = summarize_verdicts([r.full for r in results])
    reduced = summarize_verdicts([r.reduced for r in results])
    return {
        "pairs": len(results),
        "comparable": len(comparable),
        "agreement": sum(bool(r.held) for r in comparable) / len(comparable) if comparable else None,
        "flips": sum(r.flipped for r in results),
        "kappa": cohen_kappa([r.full.outcome for r in comparable], [r.reduced.outcome for r in comparable]),
        "mean_abs_delta_p_a": sum(abs(d) for d in deltas) / len(deltas) if deltas else None,
        "max_abs_delta_p_a": max((abs(d) for d in deltas), default=None),
        "coverage": {"full": full["coverage"], "reduced": reduced["coverage"]},
        "position_consistency": {"full": full["position_consistency"], "reduced": reduced["position_consistency"]},
        "outcomes": {"full": full["outcomes"], "reduced": reduced["outcomes"]},
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


__all__ = ["CATEGORIES", "SCORED", "StillGrades", "cohen_kappa", "still_grades", "still_grades_summary",
           "summarize_verdicts"]
