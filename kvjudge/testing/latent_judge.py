"""A judge of known quality in process, for best-of-N selection at the library level: each run has a latent
quality, and every reading of the judge sees it through fresh Gaussian noise of a set σ.

- ``score_runs(run_ids)``: per run, quality + N(0, σ²) — a pointwise critic whose scores are that noisy;
- ``compare(pairs)``: per pair, 1.0 when the first run's reading (quality + noise) beats the second's, else 0.0 —
  two fresh readings per comparison, so the first run of a pair a quality gap Δ apart wins with probability
  Φ(Δ / (σ√2)), whatever the order (no position bias).

It implements :class:`kvjudge.judge.comparators.Scorer` and :class:`~kvjudge.judge.comparators.Comparator`, answers
at once (a zero-latency judge: what the selection harness itself costs is all a benchmark of it measures), and
counts what it was asked (``scored``, ``compared``, ``calls``). Readings are drawn from ``seed`` in the order they
are asked for. ``errors``: run ids whose every reading is an error (None).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass
class LatentJudge:
    """Readings of ``quality[run_id]`` through N(0, ``sigma``²) noise."""

    quality: Mapping[str, float]
    sigma: float
    seed: int = 0
    errors: frozenset[str] = frozenset()
    scored: int = 0
    compared: int = 0
    calls: int = 0
    _rng: Any = field(default=None, repr=False)

    def __post_init__(self) -> None:
        import numpy as np

        if self.sigma <= 0:
            raise ValueError(f"sigma must be positive, got {self.sigma}")
        self._rng = np.random.default_rng(self.seed)

    def _readings(self, run_ids: Sequence[str]) -> Any:
        import numpy as np

        quality = np.fromiter((self.quality[run_id] for run_id in run_ids), dtype=float, count=len(run_ids))
        return quality + self._rng.normal(0.0, self.sigma, len(run_ids))

    def score_runs(self, run_ids: Sequence[str]) -> dict[str, float | None]:
        self.calls += 1
        self.scored += len(run_ids)
        values = self._readings(run_ids)
        return {run_id: None if run_id in self.errors else float(value) for run_id, value in zip(run_ids, values)}

    def compare(self, pairs: Sequence[tuple[str, str]]) -> list[float | None]:
        self.calls += 1
        self.compared += len(pairs)
        first = self._readings([a for a, _ in pairs])
        second = self._readings([b for _, b in pairs])
        return [None if a in self.errors or b in self.errors else float(x > y)
                for (a, b), x, y in zip(pairs, first, second)]
