"""Every agent log through one door (issue 37): the format registry and its entry points, the real layouts refused
before (SWE-agent and OpenHands run directories with their companions, history-only trajectories, OpenHands 2024
lines, ATIF outside Harbor, inspect evals run twice or empty) and the new formats (Claude Code sessions, Codex CLI
rollouts, OpenHands V1 events). The files are written by the tests (kvjudge.testing.agent_logs), shaped as each
harness's public description says; each test checks agent, task, model, trial, grade and the decisive evidence."""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

from typing import Any

import pytest
from helpers import cli_json_ok, kvjudge
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvjudge.cli import main
from kvjudge.errors import IngestError
from kvjudge.retention import Store
from kvjudge.retention.evidence import find_evidence
from kvjudge.retention.ingest import ingest_paths, registry
from kvjudge.testing import agent_logs as logs
from kvjudge.testing.inspect_logs import eval_spec, sample, write_eval
from kvjudge.testing.trajectories import make_episode
from kvjudge.testing.jsonl import write_jsonl

REPO = Path(__file__).resolve().parent.parent


def prompt_task(prompt: str, folder: str) -> str:
    """The task a session that names none gets: its folder and the first 12 hex digits of its prompt's sha256."""
    return f"{folder}/{hashlib.sha256(prompt.encode()).hexdigest()[:12]}"


def evidence_texts(store: Store, run_id: str) -> dict[str, str]:
    state = store.runs.run(run_id)
    found = find_evidence(state, store.blobs.text)
    return {name: store.blobs.text(ref) for name, ref in found.refs().items()}


# ------------------------------------------------------------------------------------------------- the registry
def test_the_registry_makes_the_choices_the_help_the_docs_and_the_error(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    names = registry.names()
    assert names[0] == "auto" and names[-2:] == ("native", "openai")  # the broad formats are asked last
    assert {"claude-code", "codex", "openhands-v1", "swe-agent", "harbor", "inspect"} <= set(names)
    docs = (REPO / "docs" / "ingest.md").read_text()
    section = re.search(r"<!-- formats:begin -->\n(.*?)\n<!-- formats:end -->", docs, re.DOTALL)
    assert section is not None and section.group(1) == registry.docs_section()
    with pytest.raises(SystemExit):
        main(["ingest", "--help"])
    helped = " ".join(capsys.readouterr().out.split())
    flat = "".join(helped.split())  # argparse wraps the help at spaces and hyphens
    assert all("".join(f"{fmt.name}: {fmt.summary.replace('`', '')}".split()) in flat for fmt in registry.formats())
    odd = tmp_path / "odd.jsonl"
    odd.write_text('{"neither": 1}\n')
    done = kvjudge("ingest", str(odd), "--store", str(tmp_path / "s.sqlite"))
    assert done.returncode != 0 and "Traceback" not in done.stderr and done.stderr.strip().count("\n") == 0
    assert f"odd.jsonl:1: $: {registry.unknown_message()}" in done.stderr
    refused = kvjudge("ingest", str(odd), "--format", "no-such", "--store", str(tmp_path / "s.sqlite"))
    assert refused.returncode != 0 and "invalid choice" in refused.stderr and "Traceback" not in refused.stderr


PLUGIN = '''
from kvjudge.retention.ingest.format import Format

def parse(obj, context, document):
    run = context.new_run(f"lab-agent/{obj['task']}", "lab", agent="lab-agent", grading_open=True)
    run.start(task_id=obj["task"], prompt=obj["prompt"])
    run.step(run.branch("main"), "assistant", text=obj["answer"])
    return run

FORMAT = Format(name="lab", summary="our lab's one-line runs", recognises=lambda obj: "lab_run" in obj, parse=parse)
'''


def _installed(site: Path, entry: str, module: str = PLUGIN) -> dict[str, str]:
    """A distribution installed into ``site`` the way pip leaves one (a module, a ``*.dist-info`` with its entry
    points), and the environment that puts ``site`` on a child's path."""
    site.mkdir(parents=True)
    (site / "lab_runs.py").write_text(module)
    info = site / "lab_runs-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: lab-runs\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[kvjudge.formats]\n{entry}\n")
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(REPO), os.environ.get("PYTHONPATH", "")])}


