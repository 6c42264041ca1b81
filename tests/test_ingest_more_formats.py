"""The last public log shapes kvjudge refused, and two formats people use: OpenHands CLI conversation folders,
OpenHands conversation exports (the trajectory visualizer's files), 2024 OpenHands benchmark lines whose
``messages`` are plain strings, Cline task folders, SWE-agent demonstrations (YAML). Every file is written here
in its harness's own shape (each module's docstring names the source read); nothing is downloaded."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers import kvjudge
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_ingest_formats import JSON_VALUES, _places, _replaced

from kvjudge.errors import IngestError
from kvjudge.retention import Store
from kvjudge.retention.evidence import find_evidence
from kvjudge.retention.ingest import ingest_paths
from kvjudge.testing import agent_logs as logs

PROMPT = "Fix the greeting in app.py: it prints helo."


def texts(store: Store, run_id: str) -> list[tuple[str, str | None, str | None]]:
    """Each transition of the live branch: its role, text and call (or output) as text."""
    out = []
    for step in store.runs.run(run_id).branches[0].transitions:
        call = store.blobs.text(step.tool_call["arguments_ref"]) if step.tool_call else \
            store.blobs.text(step.tool_output["output_ref"]) if step.tool_output else None
        out.append((step.role, store.blobs.text(step.text_ref) if step.text_ref else None, call))
    return out


# ------------------------------------------------------------------------------------------ OpenHands CLI
def cli_conversation(folder: Path) -> Path:
    """OpenHands-CLI's tests/trajectories/<name>/: the conversation's events, one file each, no ``events/``."""
    folder.mkdir(parents=True)
    events = logs.openhands_v1_events(prompt=PROMPT)
    for number, event in enumerate(events):
        (folder / f"event-{number:05d}-{event.get('id', number)}.json").write_text(json.dumps(event))
    return folder


def test_an_openhands_cli_conversation_folder_is_one_run(store: Store, tmp_path: Path) -> None:
    cli_conversation(tmp_path / "trajectories" / "simple_echo_hello_world")
    saved = cli_conversation(tmp_path / "trajectories" / "confirmation_mode")
    (saved / "base_state.json").write_text(json.dumps({"agent": {"llm": {"model": "openai/gpt-5"}}}))
    report = ingest_paths(store, [tmp_path / "trajectories"])
    assert len(report.imported) == 2
    state = store.runs.run(report.imported[1])
    assert (state.agent, state.trial, state.metadata["format"]) == ("openhands", "simple_echo_hello_world",
                                                                    "openhands-v1")
    assert store.blobs.text(state.task_prompt_ref) == PROMPT and state.task_id.startswith("session/")
    assert store.runs.run(report.imported[0]).agent == "openhands@openai/gpt-5"  # its state beside the events


# -------------------------------------------------------------------------------- OpenHands conversation exports
def export(model: str = "claude-3-5-sonnet-20241022") -> list[dict[str, Any]]:
    """A conversation as the trajectory visualizer's demo1.json holds it: a JSON list of events."""
    reply = {"id": "chatcmpl-1", "model": model, "choices": [{"message": {"content": "Let me look."}}]}
    return [
        {"id": 0, "timestamp": "2025-01-20T20:29:13", "source": "environment", "message": "",
         "observation": "agent_state_changed", "content": "", "extras": {"agent_state": "loading"}},
        {"id": 1, "timestamp": "2025-01-20T20:29:32", "source": "user", "message": PROMPT, "action": "message",
         "args": {"content": PROMPT, "image_urls": [], "wait_for_response": False}},
        {"id": 2, "timestamp": "2025-01-20T20:29:35", "source": "agent", "message": "Running command: cat app.py",
         "action": "run", "args": {"command": "cat app.py", "thought": "Let me look.", "blocking": False},
         "tool_call_metadata": {"function_name": "execute_bash", "tool_call_id": "toolu_1", "model_response": reply,
                                "total_calls_in_response": 1}},
        {"id": 3, "timestamp": "2025-01-20T20:29:36", "source": "agent", "message": "Command executed.", "cause": 2,
         "observation": "run", "content": "print('helo')",
         "extras": {"command": "cat app.py", "metadata": {"exit_code": 0}},
         "tool_call_metadata": {"function_name": "execute_bash", "tool_call_id": "toolu_1", "model_response": reply}},
        {"id": 4, "timestamp": "2025-01-20T20:29:40", "source": "agent", "message": "Done.", "action": "finish",
         "args": {"outputs": {}, "thought": "Fixed."}}]


