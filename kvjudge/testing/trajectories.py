"""Synthetic agent runs written exactly as mini-swe-agent (v1 and v2) and SWE-agent (1.x) write trajectories,
for tests, the ingest benchmark and examples. Nothing here is downloaded: the shapes (field names, nesting,
templates, the long-output warning) follow the harnesses' own code and documentation.

An :class:`Episode` is the harness-independent story of one run (problem statement, steps, exit status,
patch); :func:`mini_swe_agent_v1`, :func:`mini_swe_agent_v2` and :func:`swe_agent` render it as each harness
would save it; :func:`make_episode` builds a realistic one from a seed (file listings, source files, grep hits,
pytest logs, a long output now and then).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import Any

from kvjudge.testing.filler import filler

#: mini-swe-agent's observation template (v1 ``action_observation_template``, v2 ``observation_template``):
#: outputs of 10,000 characters or more become a warning with the first and last 5,000.
LONG_OUTPUT = 10_000

MINI_SYSTEM_V1 = (
    "You are a helpful assistant that can interact multiple times with a computer shell to solve programming "
    "tasks.\nYour response must contain exactly ONE bash code block with ONE command (or commands connected with "
    "&& or ||).\n\nInclude a THOUGHT section before your command where you explain your reasoning process.\n"
    "Format your response as shown in <format_example>.\n\n<format_example>\nTHOUGHT: Your reasoning and "
    "analysis here\n\n```bash\nyour_command_here\n```\n</format_example>\n\nFailure to follow these rules will "
    "cause your response to be rejected.\n")
MINI_SYSTEM_V2 = "You are a helpful assistant that can interact with a computer shell to solve programming tasks.\n"
_MINI_INSTANCE = (
    "<pr_description>\nConsider the following PR description:\n{{task}}\n</pr_description>\n\n<instructions>\n"
    "# Task Instructions\n\n## Overview\n\nYou're a software engineer interacting continuously with a computer by "
    "submitting commands.\nYou'll be helping implement necessary changes to meet requirements in the PR "
    "description.\nYour task is specifically to make changes to non-test files in the current directory in order "
    "to fix the issue described in the PR description in a way that is general and consistent with the codebase."
    "\n\n## Important Boundaries\n\n- MODIFY: Regular source code files in /testbed (this is the working "
    "directory for all your subsequent commands)\n- DO NOT MODIFY: Tests, configuration files (pyproject.toml, "
    "setup.cfg, etc.)\n\n## Recommended Workflow\n\n1. Analyze the codebase by finding and reading relevant files"
    "\n2. Create a script to reproduce the issue\n3. Edit the source code to resolve the issue\n4. Verify your fix "
    "works by running your script again\n5. Test edge cases to ensure your fix is robust\n\n## Submission\n\n"
    "When you've completed your work, issue exactly the following command:\n\n```bash\necho "
    "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && git add -A && git diff --cached\n```\n</instructions>")
SWE_SYSTEM = (
    "You are a helpful assistant that can interact with a computer to solve tasks.\n<IMPORTANT>\n* If user "
    "provides a path, you should NOT assume it's relative to the current working directory. Instead, you should "
    "explore the file system to find the file before working on it.\n</IMPORTANT>\n\nYou have access to the "
    "following functions: bash, str_replace_editor, submit.")
_SWE_INSTANCE = (
    "<uploaded_files>\n/testbed\n</uploaded_files>\nI've uploaded a python code repository in the directory "
    "/testbed. Consider the following PR description:\n\n<pr_description>\n{{problem_statement}}\n"
    "</pr_description>\n\nCan you help me implement the necessary changes to the repository so that the "
    "requirements specified in the <pr_description> are met?\nI've already taken care of all changes to any of "
    "the test files described in the <pr_description>. This means you DON'T have to modify the testing logic or "
    "any of the tests in any way!\nYour task is to make the minimal changes to non-tests files in the /testbed "
    "directory to ensure the <pr_description> is satisfied.")
SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && git add -A && git diff --cached"


@dataclass
class Step:
    """One action of an episode: the model's thought and command, and what the command printed."""

    thought: str
    command: str
    output: str
    returncode: int = 0


@dataclass
class Episode:
    """A run told independently of the harness that will write it."""

    instance_id: str
    problem_statement: str
    steps: list[Step] = field(default_factory=list)
    model: str = "anthropic/claude-sonnet-4-5-20250929"
    exit_status: str = "Submitted"
    patch: str = ""
    cost: float = 0.0
    format_error_after: int | None = None  # a format error follows this step (mini-swe-agent), when set

    @property
    def api_calls(self) -> int:
        return len(self.steps) + 1 + (self.format_error_after is not None)


