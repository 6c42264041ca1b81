"""OpenHands SWE-bench evaluation files, written as OpenHands writes them: ``output.jsonl`` lines (``EvalOutput``,
its events serialized as ``event_to_dict`` does, new event history or the older ``[action, observation]``
pairs), ``output.swebench_eval.jsonl`` lines (the same with ``test_result.report``), and the
``llm_completions/<instance_id>/<model>-<unix time>.json`` log of every model call, native function calling or
mocked (``fncall_messages`` beside ``messages`` with ``<function=…><parameter=…>`` text).

The story of a run is an :class:`~kvjudge.testing.trajectories.Episode` (problem statement, steps, patch):
:func:`output_line`, :func:`eval_output_line` and :func:`write_completions` render it. Field names and nesting
follow OpenHands' ``evaluation/benchmarks/swe_bench/run_infer.py`` and ``eval_infer.py``,
``openhands/events/serialization/event.py`` and ``openhands/llm/llm.py``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kvjudge.testing.trajectories import Episode, Step

VERSION = "0.54.0"
AGENT_CLASS = "CodeActAgent"
WORKSPACE = "/workspace/csvkit__csvkit__1.0"
PYTHON = "/opt/miniconda3/envs/testbed/bin/python"
SYSTEM_PROMPT = (
    "You are OpenHands agent, a helpful AI assistant that can interact with a computer to solve tasks.\n\n"
    "<ROLE>\nYour primary role is to assist users by executing commands, modifying code, and solving technical "
    "problems effectively. You should be thorough, methodical, and prioritize quality over speed.\n</ROLE>\n\n"
    "<EFFICIENCY>\n* Each action you take is somewhat expensive. Wherever possible, combine multiple actions into a "
    "single action.\n</EFFICIENCY>")
INSTRUCTION = (
    "<uploaded_files>\n/workspace/{workspace}\n</uploaded_files>\n\nI've uploaded a python code repository in the "
    "directory {workspace}. Consider the following issue description:\n\n<issue_description>\n{statement}\n"
    "</issue_description>\n\nCan you help me implement the necessary changes to the repository so that the "
    "requirements specified in the <issue_description> are met?\nI've already taken care of all changes to any of "
    "the test files described in the <issue_description>. This means you DON'T have to modify the testing logic or "
    "any of the tests in any way!\nAlso the development Python environment is already set up for you (i.e., all "
    "dependencies already installed), so you don't need to install other packages.\nYour task is to make the "
    "minimal changes to non-test files in the /workspace/{workspace} directory to ensure the <issue_description> "
    "is satisfied.\n\nFollow these phases to resolve the issue:\n\nPhase 1. READING: read the problem and reword "
    "it in clearer terms\nPhase 2. RUNNING: install and run the tests on the repository\nPhase 3. EXPLORATION: "
    "find the files that are related to the problem and possible solutions\nPhase 4. TEST CREATION: before "
    "implementing any fix, create a script to reproduce and verify the issue.\nPhase 5. FIX ANALYSIS: state "
    "clearly the problem and how to fix it\nPhase 6. FIX IMPLEMENTATION: Edit the source code to implement your "
    "chosen solution.\nPhase 7. VERIFICATION: Test your implementation thoroughly.\n8. FINAL REVIEW: Carefully "
    "re-read the problem description and compare your changes with the base commit {base_commit}.\n\nBe thorough "
    "in your exploration, testing, and reasoning.")
TOOLS = [
    {"type": "function", "function": {
        "name": "execute_bash", "description": "Execute a bash command in the terminal within a persistent shell "
                                               "session.",
        "parameters": {"type": "object", "properties": {
            "command": {"type": "string", "description": "The bash command to execute."},
            "is_input": {"type": "string", "enum": ["true", "false"]},
            "timeout": {"type": "number"}}, "required": ["command"]}}},
    {"type": "function", "function": {
        "name": "str_replace_editor", "description": "Custom editing tool for viewing, creating and editing files.",
        "parameters": {"type": "object", "properties": {
            "command": {"type": "string", "enum": ["view", "create", "str_replace", "insert", "undo_edit"]},
            "path": {"type": "string"}, "file_text": {"type": "string"}, "old_str": {"type": "string"},
            "new_str": {"type": "string"}, "insert_line": {"type": "integer"},
            "view_range": {"type": "array", "items": {"type": "integer"}}}, "required": ["command", "path"]}}},
    {"type": "function", "function": {
        "name": "think", "description": "Use the tool to think about something.",
        "parameters": {"type": "object", "properties": {"thought": {"type": "string"}}, "required": ["thought"]}}},
    {"type": "function", "function": {
        "name": "finish", "description": "Signals the completion of the current task or conversation.",
        "parameters": {"type": "object", "properties": {"message": {"type": "string"}}, "required": ["message"]}}},
]
# OpenHands' mocked function calling: the system prompt suffix and the in-context example before the first
# user message (abridged; the converter's own text is several pages).
MOCK_SUFFIX = (
    "\nYou have access to the following functions:\n\n---- BEGIN FUNCTION #1: execute_bash ----\nDescription: "
    "Execute a bash command in the terminal.\n---- END FUNCTION #1 ----\n\nIf you choose to call a function ONLY "
    "reply in the following format with NO suffix:\n\n<function=example_function_name>\n"
    "<parameter=example_parameter_1>value_1</parameter>\n</function>\n")
MOCK_EXAMPLE = ("Here's a running example of how to perform a task with the provided tools.\n\n--------------------- "
                "START OF EXAMPLE ---------------------\n\nUSER: Create a list of numbers from 1 to 10.\n\n"
                "--------------------- END OF EXAMPLE ---------------------\n\nDo NOT assume the environment is the "
                "same as in the example above.\n\n--------------------- NEW TASK DESCRIPTION ---------------------\n")
MOCK_EXAMPLE_END = "\n--------------------- END OF NEW TASK DESCRIPTION ---------------------\n"
FINISH_MESSAGE = "I have fixed the quoting of separators and verified it with the tests."


def instruction(episode: Episode) -> str:
    """The rendered instance template (``swe_default.j2``) around the episode's problem statement."""
    return INSTRUCTION.format(workspace=WORKSPACE.rsplit("/", 1)[-1], statement=episode.problem_statement,
                              base_commit="3b3e7cd5a0c6fb0e4a1e4c2f0f2a0d6e1f7a9b11")