def test_a_format_another_package_adds_through_its_entry_point_is_read(tmp_path: Path) -> None:
    env = _installed(tmp_path / "site", "lab = lab_runs:FORMAT")
    runs = write_jsonl(tmp_path / "lab.jsonl", [{"lab_run": 1, "task": "t1", "prompt": "Say hi.", "answer": "hi"}])
    store = tmp_path / "s.sqlite"
    done = kvjudge("ingest", str(runs), "--store", str(store), "--json", env=env)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["ingested"] == ["lab-agent/t1"]
    helped = kvjudge("ingest", "--help", env=env)
    assert "lab: our lab's one-line runs" in " ".join(helped.stdout.split())
    # Forced by name, and before the broad formats: this object has an "id", which native would claim.
    forced = write_jsonl(tmp_path / "forced.jsonl", [{"id": "x", "lab_run": 1, "task": "t2", "prompt": "p",
                                                      "answer": "a"}])
    done = kvjudge("ingest", str(forced), "--format", "lab", "--store", str(store), "--json", env=env)
    assert done.returncode == 0 and json.loads(done.stdout)["ingested"] == ["lab-agent/t2"], done.stderr
    with Store.open(store) as opened:
        assert opened.runs.run("lab-agent/t2").task_id == "t2" and opened.runs.run("lab-agent/t2").agent == "lab-agent"


def test_an_entry_point_that_does_not_load_is_one_note_not_a_traceback(tmp_path: Path) -> None:
    env = _installed(tmp_path / "site", "broken = lab_runs:FORMAT", module="raise ImportError('no lab here')\n")
    runs = write_jsonl(tmp_path / "chat.jsonl", [{"id": "c1", "messages": [{"role": "user", "content": "hi"}]}])
    done = kvjudge("ingest", str(runs), "--store", str(tmp_path / "s.sqlite"), "--json", env=env)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    out = json.loads(done.stdout)
    assert out["ingested"] == ["c1"]
    assert out["notes"] == ["format 'broken' (lab_runs:FORMAT) cannot be loaded: ImportError: no lab here"]


# ------------------------------------------------------------------------------------------- run directories
def test_a_swe_agent_run_directory_takes_its_patch_from_the_predictions(store: Store, tmp_path: Path) -> None:
    run_name = "gpt4__SWE-bench_Lite__default__t-0.00__p-0.95__c-2.00__install-1"
    folder = logs.swe_agent_run_directory(tmp_path / "trajectories" / "dev" / run_name, "dev__greeter-1",
                                          run_name=run_name)
    (folder / "notes.txt").write_text("a note")
    report = ingest_paths(store, [tmp_path / "trajectories"])
    run_id = f"{run_name}/dev__greeter-1"
    assert report.imported == [run_id]  # all_preds.jsonl is the run's predictions, not a run file
    state = store.runs.run(run_id)
    assert (state.agent, state.task_id, state.trial) == (run_name, "dev__greeter-1", None)
    assert state.metadata["submission_from"] == "all_preds.jsonl" and state.state == "ungraded"
    assert evidence_texts(store, run_id)["submission"] == logs.PATCH
    assert report.companion_files == [str(folder / "all_preds.jsonl")]
    assert report.settings_files == [str(folder / "args.yaml")] and report.ignored_files == 1
    out = report.to_dict()
    assert (out["companion_files"], out["settings_files"]) == (1, 1)
    assert out["notes"] == [f"1 file(s) read beside the runs (companions): {folder / 'all_preds.jsonl'}",
                            f"1 file(s) passed over (the harness's settings, not runs): {folder / 'args.yaml'}",
                            f"1 file(s) passed over (no format kvjudge reads): {folder / 'notes.txt'}"]


