"""Repeated runs of one task become trials (kvjudge/retention/ingest/trials.py): two different runs of one agent on
one task that their harness did not tell apart are two runs, each found again by the next import; the same run
reached twice is one run; the same run with other content is still refused. Files are written by the tests in the
harnesses' own shapes (SWE-agent demonstrations, inspect logs older than inspect's eval ids)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from helpers import store_snapshot

from kvjudge.errors import IngestError
from kvjudge.judge.candidates import grouped
from kvjudge.retention import Store
from kvjudge.retention.ingest import ingest_paths
from kvjudge.retention.ingest.trials import path_label
from kvjudge.testing import agent_logs as logs
from kvjudge.testing.inspect_logs import eval_spec, sample, write_json_log
from kvjudge.testing.trajectories import make_episode

INSTANCE = "marshmallow-code__marshmallow-1867"
CONFIGS = ("replay__marshmallow-code__marshmallow-1867__default__t-0.20__install-1",
           "replay__marshmallow-code__marshmallow-1867__function_calling__install-1")


def demonstrations(root: Path) -> list[Path]:
    """SWE-agent's ``trajectories/demonstrations/``: one instance replayed under two configurations (two folders,
    one ``<instance>.traj`` each, neither naming a trial), the second's agent taking one more step."""
    paths = []
    for index, config in enumerate(CONFIGS):
        trajectory = logs.swe_agent_history_only(INSTANCE)
        if index:
            trajectory["history"][2:2] = [
                {"role": "assistant", "content": "List.\n```\nls\n```", "thought": "List.", "action": "ls\n",
                 "agent": "primary"},
                {"role": "user", "content": "app.py", "agent": "primary"}]
        path = root / config / f"{INSTANCE}.traj"
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps(trajectory))
        paths.append(path)
    return paths


def test_two_configurations_of_one_instance_are_two_trials_found_again(store: Store, tmp_path: Path) -> None:
    demonstrations(tmp_path / "demonstrations")
    report = ingest_paths(store, [tmp_path / "demonstrations"])
    base = f"swe-agent/{INSTANCE}"
    assert report.imported == [base, f"{base}/{CONFIGS[1]}"] and report.skipped == []
    states = [store.runs.run(run_id) for run_id in report.imported]
    assert [(s.task_id, s.trial) for s in states] == [(INSTANCE, None), (INSTANCE, CONFIGS[1])]
    # best of N sees both runs of the task
    assert [run.id for run in grouped(store.runs.listing())[INSTANCE]] == report.imported
    before = store_snapshot(store)
    again = ingest_paths(store, [tmp_path / "demonstrations"])
    assert again.imported == [] and again.already_present == report.imported and store_snapshot(store) == before


def test_the_same_run_reached_by_two_paths_is_one_run(store: Store, tmp_path: Path) -> None:
    first, _ = demonstrations(tmp_path / "demonstrations")
    for folder in ("linked", "copied"):
        (tmp_path / folder).mkdir()
    os.symlink(first, tmp_path / "linked" / first.name)  # the same file: read once
    (tmp_path / "copied" / first.name).write_bytes(first.read_bytes())  # the same bytes: the same run
    report = ingest_paths(store, [tmp_path / "linked", tmp_path / "demonstrations", tmp_path / "copied", first])
    assert report.imported == [f"swe-agent/{INSTANCE}", f"swe-agent/{INSTANCE}/{CONFIGS[1]}"]
    assert report.already_present == [f"swe-agent/{INSTANCE}"]


def test_a_run_imported_alone_first_keeps_its_id_and_the_other_becomes_a_trial(store: Store, tmp_path: Path) -> None:
    _, second = demonstrations(tmp_path / "demonstrations")
    assert ingest_paths(store, [second]).imported == [f"swe-agent/{INSTANCE}"]
    report = ingest_paths(store, [tmp_path / "demonstrations"])
    assert report.already_present == [f"swe-agent/{INSTANCE}"]
    assert report.imported == [f"swe-agent/{INSTANCE}/{CONFIGS[0]}"]  # its folder tells it apart
    assert ingest_paths(store, [tmp_path / "demonstrations"]).imported == []


def test_two_inspect_logs_that_name_no_eval_id_are_two_trials_by_their_run_ids(store: Store, tmp_path: Path) -> None:
    model = "openai/gpt-4o"
    specs = [eval_spec("images", model), eval_spec("images", model)]
    for spec, run_id in zip(specs, ("4hZVSqgqbdNBk7pFLr5RWq", "eJCDmwYjFJJeJpJZfovPsz"), strict=True):
        del spec["eval_id"]  # inspect logs of 2024 name their run, not the eval
        spec["run_id"] = run_id
    (tmp_path / "test_eval_log").mkdir()
    for name, spec, seed in (("log_images.json", specs[0], 3), ("log_images_tc.json", specs[1], 4)):
        episode = make_episode("images-1", seed, target_bytes=2000, model=model)
        write_json_log(tmp_path / "test_eval_log" / name, spec, [sample(episode, 1, 1, model=model)])
    report = ingest_paths(store, [tmp_path / "test_eval_log"])
    assert report.imported == [f"{model}/images/1/1", f"{model}/images/1/1-eJCDmwYj"]
    assert [store.runs.run(r).trial for r in report.imported] == ["1", "1-eJCDmwYj"]
    assert ingest_paths(store, [tmp_path / "test_eval_log"]).imported == []