def instance_row(episode: Episode) -> dict[str, Any]:
    """The SWE-bench row OpenHands keeps in ``instance`` (gold patch and tests included: never for the judge)."""
    return {"repo": "csvkit/csvkit", "instance_id": episode.instance_id,
            "base_commit": "3b3e7cd5a0c6fb0e4a1e4c2f0f2a0d6e1f7a9b11",
            "patch": "diff --git a/csvkit/gold.py b/csvkit/gold.py\n+GOLD_PATCH_MARKER = True\n",
            "test_patch": "diff --git a/tests/test_gold.py b/tests/test_gold.py\n+def test_gold_marker(): ...\n",
            "problem_statement": episode.problem_statement, "hints_text": "", "created_at": "2023-05-04T12:00:00Z",
            "version": "1.0", "FAIL_TO_PASS": json.dumps(["tests/test_gold.py::test_gold_marker"]),
            "PASS_TO_PASS": json.dumps(["tests/test_utils.py::test_ok"]),
            "environment_setup_commit": "0d1f2e3c4b5a69788796a5b4c3d2e1f0a9b8c7d6", "difficulty": "<15 min fix"}


def eval_metadata(model: str, agent_class: str = AGENT_CLASS) -> dict[str, Any]:
    """``EvalMetadata.model_dump()`` as run_infer.py writes it (the API key masked)."""
    model_path = model.split("/")[-1]
    return {
        "agent_class": agent_class,
        "llm_config": {"model": model, "api_key": "**********", "base_url": None, "api_version": None,
                       "num_retries": 5, "retry_multiplier": 8.0, "retry_min_wait": 8, "retry_max_wait": 64,
                       "timeout": None, "max_message_chars": 30000, "temperature": 0.0, "top_p": 1.0,
                       "max_input_tokens": None, "max_output_tokens": None, "input_cost_per_token": None,
                       "output_cost_per_token": None, "ollama_base_url": None, "drop_params": True,
                       "modify_params": False, "disable_vision": None, "caching_prompt": True,
                       "log_completions": True, "log_completions_folder": None, "custom_tokenizer": None,
                       "native_tool_calling": None, "reasoning_effort": None, "seed": None},
        "agent_config": None,
        "max_iterations": 100,
        "eval_output_dir": f"evaluation/evaluation_outputs/outputs/princeton-nlp__SWE-bench_Verified-test/"
                           f"{agent_class}/{model_path}_maxiter_100_N_v{VERSION}-no-hint-run_1",
        "start_time": "2025-08-01 10:00:00",
        "git_commit": "9c2a8b1f4e6d3c5b7a9e0f1d2c3b4a5968778695",
        "dataset": "princeton-nlp/SWE-bench_Verified",
        "data_split": "test",
        "details": {"mode": "swe", "runtime_failure_count": 0, "remote_runtime_resource_factor": 1},
        "condenser_config": {"type": "noop"},
        "instruction_template_name": None,
    }


