"""Grades that arrive after the import (`kvjudge grade`), the listing by agent, task and state, and the pairing of
trials. A mini-swe-agent run and an OpenHands run of the same SWE-bench instance are imported ungraded, judged
(verdicts cached), graded late, and then `eval` counts their pair."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest
from helpers import cli_json_ok, kvjudge, kvjudge_json, store_snapshot

from kvjudge.cli import main
from kvjudge.commands._judging import select_pairs
from kvjudge.errors import RunStateError
from kvjudge.judge import SCORED, render_view
from kvjudge.judge.render import body_resolver
from kvjudge.judge.pairing import describe_pairs, same_task_pairs, trial_order
from kvjudge.retention import Store
from kvjudge.retention import events as ev
from kvjudge.retention.ingest import ingest_paths
from kvjudge.retention.lifecycle import check_transition
from kvjudge.retention.verify import verify
from kvjudge.testing import openhands as oh
from kvjudge.testing.jsonl import write_jsonl
from kvjudge.testing.native_runs import make_run
from kvjudge.testing.sim_judge import Settings, SimJudgeServer, write_key
from kvjudge.testing.trajectories import make_episode, mini_swe_agent_v2

MODEL = "openai/gpt-4o"
MINI = f"{MODEL}/csvkit__csvkit-101"  # mini-swe-agent: <model>/<instance>
OPENHANDS = f"CodeActAgent/{MODEL}/csvkit__csvkit-101"  # OpenHands: <agent_class>/<model>/<instance>
INSTANCES = ("csvkit__csvkit-101", "csvkit__csvkit-202")
RESOLVED = {"grader": "swe-bench", "score": 1.0, "label": "resolved"}
UNRESOLVED = {"grader": "swe-bench", "score": 0.0, "label": "unresolved"}


def write_runs(root: Path, steps: int = 3, target: int = 3_000, seed: int = 0) -> None:
    """Two agents on two SWE-bench instances: mini-swe-agent trajectories and an OpenHands output.jsonl (another
    ``seed``: another run of the same agents)."""
    lines = []
    for index, instance in enumerate(INSTANCES):
        mini = make_episode(instance, 10 + index + seed, target_bytes=target, model=MODEL)
        mini.steps = mini.steps[:steps]
        folder = root / "mini" / instance
        folder.mkdir(parents=True)
        (folder / f"{instance}.traj.json").write_text(json.dumps(mini_swe_agent_v2(mini)))
        openhands = make_episode(instance, 20 + index + seed, target_bytes=target, model=MODEL)
        openhands.steps = openhands.steps[:steps]
        lines.append(openhands)
    write_jsonl(root / "openhands" / "output.jsonl", [oh.output_line(e, MODEL) for e in lines])


def write_results(root: Path, *, mini_resolved: str, openhands_resolved: str) -> list[str]:
    """A SWE-bench summary report for the mini-swe-agent runs (named after the model, as the harness names it) and
    OpenHands' evaluation output for its runs; each agent resolved the instance given."""
    root.mkdir(parents=True, exist_ok=True)
    summary = root / f"{MODEL.replace('/', '__')}.eval-1.json"
    summary.write_text(json.dumps({"resolved_ids": [mini_resolved],
                                   "unresolved_ids": [i for i in INSTANCES if i != mini_resolved],
                                   "error_ids": [], "empty_patch_ids": [], "schema_version": 2}))
    evaluation = write_jsonl(root / "output.swebench_eval.jsonl", [
        oh.eval_output_line(make_episode(instance, 0), MODEL, oh.report(resolved=instance == openhands_resolved))
        for instance in INSTANCES])
    return ["--results", str(summary), "--results", str(evaluation)]


def grades(store_path: Path) -> dict[str, list[str]]:
    with Store.open(store_path) as store:
        return {run_id: [g["label"] for g in store.runs.run(run_id).grades] for run_id in store.runs.run_ids()}


