"""OpenAI chat format: ``{"messages": [...], "id"?: …, "agent"?: …}`` → a one-branch run, landing ungraded."""

from __future__ import annotations

import hashlib
from typing import Any

from kvjudge.retention.ingest.format import Format
from kvjudge.retention.ingest.model import (
    ROLES,
    DocumentError,
    JsonPath,
    ParseContext,
    ParsedRun,
    content_text,
    need,
    subpath,
)


def parse_openai(obj: Any, context: ParseContext, text: str) -> ParsedRun:
    """One chat-format document → ParsedRun. Without an ``id``, the id derives from the document's ``text``
    (its line, decoded with ``surrogateescape``: the same bytes name the same run, repaired or not)."""
    need(isinstance(obj, dict), "$", "an OpenAI chat document must be a JSON object")
    messages = obj.get("messages")
    need(isinstance(messages, list) and len(messages) > 0, "$.messages",
         'expected an OpenAI chat line with "messages" (a non-empty list)')
    run_id = obj.get("id")
    if run_id is None:
        # Derived from the content so importing the same file twice names the same runs.
        run_id = "chat-" + hashlib.sha256(text.strip().encode("utf-8", "surrogateescape")).hexdigest()[:16]
    need(isinstance(run_id, str) and run_id.strip() != "", "$.id", "must be a non-empty string")
    agent = obj.get("agent")
    need(agent is None or (isinstance(agent, str) and agent != ""), "$.agent", "must be a non-empty string")
    run = context.new_run(run_id, "openai", agent=agent, grading_open=True)
    run.named = True  # its id, or one derived from its text
    run.start(task_id=None, prompt=None)
    branch = run.branch("main")
    call_names: dict[str, str] = {}
    for index, message in enumerate(messages):
        where = ("$.messages", index)
        need(isinstance(message, dict), where, "must be an object")
        role = message.get("role")
        if role not in ROLES:
            raise DocumentError((*where, "role"), f"must be one of {', '.join(ROLES)}")
        text = content_text(message.get("content"), (*where, "content"))
        if role == "tool":
            name = message.get("name") or call_names.get(str(message.get("tool_call_id")))
            run.step(branch, role, output=(name, text or "", None))
            continue
        calls = parse_tool_calls(message.get("tool_calls"), (*where, "tool_calls"), call_names)
        # One transition per tool call; the message text rides on the first.
        for c_index in range(max(1, len(calls))):
            run.step(branch, role, text=text if c_index == 0 else None, call=calls[c_index] if calls else None)
    return run


def parse_tool_calls(calls: Any, path: JsonPath, call_names: dict[str, str] | None = None) -> list[tuple[str, Any]]:
    """``tool_calls`` of a chat message → ``[(name, arguments)]``; records ``id → name`` in ``call_names``."""
    if calls is None:
        return []
    need(isinstance(calls, list), path, "must be a list")
    parsed = []
    for index, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if not (isinstance(function, dict) and isinstance(function.get("name"), str)):
            raise DocumentError(subpath(path, index, "function"), "needs a string name")
        if call_names is not None and isinstance(call.get("id"), str):
            call_names[call["id"]] = function["name"]
        parsed.append((function["name"], function.get("arguments")))
    return parsed


FORMAT = Format(
    name="openai", summary="OpenAI chat lines (`messages`, `tool_calls`), each a run landing ungraded",
    recognises=lambda obj: "messages" in obj,
    parse=lambda obj, context, document: parse_openai(obj, context, document.text))