def _mini_observation(output: str, returncode: int) -> str:
    """mini-swe-agent's swebench observation template, rendered."""
    if len(output) < LONG_OUTPUT:
        return f"<returncode>{returncode}</returncode>\n<output>\n{output}</output>"
    warning = ("<warning>\nThe output of your last command was too long.\nPlease try a different command that "
               "produces less output.\nIf you're looking at a file you can try use head, tail or sed to view a "
               "smaller number of lines selectively.\nIf you're using grep or find and it produced too much output, "
               "you can use a more selective search pattern.\nIf you really need to see something from the full "
               "command's output, you can redirect output to a file and then search in that file.\n</warning>")
    return (f"<returncode>{returncode}</returncode>\n{warning}<output_head>\n{output[:5000]}\n</output_head>\n"
            f"<elided_chars>\n{len(output) - 10000} characters elided\n</elided_chars>\n<output_tail>\n"
            f"{output[-5000:]}\n</output_tail>")


def _usage(step: int) -> dict[str, Any]:
    return {"completion_tokens": 80 + step, "prompt_tokens": 2400 + 900 * step,
            "total_tokens": 2480 + 901 * step, "completion_tokens_details": None, "prompt_tokens_details": None}


def mini_swe_agent_v1(episode: Episode) -> dict[str, Any]:
    """The episode as mini-swe-agent 1.x saves ``<instance>.traj.json`` (``trajectory_format: mini-swe-agent-1``)."""
    clock = 1_750_000_000.0
    instance = _MINI_INSTANCE.replace("{{task}}", episode.problem_statement)
    messages: list[dict[str, Any]] = [{"role": "system", "content": MINI_SYSTEM_V1, "timestamp": clock},
                                      {"role": "user", "content": instance, "timestamp": clock + 0.01}]
    for index, step in enumerate(episode.steps + _submit_steps(episode)):
        content = f"THOUGHT: {step.thought}\n\n```bash\n{step.command}\n```"
        response = {"id": f"chatcmpl-{index}", "model": episode.model, "object": "chat.completion",
                    "choices": [{"finish_reason": "stop", "index": 0,
                                 "message": {"content": content, "role": "assistant"}}], "usage": _usage(index)}
        messages.append({"role": "assistant", "content": content, "timestamp": clock + index,
                         "extra": {"response": response}})
        if step.command == SUBMIT:
            break
        messages.append({"role": "user", "content": _mini_observation(step.output, step.returncode),
                         "timestamp": clock + index + 0.5})
        if episode.format_error_after == index:
            messages.append({"role": "assistant", "content": "THOUGHT: I will look at two files at once.",
                             "timestamp": clock + index + 0.6, "extra": {"response": {"usage": _usage(index)}}})
            messages.append({"role": "user", "timestamp": clock + index + 0.7, "content": (
                "Please always provide EXACTLY ONE action in triple backticks, found 0 actions.\n\nPlease format "
                "your action in triple backticks as shown in <response_example>.")})
    # The exception that ended the run is the last message: Submitted carries the patch, others their text.
    messages.append({"role": "user", "content": episode.patch if episode.exit_status == "Submitted" else "",
                     "timestamp": clock + len(episode.steps) + 1})
    return {
        "info": {
            "exit_status": episode.exit_status,
            "submission": episode.patch if episode.exit_status == "Submitted" else "",
            "model_stats": {"instance_cost": episode.cost, "api_calls": episode.api_calls},
            "mini_version": "1.17.5",
            "config": {
                "agent": {"system_template": MINI_SYSTEM_V1, "instance_template": _MINI_INSTANCE,
                          "action_observation_template": "<returncode>{{output.returncode}}</returncode>…",
                          "action_regex": r"```bash\s*\n(.*?)\n```", "step_limit": 250, "cost_limit": 3.0},
                "model": {"model_name": episode.model, "model_kwargs": {"drop_params": True, "temperature": 0.0},
                          "litellm_model_registry": None},
                "environment": {"image": f"docker.io/swebench/sweb.eval.x86_64.{episode.instance_id}:latest",
                                "cwd": "/testbed", "env": {"PAGER": "cat", "MANPAGER": "cat"}, "timeout": 60},
                "agent_type": "minisweagent.run.extra.swebench.ProgressTrackingAgent",
                "model_type": "minisweagent.models.litellm_model.LitellmModel",
                "environment_type": "minisweagent.environments.docker.DockerEnvironment",
            },
        },
        "messages": messages,
        "trajectory_format": "mini-swe-agent-1",
        "instance_id": episode.instance_id,
    }


