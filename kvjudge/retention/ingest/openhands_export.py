"""OpenHands conversation exports: one conversation's event stream saved as a JSON list — the web app's trajectory
download, the files the trajectory visualizer (OpenHands/trajectory-visualizer) opens, such as its ``demo1.json``.

Shape, as read in the visualizer's sample, its upload code (``App.tsx``: a JSON array whose first item has
``source`` beside ``action`` or ``observation``, or an object whose ``history`` is that array) and OpenHands' event
serialization (the same events an evaluation's ``history`` holds, :mod:`.openhands`): a list of events, each with
an integer ``id``, a ``timestamp``, a ``source`` (``user``, ``agent``, ``environment``) and a ``message``; an
action has ``action`` (``message``, ``run``, ``edit``, ``finish``, ``change_agent_state``, …) and ``args``, an
observation ``observation`` (``run``, ``edit``, ``agent_state_changed``, ``null``, …), ``content``, ``extras`` and
``cause`` (the id of the action it answers); a call made through function calling carries ``tool_call_metadata``
(``function_name``, ``tool_call_id``, and ``model_response`` — the model's whole reply, whose ``model`` names the
model). No task or instance is named: it is a conversation, not an evaluation.

Mapping, as for other conversations (:mod:`.openhands_v1`, Claude Code): agent ``openhands@<model>`` (the first
model reply's model; ``openhands`` when none is named); task :func:`~.model.task_from_prompt` of the first user
message; trial the conversation's first ``timestamp`` (the file's stem when it has none), so one export saved
under two names is one run; run id ``<agent>/<task>/<trial>``. The events become transitions as an evaluation's
history does (:class:`.openhands.History`): each call an assistant transition, each observation a tool transition
with its exit code, the controller's bookkeeping left out.
"""

from __future__ import annotations

from typing import Any

from kvjudge.retention.ingest.format import Format
from kvjudge.retention.ingest.model import ParseContext, ParsedRun, content_text, dig, need, scalars
from kvjudge.retention.ingest.model import task_from_prompt
from kvjudge.retention.ingest.openhands import HARNESS, History
from kvjudge.retention.ingest.trials import clean

NAME = "openhands-export"
_SOURCES = frozenset({"user", "agent", "environment"})


def is_export_event(record: dict[str, Any]) -> bool:
    """One event of an exported conversation: an integer ``id``, a known ``source``, an action or observation."""
    event_id = record.get("id")
    source = record.get("source")
    return (isinstance(event_id, int) and not isinstance(event_id, bool) and isinstance(source, str)
            and source in _SOURCES and (isinstance(record.get("action"), str)
                                        or isinstance(record.get("observation"), str)))


def is_wrapped_export(obj: dict[str, Any]) -> bool:
    """An export wrapped in an object: ``{"history": [events]}`` (the other shape the visualizer opens)."""
    history = obj.get("history")
    return isinstance(history, list) and bool(history) and isinstance(history[0], dict) \
        and is_export_event(history[0]) and "instance_id" not in obj and "instance" not in obj


def parse_openhands_export(obj: Any, context: ParseContext, document: Any = None) -> ParsedRun:
    """An exported conversation (a list of events, or ``{"history": [events]}``) → ParsedRun (DocumentError naming
    ``$[i]``)."""
    base = "$"
    if isinstance(obj, dict):
        obj, base = obj.get("history"), "$.history"
    need(isinstance(obj, list) and bool(obj), base, "an OpenHands conversation export is a list of events")
    model = next((found for event in obj if isinstance(found := dig(event, "tool_call_metadata", "model_response",
                                                                     "model"), str) and found), None)
    agent = context.agent or (f"openhands@{model}" if model else "openhands")
    prompt = _first_prompt(obj, base)
    started = obj[0].get("timestamp") if isinstance(obj[0], dict) else None
    conversation = clean(started) if isinstance(started, str) and clean(started) else _stem(document) or "conversation"
    task = task_from_prompt(prompt, None) or conversation
    run = context.new_run(f"{agent}/{task}/{conversation}", NAME, agent=agent, grading_open=True)
    run.named = isinstance(started, str)  # the conversation's start is its identity
    history = History(run, run.branch("main"), prompt, {})
    for index, event in enumerate(obj):
        history.add(event, (base, index))
    run.start(task_id=task, prompt=prompt, trial=conversation,
              metadata=scalars({"format": NAME, "model": model, "harness": HARNESS}))
    return run


def _first_prompt(events: list[Any], base: str) -> str | None:
    """The text of the first message the user sent."""
    for index, event in enumerate(events):
        if isinstance(event, dict) and event.get("action") == "message" and event.get("source") == "user":
            args = event.get("args") if isinstance(event.get("args"), dict) else {}
            return content_text(args.get("content"), (base, index, "args", "content"))
    return None


def _stem(document: Any) -> str | None:
    name = document.source.name if document is not None else ""
    return name[: -len(".json")] if name.endswith(".json") and len(name) > len(".json") else name or None


FORMAT = Format(
    name=NAME, summary="OpenHands conversation exports (a JSON list of events: the web app's trajectory download, "
                       "the trajectory visualizer's files)",
    recognises=is_wrapped_export, recognises_record=is_export_event, parse=parse_openhands_export)
