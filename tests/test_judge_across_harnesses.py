"""Four agents on the same SWE-bench instances, run on three harnesses, judged and ranked together.

The pairwise comparison kvjudge exists for, as a researcher meets it: a mini-swe-agent baseline (its 1.x and 2.x
trajectory shapes, two models), a SWE-agent run and an OpenHands CodeAct run (``output.jsonl``), each graded by
its own evaluation output — SWE-bench summary reports, per-instance ``report.json`` files, OpenHands'
``output.swebench_eval.jsonl`` — passed to ``kvjudge ingest --results``. Every file is written here, shaped as the
harnesses write them (:mod:`kvjudge.testing.trajectories`, :mod:`kvjudge.testing.openhands`).

The judge is the simulated judge of known quality (:mod:`kvjudge.testing.sim_judge`): it decides a pair only
when it recognises both runs by their marker line and sees each one's final patch and last test outcome, and
then prefers the better run exactly when the pair's draw is under its accuracy. So the test knows, before any
command runs, which pairs it must be shown, what it will say of each, and what ``kvjudge eval`` must score. It
also keeps every text it is sent: none may carry a grade or anything of an evaluation report.
"""

from __future__ import annotations

import itertools
import json
import random
import zlib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from helpers import kvjudge_json

from kvjudge.retention import Store
from kvjudge.testing import trajectories
from kvjudge.testing import openhands as oh
from kvjudge.testing.graded_runs import final_patch, pytest_log
from kvjudge.testing.jsonl import write_jsonl
from kvjudge.testing.sim_judge import (
    AnswerKey,
    KeyEntry,
    Settings,
    SimJudgeServer,
    draw,
    key_entry,
    quoted_views,
    write_key,
)
from kvjudge.testing.trajectories import Episode, Step, make_episode

TASKS = [f"csvkit__csvkit-{number}" for number in (101, 202, 303, 404, 505, 606, 707)]
MINI_V1, MINI_V2, SWE_AGENT, OPENHANDS = "openai/gpt-4o", "anthropic/claude-sonnet-4-5", "gemini/gemini-2.5-pro", \
    "deepseek/deepseek-chat"
#: Agent name → (the model it ran, its harness, the format its runs are stored as).
AGENTS = {MINI_V1: (MINI_V1, "mini-swe-agent", "mini-swe-agent-1"),
          MINI_V2: (MINI_V2, "mini-swe-agent", "mini-swe-agent-1.1"),
          SWE_AGENT: (SWE_AGENT, "swe-agent", "swe-agent"),
          f"{oh.AGENT_CLASS}/{OPENHANDS}": (OPENHANDS, "openhands", "openhands")}
EVALUATION_ERROR = (f"{oh.AGENT_CLASS}/{OPENHANDS}", TASKS[3])  # OpenHands' evaluation of this one errored
SETTINGS = Settings(accuracy=0.75, bias=0.55, seed=22)
# What the judge is scored against, and what an evaluation report says: none of it may reach a judge prompt.
# The grades' words and the SWE-bench grader's name; the lines a view would show if grades or verifier results
# were let through; the fields of SWE-bench and OpenHands reports; the SWE-bench row OpenHands keeps beside each
# run (its gold patch and the tests that decide the grade).
HELD_OUT = ("resolved", "swe-bench", "resolved_ids",
            "unresolved_ids", "empty_patch_ids", "error_ids", "completed_ids", "patch_successfully_applied",
            "tests_status", "FAIL_TO_PASS", "PASS_TO_PASS", "empty_generation", "failed_apply_patch", "error_eval",
            "test_timeout", "APPLY_PATCH_PASS", "GOLD_PATCH_MARKER", "test_gold_marker")
#: The lines a view adds when grades or verifier results are shown (kvjudge.judge.render: held out by default).
SHOWN_GRADES = ("Grades:", "score 1.0", "score 0.0", "label resolved", "Verifier results")


@dataclass(frozen=True)
class Run:
    """One agent's run on one task: the episode its harness wrote, whether its tests passed, its key entry."""

    agent: str
    task: str
    episode: Episode
    passed: bool
    key: KeyEntry


def _seed(*parts: str) -> int:
    return zlib.crc32("/".join(parts).encode())


