"""Harness-shaped files for the formats of issue 37, written by kvjudge's own tests from the formats' public
descriptions (no other project's files): Claude Code sessions, Codex CLI rollouts, OpenHands V1 event streams,
ATIF trajectories outside Harbor's layout, SWE-agent run directories and OpenHands evaluation directories.

Every writer takes the few facts a test checks (task text, model, the final answer or patch) and returns them
laid out as the harness lays them out, so the test asserts what the importer made of them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kvjudge.testing.jsonl import write_jsonl

PATCH = ("diff --git a/app.py b/app.py\n--- a/app.py\n+++ b/app.py\n@@ -1 +1 @@\n-print('helo')\n"
         "+print('hello')\n")
PROMPT = "Fix the greeting in app.py: it prints 'helo'."
ANSWER = "Fixed: app.py now prints 'hello'; the test passes."


def claude_code_session(path: Path, *, model: str = "claude-sonnet-4-5-20250929", session: str = "5f1c2a90-0b1e",
                        prompt: str = PROMPT, answer: str = ANSWER) -> Path:
    """A Claude Code session: a summary line, the prompt, a tool call and its result, a reply regenerated (the
    first attempt abandoned: its parent is the same as the kept one's), a Task subagent's sidechain, the answer."""
    base = {"sessionId": session, "cwd": "/home/dev/greeter", "version": "2.0.14", "gitBranch": "main",
            "userType": "external"}

    def message(uuid: str, parent: str | None, role: str, content: Any, **extra: Any) -> dict[str, Any]:
        body: dict[str, Any] = {"role": role, "content": content}
        if role == "assistant":
            body.update(model=model, id=extra.pop("reply", f"msg_{uuid}"), type="message",
                        usage={"input_tokens": 12, "cache_read_input_tokens": 900, "cache_creation_input_tokens": 88,
                               "output_tokens": 40})
        return {**base, "type": role, "uuid": uuid, "parentUuid": parent, "isSidechain": False,
                "timestamp": f"2025-10-01T10:00:{len(uuid):02d}Z", "message": body, **extra}

    lines = [
        {"type": "summary", "summary": "Fix greeting typo", "leafUuid": "u9"},
        message("u1", None, "user", prompt),
        message("u2", "u1", "assistant", [{"type": "thinking", "thinking": "Look at the file first."},
                                          {"type": "text", "text": "Let me read app.py."},
                                          {"type": "tool_use", "id": "toolu_1", "name": "Read",
                                           "input": {"file_path": "/home/dev/greeter/app.py"}}]),
        message("u3", "u2", "user", [{"type": "tool_result", "tool_use_id": "toolu_1",
                                      "content": "1\tprint('helo')"}]),
        # First reply to the tool result, abandoned (the user pressed escape and it was regenerated).
        message("u4", "u3", "assistant", [{"type": "text", "text": "I will rewrite the whole project."}]),
        message("u5", "u3", "assistant", [{"type": "tool_use", "id": "toolu_2", "name": "Task",
                                           "input": {"description": "check tests", "prompt": "Run the tests"}}]),
        {**message("s1", "u5", "user", "Run the tests"), "isSidechain": True},
        {**message("s2", "s1", "assistant", [{"type": "tool_use", "id": "toolu_3", "name": "Bash",
                                              "input": {"command": "pytest -q"}}]), "isSidechain": True},
        {**message("s3", "s2", "user", [{"type": "tool_result", "tool_use_id": "toolu_3", "is_error": True,
                                         "content": [{"type": "text", "text": "1 failed"}]}]), "isSidechain": True},
        message("u6", "u5", "user", [{"type": "tool_result", "tool_use_id": "toolu_2", "content": "1 failed"}]),
        message("u7", "u6", "assistant", [{"type": "tool_use", "id": "toolu_4", "name": "Edit",
                                           "input": {"file_path": "app.py", "old_string": "helo",
                                                     "new_string": "hello"}}]),
        message("u8", "u7", "user", [{"type": "tool_result", "tool_use_id": "toolu_4", "content": "ok"}]),
        message("u9", "u8", "assistant", [{"type": "text", "text": answer}]),
    ]
    return write_jsonl(path, lines)


def codex_rollout(path: Path, *, model: str = "gpt-5-codex", session: str = "0199a1b2-c3d4",
                  prompt: str = PROMPT, answer: str = ANSWER) -> Path:
    """A Codex CLI rollout: session_meta, the harness's context messages, the prompt, a turn_context, a shell call
    with its JSON output and exit code, an apply_patch call, token counts, the UI's events, the answer."""
    def line(kind: str, payload: dict[str, Any], second: int = 0) -> dict[str, Any]:
        return {"timestamp": f"2025-10-02T09:00:{second:02d}.000Z", "type": kind, "payload": payload}

    def item(payload: dict[str, Any]) -> dict[str, Any]:
        return line("response_item", payload)

    lines = [
        line("session_meta", {"id": session, "timestamp": "2025-10-02T09:00:00.000Z", "cwd": "/home/dev/greeter",
                              "originator": "codex_cli_rs", "cli_version": "0.46.0", "instructions": None,
                              "model_provider": "openai", "git": {"branch": "main"}}),
        item({"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": "<environment_context>\n  <cwd>/home/dev/greeter</cwd>\n"
                                           "</environment_context>"}]}),
        item({"type": "message", "role": "user", "content": [{"type": "input_text", "text": prompt}]}),
        line("event_msg", {"type": "user_message", "message": prompt, "kind": "plain"}),
        line("turn_context", {"cwd": "/home/dev/greeter", "approval_policy": "on-request", "model": model,
                              "effort": "medium", "summary": "auto",
                              "sandbox_policy": {"mode": "workspace-write"}}),
        item({"type": "reasoning", "summary": [{"type": "summary_text", "text": "**Reading the file**"}],
              "encrypted_content": "gAAAAB..."}),
        item({"type": "function_call", "name": "shell", "call_id": "call_1",
              "arguments": json.dumps({"command": ["bash", "-lc", "cat app.py"], "workdir": "/home/dev/greeter"})}),
        item({"type": "function_call_output", "call_id": "call_1",
              "output": json.dumps({"output": "print('helo')\n", "metadata": {"exit_code": 0,
                                                                             "duration_seconds": 0.1}})}),
        line("event_msg", {"type": "token_count", "info": {"last_token_usage": {
            "input_tokens": 3200, "cached_input_tokens": 3000, "output_tokens": 45, "total_tokens": 3245}}}),
        item({"type": "custom_tool_call", "name": "apply_patch", "call_id": "call_2", "status": "completed",
              "input": PATCH}),
        item({"type": "custom_tool_call_output", "call_id": "call_2",
              "output": json.dumps({"output": "Success. Updated app.py", "metadata": {"exit_code": 0}})}),
        item({"type": "function_call", "name": "shell", "call_id": "call_3",
              "arguments": json.dumps({"command": ["bash", "-lc", "pytest -q"]})}),
        item({"type": "function_call_output", "call_id": "call_3",
              "output": "Exit code: 0\nWall time: 0.4 seconds\nOutput:\n1 passed\n"}),
        item({"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": answer}]}),
        line("event_msg", {"type": "agent_message", "message": answer}),
        line("event_msg", {"type": "token_count", "info": {"last_token_usage": {
            "input_tokens": 3600, "cached_input_tokens": 3200, "output_tokens": 30, "total_tokens": 3630}}}),
        line("event_msg", {"type": "task_complete", "last_agent_message": answer}),
    ]
    return write_jsonl(path, lines)


