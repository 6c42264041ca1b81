"""PNG reliability diagrams of scores against held-out labels (matplotlib), for ``eval`` and the benchmarks.

A diagram draws :func:`kvjudge.judge.metrics.reliability_bins` rows — (mean predicted, observed rate, items) per
equal-mass bin — one line per series (a judge setting, a protocol, before and after calibration), each point
labelled with its items, beside the diagonal of perfect calibration. The HTML report draws the same rows as inline
SVG (:func:`kvjudge.report.charts.calibration_chart`): its pages load nothing, a PNG file included.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

Bins = Sequence[tuple[float, float, int]]


def plot_reliability_bins(series: Mapping[str, Bins], path: Any, *, title: str = "Reliability against held-out "
                          "grades", xlabel: str = "predicted probability (equal-mass bins)",
                          ylabel: str = "observed rate") -> None:
    """Write a PNG to ``path``: each series' bins as a line of points, the diagonal for reference."""
    # The figure alone, drawn by Agg: pyplot's state machine and backend loading cost a command a tenth of a second.
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6, 5))
    ax = fig.subplots()
    ax.plot([0, 1], [0, 1], color="grey", linewidth=1, label="perfectly calibrated")
    for label, rows in series.items():
        rows = [row for row in rows if row[2]]
        ax.plot([r[0] for r in rows], [r[1] for r in rows], marker="o",
                label=f"{label} (n={sum(r[2] for r in rows)})")
        for mean, rate, count in rows:
            ax.annotate(str(count), (mean, rate), fontsize=7, xytext=(3, 3), textcoords="offset points")
    ax.set_xlim(0, 1)
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