def mini_swe_agent_v2(episode: Episode, *, tool_calls: bool = True) -> dict[str, Any]:
    """The episode as mini-swe-agent 2.x saves it (``trajectory_format: mini-swe-agent-1.1``): the model's own
    messages plus ``extra``; tool-call models (the default) or text-based ones (``mswea_bash_command`` blocks)."""
    clock = 1_760_000_000.0
    instance = _MINI_INSTANCE.replace("{{task}}", episode.problem_statement)
    messages: list[dict[str, Any]] = [{"role": "system", "content": MINI_SYSTEM_V2},
                                      {"role": "user", "content": instance}]
    for index, step in enumerate(episode.steps + _submit_steps(episode)):
        call_id = f"toolu_{index:04d}{episode.instance_id[-6:]}"
        cost = round(0.004 + 0.0007 * index, 6)
        if tool_calls:
            message: dict[str, Any] = {
                "content": step.thought, "role": "assistant",
                "tool_calls": [{"function": {"arguments": json.dumps({"command": step.command}), "name": "bash"},
                                "id": call_id, "type": "function"}],
                "function_call": None, "provider_specific_fields": {}}
            action = {"command": step.command, "tool_call_id": call_id}
        else:
            message = {"content": f"THOUGHT: {step.thought}\n\n```mswea_bash_command\n{step.command}\n```",
                       "role": "assistant", "tool_calls": None, "function_call": None}
            action = {"command": step.command}
        # extra.response is the provider's whole response (model_dump): the message again, finish reason, usage.
        response = {"id": f"chatcmpl-{index}", "created": int(clock) + index, "model": episode.model,
                    "object": "chat.completion", "system_fingerprint": None,
                    "choices": [{"finish_reason": "tool_calls" if tool_calls else "stop", "index": 0,
                                 "message": dict(message)}], "usage": _usage(index)}
        message["extra"] = {"actions": [action], "response": response, "cost": cost, "timestamp": clock + index}
        messages.append(message)
        if step.command == SUBMIT:
            break  # Submitted is raised while the command runs: no observation follows
        observation: dict[str, Any] = {
            "content": _mini_observation(step.output, step.returncode),
            "extra": {"raw_output": step.output, "returncode": step.returncode, "timestamp": clock + index + 0.5,
                      "exception_info": ""}}
        if tool_calls:
            observation.update(tool_call_id=call_id, role="tool")
        else:
            observation["role"] = "user"
        messages.append(observation)
        if episode.format_error_after == index:
            messages.append({"role": "user", "extra": {"interrupt_type": "FormatError"}, "content": (
                "Tool call error:\n\n<error>\nNo tool calls found in the response. Every response MUST include at "
                "least one tool call.\n</error>")})
    submitted = episode.exit_status == "Submitted"
    messages.append({"role": "exit", "content": episode.patch if submitted else episode.exit_status,
                     "extra": {"exit_status": episode.exit_status, "submission": episode.patch if submitted else ""}})
    model_type = "litellm_model.LitellmModel" if tool_calls else "litellm_textbased_model.LitellmTextbasedModel"
    return {
        "info": {
            "model_stats": {"instance_cost": episode.cost, "api_calls": episode.api_calls},
            "config": {
                "agent": {"system_template": MINI_SYSTEM_V2, "instance_template": _MINI_INSTANCE, "step_limit": 250,
                          "cost_limit": 3.0, "output_path": None},
                "agent_type": "minisweagent.agents.default.DefaultAgent",
                "model": {"model_name": episode.model, "model_kwargs": {"drop_params": True},
                          "observation_template": "{% if output.exception_info -%}…", "format_error_template": "…",
                          "cost_tracking": "default"},
                "model_type": f"minisweagent.models.{model_type}",
                "environment": {"cwd": "/testbed", "timeout": 60, "env": {"PAGER": "cat"}},
                "environment_type": "minisweagent.environments.docker.DockerEnvironment",
            },
            "mini_version": "2.0.0",
            "exit_status": episode.exit_status,
            "submission": episode.patch if submitted else "",
        },
        "messages": messages,
        "trajectory_format": "mini-swe-agent-1.1",
        "instance_id": episode.instance_id,
    }