def test_an_openhands_conversation_export_is_one_run_named_directly_or_walked(store: Store, tmp_path: Path) -> None:
    (tmp_path / "exports").mkdir()
    path = tmp_path / "exports" / "demo1.json"
    path.write_text(json.dumps(export(), indent=2))
    (tmp_path / "exports" / "package.json").write_text(json.dumps({"name": "trajectory-visualizer"}))
    report = ingest_paths(store, [tmp_path / "exports"])
    agent = "openhands@claude-3-5-sonnet-20241022"
    assert len(report.imported) == 1 and report.imported[0].startswith(f"{agent}/session/")
    assert report.imported[0].endswith("/2025-01-20T20:29:13") and report.ignored_files == 1  # package.json: not
    run_id = report.imported[0]
    assert texts(store, run_id)[1:] == [("assistant", "Let me look.", "cat app.py"),
                                        ("tool", None, "print('helo')"), ("assistant", "Fixed.", None)]
    # the same conversation saved again, under another name and wrapped as {"history": [...]}: the same run
    (tmp_path / "saved-again.json").write_text(json.dumps({"history": export()}))
    assert ingest_paths(store, [path, tmp_path / "saved-again.json"]).already_present == [run_id, run_id]


# -------------------------------------------------------------------------------- OpenHands 2024 benchmarks
def logic_reasoning_line(instance: str, *, correct: bool) -> dict[str, Any]:
    """A 2024 evaluation line of a benchmark other than SWE-bench (logic_reasoning's run_infer.py): ``id`` beside
    the instance row, history as [action, observation] pairs, ``messages`` the observations' plain text."""
    return {"id": instance, "instance": {"id": instance, "question": "Is Stella a wumpus?", "answer": "A"},
            "instruction": f"You are given a logic program.\n{PROMPT}",
            "history": [[{"id": 1, "source": "agent", "action": "run", "args": {"command": "python logic.py",
                                                                               "thought": "Run it."}},
                         {"id": 2, "source": "agent", "cause": 1, "observation": "run", "content": "'A'",
                          "extras": {"command_id": -1, "command": "python logic.py", "exit_code": 0}}]],
            "metrics": {"accumulated_cost": 0.01}, "final_message": "A", "messages": ["'A'"], "error": None,
            "test_result": {"result": correct}}


def test_a_2024_benchmark_line_with_plain_string_messages_is_an_openhands_run(store: Store, tmp_path: Path) -> None:
    folder = tmp_path / "logic_reasoning" / "CodeActAgent" / "ProntoQA" / "gpt-4o_maxiter_10"
    folder.mkdir(parents=True)
    (folder / "output.jsonl").write_text("".join(json.dumps(logic_reasoning_line(f"ProntoQA_{n}", correct=n == 1))
                                                 + "\n" for n in (1, 2)))
    (folder / "metadata.json").write_text(json.dumps({"Dataset": "ProntoQA", "Agent class": "CodeActAgent",
                                                      "Model name": "gpt-4o", "Final Accuracy": "0.50"}))
    report = ingest_paths(store, [tmp_path / "logic_reasoning"])
    assert report.imported == ["CodeActAgent/gpt-4o/ProntoQA_1", "CodeActAgent/gpt-4o/ProntoQA_2"]
    first, second = (store.runs.run(run_id) for run_id in report.imported)
    assert (first.task_id, first.agent, first.grades[0]["score"], second.grades[0]["score"]) == (
        "ProntoQA_1", "CodeActAgent/gpt-4o", 1.0, 0.0)
    assert texts(store, report.imported[0])[1:] == [("assistant", "Run it.", "python logic.py"), ("tool", None, "'A'")]