def report(*, resolved: bool = False, empty_generation: bool = False, failed_apply_patch: bool = False,
           error_eval: bool = False, test_timeout: bool = False) -> dict[str, bool]:
    """``test_result.report`` as eval_infer.py writes it."""
    return {"empty_generation": empty_generation, "resolved": resolved, "failed_apply_patch": failed_apply_patch,
            "error_eval": error_eval, "test_timeout": test_timeout}


def _usage(index: int) -> dict[str, Any]:
    return {"completion_tokens": 120 + index, "prompt_tokens": 5200 + 1100 * index, "total_tokens":
            5320 + 1101 * index, "completion_tokens_details": None,
            "prompt_tokens_details": {"audio_tokens": None, "cached_tokens": 5000 + 1000 * index},
            "cache_creation_input_tokens": 180, "cache_read_input_tokens": 5000 + 1000 * index}


def _response_id(episode: Episode, index: int) -> str:
    return f"chatcmpl-{episode.instance_id[-6:]}-{index:03d}"


def _call_id(index: int) -> str:
    return f"toolu_01{index:04d}Xq7RmVb8Nn2Lp"


def _response_model(model: str) -> str:
    return model.split("/")[-1]


def _calls(episode: Episode) -> list[tuple[str, str, dict[str, Any], Step | None]]:
    """Each model call of the episode: (thought, tool name, arguments, the step it ran), the finish call last.

    Reading a source file is a ``str_replace_editor view``; everything else runs in ``execute_bash``."""
    calls: list[tuple[str, str, dict[str, Any], Step | None]] = []
    for step in episode.steps:
        if step.command.startswith("nl -ba "):
            path = f"{WORKSPACE}/{step.command.split()[-1]}"
            calls.append((step.thought, "str_replace_editor", {"command": "view", "path": path}, step))
        else:
            calls.append((step.thought, "execute_bash", {"command": step.command}, step))
    calls.append(("The fix is in place and the tests pass.", "finish", {"message": FINISH_MESSAGE}, None))
    return calls


def _ps1_metadata(returncode: int) -> dict[str, Any]:
    return {"exit_code": returncode, "pid": -1, "username": "root", "hostname": "runtime-7f9c2d",
            "working_dir": WORKSPACE, "py_interpreter_path": PYTHON, "prefix": "",
            "suffix": f"\n[The command completed with exit code {returncode}.]"}


