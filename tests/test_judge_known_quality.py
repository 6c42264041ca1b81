"""kvjudge reads a capable judge right: end to end through the CLI, against a simulated judge of known quality.

The bundled judge model has no signal, so nothing measured with it can show that `eval`, `rank` and
`judge --still-grades` would report a good judge's quality correctly. Here the judge is
:mod:`kvjudge.testing.sim_judge`, served over HTTP as vLLM serves a model, whose accuracy and position bias are
set and which decides a pair only when both runs' final patch and last test outcome are visible in their views.
The runs are SWE-bench-shaped (:mod:`kvjudge.testing.graded_runs`), ingested with `kvjudge ingest`; the server
is certified with `kvjudge probe --server`, and every figure below comes from the CLI's JSON — the evidence
figures too: how much of each run's patch and last test outcome each view shows, whatever the judge made of it.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
from helpers import kvjudge, kvjudge_json

from kvjudge.testing.graded_runs import GradedRun, swe_run, write_graded
from kvjudge.testing.sim_judge import Settings, SimJudge, SimJudgeServer, draw

PARALLEL = "4"  # requests in flight: the simulated judge answers at once, the client is the bottleneck


def _ingest(tmp_path: Path, runs: Sequence[GradedRun]) -> tuple[Path, Path]:
    """The runs in a store (through `kvjudge ingest`) and the answer key beside it."""
    runs_file, key = write_graded(tmp_path, runs)
    store = tmp_path / "store.sqlite"
    ingested = kvjudge_json("ingest", str(runs_file), "--store", str(store))
    assert ingested["imported"] == len(runs) and ingested["states"] == {"graded": len(runs)}
    return store, key


@pytest.fixture
def serve(start_sim: Callable[[Path, Settings], SimJudgeServer]) -> Callable[[Path, Settings], SimJudgeServer]:
    """Start simulated judges (each certified with `kvjudge probe --server`); all stopped after the test."""

    def start(key: Path, settings: Settings) -> SimJudgeServer:
        server = start_sim(key, settings)
        probed = kvjudge_json("probe", "--server", server.url)
        assert probed["certified"] and probed["max_context_tokens"] == settings.max_model_len
        assert server.judge.reasons == {"no_runs": 1}  # the probe's prompt just under the context quotes no runs
        server.judge.reasons.clear()
        return server

    return start


# ------------------------------------------------------------------------------------------------- eval
def _eval_runs() -> list[GradedRun]:
    """110 tasks with one resolved and one unresolved run (which one sorts first is drawn), and 8 tasks whose two
    runs are both resolved (equal grades: no truth, left out of the accuracy)."""
    rng = random.Random(23)
    runs = []
    for number in range(118):
        task = f"repo__issue-{number}"
        first_passes = rng.random() < 0.5
        both = number >= 110
        runs.append(swe_run(f"{task}/x", task=task, passed=first_passes or both, seed=number, explore=2,
                            file_lines=30))
        runs.append(swe_run(f"{task}/y", task=task, passed=not first_passes or both, seed=number, explore=2,
                            file_lines=30))
    return runs


@pytest.mark.parametrize(("accuracy", "bias"), [(0.8, 0.5), (0.7, 0.6)])
def test_eval_recovers_the_set_accuracy_and_position_bias(tmp_path: Path, serve, accuracy: float,
                                                          bias: float) -> None:
    runs = _eval_runs()
    store, key = _ingest(tmp_path, runs)
    settings = Settings(accuracy=accuracy, bias=bias, seed=11)
    server = serve(key, settings)
    result = kvjudge_json("eval", "--server", server.url, "--store", str(store), "--parallel", PARALLEL,
                          "--png", str(tmp_path / "eval.png"))
    [(framing, figures)] = result["templates"].items()
    assert framing == "raw"  # vLLM publishes no chat template: the raw framing through the completions API
    assert (figures["graded_pairs"], figures["equal_grades"], figures["ungraded"]) == (110, 8, 0)
    judge = figures["judge"]
    assert judge["pairs"] == 110 and judge["coverage"] == 1.0 and judge["decisive"] == 110
    # Exactly the pairs the server's draws judged right, and the set accuracy within eval's Wilson interval.
    by_id = {run.id: run for run in runs}
    expected = sum(draw(settings.seed, by_id[f"repo__issue-{n}/x"].key.marker,
                        by_id[f"repo__issue-{n}/y"].key.marker) < accuracy for n in range(110))
    assert judge["correct"] == expected
    low, high = judge["accuracy_decisive_ci95"]
    assert low <= accuracy <= high, (judge["accuracy_decisive"], low, high)
    low, high = judge["accuracy_ties_half_ci95"]
    assert low <= accuracy <= high
    assert judge["position_bias"] == pytest.approx(bias, abs=0.02)
    # p_a takes two values: confidence where the draw judges right, 1 − confidence where not.
    calibration = judge["calibration"]
    assert calibration["items"] == 110
    # Brier of two values: right pairs (1 − confidence)², wrong ones confidence².
    assert calibration["brier"] == pytest.approx((expected * 0.15**2 + (110 - expected) * 0.85**2) / 110)
    # Equal-mass bins of 11 pairs over two values: each bin's ECE term is |p − the share right in it|.
    assert calibration["ece"] == pytest.approx(sum(count / 110 * abs(mean - rate)
                                                   for mean, rate, count in calibration["reliability"]))
    assert set(calibration["calibration"]) == {"isotonic", "platt"}
    assert calibration["calibration"]["isotonic"]["held_out"] == 55
    assert judge["position_consistency"] == 1.0 and judge["inconsistent_rate"] == 0.0
    # Every order of every pair was read by the server, evidence visible; equal grades got no preference.
    assert server.judge.reasons == {"decided": 220, "equal_grades": 16}
    assert (tmp_path / "eval.png").stat().st_size > 0


# ------------------------------------------------------------------------------------------------- rank
AGENT_PASSES = {"strong": 27, "middling": 15, "weak": 3}  # resolved tasks out of 30


def test_rank_recovers_the_order_of_three_agents(tmp_path: Path, serve) -> None:
    rng = random.Random(7)
    runs = []
    for agent, passes in AGENT_PASSES.items():
        resolved = set(rng.sample(range(30), passes))
        runs += [swe_run(f"{agent}/task-{n}", task=f"task-{n}", agent=agent, passed=n in resolved, seed=n,
                         explore=2, file_lines=30) for n in range(30)]
    store, key = _ingest(tmp_path, runs)
    server = serve(key, Settings(accuracy=0.9, bias=0.55, seed=3))
    ranking = kvjudge_json("rank", "--server", server.url, "--store", str(store), "--parallel", PARALLEL,
                           "--bootstrap", "300", "--png", str(tmp_path / "rank.png"))
    assert ranking["pairs"] == 90 and ranking["games"] == 90  # three pairs of agents on each of 30 tasks
    rows = ranking["agents"]
    assert [row["agent"] for row in rows] == ["strong", "middling", "weak"]
    strong, _middling, weak = rows
    assert strong["ci95"][0] > weak["ci95"][1]  # the ends of the order are told apart, not just ordered
    assert all(row["coverage"] == 1.0 for row in rows)


# ----------------------------------------------------------------------------------------- still grades
# Runs of ≈ 5,300 tokens (counted by the simulated judge): six 80-line source files read while exploring, a 12-line
# patch (≈ 300 tokens) submitted as the output of mini-swe-agent's submit command, a test log. Reduced to 800 tokens
# the views keep about a sixth of the runs: reduction cuts the file dumps (exploration, cut first) and keeps the
# patch and the test outcome (the run's evidence, cut last) whole. The negative control reduces every view below the
# patch's own size: no view that small can hold the patch, so reduction must cut it.
EVIDENCE_KEPT = 800


def _still_grades_runs() -> list[GradedRun]:
    runs = []
    for number in range(40):
        task = f"repo__issue-{number}"
        runs += [swe_run(f"{task}/pass", task=task, passed=True, seed=number, explore=6, file_lines=80),
                 swe_run(f"{task}/fail", task=task, passed=False, seed=number, explore=6, file_lines=80)]
    return runs


def _evidence(verdict: dict, side: str) -> list[tuple[float, bool]]:
    """(share of the submission shown, last test outcome shown) of each run of a still-grades pair, on ``side``."""
    return [(e[side]["submission_share"], e[side]["verification_outcome_visible"])
            for e in (verdict["evidence"]["a"], verdict["evidence"]["b"])]


def test_still_grades_holds_where_reduction_keeps_the_evidence_and_reports_every_verdict_lost_where_it_is_cut(
        tmp_path: Path, serve) -> None:
    runs = _still_grades_runs()
    store, key = _ingest(tmp_path, runs)
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"a": f"repo__issue-{n}/pass", "b": f"repo__issue-{n}/fail"}) + "\n"
                             for n in range(40)))
    server = serve(key, Settings(accuracy=0.8, bias=0.6, seed=5))

    def still_grades(reduce_to: int) -> tuple[list[dict], dict, Counter]:
        before = Counter(server.judge.reasons)
        lines = _json_lines("judge", "--pairs", str(pairs), "--still-grades", "--reduce-to", str(reduce_to),
                            "--server", server.url, "--store", str(store), "--parallel", PARALLEL)
        return lines[:-1], lines[-1]["summary"], Counter(server.judge.reasons) - before

    verdicts, summary, reasons = still_grades(EVIDENCE_KEPT)
    assert (summary["pairs"], summary["compared"], summary["full_cut"], summary["same_views"]) == (40, 40, 0, 0)
    # Reduction really cut the runs: each reduced view is under a quarter of its full view.
    assert all(v["view_tokens"]["reduced"][r] < v["view_tokens"]["full"][r] / 4 for v in verdicts for r in "ab")
    full_outcomes = summary["outcomes"]["full"]
    assert full_outcomes["a"] + full_outcomes["b"] == 40  # the full runs show the evidence: every pair decided
    # It kept the evidence: every run's whole patch and last test outcome, on both sides, so nothing is flagged.
    for side in ("full", "reduced"):
        assert all(_evidence(v, side) == [(1.0, True), (1.0, True)] for v in verdicts)
        assert summary["evidence"][side] == {"views": 80, "submissions_measured": 80, "mean_submission_share": 1.0,
                                             "submission_whole": 80, "outcomes_measured": 80, "outcome_visible": 80}
    assert summary["evidence"]["hidden_pairs"] == 0 and not any(v["evidence_hidden"] for v in verdicts)
    # So still-grades holds: at least 95 % of verdicts, none flipped or lost; every call was decided on the evidence.
    assert summary["agreement"] >= 0.95 and summary["flips"] == 0 and summary["lost"] == 0
    assert reasons == {"decided": 160}

    # The negative control: a target below the smallest patch, so that reduction must cut every patch.
    below = min(len(SimJudge.tokens(run.patch)) for run in runs) - 1
    verdicts, summary, reasons = still_grades(below)
    assert summary["compared"] == 40
    # Every run's evidence is flagged as hidden by the reduction (the full side still shows it whole) …
    assert summary["evidence"]["hidden_pairs"] == 40 and all(v["evidence_hidden"] for v in verdicts)
    assert all(v["evidence"][r]["hidden"] for v in verdicts for r in "ab")
    assert all(_evidence(v, "full") == [(1.0, True), (1.0, True)] for v in verdicts)
    assert all(share < 1.0 and not shown for v in verdicts for share, shown in _evidence(v, "reduced"))
    assert summary["evidence"]["reduced"]["submission_whole"] == 0
    assert summary["evidence"]["reduced"]["outcome_visible"] == 0
    # … and still-grades fails the way it should: no verdict holds, every decision is reported lost (the judge has
    # no preference without the evidence: each order leans to position A, an inconsistent verdict).
    assert summary["agreement"] == 0.0 and summary["agreement"] < 0.95
    assert summary["lost"] == 40 and summary["flips"] == 0
    assert summary["outcomes"]["reduced"]["inconsistent"] == 40
    assert all(v["held"] is False and v["lost"] is True for v in verdicts)
    # The full side came from the judgment cache; the reduced views hid the evidence from every call.
    assert set(reasons) <= {"evidence_hidden", "unidentified"} and sum(reasons.values()) == 80


# Windows for eval's evidence figures: one that holds both runs whole; one in which each view must be cut to about a
# fifth of its run (≈ 1,000 of ≈ 5,300 tokens), which the evidence survives; one in which each view gets less than
# its evidence needs.
WHOLE_WINDOW, CUT_WINDOW, STARVED_WINDOW = 32_768, 2_400, 1_800


def test_eval_reports_how_much_evidence_each_judged_view_shows_and_flags_a_cut_that_hides_it(
        tmp_path: Path, serve) -> None:
    runs = _still_grades_runs()[:24]
    store, key = _ingest(tmp_path, runs)
    by_id = {run.id: run for run in runs}
    right = sum(draw(5, by_id[f"repo__issue-{n}/pass"].key.marker, by_id[f"repo__issue-{n}/fail"].key.marker) < 0.8
                for n in range(12))
    whole = {"views": 24, "submissions_measured": 24, "mean_submission_share": 1.0, "submission_whole": 24,
             "outcomes_measured": 24, "outcome_visible": 24}

    def evaluated(window: int) -> tuple[dict, dict, Counter]:
        server = serve(key, Settings(accuracy=0.8, bias=0.6, seed=5, max_model_len=window))
        result = kvjudge_json("eval", "--server", server.url, "--store", str(store), "--parallel", PARALLEL,
                              "--png", str(tmp_path / "eval.png"))
        [figures] = result["templates"].values()
        assert figures["graded_pairs"] == 12
        return figures, figures["evidence"], Counter(server.judge.reasons)

    figures, evidence, reasons = evaluated(WHOLE_WINDOW)
    assert not figures["window"]["cut"]
    assert evidence == {"full": whole, "judged": whole, "hidden_pairs": 0, "hidden": []}
    assert figures["judge"]["correct"] == right and reasons == {"decided": 24}

    # Cut to fit a small window, the views still show every run's whole patch and test outcome: nothing is flagged,
    # and the judge gets exactly the pairs right it got right with the whole runs.
    figures, evidence, reasons = evaluated(CUT_WINDOW)
    assert figures["window"]["cut"] and figures["window"]["n_ctx"] < figures["window"]["needed"] / 4
    assert evidence == {"full": whole, "judged": whole, "hidden_pairs": 0, "hidden": []}
    assert figures["judge"]["correct"] == right and reasons == {"decided": 24}

    # In a window too small for the evidence, every pair is flagged, and the judge decides none.
    figures, evidence, reasons = evaluated(STARVED_WINDOW)
    assert evidence["full"] == whole
    judged = evidence["judged"]
    assert judged["mean_submission_share"] < 1.0 and judged["submission_whole"] == 0 and judged["outcome_visible"] == 0
    assert evidence["hidden_pairs"] == 12
    assert sorted(evidence["hidden"]) == sorted(f"repo__issue-{n}/fail vs repo__issue-{n}/pass" for n in range(12))
    assert figures["judge"]["decisive"] == 0 and set(reasons) <= {"evidence_hidden", "unidentified"}


def _json_lines(*args: str) -> list[dict]:
    done = kvjudge(*args, "--json")
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]