def _run(agent: str, task: str, passed: bool) -> Run:
    """A realistic episode (explore, read, grep, test, edit, reproduce) ending in a test run and a final patch
    of its own; the problem statement is the task's, shared by every agent."""
    seed = _seed(agent, task)
    model = AGENTS[agent][0]
    episode = make_episode(task, seed, target_bytes=3_000, model=model)
    episode.problem_statement = make_episode(task, _seed(task), target_bytes=100).problem_statement
    patch, marker = final_patch(seed, "csvkit/cli.py", 9)
    log, outcome = pytest_log(seed + 1, "tests/test_cli.py", passed)
    episode.steps.append(Step("The quoting is fixed; running the tests again.", "python -m pytest tests/test_cli.py",
                              log + "\n", 0 if passed else 1))
    episode.patch = patch
    entry = key_entry(marker=marker, grade=1.0 if passed else 0.0, patch=patch, outcome=outcome,
                      run=f"{agent} on {task}")
    return Run(agent, task, episode, passed, entry)


def _write(root: Path, runs: list[Run]) -> tuple[Path, list[str]]:
    """Each harness's files under ``root/runs`` as it lays them out, and the ``--results`` arguments: a
    SWE-bench summary report per mini-swe-agent v1 / SWE-agent model (named after the model), per-instance
    ``report.json`` files for mini-swe-agent v2 (in a folder named after it), OpenHands' evaluation output."""
    folder = root / "runs"
    by_agent: dict[str, list[Run]] = {}
    for run in runs:
        by_agent.setdefault(run.agent, []).append(run)

    def trajectory(path: Path, data: dict[str, Any]) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data, indent=1))

    def summary(agent: str) -> Path:
        path = root / f"{agent.replace('/', '__')}.eval-1.json"
        resolved = [r.task for r in by_agent[agent] if r.passed]
        unresolved = [r.task for r in by_agent[agent] if not r.passed]
        path.write_text(json.dumps({
            "total_instances": len(TASKS), "submitted_instances": len(TASKS), "completed_instances": len(TASKS),
            "resolved_instances": len(resolved), "unresolved_instances": len(unresolved), "empty_patch_instances": 0,
            "error_instances": 0, "completed_ids": sorted(resolved + unresolved), "incomplete_ids": [],
            "empty_patch_ids": [], "submitted_ids": sorted(resolved + unresolved), "resolved_ids": resolved,
            "unresolved_ids": unresolved, "error_ids": [], "schema_version": 2}, indent=4))
        return path

    for run in by_agent[MINI_V1]:
        trajectory(folder / "mini-v1" / run.task / f"{run.task}.traj.json", trajectories.mini_swe_agent_v1(run.episode))
    for run in by_agent[MINI_V2]:
        trajectory(folder / "mini-v2" / run.task / f"{run.task}.traj.json", trajectories.mini_swe_agent_v2(run.episode))
    for run in by_agent[SWE_AGENT]:
        trajectory(folder / "swe-agent" / run.task / f"{run.task}.traj", trajectories.swe_agent(run.episode))
    logs = root / "logs" / "run_evaluation" / "eval-1" / MINI_V2.replace("/", "__")
    for run in by_agent[MINI_V2]:
        (logs / run.task).mkdir(parents=True)
        (logs / run.task / "report.json").write_text(json.dumps({run.task: {
            "patch_is_None": False, "patch_exists": True, "patch_successfully_applied": True, "resolved": run.passed,
            "tests_status": {"FAIL_TO_PASS": {"success": ["tests/test_cli.py::test_quote"] if run.passed else [],
                                              "failure": [] if run.passed else ["tests/test_cli.py::test_quote"]},
                             "PASS_TO_PASS": {"success": ["tests/test_cli.py::test_plain"], "failure": []}}}}))
    openhands = by_agent[f"{oh.AGENT_CLASS}/{OPENHANDS}"]
    write_jsonl(folder / "openhands" / "output.jsonl", [oh.output_line(r.episode, OPENHANDS) for r in openhands])
    evaluation = folder / "openhands" / "output.swebench_eval.jsonl"  # beside output.jsonl, as OpenHands leaves it
    write_jsonl(evaluation, [oh.eval_output_line(r.episode, OPENHANDS, oh.report(
        resolved=r.passed, error_eval=(r.agent, r.task) == EVALUATION_ERROR)) for r in openhands])
    return folder, [str(summary(MINI_V1)), str(root / "logs"), str(summary(SWE_AGENT)), str(evaluation)]