def agent_observation(step: Step, tool: str) -> str:
    """What the model read of a step's result (``CmdOutputObservation.to_agent_observation()`` for commands)."""
    if tool == "str_replace_editor":
        return f"Here's the result of running `cat -n` on {WORKSPACE}:\n{step.output}"
    metadata = _ps1_metadata(step.returncode)
    return (f"{step.output}{metadata['suffix']}\n[Current working directory: {WORKSPACE}]\n[Python interpreter: "
            f"{PYTHON}]\n[Command finished with exit code {step.returncode}]")


# ---------------------------------------------------------------------------------------------- output.jsonl
def _model_response(episode: Episode, model: str, index: int, thought: str, tool: str,
                    arguments: dict[str, Any]) -> dict[str, Any]:
    return {"id": _response_id(episode, index), "created": 1754042400 + 30 * index, "model": _response_model(model),
            "object": "chat.completion", "system_fingerprint": None,
            "choices": [{"finish_reason": "tool_calls", "index": 0, "message": {
                "content": thought, "role": "assistant", "tool_calls": [{
                    "index": 1, "function": {"arguments": json.dumps(arguments), "name": tool},
                    "id": _call_id(index), "type": "function"}], "function_call": None}}],
            "usage": _usage(index), "service_tier": None}


def _llm_metrics(index: int) -> dict[str, Any]:
    return {"accumulated_cost": round(0.02 * (index + 1), 6), "max_budget_per_task": None,
            "accumulated_token_usage": {"model": "default", "prompt_tokens": sum(5200 + 1100 * i for i in
                                                                                range(index + 1)),
                                        "completion_tokens": sum(120 + i for i in range(index + 1)),
                                        "cache_read_tokens": 0, "cache_write_tokens": 0, "context_window": 200000,
                                        "per_turn_token": 5320 + 1101 * index, "response_id": ""},
            "costs": [], "response_latencies": [], "token_usages": []}


