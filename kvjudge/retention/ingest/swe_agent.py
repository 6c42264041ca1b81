"""SWE-agent trajectories (``<instance_id>.traj``) and demonstrations (``<instance_id>.demo.yaml``).

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
submission the last transition. Attempts the retry agent did not choose become dead branches. A trajectory that
holds only its ``history`` (demonstrations, older versions) is read from it: each assistant message (its
``thought`` and ``action``; in 1.x function calling its ``tool_calls``) an assistant transition, each message after
it a tool transition.

A demonstration (``<instance>.demo.yaml``, SWE-agent 1.x's ``sweagent traj-to-demo``, replayed by ``sweagent run
replay``) is a YAML file of the same ``history`` — messages with ``role``, ``content``, ``tool_calls``
(``function{name, arguments}``, ``id``), ``message_type`` (action or observation), ``tool_call_ids``; by default
the assistant's alone, with ``--include_user`` the instance message and the observations too — beside the
``replay_config`` (an object here: ``problem_statement.id``/``text``, ``agent.model.name``), read as a trajectory
of history alone.

A run directory holds, beside the trajectories, the run's predictions — ``all_preds.jsonl`` (0.x: one line per
instance, ``{model_name_or_path, instance_id, model_patch}``) or ``preds.json`` (1.x: instance id → the same) —
and its settings (``args.yaml``, ``config.yaml``). The prediction is the final patch the harness submitted: it is
the submission of a trajectory whose ``info`` has none, and its ``model_name_or_path`` names the agent of a
trajectory whose config names no model. The settings are passed over (noted).
"""

from __future__ import annotations

import json
import re
from typing import Any

from kvjudge.retention.ingest.format import Companion, Format, companion_data
from kvjudge.retention.ingest.model import DocumentError, ParseContext, ParsedRun, as_object, content_text, dig
from kvjudge.retention.ingest.model import get_field, jpath, need, scalars, with_marker
from kvjudge.retention.ingest.openai import parse_tool_calls
from kvjudge.retention.ingest.swebench import read_predictions

TASK_MARKER = "{{problem_statement}}"
TOOL = "bash"

_ISSUE = re.compile(r"ISSUE:\n(.*?)\n\nINSTRUCTIONS:", re.DOTALL)
_PR = re.compile(r"<pr_description>\n(.*?)\n</pr_description>", re.DOTALL)


def is_swe_agent(obj: dict[str, Any]) -> bool:
    """A SWE-agent trajectory: a ``trajectory`` list (or a retry agent's ``attempts``) beside ``info``/``history``,
    or a ``history`` alone whose messages have roles."""
    steps = isinstance(obj.get("trajectory"), list) and ("history" in obj or "info" in obj)
    history = obj.get("history")
    alone = isinstance(history, list) and bool(history) and isinstance(history[0], dict) and "role" in history[0] \
        and "messages" not in obj
    return steps or alone or (isinstance(obj.get("attempts"), list) and "info" in obj)


PREDICTIONS = (Companion("all_preds.jsonl", "the final patch of each instance", read_predictions),
               Companion("preds.json", "the final patch of each instance", read_predictions))
SETTINGS = (Companion("args.yaml", "the run's settings"), Companion("config.yaml", "the run's settings"),
            Companion("run_batch.config.yaml", "the run's settings"))


def _prediction(document: Any, instance_id: str) -> tuple[dict[str, str] | None, str | None]:
    """The prediction the run directory's predictions hold for ``instance_id``, and the file it came from."""
    for companion in PREDICTIONS:
        predictions = companion_data(document, companion)
        if predictions and instance_id in predictions:
            return predictions[instance_id], companion.pattern
    return None, None


