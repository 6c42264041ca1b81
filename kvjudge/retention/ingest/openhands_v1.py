"""OpenHands V1 conversations (the software-agent SDK): typed events, as an event stream (JSONL, one event per
line), a saved trajectory (one JSON array of events) or an ``events/`` folder; also the ``history`` of a V1
evaluation's output.jsonl.

Shape, as the SDK serialises its events (``openhands.sdk.event``): every event has ``kind``, ``id``,
``timestamp`` and ``source`` (``agent``, ``user``, ``environment``). ``SystemPromptEvent{system_prompt{text},
tools}``; ``MessageEvent{llm_message{role, content[{type: text, text}]}}``; ``ActionEvent{thought[{text}],
reasoning_content, action{kind, …} (the tool's arguments: ``command`` of a terminal action, ``message`` of a
``FinishAction``), tool_name, tool_call_id, tool_call{name, arguments}, llm_response_id}``;
``ObservationEvent{observation{kind, content[{text}] or output, exit_code | metadata.exit_code}, action_id,
tool_name, tool_call_id}``; ``AgentErrorEvent{tool_name, tool_call_id, error}``; ``UserRejectObservation
{rejection_reason}``; the condenser's ``Condensation{forgotten_event_ids, summary}`` and
``CondensationSummaryEvent{summary}``; ``CondensationRequest``, ``PauseEvent`` and
``ConversationStateUpdateEvent`` are the controller's own.

A conversation persisted event by event (``<conversation>/events/event-<n>-<id>.json``, or — as the OpenHands CLI
keeps them, in OpenHands-CLI's ``tests/trajectories/<name>/`` — a folder of nothing but such files) is read as one
run, its events in order. Mapping: a conversation is a run. Agent ``openhands@<model>`` (the model of ``base_state.json`` beside the events,
``agent.llm.model``, when there is one); trial the file's stem (the conversation); task
:func:`~.model.task_from_prompt` of the first user message; run id ``<agent>/<task>/<conversation>``. Each action
an assistant transition (its thought and reasoning as text, the call with its arguments: a command for a terminal
action, a ``finish`` call with its message), each observation a tool transition with its exit code, an agent
error a tool transition too; condensations change what the model saw, not what happened: counted in the
metadata, their summaries not imported as turns.
"""

from __future__ import annotations

from typing import Any

from kvjudge.retention.ingest.format import Companion, Format, companion_data, json_object_reader
from kvjudge.retention.ingest.model import DocumentError, JsonPath, ParseContext, ParsedRun, content_text, dig
from kvjudge.retention.ingest.model import need, scalars, subpath, task_from_prompt, with_marker

NAME = "openhands-v1"
TASK_MARKER = "{{task}}"
_EVENT_KINDS = frozenset({"SystemPromptEvent", "MessageEvent", "ActionEvent", "ObservationEvent", "AgentErrorEvent",
                          "UserRejectObservation", "Condensation", "CondensationRequest", "CondensationSummaryEvent",
                          "PauseEvent", "ConversationStateUpdateEvent", "ConversationErrorEvent"})
_CONDENSATIONS = frozenset({"Condensation", "CondensationSummaryEvent"})
#: Action fields that say how the SDK ran a call, not what the agent asked for.
_BOOKKEEPING = frozenset({"kind", "security_risk", "thought", "summary"})


def is_event(record: dict[str, Any]) -> bool:
    """One V1 event: a known ``kind`` beside its ``source``."""
    kind = record.get("kind")
    return isinstance(kind, str) and kind in _EVENT_KINDS and "source" in record


BASE_STATE = Companion("base_state.json", "the conversation's agent and model",
                       json_object_reader("an OpenHands conversation's state, with agent.llm.model"))


def parse_openhands_v1(obj: Any, context: ParseContext, document: Any = None) -> ParsedRun:
    """A V1 event stream or saved trajectory (a list of events) → ParsedRun (DocumentError naming ``$[i]``)."""
    need(isinstance(obj, list) and bool(obj), "$", "an OpenHands V1 conversation is a list of events")
    state = companion_data(document, BASE_STATE) if document is not None else None
    model = dig(state, "agent", "llm", "model")
    agent = context.agent or (f"openhands@{model}" if isinstance(model, str) and model else "openhands")
    conversation = _stem(document) or (obj[0].get("id") if isinstance(obj[0], dict) else None) or "conversation"
    prompt = first_prompt(obj, "$")
    task = task_from_prompt(prompt, None) or conversation
    run = context.new_run(f"{agent}/{task}/{conversation}", NAME, agent=agent, grading_open=True)
    writer = EventWriter(run, run.branch("main"), prompt)
    for index, event in enumerate(obj):
        writer.add(event, ("$", index))
    run.start(task_id=task, prompt=prompt, trial=conversation, metadata=scalars({
        "format": NAME, "model": model, "harness": "OpenHands V1", "condensations": writer.condensations or None}))
    return run


def _stem(document: Any) -> str | None:
    """The conversation a file names: its stem; for an ``events/`` folder the folder above it, for a folder of
    event files the folder itself."""
    if document is None:
        return None
    if document.source.path.is_dir():  # its events, one per file: the conversation's folder
        folder = document.source.path
        return (folder.parent.name if folder.name == "events" else folder.name) or None
    name = document.source.name
    for suffix in (".jsonl", ".json"):
        if name.endswith(suffix):
            return name[: -len(suffix)] or None
    return name or None