def _submit_steps(episode: Episode) -> list[Step]:
    if episode.exit_status != "Submitted":
        return []
    return [Step("I have verified the fix; submitting the patch.", SUBMIT, "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT\n"
                 + episode.patch)]


def swe_agent(episode: Episode) -> dict[str, Any]:
    """The episode as SWE-agent 1.x saves ``<instance>.traj`` (``trajectory``, ``history``, ``info``,
    ``replay_config`` as a JSON string)."""
    instance = _SWE_INSTANCE.replace("{{problem_statement}}", episode.problem_statement)
    history: list[dict[str, Any]] = [
        {"role": "system", "content": SWE_SYSTEM, "agent": "main", "message_type": "system_prompt"},
        {"role": "user", "content": [{"type": "text", "text": instance}], "agent": "main",
         "message_type": "observation"}]
    trajectory = []
    steps = episode.steps + ([Step("Submitting the change.", "submit", episode.patch)] if episode.patch else [])
    for index, step in enumerate(steps):
        call_id = f"call_{index:04d}{episode.instance_id[-6:]}"
        state = {"working_dir": "/testbed", "open_file": "n/a" if index == 0 else "/testbed/src/module.py"}
        trajectory.append({"action": step.command, "observation": step.output, "response": step.thought,
                           "thought": step.thought, "execution_time": round(0.1 + index * 0.013, 3),
                           "state": state, "query": [], "extra_info": {}})
        history.append({"role": "assistant", "content": step.thought, "thought": step.thought,
                        "action": step.command, "agent": "main", "message_type": "action",
                        "tool_calls": [{"function": {"arguments": json.dumps({"command": step.command}),
                                                     "name": "bash"}, "id": call_id, "type": "function"}]})
        history.append({"role": "tool", "content": [{"type": "text", "text": step.output}], "agent": "main",
                        "message_type": "observation", "tool_call_ids": [call_id]})
    replay = {"env": {"deployment": {"image": "python:3.11", "type": "docker"}, "repo": {"type": "preexisting",
                                                                                         "repo_name": "testbed"}},
              "agent": {"name": "main", "model": {"name": episode.model, "per_instance_cost_limit": 3.0,
                                                  "temperature": 0.0, "top_p": 1.0}},
              "problem_statement": {"text": episode.problem_statement, "extra_fields": {},
                                    "type": "text", "id": episode.instance_id},
              "output_dir": "trajectories/run", "actions": {"open_pr": False}, "env_var_path": None}
    return {
        "trajectory": trajectory,
        "history": history,
        "info": {"swe_agent_hash": "0f9e8d7c", "swe_agent_version": "1.1.0", "swe_rex_version": "1.2.1",
                 "swe_rex_hash": "unavailable", "submission": episode.patch or None,
                 "exit_status": "submitted" if episode.exit_status == "Submitted" else episode.exit_status,
                 "model_stats": {"instance_cost": episode.cost, "tokens_sent": 2400 * len(steps),
                                 "tokens_received": 90 * len(steps), "api_calls": len(steps)},
                 "edited_files30": "", "edited_files50": "", "edited_files70": ""},
        "replay_config": json.dumps(replay),
        "environment": "main",
    }


# ------------------------------------------------------------------- realistic episodes from a seed
_MODULES = ("csv_utils", "parser", "cache", "formatter", "router", "schema", "fields", "io_helpers")
_FUNCS = ("quote_field", "parse_row", "merge_split", "to_token", "read_buffer", "index_of", "validate", "retry")


def _source_file(rng: random.Random, lines: int) -> str:
    out = ['"""Helpers for reading and writing rows."""', "", "import re", "from typing import Any", ""]
    while len(out) < lines:
        name = rng.choice(_FUNCS) + f"_{rng.randrange(100)}"
        out += [f"def {name}(value: Any, sep: str = \",\") -> str:",
                f'    """{filler(rng.randrange(10**6), 8)}"""',
                "    if value is None:", "        return \"\"",
                f"    parts = [p.strip() for p in str(value).split(sep)]  # {rng.randrange(10**4)}",
                "    return sep.join(f'\"{p}\"' if sep in p else p for p in parts)", ""]
    return "\n".join(f"{index + 1:6}\t{line}" for index, line in enumerate(out[:lines])) + "\n"