def test_a_truncated_predictions_file_refuses_its_runs_with_one_line(store: Store, tmp_path: Path) -> None:
    folder = logs.swe_agent_run_directory(tmp_path / "run", "dev__greeter-1", run_name="m")
    raw = (folder / "all_preds.jsonl").read_bytes()
    (folder / "all_preds.jsonl").write_bytes(raw[: len(raw) - 20])
    with pytest.raises(IngestError, match=r"all_preds\.jsonl: not valid JSON .*; is it a complete predictions file"
                                          r"\?; nothing was imported"):
        ingest_paths(store, [tmp_path / "run"])
    assert store.runs.run_ids() == []


def test_a_swe_agent_trajectory_of_history_alone_is_read(store: Store, tmp_path: Path) -> None:
    path = tmp_path / "dev__greeter-1.traj"
    path.write_text(json.dumps(logs.swe_agent_history_only("dev__greeter-1")))
    run_id = ingest_paths(store, [path]).imported[0]
    state = store.runs.run(run_id)
    assert (run_id, state.agent, state.task_id) == ("swe-agent/dev__greeter-1", "swe-agent", "dev__greeter-1")
    assert store.blobs.text(state.task_prompt_ref) == logs.PROMPT
    steps = state.branches[0].transitions
    assert [t.role for t in steps] == ["system", "user", "assistant", "tool", "assistant", "tool"]
    assert store.blobs.text(steps[2].tool_call["arguments_ref"]) == "open app.py\n"
    assert evidence_texts(store, run_id)["submission"] == logs.PATCH  # the output of `submit`: a diff


def test_an_openhands_evaluation_directory_reads_its_metadata_and_patches(store: Store, tmp_path: Path) -> None:
    model = "anthropic/claude-sonnet-4-5"
    folder = logs.openhands_eval_directory(tmp_path / "evaluation" / "CodeActAgent", ["dev__greeter-1",
                                                                                      "dev__greeter-2"],
                                           agent_class="CodeActAgent", model=model)
    report = ingest_paths(store, [tmp_path / "evaluation"])
    agent = f"CodeActAgent/{model}"
    assert report.imported == [f"{agent}/dev__greeter-1", f"{agent}/dev__greeter-2"]
    state = store.runs.run(f"{agent}/dev__greeter-1")
    assert (state.agent, state.task_id, state.metadata["model"]) == (agent, "dev__greeter-1", model)
    assert evidence_texts(store, f"{agent}/dev__greeter-1")["submission"] == logs.PATCH
    assert sorted(report.companion_files) == [str(folder / "metadata.json"), str(folder / "patch.jsonl")]
    assert report.settings_files == [str(folder / "config.json")] and report.ignored_files == 0


def test_an_openhands_2024_line_is_not_taken_for_openai_chat(store: Store, tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "output.jsonl", [logs.openhands_2024_line("dev__greeter-1", resolved=True)])
    report = ingest_paths(store, [path])
    run_id = "OpenHands/dev__greeter-1"  # the line names no agent class: the harness names the agent
    assert report.imported == [run_id]
    state = store.runs.run(run_id)
    assert (state.task_id, state.state, state.grades) == (
        "dev__greeter-1", "graded", ({"grader": "swe-bench", "score": 1.0, "label": "resolved"},))
    assert state.metadata["format"] == "openhands" and store.blobs.text(state.task_prompt_ref) == logs.PROMPT
    calls = [t for t in state.branches[0].transitions if t.tool_call]
    assert store.blobs.text(calls[0].tool_call["arguments_ref"]) == "cat app.py"
    assert evidence_texts(store, run_id)["submission"] == logs.PATCH


