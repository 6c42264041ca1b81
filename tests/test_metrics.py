"""The critic metrics (kvjudge/judge/metrics.py), each against a case worked by hand."""

from __future__ import annotations

import math
import random

import pytest

from kvjudge.judge import metrics as m
from kvjudge.judge.evaluate import wilson as evaluate_wilson


def test_wilson_is_the_formula_and_evaluate_still_exports_it() -> None:
    # 8 of 10 at z = 1.96: centre (0.8 + 0.19208) / 1.38416, half 1.96·√(0.016 + 0.0009604) / 1.38416.
    z = m.Z95
    centre = (0.8 + z * z / 20) / (1 + z * z / 10)
    half = z * math.sqrt(0.8 * 0.2 / 10 + z * z / 400) / (1 + z * z / 10)
    assert m.wilson(8, 10) == pytest.approx((centre - half, centre + half))
    assert m.wilson(8, 10) == pytest.approx((0.4902, 0.9433), abs=1e-4)
    assert evaluate_wilson is m.wilson and m.wilson(3, 0) is None


def test_auc_counts_ties_half_and_is_none_for_one_class() -> None:
    # Positives 0.9, 0.5; negatives 0.5, 0.1. Pairs (pos, neg): (0.9,0.5) 1, (0.9,0.1) 1, (0.5,0.5) ½, (0.5,0.1) 1.
    assert m.roc_auc([0.9, 0.5, 0.5, 0.1], [1, 1, 0, 0]) == pytest.approx(3.5 / 4)
    assert m.roc_auc([0.1, 0.2, 0.3], [1, 0, 0]) == 0.0
    assert m.roc_auc([0.3, 0.3], [True, False]) == 0.5
    assert m.roc_auc([0.1, 0.9], [1, 1]) is None
    with pytest.raises(ValueError):
        m.roc_auc([0.1, 0.2], [1, 2])


def test_bootstrap_interval_is_seeded_holds_the_estimate_and_skips_undefined_resamples() -> None:
    rng = random.Random(3)
    labels = [rng.random() < 0.5 for _ in range(200)]
    scores = [float(y) + rng.gauss(0, 1) for y in labels]
    auc = m.roc_auc(scores, labels)
    first = m.bootstrap_interval(m.roc_auc, scores, labels, n=300, seed=5)
    assert first == m.bootstrap_interval(m.roc_auc, scores, labels, n=300, seed=5)
    assert first[0] < auc < first[1] and first[1] - first[0] < 0.25
    # Two items of different classes: a resample drawing one class only has no AUC and is left out.
    assert m.bootstrap_interval(m.roc_auc, [0.2, 0.8], [0, 1], n=50) == (1.0, 1.0)
    assert m.bootstrap_interval(lambda x: None, [1.0], n=5) is None


def test_brier_ece_and_equal_mass_bins_by_hand() -> None:
    probs = [0.1, 0.2, 0.3, 0.4, 0.6, 0.7, 0.8, 0.9]
    labels = [0, 0, 1, 0, 1, 1, 0, 1]
    # Brier: (.01 + .04 + .49 + .16 + .16 + .09 + .64 + .01) / 8 = 1.6 / 8.
    assert m.brier(probs, labels) == pytest.approx(0.2)
    # Two equal-mass bins of four: means 0.25 and 0.75, observed 1/4 and 3/4: perfectly calibrated bins.
    assert m.reliability_bins(probs, labels, bins=2) == [(pytest.approx(0.25), 0.25, 4), (pytest.approx(0.75), 0.75, 4)]
    assert m.expected_calibration_error(probs, labels, bins=2) == pytest.approx(0.0)
    # Four bins of two: |0.15 − 0| + |0.35 − 0.5| + |0.65 − 1| + |0.85 − 0.5|, each weighted 2/8.
    assert m.expected_calibration_error(probs, labels, bins=4) == pytest.approx((0.15 + 0.15 + 0.35 + 0.35) / 4)
    # Equal mass, not equal width: nine items at 0.9 and one at 0.1 in two bins are five and five.
    assert [count for _, _, count in m.reliability_bins([0.9] * 9 + [0.1], [1] * 10, bins=2)] == [5, 5]
    assert m.brier([], []) is None and m.expected_calibration_error([], []) is None


def test_isotonic_map_is_pool_adjacent_violators() -> None:
    # Labels in order of p: 1, 0, 0, 1 → pooled: (1, 0, 0) averages ⅓, then 1.
    calibrate = m.fit_calibration([0.1, 0.2, 0.3, 0.4], [1, 0, 0, 1], "isotonic")
    assert list(calibrate([0.1, 0.2, 0.3, 0.4])) == pytest.approx([1 / 3, 1 / 3, 1 / 3, 1.0])
    assert list(calibrate([0.0, 0.35, 0.9])) == pytest.approx([1 / 3, (1 / 3 + 1) / 2, 1.0])  # interpolated, flat
    # Ties share their block's value.
    assert list(m.fit_calibration([0.5, 0.5, 0.7], [0, 1, 1])([0.5, 0.7])) == pytest.approx([0.5, 1.0])
    with pytest.raises(ValueError):
        m.fit_calibration([0.5], [1], "temperature")