def _pytest_log(rng: random.Random, tests: int, failed: int) -> str:
    rows = [f"tests/test_{rng.choice(_MODULES)}.py::test_{rng.choice(_FUNCS)}_{i} "
            f"{'FAILED' if i < failed else 'PASSED'} [{100 * (i + 1) // tests:3d}%]" for i in range(tests)]
    tail = [f"FAILED tests/test_{_MODULES[0]}.py::test_{_FUNCS[0]}_{i} - AssertionError: assert "
            f"'\"a,b\"' == 'a,b'" for i in range(failed)]
    summary = f"{'=' * 20} {failed} failed, {tests - failed} passed in {rng.uniform(0.2, 9):.2f}s {'=' * 20}"
    return ("============================= test session starts ==============================\nplatform linux -- "
            "Python 3.11.9, pytest-8.3.2, pluggy-1.5.0\nrootdir: /testbed\ncollected " + str(tests) + " items\n\n"
            + "\n".join(rows + tail + [summary]) + "\n")


def _listing(rng: random.Random, entries: int) -> str:
    return "\n".join(f"./src/{rng.choice(_MODULES)}/{rng.choice(_FUNCS)}_{i}.py" for i in range(entries)) + "\n"


def _sized(make: Any, size: int) -> str:
    """Output from ``make(n)`` grown until it is about ``size`` characters."""
    n = 8
    text = make(n)
    while len(text) < size and n < 1 << 16:
        n *= 2
        text = make(n)
    return text[: max(size, 1)] if len(text) > size else text


def _hunk_line(rng: random.Random, module: str, number: int) -> str:
    name = rng.choice(_FUNCS)
    return rng.choice((
        f"    {name}_{number} = {module}.{rng.choice(_FUNCS)}(value, sep=sep)  # {rng.randrange(10**5)}",
        f"    if {name}_{number} is None or sep not in str(value):  # case {rng.randrange(10**5)}",
        f"        return [p.strip('\"') for p in _split_quoted(value, sep, limit={number})]",
        f"    logger.debug(\"{name}: %r (step {number})\", value)",
        f"def {name}_{number}(value: str, sep: str = \",\", *, strict: bool = False) -> list[str]:",
        f"        raise ValueError(f\"unbalanced quote in {{value!r}} at {number}\")"))


