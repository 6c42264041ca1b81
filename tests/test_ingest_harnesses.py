"""Harbor trials (ATIF + result.json) and inspect_ai eval logs (.eval, zstd or deflated; .json) in: runs, agents,
tasks, trials, held-out grades, per-call usage; hostile and broken files refused with one line and nothing
written. Every file is written by the tests through kvjudge.testing.harbor and kvjudge.testing.inspect_logs,
shaped as the harnesses write them; nothing is downloaded."""

from __future__ import annotations

import io
import json
import os
import zipfile
from pathlib import Path

import pytest
from helpers import cli_json_ok, kvjudge, store_snapshot

from kvjudge.cli import main
from kvjudge.errors import IngestError
from kvjudge.judge import render_view
from kvjudge.judge.render import body_resolver
from kvjudge.retention import Store
from kvjudge.retention.ingest import archive, ingest_paths, json_stream
from kvjudge.retention.ingest.inspect_log import score_grade
from kvjudge.retention.ingest.results import load_results
from kvjudge.testing.harbor import TrialSpec, write_job, write_result, write_trial
from kvjudge.testing.inspect_logs import ZstdZip, eval_spec, sample, write_eval, write_json_log
from kvjudge.testing.trajectories import make_episode

TERMINUS = "terminus-2@anthropic/claude-sonnet-4-5-20250929"
CLAUDE = "claude-code@openai/gpt-5"
TASKS = ("fix-csv-quoting", "build-cython-ext")
PASS, FAIL = ({"grader": "harbor", "score": score, "label": label} for score, label in ((1.0, "pass"), (0.0, "fail")))


def two_agent_job(root: Path) -> Path:
    """Two agents × two tasks × two trials; terminus-2 summarised its context once on one trial; one claude-code
    trial timed out before the verifier ran; claude-code failed the second task."""
    trials = []
    for t_index, task in enumerate(TASKS):
        for trial in range(2):
            trials.append(TrialSpec(task, suffix=f"T{t_index}{trial}aaaa", seed=10 * t_index + trial,
                                    continuations=1 if (t_index, trial) == (0, 1) else 0))
            trials.append(TrialSpec(task, agent="claude-code", model="openai/gpt-5", suffix=f"C{t_index}{trial}bbbb",
                                    seed=50 + 10 * t_index + trial, reward=0.0 if t_index else 1.0,
                                    exception="AgentTimeoutError" if (t_index, trial) == (1, 1) else None))
    trials[-1].reward = None
    return write_job(root, "2025-11-02__10-00-00", trials)


def transitions(store: Store, run_id: str) -> list:
    return list(store.runs.run(run_id).branches[0].transitions)


def test_a_harbor_job_imports_trials_as_runs(store: Store, tmp_path: Path) -> None:
    job = two_agent_job(tmp_path / "jobs")
    report = ingest_paths(store, [tmp_path / "jobs"])
    assert len(report.imported) == 8 and report.skipped == []
    assert dict(report.states) == {"graded": 7, "ungraded": 1}
    # Per trial: config.json, trial.log, the agent's other logs (a session JSONL too), the verifier's files; and
    # the job's own three files. None of them is read as a run.
    assert report.ignored_files == 3 + 8 * 2 + 4 + 4 + 7 * 2
    run_id = f"{TERMINUS}/{TASKS[0]}/{TASKS[0]}__T00aaaa"
    state = store.runs.run(run_id)
    assert (state.agent, state.task_id, state.trial) == (TERMINUS, TASKS[0], f"{TASKS[0]}__T00aaaa")
    assert state.grades == ({"grader": "harbor", "score": 1.0, "label": "pass"},)
    assert state.metadata["format"] == "ATIF-v1.6" and state.metadata["harness"] == "harbor terminus-2 2.0.0"
    steps = transitions(store, run_id)
    assert store.blobs.text(steps[0].text_ref) == "{{task}}"
    assert "Task Description:" in store.blobs.text(state.task_prompt_ref)
    calls = [t for t in steps if t.tool_call]
    assert calls[0].tool_call["name"] == "bash_command" and calls[-1].tool_call["name"] == "mark_task_complete"
    assert calls[0].usage == {"input_tokens": 2400, "output_tokens": 80}  # the step's metrics, cached included
    outputs = [t for t in steps if t.tool_output]
    assert len(outputs) == len(calls) and all(t.tool_output["name"] for t in outputs)
    assert "New Terminal Output" in store.blobs.text(outputs[0].tool_output["output_ref"])

    timed_out = store.runs.run(f"{CLAUDE}/{TASKS[1]}/{TASKS[1]}__C11bbbb")
    assert timed_out.state == "ungraded" and timed_out.grades == ()
    assert timed_out.metadata["exception"].startswith("AgentTimeoutError")
    claude = transitions(store, f"{CLAUDE}/{TASKS[0]}/{TASKS[0]}__C00bbbb")
    first_call = next(t for t in claude if t.tool_call)
    assert first_call.tool_call["name"] == "Bash"
    # The reasoning comes before the message in the assistant's text.
    assert store.blobs.text(first_call.text_ref).startswith("Let me look at the repository layout first.\n\nI'll run")
    assert store.runs.run(f"{CLAUDE}/{TASKS[1]}/{TASKS[1]}__C10bbbb").grades[0]["label"] == "fail"
    assert job.is_dir()


