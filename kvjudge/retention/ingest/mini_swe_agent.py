"""mini-swe-agent trajectories (``*.traj.json``): ``trajectory_format`` ``mini-swe-agent-1`` and ``-1.1``.

Shapes, as mini-swe-agent writes them:

- ``mini-swe-agent-1`` (v1.x): ``messages`` of ``{"role", "content", "timestamp"?, "extra"?}`` — system, the
  instance message (``<pr_description>`` holds the task), then assistant messages (a THOUGHT and one fenced
  ``bash`` block) each answered by a user message: the observation (``<returncode>N</returncode>`` and
  ``<output>…</output>``, or a warning with ``<output_head>``/``<output_tail>`` for long output), a format
  error, or a time-out. The last user message is the exit: the submission itself when it submitted.
- ``mini-swe-agent-1.1`` (v2.x): messages are the model's own output plus ``extra``: assistant messages carry
  ``extra.actions`` (``[{"command", "tool_call_id"?}]``) and, for tool-call models, ``tool_calls``;
  observations are ``role: tool`` (or ``user`` for text-based models) with ``extra.returncode``; the last
  message has ``role: exit`` and ``extra.exit_status``/``submission``. Responses-API models store the whole
  response object (``"object": "response"``) and ``function_call_output`` items.
- ``info``: ``exit_status``, ``submission`` (the patch), ``model_stats`` (``instance_cost``, ``api_calls``),
  ``config`` (``model.model_name``, ``agent.action_regex``), ``mini_version``; ``instance_id`` at the top.

Mapping: task id = instance id; task prompt = the ``<pr_description>``; the instance message around it is the
first transition (the prompt replaced by ``{{task}}``, as in the harness's template); each action is an
assistant transition with a ``bash`` call; each observation a tool transition with its exit code; the
submission the last transition; exit status, cost and API calls are run metadata.
"""

from __future__ import annotations

import json
import re
from typing import Any

from kvjudge.retention.ingest.format import Format
from kvjudge.retention.ingest.model import ROLES, DocumentError, JsonPath, ParseContext, ParsedRun, as_object
from kvjudge.retention.ingest.model import content_text, dig, get_field, need, scalars, usage_of, with_marker
from kvjudge.retention.ingest.openai import parse_tool_calls

FORMAT_V1, FORMAT_V11 = "mini-swe-agent-1", "mini-swe-agent-1.1"
TRAJECTORY_FORMATS = (FORMAT_V1, FORMAT_V11)
TASK_MARKER = "{{task}}"
TOOL = "bash"

# v1's default; a trajectory's own info.config.agent.action_regex wins. v2 text-based models use mswea_bash_command.
_ACTION_RES = (r"```bash\s*\n(.*?)\n```", r"```mswea_bash_command\s*\n(.*?)\n```")
_PR = re.compile(r"<pr_description>\n?(?:Consider the following PR description:\n)?(.*?)\n?</pr_description>",
                 re.DOTALL)
_RETURNCODE = re.compile(r"<returncode>(-?\d+)</returncode>\n?")
_OUTPUT = re.compile(r"<output>\n?(.*)</output>\s*", re.DOTALL)


def is_mini_swe_agent(obj: dict[str, Any]) -> bool:
    """A mini-swe-agent trajectory: it names its ``trajectory_format``, or has ``info`` beside ``messages``."""
    return "trajectory_format" in obj or ("messages" in obj and isinstance(obj.get("info"), dict))