def parse_swe_agent(obj: Any, context: ParseContext, document: Any = None) -> ParsedRun:
    """One ``*.traj`` document → ParsedRun (raises DocumentError naming the JSON path); ``document`` gives the
    run directory's predictions."""
    need(isinstance(obj, dict), "$", "a SWE-agent trajectory must be a JSON object")
    history = get_field(obj, "history", "$", list, "a list of messages", required=False) or []
    trajectory = get_field(obj, "trajectory", "$", list, "a list of steps", required=not history)
    info = get_field(obj, "info", "$", dict, "an object", required=trajectory is not None) or {}
    replay = _replay_config(obj.get("replay_config"))
    statement = dig(replay, "problem_statement", "text")
    instance_id = dig(replay, "problem_statement", "id") or context.default_instance
    need(isinstance(instance_id, str) and instance_id != "", "$.replay_config",
         "names no problem_statement.id, and the file name (<instance>.traj) gives none")
    prediction, predicted_in = _prediction(document, instance_id) if document is not None else (None, None)
    model = dig(replay, "agent", "model", "name")
    named = model if isinstance(model, str) and model else (prediction or {}).get("model")
    agent = context.agent or named or "swe-agent"
    submission = get_field(info, "submission", "$.info", str, "a string", required=False)
    if not submission and prediction and prediction["patch"]:
        submission = prediction["patch"]
    else:
        predicted_in = None
    stats = as_object(info.get("model_stats"))
    version = info.get("swe_agent_version")
    metadata = scalars({"format": "swe-agent", "exit_status": info.get("exit_status"),
                        "cost": stats.get("instance_cost"), "api_calls": stats.get("api_calls"),
                        "tokens_sent": stats.get("tokens_sent"), "tokens_received": stats.get("tokens_received"),
                        "model": model, "submission_from": predicted_in,
                        "harness": f"SWE-agent {version}" if isinstance(version, str) else "SWE-agent"})
    run = context.new_run(context.with_trial(f"{agent}/{instance_id}"), "swe-agent", agent=agent, grading_open=True)
    prefix, statement, first_action = _prompt_prefix(history, statement if isinstance(statement, str) else None)
    run.start(task_id=instance_id, prompt=statement, metadata=metadata, trial=context.trial)
    main = run.branch("main")
    for role, text in prefix:
        run.step(main, role, text=text)
    if trajectory is not None:
        _steps(run, main, trajectory, "$.trajectory")
    else:
        _history_steps(run, main, history, first_action)
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


def _prompt_prefix(history: list[Any], statement: str | None) -> tuple[list[tuple[str, str]], str | None, int]:
    """The messages before the first action as (role, text), the problem statement, and the first action's index.

    Demonstrations (``is_demo``) are joined into one user message; the instance message (the first user
    message that is not a demonstration) has the problem statement replaced by ``{{problem_statement}}``.
    """
    prefix: list[tuple[str, str]] = []
    demo: list[str] = []
    instance_seen = False
    first_action = len(history)
    for index, item in enumerate(history):
        where = ("$.history", index)
        need(isinstance(item, dict), where, "must be an object")
        role = item.get("role")
        need(isinstance(role, str), (*where, "role"), "missing (every message needs a role)")
        if role == "assistant" and not item.get("is_demo"):
            first_action = index
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
    return prefix, statement, first_action


def _history_steps(run: ParsedRun, branch: str, history: list[Any], start: int) -> None:
    """A trajectory without ``trajectory`` steps, from its history: each assistant message (its ``thought`` and
    ``action``, else its content and ``tool_calls``: one transition per call) an assistant transition, each other
    message after one a tool transition (named by its ``tool_call_ids``)."""
    names: dict[str, str] = {}
    for index in range(start, len(history)):
        where = ("$.history", index)
        item = history[index]
        need(isinstance(item, dict), where, "must be an object")
        text = content_text(item.get("content"), (*where, "content"))
        if item.get("role") == "assistant":
            thought = item.get("thought") if isinstance(item.get("thought"), str) else text
            action = item.get("action") if isinstance(item.get("action"), str) else None
            calls = [] if action else parse_tool_calls(item.get("tool_calls"), (*where, "tool_calls"), names)
            for number, call in enumerate(calls):
                run.step(branch, "assistant", text=thought if number == 0 else None, call=call)
            if not calls:
                run.step(branch, "assistant", text=thought, call=(TOOL, action) if action and action.strip() else None)
        else:
            ids = item.get("tool_call_ids")
            name = names.get(ids[0]) if isinstance(ids, list) and ids and isinstance(ids[0], str) else None
            run.step(branch, "tool", output=(name or TOOL, text or "", None))


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


FORMAT = Format(
    name="swe-agent", summary="SWE-agent trajectories (`*.traj`, 0.7 and 1.x; a `history` alone too) and "
                              "demonstrations (`*.demo.yaml`)",
    recognises=is_swe_agent, parse=parse_swe_agent, files=("*.traj", "*.demo.yaml"),
    companions=PREDICTIONS + SETTINGS,
    trial_label=True)
