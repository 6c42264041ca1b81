"""Meta-evaluation and ranking figures against values computed by hand, on fixed verdicts (no model)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from helpers import cli_json, make_verdict, store_from_runs

from kvjudge.cli import main
from kvjudge.judge.evaluate import Decision, baseline_decisions, conclusion, evaluate, last_exit_code, metrics, wilson
from kvjudge.judge.ranking import agent_of, bradley_terry, games_from, rank
from kvjudge.testing.native_runs import make_run


def test_wilson_interval_matches_the_formula_by_hand() -> None:
    # 8 of 10 at z = 1.96: centre (0.8 + 0.19208) / 1.38416 = 0.71676, half 0.24076 → [0.4902, 0.9433].
    low, high = wilson(8, 10)
    assert low == pytest.approx(0.4902, abs=1e-4) and high == pytest.approx(0.9433, abs=1e-4)
    assert wilson(0, 5)[0] == 0.0 and wilson(5, 5)[1] == 1.0
    assert wilson(2.5, 5) == pytest.approx(wilson(1, 2), abs=0.2)  # fractional successes are allowed
    assert wilson(1, 0) is None


def _d(a: str, b: str, outcome: str, p_ab: float, p_ba: float, mass: float = 0.5) -> Decision:
    return Decision(a, b, outcome, (p_ab + p_ba) / 2, p_ab, p_ba, mass)


def test_metrics_against_hand_computed_values() -> None:
    truths = {("a1", "b1"): "a", ("a2", "b2"): "b", ("a3", "b3"): "a", ("a4", "b4"): "b", ("a5", "b5"): "a",
              ("a6", "b6"): "equal"}
    decisions = [
        _d("a1", "b1", "a", 0.9, 0.7, 0.4),           # right
        _d("a2", "b2", "a", 0.8, 0.6, 0.6),           # wrong
        _d("a3", "b3", "tie", 0.52, 0.51, 0.5),       # no preference: half
        _d("a4", "b4", "inconsistent", 0.9, 0.1, 0.3),  # the orders disagree: half, shown-first bias 0.9
        Decision("a5", "b5", "error", None),          # not scored: lowers coverage, not accuracy
        _d("a6", "b6", "a", 0.9, 0.9),                # equal grades: no truth, left out
    ]
    m = metrics(decisions, truths)
    assert (m["pairs"], m["scored"], m["decisive"], m["correct"]) == (5, 4, 2, 1)
    assert m["coverage"] == pytest.approx(4 / 5)
    assert m["accuracy_ties_half"] == pytest.approx((1 + 0.5 * 2) / 4)
    assert m["accuracy_ties_half_ci95"] == pytest.approx(wilson(2, 4))
    assert m["accuracy_decisive"] == pytest.approx(1 / 2)
    # κ over (judge a|b|none, truth a|b): judge [a, a, none, none], truth [a, b, a, b]: observed 1/4;
    # chance: judge a 2, truth a 2 → 4/16; judge none never matches → κ = (0.25 − 0.25) / 0.75 = 0.
    assert m["kappa"] == pytest.approx(0.0)
    # Position bias: mean of (p_ab + 1 − p_ba) / 2 = [(0.9+0.3)/2, (0.8+0.4)/2, (0.52+0.49)/2, (0.9+0.9)/2] / 4.
    assert m["position_bias"] == pytest.approx((0.6 + 0.6 + 0.505 + 0.9) / 4)
    assert m["position_consistency"] == pytest.approx(3 / 4)  # only the inconsistent one splits
    assert m["tie_rate"] == pytest.approx(1 / 4) and m["inconsistent_rate"] == pytest.approx(1 / 4)
    assert m["mean_label_mass"] == pytest.approx((0.4 + 0.6 + 0.5 + 0.3) / 4)
    bins = {(r["low"], r["high"]): r for r in m["reliability"]}
    # p_a: 0.8 (a better), 0.7 (b), 0.515 (a), 0.5 (b).
    assert bins[(0.4, 0.6)]["pairs"] == 2 and bins[(0.4, 0.6)]["a_better"] == pytest.approx(0.5)
    assert bins[(0.6, 0.8)]["pairs"] == 1 and bins[(0.6, 0.8)]["a_better"] == 0.0
    assert bins[(0.8, 1.0)]["pairs"] == 1 and bins[(0.8, 1.0)]["a_better"] == 1.0


def _graded(run_id: str, passed: bool, task: str, outputs: list[str], exit_code: int | None = None,
            tenant: str = "default") -> dict:
    run = make_run(run_id, outputs, passed=passed, tenant=tenant)
    run["task"]["id"] = task
    run["grades"] = [{"grader": "human", "score": 1.0 if passed else 0.0, "label": "pass" if passed else "fail"}]
    if exit_code is not None:
        run["branches"][0]["transitions"][-1]["tool_output"]["exit_code"] = exit_code
    return run


def test_baselines_and_a_judge_that_does_not_beat_them(tmp_path: Path) -> None:
    runs = [_graded("t1-good", True, "t1", ["ok"], exit_code=0), _graded("t1-bad", False, "t1", ["x" * 400], 1),
            _graded("t2-bad", False, "t2", ["short"], exit_code=1), _graded("t2-good", True, "t2", ["y" * 900], 0)]
    with store_from_runs(tmp_path / "store.sqlite", runs) as store:
        assert last_exit_code(store.runs.run("t1-good")) == 0 and last_exit_code(store.runs.run("t1-bad")) == 1
        pairs = [("t1-good", "t1-bad"), ("t2-bad", "t2-good")]
        verdicts = [make_verdict("t1-good", "t1-bad", "inconsistent", 0.9, 0.1),
                    make_verdict("t2-bad", "t2-good", "a", 0.7, 0.7)]
        result = evaluate(store, verdicts)
        first = baseline_decisions("always_first", pairs, {})
    assert [d.outcome for d in first] == ["a", "a"]
    assert result["graded_pairs"] == 2 and result["equal_grades"] == 0
    base = result["baselines"]
    assert base["always_first"]["accuracy_ties_half"] == pytest.approx(0.5)
    assert base["longer_run"]["accuracy_ties_half"] == pytest.approx(0.5)   # the longer run won once
    assert base["last_exit_zero"]["accuracy_ties_half"] == pytest.approx(1.0)
    assert base["last_exit_zero"]["position_bias"] is None  # a baseline is not asked in two orders
    assert result["judge"]["accuracy_ties_half"] == pytest.approx(0.25)
    assert result["conclusion"].startswith("the judge does not beat the baselines")
    assert "last_exit_zero 1.00" in result["conclusion"]


def test_conclusion_says_when_a_better_score_is_not_shown_better() -> None:
    judge = {"pairs": 4, "accuracy_ties_half": 0.75, "accuracy_ties_half_ci95": wilson(3, 4)}
    baselines = {"always_first": {"accuracy_ties_half": 0.5}}
    assert "not shown to beat always_first" in conclusion(judge, baselines)
    strong = {"pairs": 200, "accuracy_ties_half": 0.9, "accuracy_ties_half_ci95": wilson(180, 200)}
    assert conclusion(strong, baselines).startswith("the judge beats every baseline")


class _V:  # the fields rank() reads from a verdict
    def __init__(self, a: str, b: str, outcome: str) -> None:
        self.a, self.b, self.outcome = a, b, outcome


def _tournament() -> list[_V]:
    # Three agents, known order strong > middle > weak: strong beats both (one tie), middle beats weak.
    verdicts = []
    for i in range(6):
        verdicts.append(_V(f"strong/{i}", f"middle/{i}", "a" if i < 5 else "tie"))
        verdicts.append(_V(f"weak/{i}", f"strong/{i}", "b"))
        verdicts.append(_V(f"middle/{i}", f"weak/{i}", "a" if i < 4 else "b"))
    verdicts.append(_V("middle/9", "weak/9", "error"))
    return verdicts


def test_bradley_terry_recovers_a_known_order_with_intervals() -> None:
    ranking = rank(_tournament(), lambda run_id: run_id.split("/")[0], bootstrap=200)
    rows = {r["agent"]: r for r in ranking["agents"]}
    assert [r["agent"] for r in ranking["agents"]] == ["strong", "middle", "weak"]
    assert (rows["strong"]["wins"], rows["strong"]["ties"], rows["strong"]["losses"]) == (11, 1, 0)
    assert (rows["middle"]["wins"], rows["middle"]["ties"], rows["middle"]["losses"]) == (4, 1, 7)
    assert rows["middle"]["unscored"] == 1 and rows["middle"]["coverage"] == pytest.approx(12 / 13)
    assert ranking["games"] == 18 and sum(r["strength"] for r in ranking["agents"]) == pytest.approx(0, abs=1e-9)
    for row in ranking["agents"]:
        low, high = row["ci95"]
        assert low <= row["strength"] <= high
    assert rows["strong"]["ci95"][0] > rows["weak"]["ci95"][1]  # the ends of the order are told apart
    assert rank(_tournament(), lambda r: r.split("/")[0], bootstrap=200) == ranking  # seeded: reproducible


def test_bradley_terry_counts_a_tie_as_half_a_win() -> None:
    games, _ = games_from([_V("x/1", "y/1", "tie"), _V("x/2", "y/2", "a")], lambda r: r.split("/")[0])
    theta = bradley_terry(games, ["x", "y"], prior=0.0)
    # x scored 1.5 of 2 games: the MLE has P(x beats y) = 0.75, so θx − θy = log 3.
    assert theta["x"] - theta["y"] == pytest.approx(math.log(3), abs=1e-4)


def test_agent_falls_back_to_the_id_prefix_then_the_tenant(tmp_path: Path) -> None:
    runs = [make_run("swe-agent/django-1", ["ok"], tenant="acme"), make_run("plain", ["ok"], tenant="acme")]
    with store_from_runs(tmp_path / "store.sqlite", runs) as store:
        assert agent_of(store.runs.run("swe-agent/django-1")) == "swe-agent"
        assert agent_of(store.runs.run("plain")) == "acme"


def test_cli_rank_from_a_verdicts_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    runs = [make_run(f"{agent}/{i}", ["ok"]) for agent in ("strong", "middle", "weak") for i in range(6)]
    runs.append(make_run("middle/9", ["ok"]))
    runs.append(make_run("weak/9", ["ok"]))
    with store_from_runs(tmp_path / "store.sqlite", runs) as store:
        path = str(store.path)
    lines = [json.dumps({"a": v.a, "b": v.b, "outcome": v.outcome}) for v in _tournament()]
    verdicts = tmp_path / "verdicts.jsonl"
    verdicts.write_text("\n".join([*lines, json.dumps({"summary": {"pairs": len(lines)}})]) + "\n")
    png = tmp_path / "rank.png"
    code, ranking = cli_json(capsys, "rank", "--verdicts", str(verdicts), "--store", path, "--png", str(png),
                             "--bootstrap", "200")
    assert code == 0 and [r["agent"] for r in ranking["agents"]] == ["strong", "middle", "weak"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and ranking["png"] == str(png)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"a": "strong/1"}\n')
    assert main(["rank", "--verdicts", str(bad), "--store", path]) != 0
    assert "needs string fields" in capsys.readouterr().err