def parse_mini_swe_agent(obj: Any, context: ParseContext) -> ParsedRun:
    """One ``*.traj.json`` document → ParsedRun (raises DocumentError naming the JSON path)."""
    need(isinstance(obj, dict), "$", "a mini-swe-agent trajectory must be a JSON object")
    messages = get_field(obj, "messages", "$", list, "a list of messages")
    need(len(messages) > 0, "$.messages", "must not be empty")
    fmt = obj.get("trajectory_format")
    if fmt is None:
        fmt = FORMAT_V11 if any(isinstance(m, dict) and (m.get("role") == "exit" or dig(m, "extra", "actions"))
                                for m in messages) else FORMAT_V1
    need(fmt in TRAJECTORY_FORMATS, "$.trajectory_format",
         f"unknown trajectory_format {fmt!r} (this kvjudge reads {', '.join(TRAJECTORY_FORMATS)})")
    info = get_field(obj, "info", "$", dict, "an object")
    instance_id = get_field(obj, "instance_id", "$", str, "a string", required=False) or context.default_instance
    need(bool(instance_id), "$.instance_id", "missing, and the file name (<instance>.traj.json) gives none")
    model = dig(info, "config", "model", "model_name")
    agent = context.agent or (model if isinstance(model, str) and model else "mini-swe-agent")
    submission = get_field(info, "submission", "$.info", str, "a string", required=False)
    stats = as_object(info.get("model_stats"))
    version = info.get("mini_version")
    metadata = scalars({"format": fmt, "exit_status": info.get("exit_status"), "cost": stats.get("instance_cost"),
                        "api_calls": stats.get("api_calls"), "model": model,
                        "harness": f"mini-swe-agent {version}" if isinstance(version, str) else "mini-swe-agent"})
    run = context.new_run(context.with_trial(f"{agent}/{instance_id}"), fmt, agent=agent, grading_open=True)
    action_res = _action_patterns(dig(info, "config", "agent", "action_regex"), dig(info, "config", "model",
                                                                                     "action_regex"))
    steps: list[tuple[str, dict[str, Any]]] = []
    prompt = None
    acted = False  # the instance message is the first user message before any action
    last = len(messages) - 1
    for index, message in enumerate(messages):
        where = ("$.messages", index)
        need(isinstance(message, dict), where, "must be an object")
        kind = _kind_of(message, where)
        acted = acted or kind == "assistant"
        if kind == "user" and prompt is None and not acted:
            text = content_text(get_field(message, "content", where, (str, list), "the message text"),
                                (*where, "content"))
            prompt = _task_prompt(text or "")
            steps.append(("instance", {"text": with_marker(text or "", prompt, TASK_MARKER)}))
        elif kind == "exit" or (fmt == FORMAT_V1 and index == last and kind == "user" and info.get("exit_status")
                                and _is_exit_message(message, submission)):
            continue  # the exit status and the submission are kept as metadata and the last transition
        else:
            steps.append((kind, {"message": message, "where": where}))
    run.start(task_id=instance_id, prompt=prompt, metadata=metadata, trial=context.trial)
    branch = run.branch("main")
    for kind, data in steps:
        if kind == "instance":
            run.step(branch, "user", text=data["text"])
        elif kind == "assistant":
            _assistant(run, branch, data["message"], data["where"], action_res)
        elif kind == "observation":
            text, exit_code = _observation(data["message"], data["where"])
            run.step(branch, "tool", output=(TOOL, text, exit_code))
        else:
            message, where = data["message"], data["where"]
            run.step(branch, kind, text=content_text(message.get("content"), (*where, "content")))
    if submission:
        run.step(branch, "assistant", call=("submit", submission))
    return run


def _action_patterns(*configured: Any) -> list[re.Pattern[str]]:
    patterns = []
    for source in [c for c in configured if isinstance(c, str)] + list(_ACTION_RES):
        try:
            patterns.append(re.compile(source, re.DOTALL))
        except re.error:
            continue  # a config regex Python cannot read: the defaults still apply
    return patterns


def _kind_of(message: dict[str, Any], where: JsonPath) -> str:
    """assistant | observation | exit | system | user | developer — from the message's shape."""
    if message.get("object") == "response":
        return "assistant"
    if message.get("type") == "function_call_output":
        return "observation"
    role = message.get("role")
    need(isinstance(role, str), (*where, "role"), "missing (every message needs a role)")
    if role == "exit":
        return "exit"
    if role == "tool" or (role == "user" and _has_returncode(message)):
        return "observation"
    if role not in ROLES:
        raise DocumentError((*where, "role"), f"unknown role {role!r} (expected one of {', '.join(ROLES)}, exit)")
    return role


def _has_returncode(message: dict[str, Any]) -> bool:
    if "returncode" in (message.get("extra") or {}):
        return True
    content = message.get("content")
    return isinstance(content, str) and _RETURNCODE.match(content.lstrip()) is not None


def _is_exit_message(message: dict[str, Any], submission: str | None) -> bool:
    """v1's last user message is the exception that ended the run: its text is the submission (or empty)."""
    content = message.get("content")
    return content in ("", None) or content == submission


def _task_prompt(text: str) -> str:
    """The PR description inside ``<pr_description>``; the whole message when it has none."""
    found = _PR.search(text)
    return found.group(1) if found and found.group(1) else text


