"""`kvjudge select` end to end: runs ingested with `kvjudge ingest`, a simulated judge of known quality served over
HTTP (kvjudge.testing.sim_judge), and every pick checked against what that judge's per-pair draws say the documented
strategy must pick — computed here from the draws, not by kvjudge."""

from __future__ import annotations

import dataclasses
import json
import random
from html import unescape
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers import kvjudge, kvjudge_json

from kvjudge.testing.graded_runs import GradedRun, swe_run, write_graded
from kvjudge.testing.sim_judge import Settings, SimJudgeServer, draw

SETTINGS = Settings(accuracy=0.75, bias=0.5, seed=5)
UNGRADED = "task-ungraded"


def _runs() -> list[GradedRun]:
    """12 tasks of four runs, 6 of two, 2 of one (nothing to choose) and one of three with an ungraded run."""
    rng = random.Random(41)
    runs = []
    sizes = [4] * 12 + [2] * 6 + [1] * 2
    for number, n in enumerate(sizes):
        task = f"task-{number:02d}"
        runs += [swe_run(f"{task}/trial-{i}", task=task, passed=rng.random() < 0.4, seed=number, explore=1,
                         file_lines=12) for i in range(n)]
    for i in range(3):
        run = swe_run(f"{UNGRADED}/trial-{i}", task=UNGRADED, passed=i == 1, seed=99, explore=1, file_lines=12)
        if i == 2:
            run.run["grades"] = []
            run.run["lifecycle"] = ["running", "grading", "ungraded"]
        runs.append(run)
    return runs


def _knockout(runs: list[GradedRun], winner: Callable[[GradedRun, GradedRun], GradedRun]) -> str:
    """The documented knockout: 1st v 2nd, 3rd v 4th, …, an odd one out advancing unplayed; ``winner`` of each
    match advances."""
    alive = list(runs)
    while len(alive) > 1:
        advancing = [winner(first, second) for first, second in zip(alive[0::2], alive[1::2])]
        if len(alive) % 2:
            advancing.append(alive[-1])
        alive = advancing
    return alive[0].id


def _letter_winner(first: GradedRun, second: GradedRun) -> GradedRun:
    """The letter judge prefers the better run when the pair's draw is below its accuracy, has no preference on
    equal grades (the earlier advances)."""
    if first.key.grade == second.key.grade:
        return first
    right = draw(SETTINGS.seed, first.key.marker, second.key.marker) < SETTINGS.accuracy
    better, worse = (first, second) if first.key.grade > second.key.grade else (second, first)
    return better if right else worse


def _expected_knockout(runs: list[GradedRun]) -> str:
    return _knockout(runs, _letter_winner)


def _expected_all_pairs(runs: list[GradedRun]) -> str:
    """Every pair once: each run's summed probability (confidence to the preferred run, 0.5 each on equal grades);
    in a complete round robin the Bradley–Terry order is that sum's order; the earliest of equals."""
    total = {r.id: 0.0 for r in runs}
    for i, first in enumerate(runs):
        for second in runs[i + 1:]:
            if first.key.grade == second.key.grade:
                p_first = 0.5
            else:
                right = draw(SETTINGS.seed, first.key.marker, second.key.marker) < SETTINGS.accuracy
                p_first = SETTINGS.confidence if (first.key.grade > second.key.grade) == right \
                    else 1 - SETTINGS.confidence
            total[first.id] += p_first
            total[second.id] += 1 - p_first
    best = max(total.values())
    return next(r.id for r in runs if total[r.id] >= best - 1e-9)