# ------------------------------------------------------------------------------------------------------- ATIF
def test_atif_files_outside_harbor_are_one_run_with_continuation_and_subagent(store: Store, tmp_path: Path) -> None:
    paths = logs.atif_directory(tmp_path / "atif", "greeter")
    report = ingest_paths(store, [tmp_path / "atif"])
    agent = "terminus-2@openai/gpt-5"
    run_id = f"{agent}/greeter/sess-1"
    assert report.imported == [run_id] and report.ignored_files == 0
    state = store.runs.run(run_id)
    assert (state.agent, state.task_id, state.trial) == (agent, "greeter", "sess-1")
    assert state.metadata["continuations"] == 1 and state.metadata["copied_steps"] == 1
    assert state.metadata["subagents"] == 1 and state.metadata["model"] == "openai/gpt-5"
    main_branch, subagent = state.branches
    assert (subagent.status, subagent.parent) == ("dead", "main")
    assert [store.blobs.text(t.text_ref) for t in subagent.transitions if t.text_ref] == [
        "Summarise the work so far.", "Read app.py; it prints helo."]
    found = evidence_texts(store, run_id)
    assert found["final_message"] == logs.ANSWER and found["task"] == logs.PROMPT
    # Named alone, any file of the group reads the whole run: already present.
    assert ingest_paths(store, [paths[2]]).already_present == [run_id]


# ---------------------------------------------------------------------------------------------------- inspect
def test_two_inspect_logs_of_one_task_and_model_are_two_trials(store: Store, tmp_path: Path) -> None:
    model = "openai/gpt-4o"
    first, second = eval_spec("greet", model), eval_spec("greet", model)
    second["eval_id"] = "Zq9" + first["eval_id"][3:]  # inspect draws a new eval id for every eval
    episode = make_episode("greet-1", 3, target_bytes=3000, model=model)
    (tmp_path / "logs").mkdir()
    write_eval(tmp_path / "logs" / "a.eval", first, [sample(episode, 1, 1, model=model, score="C")])
    write_eval(tmp_path / "logs" / "b.eval", second, [sample(episode, 1, 1, model=model, score="I")])
    report = ingest_paths(store, [tmp_path / "logs"])
    trials = [f"1-{first['eval_id'][:8]}", f"1-{second['eval_id'][:8]}"]
    assert report.imported == [f"{model}/greet/1/{trial}" for trial in trials]
    states = [store.runs.run(run_id) for run_id in report.imported]
    assert [(s.task_id, s.trial, s.grades[0]["label"]) for s in states] == [
        ("greet/1", trials[0], "correct"), ("greet/1", trials[1], "incorrect")]


def test_an_inspect_log_with_no_samples_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = eval_spec("greet", "openai/gpt-4o")
    empty = write_eval(tmp_path / "empty.eval", spec, [])
    out = cli_json_ok(capsys, "ingest", str(empty), "--store", str(tmp_path / "s.sqlite"))
    assert out["ingested"] == [] and out["notes"] == [
        f"{empty}: holds no runs (an inspect log whose eval ran no samples, an empty file): nothing imported from it"]


# -------------------------------------------------------------------------------------------- Claude Code, Codex
def test_a_claude_code_session_is_one_run_threaded_by_parent(store: Store, tmp_path: Path) -> None:
    path = logs.claude_code_session(tmp_path / "projects" / "-home-dev-greeter" / "5f1c2a90-0b1e.jsonl")
    report = ingest_paths(store, [tmp_path / "projects"])
    agent = "claude-code@claude-sonnet-4-5-20250929"
    task = prompt_task(logs.PROMPT, "greeter")
    run_id = f"{agent}/{task}/5f1c2a90-0b1e"
    assert report.imported == [run_id]
    state = store.runs.run(run_id)
    assert (state.agent, state.task_id, state.trial, state.state) == (agent, task, "5f1c2a90-0b1e", "ungraded")
    assert state.metadata["harness"] == "Claude Code 2.0.14" and state.metadata["model"] == "claude-sonnet-4-5-20250929"
    main_branch, abandoned, subagent = state.branches
    roles = [(t.role, t.tool_call["name"] if t.tool_call else t.tool_output["name"] if t.tool_output else None)
             for t in main_branch.transitions]
    assert roles == [("user", None), ("assistant", "Read"), ("tool", "Read"), ("assistant", "Task"),
                     ("tool", "Task"), ("assistant", "Edit"), ("tool", "Edit"), ("assistant", None)]
    assert store.blobs.text(main_branch.transitions[0].text_ref) == "{{task}}"
    assert main_branch.transitions[1].usage == {"input_tokens": 12 + 900 + 88, "output_tokens": 40}
    assert (abandoned.status, [store.blobs.text(t.text_ref) for t in abandoned.transitions]) == (
        "dead", ["I will rewrite the whole project."])
    assert (subagent.status, subagent.fork_at) == ("dead", 4)  # forks after the Task call it answers
    assert [t.tool_output["exit_code"] for t in subagent.transitions if t.tool_output] == [1]
    found = evidence_texts(store, run_id)
    assert found["final_message"] == logs.ANSWER and found["task"] == logs.PROMPT
    assert ingest_paths(store, [path]).already_present == [run_id]  # importing again (after a kill) changes nothing


