"""OpenHands runs: the SWE-bench evaluation's ``output.jsonl`` lines and its ``llm_completions`` logs.

Shapes, as OpenHands writes them (``evaluation/benchmarks/swe_bench/run_infer.py``, the event serialization,
``openhands/llm/llm.py``):

- **output.jsonl**, one line per instance (``EvalOutput``): ``instance_id``, ``instruction`` (the rendered
  instance template), ``instance`` (the SWE-bench row: ``problem_statement``, …), ``metadata`` (``agent_class``,
  ``llm_config.model``, ``max_iterations``, ``dataset``), ``history``, ``metrics`` (``accumulated_cost``,
  ``token_usages[]{prompt_tokens, completion_tokens, response_id}``), ``test_result.git_patch`` (the
  submission), ``error``, and ``report`` once the evaluation was merged in. ``history`` is a list of events:
  actions ``{id, source, action, args, tool_call_metadata?{function_name, tool_call_id, model_response}}`` and
  observations ``{id, cause, observation, content, extras, tool_call_metadata?}``; a command's exit code is
  ``extras.metadata.exit_code`` (``extras.exit_code`` in older files; -1 means none). Older files store history
  as ``[action, observation]`` pairs.
- **llm_completions/<instance_id>/<model>-<unix time>.json**, one file per model call (the model with ``/`` →
  ``__``): ``messages`` (the prompt of that call), ``response`` (``choices[0].message``, ``model``, ``usage``),
  ``kwargs``, ``timestamp``, ``cost``. When function calling was mocked, ``fncall_messages`` /
  ``fncall_response`` hold the conversation with native tool calls and ``messages`` the same as text
  (``<function=NAME><parameter=KEY>VALUE</parameter></function>``, tool results as user messages
  ``EXECUTION RESULT of [NAME]:``). The last call of an instance holds the whole conversation; the earlier calls
  are not runs of their own: they give each assistant turn its usage (:attr:`Source.series`).

Mapping. Task id = the instance id; task prompt = the problem statement; the instance message around it is
stored with ``{{ instance.problem_statement }}`` in its place. output.jsonl: agent = ``<agent_class>/<model>``,
run id = ``<agent>/<instance_id>``; each tool action an assistant transition (its thought as text, the call with
its arguments: a command for ``run``), each observation a tool transition (with its exit code), the git patch
the last transition (a ``submit`` call); bookkeeping events (recall, state changes, condensation, null) are left
out; ``error`` and the cost are run metadata; a ``report`` in the line is the held-out grade. Completions logs:
agent = ``OpenHands/<model>`` (from the file name, else ``response.model``), run id ``<agent>/<instance_id>``;
the messages of the last call plus its response, tool results with the exit code printed at their end
(``[Command finished with exit code N]``); the usage of call *k* from the end goes to assistant turn *k* from
the end (a condensed conversation has lost its first turns, never its last).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

from kvjudge.retention.ingest import openhands_v1
from kvjudge.retention.ingest.format import Companion, Format, companion_data, json_object_reader
from kvjudge.retention.ingest.model import DocumentError, JsonPath, ParseContext, ParsedRun, as_object, content_text
from kvjudge.retention.ingest.model import dig, get_field, need, scalars, settle_events, subpath, usage_of, with_marker
from kvjudge.retention.ingest.openai import parse_tool_calls
from kvjudge.retention.ingest.swebench import openhands_report_grade, read_predictions

NAME = "openhands"
HARNESS = "OpenHands"
TASK_MARKER = "{{ instance.problem_statement }}"
SUBMIT = "submit"
#: The agent class OpenHands' eval_infer.py writes when metadata.json is missing: it names no agent.
PLACEHOLDER_AGENT = "dummy_agent"

# Events that are the controller's bookkeeping, not the agent's work.
_SKIPPED_ACTIONS = frozenset({"null", "recall", "change_agent_state", "condensation", "condensation_request",
                              "loop_recovery", "pause", "resume", "stop"})
_SKIPPED_OBSERVATIONS = frozenset({"null", "agent_state_changed", "recall", "condense", "loop_detection"})
# Action arguments that say how OpenHands ran a call, not what the agent asked for.
_BOOKKEEPING = frozenset({"thought", "security_risk", "confirmation_state", "is_confirmed", "blocking", "hidden",
                          "is_static", "cwd", "impl_source", "wait_for_response", "kernel_init_code",
                          "include_extra", "task_completed", "is_input"})
# The one argument that is the call, for actions that have one.
_SINGLE_ARGUMENT = {"run": "command", "run_ipython": "code", "browse": "url", "browse_interactive": "browser_actions"}
# Arguments at their defaults (a whole file read, an editor command's unused line range) say nothing.
_DEFAULTS = {"read": {"start": 0, "end": -1}, "edit": {"start": 1, "end": -1}}
_STATEMENT = re.compile(r"<(issue_description|pr_description|issue)>\n?(.*?)\n?</\1>", re.DOTALL)
_EXIT_CODE = re.compile(r"\[Command finished with exit code (-?\d+)\]\s*$")
_COMPLETION_FILE = re.compile(r"^(?P<model>.+)-(?P<time>\d+(?:\.\d+)?)\.json$")
_FUNCTION = re.compile(r"<function=([^>\s]+)>\n?(.*?)(?:</function>|$)", re.DOTALL)
_PARAMETER = re.compile(r"<parameter=([^>\s]+)>\n?(.*?)\n?</parameter>", re.DOTALL)
_EXECUTION_RESULT = re.compile(r"^EXECUTION RESULT of \[([^\]]+)\]:\n")


def is_openhands(obj: dict[str, Any]) -> bool:
    """An OpenHands output.jsonl line (an instance with its history or test result, and its metadata, instance
    row or instruction — the 2024 harness's lines may lack metadata), or one ``llm_completions`` log (a model
    call's messages and response)."""
    if isinstance(_instance_id(obj), str) and ("history" in obj or "test_result" in obj) \
            and ("metadata" in obj or "instance" in obj or "instruction" in obj):
        return True
    return "response" in obj and "messages" in obj and ("kwargs" in obj or "fncall_messages" in obj)


def _instance_id(obj: dict[str, Any]) -> Any:
    """The line's ``instance_id``, else its SWE-bench row's (``instance.instance_id``), else — the 2024 harness's
    other benchmarks (logic_reasoning, …) — its ``id`` beside the instance row."""
    if "instance_id" in obj:
        return obj["instance_id"]
    found = dig(obj, "instance", "instance_id")
    if found is None and isinstance(obj.get("instance"), dict) and _is_id(obj.get("id")):
        return str(obj["id"])
    return found


METADATA = Companion("metadata.json", "the evaluation's agent class and model, for lines that name none",
                     json_object_reader("OpenHands' evaluation metadata: agent_class, llm_config.model, …"))
PATCHES = Companion("patch.jsonl", "the final patch of each instance, for lines without test_result.git_patch",
                    read_predictions)


def agent_from_metadata(metadata: Any) -> str | None:
    """The agent an output.jsonl line's ``metadata`` names: ``<agent_class>/<model>`` (None: it names none)."""
    if not isinstance(metadata, dict):
        return None
    agent_class, model = metadata.get("agent_class", metadata.get("Agent class")), _model(metadata)
    if agent_class == PLACEHOLDER_AGENT or not (isinstance(agent_class, str) and agent_class):
        return None
    return f"{agent_class}/{model}" if isinstance(model, str) and model else agent_class


def _model(metadata: dict[str, Any]) -> Any:
    """The model evaluation metadata names (``llm_config.model``; the 2024 benchmarks' ``Model name``)."""
    return dig(metadata, "llm_config", "model") or metadata.get("Model name")


def run_id_for(agent: str, instance_id: str) -> str:
    """The id of ``agent``'s run on ``instance_id``: ``<agent>/<instance_id>``."""
    return f"{agent}/{instance_id}"


def parse_openhands(obj: Any, context: ParseContext, document: Any) -> ParsedRun:
    """One output.jsonl line, or the last ``llm_completions`` log of an instance (``document.source.series``
    holds the earlier ones) → ParsedRun (raises DocumentError naming the JSON path)."""
    need(isinstance(obj, dict), "$", "an OpenHands document must be a JSON object")
    if "instance_id" in obj or "instance" in obj:
        return _parse_output(obj, context, document)
    return _parse_completions(obj, context, document)


# ---------------------------------------------------------------------------------------------- output.jsonl
def _parse_output(obj: dict[str, Any], context: ParseContext, document: Any) -> ParsedRun:
    instance_id = _instance_id(obj)
    need(isinstance(instance_id, str) and instance_id != "", "$.instance_id",
         "must be a non-empty string (or the line's instance row names none)")
    history = obj.get("history")
    need(history is not None, "$.history", "missing: this line holds no trajectory (evaluation output such as "
                                           "output.swebench_eval.jsonl is results: pass it with --results)")
    need(isinstance(history, list), "$.history", "must be a list of events")
    metadata = get_field(obj, "metadata", "$", dict, "an object", required=False) \
        or (companion_data(document, METADATA) if document is not None else None) or {}
    model = _model(metadata)
    agent = context.agent or agent_from_metadata(metadata) or HARNESS
    instruction = get_field(obj, "instruction", "$", str, "a string", required=False)
    statement = dig(obj, "instance", "problem_statement")
    prompt = statement if isinstance(statement, str) and statement else _statement_in(instruction)
    test_result = get_field(obj, "test_result", "$", dict, "an object", required=False) or {}
    patch = get_field(test_result, "git_patch", "$.test_result", str, "a string", required=False) \
        or get_field(obj, "git_patch", "$", str, "a string", required=False)
    if not patch and document is not None:
        patch = ((companion_data(document, PATCHES) or {}).get(instance_id) or {}).get("patch")
    error = get_field(obj, "error", "$", str, "a string", required=False)
    metrics = as_object(obj.get("metrics"))
    events = list(_events(history))
    version = next((dig(event, "args", "openhands_version") for event, _ in events
                    if isinstance(event, dict) and event.get("action") == "system"), None)
    run = context.new_run(context.with_trial(run_id_for(agent, instance_id)), NAME, agent=agent,
                          grading_open=True)
    run.start(task_id=instance_id, prompt=prompt, metadata=scalars({
        "format": NAME, "agent_class": metadata.get("agent_class", metadata.get("Agent class")), "model": model,
        "max_iterations": metadata.get("max_iterations"), "dataset": metadata.get("dataset"),
        "cost": metrics.get("accumulated_cost"), "error": error,
        "harness": f"{HARNESS} {version}" if isinstance(version, str) else HARNESS}), trial=context.trial)
    branch = run.branch("main")
    history_run = History(run, branch, prompt, _usage_by_response(metrics))
    if instruction is not None and not any(_is_user_message(event) for event, _ in events):
        history_run.user_message(instruction)
    if any(isinstance(event, dict) and "kind" in event for event, _ in events[:1]):  # a V1 evaluation's history
        v1 = openhands_v1.EventWriter(run, branch, prompt)
        for event, where in events:
            v1.add(event, where)
    else:
        for event, where in events:
            history_run.add(event, where)
    if patch and patch.strip():
        run.step(branch, "assistant", call=(SUBMIT, patch))
    grade = _line_grade(obj)
    if grade is not None:  # the line carries its evaluation: the run is settled here
        run.events.extend(settle_events(run.run_id, True, grade))
        run.grading_open = False
    return run


def _events(history: list[Any]) -> Iterator[tuple[Any, JsonPath]]:
    """The history's events in order, each with its JSON path; ``[action, observation]`` pairs flattened."""
    for index, item in enumerate(history):
        if isinstance(item, list):
            need(len(item) == 2, ("$.history", index), "a history pair must be [action, observation]")
            yield item[0], ("$.history", index, 0)
            yield item[1], ("$.history", index, 1)
        else:
            yield item, ("$.history", index)


def _is_user_message(event: Any) -> bool:
    return isinstance(event, dict) and event.get("action") == "message" and event.get("source") == "user"


def _usage_by_response(metrics: dict[str, Any]) -> dict[str, dict[str, int]]:
    """``metrics.token_usages`` by response id: the usage of each model call."""
    found = {}
    for usage in metrics.get("token_usages") or ():
        if isinstance(usage, dict) and isinstance(usage.get("response_id"), str):
            counted = usage_of(usage)
            if counted:
                found.setdefault(usage["response_id"], counted)
    return found


def _line_grade(obj: dict[str, Any]) -> dict[str, Any] | None:
    """The held-out grade of a line that carries its evaluation report (``report``, or ``test_result.report``), or
    — the 2024 harness's other benchmarks — its answer's check (``test_result.result``, true or false)."""
    result = dig(obj, "test_result", "result")
    if isinstance(result, bool):
        return {"grader": HARNESS.lower(), "score": float(result), "label": "correct" if result else "incorrect"}
    for path, report in (("$.report", obj.get("report")), ("$.test_result.report", dig(obj, "test_result", "report"))):
        if report is None:
            continue
        need(isinstance(report, dict), path, "must be an object (the evaluation report)")
        try:
            return openhands_report_grade(report)
        except ValueError as exc:
            raise DocumentError(path, str(exc)) from None
    return None


class History:
    """Turns history events into transitions, remembering which call each observation answers."""

    def __init__(self, run: ParsedRun, branch: str, prompt: str | None, usage: dict[str, dict[str, int]]) -> None:
        self.run = run
        self.branch = branch
        self.prompt = prompt
        self.usage = usage
        self.instructed = False
        self.names: dict[Any, str] = {}  # action id or tool call id → the call's name

    def user_message(self, text: str) -> None:
        if not self.instructed:  # the first user message is the instance template around the task
            self.instructed = True
            text = with_marker(text, self.prompt, TASK_MARKER)
        self.run.step(self.branch, "user", text=text)

    def add(self, event: Any, where: JsonPath) -> None:
        need(isinstance(event, dict), where, "an event must be an object")
        if "action" in event:
            self._action(event, where)
        elif "observation" in event:
            self._observation(event, where)
        else:
            raise DocumentError(where, "is neither an action nor an observation (no \"action\" or \"observation\")")

    def _action(self, event: dict[str, Any], where: JsonPath) -> None:
        kind = get_field(event, "action", where, str, "a string")
        args = get_field(event, "args", where, dict, "an object", required=False) or {}
        if kind in _SKIPPED_ACTIONS:
            return
        if kind == "system":
            self.run.step(self.branch, "system", text=_text(args, "content", subpath(where, "args")))
            return
        if kind == "message":
            text = _text(args, "content", subpath(where, "args")) or ""
            if event.get("source") == "user":
                self.user_message(text)
            else:
                self.run.step(self.branch, "assistant", text=text)
            return
        metadata = as_object(event.get("tool_call_metadata"))
        name = metadata.get("function_name") if isinstance(metadata.get("function_name"), str) else kind
        thought = args.get("thought")
        response_id = dig(metadata, "model_response", "id")
        usage = self.usage.pop(response_id, None) if isinstance(response_id, str) else None
        self.run.step(self.branch, "assistant", text=thought if isinstance(thought, str) and thought else None,
                      call=(name, _arguments(kind, args)), usage=usage)
        if _is_id(event.get("id")):
            self.names[event["id"]] = name
        if isinstance(metadata.get("tool_call_id"), str):
            self.names[metadata["tool_call_id"]] = name

    def _name(self, call: Any) -> str | None:
        """The name of the call an id names (None: not an id, or no call of this run)."""
        return self.names.get(call) if _is_id(call) else None

    def _observation(self, event: dict[str, Any], where: JsonPath) -> None:
        kind = get_field(event, "observation", where, str, "a string")
        if kind in _SKIPPED_OBSERVATIONS:
            return
        content = get_field(event, "content", where, str, "a string", required=False) or ""
        extras = get_field(event, "extras", where, dict, "an object", required=False) or {}
        metadata = as_object(event.get("tool_call_metadata"))
        name = (metadata.get("function_name") if isinstance(metadata.get("function_name"), str) else None) \
            or self._name(metadata.get("tool_call_id")) or self._name(event.get("cause")) or kind
        exit_code = None
        if kind == "run":
            exit_code = dig(extras, "metadata", "exit_code")
            exit_code = extras.get("exit_code") if exit_code is None else exit_code
            if exit_code is not None and (not isinstance(exit_code, int) or isinstance(exit_code, bool)):
                raise DocumentError(subpath(where, "extras", "metadata", "exit_code"), "must be an integer")
            exit_code = None if exit_code == -1 else exit_code  # -1: OpenHands saw no exit code
        self.run.step(self.branch, "tool", output=(name, content, exit_code))


def _is_id(value: Any) -> bool:
    """An event or tool call id: a string or a whole number (the document may put any value there)."""
    return isinstance(value, str | int) and not isinstance(value, bool)


def _text(args: dict[str, Any], key: str, where: JsonPath) -> str | None:
    return content_text(args.get(key), subpath(where, key))


def _arguments(kind: str, args: dict[str, Any]) -> Any:
    """What the agent asked for: the command of a ``run``, else the action's arguments without bookkeeping."""
    single = _SINGLE_ARGUMENT.get(kind)
    if single is not None and single in args:
        return args[single]
    defaults = _DEFAULTS.get(kind, {})
    kept = {key: value for key, value in args.items() if key not in _BOOKKEEPING
            and value not in (None, "", [], {}) and not (key in defaults and value == defaults[key])}
    return kept or None


def _statement_in(text: str | None) -> str | None:
    """The problem statement inside the instance template (``<issue_description>``, …); the whole text when it
    has none."""
    if text is None:
        return None
    found = _STATEMENT.search(text)
    return found.group(2) if found and found.group(2) else text


# -------------------------------------------------------------------------------------------- completions logs
def completion_model(file_name: str) -> str | None:
    """The model a completions log's name gives (``<model with / as __>-<unix time>.json``), or None."""
    found = _COMPLETION_FILE.match(file_name)
    return found.group("model").replace("__", "/") if found else None


def completion_time(file_name: str) -> float | None:
    """The unix time a completions log's name gives (the calls of one instance are ordered by it), or None."""
    found = _COMPLETION_FILE.match(file_name)
    return float(found.group("time")) if found else None


def _parse_completions(obj: dict[str, Any], context: ParseContext, document: Any) -> ParsedRun:
    path = document.source.path
    instance_id = path.parent.name
    need(bool(instance_id), "$", "a completions log lies in a folder named after its instance "
                                 "(llm_completions/<instance_id>/)")
    mocked = isinstance(obj.get("fncall_messages"), list)
    messages = obj["fncall_messages"] if mocked else obj.get("messages")
    key = "fncall_messages" if mocked else "messages"
    need(isinstance(messages, list) and len(messages) > 0, f"$.{key}", "must be a non-empty list of messages")
    response_key = "fncall_response" if mocked and isinstance(obj.get("fncall_response"), dict) else "response"
    response = get_field(obj, response_key, "$", dict, "an object")
    model = completion_model(document.source.name) or response.get("model")
    agent = context.agent or (f"{HARNESS}/{model}" if isinstance(model, str) and model else HARNESS)
    run = context.new_run(context.with_trial(run_id_for(agent, instance_id)), NAME, agent=agent,
                          grading_open=True)
    calls = [usage_of(dig(earlier, "response", "usage")) for earlier in document.companions()]
    calls.append(usage_of(response.get("usage")))
    reply = _first_choice(response, f"$.{response_key}")
    turns = [(message, (f"$.{key}", index)) for index, message in enumerate(messages)]
    if reply is not None:
        turns.append((reply, (f"$.{response_key}", "choices", 0, "message")))
    prompt = None
    for message, where in turns:
        if isinstance(message, dict) and message.get("role") == "user":
            prompt = _statement_in(content_text(message.get("content"), (*where, "content")))
            break
    run.start(task_id=instance_id, prompt=prompt, metadata=scalars({
        "format": NAME, "model": model, "api_calls": len(calls), "harness": HARNESS,
        "function_calling": "mocked" if mocked else None}), trial=context.trial)
    _Conversation(run, run.branch("main"), prompt, calls).add_all(turns)
    return run


def _first_choice(response: dict[str, Any], where: str) -> dict[str, Any] | None:
    choices = response.get("choices")
    if not isinstance(choices, list) or not choices:
        return None
    message = choices[0].get("message") if isinstance(choices[0], dict) else None
    need(isinstance(message, dict), f"{where}.choices[0].message", "must be an object")
    return message


class _Conversation:
    """Chat messages (OpenAI shape, native or mocked tool calls) → transitions, usage aligned from the end."""

    def __init__(self, run: ParsedRun, branch: str, prompt: str | None, calls: list[dict[str, int] | None]) -> None:
        self.run = run
        self.branch = branch
        self.prompt = prompt
        self.calls = calls
        self.names: dict[str, str] = {}
        self.instructed = False

    def add_all(self, turns: list[tuple[Any, JsonPath]]) -> None:
        assistants = sum(1 for message, _ in turns if isinstance(message, dict) and message.get("role") == "assistant")
        offset = len(self.calls) - assistants  # call index of the first assistant turn (aligned from the end)
        for message, where in turns:
            need(isinstance(message, dict), where, "must be an object")
            role = message.get("role")
            need(role in ("system", "user", "assistant", "tool"), (*where, "role"),
                 "must be one of system, user, assistant, tool")
            text = content_text(message.get("content"), (*where, "content"))
            if role == "assistant":
                usage = self.calls[offset] if 0 <= offset < len(self.calls) else None
                offset += 1
                self._assistant(message, text, where, usage)
            elif role == "tool":
                name = message.get("name") or self.names.get(str(message.get("tool_call_id"))) or "tool"
                self._tool_result(str(name), text or "")
            elif role == "user" and text is not None and (found := _EXECUTION_RESULT.match(text)):
                self._tool_result(found.group(1), text[found.end():])  # a mocked tool result
            elif role == "user" and not self.instructed:
                self.instructed = True
                self.run.step(self.branch, "user", text=with_marker(text or "", self.prompt, TASK_MARKER))
            else:
                self.run.step(self.branch, role, text=text)

    def _assistant(self, message: dict[str, Any], text: str | None, where: JsonPath,
                   usage: dict[str, int] | None) -> None:
        calls = parse_tool_calls(message.get("tool_calls"), (*where, "tool_calls"), self.names)
        if not calls and text and "<function=" in text:  # mocked function calling, as text
            text, calls = _mocked_calls(text)
        for index in range(max(1, len(calls))):
            self.run.step(self.branch, "assistant", text=text if index == 0 else None,
                          call=_call(calls[index]) if calls else None, usage=usage if index == 0 else None)

    def _tool_result(self, name: str, text: str) -> None:
        found = _EXIT_CODE.search(text)
        self.run.step(self.branch, "tool", output=(name, text, int(found.group(1)) if found else None))


def _call(call: tuple[str, Any]) -> tuple[str, Any]:
    """A tool call with its arguments decoded: the command of ``execute_bash``, else the arguments object."""
    name, arguments = call
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return name, arguments
    if isinstance(arguments, dict) and set(arguments) <= {"command", "is_input", "timeout", "security_risk"} \
            and isinstance(arguments.get("command"), str) and name == "execute_bash":
        return name, arguments["command"]
    return name, arguments


def _mocked_calls(text: str) -> tuple[str | None, list[tuple[str, Any]]]:
    """The ``<function=…><parameter=…>`` calls in mocked text, and the text before the first one."""
    calls = []
    for found in _FUNCTION.finditer(text):
        parameters = {key: value for key, value in _PARAMETER.findall(found.group(2))}
        calls.append((found.group(1), parameters))
    first = _FUNCTION.search(text)
    before = text[:first.start()].rstrip() if first else text
    return (before or None), calls


FORMAT = Format(
    name=NAME, summary="OpenHands evaluation `output.jsonl` (2024 and later) and `llm_completions` logs",
    recognises=is_openhands, parse=parse_openhands, files=("output.jsonl",),
    companions=(METADATA, PATCHES, Companion("config.json", "the evaluation's settings")), trial_label=True)
