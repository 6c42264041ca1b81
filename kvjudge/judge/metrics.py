"""Critic metrics: how well scores and probabilities predict held-out grades, as verifiers are measured.

Pure functions over plain sequences (no store, no judge): a caller passes each run's (or pair's) score and its label.
Labels are truths as 0/1 (a run passed; run a of a pair was better). None is never a score here: a caller leaves
out what the judge could not score and counts it itself.

- :func:`wilson`: the Wilson score interval of a proportion (fractional successes allowed: ties as half);
- :func:`roc_auc`: the probability that a random positive scores above a random negative (ties count half; the
  Mann–Whitney statistic), None when one class is absent; :func:`bootstrap_interval` for its interval (percentile
  bootstrap over the items, fixed seed: the same inputs give the same interval);
- :func:`brier`, :func:`expected_calibration_error` and :func:`reliability_bins`: calibration over **equal-mass**
  bins (each bin holds as many items as the others, ± 1), so a judge that says 0.9 for nearly everything is not
  measured on three items in its lowest bin;
- :func:`fit_calibration`: a monotone map from raw probabilities to calibrated ones, isotonic (pool-adjacent-
  violators) or Platt (a logistic curve on the log-odds); :func:`held_out_calibration` fits it on one part of the
  items and reports ECE and Brier before and after on the **rest only** — never fitted and measured on the same
  items;
- :func:`length_controlled`: how far a pairwise judge's preference for run a moves with the length difference of
  the two runs (a least-squares slope per 1,000 characters with a bootstrap interval, and the preference at equal
  length), the length bias AlpacaEval controls for, to read beside position bias.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

Z95 = 1.959963984540054
DEFAULT_BINS = 10
BOOTSTRAP = 1000
SEED = 0
CALIBRATION_METHODS = ("isotonic", "platt")
# Platt's fit reads log-odds: probabilities are clipped this far from 0 and 1 so a judge that says 1.0 stays finite.
_CLIP = 1e-6
LENGTH_UNIT = 1000  # length differences are reported per this many characters


def wilson(successes: float, n: int, z: float = Z95) -> tuple[float, float] | None:
    """Wilson score interval for ``successes`` of ``n`` (fractional successes allowed: ties as half)."""
    if n <= 0:
        return None
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def _checked(values: Sequence[float], labels: Sequence[Any]) -> tuple[Any, Any]:
    import numpy as np

    x = np.asarray(values, dtype=float)
    y = np.asarray(labels, dtype=float)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError(f"scores and labels must be two sequences of one length, got {x.shape} and {y.shape}")
    if not np.all((y == 0) | (y == 1)):
        raise ValueError("labels must be 0 or 1 (False or True)")
    return x, y


def roc_auc(scores: Sequence[float], labels: Sequence[Any]) -> float | None:
    """ROC AUC: P(a random positive's score > a random negative's), a tie counting half; None without both classes."""
    from scipy.stats import rankdata

    x, y = _checked(scores, labels)
    positives = int(y.sum())
    negatives = len(y) - positives
    if positives == 0 or negatives == 0:
        return None
    ranks = rankdata(x)  # average ranks: a tie between a positive and a negative is half a win
    return float((ranks[y == 1].sum() - positives * (positives + 1) / 2) / (positives * negatives))


def bootstrap_interval(statistic: Callable[..., float | None], *arrays: Sequence[Any], n: int = BOOTSTRAP,
                       seed: int = SEED, level: float = 0.95) -> tuple[float, float] | None:
    """Percentile bootstrap interval of ``statistic(*arrays)``: the items (one index across every array) resampled
    with replacement ``n`` times from a fixed ``seed``. Resamples where the statistic is None (an AUC drawn with one
    class only) are left out; None when every one is."""
    import numpy as np

    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    columns = [np.asarray(a) for a in arrays]
    size = len(columns[0]) if columns else 0
    if size == 0 or any(len(c) != size for c in columns):
        raise ValueError("bootstrap_interval needs one or more non-empty arrays of one length")
    rng = np.random.default_rng(seed)
    values = []
    for _ in range(n):
        drawn = rng.integers(0, size, size)
        value = statistic(*(c[drawn] for c in columns))
        if value is not None:
            values.append(value)
    if not values:
        return None
    tail = (1 - level) / 2 * 100
    low, high = np.percentile(values, [tail, 100 - tail])
    return float(low), float(high)


def brier(probs: Sequence[float], labels: Sequence[Any]) -> float | None:
    """The mean squared difference between each probability and its 0/1 label (None for no items)."""
    p, y = _checked(probs, labels)
    return float(((p - y) ** 2).mean()) if len(p) else None


def _equal_mass(p: Any, bins: int) -> list[Any]:
    """Indexes of the items in ``bins`` bins of equal mass (sizes differ by at most one), lowest probabilities
    first; ties keep their input order (a stable sort), so the same inputs give the same bins."""
    import numpy as np

    if bins < 1:
        raise ValueError(f"bins must be at least 1, got {bins}")
    if len(p) == 0:
        return []
    order = np.argsort(p, kind="stable")
    return [part for part in np.array_split(order, min(bins, len(p))) if len(part)]


def reliability_bins(probs: Sequence[float], labels: Sequence[Any],
                     bins: int = DEFAULT_BINS) -> list[tuple[float, float, int]]:
    """Per equal-mass bin, lowest first: (mean predicted probability, observed rate of label 1, items)."""
    p, y = _checked(probs, labels)
    return [(float(p[part].mean()), float(y[part].mean()), len(part)) for part in _equal_mass(p, bins)]


def expected_calibration_error(probs: Sequence[float], labels: Sequence[Any], bins: int = DEFAULT_BINS) -> float | None:
    """ECE over equal-mass bins: Σ (items in bin / items) · |mean predicted − observed rate| (None for no items)."""
    rows = reliability_bins(probs, labels, bins)
    total = sum(count for _, _, count in rows)
    return sum(count / total * abs(mean - rate) for mean, rate, count in rows) if total else None


def _pool_adjacent_violators(y: Any) -> Any:
    """The non-decreasing sequence closest to ``y`` in squared error (``y`` in the order of its inputs)."""
    import numpy as np

    means: list[float] = []
    sizes: list[int] = []
    for value in y:
        means.append(float(value))
        sizes.append(1)
        while len(means) > 1 and means[-2] > means[-1]:  # pool the last two blocks until the order holds
            size = sizes[-2] + sizes[-1]
            means[-2] = (means[-2] * sizes[-2] + means[-1] * sizes[-1]) / size
            sizes[-2] = size
            means.pop()
            sizes.pop()
    return np.repeat(means, sizes)


def _logit(p: Any) -> Any:
    import numpy as np

    p = np.clip(p, _CLIP, 1 - _CLIP)
    return np.log(p / (1 - p))


def _fit_logistic(x: Any, y: Any) -> tuple[float, float]:
    """(intercept, slope) of P(y) = σ(intercept + slope·x) by maximum likelihood (``y`` may be soft, in [0, 1])."""
    import numpy as np
    from scipy.optimize import minimize

    def objective(theta: Any) -> tuple[float, Any]:
        z = theta[0] + theta[1] * x
        loss = float(np.sum(y * np.logaddexp(0.0, -z) + (1 - y) * np.logaddexp(0.0, z)))
        residual = 1.0 / (1.0 + np.exp(-z)) - y
        return loss, np.array([residual.sum(), (residual * x).sum()])

    result = minimize(objective, np.zeros(2), jac=True, method="L-BFGS-B")
    return float(result.x[0]), float(result.x[1])


def fit_calibration(probs: Sequence[float], labels: Sequence[Any],
                    method: str = "isotonic") -> Callable[[Sequence[float]], Any]:
    """A map from raw probabilities to calibrated ones, fitted on ``probs`` and their ``labels``.

    ``isotonic``: the pool-adjacent-violators fit of the labels on the sorted probabilities, read between fitted
    points by linear interpolation (constant beyond the ends). ``platt``: σ(a + b·logit(p)) with a, b by maximum
    likelihood. The map takes a sequence and returns a numpy array."""
    import numpy as np

    if method not in CALIBRATION_METHODS:
        raise ValueError(f"unknown calibration method {method!r}; use one of {', '.join(CALIBRATION_METHODS)}")
    p, y = _checked(probs, labels)
    if len(p) == 0:
        raise ValueError("a calibration map needs at least one labelled item")
    if method == "platt":
        intercept, slope = _fit_logistic(_logit(p), y)
        return lambda values: 1.0 / (1.0 + np.exp(-(intercept + slope * _logit(np.asarray(values, dtype=float)))))
    order = np.argsort(p, kind="stable")
    fitted = _pool_adjacent_violators(y[order])
    xs, first = np.unique(p[order], return_index=True)
    # Equal probabilities share one fitted value (their block's): read the mean over each distinct probability.
    ys = np.array([fitted[start:end].mean() for start, end in zip(first, [*first[1:], len(fitted)])])
    return lambda values: np.interp(np.asarray(values, dtype=float), xs, ys)


def held_out_calibration(probs: Sequence[float], labels: Sequence[Any], method: str = "isotonic", *,
                         fit_fraction: float = 0.5, seed: int = SEED, bins: int = DEFAULT_BINS) -> dict[str, Any]:
    """Fit a calibration map on a random ``fit_fraction`` of the items (seeded) and measure ECE and Brier before and
    after it on the other items only. ``fit`` and ``held_out`` are how many items each part has; figures are None
    where a part is empty."""
    import numpy as np

    if not 0 < fit_fraction < 1:
        raise ValueError(f"fit_fraction must be in (0, 1), got {fit_fraction}")
    p, y = _checked(probs, labels)
    order = np.random.default_rng(seed).permutation(len(p))
    cut = int(round(len(p) * fit_fraction))
    fit, rest = order[:cut], order[cut:]
    result: dict[str, Any] = {"method": method, "fit": len(fit), "held_out": len(rest), "seed": seed, "bins": bins,
                              "before": {"ece": None, "brier": None}, "after": {"ece": None, "brier": None}}
    if len(fit) == 0 or len(rest) == 0:
        return result
    calibrated = fit_calibration(p[fit], y[fit], method)(p[rest])
    for name, values in (("before", p[rest]), ("after", calibrated)):
        result[name] = {"ece": expected_calibration_error(values, y[rest], bins), "brier": brier(values, y[rest])}
    return result


def _slope(x: Any, y: Any) -> float | None:
    """The least-squares slope of ``y`` on ``x`` (None when ``x`` does not vary)."""
    spread = float(((x - x.mean()) ** 2).sum())
    return float(((x - x.mean()) * (y - y.mean())).sum() / spread) if spread else None


def length_controlled(preferences: Sequence[float], length_differences: Sequence[float], *,
                      unit: float = LENGTH_UNIT, bootstrap: int = BOOTSTRAP, seed: int = SEED) -> dict[str, Any]:
    """How far a pairwise judge's preference moves with the runs' length difference.

    ``preferences``: per pair, the judge's probability that run a is better (p_a); ``length_differences``: length of
    a − length of b (characters of the views). Returns ``slope`` (the least-squares change in p_a per ``unit``
    characters of difference, 0: no length bias) with its percentile bootstrap interval ``slope_ci95``,
    ``at_equal_length`` (the fitted p_a where the lengths are equal), ``logistic_slope`` (the same in log-odds
    per ``unit``: p_a as a soft label), and ``longer_preferred`` (of pairs with different lengths and a preference,
    the share where the longer run is the one preferred)."""
    import numpy as np

    p = np.asarray(preferences, dtype=float)
    d = np.asarray(length_differences, dtype=float) / unit
    if p.shape != d.shape or p.ndim != 1:
        raise ValueError("preferences and length differences must be two sequences of one length")
    if np.any((p < 0) | (p > 1)):
        raise ValueError("preferences must be probabilities in [0, 1]")
    result: dict[str, Any] = {"pairs": len(p), "unit_chars": unit, "slope": None, "slope_ci95": None,
                              "at_equal_length": None, "logistic_slope": None, "longer_preferred": None}
    leaning = (d != 0) & (p != 0.5)
    if leaning.any():
        result["longer_preferred"] = float(((p[leaning] > 0.5) == (d[leaning] > 0)).mean())
    slope = _slope(d, p) if len(p) >= 2 else None
    if slope is None:
        return result
    result.update(slope=slope, at_equal_length=float(p.mean() - slope * d.mean()),
                  logistic_slope=_fit_logistic(d, p)[1],
                  slope_ci95=bootstrap_interval(_slope, d, p, n=bootstrap, seed=seed))
    return result
