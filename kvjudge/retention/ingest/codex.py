"""Codex CLI rollouts: ``~/.codex/sessions/YYYY/MM/DD/rollout-<time>-<id>.jsonl``, one run per file.

Shape, as Codex CLI writes it (``codex-rs/protocol``): every line ``{timestamp, type, payload}``. ``session_meta``
(first: ``id``, ``cwd``, ``cli_version``, ``originator``, ``model_provider``, ``instructions``); ``turn_context``
(each turn: ``cwd``, ``model``, ``approval_policy``, ``sandbox_policy``, ``effort``); ``response_item`` — what
the model saw and said: ``message{role user|assistant|developer, content[{type input_text|output_text, text}]}``,
``reasoning{summary[{type summary_text, text}], encrypted_content}``, ``function_call{name, arguments (JSON
text), call_id}`` and ``function_call_output{call_id, output}`` (the output JSON text ``{output, metadata
{exit_code}}``, or text opening ``Exit code: N``), ``custom_tool_call{name, input, call_id}`` (``apply_patch``:
the input is the patch) and ``custom_tool_call_output``, ``local_shell_call{call_id, action{command}}``;
``event_msg`` — the UI's events (``token_count{info.last_token_usage}``, ``user_message``, ``agent_message``,
``task_complete``); ``compacted`` — a summary standing in for the history before it.

Mapping: a rollout is a run. Agent ``codex@<model>`` (the first turn's model); trial the session id; task
:func:`~.model.task_from_prompt` of the first prompt (the first user message that is not the harness's
``<environment_context>`` or ``<user_instructions>``) and the ``cwd``; run id ``<agent>/<task>/<session>``.
Response items become transitions (reasoning summaries as assistant text, a shell call's command as its
arguments, an output's exit code kept); each ``token_count`` is the usage of the assistant transition before it;
the UI's events repeat the response items and are not imported. Older rollouts (before the ``{timestamp, type,
payload}`` lines) open with the session itself, ``{id, timestamp, instructions}``, and hold the response items
bare, beside ``{"record_type": "state"}`` lines: read the same way (they name no model: agent ``codex``).
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

from kvjudge.retention import events as ev
from kvjudge.retention.ingest.format import Format
from kvjudge.retention.ingest.model import ParseContext, ParsedRun, content_text, dig, get_field, need, scalars
from kvjudge.retention.ingest.model import task_from_prompt, usage_of, with_marker

NAME = "codex"
TASK_MARKER = "{{task}}"
_LINE_TYPES = frozenset({"session_meta", "turn_context", "response_item", "event_msg", "compacted"})
_CONTEXT = ("<environment_context>", "<user_instructions>", "# AGENTS.md")
_EXIT_CODE = re.compile(r"\AExit code: (-?\d+)")


def is_rollout_record(record: dict[str, Any]) -> bool:
    """A rollout line: ``{timestamp, type, payload}`` with one of the rollout's line types, or the session line
    older rollouts open with (``{id, timestamp, instructions}``, response items after it unwrapped)."""
    kind = record.get("type")
    if "type" not in record and {"id", "timestamp", "instructions"} <= record.keys():
        return True
    return isinstance(kind, str) and kind in _LINE_TYPES and "payload" in record and "timestamp" in record


def _wrapped(lines: list[Any]) -> list[Any]:
    """An older rollout (its first line the session itself, then bare response items and ``record_type`` state
    lines) as the lines a rollout writes now."""
    first = lines[0]
    if not (isinstance(first, dict) and "type" not in first and "payload" not in first):
        return lines
    wrapped: list[Any] = [{"timestamp": first.get("timestamp"), "type": "session_meta", "payload": first}]
    for line in lines[1:]:
        if isinstance(line, dict) and "record_type" in line:
            wrapped.append({"type": "state", "payload": {}})  # the harness's state: nothing of the run
        else:
            wrapped.append({"timestamp": None, "type": "response_item", "payload": line})
    return wrapped


def parse_codex(obj: Any, context: ParseContext, document: Any = None) -> ParsedRun:
    """A rollout's lines (a list) → ParsedRun (DocumentError naming ``$[i]``, the *i*-th non-blank line)."""
    need(isinstance(obj, list) and bool(obj), "$", "a Codex rollout is a JSONL file of {timestamp, type, payload}")
    obj = _wrapped(obj)
    meta: dict[str, Any] = {}
    model = None
    items: list[tuple[int, dict[str, Any]]] = []
    for index, line in enumerate(obj):
        need(isinstance(line, dict), ("$", index), "must be an object (one line of the rollout)")
        kind = line.get("type")
        payload = get_field(line, "payload", ("$", index), dict, "an object")
        if kind == "session_meta" and not meta:
            meta = payload
        elif kind == "turn_context" and model is None and isinstance(payload.get("model"), str):
            model = payload["model"]
        elif kind == "response_item" or (kind == "event_msg" and payload.get("type") == "token_count") \
                or kind == "compacted":
            items.append((index, line))
    session = meta.get("id")
    need(isinstance(session, str) and session != "", "$[0].payload.id",
         "missing (a rollout opens with its session_meta, which names the session)")
    prompt = next((text for _, line in items if (text := _prompt_of(line)) is not None), None)
    cwd = meta.get("cwd") if isinstance(meta.get("cwd"), str) else None
    task = task_from_prompt(prompt, cwd) or session
    agent = context.agent or (f"codex@{model}" if model else "codex")
    run = context.new_run(f"{agent}/{task}/{session}", NAME, agent=agent, grading_open=True)
    run.named = True  # the session is its identity: other content under it is the session changed
    version = meta.get("cli_version")
    run.start(task_id=task, prompt=prompt, trial=session, metadata=scalars({
        "format": NAME, "model": model, "cwd": cwd, "originator": meta.get("originator"),
        "model_provider": meta.get("model_provider"),
        "harness": f"Codex CLI {version}" if isinstance(version, str) else "Codex CLI"}))
    _Writer(run, run.branch("main"), prompt).add_all(items)
    return run


