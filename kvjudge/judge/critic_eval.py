"""Scores measured as critics are measured: a pointwise protocol's P(success) against the runs' held-out grades
(ROC AUC with a bootstrap interval, Brier, ECE and the reliability bins over equal-mass bins, calibration maps fitted
on one part of the runs and reported on the rest, how well each criterion predicts the grade), and a pairwise
protocol's p_a as a score of "run a is the better" (its AUC, overall and per criterion). The metrics are
:mod:`kvjudge.judge.metrics`'; this module only says what is measured against what.

A run succeeded when its best grade is at least :data:`SUCCESS_AT` (SWE-bench's resolved 1.0, a Harbor reward of
1.0; a fractional grade counts when it is at least half). A run without a grade, and a score that is not one (an
error, an overflow), are left out and counted.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from kvjudge.judge.metrics import (
    CALIBRATION_METHODS,
    bootstrap_interval,
    brier,
    expected_calibration_error,
    held_out_calibration,
    reliability_bins,
    roc_auc,
)

if TYPE_CHECKING:
    from kvjudge.judge.pointwise import RunScore
    from kvjudge.judge.verdict import Verdict

SUCCESS_AT = 0.5


def _auc_figures(scores: Sequence[float], labels: Sequence[int]) -> dict[str, Any]:
    auc = roc_auc(scores, labels) if scores else None
    return {"auc": auc, "auc_ci95": bootstrap_interval(roc_auc, scores, labels) if auc is not None else None}


def score_figures(scores: Sequence[RunScore], grades: Mapping[str, float | None]) -> dict[str, Any]:
    """A pointwise protocol's figures over the runs of ``scores`` whose grade (by run id) is known."""
    graded = [s for s in scores if s.scored and grades.get(s.run_id) is not None]
    probs = [float(s.p_success) for s in graded if s.p_success is not None]
    labels = [int(float(grades[s.run_id]) >= SUCCESS_AT) for s in graded]  # type: ignore[arg-type]
    figures: dict[str, Any] = {
        "runs": len(scores), "scored": sum(s.scored for s in scores), "graded": len(graded),
        "ungraded": sum(grades.get(s.run_id) is None for s in scores), "succeeded": sum(labels),
        **_auc_figures(probs, labels),
        "brier": brier(probs, labels) if probs else None,
        "ece": expected_calibration_error(probs, labels) if probs else None,
        "reliability": [{"mean_p": m, "observed": o, "runs": n} for m, o, n in reliability_bins(probs, labels)]
        if probs else [],
        "calibration": {method: held_out_calibration(probs, labels, method) for method in CALIBRATION_METHODS}
        if len(probs) >= 4 else {},
        "criteria": {},
    }
    for name in (graded[0].criteria if graded else {}):
        values = [float(s.criteria[name]["mean"]) for s in graded]
        figures["criteria"][name] = {**_auc_figures(values, labels), "brier": brier(values, labels)}
    return figures


def pairwise_score_figures(verdicts: Sequence[Verdict], truths: Mapping[tuple[str, str], str]) -> dict[str, Any]:
    """p_a as a score of "run a is the better" over the pairs whose truth is a or b: its AUC (with interval), and
    each criterion's (a scale protocol's per-criterion means)."""
    judged = [v for v in verdicts if v.scored and v.p_a is not None and truths.get((v.a, v.b)) in ("a", "b")]
    labels = [int(truths[(v.a, v.b)] == "a") for v in judged]
    figures: dict[str, Any] = {"pairs": len(judged), **_auc_figures([float(v.p_a) for v in judged], labels),
                               "criteria": {}}
    criteria = [v.reading_figures().get("criteria", {}) for v in judged]
    for name in (criteria[0] if criteria else {}):
        figures["criteria"][name] = _auc_figures([float(c[name]["mean"]) for c in criteria], labels)
    return figures


__all__ = ["SUCCESS_AT", "pairwise_score_figures", "score_figures"]