# ---------------------------------------------------------------------------------------------------- Cline
def cline_task(tasks: Path, task_id: str, *, native: bool) -> Path:
    """A Cline task folder: the conversation (XML tool calls in text, or native tool_use blocks), the UI messages
    and the task metadata."""
    folder = tasks / task_id
    folder.mkdir(parents=True)
    first = {"role": "user", "content": [
        {"type": "text", "text": f"<task>\n{PROMPT}\n</task>"},
        {"type": "text", "text": "<environment_details>\n# Current Working Directory (/home/dev/greeter) Files\n"
                                 "app.py\n</environment_details>"}]}
    if native:
        turns = [{"role": "assistant", "content": [
                      {"type": "text", "text": "Reading it."},
                      {"type": "tool_use", "id": "toolu_1", "name": "read_file", "input": {"path": "app.py"}}],
                  "modelInfo": {"modelId": "claude-sonnet-4-5", "providerId": "anthropic", "mode": "act"},
                  "metrics": {"tokens": {"prompt": 900, "completion": 30, "cached": 0}, "cost": 0.003}},
                 {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                               "content": "print('helo')"}]}]
    else:
        turns = [{"role": "assistant", "content": [
                      {"type": "text", "text": "Reading it.\n\n<read_file>\n<path>app.py</path>\n</read_file>"}]},
                 {"role": "user", "content": [{"type": "text", "text": "[read_file for 'app.py'] Result:"},
                                              {"type": "text", "text": "print('helo')"}]}]
    done = {"role": "assistant", "content": [
        {"type": "text", "text": "<attempt_completion>\n<result>Fixed.</result>\n</attempt_completion>"}]}
    (folder / "api_conversation_history.json").write_text(json.dumps([first, *turns, done]))
    request = json.dumps({"request": "…", "tokensIn": 900, "tokensOut": 30, "cacheReads": 100, "cost": 0.003})
    (folder / "ui_messages.json").write_text(json.dumps([
        {"ts": 1, "type": "say", "say": "task", "text": PROMPT},
        {"ts": 2, "type": "say", "say": "api_req_started", "text": request},
        {"ts": 3, "type": "ask", "ask": "tool", "text": "{\"tool\": \"readFile\"}"}]))
    (folder / "task_metadata.json").write_text(json.dumps({
        "files_in_context": [], "environment_history": [],
        "model_usage": [{"ts": 2, "model_id": "claude-sonnet-4-5", "model_provider_id": "anthropic", "mode": "act"}]}))
    (folder / "context_history.json").write_text("[]")
    return folder


def test_cline_task_folders_are_runs_of_one_task_with_their_calls(store: Store, tmp_path: Path) -> None:
    cline_task(tmp_path / "tasks", "1733490000000", native=False)
    cline_task(tmp_path / "tasks", "1733490100000", native=True)
    report = ingest_paths(store, [tmp_path / "tasks"])
    assert len(report.imported) == 2 and report.ignored_files == 0 and len(report.companion_files) == 4
    states = [store.runs.run(run_id) for run_id in report.imported]
    assert {s.agent for s in states} == {"cline@claude-sonnet-4-5"} and states[0].task_id == states[1].task_id
    assert states[0].task_id.startswith("greeter/") and [s.trial for s in states] == ["1733490000000",
                                                                                     "1733490100000"]
    assert store.blobs.text(states[0].task_prompt_ref) == PROMPT
    assert states[0].metadata["tokens_in"] == 1000 and states[0].metadata["cost"] == 0.003
    for run_id in report.imported:
        steps = texts(store, run_id)
        assert steps[1][2] == '{"path":"app.py"}' and steps[2] == ("tool", None, "print('helo')")
        assert steps[-1] == ("assistant", "<attempt_completion>\n<result>Fixed.</result>\n</attempt_completion>",
                             '{"result":"Fixed."}')
    native = store.runs.run(report.imported[1]).branches[0].transitions[1]
    assert native.usage == {"input_tokens": 900, "output_tokens": 30}
    assert ingest_paths(store, [tmp_path / "tasks"]).imported == []