EXPECTED = {"tournament": (_expected_knockout, lambda n: n - 1), "all-pairs": (_expected_all_pairs,
                                                                               lambda n: n * (n - 1) // 2)}


@pytest.mark.parametrize("strategy", ["tournament", "all-pairs"])
def test_select_picks_what_the_judges_draws_say_and_reports_what_the_picks_are_worth(
        tmp_path: Path, start_sim: Callable[[Path, Settings], SimJudgeServer], strategy: str) -> None:
    runs = _runs()
    runs_file, key = write_graded(tmp_path, runs)
    store = tmp_path / "store.sqlite"
    assert kvjudge_json("ingest", str(runs_file), "--store", str(store))["imported"] == len(runs)
    server = start_sim(key, SETTINGS)
    assert kvjudge_json("probe", "--server", server.url)["certified"]
    picks_file, html = tmp_path / "picks.jsonl", tmp_path / "best.html"
    result = kvjudge_json("select", "--server", server.url, "--store", str(store), "--parallel", "4", "--strategy",
                          strategy, "--picks", str(picks_file), "--html", str(html))
    by_task: dict[str, list[GradedRun]] = {}
    for run in runs:
        by_task.setdefault(str(run.run["task"]["id"]), []).append(run)
    expect, bound = EXPECTED[strategy]
    picks = {p["task"]: p for p in result["picks"]}
    assert set(picks) == set(by_task)
    for task, candidates in by_task.items():
        pick = picks[task]
        assert pick["candidates"][0]["run"] == candidates[0].id and pick["n"] == len(candidates)
        if len(candidates) == 1:
            assert pick["status"] == "nothing to choose" and pick["picked"] == candidates[0].id
            assert pick["comparisons"] == 0
            continue
        assert pick["picked"] == expect(candidates), task
        assert pick["comparisons"] == bound(len(candidates)) and pick["errors"] == 0 and pick["tokens"] > 0
    # The table, over the 18 tasks with a choice and every run graded, from the grades the judge never saw.
    table = result["table"]
    assert (table["tasks"], table["chosen"], table["nothing_to_choose"], table["ungraded"], table["in_table"]) == \
        (21, 19, 2, 1, 18)
    graded = {task: c for task, c in by_task.items() if len(c) > 1 and task != UNGRADED}
    passed = {r.id: r.key.grade == 1.0 for r in runs}
    rows = {row["name"]: row for row in table["rows"]}
    assert rows["pick"]["passed"] == sum(passed[picks[task]["picked"]] for task in graded)
    assert rows["random"]["passed"] == pytest.approx(sum(sum(passed[r.id] for r in c) / len(c)
                                                         for c in graded.values()))
    assert rows["first run"]["passed"] == sum(passed[c[0].id] for c in graded.values())
    assert rows["oracle"]["passed"] == sum(any(passed[r.id] for r in c) for c in graded.values())
    # These runs' last test command exits 0 exactly when they pass: the last-exit-0 pick is as good as the oracle.
    assert rows["last exit 0"]["passed"] == rows["oracle"]["passed"]
    assert table["spent"]["comparisons"] == sum(bound(len(c)) for c in by_task.values() if len(c) > 1)
    assert "nothing to choose" in table["note"] and "ungraded" in table["note"]
    # The picks file: one line per task, as the JSON says; the page quotes the table under a strict policy.
    lines = [json.loads(line) for line in picks_file.read_text().splitlines()]
    assert [line["picked"] for line in lines] == [p["picked"] for p in result["picks"]]
    page = html.read_text()
    assert "default-src 'none'" in unescape(page) and 'id="selection-table"' in page and "<script" not in page
    assert page.count('<tr data-task="') == 21
    if strategy == "tournament":
        # The report's best-of-N section: the same picks, from verdicts the report judged itself.
        report = kvjudge_json("report", "--server", server.url, "--store", str(store), "--parallel", "4",
                              "--select", strategy, "--out", str(tmp_path / "report.html"))
        index = (tmp_path / "report.html").read_text()
        assert report["pairs"] > 0 and 'id="best-of-n"' in index and index.count('<tr data-task="') == 21
        # The index's calibration of p_a (equal-mass bins, held-out maps), with its diagram.
        assert 'id="calibration"' in index and 'id="calibration-chart"' in index and "equal-mass bins" in index
        for task, pick in picks.items():
            row = index[index.index(f'<tr data-task="{task}">'):]
            assert row[:row.index("</tr>")].count(pick["picked"]) >= 2  # the picked column and its marked candidate


# ------------------------------------------------------------------------------- the scale protocols' picks
SCALE = Settings(sigma=0.0, seed=5)  # no reading noise: each reading's expected level is the run's latent quality


def _scaled_runs() -> list[GradedRun]:
    """Tasks of 4, 3, 2 and 1 runs, each run with a latent quality in eighths (equal ones are ties)."""
    rng = random.Random(43)
    runs = []
    for number, n in enumerate([4] * 5 + [3] * 2 + [2] * 2 + [1]):
        task = f"task-{number:02d}"
        for i in range(n):
            run = swe_run(f"{task}/trial-{i}", task=task, passed=rng.random() < 0.4, seed=number, explore=1,
                          file_lines=12)
            runs.append(dataclasses.replace(run, key=dataclasses.replace(run.key, quality=rng.randint(1, 7) / 8)))
    return runs


def _scale_winner(first: GradedRun, second: GradedRun) -> GradedRun:
    """The pairwise-scale judge without noise reads p_a = 0.5 + (quality of a − quality of b) / 2 in both orders
    (no position bias): a tie under the default 0.05 margin — the earlier advances — when the qualities are equal
    (qualities in eighths differ by at least 1/8 otherwise)."""
    assert first.key.quality is not None and second.key.quality is not None
    if abs(first.key.quality - second.key.quality) / 2 < 0.05:
        return first
    return first if first.key.quality > second.key.quality else second


def _completions(server: SimJudgeServer) -> int:
    """The judge readings the server answered on a scale (certifying the window asks other questions)."""
    return server.judge.reasons["scale"]


def test_select_pointwise_picks_the_best_scored_run_reuses_its_scores_and_pairwise_scale_picks_by_p_a(
        tmp_path: Path, start_sim: Callable[[Path, Settings], SimJudgeServer]) -> None:
    runs = _scaled_runs()
    runs_file, key = write_graded(tmp_path, runs)
    store = tmp_path / "store.sqlite"
    assert kvjudge_json("ingest", str(runs_file), "--store", str(store))["imported"] == len(runs)
    server = start_sim(key, SCALE)
    common = ["--server", server.url, "--store", str(store), "--parallel", "4", "--picks", str(tmp_path / "p.jsonl")]
    by_task: dict[str, list[GradedRun]] = {}
    for run in runs:
        by_task.setdefault(str(run.run["task"]["id"]), []).append(run)
    # --protocol pointwise alone chooses the pointwise strategy.
    result = kvjudge_json("select", *common, "--protocol", "pointwise", "--repeats", "2")
    assert result["strategy"] == "pointwise"
    asked = _completions(server)
    picks = {p["task"]: p for p in result["picks"]}
    assert set(picks) == set(by_task)
    for task, candidates in by_task.items():
        pick = picks[task]
        if len(candidates) == 1:
            assert pick["status"] == "nothing to choose" and pick["comparisons"] == 0
            continue
        best = max(r.key.quality for r in candidates)  # type: ignore[type-var]
        assert pick["picked"] == next(r.id for r in candidates if r.key.quality == best), task
        assert pick["scores"] == {r.id: pytest.approx(r.key.quality) for r in candidates}
        assert pick["comparisons"] == len(candidates) and pick["errors"] == 0 and pick["tokens"] > 0
    # Each run with a choice was read 3 criteria × 2 repeats times; a second select reads the cached scores.
    assert asked == 6 * sum(len(c) for c in by_task.values() if len(c) > 1)
    again = kvjudge_json("select", *common, "--strategy", "pointwise", "--repeats", "2")
    assert _completions(server) == asked and [p["picked"] for p in again["picks"]] == [p["picked"] for p in
                                                                                     result["picks"]]
    # The knockout on the pairwise scale's p_a.
    result = kvjudge_json("select", *common, "--protocol", "pairwise-scale")
    assert result["strategy"] == "tournament"
    for pick in result["picks"]:
        candidates = by_task[pick["task"]]
        assert pick["picked"] == _knockout(candidates, _scale_winner), pick["task"]
        assert pick["comparisons"] == len(candidates) - 1 and pick["errors"] == 0
    # A strategy and a protocol that do not fit: one line, before any judge call.
    asked = _completions(server)
    done = kvjudge("select", *common, "--strategy", "tournament", "--protocol", "pointwise", cwd=tmp_path)
    assert done.returncode != 0 and done.stderr.count("\n") == 1 and "needs a pairwise protocol" in done.stderr
    assert _completions(server) == asked


def test_select_takes_the_protocol_flags_and_no_pairs(tmp_path: Path) -> None:
    shown = kvjudge("select", "--help", cwd=tmp_path).stdout
    assert all(flag in shown for flag in ("--protocol", "--levels", "--repeats", "--rubric", "--task", "--strategy"))
    assert "RUN" not in shown.replace("RUNS", "") and "--pairs" not in shown and "--trials" not in shown


def test_select_refuses_pairs_and_an_unknown_task_in_one_line(tmp_path: Path) -> None:
    runs_file, _key = write_graded(tmp_path, [swe_run("t/one", task="t", passed=True, explore=1, file_lines=12)])
    store = tmp_path / "store.sqlite"
    kvjudge_json("ingest", str(runs_file), "--store", str(store))
    for extra in (["a", "b"], ["--trials", "all"]):
        done = kvjudge("select", *extra, "--store", str(store), cwd=tmp_path)
        assert done.returncode == 2 and "unrecognized arguments" in done.stderr
    done = kvjudge("select", "--store", str(store), "--task", "nope", "--server", "http://127.0.0.1:9", cwd=tmp_path)
    assert done.returncode != 0 and done.stderr.count("\n") == 1 and "task 'nope' holds no runs" in done.stderr
    assert not (tmp_path / "kvjudge-picks.jsonl").exists()  # nothing written before the error