def openhands_v1_events(*, prompt: str = PROMPT, answer: str = ANSWER) -> list[dict[str, Any]]:
    """An OpenHands V1 conversation's events: system prompt, the task, a terminal action and its observation, a
    condensation, an agent error, a finish action with the answer."""
    def event(kind: str, number: int, source: str, **fields: Any) -> dict[str, Any]:
        return {"kind": kind, "id": f"ev-{number}", "timestamp": f"2025-10-03T08:00:{number:02d}", "source": source,
                **fields}

    def text(value: str) -> list[dict[str, Any]]:
        return [{"type": "text", "text": value}]

    return [
        event("SystemPromptEvent", 0, "agent", system_prompt={"type": "text", "text": "You are OpenHands agent."},
              tools=[{"name": "terminal"}, {"name": "finish"}]),
        event("MessageEvent", 1, "user", llm_message={"role": "user", "content": text(prompt)}),
        event("ActionEvent", 2, "agent", thought=text("Run the tests first."), tool_name="terminal",
              tool_call_id="tc-1", llm_response_id="resp-1",
              tool_call={"id": "tc-1", "name": "terminal", "arguments": '{"command": "pytest -q"}'},
              action={"kind": "TerminalAction", "command": "pytest -q", "is_input": False}),
        event("ObservationEvent", 3, "environment", tool_name="terminal", tool_call_id="tc-1", action_id="ev-2",
              observation={"kind": "TerminalObservation", "content": text("1 failed"), "exit_code": 1}),
        event("Condensation", 4, "environment", forgotten_event_ids=["ev-2", "ev-3"], summary="Tests failed."),
        event("AgentErrorEvent", 5, "agent", tool_name="str_replace_editor", tool_call_id="tc-2",
              error="Tool 'str_replace_editor' not found"),
        event("ActionEvent", 6, "agent", thought=text("Done."), tool_name="finish", tool_call_id="tc-3",
              tool_call={"id": "tc-3", "name": "finish", "arguments": json.dumps({"message": answer})},
              action={"kind": "FinishAction", "message": answer}),
        event("ConversationStateUpdateEvent", 7, "environment", key="agent_status", value="finished"),
    ]


