"""The report's charts as geometry: numbers placed on an SVG canvas, drawn by the templates (charts.html).

Only coordinates are computed here; every label (agent names come from runs) is written by the autoescaping
templates. No chart loads anything: each is an inline ``<svg>`` element of the page.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kvjudge.judge.evaluate import BASELINES

# Canvas sizes (SVG user units; the page scales them to its width).
WIDTH = 640
ROW = 28
LEFT = 200        # room for the row labels
RIGHT = 24
TOP = 16
AXIS = 36         # room for the axis labels under the rows
SQUARE = 320      # the reliability diagram's plot area


@dataclass(frozen=True)
class Scale:
    """A linear map from data values ``low``–``high`` to canvas positions ``start``–``end``."""

    low: float
    high: float
    start: float
    end: float

    def __call__(self, value: float) -> float:
        span = self.high - self.low or 1.0
        return round(self.start + (value - self.low) / span * (self.end - self.start), 2)

    def ticks(self, values: Sequence[float], digits: int = 1) -> list[dict[str, Any]]:
        return [{"at": self(v), "label": f"{v:.{digits}f}"} for v in values]


def _interval_rows(items: Sequence[tuple[str, float | None, Sequence[float] | None]], scale: Scale) \
        -> list[dict[str, Any]]:
    rows = []
    for index, (label, value, interval) in enumerate(items):
        y = TOP + ROW * index + ROW / 2
        row: dict[str, Any] = {"label": label, "y": y, "value": value, "x": None, "low": None, "high": None}
        if value is not None:
            low, high = interval or (value, value)
            row.update(x=scale(value), low=scale(low), high=scale(high), interval=(low, high))
        rows.append(row)
    return rows


def accuracy_chart(evaluation: Mapping[str, Any]) -> dict[str, Any]:
    """Accuracy (ties as half) with its Wilson 95 % interval: the judge, then each baseline on the same pairs."""
    scale = Scale(0.0, 1.0, LEFT, WIDTH - RIGHT)
    judge = evaluation["judge"]
    items = [("judge", judge["accuracy_ties_half"], judge["accuracy_ties_half_ci95"])]
    items += [(name.replace("_", "-"), evaluation["baselines"][name]["accuracy_ties_half"],
               evaluation["baselines"][name]["accuracy_ties_half_ci95"]) for name in BASELINES]
    rows = _interval_rows(items, scale)
    bottom = TOP + ROW * len(rows)
    return {"width": WIDTH, "height": bottom + AXIS, "rows": rows, "bottom": bottom, "left": LEFT,
            "ticks": scale.ticks([0.0, 0.25, 0.5, 0.75, 1.0], 2), "half": scale(0.5),
            "title": "Accuracy, ties as half, with Wilson 95 % intervals"}


def ranking_chart(ranking: Mapping[str, Any]) -> dict[str, Any] | None:
    """Each agent's Bradley–Terry strength with its bootstrap 95 % interval (None: nothing ranked)."""
    agents = ranking.get("agents") or []
    if not agents:
        return None
    values = [v for r in agents for v in (r["strength"], *(r["ci95"] or ()))]
    reach = max(1.0, *(abs(v) for v in values))
    scale = Scale(-reach, reach, LEFT, WIDTH - RIGHT)
    items = [(f"{r['agent']} ({r['wins']}-{r['ties']}-{r['losses']})", r["strength"], r["ci95"]) for r in agents]
    rows = _interval_rows(items, scale)
    bottom = TOP + ROW * len(rows)
    return {"width": WIDTH, "height": bottom + AXIS, "rows": rows, "bottom": bottom, "left": LEFT,
            "ticks": scale.ticks([-reach, -reach / 2, 0.0, reach / 2, reach], 2), "zero": scale(0.0),
            "title": "Bradley–Terry log-strength with bootstrap 95 % intervals"}


def reliability_chart(bins: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The reliability diagram: per bin of p_a, its mean against the share of pairs where run a was better."""
    margin = 48
    x = Scale(0.0, 1.0, margin, margin + SQUARE)
    y = Scale(0.0, 1.0, TOP + SQUARE, TOP)
    points = [{"x": x(b["mean_p_a"]), "y": y(b["a_better"]), "pairs": b["pairs"], "mean_p_a": b["mean_p_a"],
               "a_better": b["a_better"], "low": b["low"], "high": b["high"]}
              for b in bins if b["pairs"]]
    return {"width": margin + SQUARE + RIGHT, "height": TOP + SQUARE + AXIS + 12, "points": points,
            "x0": x(0.0), "x1": x(1.0), "y0": y(0.0), "y1": y(1.0),
            "xticks": x.ticks([0.0, 0.2, 0.4, 0.6, 0.8, 1.0]), "yticks": y.ticks([0.0, 0.2, 0.4, 0.6, 0.8, 1.0]),
            "title": "Reliability: p_a (binned) against the share of pairs where run a has the higher grade",
            "xlabel": "judge's p_a (binned)", "unit": "pair(s)", "predicted": "mean p_a", "observed": "run a better in",
            "empty": "no scored verdict on pairs with different grades"}


def calibration_chart(rows: Sequence[Sequence[float]], title: str = "Reliability: predicted probability "
                      "(equal-mass bins) against the observed pass rate") -> dict[str, Any]:
    """The reliability diagram of :func:`kvjudge.judge.metrics.reliability_bins` rows (mean predicted, observed
    rate, items), in the geometry :func:`reliability_chart` gives the template's ``reliability`` macro."""
    bins = [{"mean_p_a": mean, "a_better": rate, "pairs": count, "low": mean, "high": mean}
            for mean, rate, count in rows]
    return {**reliability_chart(bins), "title": title, "xlabel": "predicted probability (equal-mass bins)",
            "unit": "item(s)", "predicted": "mean predicted", "observed": "observed rate", "empty": "no labelled item"}