def _history(episode: Episode, model: str, agent_class: str) -> list[dict[str, Any]]:
    """The event history as ``[event_to_dict(e) for e in state.history]``."""
    clock = "2025-08-01T10:00:{:02d}.{:06d}"
    text = instruction(episode)
    events: list[dict[str, Any]] = [
        {"id": 0, "timestamp": clock.format(0, 1), "source": "agent", "message": SYSTEM_PROMPT, "action": "system",
         "args": {"content": SYSTEM_PROMPT, "tools": TOOLS, "openhands_version": VERSION, "agent_class": agent_class}},
        {"id": 1, "timestamp": clock.format(0, 2), "source": "user", "message": text, "action": "message",
         "args": {"content": text, "file_urls": None, "image_urls": None, "wait_for_response": False,
                  "security_risk": -1}},
        {"id": 2, "timestamp": clock.format(0, 3), "source": "user", "message": "Retrieving content for: <uploaded",
         "action": "recall", "args": {"recall_type": "workspace_context", "query": text, "thought": ""}},
        {"id": 3, "timestamp": clock.format(0, 4), "source": "agent", "message": "", "observation":
         "agent_state_changed", "content": "", "extras": {"agent_state": "running", "reason": ""}},
        {"id": 4, "timestamp": clock.format(0, 5), "source": "environment", "message": "Added workspace context",
         "cause": 2, "observation": "recall", "content": "Added workspace context", "extras": {
             "recall_type": "workspace_context", "repo_name": "", "repo_directory": "", "repo_branch": "",
             "repo_instructions": "", "runtime_hosts": {"http://localhost:51234": 51234},
             "additional_agent_instructions": "", "date": "2025-08-01", "custom_secrets_descriptions": {},
             "conversation_instructions": "", "working_dir": "/workspace", "microagent_knowledge": []}},
    ]
    next_id = 5
    for index, (thought, tool, arguments, step) in enumerate(_calls(episode)):
        metadata = {"function_name": tool, "tool_call_id": _call_id(index),
                    "model_response": _model_response(episode, model, index, thought, tool, arguments),
                    "total_calls_in_response": 1}
        stamp = clock.format(min(59, index + 1), 7)
        if tool == "finish":
            events.append({"id": next_id, "timestamp": stamp, "source": "agent", "message": FINISH_MESSAGE,
                           "action": "finish", "tool_call_metadata": metadata, "llm_metrics": _llm_metrics(index),
                           "args": {"final_thought": FINISH_MESSAGE, "outputs": {}, "thought": thought}})
            events.append({"id": next_id + 1, "timestamp": stamp, "source": "environment", "message": "",
                           "observation": "agent_state_changed", "content": "",
                           "extras": {"agent_state": "finished", "reason": ""}})
            break
        assert step is not None
        if tool == "execute_bash":
            action = {"id": next_id, "timestamp": stamp, "source": "agent",
                      "message": f"Running command: {step.command}", "action": "run", "tool_call_metadata": metadata,
                      "llm_metrics": _llm_metrics(index),
                      "args": {"command": step.command, "is_input": False, "thought": thought, "blocking": False,
                               "is_static": False, "cwd": None, "hidden": False, "confirmation_state": "confirmed",
                               "security_risk": -1}}
            observation = {"id": next_id + 1, "timestamp": stamp, "source": "agent",
                           "message": f"Command `{step.command}` executed with exit code {step.returncode}.",
                           "cause": next_id, "observation": "run", "tool_call_metadata": metadata,
                           "content": step.output, "extras": {"command": step.command,
                                                              "metadata": _ps1_metadata(step.returncode),
                                                              "hidden": False},
                           "success": step.returncode == 0}
        else:
            path = arguments["path"]
            action = {"id": next_id, "timestamp": stamp, "source": "agent", "message": f"Reading file: {path}",
                      "action": "read", "tool_call_metadata": metadata, "llm_metrics": _llm_metrics(index),
                      "args": {"path": path, "start": 0, "end": -1, "thought": thought, "security_risk": -1,
                               "impl_source": "oh_aci", "view_range": None}}
            observation = {"id": next_id + 1, "timestamp": stamp, "source": "agent",
                           "message": f"I read the file {path}.", "cause": next_id, "observation": "read",
                           "tool_call_metadata": metadata, "content": agent_observation(step, tool),
                           "extras": {"path": path, "impl_source": "oh_aci"}}
        events += [action, observation]
        next_id += 2
    return events


def _pair_history(episode: Episode) -> list[list[dict[str, Any]]]:
    """Older output.jsonl: history as ``[action, observation]`` pairs (``compatibility_for_eval_history_pairs``),
    commands' exit codes in ``extras.exit_code``."""
    null = {"message": "No observation", "observation": "null", "content": "", "extras": {}}
    text = instruction(episode)
    pairs: list[list[dict[str, Any]]] = [[
        {"id": 0, "timestamp": "2024-06-01T09:00:00.000001", "source": "user", "message": text, "action": "message",
         "args": {"content": text, "images_urls": None, "wait_for_response": False}}, null]]
    for index, step in enumerate(episode.steps, start=1):
        action = {"id": 2 * index - 1, "timestamp": "2024-06-01T09:00:01.000001", "source": "agent",
                  "message": f"Running command: {step.command}", "action": "run",
                  "args": {"command": step.command, "background": False, "thought": step.thought}}
        observation = {"id": 2 * index, "timestamp": "2024-06-01T09:00:02.000001", "source": "agent",
                       "message": f"Command `{step.command}` executed with exit code {step.returncode}.",
                       "cause": 2 * index - 1, "observation": "run", "content": step.output,
                       "extras": {"command_id": -1, "command": step.command, "exit_code": step.returncode}}
        pairs.append([action, observation])
    pairs.append([{"id": 2 * len(episode.steps) + 1, "timestamp": "2024-06-01T09:00:03.000001", "source": "agent",
                   "message": "All done! What's next on the agenda?", "action": "finish",
                   "args": {"outputs": {}, "thought": FINISH_MESSAGE}}, null])
    return pairs