def test_late_grades_attach_once_and_conflicts_need_replace(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    write_runs(tmp_path / "runs")
    store = tmp_path / "store.sqlite"
    common = ["--store", str(store)]
    imported = cli_json_ok(capsys, "ingest", str(tmp_path / "runs"), *common)
    assert imported["imported"] == 4 and imported["states"] == {"ungraded": 4}
    with Store.open(store) as opened:
        hashes = {run_id: next(iter(opened.events.iter_events(run_id)))[1].content_hash for run_id in opened.runs.run_ids()}
    # An ungraded run cannot be marked graded without a grade.
    assert main(["mark", MINI, "graded", *common]) == 1
    assert "an ungraded run becomes graded by getting a grade: kvjudge grade" in capsys.readouterr().err

    results = write_results(tmp_path / "results", mini_resolved=INSTANCES[0], openhands_resolved=INSTANCES[1])
    graded = cli_json_ok(capsys, "grade", "--all", *results, *common)
    assert graded["counts"] == {"graded": 4, "replaced": 0, "unchanged": 0, "no_result": 0}
    assert {entry["run"]: entry["state"] for entry in graded["graded"]} == {run: "graded" for run in hashes}
    assert [r["agent_from"] for r in graded["results"]] == ["file name", "run ids"]
    assert grades(store) == {OPENHANDS: ["unresolved"], f"CodeActAgent/{MODEL}/csvkit__csvkit-202": ["resolved"],
                             MINI: ["resolved"], f"{MODEL}/csvkit__csvkit-202": ["unresolved"]}
    with Store.open(store) as opened:
        state = opened.runs.run(MINI)
        assert state.lifecycle == ("running", "grading", "ungraded", "graded")
        kinds = [event.kind for _, event in opened.events.iter_events(MINI)]
        assert kinds[-4:] == ["StateChanged", "StateChanged", "GradeRecorded", "StateChanged"]  # appended, after
        # What was imported is unchanged: the content hash recorded at import names it still.
        assert {run_id: next(iter(opened.events.iter_events(run_id)))[1].content_hash for run_id in hashes} == hashes
        assert verify(opened).ok
        # What the judge reads of each run: neither the late grade nor the SWE-bench row OpenHands kept.
        for run_id in hashes:
            state = opened.runs.run(run_id)
            view = render_view(state, body_resolver(state, opened.blobs.text))
            assert state.task_id in view and "swe-bench" not in view and "resolved" not in view
            assert "GOLD_PATCH_MARKER" not in view and "test_gold_marker" not in view
    listed = cli_json_ok(capsys, "runs", "--state", "graded", "--agent", f"CodeActAgent/{MODEL}", *common,
                         "--config", str(_chars(tmp_path)))
    assert [(r["id"], r["agent"], r["task"], r["trial"], r["grade"]) for r in listed] == [
        (OPENHANDS, f"CodeActAgent/{MODEL}", INSTANCES[0], None, UNRESOLVED),
        (f"CodeActAgent/{MODEL}/csvkit__csvkit-202", f"CodeActAgent/{MODEL}", INSTANCES[1], None, RESOLVED)]

    # The same grades again: nothing changes, not a byte.
    before = store_snapshot(store)
    again = cli_json_ok(capsys, "grade", "--all", *results, *common)
    assert again["counts"] == {"graded": 0, "replaced": 0, "unchanged": 4, "no_result": 0}
    assert store_snapshot(store) == before
    # The original import again: its runs are already present.
    reimported = cli_json_ok(capsys, "ingest", str(tmp_path / "runs"), *common)
    assert reimported["imported"] == 0 and reimported["already_present"] == 4
    assert store_snapshot(store) == before

    # Other results for graded runs: refused, one line, nothing written — unless --replace.
    other = write_results(tmp_path / "other", mini_resolved=INSTANCES[1], openhands_resolved=INSTANCES[1])
    assert main(["grade", MINI, f"{MODEL}/csvkit__csvkit-202", OPENHANDS, *other, *common]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"run {MINI} is graded" in err and "(and 1 more run(s))" in err
    assert "--replace records the new grade" in err
    assert store_snapshot(store) == before
    replaced = cli_json_ok(capsys, "grade", MINI, OPENHANDS, *other, "--replace", *common)
    assert replaced["counts"] == {"graded": 0, "replaced": 1, "unchanged": 1, "no_result": 0}
    assert replaced["replaced"] == [{"run": MINI, "grade": UNRESOLVED, "state": "graded", "replaces": [RESOLVED]}]
    with Store.open(store) as opened:
        state = opened.runs.run(MINI)
        assert state.grades == (UNRESOLVED,) and state.state == "graded"
        recorded = [event for _, event in opened.events.iter_events(MINI) if isinstance(event, ev.GradeRecorded)]
        assert [(e.grade, e.replaces) for e in recorded] == [(RESOLVED, None), (UNRESOLVED, [RESOLVED])]
        projected = {run_id: opened.runs.projected_bytes(run_id) for run_id in opened.runs.run_ids()}
        opened.rebuild_projection()  # the fold is pure: re-folded from LSN 0, the same bytes
        assert {run_id: opened.runs.projected_bytes(run_id) for run_id in opened.runs.run_ids()} == projected
        assert verify(opened).ok


def _chars(tmp_path: Path) -> Path:
    config = tmp_path / "chars.toml"
    config.write_text('[retention]\ncounter = "chars"\n')
    return config


def test_grade_refuses_bad_input_and_writes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_runs(tmp_path / "runs", steps=2, target=1_500)
    store = tmp_path / "store.sqlite"
    common = ["--store", str(store)]
    cli_json_ok(capsys, "ingest", str(tmp_path / "runs"), *common)
    results = write_results(tmp_path / "results", mini_resolved=INSTANCES[0], openhands_resolved=INSTANCES[0])
    before = store_snapshot(store)
    unnamed = tmp_path / "unnamed" / "summary.json"  # names no agent: both agents ran these instances
    unnamed.parent.mkdir()
    unnamed.write_text(json.dumps({"resolved_ids": list(INSTANCES), "unresolved_ids": []}))
    not_json = tmp_path / "broken" / "output.swebench_eval.jsonl"
    not_json.parent.mkdir()
    not_json.write_text('{"instance_id": "csvkit__csvkit-101", "test_result": {"report": {"resol\n')
    for argv, message in (
            (["grade", "no/such/run", *results], "no run 'no/such/run' in the store"),
            (["grade", "--all"], "pass the results to attach: --results"),
            (["grade", MINI, "--all", *results], "name the runs to grade (RUN...) or pass --all"),
            (["grade", "--all", "--results", str(tmp_path / "missing.json")], "missing.json does not exist"),
            (["grade", "--all", "--results", str(not_json)], f"--results {not_json}:1: not valid JSON"),
            (["grade", "--all", "--results", str(unnamed)], "matches runs of 2 agents")):
        assert main([*argv, *common]) != 0, argv
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and message in err and "Traceback" not in err, (argv, err)
        assert store_snapshot(store) == before
    # With the agent named, the same summary grades that agent's runs only.
    named = cli_json_ok(capsys, "grade", "--all", "--results", f"{MODEL}={unnamed}", *common)
    assert sorted(entry["run"] for entry in named["graded"]) == [MINI, f"{MODEL}/csvkit__csvkit-202"]
    assert len(named["no_result"]) == 2


def test_the_late_graded_step_needs_a_grade(tmp_path: Path) -> None:
    check_transition("r", "ungraded", "graded", after_grade=True)
    with pytest.raises(RunStateError, match="becomes graded by getting a grade"):
        check_transition("r", "ungraded", "graded")
    with pytest.raises(RunStateError):
        check_transition("r", "archived", "graded", after_grade=True)
    # An ungraded run holding a grade from its import still cannot be marked graded: only a new grade moves it.
    run = make_run("held", ["ok"], passed=True, lifecycle=["running", "grading", "ungraded"])
    write_jsonl(tmp_path / "runs.jsonl", [run])
    with Store.open(tmp_path / "s.sqlite") as store:
        ingest_paths(store, [tmp_path / "runs.jsonl"]).runs
        assert store.runs.run("held").grades
        with pytest.raises(RunStateError):
            store.events.mark("held", "graded")
        with pytest.raises(RunStateError):  # the step must directly follow the grade
            store.events.append_many("held", [ev.GradeRecorded(run="held", grade={"grader": "g", "score": 1.0}),
                                       ev.VerifierRecorded(run="held", result={"name": "v", "passed": True}),
                                       ev.StateChanged(run="held", state="graded")])
        store.events.append_many("held", [ev.GradeRecorded(run="held", grade={"grader": "g", "score": 1.0}),
                                   ev.StateChanged(run="held", state="graded")])
        assert store.runs.run("held").state == "graded"


# --------------------------------------------------------------------------------------------------- trials
def _run(run_id: str, agent: str | None, trial: str | None, task: str = "t") -> SimpleNamespace:
    return SimpleNamespace(id=run_id, agent=agent, trial=trial, task_id=task, tenant="default")


def test_matched_pairs_trial_i_with_trial_i_and_all_pairs_every_two() -> None:
    runs = [_run(f"{agent}/t/{trial}", agent, trial) for agent in ("a", "b") for trial in ("epoch-1", "epoch-2",
                                                                                          "epoch-10")]
    matched = same_task_pairs(runs)
    assert matched.pairs == [("a/t/epoch-1", "b/t/epoch-1"), ("a/t/epoch-10", "b/t/epoch-10"),
                             ("a/t/epoch-2", "b/t/epoch-2")]
    assert matched.to_json() == {"policy": "matched", "pairs": 3, "tasks": 1, "trials_per_task": {"3": 1}}
    assert "3 pair(s) on 1 task(s) (matched: trial i with trial i; 3 trial(s) per agent on 1 task(s))" \
        == matched.describe()
    everything = same_task_pairs(runs, policy="all")
    assert len(everything.pairs) == 15  # every two of six runs: 9 across the agents, 3 + 3 within each
    across = same_task_pairs(runs, policy="all", keep=lambda x, y: x.agent != y.agent)
    assert len(across.pairs) == 9
    # Trial names are ordered numbers first: epoch-2 is the second trial, not epoch-10.
    assert sorted(["epoch-10", "epoch-2", "epoch-1"], key=trial_order) == ["epoch-1", "epoch-2", "epoch-10"]
    # Different trial names across agents (Harbor's are random): paired by their place in each agent's order.
    named = [_run("a/x", "a", "t__Ab12"), _run("a/y", "a", "t__Zz99"), _run("b/x", "b", "t__Qq00"),
             _run("b/y", "b", "t__Rr11")]
    assert same_task_pairs(named).pairs == [("a/x", "b/x"), ("a/y", "b/y")]


def test_runs_without_trials_pair_as_before() -> None:
    runs = [_run("csv-1", None, None), _run("csv-2", None, None), _run("csv-3", None, None),
            _run("other", None, None, task="u")]
    assert same_task_pairs(runs).pairs == [("csv-1", "csv-2"), ("csv-1", "csv-3"), ("csv-2", "csv-3")]
    assert same_task_pairs(runs).pairs == same_task_pairs(runs, policy="all").pairs
    mixed = [_run("a/1", "a", "1"), _run("a/2", "a", "2"), _run("b", "b", None)]  # b ran once, with no trial
    assert same_task_pairs(mixed).pairs == [("a/1", "b"), ("a/2", "b")]
    states = {state.id: state for state in mixed}
    assert describe_pairs([("a/1", "b")], states.__getitem__, "named").trials == {1: 1}


def test_select_pairs_applies_the_policy_to_a_store(tmp_path: Path) -> None:
    runs = []
    for agent in ("a", "b"):
        for trial in ("1", "2"):
            run = make_run(f"{agent}/fix-csv/{trial}", ["collected 1 item\n1 passed"], passed=True)
            run.update(agent=agent, trial=trial)
            run["task"]["id"] = "fix-csv"
            runs.append(run)
    write_jsonl(tmp_path / "runs.jsonl", runs)
    with Store.open(tmp_path / "s.sqlite") as store:
        ingest_paths(store, [tmp_path / "runs.jsonl"]).runs

        def args(**given: object) -> argparse.Namespace:
            return argparse.Namespace(**{"runs": [], "pairs": None, "task": None, "trials": "matched", **given})

        assert select_pairs(args(task="fix-csv"), store.runs).pairs == [("a/fix-csv/1", "b/fix-csv/1"),
                                                                   ("a/fix-csv/2", "b/fix-csv/2")]
        assert len(select_pairs(args(trials="all"), store.runs, default_all=True).pairs) == 6
        named = select_pairs(args(runs=["a/fix-csv/1", "a/fix-csv/2"]), store.runs)
        assert named.to_json() == {"policy": "named", "pairs": 1, "tasks": 1, "trials_per_task": {"2": 1}}


def test_repeated_swe_bench_runs_are_trials_graded_and_paired_by_trial(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """A second run of the same two agents on the same instances: without --trial it is the same run ids with other
    content (refused); with --trial each run is a trial of its own, --results and `grade` reach it, pairs form by
    trial."""
    write_runs(tmp_path / "first", steps=2, target=1_500)
    write_runs(tmp_path / "second", steps=2, target=1_500, seed=5)
    store = tmp_path / "store.sqlite"
    common = ["--store", str(store)]
    first_results = write_results(tmp_path / "results-1", mini_resolved=INSTANCES[0], openhands_resolved=INSTANCES[1])
    first = cli_json_ok(capsys, "ingest", str(tmp_path / "first"), "--trial", "1", *first_results, *common)
    assert first["imported"] == 4 and first["states"] == {"graded": 4} and first["unmatched_results"] == []
    trial_1 = {f"{MINI}/1": "resolved", f"{MODEL}/csvkit__csvkit-202/1": "unresolved",
               f"{OPENHANDS}/1": "unresolved", f"CodeActAgent/{MODEL}/csvkit__csvkit-202/1": "resolved"}
    assert {run: labels[0] for run, labels in grades(store).items()} == trial_1
    before = store_snapshot(store)
    assert main(["ingest", str(tmp_path / "second"), "--trial", "1", *common]) == 1  # the same trial again
    assert "already in the store with other content" in capsys.readouterr().err
    for label in ("", "a/b", " 2"):
        assert main(["ingest", str(tmp_path / "second"), "--trial", label, *common]) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "a trial label is a non-empty name without '/'" in err
    native = write_jsonl(tmp_path / "native.jsonl", [make_run("own-id", ["ok"], passed=True)])
    assert main(["ingest", str(native), "--trial", "2", *common]) == 1
    expected = "--trial labels runs whose files name no trial (mini-swe-agent, swe-agent, openhands)"
    assert expected in capsys.readouterr().err
    assert store_snapshot(store) == before

    second = cli_json_ok(capsys, "ingest", str(tmp_path / "second"), "--trial", "2", *common)
    assert second["imported"] == 4 and second["states"] == {"ungraded": 4}
    listed = cli_json_ok(capsys, "runs", "--task", INSTANCES[0], *common, "--config", str(_chars(tmp_path)))
    assert [(row["id"], row["task"], row["trial"]) for row in listed] == [
        (f"{OPENHANDS}/1", INSTANCES[0], "1"), (f"{OPENHANDS}/2", INSTANCES[0], "2"),
        (f"{MINI}/1", INSTANCES[0], "1"), (f"{MINI}/2", INSTANCES[0], "2")]

    # The second trial's results name no trial: they fit trial 1's runs as well, so `grade --all` is refused
    # until the trial is named.
    second_results = write_results(tmp_path / "results-2", mini_resolved=INSTANCES[1],
                                   openhands_resolved=INSTANCES[1])
    before = store_snapshot(store)
    assert main(["grade", "--all", *second_results, *common]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "names no trial and fits 2 trials" in err and "--trial LABEL" in err
    assert store_snapshot(store) == before
    assert main(["grade", f"{MINI}/2", "--trial", "2", *second_results, *common]) == 2  # --trial goes with --all
    capsys.readouterr()
    graded = cli_json_ok(capsys, "grade", "--all", "--trial", "2", *second_results, *common)
    assert graded["counts"] == {"graded": 4, "replaced": 0, "unchanged": 0, "no_result": 0}
    assert {run: labels[0] for run, labels in grades(store).items()} == {
        **trial_1, f"{MINI}/2": "unresolved", f"{MODEL}/csvkit__csvkit-202/2": "resolved",
        f"{OPENHANDS}/2": "unresolved", f"CodeActAgent/{MODEL}/csvkit__csvkit-202/2": "resolved"}

    # Pairs by trial: trial i of one agent with trial i of the other (two per instance), or every pair (six).
    with Store.open(store) as opened:
        matched = same_task_pairs(opened.runs.iter_runs())
        assert matched.pairs == [(f"{OPENHANDS}/1", f"{MINI}/1"), (f"{OPENHANDS}/2", f"{MINI}/2"),
                                 (f"CodeActAgent/{MODEL}/csvkit__csvkit-202/1", f"{MODEL}/csvkit__csvkit-202/1"),
                                 (f"CodeActAgent/{MODEL}/csvkit__csvkit-202/2", f"{MODEL}/csvkit__csvkit-202/2")]
        assert matched.trials == {2: 2}
        assert len(same_task_pairs(opened.runs.iter_runs(), policy="all").pairs) == 12


def test_verdicts_judged_before_the_grades_came_are_reused_by_eval(tmp_path: Path,
                                                                   start_sim: Callable[[Path, Settings],
                                                                                       SimJudgeServer]) -> None:
    """Judge first, grade later: `eval` then scores the pairs from the verdicts cached by `judge`, sending the judge
    nothing more (the grades are not part of what identifies a verdict)."""
    write_runs(tmp_path / "runs", steps=2, target=1_200)
    store = str(tmp_path / "store.sqlite")
    assert kvjudge_json("ingest", str(tmp_path / "runs"), "--store", store)["states"] == {"ungraded": 4}
    server = start_sim(write_key(tmp_path / "key.json", []), Settings())
    assert kvjudge_json("probe", "--server", server.url)["certified"]
    probed = sum(server.requests.values())
    for instance in INSTANCES:
        judged = kvjudge("judge", "--task", instance, "--server", server.url, "--store", store, "--json")
        assert judged.returncode == 0, judged.stderr
        assert json.loads(judged.stdout.splitlines()[-1])["summary"]["cached"] == 0
    calls = server.requests["/v1/completions"]
    assert calls >= 2 * len(INSTANCES) and sum(server.requests.values()) > probed  # both orders of each pair
    results = write_results(tmp_path / "results", mini_resolved=INSTANCES[0], openhands_resolved=INSTANCES[1])
    assert kvjudge_json("grade", "--all", *results, "--store", store)["counts"]["graded"] == 4
    before = dict(server.requests)
    evaluated = kvjudge_json("eval", "--server", server.url, "--store", store, "--png", str(tmp_path / "e.png"))
    (figures,) = evaluated["templates"].values()
    assert evaluated["pairing"]["pairs"] == 2 and figures["graded_pairs"] == 2 and figures["ungraded"] == 0
    assert figures["judge"]["pairs"] == 2
    # Every verdict from the cache: no judge call, nothing counted (eval only asked the server who it is).
    asked = {path: n - before.get(path, 0) for path, n in server.requests.items() if n != before.get(path, 0)}
    assert set(asked) == {"/v1/models", "/version"}


# ------------------------------------------------------------------------------ end to end, with a real judge
@pytest.mark.model
def test_judge_then_grade_late_then_eval_counts_the_pairs(tmp_path: Path, default_model: Path) -> None:
    write_runs(tmp_path / "runs", steps=2, target=1_200)
    store = tmp_path / "store.sqlite"
    common = ["--store", str(store), "--config", str(_chars(tmp_path))]
    judge_options = ["--model", str(default_model), "--n-ctx", "1024", "--no-certify"]
    assert kvjudge("ingest", str(tmp_path / "runs"), *common).returncode == 0

    judged = kvjudge("judge", "--task", INSTANCES[0], *judge_options, "--json", *common, timeout=900)
    assert judged.returncode == 0, judged.stderr
    *rows, tail = [json.loads(line) for line in judged.stdout.splitlines()]
    # The mini-swe-agent run and the OpenHands run of one SWE-bench instance pair up.
    assert [(r["a"], r["b"]) for r in rows] == [(OPENHANDS, MINI)] and rows[0]["outcome"] in SCORED
    assert tail["summary"]["pairing"] == {"policy": "matched", "pairs": 1, "tasks": 1, "trials_per_task": {"1": 1}}

    ungraded = kvjudge("eval", "--task", INSTANCES[0], *judge_options, "--json", *common,
                       "--png", str(tmp_path / "e.png"), timeout=900)
    assert ungraded.returncode == 0, ungraded.stderr
    (before,) = json.loads(ungraded.stdout)["templates"].values()
    assert before["pairs"] == 1 and before["graded_pairs"] == 0 and before["ungraded"] == 1

    results = write_results(tmp_path / "results", mini_resolved=INSTANCES[0], openhands_resolved=INSTANCES[1])
    graded = kvjudge("grade", "--all", *results, "--json", *common)
    assert graded.returncode == 0, graded.stderr
    assert json.loads(graded.stdout)["counts"]["graded"] == 4

    evaluated = kvjudge("eval", *judge_options, "--json", *common, "--png", str(tmp_path / "e.png"), timeout=900)
    assert evaluated.returncode == 0, evaluated.stderr
    report = json.loads(evaluated.stdout)
    (after,) = report["templates"].values()
    # Two instances, one pair each; the grades differ on both (each agent resolved one): both pairs count now.
    assert report["pairing"] == {"policy": "matched", "pairs": 2, "tasks": 2, "trials_per_task": {"1": 2}}
    assert after["pairs"] == 2 and after["graded_pairs"] == 2 and after["ungraded"] == 0
    assert after["judge"]["pairs"] == 2

    snapshot = store_snapshot(store)
    assert json.loads(kvjudge("grade", "--all", *results, "--json", *common).stdout)["counts"]["unchanged"] == 4
    conflicting = write_results(tmp_path / "other", mini_resolved=INSTANCES[1], openhands_resolved=INSTANCES[1])
    refused = kvjudge("grade", "--all", *conflicting, *common)
    assert refused.returncode == 1 and "--replace" in refused.stderr and refused.stderr.count("\n") == 1
    assert store_snapshot(store) == snapshot