# ------------------------------------------------------------------------------------- SWE-agent demonstrations
DEMO = f"""# This is a demo file generated from trajectory file:
# trajectories/dev/replay__1c2844/1c2844.traj
history:
  - role: user
    content: |-
      <pr_description>
      {PROMPT}
      </pr_description>
      Can you help me implement the necessary changes?
    agent: main
    message_type: observation
  - role: assistant
    content: Let's look at the file.
    agent: main
    tool_calls:
      - function:
          arguments: '{{"command":"view","path":"/repo/app.py"}}'
          name: str_replace_editor
        id: call_1
        type: function
    message_type: action
  - role: tool
    content: |-
      print('helo')
    agent: main
    message_type: observation
    tool_call_ids:
      - call_1
  - role: assistant
    content: Submitting.
    agent: main
    tool_calls:
      - function:
          arguments: '{{}}'
          name: submit
        id: call_2
        type: function
    message_type: action
replay_config:
  agent:
    model:
      name: claude-sonnet-4-20250514
  problem_statement:
    type: text_file
    path: /repo/problem_statements/1.md
    id: 1c2844
"""


def test_a_swe_agent_demonstration_is_read_from_its_yaml(store: Store, tmp_path: Path) -> None:
    (tmp_path / "demonstrations").mkdir()
    (tmp_path / "demonstrations" / "str_replace_anthropic_demo.yaml").write_text(DEMO)
    actions_only = yaml.safe_load(DEMO)  # traj-to-demo without --include_user: the assistant's messages alone
    actions_only["history"] = [m for m in actions_only["history"] if m["role"] == "assistant"]
    actions_only["replay_config"]["problem_statement"]["id"] = "7a11e0"
    (tmp_path / "demonstrations" / "dev.demo.yaml").write_text(yaml.safe_dump(actions_only))
    (tmp_path / "demonstrations" / "config.yaml").write_text("agent:\n  model:\n    name: gpt-4o\n")  # settings
    report = ingest_paths(store, [tmp_path / "demonstrations"])
    agent = "claude-sonnet-4-20250514"
    assert sorted(report.imported) == [f"{agent}/1c2844", f"{agent}/7a11e0"] and report.ignored_files == 0
    assert report.settings_files == [str(tmp_path / "demonstrations" / "config.yaml")]  # passed over, noted
    run_id = f"{agent}/1c2844"
    state = store.runs.run(run_id)
    assert (state.task_id, store.blobs.text(state.task_prompt_ref)) == ("1c2844", PROMPT)
    assert texts(store, run_id)[1:] == [
        ("assistant", "Let's look at the file.", '{"command":"view","path":"/repo/app.py"}'),
        ("tool", None, "print('helo')"), ("assistant", "Submitting.", "{}")]
    assert store.runs.run(run_id).branches[0].transitions[2].tool_output["name"] == "str_replace_editor"
    assert [role for role, _, _ in texts(store, f"{agent}/7a11e0")] == ["assistant", "assistant"]


@pytest.mark.parametrize(("text", "says"), [
    ("history: &h [1]\nother: *h\n", "an alias"),
    ("history:\n  - role: [unclosed\n", "not valid YAML"),
    ("history:\n  - !!binary aGk=\n", "binary data"),
])
def test_a_hostile_or_broken_demonstration_is_refused_in_one_line(tmp_path: Path, text: str, says: str) -> None:
    path = tmp_path / "x.demo.yaml"
    path.write_text(text)
    with Store.open(tmp_path / "s.sqlite") as store:
        with pytest.raises(IngestError) as caught:
            ingest_paths(store, [path])
        assert says in str(caught.value) and "\n" not in str(caught.value) and store.runs.run_ids() == []