def _metrics(episode: Episode, model: str) -> dict[str, Any]:
    calls = len(_calls(episode))
    return {"accumulated_cost": round(0.02 * calls, 6), "max_budget_per_task": None,
            "accumulated_token_usage": {"model": "default", "prompt_tokens": sum(5200 + 1100 * i for i in range(calls)),
                                        "completion_tokens": sum(120 + i for i in range(calls)),
                                        "cache_read_tokens": 0, "cache_write_tokens": 0, "context_window": 200000,
                                        "per_turn_token": 0, "response_id": ""},
            "costs": [{"model": model, "cost": 0.02, "timestamp": 1754042400.5 + 30 * i} for i in range(calls)],
            "response_latencies": [{"model": model, "latency": 3.2, "response_id": _response_id(episode, i)}
                                   for i in range(calls)],
            "token_usages": [{"model": model, "prompt_tokens": 5200 + 1100 * i, "completion_tokens": 120 + i,
                              "cache_read_tokens": 5000 + 1000 * i, "cache_write_tokens": 180,
                              "context_window": 200000, "per_turn_token": 5320 + 1101 * i,
                              "response_id": _response_id(episode, i)} for i in range(calls)],
            "condenser": []}


def output_line(episode: Episode, model: str, *, agent_class: str = AGENT_CLASS, pairs: bool = False,
                error: str | None = None, with_report: dict[str, bool] | None = None) -> dict[str, Any]:
    """One ``output.jsonl`` line (``EvalOutput.model_dump``): the new event history, or with ``pairs`` the older
    ``[action, observation]`` pairs; ``with_report`` adds the ``report`` that update_output_with_eval.py merges in."""
    line: dict[str, Any] = {
        "instance_id": episode.instance_id,
        "test_result": {"git_patch": episode.patch},
        "instruction": instruction(episode),
        "metadata": eval_metadata(model, agent_class),
        "history": _pair_history(episode) if pairs else _history(episode, model, agent_class),
        "metrics": _metrics(episode, model),
        "error": error,
        "instance": instance_row(episode),
    }
    if with_report is not None:
        line["report"] = with_report
    return line


def eval_output_line(episode: Episode, model: str, evaluation: dict[str, bool], *,
                     agent_class: str | None = AGENT_CLASS) -> dict[str, Any]:
    """One ``output.swebench_eval.jsonl`` line (``eval_infer.py``): the prediction's test result with its report
    (``agent_class`` None: the placeholder metadata eval_infer.py writes when metadata.json is missing)."""
    metadata = eval_metadata(model, agent_class) if agent_class else eval_metadata("dummy_model", "dummy_agent")
    return {"instance_id": episode.instance_id,
            "test_result": {"git_patch": episode.patch, "report": evaluation,
                            "apply_patch_output": "Checking patch src/parser.py...\nApplied patch src/parser.py "
                                                  "cleanly.\nAPPLY_PATCH_PASS",
                            "test_output": "+ pytest -rA tests/test_gold.py\n1 passed"},
            "instruction": None, "metadata": metadata, "history": None, "metrics": None, "error": None,
            "instance": None}


# -------------------------------------------------------------------------------------------- completions logs
def _text(text: str, *, cached: bool = False) -> list[dict[str, Any]]:
    part: dict[str, Any] = {"type": "text", "text": text}
    if cached:
        part["cache_control"] = {"type": "ephemeral"}
    return [part]