def test_continuations_belong_to_the_same_run(store: Store, tmp_path: Path) -> None:
    two_agent_job(tmp_path / "jobs")
    ingest_paths(store, [tmp_path / "jobs"])
    whole = store.runs.run(f"{TERMINUS}/{TASKS[0]}/{TASKS[0]}__T00aaaa")
    continued = store.runs.run(f"{TERMINUS}/{TASKS[0]}/{TASKS[0]}__T01aaaa")
    assert continued.metadata["continuations"] == 1 and continued.metadata["copied_steps"] == 1
    texts = [store.blobs.text(t.text_ref) for t in continued.branches[0].transitions if t.text_ref]
    # The copied prompt is left out; the summary that starts the continuation is in, once.
    assert texts.count("{{task}}") == 1 and sum("Summary of the work so far" in t for t in texts) == 1
    assert any(t.tool_call and t.tool_call["name"] == "mark_task_complete" for t in continued.branches[0].transitions)
    assert "continuations" not in whole.metadata


def test_reimport_is_idempotent_and_a_trajectory_names_its_trial(store: Store, tmp_path: Path) -> None:
    job = two_agent_job(tmp_path / "jobs")
    ingest_paths(store, [tmp_path / "jobs"])
    before = store_snapshot(store)
    again = ingest_paths(store, [tmp_path / "jobs"])
    assert again.imported == [] and len(again.already_present) == 8
    trial = job / f"{TASKS[0]}__T01aaaa"
    named = ingest_paths(store, [trial / "agent" / "trajectory.cont-1.json", trial / "agent" / "trajectory.json", trial])
    assert named.runs == [f"{TERMINUS}/{TASKS[0]}/{TASKS[0]}__T01aaaa"] and named.imported == []
    assert store_snapshot(store) == before


def test_a_lone_atif_file_imports_ungraded(store: Store, tmp_path: Path) -> None:
    job = write_job(tmp_path / "jobs", "j", [TrialSpec("hello-world", continuations=2, seed=3)])
    lone = tmp_path / "lone"
    lone.mkdir()
    for path in (job / "hello-world__AbC1234" / "agent").glob("trajectory*.json"):
        (lone / path.name).write_bytes(path.read_bytes())
    report = ingest_paths(store, [lone / "trajectory.json"])
    run_id = f"{TERMINUS}/hello-world__AbC1234-session"
    assert report.imported == [run_id] and dict(report.states) == {"ungraded": 1}
    state = store.runs.run(run_id)
    assert state.task_id is None and state.trial == "hello-world__AbC1234-session" and state.grades == ()
    assert state.metadata["continuations"] == 2
    # A continuation named on its own reads the same run.
    assert ingest_paths(store, [lone / "trajectory.cont-2.json"]).already_present == [run_id]