def first_prompt(events: list[Any], base: JsonPath) -> str | None:
    """The text of the first user message among ``events``."""
    for index, event in enumerate(events):
        if isinstance(event, dict) and event.get("kind") == "MessageEvent" and event.get("source") == "user":
            return _message_text(event, subpath(base, index))
    return None


def _message_text(event: dict[str, Any], where: JsonPath) -> str | None:
    return content_text(dig(event, "llm_message", "content"), subpath(where, "llm_message", "content"))


class EventWriter:
    """V1 events → transitions, calls named by their tool call ids; condensations counted."""

    def __init__(self, run: ParsedRun, branch: str, prompt: str | None) -> None:
        self.run = run
        self.branch = branch
        self.prompt = prompt
        self.prompted = False
        self.condensations = 0

    def add(self, event: Any, where: JsonPath) -> None:
        need(isinstance(event, dict), where, "an event must be an object")
        kind = event.get("kind")
        if not isinstance(kind, str):
            raise DocumentError(subpath(where, "kind"), "missing (every V1 event names its kind)")
        if kind == "SystemPromptEvent":
            self.run.step(self.branch, "system", text=_text_of(event.get("system_prompt"), subpath(where,
                                                                                                     "system_prompt")))
        elif kind == "MessageEvent":
            text = _message_text(event, where) or ""
            if event.get("source") == "user":
                if not self.prompted and text == self.prompt:
                    self.prompted = True
                    text = with_marker(text, self.prompt, TASK_MARKER)
                self.run.step(self.branch, "user", text=text)
            else:
                self.run.step(self.branch, "assistant", text=text)
        elif kind == "ActionEvent":
            self._action(event, where)
        elif kind in ("ObservationEvent", "AgentErrorEvent", "UserRejectObservation"):
            self._observation(kind, event, where)
        elif kind in _CONDENSATIONS:
            self.condensations += 1

    def _action(self, event: dict[str, Any], where: JsonPath) -> None:
        parts = event.get("thought") if isinstance(event.get("thought"), list) else []
        thought = "\n".join(t for part in parts if isinstance(part, dict) and isinstance(t := part.get("text"), str))
        reasoning = event.get("reasoning_content") if isinstance(event.get("reasoning_content"), str) else ""
        text = "\n\n".join(t for t in (reasoning, thought) if t) or None
        action = event.get("action") if isinstance(event.get("action"), dict) else {}
        name = event.get("tool_name") if isinstance(event.get("tool_name"), str) else \
            dig(event, "tool_call", "name") if isinstance(dig(event, "tool_call", "name"), str) else action.get("kind")
        need(isinstance(name, str), subpath(where, "tool_name"), "missing (an action names its tool)")
        if action.get("kind") == "FinishAction":
            name = "finish"
        self.run.step(self.branch, "assistant", text=text, call=(name, _arguments(action, event)))

    def _observation(self, kind: str, event: dict[str, Any], where: JsonPath) -> None:
        name = event.get("tool_name") if isinstance(event.get("tool_name"), str) else "tool"
        if kind == "AgentErrorEvent":
            self.run.step(self.branch, "tool", output=(name, str(event.get("error") or ""), 1))
            return
        if kind == "UserRejectObservation":
            self.run.step(self.branch, "tool", output=(name, str(event.get("rejection_reason") or "rejected"), None))
            return
        observation = event.get("observation")
        need(isinstance(observation, dict), subpath(where, "observation"), "must be an object")
        content = observation.get("content")
        text = _text_of(content, subpath(where, "observation", "content")) if content is not None else \
            observation.get("output") if isinstance(observation.get("output"), str) else ""
        code = observation.get("exit_code", dig(observation, "metadata", "exit_code"))
        code = code if isinstance(code, int) and not isinstance(code, bool) and code != -1 else None
        self.run.step(self.branch, "tool", output=(name, text or "", code))


def _text_of(value: Any, where: JsonPath) -> str | None:
    """A V1 text field: a string, a TextContent object, or a list of them."""
    if isinstance(value, dict):
        value = [value]
    return content_text(value, where)


def _arguments(action: dict[str, Any], event: dict[str, Any]) -> Any:
    """What the agent asked for: a terminal action's command, a finish's message, else the action's fields (or
    the tool call's arguments when the action is missing)."""
    for key in ("command", "message"):
        if isinstance(action.get(key), str) and set(action) - _BOOKKEEPING <= {key, "is_input", "timeout", "reset"}:
            return action[key]
    kept = {k: v for k, v in action.items() if k not in _BOOKKEEPING and v not in (None, "", [], {})}
    return kept or dig(event, "tool_call", "arguments")


FORMAT = Format(
    name=NAME, summary="OpenHands V1 event streams (JSONL) and saved trajectories (a JSON list of typed events)",
    recognises_record=is_event, parse=parse_openhands_v1, files=("*.jsonl",), companions=(BASE_STATE,),
    marks=("event-*.json",))