def atif(session: str, steps: list[dict[str, Any]], **fields: Any) -> dict[str, Any]:
    """An ATIF-v1.6 document."""
    return {"schema_version": "ATIF-v1.6", "session_id": session,
            "agent": {"name": "terminus-2", "version": "2.0.0", "model_name": "openai/gpt-5",
                      "tool_definitions": [{"type": "function", "function": {"name": "bash_command"}}]},
            "steps": steps, **fields}


def atif_directory(folder: Path, stem: str, *, answer: str = ANSWER) -> list[Path]:
    """ATIF files outside Harbor's layout: ``<stem>.trajectory.json``, its continuation ``.cont-1`` (a copied first
    step) and a summarization subagent's trajectory, referenced from the main one."""
    folder.mkdir(parents=True, exist_ok=True)
    summary_name = f"{stem}.trajectory.summarization-1-summary.json"
    main = atif("sess-1", [
        {"step_id": 1, "source": "user", "message": PROMPT},
        {"step_id": 2, "source": "agent", "message": "Reading.", "reasoning_content": "Start with the file.",
         "tool_calls": [{"tool_call_id": "c1", "function_name": "bash_command",
                         "arguments": {"keystrokes": "cat app.py\n"}}],
         "observation": {"results": [{"source_call_id": "c1", "content": "print('helo')"},
                                     {"subagent_trajectory_ref": [{"session_id": "sess-1-summary",
                                                                   "trajectory_path": summary_name}]}]},
         "metrics": {"prompt_tokens": 1200, "completion_tokens": 30}}],
        trajectory_id="traj-main", continued_trajectory_ref=f"{stem}.trajectory.cont-1.json")
    continuation = atif("sess-1", [
        {"step_id": 1, "source": "user", "message": PROMPT, "is_copied_context": True},
        {"step_id": 2, "source": "agent", "message": answer,
         "tool_calls": [{"tool_call_id": "c2", "function_name": "mark_task_complete", "arguments": {}}]}],
        trajectory_id="traj-cont-1", final_metrics={"total_prompt_tokens": 2400, "total_completion_tokens": 60})
    summary = atif("sess-1-summary", [
        {"step_id": 1, "source": "user", "message": "Summarise the work so far."},
        {"step_id": 2, "source": "agent", "message": "Read app.py; it prints helo."}], trajectory_id="traj-sum-1")
    paths = []
    for name, document in ((f"{stem}.trajectory.json", main), (f"{stem}.trajectory.cont-1.json", continuation),
                           (summary_name, summary)):
        (folder / name).write_text(json.dumps(document, indent=2))
        paths.append(folder / name)
    return paths