def _runs() -> list[Run]:
    """Every agent on every task; which runs pass is drawn (some tasks all pass or all fail)."""
    rng = random.Random(2201)
    strength = {MINI_V1: 0.3, MINI_V2: 0.7, SWE_AGENT: 0.5, f"{oh.AGENT_CLASS}/{OPENHANDS}": 0.6}
    return [_run(agent, task, rng.random() < strength[agent]) for task in TASKS for agent in AGENTS]


def test_four_agents_in_three_formats_pair_score_and_rank_without_a_grade_in_any_prompt(tmp_path: Path) -> None:
    runs = _runs()
    store = str(tmp_path / "store.sqlite")
    folder, results = _write(tmp_path, runs)
    ingested = kvjudge_json("ingest", str(folder), *itertools.chain.from_iterable(("--results", r) for r in results),
                            "--store", store)
    assert ingested["imported"] == len(TASKS) * len(AGENTS) and ingested["evaluation_errors"] == 1
    assert ingested["states"] == {"graded": len(runs) - 1, "ungraded": 1}
    assert ingested["ignored_files"] == 1  # the OpenHands evaluation output beside output.jsonl: results, not runs
    assert ingested["unmatched_results"] == []
    # Each agent's runs graded by its own evaluation output: the SWE-bench files by the model they are named
    # after, OpenHands' lines by the run ids their metadata gives (one evaluation errored: no grade).
    graded_by: Counter[tuple[str | None, str]] = Counter()
    for entry in ingested["results"]:
        graded_by[(entry["agent"], entry["agent_from"])] += entry["graded"]
    assert graded_by == {(MINI_V1, "file name"): len(TASKS), (MINI_V2, "file name"): len(TASKS),
                         (SWE_AGENT, "file name"): len(TASKS), (None, "run ids"): len(TASKS) - 1}
    # Every run under its agent and task, in its harness's format, with the grade its evaluation gave it.
    listed = kvjudge_json("runs", "--store", store)
    by_run = {(row["agent"], row["task"]): row for row in listed}
    assert set(by_run) == {(r.agent, r.task) for r in runs}
    for run in runs:
        grade = by_run[(run.agent, run.task)]["grade"]
        if (run.agent, run.task) == EVALUATION_ERROR:
            assert grade is None and by_run[(run.agent, run.task)]["state"] == "ungraded"
        else:
            assert grade == {"grader": "swe-bench", "score": 1.0 if run.passed else 0.0,
                             "label": "resolved" if run.passed else "unresolved"}
    with Store.open(store) as opened:
        formats = {(state.agent, state.metadata["format"]) for state in opened.runs.iter_runs()}
    assert formats == {(agent, stored) for agent, (_model, _harness, stored) in AGENTS.items()}

    key = write_key(tmp_path / "key.json", [r.key for r in runs])
    prompts: list[str] = []
    with SimJudgeServer(key, SETTINGS, prompts=prompts) as server:
        probed = kvjudge_json("probe", "--server", server.url)
        assert probed["certified"]
        server.judge.reasons.clear()
        probe_texts = len(prompts)
        evaluated = kvjudge_json("eval", "--server", server.url, "--store", store, "--parallel", "4", "--png",
                                 str(tmp_path / "eval.png"))
        eval_texts = len(prompts)
        eval_calls = server.requests["/v1/completions"]
        ranked = kvjudge_json("rank", "--server", server.url, "--store", store, "--parallel", "4", "--png",
                              str(tmp_path / "rank.png"))
        reasons = Counter(server.judge.reasons)
        rank_calls = server.requests["/v1/completions"] - eval_calls

    # The pairs: every two agents meet on every task (runs without trials pair with every other run on a task),
    # so each of the six pairs of agents — four of them across harnesses — is judged once per task, both orders.
    answer_key = AnswerKey.load(key)
    entry_of = {run.key.run: run for run in runs}
    judged: dict[frozenset[str], Counter[str]] = {}
    for prompt in prompts[probe_texts:eval_texts]:
        views = quoted_views(prompt)
        if set(views) != {"A", "B"}:
            continue  # a text sent to be counted, not a prompt
        first, second = (answer_key.identify(frozenset(line.strip() for line in views[p].split("\n")))
                         for p in ("A", "B"))
        assert first is not None and second is not None, "a view the judge could not tell apart"
        a, b = entry_of[first.run], entry_of[second.run]
        assert a.task == b.task and a.agent != b.agent
        judged.setdefault(frozenset((a.agent, b.agent)), Counter())[a.task] += 1
    assert len(judged) == 6
    for agents, per_task in judged.items():
        assert per_task == {task: 2 for task in TASKS}, agents  # once per task, in both orders
    formats_met = {frozenset(AGENTS[agent][1] for agent in agents) for agents in judged}  # harnesses that met
    assert formats_met == {frozenset({"mini-swe-agent"}), frozenset({"mini-swe-agent", "swe-agent"}),
                           frozenset({"mini-swe-agent", "openhands"}), frozenset({"swe-agent", "openhands"})}
    pairs = len(TASKS) * 6
    assert evaluated["pairing"] == {"policy": "matched", "pairs": pairs, "tasks": len(TASKS),
                                    "trials_per_task": {"1": len(TASKS)}}

    # What the key predicts: the server decides every pair whose key grades differ (both orders) and prefers the
    # better run exactly when the pair's draw is under the accuracy; eval scores the pairs whose stored grades
    # differ (the run whose evaluation errored has none: its pairs are left out).
    decided = equal = graded = correct = ungraded = 0
    for task in TASKS:
        for a, b in itertools.combinations([r for r in runs if r.task == task], 2):
            if a.passed == b.passed:
                equal += 1
            else:
                decided += 1
            if EVALUATION_ERROR in ((a.agent, a.task), (b.agent, b.task)):
                ungraded += 1
            elif a.passed != b.passed:
                graded += 1
                correct += draw(SETTINGS.seed, a.key.marker, b.key.marker) < SETTINGS.accuracy
    assert reasons == {"decided": 2 * decided, "equal_grades": 2 * equal}  # every view identified, evidence seen
    [(framing, figures)] = evaluated["templates"].items()
    assert framing == "raw"
    assert (figures["pairs"], figures["graded_pairs"], figures["ungraded"]) == (pairs, graded, ungraded)
    assert figures["equal_grades"] == pairs - graded - ungraded
    judge = figures["judge"]
    assert (judge["pairs"], judge["decisive"], judge["correct"]) == (graded, graded, correct)
    assert judge["accuracy_decisive"] == pytest.approx(correct / graded)
    assert 0 < correct < graded  # the key predicts mistakes as well as right answers: the count is not trivial
    assert judge["position_bias"] == pytest.approx(SETTINGS.bias, abs=0.02)

    # rank: all four agents, each in every pair it was in (from the judgment cache: no prompt sent again).
    assert ranked["pairs"] == ranked["games"] == pairs and ranked["pairing"]["pairs"] == pairs
    assert sorted(row["agent"] for row in ranked["agents"]) == sorted(AGENTS)
    for row in ranked["agents"]:
        assert row["wins"] + row["ties"] + row["losses"] == 3 * len(TASKS) and row["coverage"] == 1.0
    assert rank_calls == 0

    # Nothing held out reached the judge: not in the prompts, not in the texts it was asked to count — though
    # the judge did read the runs (every marker and evidence line is there) and kvjudge was given all of it.
    read = "\n".join(prompts[probe_texts:])
    for run in runs:
        assert run.key.marker in read and all(line.strip() in read for line in run.key.evidence)
    given = "\n".join(path.read_text() for path in tmp_path.rglob("*") if path.is_file()
                      and path.suffix in (".json", ".jsonl", ".traj"))
    for text in HELD_OUT:
        assert text.lower() in given.lower(), text  # the check below could fail
        assert text.lower() not in read.lower(), f"{text!r} reached the judge"
    for text in SHOWN_GRADES:
        assert text not in read, f"{text!r} reached the judge"