def test_a_running_job_imports_unfinished_trials_ungraded_and_grade_attaches_their_results(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A job imported while it runs: its finished trials graded; a trial not finished (config.json, an ATIF
    trajectory, no result.json) ungraded, under the run id its result.json will name; a lone ATIF file by its
    session. JSON named trajectory.json that is not ATIF is passed over, and so is a running trial whose trajectory
    is not. When the trial finishes, `kvjudge grade` attaches its result.json, and the job imported again finds every
    run present."""
    running = TrialSpec(TASKS[0], suffix="Run0001", seed=21, finished=False)
    job = write_job(tmp_path / "jobs", "j", [TrialSpec(TASKS[0], seed=1), TrialSpec(TASKS[1], suffix="Fin0002", seed=2),
                                             running])
    not_atif = TrialSpec(TASKS[1], suffix="Log0003", seed=3, finished=False)  # its agent's own log, no ATIF yet
    write_trial(job, not_atif)
    (job / not_atif.trial_name / "agent" / "trajectory.json").write_text(json.dumps({"events": [], "steps": []}))
    (tmp_path / "jobs" / "notes").mkdir()
    (tmp_path / "jobs" / "notes" / "trajectory.json").write_text(json.dumps({"schema_version": "2.1", "steps": []}))
    other = write_job(tmp_path / "other", "o", [TrialSpec("hello-world", seed=5, reward=0.0)])
    lone = tmp_path / "jobs" / "shared" / "trajectory.json"  # copied out of a trial of another job
    lone.parent.mkdir()
    lone.write_bytes((other / "hello-world__AbC1234" / "agent" / "trajectory.json").read_bytes())
    store = tmp_path / "store.sqlite"
    common = ["--store", str(store)]
    imported = cli_json_ok(capsys, "ingest", str(tmp_path / "jobs"), *common)
    unfinished = f"{TERMINUS}/{TASKS[0]}/{running.trial_name}"
    lone_run = f"{TERMINUS}/hello-world__AbC1234-session"
    assert sorted(imported["ingested"]) == sorted([f"{TERMINUS}/{TASKS[0]}/{TASKS[0]}__AbC1234", unfinished,
                                                   f"{TERMINUS}/{TASKS[1]}/{TASKS[1]}__Fin0002", lone_run])
    assert imported["states"] == {"graded": 2, "ungraded": 2}
    # The job's 3 files; 5 of each finished trial (config.json, trial.log, recording.cast, 2 verifier files); 2 of
    # the unfinished one read (trial.log, recording.cast); the 4 files of the trial with no ATIF; the notes.
    assert imported["ignored_files"] == 3 + 2 * 5 + 2 + 4 + 1
    with Store.open(store) as opened:
        state = opened.runs.run(unfinished)
        assert (state.agent, state.task_id, state.trial, state.state) == (TERMINUS, TASKS[0], running.trial_name,
                                                                          "ungraded")
        assert state.metadata["trial_finished"] is False and opened.runs.run(lone_run).task_id is None
    named = cli_json_ok(capsys, "ingest", str(job / running.trial_name / "agent" / "trajectory.json"), *common)
    assert named["already_present_ids"] == [unfinished]  # the trajectory named alone reads its trial

    # The trial finishes: its result.json names the run imported.
    result = write_result(job / running.trial_name, running)
    graded = cli_json_ok(capsys, "grade", "--all", "--results", str(job), *common)
    assert graded["counts"] == {"graded": 1, "replaced": 0, "unchanged": 2, "no_result": 1}
    assert graded["graded"] == [{"run": unfinished, "grade": PASS, "state": "graded"}]
    assert graded["no_result"] == [lone_run] and graded["bound"] is None
    # The job again: every run present; the trial that finished since stays as imported (the log only grows).
    before = store_snapshot(store)
    again = cli_json_ok(capsys, "ingest", str(tmp_path / "jobs"), *common)
    assert again["imported"] == 0 and again["already_present"] == 4 and again["finished_since"] == [unfinished]
    assert store_snapshot(store) == before

    # The lone trajectory: nothing in ATIF names its trial, so its trial's result.json is bound by naming the run.
    other_result = other / "hello-world__AbC1234" / "result.json"
    bound = cli_json_ok(capsys, "grade", lone_run, "--results", str(other_result), *common)
    assert bound["bound"] == {"run": lone_run, "result_for": f"{TERMINUS}/hello-world/hello-world__AbC1234",
                              "results": str(other_result)}
    assert bound["graded"] == [{"run": lone_run, "grade": FAIL, "state": "graded"}] and bound["unmatched_results"] == []
    # The result of a run the store holds is that run's: never bound to another; nor is a result bound to a run that
    # has a task (the results that name it grade it).
    before = store_snapshot(store)
    unbound = cli_json_ok(capsys, "grade", unfinished, "--results", str(other_result), *common)
    assert unbound["bound"] is None and unbound["no_result"] == [unfinished]
    assert main(["grade", lone_run, "--results", str(result), *common]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"is the result of run {unfinished}, which the store holds" in err
    assert store_snapshot(store) == before


def test_grade_attaches_the_scores_of_a_later_inspect_log(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = "openai/gpt-4o"
    spec = eval_spec("csv_quoting", model, samples=2)
    (tmp_path / "runs").mkdir()
    write_eval(tmp_path / "runs" / "run.eval", spec, inspect_samples(model, scores=(None, None), epochs=1))
    store = tmp_path / "store.sqlite"
    common = ["--store", str(store)]
    imported = cli_json_ok(capsys, "ingest", str(tmp_path / "runs"), *common)
    runs = [f"{model}/csv_quoting/{i}/1-{spec['eval_id'][:8]}" for i in (1, 2)]  # trial: epoch and eval
    assert imported["ingested"] == runs and imported["states"] == {"ungraded": 2}
    scored = write_eval(tmp_path / "scored.eval", spec, inspect_samples(model, scores=("C", "I"), epochs=1))
    graded = cli_json_ok(capsys, "grade", "--all", "--results", str(scored), *common)
    assert [(entry["run"], entry["grade"]["label"], entry["state"]) for entry in graded["graded"]] == [
        (runs[0], "correct", "graded"), (runs[1], "incorrect", "graded")]
    assert graded["results"] == [{"results": str(scored), "agent": None, "agent_from": "run ids", "graded": 2}]
    before = store_snapshot(store)
    assert cli_json_ok(capsys, "grade", "--all", "--results", str(scored), *common)["counts"]["unchanged"] == 2
    rescored = write_json_log(tmp_path / "rescored.json", spec, inspect_samples(model, scores=("I", "I"), epochs=1))
    assert main(["grade", "--all", "--results", str(rescored), *common]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"run {runs[0]} is graded" in err and "--replace" in err
    assert store_snapshot(store) == before
    replaced = cli_json_ok(capsys, "grade", runs[0], "--results", str(rescored), "--replace", *common)
    assert [entry["grade"]["label"] for entry in replaced["replaced"]] == ["incorrect"]


def harbor_broken(tmp_path: Path, change) -> Path:  # noqa: ANN001 - change(trial_dir)
    job = write_job(tmp_path / "broken", "j", [TrialSpec("hello-world", seed=4)])
    trial = job / "hello-world__AbC1234"
    change(trial)
    return trial


def edit_json(path: Path, edit) -> None:  # noqa: ANN001
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))


def _swap_steps(trial: Path) -> None:
    def edit(data: dict) -> None:
        data["steps"][2]["step_id"], data["steps"][3]["step_id"] = 4, 3
    edit_json(trial / "agent" / "trajectory.json", edit)


def _orphan_result(trial: Path) -> None:
    def edit(data: dict) -> None:
        data["steps"][1]["observation"]["results"][0]["source_call_id"] = "call_nowhere"
    edit_json(trial / "agent" / "trajectory.json", edit)


def _text_reward(trial: Path) -> None:
    edit_json(trial / "result.json", lambda data: data["verifier_result"]["rewards"].update(reward="1.0"))


HARBOR_BROKEN = [
    (_swap_steps, '$["agent/trajectory.json"].steps[3].step_id: step 3 comes after step 4: steps out of order'),
    (_orphan_result, '$["agent/trajectory.json"].steps[1].observation.results[0].source_call_id: names tool call '
                     "'call_nowhere'"),
    (_text_reward, '$["result.json"].verifier_result.rewards.reward: must be a number, not a string'),
]


@pytest.mark.parametrize("change, expected", HARBOR_BROKEN, ids=["step-order", "orphan-result", "text-reward"])
def test_broken_harbor_trials_are_refused_and_nothing_is_written(store: Store, tmp_path: Path, change,
                                                                 expected: str) -> None:
    two_agent_job(tmp_path / "jobs")
    ingest_paths(store, [tmp_path / "jobs"])
    before = store_snapshot(store)
    trial = harbor_broken(tmp_path, change)
    good = write_job(tmp_path / "good", "g", [TrialSpec("other-task", seed=9)])
    with pytest.raises(IngestError) as caught:
        ingest_paths(store, [good, trial.parent])
    message = str(caught.value)
    assert "\n" not in message and message.startswith(f"{trial}: ") and expected in message
    assert store_snapshot(store) == before
    skipped = ingest_paths(store, [good, trial.parent], skip_bad=True)
    assert [item["path"] for item in skipped.skipped] == [str(trial)] and len(skipped.imported) == 1


def _trial_with(tmp_path: Path, edit, schema_version: str = "ATIF-v1.6") -> Path:  # noqa: ANN001 - edit(trajectory)
    job = write_job(tmp_path / "jobs", "j", [TrialSpec("hello-world", seed=6, steps=3, schema_version=schema_version)])
    edit_json(job / "hello-world__AbC1234" / "agent" / "trajectory.json", edit)
    return job


@pytest.mark.parametrize("version", ["ATIF-v1.0", "ATIF-v1.7"])
def test_atif_versions_of_major_1_and_unknown_fields_are_read(store: Store, tmp_path: Path, version: str) -> None:
    def edit(data: dict) -> None:  # what a newer minor version may add, and messages as content parts
        data["provenance"] = {"exporter": "harbor 9.9", "signed": False}
        data["agent"]["tools"] = [{"name": "bash_command"}]
        user, agent = data["steps"][0], data["steps"][1]
        user["message"] = [{"type": "text", "text": "Fix the quoting. "}, {"type": "image", "source": {"path": "a.png"}},
                           {"type": "text", "text": "Then run the tests."}]
        user["attachments"] = []
        agent["message"] = [{"type": "text", "text": "Running the tests first."}]
        agent["tool_calls"][0]["extra"] = {"latency_ms": 12}
        agent["observation"]["results"][0].update(content=[{"type": "text", "text": "3 passed"}], exit_code=0)
        agent["observation"]["extra"] = {"truncated": False}

    job = _trial_with(tmp_path, edit, version)
    (run_id,) = ingest_paths(store, [job]).imported
    state = store.runs.run(run_id)
    assert state.metadata["format"] == version and state.grades == (PASS,)
    texts = [store.blobs.text(ref) for t in state.branches[0].transitions
             for ref in (t.text_ref, (t.tool_output or {}).get("output_ref")) if ref]
    assert store.blobs.text(state.task_prompt_ref) == "Fix the quoting. [image part not imported]Then run the tests."
    assert texts[:3] == ["{{task}}", "Running the tests first.", "3 passed"]


def test_an_atif_major_version_other_than_1_is_refused(store: Store, tmp_path: Path) -> None:
    job = _trial_with(tmp_path, lambda data: None, "ATIF-v2.0")
    good = write_job(tmp_path / "good", "g", [TrialSpec("other-task", seed=9, steps=2)])
    with pytest.raises(IngestError) as caught:
        ingest_paths(store, [good, job])
    message = str(caught.value)
    assert "\n" not in message and message.startswith(f"{job / 'hello-world__AbC1234'}: ")
    assert """$["agent/trajectory.json"].schema_version: unknown ATIF version 'ATIF-v2.0'""" in message
    assert store.runs.run_ids() == []
    assert len(ingest_paths(store, [good, job], skip_bad=True).imported) == 1


def test_observation_results_naming_no_call_are_read_as_harbor_writes_them(store: Store, tmp_path: Path) -> None:
    """Terminus 2 links an observation to its call only when the step ran one command: a batch of commands shares
    one terminal output, and a reply it could not parse has no call; neither names a source_call_id (ATIF makes it
    optional). A result naming a call its step did not make is refused (test_broken_harbor_trials_…)."""
    def edit(data: dict) -> None:
        batch, unparsed = data["steps"][1], data["steps"][2]
        batch["tool_calls"].append({"tool_call_id": "call_0_2", "function_name": "bash_command",
                                    "arguments": {"keystrokes": "ls\n", "duration": 0.1}})
        del batch["observation"]["results"][0]["source_call_id"]
        del unparsed["tool_calls"]
        unparsed["observation"] = {"results": [{"content": "Previous response had parsing errors: …"}]}

    (run_id,) = ingest_paths(store, [_trial_with(tmp_path, edit)]).imported
    steps = transitions(store, run_id)
    assert [t.role for t in steps[1:6]] == ["assistant", "assistant", "tool", "assistant", "tool"]
    assert [t.tool_call["name"] for t in steps[1:3]] == ["bash_command", "bash_command"]
    assert steps[3].tool_output["name"] is None and steps[5].tool_output["name"] is None
    assert store.blobs.text(steps[5].tool_output["output_ref"]).startswith("Previous response had parsing errors")


def inspect_samples(model: str, *, scores=("C", "I"), epochs: int = 2, steps: int = 4) -> list[dict]:  # noqa: ANN001
    out = []
    for index, value in enumerate(scores):
        episode = make_episode(f"case-{index}", 300 + index, target_bytes=4_000)
        episode.steps = episode.steps[:steps]
        out.extend(sample(episode, index + 1, epoch, model=model, score=value) for epoch in range(1, epochs + 1))
    return out


@pytest.mark.parametrize("kind", ["zstd", "deflate", "json", "running"])
def test_inspect_logs_import_sample_by_epoch(store: Store, tmp_path: Path, kind: str) -> None:
    model = "openai/gpt-4o"
    spec = eval_spec("csv_quoting", model, epochs=2, samples=2)
    samples = inspect_samples(model)
    if kind == "json":
        path = write_json_log(tmp_path / "2025-11-03T09-12-44_csv-quoting_abc.json", spec, samples)
    else:
        path = write_eval(tmp_path / "log.eval", spec, samples, compression="deflate" if kind == "deflate" else "zstd",
                          finished=kind != "running")
    if kind == "zstd":
        with zipfile.ZipFile(path) as opened:
            assert {info.compress_type for info in opened.infolist()} == {archive.ZIP_ZSTANDARD}
    listed = sorted(os.listdir(tmp_path))
    report = ingest_paths(store, [tmp_path])
    assert sorted(os.listdir(tmp_path)) == listed  # nothing extracted
    evaluation = spec["eval_id"][:8]  # the trial: the epoch of this eval
    assert report.imported == [f"{model}/csv_quoting/{i}/{e}-{evaluation}" for i in (1, 2) for e in (1, 2)]
    state = store.runs.run(f"{model}/csv_quoting/2/2-{evaluation}")
    assert (state.agent, state.task_id, state.trial) == (model, "csv_quoting/2", f"2-{evaluation}")
    assert state.grades == ({"grader": "inspect:includes", "score": 0.0, "label": "incorrect"},)
    assert store.runs.run(f"{model}/csv_quoting/1/1-{evaluation}").grades[0]["label"] == "correct"
    steps = list(state.branches[0].transitions)
    assert [t.role for t in steps[:4]] == ["system", "user", "assistant", "tool"]
    assert store.blobs.text(steps[1].text_ref) == "{{task}}"
    # Usage from the model event that produced each message (matched by id), cache reads counted in.
    assert steps[2].usage == {"input_tokens": 2400, "output_tokens": 60}
    assert steps[2].tool_call["name"] == "bash" and json.loads(store.blobs.text(steps[2].tool_call["arguments_ref"]))["cmd"]
    assert sum(1 for t in steps if t.usage) == 5  # four tool calls and the answer


def test_inspect_attachments_the_messages_name_are_resolved_and_no_other(store: Store, tmp_path: Path) -> None:
    model = "openai/gpt-4o"
    record = inspect_samples(model, epochs=1)[0]
    record["attachments"].update({"long-output": "the whole tool output", "long-reason": "a long thought",
                                  "long-text": "a long answer", "unread": "\ud800 never read: an event's own"})
    tool = next(m for m in record["messages"] if m["role"] == "tool")
    tool["content"] = "attachment://long-output"
    assistant = next(m for m in record["messages"] if m["role"] == "assistant")
    assistant["content"] = [{"type": "reasoning", "reasoning": "attachment://long-reason", "redacted": False},
                            {"type": "text", "text": "attachment://long-text"}]
    record["events"].append({"event": "tool", "result": "attachment://unread"})
    write_json_log(tmp_path / "log.json", eval_spec("csv_quoting", model, epochs=1, samples=1), [record])
    (run_id,) = ingest_paths(store, [tmp_path]).imported  # the unread attachment's lone surrogate is never checked
    texts = [store.blobs.text(ref) for t in store.runs.run(run_id).branches[0].transitions
             for ref in (t.text_ref, (t.tool_output or {}).get("output_ref")) if ref]
    assert "the whole tool output" in texts and "a long thought\na long answer" in texts
    assert not any("attachment://" in text for text in texts)


def test_inspect_solver_names_the_agent_and_unscored_samples_take_results(store: Store, tmp_path: Path) -> None:
    model = "anthropic/claude-sonnet-4-5"
    spec = eval_spec("csv_quoting", model, solver="react")
    unscored = write_eval(tmp_path / "run.eval", spec, inspect_samples(model, scores=(None, None), epochs=1))
    (tmp_path / "scored").mkdir()
    scored = write_eval(tmp_path / "scored" / "scored.eval", spec, inspect_samples(model, scores=("P", 0.25), epochs=1))
    report = ingest_paths(store, [unscored], results=[str(scored)])
    agent = f"react@{model}"
    assert report.imported == [f"{agent}/csv_quoting/{i}/1-{spec['eval_id'][:8]}" for i in (1, 2)]
    assert [store.runs.run(r).grades for r in report.imported] == [
        ({"grader": "inspect:includes", "score": 0.5, "label": "partial"},),
        ({"grader": "inspect:includes", "score": 0.25, "label": "0.25"},)]
    assert report.unmatched_results == []


@pytest.mark.parametrize("value, expected", [
    ("C", (1.0, "correct")), ("I", (0.0, "incorrect")), ("P", (0.5, "partial")), ("N", (0.0, "no answer")),
    ("yes", (1.0, "yes")), ("False", (0.0, "False")), ("0.75", (0.75, "0.75")), (True, (1.0, "True")), (1, (1.0, "1")),
    (7, None), (-0.5, None), ("maybe", None), ({"a": 1}, None), ([1, 0], None)])
def test_inspect_score_values_map_to_grades(value, expected) -> None:  # noqa: ANN001
    grade, because = score_grade({"match": {"value": value}}, "$.scores")
    if expected is None:
        assert grade is None and because
    else:
        assert (grade["score"], grade["label"]) == expected and grade["grader"] == "inspect:match"


def test_harbor_results_files_grade_by_run_id(tmp_path: Path) -> None:
    job = two_agent_job(tmp_path / "jobs")
    [one] = load_results([str(job / f"{TASKS[1]}__C10bbbb" / "result.json")])
    assert one.run_grades == {f"{CLAUDE}/{TASKS[1]}/{TASKS[1]}__C10bbbb":
                              {"grader": "harbor", "score": 0.0, "label": "fail"}}
    grades = {run: grade for results in load_results([str(job)]) for run, grade in results.run_grades.items()}
    with Store.open(tmp_path / "s.sqlite") as opened:
        ingest_paths(opened, [job])
        assert {r: (opened.runs.run(r).grades[0] if opened.runs.run(r).grades else None) for r in opened.runs.run_ids()} == grades


def zip_of(path: Path, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as opened:
        for name, data in members.items():
            opened.writestr(name, data)
    return path


def _truncated(path: Path) -> str:
    good = write_eval(path, eval_spec("t", "m/x"), inspect_samples("m/x", epochs=1))
    good.write_bytes(good.read_bytes()[: good.stat().st_size * 2 // 3])
    return "not a complete zip archive"


def _bomb(path: Path) -> str:
    # 64 MiB of zeros zstd-compress to a few kB: far beyond 200× its stored size.
    ZstdZip(path).write({"header.json": json.dumps({"eval": eval_spec("t", "m/x")}).encode(),
                         "samples/1_epoch_1.json": [b"\0" * (1 << 20)] * 64})
    return "samples/1_epoch_1.json: declares 67108864 bytes from"


def _lying_size(path: Path) -> str:
    ZstdZip(path, declared_size={"samples/1_epoch_1.json": 1000}).write({
        "header.json": json.dumps({"eval": eval_spec("t", "m/x")}).encode(),
        "samples/1_epoch_1.json": [b" " * (1 << 20)] * 4})
    return "samples/1_epoch_1.json: inflates beyond the 1000 bytes the archive declares"


def _climbing(path: Path) -> str:
    write_eval(path, eval_spec("t", "m/x"), inspect_samples("m/x", epochs=1), members={"../../etc/cron.d/x": b"{}"})
    return "member '../../etc/cron.d/x' has an absolute or climbing path"


def _absolute(path: Path) -> str:
    zip_of(path, {"header.json": b"{}", "/etc/passwd": b"root"})
    return "member '/etc/passwd' has an absolute or climbing path"


def _bad_member_json(path: Path) -> str:
    write_eval(path, eval_spec("t", "m/x"), [], members={"samples/9_epoch_1.json": b'{"id": 9, "epoch": '})
    return "samples/9_epoch_1.json: not valid JSON"


EVAL_BROKEN = [_truncated, _bomb, _lying_size, _climbing, _absolute, _bad_member_json]


@pytest.mark.parametrize("make", EVAL_BROKEN, ids=[f.__name__.strip("_") for f in EVAL_BROKEN])
def test_hostile_eval_archives_are_refused_and_nothing_is_written(store: Store, tmp_path: Path, make) -> None:
    good = write_eval(tmp_path / "good.eval", eval_spec("t", "m/good"), inspect_samples("m/good", epochs=1))
    ingest_paths(store, [good])
    before = store_snapshot(store)
    bad = tmp_path / "bad.eval"
    expected = make(bad)
    listed = sorted(os.listdir(tmp_path))
    with pytest.raises(IngestError) as caught:
        ingest_paths(store, [good, bad])
    message = str(caught.value)
    assert "\n" not in message and message.startswith(str(bad)) and expected in message, message
    assert store_snapshot(store) == before and sorted(os.listdir(tmp_path)) == listed
    assert ingest_paths(store, [good, bad], skip_bad=True).skipped[0]["path"] == str(bad)


def test_a_truncated_json_log_is_refused(store: Store, tmp_path: Path) -> None:
    path = write_json_log(tmp_path / "log.json", eval_spec("t", "m/x"), inspect_samples("m/x"))
    path.write_bytes(path.read_bytes()[:-300])
    with pytest.raises(IngestError, match=r"log\.json: .*the file ends early"):
        ingest_paths(store, [path])
    assert store.runs.run_ids() == []


def test_json_log_streams_values_across_the_window(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(json_stream, "_CHUNK", 5)  # every value crosses several windows
    log = {"version": 2, "status": "success", "eval": {"task": "t", "n": 12345678901234567890123},
           "samples": [{"id": i, "text": "é\"\\" * (i * 40), "x": 1.5e-7} for i in range(4)], "reductions": []}
    raw = json.dumps(log, indent=2, ensure_ascii=False).encode()
    members = list(json_stream.JsonObjectStream(io.BytesIO(raw), "log.json").members("samples"))
    assert [m[2] for m in members if m[0] == "samples"] == log["samples"]
    assert members[2] == ("eval", None, log["eval"])


def test_untrusted_text_in_a_trajectory_is_refused_or_repaired(store: Store, tmp_path: Path) -> None:
    def change(trial: Path) -> None:
        path = trial / "agent" / "trajectory.json"
        path.write_text(path.read_text().replace("Let me look at", "Let me \\ud800look at", 1))
    trial = harbor_broken(tmp_path, change)
    with pytest.raises(IngestError, match=r'\$\["agent/trajectory.json"\]\.steps\[1\]\.message is not valid Unicode'):
        ingest_paths(store, [trial])
    report = ingest_paths(store, [trial], repair_text=True)
    assert list(report.repaired) == report.imported and len(report.imported) == 1


def test_no_grade_or_reward_reaches_the_judges_view(store: Store, tmp_path: Path) -> None:
    two_agent_job(tmp_path / "jobs")
    model = "openai/gpt-4o"
    write_eval(tmp_path / "jobs" / "log.eval", eval_spec("csv_quoting", model), inspect_samples(model, epochs=1))
    ingest_paths(store, [tmp_path / "jobs"])
    assert len(store.runs.run_ids()) == 10
    for state in store.runs.iter_runs():
        view = render_view(state, body_resolver(state, store.blobs.text))
        assert state.grades or state.state == "ungraded"
        for hidden in ("reward", "Grades", "verifier_result", "inspect:includes", "harbor", "exception_info",
                       '"value"', "AgentTimeoutError", "incorrect"):
            assert hidden not in view, (state.id, hidden)


@pytest.mark.model
def test_judge_task_pairs_a_harbor_job_across_agents(tmp_path: Path, default_model: Path) -> None:
    trials = [TrialSpec("fix-csv", agent=agent, model=model, suffix=f"{agent[:1].upper()}{n}xxxxx", seed=n,
                        steps=1, target_bytes=600, reward=float(agent == "terminus-2"))
              for agent, model in (("terminus-2", "m/alpha"), ("claude-code", "m/beta")) for n in range(2)]
    write_job(tmp_path / "jobs", "job", trials)
    store = str(tmp_path / "store.sqlite")
    assert kvjudge("ingest", str(tmp_path / "jobs"), "--store", store).returncode == 0
    judged = kvjudge("judge", "--task", "fix-csv", "--model", str(default_model), "--n-ctx", "1024", "--no-certify",
                     "--store", store, "--json", timeout=900)
    assert judged.returncode == 0, judged.stderr
    *rows, _ = [json.loads(line) for line in judged.stdout.splitlines()]
    agents = {"terminus-2@m/alpha", "claude-code@m/beta"}
    with Store.open(store) as opened:
        pairs = [(opened.runs.run(r["a"]), opened.runs.run(r["b"])) for r in rows]
    assert pairs and all(a.task_id == b.task_id == "fix-csv" for a, b in pairs)
    assert any({a.agent, b.agent} == agents for a, b in pairs)
    assert "harbor" not in judged.stdout and "reward" not in judged.stdout


def test_an_eval_member_is_read_within_its_bound(tmp_path: Path) -> None:
    path = tmp_path / "x.eval"
    ZstdZip(path).write({"samples/big.json": [b" " * (1 << 20)] * 8})
    with archive.Archive(path) as opened:
        assert opened.read("samples/big.json") == b" " * (8 << 20)  # 8 MiB from a few hundred bytes: the floor


def test_bytes_that_are_not_utf8_in_an_eval_sample_are_refused_or_repaired(store: Store, tmp_path: Path) -> None:
    samples = inspect_samples("m/x", scores=("C",), epochs=1)
    raw = json.dumps(samples[0], indent=2).encode().replace(b"Running `", b"Running \xff`", 1)
    path = write_eval(tmp_path / "log.eval", eval_spec("t", "m/x"), [], members={"samples/1_epoch_1.json": raw})
    with pytest.raises(IngestError, match=r"log\.eval:samples/1_epoch_1\.json: text at \$\.sample\.messages\[2\]"
                                          r"\.content\[1\]\.text is not valid Unicode"):
        ingest_paths(store, [path])
    assert store.runs.run_ids() == []
    report = ingest_paths(store, [path], repair_text=True)
    run_id = f"m/x/t/1/1-{eval_spec('t', 'm/x')['eval_id'][:8]}"
    assert list(report.repaired) == [run_id]
    assert "Running \ufffd`" in store.blobs.text(store.runs.run(run_id).branches[0].transitions[2].text_ref)


def _harbor_variety(root: Path) -> Path:
    """The two-agent job, a trial not finished, and a trial whose trajectory opens with a system step and has
    content parts, a batch of calls sharing one output and a reply without a call."""
    job = two_agent_job(root)
    write_trial(job, TrialSpec(TASKS[1], suffix="Run0001", seed=21, finished=False))
    varied = write_trial(job, TrialSpec("hello-world", seed=6, steps=3))

    def edit(data: dict) -> None:
        user, batch, unparsed = data["steps"][0], data["steps"][1], data["steps"][2]
        data["steps"].insert(0, {"step_id": 1, "source": "system", "message": "You are a careful engineer."})
        for number, step in enumerate(data["steps"], start=1):
            step["step_id"] = number
        user["message"] = [{"type": "text", "text": "Fix the quoting. "},
                           {"type": "image", "source": {"path": "a.png"}}]
        batch["tool_calls"].append({"tool_call_id": "call_0_2", "function_name": "bash_command",
                                    "arguments": {"keystrokes": "ls\n", "duration": 0.1}})
        del batch["observation"]["results"][0]["source_call_id"]
        del unparsed["tool_calls"]
        unparsed["observation"] = {"results": [{"content": "Previous response had parsing errors: …"}]}
    edit_json(varied / "agent" / "trajectory.json", edit)
    return job


# Each trial's content hash as kvjudge has always imported it (by trial name): a run imported again must hash the
# same whatever the parser's inner workings, or a store filled before would refuse the same trial as other content.
HARBOR_CONTENT_HASHES = {
    "build-cython-ext__C10bbbb": "sha256:7d65edfaee85b98fc67cecacf93c05f13a5cc47f9ce707463136248b6f7a16ca",
    "build-cython-ext__C11bbbb": "sha256:0a150f4b171e001d29411b47ee9d2f37bb36ef2b7872da3946b334a5487b0030",
    "fix-csv-quoting__C00bbbb": "sha256:4246d45351a2341cbdd562f45488b024e88055e271800797c7fe6841cd12dd1c",
    "fix-csv-quoting__C01bbbb": "sha256:21d383064e0ea420173a5fa502e81536ac4b22bb35230937e592ca61ee2a855f",
    "build-cython-ext__Run0001": "sha256:8361ae0dc93f49199b1e725fc323883fae9d1b46cea278095ff9947a352a54fa",
    "build-cython-ext__T10aaaa": "sha256:47d0fdb345c4072efa721fc87c537b547de001ccbd133262dd758c8974618423",
    "build-cython-ext__T11aaaa": "sha256:47b6e06b1a437abc9544d8339e25250468fed8460584c1b975a2639d2b2530d0",
    "fix-csv-quoting__T00aaaa": "sha256:b0927b940f2a5263345774797022261be04d9cb35207ac757b9c73049c882278",
    "fix-csv-quoting__T01aaaa": "sha256:472cbecc83f6340a8917c5a56f6d64590d53b9497f7d358873c26f1a4e66446b",
    "hello-world__AbC1234": "sha256:9d4b64225247440cb31cda3060a2cce0ef67195816d7c9cb20b54c3211759f26",
}


def test_a_harbor_trial_hashes_as_it_always_has(store: Store, tmp_path: Path) -> None:
    report = ingest_paths(store, [_harbor_variety(tmp_path / "jobs")])
    assert len(report.imported) == 10 and report.skipped == []
    hashes = {store.runs.run(run_id).trial: next(iter(store.events.iter_events(run_id)))[1].content_hash
              for run_id in report.imported}
    assert hashes == HARBOR_CONTENT_HASHES