def swe_agent_run_directory(folder: Path, instance: str, *, run_name: str, patch: str = PATCH) -> Path:
    """A SWE-agent 0.x run directory: ``<instance>.traj`` (its info names no submission and no model),
    ``all_preds.jsonl`` with the instance's final patch, and ``args.yaml``."""
    folder.mkdir(parents=True, exist_ok=True)
    trajectory = {
        "environment": "swe_main",
        "trajectory": [{"action": "open app.py", "observation": "1:print('helo')", "response": "open app.py",
                        "thought": "Open the file.", "state": "{}"},
                       {"action": "edit 1:1\nprint('hello')\nend_of_edit", "observation": "File updated.",
                        "response": "", "thought": "Fix the typo.", "state": "{}"},
                       {"action": "submit", "observation": "", "response": "", "thought": "Submit.", "state": "{}"}],
        "history": [{"role": "system", "content": "SETTING: You are an autonomous programmer.", "agent": "primary"},
                    {"role": "user", "content": f"We're currently solving the following issue.\nISSUE:\n{PROMPT}\n\n"
                                                f"INSTRUCTIONS:\nEdit the code.", "agent": "primary"}],
        "info": {"exit_status": "submitted", "model_stats": {"instance_cost": 0.12, "api_calls": 3}}}
    (folder / f"{instance}.traj").write_text(json.dumps(trajectory, indent=2))
    write_jsonl(folder / "all_preds.jsonl", [
        {"model_name_or_path": run_name, "instance_id": instance, "model_patch": patch},
        {"model_name_or_path": run_name, "instance_id": "other__repo-2", "model_patch": ""}])
    (folder / "args.yaml").write_text(f"environment:\n  data_path: princeton-nlp/SWE-bench_Lite\nagent:\n  model:\n"
                                      f"    model_name: {run_name}\n")
    return folder


def swe_agent_history_only(instance: str) -> dict[str, Any]:
    """A SWE-agent demonstration: a ``history`` alone (the system prompt, the issue, actions and observations)."""
    return {"history": [
        {"role": "system", "content": "SETTING: You are an autonomous programmer.", "agent": "primary"},
        {"role": "user", "content": f"ISSUE:\n{PROMPT}\n\nINSTRUCTIONS:\nEdit the code.", "agent": "primary"},
        {"role": "assistant", "content": "Open the file.\n```\nopen app.py\n```", "thought": "Open the file.",
         "action": "open app.py\n", "agent": "primary"},
        {"role": "user", "content": "1:print('helo')", "agent": "primary"},
        {"role": "assistant", "content": "Submit.\n```\nsubmit\n```", "thought": "Submit.", "action": "submit\n",
         "agent": "primary"},
        {"role": "user", "content": PATCH, "agent": "primary"}]}


def openhands_2024_line(instance: str, *, resolved: bool) -> dict[str, Any]:
    """An output.jsonl line of OpenHands' 2024 evaluation harness: the instance row (holding the id), history as
    events with source/action/observation, test_result with the patch and its report — and no metadata."""
    return {
        "instance": {"instance_id": instance, "repo": "dev/greeter", "problem_statement": PROMPT},
        "instruction": f"<issue_description>\n{PROMPT}\n</issue_description>\nFix it.",
        "history": [
            {"id": 0, "source": "user", "action": "message", "args": {"content": "Fix it."}, "message": "Fix it."},
            {"id": 1, "source": "agent", "action": "run", "args": {"command": "cat app.py", "thought": "Look."},
             "message": "Running command: cat app.py"},
            {"id": 2, "source": "agent", "cause": 1, "observation": "run", "content": "print('helo')",
             "extras": {"command": "cat app.py", "exit_code": 0}, "message": "Command ran"},
            {"id": 3, "source": "agent", "action": "finish", "args": {"outputs": {}, "thought": "Done."},
             "message": "All done"}],
        "test_result": {"git_patch": PATCH, "report": {"resolved": resolved, "empty_generation": False}},
        "error": None}


def openhands_eval_directory(folder: Path, instances: list[str], *, agent_class: str, model: str) -> Path:
    """An OpenHands evaluation directory: ``output.jsonl`` whose lines name no metadata and no patch,
    ``metadata.json`` (the agent class and model), ``patch.jsonl`` (each instance's patch) and ``config.json``."""
    folder.mkdir(parents=True, exist_ok=True)
    lines = []
    for instance in instances:
        line = openhands_2024_line(instance, resolved=False)
        line["instance_id"] = instance
        line["test_result"] = {}
        lines.append(line)
    write_jsonl(folder / "output.jsonl", lines)
    (folder / "metadata.json").write_text(json.dumps({"agent_class": agent_class, "llm_config": {"model": model},
                                                      "max_iterations": 30, "dataset": "swe-bench-lite"}))
    write_jsonl(folder / "patch.jsonl", [{"instance_id": instance, "model_patch": PATCH} for instance in instances])
    (folder / "config.json").write_text(json.dumps({"runtime": "docker", "max_budget_per_task": 4.0}))
    return folder