def test_a_label_another_trial_took_passes_to_the_next(store: Store, tmp_path: Path) -> None:
    model = "openai/gpt-4o"
    (tmp_path / "logs").mkdir()
    for name, seed in (("a.json", 3), ("b.json", 4), ("c.json", 5), ("d.json", 6)):  # one eval's ids in all
        spec = eval_spec("images", model)
        del spec["eval_id"]
        episode = make_episode("images-1", seed, target_bytes=2000, model=model)
        write_json_log(tmp_path / "logs" / name, spec, [sample(episode, 1, 1, model=model)])
    report = ingest_paths(store, [tmp_path / "logs"])
    spec = eval_spec("images", model)
    labels = ["", f"-{spec['run_id'][:8]}", f"-{spec['task_id'][:8]}", "-d"]  # the eval's ids, then the path
    assert report.imported == [f"{model}/images/1/1{label}" for label in labels]
    assert ingest_paths(store, [tmp_path / "logs"]).imported == []


def test_one_instance_twice_in_a_jsonl_file_is_two_trials(store: Store, tmp_path: Path) -> None:
    lines = [logs.openhands_2024_line("dev__greeter-1", resolved=True),
             logs.openhands_2024_line("dev__greeter-1", resolved=False)]
    lines[1]["history"][1]["args"]["command"] = "cat -n app.py"
    path = tmp_path / "output.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    report = ingest_paths(store, [path])
    assert len(report.imported) == 2 and report.imported[0] == "OpenHands/dev__greeter-1"
    assert report.imported[1].startswith("OpenHands/dev__greeter-1/")  # by its work digest: the path is the same
    assert ingest_paths(store, [path]).imported == []


def test_the_same_work_with_other_content_is_still_refused(store: Store, tmp_path: Path) -> None:
    lines = [logs.openhands_2024_line("dev__greeter-1", resolved=True),
             logs.openhands_2024_line("dev__greeter-1", resolved=False)]  # one run, two grades
    path = tmp_path / "output.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    with pytest.raises(IngestError, match=r"output.jsonl:2: run 'OpenHands/dev__greeter-1' appears twice with "
                                          r"different content"):
        ingest_paths(store, [path])
    assert store.runs.run_ids() == []


def test_a_path_label_keeps_what_tells_runs_apart() -> None:
    assert path_label(f"{CONFIGS[0]}/{INSTANCE}.traj", INSTANCE) == CONFIGS[0]
    assert path_label("log_images_tc.json", "images/1") == "log_images_tc"
    assert path_label("a/b/run.jsonl.gz", "t") == "a:b:run"
    assert path_label(None, "t") is None


def test_a_session_that_changed_is_refused_not_made_a_trial(store: Store, tmp_path: Path) -> None:
    # A Claude Code session names its run: the same session with other work is that session changed.
    first = logs.claude_code_session(tmp_path / "a" / "session.jsonl")
    run_id = ingest_paths(store, [first]).imported[0]
    changed = logs.claude_code_session(tmp_path / "b" / "session.jsonl", answer="Another answer.")
    with pytest.raises(IngestError, match=f"run '{run_id}' is already in the store with other content"):
        ingest_paths(store, [changed])
    assert store.runs.run_ids() == [run_id]


def test_an_inspect_log_rescored_is_another_eval_of_the_same_samples(store: Store, tmp_path: Path) -> None:
    # `inspect score` writes a new log (a new run id) of the same samples with other scores: two evals, two trials.
    model = "openai/gpt-4o-mini"
    episode = make_episode("popularity-9", 3, target_bytes=2000, model=model)
    (tmp_path / "logs").mkdir()
    for name, run_id, score in (("a.json", "dPiJifoWeEQBrfWsAopzWr", "C"), ("b.json", "mj7khqpMM4GBCfVQozKgzB", "I")):
        spec = eval_spec("popularity", model)
        del spec["eval_id"]
        spec["run_id"] = run_id
        write_json_log(tmp_path / "logs" / name, spec, [sample(episode, 9, 1, model=model, score=score)])
    report = ingest_paths(store, [tmp_path / "logs"])
    assert report.imported == [f"{model}/popularity/9/1", f"{model}/popularity/9/1-mj7khqpM"]
    assert [store.runs.run(r).grades[0]["label"] for r in report.imported] == ["correct", "incorrect"]


def test_a_trial_pointed_at_from_another_folder_is_found_again(store: Store, tmp_path: Path) -> None:
    demonstrations(tmp_path / "trajectories" / "demonstrations")
    first = ingest_paths(store, [tmp_path / "trajectories" / "demonstrations"])
    again = ingest_paths(store, [tmp_path / "trajectories"])  # its path label would be another
    assert again.imported == [] and sorted(again.already_present) == sorted(first.imported)