def test_a_truncated_session_is_refused_whole_in_one_line(tmp_path: Path) -> None:
    path = logs.claude_code_session(tmp_path / "s.jsonl")
    raw = path.read_bytes()
    path.write_bytes(raw[: len(raw) - 30])
    done = kvjudge("ingest", str(path), "--store", str(tmp_path / "store.sqlite"))
    lines = done.stderr.strip().splitlines()
    assert done.returncode != 0 and len(lines) == 1 and "Traceback" not in done.stderr
    assert re.search(r"s\.jsonl:13: not valid JSON .*nothing was imported", lines[0]), lines  # its last line


def test_a_codex_rollout_is_one_run_with_its_calls_and_usage(store: Store, tmp_path: Path) -> None:
    path = logs.codex_rollout(tmp_path / "sessions" / "2025" / "10" / "02" / "rollout-2025-10-02T09-00-00-0199a1b2"
                                                                             "-c3d4.jsonl")
    report = ingest_paths(store, [tmp_path / "sessions"])
    agent, task = "codex@gpt-5-codex", prompt_task(logs.PROMPT, "greeter")
    run_id = f"{agent}/{task}/0199a1b2-c3d4"
    assert report.imported == [run_id]
    state = store.runs.run(run_id)
    assert (state.agent, state.task_id, state.trial) == (agent, task, "0199a1b2-c3d4")
    assert state.metadata["harness"] == "Codex CLI 0.46.0"
    steps = state.branches[0].transitions
    calls = [(t.tool_call["name"], store.blobs.text(t.tool_call["arguments_ref"])) for t in steps if t.tool_call]
    assert calls == [("shell", "cat app.py"), ("apply_patch", logs.PATCH), ("shell", "pytest -q")]
    outputs = [(t.tool_output["name"], t.tool_output["exit_code"]) for t in steps if t.tool_output]
    assert outputs == [("shell", 0), ("apply_patch", 0), ("shell", 0)]
    assert [t.usage for t in steps if t.usage] == [{"input_tokens": 3200, "output_tokens": 45},
                                                  {"input_tokens": 3600, "output_tokens": 30}]
    user_texts = [store.blobs.text(t.text_ref) for t in steps if t.role == "user"]
    assert user_texts[1] == "{{task}}" and user_texts[0].startswith("<environment_context>")
    found = evidence_texts(store, run_id)
    assert found["final_message"] == logs.ANSWER and found["verification"].endswith("1 passed\n")


def test_a_claude_code_and_a_codex_session_on_one_prompt_are_one_task(store: Store, tmp_path: Path) -> None:
    logs.claude_code_session(tmp_path / "c.jsonl")
    logs.codex_rollout(tmp_path / "rollout-x.jsonl")
    report = ingest_paths(store, [tmp_path])
    assert {store.runs.run(run_id).task_id for run_id in report.imported} == {prompt_task(logs.PROMPT, "greeter")}
    assert {store.runs.run(run_id).agent for run_id in report.imported} == {"claude-code@claude-sonnet-4-5-20250929",
                                                                       "codex@gpt-5-codex"}


