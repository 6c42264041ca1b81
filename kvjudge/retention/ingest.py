"""Import runs from JSONL: the native format (``kvjudge/schemas/run.schema.json``) or OpenAI chat format.

Parsing is pure: each line becomes a :class:`ParsedRun` — the bodies to put and the events to append.
Text never enters an event; events carry ``sha256:`` refs. A malformed line is an
:class:`~kvjudge.errors.IngestError` naming the file, the line and the field.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvjudge.errors import IngestError, RunStateError
from kvjudge.retention import events as ev
from kvjudge.retention.blobs import ref_of
from kvjudge.retention.events import canonical_json
from kvjudge.retention.lifecycle import GRADING, RUNNING, UNGRADED, check_path
from kvjudge.retention.text_check import TextError, parse_checked

FORMATS = ("native", "openai")
DEFAULT_TENANT = "default"

_RUN_KEYS = {"id", "tenant", "task", "lifecycle", "branches", "verifier", "grades"}
_BRANCH_KEYS = {"id", "status", "parent", "fork_at", "transitions"}
_TRANSITION_KEYS = {"role", "text", "tool_call", "tool_output", "usage", "context"}
_ROLES = {"system", "developer", "user", "assistant", "tool"}


@dataclass
class ParsedRun:
    """One run ready to write: its bodies (to put first) and its events (to append, in order)."""

    run_id: str
    tenant: str
    bodies: list[bytes] = field(default_factory=list)
    events: list[ev.Event] = field(default_factory=list)

    def body_ref(self, text: str | None) -> str | None:
        """Register ``text`` as a body and return its ref (None stays None)."""
        if text is None:
            return None
        raw = text.encode("utf-8")
        self.bodies.append(raw)
        return ref_of(raw)


class _LineError(Exception):
    """A problem in one line; turned into an IngestError with the file and line number."""


def _need(cond: bool, message: str) -> None:
    if not cond:
        raise _LineError(message)


def _opt_str(obj: dict[str, Any], key: str, where: str) -> str | None:
    value = obj.get(key)
    _need(value is None or isinstance(value, str), f"{where}.{key} must be a string or null")
    return value


def _int_map(value: Any, where: str) -> dict[str, int] | None:
    if value is None:
        return None
    _need(isinstance(value, dict), f"{where} must be an object of token counts")
    for key, number in value.items():
        _need(isinstance(number, int) and not isinstance(number, bool) and number >= 0,
              f"{where}.{key} must be a non-negative integer")
    return dict(value)


def _known_keys(obj: dict[str, Any], allowed: set[str], where: str) -> None:
    extra = sorted(set(obj) - allowed)
    _need(not extra, f"{where} has unknown field(s) {', '.join(extra)} (allowed: {', '.join(sorted(allowed))})")


def detect_format(obj: Any) -> str:
    """``openai`` for ``{"messages": [...]}`` lines, else ``native``."""
    if isinstance(obj, dict) and "messages" in obj and "branches" not in obj:
        return "openai"
    return "native"


def parse_native(obj: Any, tenant: str | None) -> ParsedRun:
    """A native run object → ParsedRun (raises _LineError)."""
    _need(isinstance(obj, dict), "a native run must be a JSON object")
    _known_keys(obj, _RUN_KEYS, "run")
    run_id = obj.get("id")
    _need(isinstance(run_id, str) and run_id.strip() != "", "run.id must be a non-empty string")
    run_tenant = _opt_str(obj, "tenant", "run") or tenant or DEFAULT_TENANT
    run = ParsedRun(run_id=run_id, tenant=run_tenant)

    task = obj.get("task") or {}
    _need(isinstance(task, dict), "run.task must be an object")
    _known_keys(task, {"id", "prompt"}, "run.task")
    task_id = _opt_str(task, "id", "run.task")
    prompt_ref = run.body_ref(_opt_str(task, "prompt", "run.task"))

    lifecycle = obj.get("lifecycle", [RUNNING])
    _need(isinstance(lifecycle, list) and all(isinstance(s, str) for s in lifecycle),
          "run.lifecycle must be a list of states")
    try:
        check_path(lifecycle)
    except RunStateError as exc:
        raise _LineError(f"run.lifecycle: {exc}") from exc

    branches = obj.get("branches")
    _need(isinstance(branches, list) and branches, "run.branches must be a non-empty list")
    run.events.append(ev.RunStarted(run=run_id, tenant=run_tenant, task_id=task_id, task_prompt_ref=prompt_ref))
    seen: dict[str, int] = {}
    for b_index, branch in enumerate(branches):
        where = f"branches[{b_index}]"
        _need(isinstance(branch, dict), f"{where} must be an object")
        _known_keys(branch, _BRANCH_KEYS, where)
        branch_id = branch.get("id")
        _need(isinstance(branch_id, str) and branch_id != "", f"{where}.id must be a non-empty string")
        _need(branch_id not in seen, f"{where}.id {branch_id!r} is used twice")
        status = branch.get("status", "live")
        _need(status in ("live", "dead"), f"{where}.status must be 'live' or 'dead'")
        parent = _opt_str(branch, "parent", where)
        _need(parent is None or parent in seen, f"{where}.parent {parent!r} must name an earlier branch")
        fork_at = branch.get("fork_at")
        _need(fork_at is None or (isinstance(fork_at, int) and not isinstance(fork_at, bool) and fork_at >= 0),
              f"{where}.fork_at must be a non-negative integer or null")
        transitions = branch.get("transitions", [])
        _need(isinstance(transitions, list), f"{where}.transitions must be a list")
        seen[branch_id] = len(transitions)
        run.events.append(ev.BranchOpened(run=run_id, branch=branch_id, status=status, parent=parent,
                                          fork_at=fork_at))
        for t_index, transition in enumerate(transitions):
            run.events.append(_parse_transition(run, branch_id, t_index, transition,
                                                f"{where}.transitions[{t_index}]"))

    verifier = obj.get("verifier", [])
    _need(isinstance(verifier, list), "run.verifier must be a list")
    for index, result in enumerate(verifier):
        _need(isinstance(result, dict) and isinstance(result.get("name"), str)
              and isinstance(result.get("passed"), bool),
              f"verifier[{index}] needs a string name and a boolean passed")
    grades = obj.get("grades", [])
    _need(isinstance(grades, list), "run.grades must be a list")
    for index, grade in enumerate(grades):
        score = grade.get("score") if isinstance(grade, dict) else None
        _need(isinstance(grade, dict) and isinstance(grade.get("grader"), str)
              and isinstance(score, int | float) and not isinstance(score, bool),
              f"grades[{index}] needs a string grader and a numeric score")

    # Verifier results and grades are facts of the grading step: they follow the move to grading.
    facts = [ev.VerifierRecorded(run=run_id, result=r) for r in verifier]
    facts += [ev.GradeRecorded(run=run_id, grade=g) for g in grades]
    if GRADING not in lifecycle:
        run.events.extend(facts)
    for state in lifecycle[1:]:
        run.events.append(ev.StateChanged(run=run_id, state=state))
        if state == GRADING:
            run.events.extend(facts)
    return run


def _parse_transition(run: ParsedRun, branch_id: str, seq: int, obj: Any, where: str) -> ev.TransitionRecorded:
    _need(isinstance(obj, dict), f"{where} must be an object")
    _known_keys(obj, _TRANSITION_KEYS, where)
    role = obj.get("role")
    _need(role in _ROLES, f"{where}.role must be one of {', '.join(sorted(_ROLES))}")
    text_ref = run.body_ref(_opt_str(obj, "text", where))
    tool_call = obj.get("tool_call")
    call = None
    if tool_call is not None:
        _need(isinstance(tool_call, dict) and isinstance(tool_call.get("name"), str),
              f"{where}.tool_call needs a string name")
        _known_keys(tool_call, {"name", "arguments"}, f"{where}.tool_call")
        arguments = tool_call.get("arguments")
        if arguments is not None and not isinstance(arguments, str):
            arguments = canonical_json(arguments)  # structured arguments are kept as their canonical JSON text
        call = {"name": tool_call["name"], "arguments_ref": run.body_ref(arguments)}
    tool_output = obj.get("tool_output")
    output = None
    if tool_output is not None:
        _need(isinstance(tool_output, dict), f"{where}.tool_output must be an object")
        _known_keys(tool_output, {"name", "output", "exit_code"}, f"{where}.tool_output")
        exit_code = tool_output.get("exit_code")
        _need(exit_code is None or (isinstance(exit_code, int) and not isinstance(exit_code, bool)),
              f"{where}.tool_output.exit_code must be an integer or null")
        output = {"name": _opt_str(tool_output, "name", f"{where}.tool_output"),
                  "output_ref": run.body_ref(_opt_str(tool_output, "output", f"{where}.tool_output")),
                  "exit_code": exit_code}
    return ev.TransitionRecorded(run=run.run_id, branch=branch_id, seq=seq, role=role, text_ref=text_ref,
                                 tool_call=call, tool_output=output, usage=_int_map(obj.get("usage"), f"{where}.usage"),
                                 context=_int_map(obj.get("context"), f"{where}.context"))


def _content_text(content: Any, where: str) -> str | None:
    if content is None or isinstance(content, str):
        return content
    _need(isinstance(content, list), f"{where}.content must be a string, null or a list of text parts")
    texts = []
    for index, part in enumerate(content):
        _need(isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str),
              f"{where}.content[{index}] must be a text part ({{\"type\": \"text\", \"text\": …}})")
        texts.append(part["text"])
    return "".join(texts)


def parse_openai(obj: Any, tenant: str | None, raw_line: str) -> ParsedRun:
    """An OpenAI chat-format line → a one-branch run that lands as Ungraded."""
    _need(isinstance(obj, dict), "an OpenAI chat line must be a JSON object")
    messages = obj.get("messages")
    _need(isinstance(messages, list) and messages, "messages must be a non-empty list")
    run_id = obj.get("id")
    if run_id is None:
        # Derived from the line's content so importing the same file twice names the same runs.
        run_id = "chat-" + hashlib.sha256(raw_line.strip().encode("utf-8", "surrogateescape")).hexdigest()[:16]
    _need(isinstance(run_id, str) and run_id.strip() != "", "id must be a non-empty string")
    run = ParsedRun(run_id=run_id, tenant=tenant or DEFAULT_TENANT)
    run.events.append(ev.RunStarted(run=run_id, tenant=run.tenant, task_id=None, task_prompt_ref=None))
    run.events.append(ev.BranchOpened(run=run_id, branch="main", status="live", parent=None, fork_at=None))
    call_names: dict[str, str] = {}
    seq = 0
    for index, message in enumerate(messages):
        where = f"messages[{index}]"
        _need(isinstance(message, dict), f"{where} must be an object")
        role = message.get("role")
        _need(role in _ROLES, f"{where}.role must be one of {', '.join(sorted(_ROLES))}")
        text = _content_text(message.get("content"), where)
        if role == "tool":
            name = message.get("name") or call_names.get(str(message.get("tool_call_id")))
            output = {"name": name, "output_ref": run.body_ref(text or ""), "exit_code": None}
            run.events.append(ev.TransitionRecorded(run=run_id, branch="main", seq=seq, role=role, text_ref=None,
                                                    tool_call=None, tool_output=output, usage=None, context=None))
            seq += 1
            continue
        calls = message.get("tool_calls") or []
        _need(isinstance(calls, list), f"{where}.tool_calls must be a list")
        parsed_calls = []
        for c_index, call in enumerate(calls):
            function = call.get("function") if isinstance(call, dict) else None
            _need(isinstance(function, dict) and isinstance(function.get("name"), str),
                  f"{where}.tool_calls[{c_index}].function needs a string name")
            arguments = function.get("arguments")
            if arguments is not None and not isinstance(arguments, str):
                arguments = canonical_json(arguments)
            if isinstance(call.get("id"), str):
                call_names[call["id"]] = function["name"]
            parsed_calls.append((function["name"], arguments))
        # One transition per tool call; the message text rides on the first.
        for c_index in range(max(1, len(parsed_calls))):
            tool_call = None
            if parsed_calls:
                name, arguments = parsed_calls[c_index]
                tool_call = {"name": name, "arguments_ref": run.body_ref(arguments)}
            text_ref = run.body_ref(text) if c_index == 0 else None
            run.events.append(ev.TransitionRecorded(run=run_id, branch="main", seq=seq, role=role, text_ref=text_ref,
                                                    tool_call=tool_call, tool_output=None, usage=None, context=None))
            seq += 1
    run.events.append(ev.StateChanged(run=run_id, state=GRADING))
    run.events.append(ev.StateChanged(run=run_id, state=UNGRADED))
    return run


def iter_parsed(path: str | os.PathLike[str], tenant: str | None = None, fmt: str | None = None,
                exists: Callable[[str], bool] | None = None, repair_text: bool = False) -> Iterator[ParsedRun]:
    """Parse ``path`` line by line (streamed). ``exists(run_id)`` flags ids already in the store.

    Text that is not Unicode is refused, or with ``repair_text`` stored as U+FFFD (see text_check).
    """
    source = Path(path)
    if fmt is not None and fmt not in FORMATS:
        raise IngestError(f"unknown format {fmt!r}; use one of {', '.join(FORMATS)} (or omit --format to detect)")
    if not source.is_file():
        raise IngestError(f"{source} does not exist or is not a file; pass a JSONL file of runs")
    chosen = fmt
    ids: set[str] = set()
    with source.open("rb") as handle:
        for number, raw in enumerate(handle, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                if not repair_text:
                    raise IngestError(f"{source}:{number}: not UTF-8 ({exc.reason} at byte {exc.start}; inside a "
                                      f"string, --repair-text stores U+FFFD in its place); nothing of this line was "
                                      f"written") from exc
                line = raw.decode("utf-8", "surrogateescape")  # bad bytes → lone surrogates, repaired by text_check
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise IngestError(f"{source}:{number}: not valid JSON ({exc.msg} at column {exc.colno}); "
                                  f"nothing of this line was written") from exc
            except (ValueError, RecursionError) as exc:  # an integer of > 4300 digits; nesting ~1000 deep
                raise IngestError(f"{source}:{number}: not valid JSON for kvjudge ({str(exc).split(';')[0]}); "
                                  f"nothing of this line was written") from None
            if chosen is None:
                chosen = detect_format(obj)
            try:
                if chosen == "openai":
                    _need(detect_format(obj) == "openai", "expected an OpenAI chat line with \"messages\"")
                    run = parse_checked(obj, lambda doc: parse_openai(doc, tenant, line), repair_text=repair_text)
                else:
                    run = parse_checked(obj, lambda doc: parse_native(doc, tenant), repair_text=repair_text)
                _need(run.run_id not in ids, f"run id {run.run_id!r} appears twice in the file")
                _need(exists is None or not exists(run.run_id), f"run {run.run_id!r} is already in the store")
            except (_LineError, TextError) as exc:
                raise IngestError(f"{source}:{number}: {exc} ({chosen} format); nothing of this line was written") from None
            ids.add(run.run_id)
            yield run


def parse_file(path: str | os.PathLike[str], tenant: str | None = None, fmt: str | None = None,
               exists: Callable[[str], bool] | None = None, repair_text: bool = False) -> Iterator[ParsedRun]:
    """Check the whole file first (IngestError on the first bad line), then stream its runs again."""
    for _ in iter_parsed(path, tenant, fmt, exists, repair_text):
        pass
    return iter_parsed(path, tenant, fmt, exists, repair_text)
