"""Cline tasks: a task folder (``tasks/<task id>/`` in Cline's storage) whose ``api_conversation_history.json`` is
the run, beside ``ui_messages.json`` and ``task_metadata.json``.

Shapes, as read in Cline's source (``core/storage/disk.ts`` names the files; ``shared/ExtensionMessage.ts``,
``shared/messages/content.ts``, ``core/context/context-tracking/ContextTrackerTypes.ts``):

- ``api_conversation_history.json``: the conversation the model saw, a JSON list of Anthropic messages ``{role:
  user|assistant, content}`` (content a string or blocks: ``text``, ``image``, ``tool_use{id, name, input}``,
  ``tool_result{tool_use_id, content, is_error}``, ``thinking``), newer versions adding per message ``ts``,
  ``modelInfo{modelId, providerId, mode}`` and ``metrics{tokens{prompt, completion, cached}, cost}``. The first user
  message wraps the task in ``<task>…</task>`` and appends ``<environment_details>`` (its ``# Current Working
  Directory (<path>)``). Before native tool calling, the assistant wrote each call as XML in its text
  (``<execute_command><command>ls</command></execute_command>``) and Cline answered in the next user message
  with a text block ``[<tool> for '<what>'] Result:`` followed by the output.
- ``ui_messages.json``: what the user saw, ``{ts, type: say|ask, say|ask, text, …}``; the first is
  ``say: task`` (the task as typed), and each ``say: api_req_started`` holds a JSON text with the request's
  ``tokensIn``, ``tokensOut``, ``cacheReads``, ``cacheWrites`` and ``cost``.
- ``task_metadata.json``: ``model_usage[{ts, model_id, model_provider_id, mode}]``, ``files_in_context``,
  ``environment_history``.

Mapping, as for other sessions (Claude Code, Codex CLI): agent ``cline@<model>`` (the last model the metadata or
a message names; ``cline`` when none is); task :func:`~.model.task_from_prompt` of the task text in the working
directory; trial the task id (the folder's name); run id ``<agent>/<task>/<task id>``. Each assistant message
is an assistant transition per call (its thinking and text on the first; native ``tool_use`` blocks, else the
XML calls in its text), each tool result a tool transition (exit code 1 where it is an error), other user text a
user transition; the requests' tokens and cost summed in the run's metadata.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from kvjudge.errors import IngestError
from kvjudge.retention.ingest.format import Companion, Format, companion_data, json_object_reader
from kvjudge.retention.ingest.model import JsonPath, ParseContext, ParsedRun, assistant_blocks, content_text, dig
from kvjudge.retention.ingest.model import need, scalars, task_from_prompt, with_marker

NAME = "cline"
HISTORY = "api_conversation_history.json"
TASK_MARKER = "{{task}}"
_TASK = re.compile(r"<task>\n?(.*?)\n?</task>", re.DOTALL)
_CWD = re.compile(r"# Current Working Directory \((.+?)\)")
_RESULT = re.compile(r"^\[(\w+)(?: for .*)?\] Result:\s*$", re.DOTALL)
# Cline's tools before native tool calling, written as XML in the assistant's text.
_TOOLS = ("execute_command", "read_file", "write_to_file", "replace_in_file", "search_files", "list_files",
          "list_code_definition_names", "browser_action", "use_mcp_tool", "access_mcp_resource",
          "ask_followup_question", "attempt_completion", "new_task", "plan_mode_respond", "web_fetch",
          "load_mcp_documentation", "condense", "summarize_task", "report_bug", "new_rule")
_XML_CALL = re.compile(r"<(" + "|".join(_TOOLS) + r")>(.*?)</\1>", re.DOTALL)
_PARAMETER = re.compile(r"<(\w+)>\n?(.*?)\n?</\1>", re.DOTALL)


def is_cline_message(record: dict[str, Any]) -> bool:
    """The first message of a Cline conversation: a user message whose text holds the ``<task>`` Cline wraps the
    task in (or one carrying Cline's own ``modelInfo``/``metrics``)."""
    if record.get("role") != "user" or "type" in record:
        return False
    content = record.get("content")
    blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
    return isinstance(blocks, list) and (any(isinstance(b, dict) and isinstance(b.get("text"), str)
                                             and "<task>" in b["text"] for b in blocks)
                                         or "modelInfo" in record or "metrics" in record)


def _decoded(path: Path) -> list[Any]:
    """A companion holding a JSON list (``ui_messages.json``): the list, or an IngestError naming the file."""
    try:
        data = json.loads(path.read_bytes())
    except (OSError, ValueError) as exc:
        raise IngestError(f"{path}: not readable JSON ({exc}); is it a complete {path.name}?") from None
    if not isinstance(data, list):
        raise IngestError(f"{path}: must be a JSON list (Cline's UI messages)")
    return data


UI_MESSAGES = Companion("ui_messages.json", "the task as typed and each request's tokens and cost", _decoded)
METADATA = Companion("task_metadata.json", "the models the task used",
                     json_object_reader("Cline's task metadata, with model_usage"))
CONTEXT = Companion("context_history.json", "how Cline trimmed the context")


def parse_cline(obj: Any, context: ParseContext, document: Any = None) -> ParsedRun:
    """A Cline ``api_conversation_history.json`` (a list of messages) → ParsedRun (DocumentError naming ``$[i]``)."""
    need(isinstance(obj, list) and bool(obj), "$", "a Cline conversation is a non-empty list of messages")
    ui = (companion_data(document, UI_MESSAGES) if document is not None else None) or []
    usage = (companion_data(document, METADATA) if document is not None else None) or {}
    models = [entry.get("model_id") for entry in usage.get("model_usage") or () if isinstance(entry, dict)]
    models += [dig(message, "modelInfo", "modelId") for message in obj if isinstance(message, dict)]
    model = next((m for m in reversed(models) if isinstance(m, str) and m), None)
    agent = context.agent or (f"cline@{model}" if model else "cline")
    first = _text(obj[0]) if isinstance(obj[0], dict) else None
    typed = next((m.get("text") for m in ui if isinstance(m, dict) and m.get("say") == "task"), None)
    found = _TASK.search(first or "")
    prompt = typed if isinstance(typed, str) and typed else found.group(1) if found else None
    cwd = _CWD.search(first or "")
    task_id = document.source.path.parent.name if document is not None else None
    task = task_from_prompt(prompt, cwd.group(1) if cwd else None) or task_id or "task"
    trial = task_id or "task"
    run = context.new_run(f"{agent}/{task}/{trial}", NAME, agent=agent, grading_open=True)
    run.named = task_id is not None  # Cline's task id is its identity
    writer = _Writer(run, run.branch("main"), prompt)
    for index, message in enumerate(obj):
        writer.add(message, ("$", index))
    run.start(task_id=task, prompt=prompt, trial=trial, metadata=scalars({
        "format": NAME, "model": model, "cwd": cwd.group(1) if cwd else None, "harness": "Cline",
        **_requests(ui)}))
    return run


def _text(message: dict[str, Any]) -> str | None:
    """The text blocks of a message, joined."""
    content = message.get("content")
    blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
    if not isinstance(blocks, list):
        return None
    return "\n".join(t for b in blocks if isinstance(b, dict) and b.get("type") == "text"
                     and isinstance(t := b.get("text"), str)) or None


def _requests(ui: list[Any]) -> dict[str, Any]:
    """The model requests' totals from the UI messages' ``api_req_started`` entries."""
    totals = {"api_calls": 0, "tokens_in": 0, "tokens_out": 0, "cost": 0.0}
    for message in ui:
        if not (isinstance(message, dict) and message.get("say") == "api_req_started"):
            continue
        try:
            info = json.loads(message.get("text") or "")
        except (TypeError, ValueError, RecursionError):
            continue
        if not isinstance(info, dict):
            continue
        totals["api_calls"] += 1
        for ours, keys in (("tokens_in", ("tokensIn", "cacheReads", "cacheWrites")), ("tokens_out", ("tokensOut",)),
                           ("cost", ("cost",))):
            totals[ours] += sum(value for key in keys
                                if isinstance(value := info.get(key), int | float) and not isinstance(value, bool))
    return totals if totals["api_calls"] else {}


class _Writer:
    """Messages → transitions: native and XML tool calls, their results named by the call they answer."""

    def __init__(self, run: ParsedRun, branch: str, prompt: str | None) -> None:
        self.run, self.branch, self.prompt = run, branch, prompt
        self.prompted = False
        self.names: dict[str, str] = {}

    def add(self, message: Any, where: JsonPath) -> None:
        need(isinstance(message, dict), where, "a message must be an object")
        role = message.get("role")
        need(role in ("user", "assistant"), (*where, "role"), "must be user or assistant")
        content = message.get("content")
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        need(isinstance(blocks, list), (*where, "content"), "must be a string or a list of content blocks")
        for number, block in enumerate(blocks):
            need(isinstance(block, dict), (*where, "content", number), "must be a content block object")
        if role == "assistant":
            self._assistant(message, blocks, (*where, "content"))
        else:
            self._user(blocks, (*where, "content"))

    def _assistant(self, message: dict[str, Any], blocks: list[dict[str, Any]], where: JsonPath) -> None:
        texts, calls = assistant_blocks(blocks, where, self.names)
        text = "\n\n".join(t for t in texts if t) or None
        if not calls and text:
            calls = [(found.group(1), dict(_PARAMETER.findall(found.group(2)))) for found in _XML_CALL.finditer(text)]
        tokens = dig(message, "metrics", "tokens")
        usage = {"input_tokens": tokens["prompt"], "output_tokens": tokens["completion"]} if isinstance(tokens, dict) \
            and all(isinstance(tokens.get(k), int) and not isinstance(tokens.get(k), bool) and tokens[k] >= 0
                    for k in ("prompt", "completion")) else None
        for number in range(max(1, len(calls))):
            self.run.step(self.branch, "assistant", text=text if number == 0 else None,
                          call=calls[number] if calls else None, usage=usage if number == 0 else None)

    def _user(self, blocks: list[dict[str, Any]], where: JsonPath) -> None:
        texts: list[str] = []
        result: str | None = None  # the tool a "[tool for …] Result:" block named: the next text is its output
        for number, block in enumerate(blocks):
            if block.get("type") == "tool_result":
                output = block.get("content")
                text = output if output is None or isinstance(output, str) else \
                    content_text(output, (*where, number, "content"))
                call = block.get("tool_use_id")
                name = self.names.get(call, "tool") if isinstance(call, str) else "tool"
                self.run.step(self.branch, "tool", output=(name, text or "", 1 if block.get("is_error") is True
                                                           else None))
                continue
            text = content_text([block], (*where, number)) or ""
            if result is not None:
                self.run.step(self.branch, "tool", output=(result, text, None))
                result = None
            elif found := _RESULT.match(text):
                result = found.group(1)
            else:
                texts.append(text)
        if result is not None:
            self.run.step(self.branch, "tool", output=(result, "", None))
        text = "\n".join(t for t in texts if t)
        if not text:
            return
        if not self.prompted and self.prompt:
            self.prompted = True
            text = with_marker(text, self.prompt, TASK_MARKER)
        self.run.step(self.branch, "user", text=text)


FORMAT = Format(
    name=NAME, summary="Cline task folders (`api_conversation_history.json` beside `ui_messages.json` and "
                       "`task_metadata.json`)",
    recognises_record=is_cline_message, parse=parse_cline, files=(HISTORY,),
    companions=(UI_MESSAGES, METADATA, CONTEXT))