def _native_messages(episode: Episode, upto: int) -> list[dict[str, Any]]:
    """The conversation the model was sent for call ``upto`` (list serializer: content parts)."""
    messages: list[dict[str, Any]] = [{"content": _text(SYSTEM_PROMPT, cached=True), "role": "system"},
                                      {"content": _text(instruction(episode), cached=True), "role": "user"}]
    for index, (thought, tool, arguments, step) in enumerate(_calls(episode)[:upto]):
        assert step is not None
        messages.append({"content": _text(thought), "role": "assistant", "tool_calls": [
            {"id": _call_id(index), "type": "function",
             "function": {"name": tool, "arguments": json.dumps(arguments)}}]})
        messages.append({"content": _text(agent_observation(step, tool)), "role": "tool",
                         "tool_call_id": _call_id(index), "name": tool})
    return messages


def _mocked_call_text(tool: str, arguments: dict[str, Any]) -> str:
    """``convert_tool_call_to_string``: one ``<parameter=…>`` per argument."""
    return (f"<function={tool}>\n" + "".join(f"<parameter={key}>{value}</parameter>\n"
                                               for key, value in arguments.items()) + "</function>")


def _mocked_messages(native: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``convert_fncall_messages_to_non_fncall_messages``: calls as text, tool results as user messages."""
    converted: list[dict[str, Any]] = []
    first_user = True
    for message in native:
        content = [dict(part) for part in message["content"]]
        if message["role"] == "system":
            content[-1]["text"] += MOCK_SUFFIX
            converted.append({"role": "system", "content": content})
        elif message["role"] == "user":
            if first_user:
                first_user = False
                content[0]["text"] = MOCK_EXAMPLE + content[0]["text"] + MOCK_EXAMPLE_END
            converted.append({"role": "user", "content": content})
        elif message["role"] == "assistant":
            call = message["tool_calls"][0]["function"]
            content[-1]["text"] = (content[-1]["text"] + "\n\n"
                                   + _mocked_call_text(call["name"], json.loads(call["arguments"]))).lstrip()
            converted.append({"role": "assistant", "content": content})
        else:
            content[0]["text"] = f"EXECUTION RESULT of [{message['name']}]:\n" + content[0]["text"]
            converted.append({"role": "user", "content": content})
    return converted


def write_completions(root: Path, episode: Episode, model: str, *, mocked: bool = False) -> list[Path]:
    """Every model call of the episode as ``<root>/llm_completions/<instance_id>/<model>-<unix time>.json``
    (``root`` is the evaluation's output folder); returns the files, oldest first.

    ``mocked``: function calling mocked by prompting — ``messages`` carry the calls as text, ``fncall_messages``
    / ``fncall_response`` the native form, and the text response stops before ``</function`` (a stop word)."""
    folder = root / "llm_completions" / episode.instance_id
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    clock = 1754042400.0
    for index, (thought, tool, arguments, _step) in enumerate(_calls(episode)):
        native = _native_messages(episode, index)
        response = _model_response(episode, model, index, thought, tool, arguments)
        stamp = clock + 30 * index + 0.123456
        entry: dict[str, Any] = {"messages": native, "response": response, "args": [],
                                 "kwargs": {"tools": TOOLS, "temperature": 0.0, "top_p": 1.0},
                                 "timestamp": stamp + 0.01, "cost": 0.02}
        if mocked:
            text = f"{thought}\n\n" + _mocked_call_text(tool, arguments).removesuffix("</function>")
            plain = json.loads(json.dumps(response))
            plain["choices"][0]["message"] = {"content": text, "role": "assistant", "tool_calls": None,
                                              "function_call": None}
            plain["choices"][0]["finish_reason"] = "stop"
            converted = json.loads(json.dumps(response))
            converted["choices"][0]["message"]["tool_calls"][0]["id"] = f"toolu_{index + 1:02d}"
            entry = {"messages": _mocked_messages(native), "response": plain, "args": [],
                     "kwargs": {"temperature": 0.0, "top_p": 1.0, "stop": ["</function"]},
                     "timestamp": stamp + 0.01, "cost": 0.02, "fncall_messages": native,
                     "fncall_response": converted}
        path = folder / f"{model.replace('/', '__')}-{stamp}.json"
        path.write_text(json.dumps(entry))
        written.append(path)
    return written