def _assistant(run: ParsedRun, branch: str, message: dict[str, Any], where: JsonPath,
               action_res: list[re.Pattern[str]]) -> None:
    """One model response → one assistant transition per action (the text rides on the first)."""
    extra = as_object(message.get("extra"))
    if message.get("object") == "response":
        text = _response_text(message, where)
        usage = usage_of(message.get("usage"))
    else:
        need("content" in message or "tool_calls" in message, where,
             "an assistant message needs content (or tool_calls)")
        text = content_text(message.get("content"), (*where, "content"))
        usage = usage_of(dig(extra, "response", "usage"))
    commands = _commands(extra, message, where)
    if text is not None and not message.get("tool_calls"):  # text-based: the one fenced block is the action
        for pattern in action_res:
            found = list(pattern.finditer(text))
            if len(found) == 1 and (commands is None or found[0].group(1).strip() in commands):
                commands = commands or [found[0].group(1).strip()]
                text = (text[:found[0].start()] + text[found[0].end():]).strip()
                break
    commands = commands or []
    for c_index in range(max(1, len(commands))):
        run.step(branch, "assistant", text=text if c_index == 0 else None,
                 call=(TOOL, commands[c_index]) if commands else None, usage=usage if c_index == 0 else None)


def _commands(extra: dict[str, Any], message: dict[str, Any], where: JsonPath) -> list[str] | None:
    """The parsed actions of a v2 message (``extra.actions``), else its tool calls' commands; None: neither."""
    actions = extra.get("actions")
    if actions is not None:
        need(isinstance(actions, list), (*where, "extra", "actions"), "must be a list")
        commands = []
        for index, action in enumerate(actions):
            command = action.get("command") if isinstance(action, dict) else None
            need(isinstance(command, str), (*where, "extra", "actions", index, "command"),
                 "missing (each action needs its command)")
            commands.append(command)
        return commands
    calls = parse_tool_calls(message.get("tool_calls"), (*where, "tool_calls"))
    if not calls:
        return None
    return [_command_of(arguments) for _, arguments in calls]


def _command_of(arguments: Any) -> str:
    if isinstance(arguments, str):
        try:
            decoded = json.loads(arguments)
        except ValueError:
            return arguments
        arguments = decoded
    if isinstance(arguments, dict) and isinstance(arguments.get("command"), str):
        return arguments["command"]
    return arguments if isinstance(arguments, str) else json.dumps(arguments, sort_keys=True)


def _response_text(message: dict[str, Any], where: JsonPath) -> str | None:
    """The text of a Responses-API response object: its message items' output text."""
    output = message.get("output")
    need(isinstance(output, list), (*where, "output"), "a response object needs its output list")
    texts = []
    for index, item in enumerate(output):
        if isinstance(item, dict) and item.get("type") == "message":
            texts.append(content_text(item.get("content"), (*where, "output", index, "content")) or "")
    return "\n".join(texts) if texts else None


def _observation(message: dict[str, Any], where: JsonPath) -> tuple[str, int | None]:
    """An observation → (output text, exit code): the ``<returncode>`` moves to the exit code, an
    ``<output>`` element that is all there is unwraps; warnings, heads and tails stay as the agent saw them."""
    if message.get("type") == "function_call_output":
        raw = message.get("output")
        need(isinstance(raw, str), (*where, "output"), "missing (a function_call_output needs its output)")
        text = raw
    else:
        need("content" in message, where, "an observation needs content")
        text = content_text(message.get("content"), (*where, "content")) or ""
    extra = as_object(message.get("extra"))
    exit_code = extra.get("returncode")
    found = _RETURNCODE.search(text)
    if found is not None:
        if not isinstance(exit_code, int) or isinstance(exit_code, bool):
            exit_code = int(found.group(1))
        text = text[:found.start()] + text[found.end():]
    if exit_code is not None and (not isinstance(exit_code, int) or isinstance(exit_code, bool)):
        raise DocumentError((*where, "extra", "returncode"), "must be an integer")
    whole = _OUTPUT.fullmatch(text)
    return (whole.group(1) if whole else text), exit_code


FORMAT = Format(
    name="mini-swe-agent", summary="mini-swe-agent trajectories (`*.traj.json`, mini-swe-agent-1 and -1.1)",
    recognises=is_mini_swe_agent, parse=lambda obj, context, document: parse_mini_swe_agent(obj, context),
    trial_label=True)
