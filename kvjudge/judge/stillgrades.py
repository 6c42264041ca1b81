"""Still grades: do reduced runs get the same verdict as the full runs?

Pure arithmetic over verdicts: the judging happens elsewhere (the full pair in a window that holds it,
the reduced pair at the certified context). A comparison means something only where the judge read the
full runs uncut and the reduced views really differ from them, so a pair is *compared* only when

- both verdicts carry a score,
- the full side was not cut to fit its window (else it is ``full_cut``: reported, kept out), and
- at least one of its two views differs between the sides (else the same text was read twice).

For one pair: the tokens of each view on each side, whether the winner held, Δp_a. For a batch:
agreement, flips (a winner turned into the other), lost decisions (a winner turned into no preference: what a
capable judge does when reduction hid what it decided on), Cohen's κ and Δp_a over the compared pairs; coverage
and position consistency per side.
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

    def to_json(self) -> dict[str, Any]:
        return {"a": self.full.a, "b": self.full.b, "full": self.full.to_json(), "reduced": self.reduced.to_json(),
                "held": self.held, "flipped": self.flipped, "lost": self.lost, "delta_p_a": self.delta_p_a,
                "full_cut": self.full_cut, "views_differ": self.views_differ, "compared": self.compared,
                "view_tokens": self.view_tokens()}


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