def _prompt_of(line: dict[str, Any]) -> str | None:
    payload = line["payload"]
    if line.get("type") != "response_item" or payload.get("type") != "message" or payload.get("role") != "user":
        return None
    text = _message_text(payload, ())
    return None if not text or text.lstrip().startswith(_CONTEXT) else text


def _message_text(payload: dict[str, Any], where: Any) -> str | None:
    return content_text(payload.get("content"), (*where, "content"))


class _Writer:
    """Response items → transitions, calls named by their ``call_id``."""

    def __init__(self, run: ParsedRun, branch: str, prompt: str | None) -> None:
        self.run = run
        self.branch = branch
        self.prompt = prompt
        self.prompted = False
        self.names: dict[str, str] = {}

    def add_all(self, items: list[tuple[int, dict[str, Any]]]) -> None:
        for index, line in items:
            where = ("$", index, "payload")
            payload = line["payload"]
            if line["type"] == "event_msg":
                self._usage(payload.get("info"))
            elif line["type"] == "compacted":
                self.run.step(self.branch, "user", text=payload.get("message") if isinstance(
                    payload.get("message"), str) else None)
            else:
                self._item(payload, where)

    def _item(self, payload: dict[str, Any], where: Any) -> None:
        kind = payload.get("type")
        if kind == "message":
            role = payload.get("role")
            need(role in ("user", "assistant", "developer", "system"), (*where, "role"),
                 "must be user, assistant, developer or system")
            text = _message_text(payload, where)
            if role == "user" and not self.prompted and text is not None and text == self.prompt:
                self.prompted = True
                text = with_marker(text, self.prompt, TASK_MARKER)
            self.run.step(self.branch, role, text=text)
        elif kind == "reasoning":
            parts = payload.get("summary") if isinstance(payload.get("summary"), list) else []
            summary = [part["text"] for part in parts if isinstance(part, dict) and isinstance(part.get("text"), str)]
            if summary:
                self.run.step(self.branch, "assistant", text="\n\n".join(summary))
        elif kind in ("function_call", "custom_tool_call", "local_shell_call"):
            self._call(kind, payload, where)
        elif kind in ("function_call_output", "custom_tool_call_output"):
            text, exit_code = _output(payload.get("output"))
            name = self.names.get(_key(payload.get("call_id")), "tool")
            self.run.step(self.branch, "tool", output=(name, text, exit_code))

    def _call(self, kind: str, payload: dict[str, Any], where: Any) -> None:
        if kind == "local_shell_call":
            name, arguments = "local_shell", _command(dig(payload, "action", "command"))
        else:
            name = get_field(payload, "name", where, str, "a string")
            arguments = payload.get("input") if kind == "custom_tool_call" else _arguments(payload.get("arguments"))
        if isinstance(payload.get("call_id"), str):
            self.names[payload["call_id"]] = name
        self.run.step(self.branch, "assistant", call=(name, arguments))

    def _usage(self, info: Any) -> None:
        """A ``token_count`` event: the usage of the model call that made the last assistant transition."""
        usage = usage_of(dig(info, "last_token_usage"))  # Codex's input_tokens include the cached ones
        if usage is None:
            return
        for position in range(len(self.run.events) - 1, -1, -1):
            event = self.run.events[position]
            if isinstance(event, ev.TransitionRecorded) and event.role == "assistant":
                if event.usage is None:
                    self.run.events[position] = dataclasses.replace(event, usage=usage)
                return


def _key(value: Any) -> str | None:
    """An id to look a call up by (None for anything but a string: a document may put any value there)."""
    return value if isinstance(value, str) else None


def _arguments(arguments: Any) -> Any:
    """A function call's arguments: a shell call's command (``{"command": [..., "-lc", "pytest"]}``) as its text,
    else the decoded arguments."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return arguments
    if isinstance(arguments, dict) and "command" in arguments:
        command = _command(arguments["command"])
        rest = {k: v for k, v in arguments.items() if k not in ("command", "workdir", "timeout_ms", "timeout")}
        return command if not rest else {**rest, "command": command}
    return arguments


def _command(command: Any) -> Any:
    """``["bash", "-lc", "pytest -q"]`` → ``pytest -q``; another argv joined by spaces."""
    if isinstance(command, list) and all(isinstance(part, str) for part in command):
        if len(command) == 3 and command[1] in ("-lc", "-c"):
            return command[2]
        return " ".join(command)
    return command


def _output(output: Any) -> tuple[str, int | None]:
    """A call's output → (text, exit code): JSON ``{output, metadata{exit_code}}``, or text ``Exit code: N …``."""
    if isinstance(output, str):
        try:
            decoded = json.loads(output) if output.lstrip().startswith("{") else None
        except ValueError:
            decoded = None
        if isinstance(decoded, dict) and isinstance(decoded.get("output"), str):
            code = dig(decoded, "metadata", "exit_code")
            return decoded["output"], code if isinstance(code, int) and not isinstance(code, bool) else None
        found = _EXIT_CODE.match(output)
        return output, int(found.group(1)) if found else None
    if isinstance(output, dict) and isinstance(output.get("output"), str):
        return _output(json.dumps(output))
    return ("" if output is None else json.dumps(output, sort_keys=True)), None


FORMAT = Format(
    name=NAME, summary="Codex CLI rollouts (`rollout-*.jsonl`: `{timestamp, type, payload}` lines)",
    recognises_record=is_rollout_record, parse=parse_codex)