def test_files_that_are_no_run_log_are_passed_over_or_refused_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "mixed").mkdir()
    cline_task(tmp_path / "mixed", "1733490000000", native=True)
    (tmp_path / "mixed" / "list.json").write_text(json.dumps([{"name": "not a run"}]))
    (tmp_path / "mixed" / "notes.yaml").write_text("title: not a run\n")
    out = kvjudge("ingest", str(tmp_path / "mixed"), "--store", str(tmp_path / "s.sqlite"), "--json")
    assert out.returncode == 0 and "Traceback" not in out.stderr
    assert json.loads(out.stdout)["ignored_files"] == 2
    bad = tmp_path / "sample-trajectory.json"  # the visualizer's own sample: not an OpenHands log
    bad.write_text(json.dumps({"history": [{"action": "command", "content": "git status", "source": "user"}]}))
    refused = kvjudge("ingest", str(bad), "--store", str(tmp_path / "s.sqlite"))
    assert refused.returncode != 0 and "Traceback" not in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1 and "is none of the formats" in refused.stderr


def test_the_task_of_a_cline_run_is_its_evidence(store: Store, tmp_path: Path) -> None:
    cline_task(tmp_path / "tasks", "1733490000000", native=True)
    run_id = ingest_paths(store, [tmp_path / "tasks"]).imported[0]
    found = find_evidence(store.runs.run(run_id), store.blobs.text)
    assert store.blobs.text(found.refs()["task"]) == PROMPT


# ------------------------------------------------------------------------------------------ hostile documents
def _new_format_files(root: Path) -> list[tuple[Path, Path]]:
    """(the file a hostile value goes into, what is imported) for each new shape."""
    root.mkdir(parents=True)
    (root / "export.json").write_text(json.dumps(export()))
    (root / "output.jsonl").write_text(json.dumps(logic_reasoning_line("ProntoQA_1", correct=True)) + "\n")
    task = cline_task(root / "tasks", "1733490000000", native=True)
    demo = root / "x.demo.yaml"
    demo.write_text(json.dumps(yaml.safe_load(DEMO)))  # JSON is YAML: the fuzz rewrites it as JSON
    conversation = cli_conversation(root / "conversation")
    return [(root / "export.json", root / "export.json"), (root / "output.jsonl", root / "output.jsonl"),
            (task / "api_conversation_history.json", task), (task / "ui_messages.json", task), (demo, demo),
            (sorted(conversation.iterdir())[1], conversation)]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(which=st.integers(0, 5), where=st.integers(0, 10_000), new=JSON_VALUES)
def test_a_hostile_value_anywhere_in_a_new_shape_is_a_run_or_one_error(tmp_path_factory: pytest.TempPathFactory,
                                                                       which: int, where: int, new: Any) -> None:
    root = tmp_path_factory.mktemp("hostile")
    changed, imported = _new_format_files(root / "in")[which]
    if changed.name.endswith(".jsonl"):
        document = [json.loads(line) for line in changed.read_text().splitlines()]
    else:
        document = json.loads(changed.read_text())
    places = _places(document)[1:] or [()]
    document = _replaced(document, places[where % len(places)], new)
    if changed.name.endswith(".jsonl"):
        changed.write_text("".join(json.dumps(line) + "\n" for line in document) if isinstance(document, list) else "")
    else:
        changed.write_text(json.dumps(document))
    with Store.open(root / "store.sqlite") as store:
        try:
            report = ingest_paths(store, [imported])
        except IngestError as exc:
            assert "\n" not in str(exc)
            assert store.runs.run_ids() == []
        else:
            for run_id in report.imported:
                state = store.runs.run(run_id)
                assert state.agent and state.task_id


def test_a_claude_code_prompt_whose_content_is_a_number_is_refused_in_one_line(store: Store, tmp_path: Path) -> None:
    # Found by the hostile-value test of tests/test_ingest_formats.py: a traceback before this fix.
    path = logs.claude_code_session(tmp_path / "c.jsonl")
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    next(line for line in lines if line.get("type") == "user")["message"]["content"] = 1
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    with pytest.raises(IngestError, match=r"message.content: must be a string or a list of content blocks"):
        ingest_paths(store, [path])