def test_platt_map_recovers_a_known_logistic_curve() -> None:
    # Labels drawn from P(y) = σ(2·logit(p) − 0.5): the fitted map matches that curve.
    rng = random.Random(11)
    probs = [rng.uniform(0.02, 0.98) for _ in range(4000)]

    def truth(p: float) -> float:
        return 1 / (1 + math.exp(-(2 * math.log(p / (1 - p)) - 0.5)))

    labels = [rng.random() < truth(p) for p in probs]
    calibrate = m.fit_calibration(probs, labels, "platt")
    for p in (0.2, 0.5, 0.8):
        assert calibrate([p])[0] == pytest.approx(truth(p), abs=0.04)


def test_held_out_calibration_fits_on_one_part_and_measures_the_rest() -> None:
    # An overconfident judge: it says 0.95 / 0.05 but is right 70 % of the time.
    rng = random.Random(2)
    labels = [rng.random() < 0.5 for _ in range(600)]
    probs = [(0.95 if y else 0.05) if rng.random() < 0.7 else (0.05 if y else 0.95) for y in labels]
    result = m.held_out_calibration(probs, labels, "isotonic", fit_fraction=0.5, seed=1)
    assert (result["fit"], result["held_out"]) == (300, 300)
    # Before: |0.95 − 0.7| in every bin ≈ 0.25 (sampling moves it a little); after: near 0 on items never fitted.
    assert result["before"]["ece"] == pytest.approx(0.25, abs=0.06)
    assert result["after"]["ece"] < 0.1 and result["after"]["brier"] < result["before"]["brier"]
    # Brier before is 0.7·0.05² + 0.3·0.95² ≈ 0.2725; after, about 0.7·0.3 = 0.21.
    assert result["before"]["brier"] == pytest.approx(0.2725, abs=0.05)
    assert result["after"]["brier"] == pytest.approx(0.21, abs=0.03)
    with pytest.raises(ValueError):
        m.held_out_calibration(probs, labels, fit_fraction=1.0)


def test_length_controlled_reads_the_slope_of_preference_on_length_difference() -> None:
    # p_a = 0.6 + 0.1 per 1,000 characters of difference, exactly: slope 0.1, 0.6 at equal length.
    differences = [-2000, -1000, 0, 1000, 2000, 500]
    preferences = [0.6 + 0.1 * d / 1000 for d in differences]
    result = m.length_controlled(preferences, differences, bootstrap=200)
    assert result["slope"] == pytest.approx(0.1) and result["at_equal_length"] == pytest.approx(0.6)
    assert result["slope_ci95"] == pytest.approx((0.1, 0.1))
    assert result["logistic_slope"] > 0
    # Longer preferred: of the pairs with a length difference and p_a ≠ 0.5 (all but d=0, and -1000 gives 0.5):
    # d = -2000 (p 0.4: b, the longer, preferred), 1000, 2000, 500 (a, the longer, preferred): 4 of 4.
    assert result["longer_preferred"] == 1.0
    flat = m.length_controlled([0.7, 0.3, 0.7, 0.3], [100, 100, -100, -100], bootstrap=100)
    assert flat["slope"] == pytest.approx(0.0) and flat["longer_preferred"] == 0.5
    assert m.length_controlled([0.5, 0.9], [10, 10])["slope"] is None  # no spread in length: no slope


def test_the_reliability_diagram_draws_as_a_png_and_as_inline_svg_for_the_report(tmp_path) -> None:
    from kvjudge.judge.diagrams import plot_reliability_bins
    from kvjudge.report.charts import calibration_chart
    from kvjudge.report.pages import environment

    rows = m.reliability_bins([0.1, 0.2, 0.3, 0.4, 0.6, 0.7, 0.8, 0.9], [0, 0, 1, 0, 1, 1, 0, 1], bins=4)
    png = tmp_path / "reliability.png"
    plot_reliability_bins({"judge": rows, "<calibrated>": rows}, png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    chart = calibration_chart(rows)
    # Bin 1 (mean 0.15, observed 0) sits at x = 48 + 0.15·320, y at the bottom of the square.
    assert (chart["points"][0]["x"], chart["points"][0]["y"]) == (pytest.approx(96.0), chart["y0"])
    svg = environment().from_string('{% import "charts.html" as charts %}{{ charts.reliability(chart, "calib") }}'
                                    ).render(chart={**chart, "title": "<b>scores</b>"})
    assert svg.count("<circle") == 4 and 'id="calib"' in svg and "style=" not in svg
    assert "&lt;b&gt;scores&lt;/b&gt;" in svg  # text is autoescaped: a label never becomes markup