# ----------------------------------------------------------------------------------------------- OpenHands V1
@pytest.mark.parametrize("layout", ["stream", "saved"])
def test_openhands_v1_events_are_a_run_with_its_finish_as_the_answer(store: Store, tmp_path: Path,
                                                                     layout: str) -> None:
    folder = tmp_path / "conversations" / "conv-7"
    folder.mkdir(parents=True)
    events = logs.openhands_v1_events()
    if layout == "stream":
        path = write_jsonl(folder / "events.jsonl", events)
    else:
        path = folder / "trajectory-conv-7.json"
        path.write_text(json.dumps(events, indent=2))
    (folder / "base_state.json").write_text(json.dumps({"id": "conv-7", "agent": {
        "kind": "Agent", "llm": {"model": "litellm_proxy/claude-sonnet-4-5"}}}))
    report = ingest_paths(store, [path])
    agent, stem = "openhands@litellm_proxy/claude-sonnet-4-5", path.name.rsplit(".", 1)[0]
    task = prompt_task(logs.PROMPT, "session")
    assert report.imported == [f"{agent}/{task}/{stem}"]
    state = store.runs.run(report.imported[0])
    assert (state.agent, state.task_id, state.trial) == (agent, task, stem)
    assert state.metadata["condensations"] == 1
    steps = state.branches[0].transitions
    assert [t.role for t in steps] == ["system", "user", "assistant", "tool", "tool", "assistant"]
    assert [t.tool_output["exit_code"] for t in steps if t.tool_output] == [1, 1]
    assert store.blobs.text(steps[2].tool_call["arguments_ref"]) == "pytest -q"
    found = evidence_texts(store, report.imported[0])
    assert found["submission"] == logs.ANSWER and found["task"] == logs.PROMPT


def test_a_file_no_format_reads_is_refused_in_one_line_and_nothing_prints_a_traceback(tmp_path: Path) -> None:
    cases = {"list.json": "[1, 2, 3]", "events.jsonl": '{"kind": "Unknown", "source": "x"}\n',
             "empty-session.jsonl": json.dumps({"type": "summary", "summary": "s", "leafUuid": "u"}) + "\n"}
    for name, text in cases.items():
        (tmp_path / name).write_text(text)
        done = kvjudge("ingest", str(tmp_path / name), "--store", str(tmp_path / "s.sqlite"))
        assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr
        assert done.stderr.strip().count("\n") == 0 and name in done.stderr, done.stderr


def test_a_swe_agent_1x_run_keeps_its_predictions_above_the_instances(store: Store, tmp_path: Path) -> None:
    run = tmp_path / "default__gpt-4o"
    folder = run / "dev__greeter-1"
    folder.mkdir(parents=True)
    trajectory = logs.swe_agent_history_only("dev__greeter-1")
    trajectory["history"] = trajectory["history"][:4]  # ends on an observation: the trajectory submitted nothing
    (folder / "dev__greeter-1.traj").write_text(json.dumps(trajectory))
    (run / "preds.json").write_text(json.dumps({"dev__greeter-1": {
        "model_name_or_path": "gpt-4o", "instance_id": "dev__greeter-1", "model_patch": logs.PATCH}}))
    named = ingest_paths(store, [folder / "dev__greeter-1.traj"])  # named directly: the predictions one folder up
    assert named.imported == ["gpt-4o/dev__greeter-1"]
    assert store.runs.run("gpt-4o/dev__greeter-1").metadata["submission_from"] == "preds.json"
    assert evidence_texts(store, "gpt-4o/dev__greeter-1")["submission"] == logs.PATCH
    walked = ingest_paths(store, [run])
    assert walked.already_present == ["gpt-4o/dev__greeter-1"] and walked.companion_files == [str(run / "preds.json")]


