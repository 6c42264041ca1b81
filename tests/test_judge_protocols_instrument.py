"""The scale protocols read a judge of known quality right: on a few hundred synthetic runs, through the simulated
judge's scale mode (:mod:`kvjudge.testing.sim_judge`: each run a latent quality, each reading a distribution over
the scale centred on it with noise σ drawn per prompt), the figures read back are those σ and K predict.

The predictions are computed here, in closed form, from the simulator's model alone — never by calling the code
under test: with qualities ``q = μ± + τ·z`` (μ± = 0.6 / 0.4 by grade) and each reading ``q + σ·z`` (clipped to
[0, 1], which these parameters make negligible), a run's mean of K readings has noise ``σ/√K``, so

- pointwise ROC AUC (a passing run scores above a failing one) = Φ(Δ / √(2 (τ² + σ²/K))), Δ = 0.2;
- pairwise-scale accuracy (p_a on the better run's side): a reading centres on ``0.5 + (q_a − q_b)/2`` and the 2K
  readings of a verdict (K per order, un-swapped) average their noise, so accuracy = Φ((Δ/2) / √(τ²/2 + σ²/(2K))).

Calibration: qualities drawn so that P(grade = 1 | q) = q (q ~ U(0.1, 0.9) and the grade ~ Bernoulli(q), drawn
here as q given the grade), so the calibrated simulator's P(success) has an expected calibration error near what
sampling alone gives, the overconfident one (``sharpen`` 3) a large one, and a map fitted on half the runs brings
the other half's down.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Callable, Sequence
from pathlib import Path
from statistics import NormalDist

import pytest
from helpers import store_from_runs

from kvjudge.judge import Judge, judge_batch, open_servers
from kvjudge.judge.critic_eval import score_figures
from kvjudge.judge.pointwise import score_runs
from kvjudge.judge.protocols import Criterion, Rubric, make_protocol
from kvjudge.retention import Store
from kvjudge.testing.graded_runs import GradedRun, swe_run
from kvjudge.testing.sim_judge import AnswerKey, KeyEntry, Settings, SimJudgeServer

PHI = NormalDist().cdf
TASKS = 100  # each with a passing and a failing run: 200 runs, 100 pairs
DELTA, TAU, SIGMA = 0.2, 0.05, 0.15
ONE = Rubric((Criterion("overall", "The run accomplished its task."),), source="the test rubric")


def _runs() -> list[GradedRun]:
    return [swe_run(f"{side}/t{n}", task=f"t{n}", passed=side == "pass", seed=n, explore=0, file_lines=3, changed=2)
            for n in range(TASKS) for side in ("pass", "fail")]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[GradedRun]]:
    """The runs in a store (one ingest for the module's tests); each test writes its own answer key."""
    runs = _runs()
    path = tmp_path_factory.mktemp("instrument") / "store.sqlite"
    store_from_runs(path, [r.run for r in runs]).close()
    return path, runs


def _key(runs: Sequence[GradedRun], quality: Callable[[GradedRun, random.Random], float], seed: int) -> AnswerKey:
    rng = random.Random(seed)
    return AnswerKey([dataclasses.replace(r.key, quality=quality(r, rng)) for r in runs])


def _separated(run: GradedRun, rng: random.Random) -> float:
    return (0.5 + DELTA / 2 if run.key.grade else 0.5 - DELTA / 2) + rng.gauss(0, TAU)


def _judge(url: str, protocol: str, repeats: int, **kwargs: object) -> Judge:
    pool = open_servers([url], n_ctx=8192, parallel=8)
    return Judge(pool, margin=0.0, protocol=make_protocol(protocol, rubric=ONE, repeats=repeats, **kwargs))


def _auc(positives: Sequence[float], negatives: Sequence[float]) -> float:
    """Mann–Whitney: the share of (positive, negative) pairs ordered right, ties as half."""
    wins = sum((p > n) + 0.5 * (p == n) for p in positives for n in negatives)
    return wins / (len(positives) * len(negatives))


def _auc_se(auc: float, n_pos: int, n_neg: int) -> float:
    """Hanley & McNeil's standard error of an AUC."""
    q1, q2 = auc / (2 - auc), 2 * auc ** 2 / (1 + auc)
    return math.sqrt((auc * (1 - auc) + (n_pos - 1) * (q1 - auc ** 2) + (n_neg - 1) * (q2 - auc ** 2))
                     / (n_pos * n_neg))


def test_pointwise_auc_reads_back_what_sigma_and_k_predict(world: tuple[Path, list[GradedRun]]) -> None:
    path, runs = world
    key = _key(runs, _separated, seed=3)
    measured = {}
    with SimJudgeServer(key, Settings(sigma=SIGMA, seed=5)) as server, Store.open(path) as store:
        for repeats in (1, 4):
            judge = _judge(server.url, "pointwise", repeats)
            scores = score_runs(judge, store, [r.id for r in runs])
            judge.backend.close()
            assert all(s.scored for s in scores) and all(len(s.readings) == repeats for s in scores)
            by_run = {s.run_id: s.p_success for s in scores}
            positives = [by_run[r.id] for r in runs if r.key.grade]
            negatives = [by_run[r.id] for r in runs if not r.key.grade]
            measured[repeats] = _auc(positives, negatives)
            predicted = PHI(DELTA / math.sqrt(2 * (TAU ** 2 + SIGMA ** 2 / repeats)))
            assert abs(measured[repeats] - predicted) < 3 * _auc_se(predicted, len(positives), len(negatives)), \
                (repeats, measured[repeats], predicted)
    assert measured[4] > measured[1]


def test_pairwise_scale_accuracy_rises_from_k1_to_k4_as_predicted(world: tuple[Path, list[GradedRun]]) -> None:
    path, runs = world
    key = _key(runs, _separated, seed=4)
    pairs = [(runs[i].id, runs[i + 1].id) if i % 4 == 0 else (runs[i + 1].id, runs[i].id)
             for i in range(0, len(runs), 2)]  # the passing run first in half the pairs
    better = {pair: pair[0].startswith("pass") for pair in pairs}
    accuracy = {}
    with SimJudgeServer(key, Settings(sigma=SIGMA, seed=6)) as server, Store.open(path) as store:
        for repeats in (1, 4):
            judge = _judge(server.url, "pairwise-scale", repeats)
            verdicts = judge_batch(judge, store, pairs)
            judge.backend.close()
            assert all(v.p_a is not None and len(v.orders) == 2 * repeats for v in verdicts)
            right = [(v.p_a > 0.5) == better[(v.a, v.b)] for v in verdicts]
            accuracy[repeats] = sum(right) / len(right)
            predicted = PHI((DELTA / 2) / math.sqrt(TAU ** 2 / 2 + SIGMA ** 2 / (2 * repeats)))
            interval = 3 * math.sqrt(predicted * (1 - predicted) / len(pairs))
            assert abs(accuracy[repeats] - predicted) < interval, (repeats, accuracy[repeats], predicted)
    predicted_rise = (PHI((DELTA / 2) / math.sqrt(TAU ** 2 / 2 + SIGMA ** 2 / 8))
                      - PHI((DELTA / 2) / math.sqrt(TAU ** 2 / 2 + SIGMA ** 2 / 2)))
    assert accuracy[4] - accuracy[1] > predicted_rise / 3  # rises, by about what K predicts (≈ 0.13 here)


# ------------------------------------------------------------------------------------------------ calibration
def _calibrated(run: GradedRun, rng: random.Random) -> float:
    """q given the grade, for q ~ U(0.1, 0.9) and grade ~ Bernoulli(q): density ∝ q (passed) or ∝ 1 − q."""
    low, high = 0.1, 0.9
    draw = math.sqrt(low ** 2 + rng.random() * (high ** 2 - low ** 2))
    return draw if run.key.grade else 1.0 - draw


def _ece(probs: Sequence[float], labels: Sequence[int], bins: int = 10) -> float:
    """Expected calibration error over equal-mass bins (computed here, apart from the code under test)."""
    order = sorted(range(len(probs)), key=lambda i: probs[i])
    total = 0.0
    for b in range(bins):
        members = order[b * len(order) // bins:(b + 1) * len(order) // bins]
        gap = sum(labels[i] - probs[i] for i in members) / len(members)
        total += abs(gap) * len(members) / len(order)
    return total


def _binning_map(probs: Sequence[float], labels: Sequence[int], bins: int = 5) -> Callable[[float], float]:
    """A histogram-binning calibration map fitted on (probs, labels): each equal-mass bin's observed rate."""
    order = sorted(range(len(probs)), key=lambda i: probs[i])
    edges, rates = [], []
    for b in range(bins):
        members = order[b * len(order) // bins:(b + 1) * len(order) // bins]
        edges.append(probs[members[-1]])
        rates.append(sum(labels[i] for i in members) / len(members))

    def mapped(p: float) -> float:
        return next((rate for edge, rate in zip(edges, rates) if p <= edge), rates[-1])

    return mapped


def test_ece_is_near_zero_for_the_calibrated_judge_large_for_the_overconfident_one_and_a_held_out_map_fixes_it(
        world: tuple[Path, list[GradedRun]]) -> None:
    path, runs = world
    key = _key(runs, _calibrated, seed=8)
    labels = [int(r.key.grade) for r in runs]
    ece = {}
    with Store.open(path) as store:
        for sharpen in (1.0, 3.0):
            with SimJudgeServer(key, Settings(sigma=0.05, sharpen=sharpen, seed=9)) as server:
                judge = _judge(server.url, "pointwise", 1)
                scored = {s.run_id: s for s in score_runs(judge, store, [r.id for r in runs])}
                scores = {run_id: s.p_success for run_id, s in scored.items()}
                judge.backend.close()
            probs = [scores[r.id] for r in runs]
            ece[sharpen] = _ece(probs, labels)
            if sharpen > 1:
                fit = [i for i in range(len(runs)) if (i // 2) % 2 == 0]  # half the tasks, both their runs
                held = [i for i in range(len(runs)) if (i // 2) % 2 == 1]
                mapped = _binning_map([probs[i] for i in fit], [labels[i] for i in fit])
                ece["held_raw"] = _ece([probs[i] for i in held], [labels[i] for i in held], bins=5)
                ece["held_out"] = _ece([mapped(probs[i]) for i in held], [labels[i] for i in held], bins=5)
                # eval's own figures (kvjudge.judge.metrics, through critic_eval): the same ECE, and its held-out
                # isotonic map bringing it down on runs it was not fitted on.
                figures = score_figures(list(scored.values()), {r.id: r.key.grade for r in runs})
                assert figures["ece"] == pytest.approx(ece[sharpen])
                isotonic = figures["calibration"]["isotonic"]
                # (its 10 bins of 10 held-out runs: sampling alone gives about √(2/π)·√(0.25/10) ≈ 0.13)
                noise = math.sqrt(2 / math.pi) * math.sqrt(0.25 / 10)
                assert isotonic["held_out"] == 100 and isotonic["after"]["ece"] < 1.2 * noise < isotonic["before"]["ece"]
    # Sampling alone: each of 10 bins of 20 runs misses its mean by about √(2/π)·√(p(1−p)/20) ≤ 0.089.
    sampling = math.sqrt(2 / math.pi) * math.sqrt(0.25 / (len(runs) / 10))
    assert ece[1.0] < 1.5 * sampling
    # sharpen 3 moves p = 0.7 to 0.93: about 0.15 on average over U(0.1, 0.9) (numeric integration below).
    gap = sum(abs(1 / (1 + ((1 - q) / q) ** 3) - q) for q in (0.1 + 0.8 * (i + 0.5) / 1000 for i in range(1000))) / 1000
    assert ece[3.0] > max(0.6 * gap, 2 * sampling), (ece, gap)
    # The held-out half (100 runs, 5 bins of 20): mapped, about what sampling gives; raw, the overconfidence.
    held_sampling = math.sqrt(2 / math.pi) * math.sqrt(0.25 / 20)
    assert ece["held_out"] < 1.5 * held_sampling < ece["held_raw"], ece
