"""SWE-agent trajectories (``<instance_id>.traj``).

Shape, as SWE-agent writes it (0.7 and 1.x):

- ``trajectory``: one step per action — ``thought``, ``action``, ``observation``, ``response`` (the raw model
  output), ``state``, ``execution_time``, and in 1.x ``query`` / ``messages``;
- ``history``: the messages the model saw — the system prompt, demonstrations (``is_demo``), the instance
  message with the problem statement, then actions and observations;
- ``info``: ``exit_status`` (``submitted``, ``exit_cost``, ``submitted (exit_context)``, …), ``submission`` (the
  patch), ``model_stats`` (``instance_cost``, ``tokens_sent``, ``tokens_received``, ``api_calls``),
  ``swe_agent_version``; 1.x adds ``replay_config`` (a JSON string: ``problem_statement.text`` / ``.id``,
  ``agent.model.name``); a retry agent adds ``attempts`` (each a trajectory of its own) and
  ``info.best_attempt_idx``.

Mapping: the history before the first action (system prompt, demonstrations, the instance message with the
problem statement replaced by ``{{problem_statement}}``) becomes the first transitions; each trajectory step an
assistant transition (thought, with the action as a ``bash`` call) and a tool transition (the observation); the
submission the last transition. Attempts the retry agent did not choose become dead branches.
"""

from __future__ import annotations

import json
import re
from typing import Any

from kvjudge.retention.ingest.model import DocumentError, ParseContext, ParsedRun, as_object, content_text, dig
from kvjudge.retention.ingest.model import get_field, jpath, need, scalars, with_marker

TASK_MARKER = "{{problem_statement}}"
TOOL = "bash"

_ISSUE = re.compile(r"ISSUE:\n(.*?)\n\nINSTRUCTIONS:", re.DOTALL)
_PR = re.compile(r"<pr_description>\n(.*?)\n</pr_description>", re.DOTALL)


def is_swe_agent(obj: dict[str, Any]) -> bool:
    """A SWE-agent trajectory: a ``trajectory`` list (or a retry agent's ``attempts``) beside ``info``/``history``."""
    steps = isinstance(obj.get("trajectory"), list) and ("history" in obj or "info" in obj)
    return steps or (isinstance(obj.get("attempts"), list) and "info" in obj)


def parse_swe_agent(obj: Any, context: ParseContext) -> ParsedRun:
    """One ``*.traj`` document → ParsedRun (raises DocumentError naming the JSON path)."""
    need(isinstance(obj, dict), "$", "a SWE-agent trajectory must be a JSON object")
    trajectory = get_field(obj, "trajectory", "$", list, "a list of steps")
    info = get_field(obj, "info", "$", dict, "an object")
    history = get_field(obj, "history", "$", list, "a list of messages", required=False) or []
    replay = _replay_config(obj.get("replay_config"))
    statement = dig(replay, "problem_statement", "text")
    instance_id = dig(replay, "problem_statement", "id") or context.default_instance
    need(isinstance(instance_id, str) and instance_id != "", "$.replay_config",
         "names no problem_statement.id, and the file name (<instance>.traj) gives none")
    model = dig(replay, "agent", "model", "name")
    agent = context.agent or (model if isinstance(model, str) and model else "swe-agent")
    submission = get_field(info, "submission", "$.info", str, "a string", required=False)
    stats = as_object(info.get("model_stats"))
    version = info.get("swe_agent_version")
    metadata = scalars({"format": "swe-agent", "exit_status": info.get("exit_status"),
                        "cost": stats.get("instance_cost"), "api_calls": stats.get("api_calls"),
                        "tokens_sent": stats.get("tokens_sent"), "tokens_received": stats.get("tokens_received"),
                        "model": model,
                        "harness": f"SWE-agent {version}" if isinstance(version, str) else "SWE-agent"})
    run = context.new_run(context.with_trial(f"{agent}/{instance_id}"), "swe-agent", agent=agent, grading_open=True)
    prefix, statement = _prompt_prefix(history, statement if isinstance(statement, str) else None)
    run.start(task_id=instance_id, prompt=statement, metadata=metadata, trial=context.trial)
    main = run.branch("main")
    for role, text in prefix:
        run.step(main, role, text=text)
    _steps(run, main, trajectory, "$.trajectory")
    if submission:
        run.step(main, "assistant", call=("submit", submission))
    attempts = obj.get("attempts")
    if isinstance(attempts, list) and len(attempts) > 1:
        chosen = info.get("best_attempt_idx")
        for index, attempt in enumerate(attempts):
            if index == chosen:
                continue
            where = jpath("$.attempts", index)
            need(isinstance(attempt, dict), where, "must be an object")
            steps = get_field(attempt, "trajectory", where, list, "a list of steps")
            # An attempt starts over after the shared prompt: it forks from main where main's own steps begin.
            branch = run.branch(f"attempt-{index}", "dead", parent=main, fork_at=len(prefix))
            _steps(run, branch, steps, jpath(where, "trajectory"))
    return run


def _replay_config(value: Any) -> dict[str, Any]:
    """SWE-agent 1.x stores the run's config as a JSON string (tests and demos sometimes as an object)."""
    if value is None:
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise DocumentError("$.replay_config", f"is not valid JSON ({exc})") from None
    need(isinstance(value, dict), "$.replay_config", "must be an object (or its JSON text)")
    return value


def _prompt_prefix(history: list[Any], statement: str | None) -> tuple[list[tuple[str, str]], str | None]:
    """The messages before the first action as (role, text), and the problem statement.

    Demonstrations (``is_demo``) are joined into one user message; the instance message (the first user
    message that is not a demonstration) has the problem statement replaced by ``{{problem_statement}}``.
    """
    prefix: list[tuple[str, str]] = []
    demo: list[str] = []
    instance_seen = False
    for index, item in enumerate(history):
        where = ("$.history", index)
        need(isinstance(item, dict), where, "must be an object")
        role = item.get("role")
        need(isinstance(role, str), (*where, "role"), "missing (every message needs a role)")
        if role == "assistant" and not item.get("is_demo"):
            break
        text = content_text(item.get("content"), (*where, "content")) or ""
        if item.get("is_demo"):
            demo.append(text)
            continue
        if demo:
            prefix.append(("user", "\n".join(demo)))
            demo = []
        if role == "system":
            prefix.append(("system", text))
        elif not instance_seen:
            instance_seen = True
            statement = statement or _statement_in(text)
            prefix.append(("user", with_marker(text, statement, TASK_MARKER)))
        else:
            prefix.append(("user", text))
    if demo:
        prefix.append(("user", "\n".join(demo)))
    return prefix, statement


def _statement_in(text: str) -> str:
    """The problem statement in the instance message: SWE-agent 0.x writes ``ISSUE:\\n…\\n\\nINSTRUCTIONS:``, 1.x
    templates ``<pr_description>``; else the whole text."""
    for pattern in (_ISSUE, _PR):
        found = pattern.search(text)
        if found and found.group(1):
            return found.group(1)
    return text


def _steps(run: ParsedRun, branch: str, steps: list[Any], path: str) -> None:
    for index, step in enumerate(steps):
        where = (path, index)
        need(isinstance(step, dict), where, "must be an object")
        thought = get_field(step, "thought", where, str, "a string")
        action = get_field(step, "action", where, str, "a string")
        observation = get_field(step, "observation", where, str, "a string")
        run.step(branch, "assistant", text=thought, call=(TOOL, action) if action.strip() else None)
        run.step(branch, "tool", output=(TOOL, observation, None))