def test_an_openhands_v1_evaluation_line_reads_its_history_of_events(store: Store, tmp_path: Path) -> None:
    line = {"instance_id": "dev__greeter-1", "instance": {"problem_statement": logs.PROMPT},
            "metadata": {"agent_class": "CodeActAgent", "llm_config": {"model": "openai/gpt-5"}},
            "history": logs.openhands_v1_events(), "test_result": {"git_patch": logs.PATCH}}
    run_id = ingest_paths(store, [write_jsonl(tmp_path / "output.jsonl", [line])]).imported[0]
    assert run_id == "CodeActAgent/openai/gpt-5/dev__greeter-1"
    steps = store.runs.run(run_id).branches[0].transitions
    assert [t.role for t in steps] == ["system", "user", "assistant", "tool", "tool", "assistant", "assistant"]
    assert evidence_texts(store, run_id)["submission"] == logs.PATCH  # the git patch, after the finish call


# ------------------------------------------------------------------------------------------ hostile documents
def _fixtures(root: Path) -> list[Path]:
    """One file of each new format, whole (sessions) or as lines the importer decodes."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "traj").mkdir()
    (root / "traj" / "x.traj").write_text(json.dumps(logs.swe_agent_history_only("x")))
    return [logs.claude_code_session(root / "c.jsonl"), logs.codex_rollout(root / "rollout-1.jsonl"),
            write_jsonl(root / "v1.jsonl", logs.openhands_v1_events()),
            write_jsonl(root / "output.jsonl", [logs.openhands_2024_line("x", resolved=True)]),
            logs.atif_directory(root / "atif", "t")[0], root / "traj" / "x.traj"]


JSON_VALUES = st.recursive(st.none() | st.booleans() | st.integers(-3, 3) | st.text(max_size=5),
                           lambda inner: st.lists(inner, max_size=2) | st.dictionaries(st.text(max_size=3), inner,
                                                                                        max_size=2), max_leaves=4)


def _places(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path to a value inside ``value`` (objects by key, arrays by index)."""
    found = [path]
    children = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, child in children:
        found += _places(child, (*path, key))
    return found


def _replaced(value: Any, path: tuple[Any, ...], new: Any) -> Any:
    if not path:
        return new
    head, *rest = path
    copy = dict(value) if isinstance(value, dict) else list(value)
    copy[head] = _replaced(value[head], tuple(rest), new)
    return copy


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(which=st.integers(0, 5), where=st.integers(0, 10_000), new=JSON_VALUES)
def test_a_hostile_value_anywhere_in_a_new_format_is_a_run_or_one_error(tmp_path_factory: pytest.TempPathFactory,
                                                                         which: int, where: int, new: Any) -> None:
    root = tmp_path_factory.mktemp("hostile")
    path = _fixtures(root / "in")[which]
    if path.name.endswith(".jsonl"):
        lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        places = _places(lines)[1:]
        lines = _replaced(lines, places[where % len(places)], new)
        path.write_text("".join(json.dumps(line) + "\n" for line in lines) if isinstance(lines, list) else "")
    else:
        document = json.loads(path.read_text())
        places = _places(document)
        path.write_text(json.dumps(_replaced(document, places[where % len(places)], new)))
    with Store.open(root / "store.sqlite") as store:
        try:
            report = ingest_paths(store, [path])
        except IngestError as exc:
            assert "\n" not in str(exc)
            assert store.runs.run_ids() == []
        else:
            assert report.imported and all(store.runs.run(run_id).agent for run_id in report.imported)


