"""Evidence retention as a figure of its own: does the view a judge read still show what decides the grade?

Independent of the judge's skill (a judge too weak to notice a missing patch still gets a flag): for each run of
a verdict, the share of its final submission's lines and whether its last test outcome are shown in its full
view and in the view the judge read (:mod:`kvjudge.retention.evidence` measures both); a view that shows less
than the full one *hides evidence*. Batches are summarised per view: mean share, views showing the submission
whole, views showing the test outcome, pairs with hidden evidence.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from kvjudge.retention.evidence import Visibility


def hides(before: Visibility | None, after: Visibility | None) -> bool | None:
    """``after`` shows less of the run's evidence than ``before`` (None: nothing measurable in either)."""
    if before is None or after is None:
        return None
    measured = False
    hidden = False
    if before.share is not None and after.share is not None:
        measured = True
        hidden = after.share < before.share
    if before.outcome_visible is not None and after.outcome_visible is not None:
        measured = True
        hidden = hidden or (before.outcome_visible and not after.outcome_visible)
    return hidden if measured else None


def visibility_from_json(data: dict[str, Any] | None) -> Visibility | None:
    """A :class:`Visibility` from its ``to_json()`` (the verdict cache keeps it so)."""
    if data is None:
        return None
    return Visibility(data["submission"], data["submission_lines"], data["submission_visible"],
                      data["verification"], data["verification_outcome_visible"])


@dataclass(frozen=True)
class RunEvidence:
    """One run's evidence in one verdict: in its full view (``full``) and in the view judged (``view``)."""

    full: Visibility | None
    view: Visibility | None

    @property
    def hidden(self) -> bool | None:
        """The judged view shows less than the full one."""
        return hides(self.full, self.view)

    def to_json(self) -> dict[str, Any]:
        return {"full": None if self.full is None else self.full.to_json(),
                "view": None if self.view is None else self.view.to_json(), "hidden": self.hidden}


def compared(before: Visibility | None, after: Visibility | None, names: tuple[str, str]) -> dict[str, Any]:
    """``{names[0]: …, names[1]: …, "hidden": …}``: two views of one run side by side."""
    return {names[0]: None if before is None else before.to_json(),
            names[1]: None if after is None else after.to_json(), "hidden": hides(before, after)}


def describe(visibility: Visibility | None) -> str:
    """A few words: ``patch 58/58 lines, test outcome shown``."""
    if visibility is None:
        return "not measured"
    if visibility.submission is None:
        words = ["no submission"]
    elif visibility.share is None:
        words = [f"{visibility.submission} (original gone)"]
    else:
        words = [f"{visibility.submission} {visibility.visible}/{visibility.lines} lines"]
    if visibility.verification is None:
        words.append("no test run")
    elif visibility.outcome_visible is not None:
        words.append(f"test outcome {'shown' if visibility.outcome_visible else 'hidden'}")
    return ", ".join(words)


def figures(views: Iterable[Visibility | None]) -> dict[str, Any]:
    """Batch figures over views: how many were measured, mean submission share, views showing it whole, views
    showing the last test outcome (of those with one)."""
    seen = [v for v in views if v is not None]
    shares = [v.share for v in seen if v.share is not None]
    outcomes = [v.outcome_visible for v in seen if v.outcome_visible is not None]
    return {"views": len(seen), "submissions_measured": len(shares),
            "mean_submission_share": sum(shares) / len(shares) if shares else None,
            "submission_whole": sum(share == 1.0 for share in shares),
            "outcomes_measured": len(outcomes), "outcome_visible": sum(outcomes)}


def batch(pairs: Sequence[tuple[str, str, Sequence[RunEvidence]]], names: tuple[str, str] = ("full", "view")) \
        -> dict[str, Any]:
    """Figures over ``(a, b, [evidence of a, evidence of b])`` per pair: each side's figures, and the pairs with a
    run whose judged view hides evidence."""
    runs = [e for _, _, both in pairs for e in both]
    hidden = [f"{a} vs {b}" for a, b, both in pairs if any(e.hidden for e in both)]
    return {names[0]: figures(e.full for e in runs), names[1]: figures(e.view for e in runs),
            "hidden_pairs": len(hidden), "hidden": hidden}


def summary_line(figures_of: dict[str, Any], names: tuple[str, str]) -> str:
    """One line for people: the mean submission share and test outcomes on both sides, the pairs flagged."""
    first, second = figures_of[names[0]], figures_of[names[1]]

    def share(f: dict[str, Any]) -> str:
        return "-" if f["mean_submission_share"] is None else f"{100 * f['mean_submission_share']:.0f} %"

    line = (f"evidence: submission lines shown {share(first)} {names[0]} → {share(second)} {names[1]} (mean over "
            f"{second['submissions_measured']} views); last test outcome shown in {first['outcome_visible']} → "
            f"{second['outcome_visible']} of {second['outcomes_measured']}")
    if figures_of["hidden_pairs"]:
        line += f"; HIDDEN by reduction in {figures_of['hidden_pairs']} pair(s): {', '.join(figures_of['hidden'])}"
    return line


__all__ = ["RunEvidence", "batch", "compared", "describe", "figures", "hides", "summary_line",
           "visibility_from_json"]