def swe_patch(rng: random.Random, changed: int) -> str:
    """A unified diff with ``changed`` changed lines in 1–4 hunks over 1–3 files, three context lines around each
    hunk (as ``git diff`` writes them)."""
    hunks = max(1, min(4, changed // 6, rng.randrange(1, 5)))
    sizes = [changed // hunks + (index < changed % hunks) for index in range(hunks)]
    files = sorted(rng.sample(_MODULES, min(3, hunks)))
    out: list[str] = []
    line = rng.randrange(20, 200)
    for index, size in enumerate(sizes):
        module = files[index % len(files)]
        if index < len(files):
            out += [f"diff --git a/src/{module}.py b/src/{module}.py", f"index {rng.randrange(16**7):07x}.."
                    f"{rng.randrange(16**7):07x} 100644", f"--- a/src/{module}.py", f"+++ b/src/{module}.py"]
        removed = rng.randrange(0, size + 1) if size > 1 else 0
        added = size - removed
        before = [f" {_hunk_line(rng, module, line + k)}" for k in range(3)]
        after = [f" {_hunk_line(rng, module, line + 3 + removed + k)}" for k in range(3)]
        out.append(f"@@ -{line},{6 + removed} +{line},{6 + added} @@ def {rng.choice(_FUNCS)}(value, sep=\",\"):")
        out += before
        out += [f"-{_hunk_line(rng, module, line + 3 + k)}" for k in range(removed)]
        out += [f"+{_hunk_line(rng, module, line + 3 + k)}" for k in range(added)]
        out += after
        line += 40 + rng.randrange(200)
    return "\n".join(out) + "\n"


def make_episode(instance_id: str, seed: int, *, target_bytes: int = 60_000, model: str | None = None,
                 resolved_style: bool = True, steps: int | None = None, patch_lines: int | None = None) -> Episode:
    """A realistic episode with about ``target_bytes`` of tool output over 20–100 steps (fewer for small
    targets): explore, read, reproduce, edit, test — some outputs long enough for the harness's warning.

    SWE-bench-shaped episodes: ``steps`` fixes the number of steps, and ``patch_lines`` gives the final patch that
    many changed lines (in 1–4 hunks with their context) and ends the episode as agents end such runs: an edit,
    then the tests run once more (the last verification), then the submission.
    """
    rng = random.Random(seed)
    statement = (f"{rng.choice(_FUNCS)} mishandles quoted separators\n\n{filler(seed, 60)}\n\n```python\n"
                 f">>> {rng.choice(_FUNCS)}('a,b')\n'\"a,b\"'\n```\n\nExpected `a,b`.")
    n_steps = max(6, min(rng.randrange(20, 101), target_bytes // 2_000)) if steps is None else steps
    mean = target_bytes / n_steps
    episode_steps: list[Step] = []
    kinds = ("ls", "cat", "grep", "pytest", "edit", "python")
    for index in range(n_steps - (2 if patch_lines is not None else 0)):
        kind = kinds[index] if index < len(kinds) else rng.choice(kinds)
        module = rng.choice(_MODULES)
        size = int(mean * rng.uniform(0.2, 1.8))
        if kind == "ls":
            step = Step("Let me look at the repository layout first.", "find . -name '*.py' | head -200",
                        _sized(lambda n: _listing(rng, n), size))
        elif kind == "cat":
            step = Step(f"I'll read {module}.py to find where rows are quoted.", f"nl -ba src/{module}.py",
                        _sized(lambda n: _source_file(rng, n), size))
        elif kind == "grep":
            step = Step("Where else is the separator handled?", "grep -rn 'sep' src/ | head -100",
                        _sized(lambda n: "".join(
                            f"src/{rng.choice(_MODULES)}.py:{rng.randrange(1, 900)}:    parts = value.split(sep)  "
                            f"# {filler(rng.randrange(10**6), 6)}\n" for _ in range(n)), size),
                        returncode=0 if rng.random() < 0.9 else 1)
        elif kind == "pytest":
            failed = rng.randrange(0, 4)
            step = Step("Running the tests to see what fails.", f"python -m pytest tests/test_{module}.py -q",
                        _sized(lambda n: _pytest_log(rng, n, min(failed, n)), size), returncode=1 if failed else 0)
        elif kind == "edit":
            step = Step("Quoting must only wrap fields that contain the separator; fixing it.",
                        f"sed -i 's/if sep in p/if sep in p and not p.startswith(\\\"\\\\\\\"\\\")/' src/{module}.py",
                        "", 0)
        else:
            step = Step("Reproducing the issue with a small script.",
                        "python -c \"from src.parser import parse_row; print(parse_row('a,\\\"b,c\\\"'))\"",
                        f"['a', 'b,c']\n{filler(rng.randrange(10**6), max(5, size // 7))}\n",
                        returncode=rng.choice((0, 0, 1)))
        episode_steps.append(step)
    module = rng.choice(_MODULES)
    patch = (f"diff --git a/src/{module}.py b/src/{module}.py\nindex 1a2b3c4..5d6e7f8 100644\n--- a/src/{module}.py\n"
             f"+++ b/src/{module}.py\n@@ -41,7 +41,7 @@ def parse_row(value, sep=\",\"):\n-    return [p for p in "
             "value.split(sep)]\n+    return [p.strip('\"') for p in _split_quoted(value, sep)]\n")
    exit_status = "Submitted" if resolved_style or rng.random() < 0.7 else "LimitsExceeded"
    if patch_lines is not None:
        # Its own random stream, so the episodes above stay what they were for callers that do not ask for this.
        ending = random.Random(seed * 7919 + patch_lines)
        patch = swe_patch(ending, patch_lines)
        tests = ending.randrange(8, 40)
        failed = 0 if resolved_style else ending.randrange(1, 3)
        episode_steps += [
            Step("The fix goes where fields are split; editing the module.",
                 f"sed -i 's/value.split(sep)/_split_quoted(value, sep)/' src/{module}.py && git diff --stat",
                 f" src/{module}.py | {patch_lines} {'+-' * min(patch_lines // 2, 20)}\n 1 file changed\n", 0),
            Step("Running the tests once more to confirm the fix.", f"python -m pytest tests/test_{module}.py -q",
                 _pytest_log(ending, tests, failed), 1 if failed else 0)]
    return Episode(instance_id=instance_id, problem_statement=statement, steps=episode_steps,
                   model=model or "anthropic/claude-sonnet-4-5-20250929", exit_status=exit_status,
                   patch=patch, cost=round(0.05 + len(episode_steps) * 0.011, 4))