def test_a_subagents_own_session_file_is_a_run_of_its_own(store: Store, tmp_path: Path) -> None:
    base = {"sessionId": "5f1c2a90-0b1e", "cwd": "/home/dev/greeter", "version": "2.0.30", "isSidechain": True,
            "agentId": "a1b2c3"}
    write_jsonl(tmp_path / "agent-a1b2c3.jsonl", [
        {**base, "type": "user", "uuid": "s1", "parentUuid": None, "message": {"role": "user", "content": "Run tests"}},
        {**base, "type": "assistant", "uuid": "s2", "parentUuid": "s1", "message": {
            "role": "assistant", "model": "claude-haiku-4-5", "content": [{"type": "text", "text": "1 failed"}]}}])
    run_id = ingest_paths(store, [tmp_path]).imported[0]
    state = store.runs.run(run_id)
    assert (state.agent, state.task_id, state.trial) == (
        "claude-code@claude-haiku-4-5", prompt_task("Run tests", "greeter"), "5f1c2a90-0b1e-a1b2c3")
    assert state.metadata["subagent_of"] == "5f1c2a90-0b1e" and len(state.branches) == 1
    assert evidence_texts(store, run_id)["final_message"] == "1 failed"


def test_an_older_codex_rollout_of_bare_items_is_read(store: Store, tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "rollout-2025-05-01-abc.jsonl", [
        {"id": "abc-1", "timestamp": "2025-05-01T10:00:00Z", "instructions": None, "git": {}},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": logs.PROMPT}]},
        {"record_type": "state"},
        {"type": "function_call", "name": "shell", "call_id": "c1", "arguments": '{"command": ["cat", "app.py"]}'},
        {"type": "function_call_output", "call_id": "c1", "output": '{"output": "x", "metadata": {"exit_code": 2}}'},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": logs.ANSWER}]}])
    run_id = ingest_paths(store, [path]).imported[0]
    state = store.runs.run(run_id)
    assert (state.agent, state.task_id, state.trial) == ("codex", prompt_task(logs.PROMPT, "session"), "abc-1")
    steps = state.branches[0].transitions
    assert [(t.tool_call or {}).get("name") for t in steps] == [None, "shell", None, None]
    assert steps[2].tool_output["exit_code"] == 2 and store.blobs.text(steps[1].tool_call["arguments_ref"]) == "cat app.py"
    assert evidence_texts(store, run_id)["final_message"] == logs.ANSWER


def test_a_session_format_named_with_format_reads_the_file_as_one_session(store: Store, tmp_path: Path) -> None:
    path = logs.codex_rollout(tmp_path / "r.jsonl")
    lines = path.read_text().splitlines()
    path.write_text("\n".join([json.dumps({"timestamp": "t", "type": "other", "payload": {}}), *lines]) + "\n")
    with pytest.raises(IngestError, match=r"r\.jsonl:1: \$: is none of the formats"):
        ingest_paths(store, [path])  # its first line is no rollout line: detection reads the lines one by one
    run_id = ingest_paths(store, [path], fmt="codex").imported[0]  # named: the file is one rollout
    assert store.runs.run(run_id).trial == "0199a1b2-c3d4"


def test_an_openhands_v1_conversation_persisted_event_by_event_is_one_run(store: Store, tmp_path: Path) -> None:
    conversation = tmp_path / "conversations" / "conv-9"
    (conversation / "events").mkdir(parents=True)
    for number, event in enumerate(logs.openhands_v1_events()):
        (conversation / "events" / f"event-{number:05d}-{event['id']}.json").write_text(json.dumps(event, indent=2))
    (conversation / "base_state.json").write_text(json.dumps({"agent": {"llm": {"model": "openai/gpt-5"}}}))
    report = ingest_paths(store, [tmp_path / "conversations"])
    run_id = f"openhands@openai/gpt-5/{prompt_task(logs.PROMPT, 'session')}/conv-9"
    assert report.imported == [run_id] and report.companion_files == [str(conversation / "base_state.json")]
    state = store.runs.run(run_id)
    assert state.trial == "conv-9" and [t.role for t in state.branches[0].transitions][:3] == [
        "system", "user", "assistant"]
    assert evidence_texts(store, run_id)["submission"] == logs.ANSWER
    (conversation / "events" / "event-00003-ev-3.json").write_text('{"kind": "ObservationEvent", ')  # cut short
    with pytest.raises(IngestError, match=r"events/event-00003-ev-3\.json: not valid JSON"):
        ingest_paths(store, [tmp_path / "conversations"])
