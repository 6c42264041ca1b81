"""inspect_ai eval samples: each sample × epoch of an eval log is a run (:mod:`.inspect_reader` reads the logs).

kvjudge reads inspect's documented log format itself rather than depending on ``inspect_ai`` as an optional
extra: its wheel is ~35 MB with ~40 dependencies, reading a log through it validates every sample into pydantic
models (memory and time kvjudge does not need), and the part of the format kvjudge reads is small and stable —
the eval spec, and per sample its messages, model events' usage and scores.

Shapes, as inspect writes them (``EvalSpec``, ``EvalSample`` and ``ChatMessage`` in ``inspect_ai.log`` and
``inspect_ai.model``):

- the eval spec: ``task``, ``model``, ``solver`` (when one was named), ``eval_id``, ``run_id``, …;
- a sample: ``id`` (int or string), ``epoch``, ``input`` (a string or messages), ``messages`` (``role``
  system|user|assistant|tool; ``content`` a string or content parts — ``text``, ``reasoning`` (``redacted``
  when encrypted), ``image``, …; an assistant's ``tool_calls[]{id, function, arguments}``; a tool message's
  ``tool_call_id``, ``function``, ``error{type, message}``), ``events`` (a ``model`` event's ``output`` holds
  the message it produced, by ``id``, and that call's ``usage``), ``scores{scorer: {value, answer,
  explanation}}``, ``error``, ``limit``, ``attachments`` (``attachment://<hash>`` strings stand for these).

Mapping: agent = the eval's model, ``<solver>@<model>`` when the eval named a solver; task id =
``<task>/<sample id>``; trial = the epoch and the eval (``<epoch>-<eval_id[:8]>``: two evals of one task and
model are two trials, not one run twice); run id ``<agent>/<task>/<sample id>/<trial>``. The task prompt is the
sample's input (the first user message when the input is a message list); each assistant message is an
assistant transition per tool call (reasoning, then text, on the first) with its model call's usage (input =
``input_tokens`` + cache reads + cache writes, which inspect counts apart; output = ``output_tokens``), each
tool message a tool transition. Grades: the first scorer's value, mapped to [0, 1] as inspect's own
``value_to_float`` does — ``C`` 1, ``P`` 0.5, ``I`` and ``N`` 0, ``yes``/``true`` 1, ``no``/``false`` 0,
numbers and numeric strings as they are, booleans 1/0 — except that a number outside [0, 1], a list or
dictionary value, or any other string leaves the run ungraded (noted on the run) where inspect would count 0.
A sample with no scores lands ungraded, for ``--results`` to grade by run id.
"""

from __future__ import annotations

import math
from typing import Any

from kvjudge.retention.ingest.format import Format
from kvjudge.retention.ingest.model import (
    DocumentError,
    JsonPath,
    ParseContext,
    ParsedRun,
    get_field,
    need,
    scalars,
    settle_events,
    subpath,
    with_marker,
)

TASK_MARKER = "{{task}}"
ATTACHMENT = "attachment://"
GRADER = "inspect"
_ROLES = ("system", "user", "assistant", "tool")
_LETTERS = {"C": (1.0, "correct"), "P": (0.5, "partial"), "I": (0.0, "incorrect"), "N": (0.0, "no answer")}
_WORDS = {"yes": 1.0, "true": 1.0, "no": 0.0, "false": 0.0}
#: The eval spec's fields a sample document carries (the rest of the header is not needed per sample).
EVAL_FIELDS = ("task", "model", "solver", "eval_id", "run_id", "task_id", "task_version")


def is_inspect_sample(obj: Any) -> bool:
    """A sample as kvjudge reads it: ``{"eval": <eval spec>, "sample": <sample>}``."""
    return (isinstance(obj, dict) and isinstance(obj.get("eval"), dict) and isinstance(obj.get("sample"), dict)
            and "model" in obj["eval"])


def sample_for_import(sample: Any) -> Any:
    """What kvjudge reads of a decoded sample, the rest left out before the text check and the parse: the
    messages, scores, error and limit as they are; of the events only each model call's message id and usage;
    of the attachments only those the parser resolves (the events' own attachments can be larger than the
    messages). A value that is not a sample is returned as it is, for the parser to name what is wrong."""
    if not isinstance(sample, dict):
        return sample
    kept = {key: sample[key] for key in ("id", "epoch", "input", "messages", "scores", "error", "limit", "total_time",
                                         "working_time") if key in sample}
    calls = []
    for event in sample.get("events") or ():
        if isinstance(event, dict) and event.get("event") == "model" and isinstance(event.get("output"), dict):
            output = event["output"]
            choices = output.get("choices")
            first = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
            message = first.get("message") if isinstance(first.get("message"), dict) else {}
            calls.append({"event": "model", "output": {"choices": [{"message": {"id": message.get("id")}}],
                                                       "usage": output.get("usage")}})
    kept["events"] = calls
    attachments = sample.get("attachments")
    if isinstance(attachments, dict) and attachments:
        named = _resolved_attachments(kept)
        kept["attachments"] = {key: attachments[key] for key in named if key in attachments}
    return kept


def _resolved_attachments(sample: dict[str, Any]) -> set[str]:
    """The attachments the parser resolves (:func:`_resolve`): those the input string and the messages' text —
    a content string, a text or reasoning part — stand for. Only those strings are looked at, not every value
    of the messages (tool calls, metadata)."""
    texts: list[Any] = [sample.get("input")]
    messages = sample.get("messages")
    for message in messages if isinstance(messages, list) else ():
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list):
            texts.extend(part.get("text" if part.get("type") == "text" else "reasoning") for part in content
                         if isinstance(part, dict))
        else:
            texts.append(content)
    return {text[len(ATTACHMENT):] for text in texts if isinstance(text, str) and text.startswith(ATTACHMENT)}


def eval_agent(spec: dict[str, Any]) -> str:
    """The agent of an eval: its model, ``<solver>@<model>`` when it named a solver."""
    model, solver = spec.get("model"), spec.get("solver")
    return f"{solver}@{model}" if isinstance(solver, str) and solver else str(model)


def sample_trial(spec: dict[str, Any], epoch: Any) -> str:
    """The trial of a sample: its epoch, and the eval it is of (``<epoch>-<eval_id[:8]>``) — the same task run
    twice on one model is two evals, and each sample of each a trial of its own."""
    eval_id = spec.get("eval_id")
    return f"{epoch}-{eval_id[:8]}" if isinstance(eval_id, str) and eval_id else str(epoch)


def sample_run_id(spec: dict[str, Any], sample_id: Any, epoch: Any, agent: str | None = None) -> str:
    """``<agent>/<task>/<sample id>/<trial>`` (:func:`sample_trial`)."""
    return f"{agent or eval_agent(spec)}/{spec.get('task')}/{sample_id}/{sample_trial(spec, epoch)}"


def score_grade(scores: Any, path: JsonPath) -> tuple[dict[str, Any] | None, str | None]:
    """The first scorer's value as a grade in [0, 1] (see the module docstring), or (None, why not)."""
    if not scores:
        return None, "not scored"
    need(isinstance(scores, dict), path, "must be an object of scorer names to scores")
    name, score = next(iter(scores.items()))
    need(isinstance(score, dict) and "value" in score, subpath(path, name), "a score needs its value")
    value = score["value"]
    number: float | None = None
    label = str(value)
    if isinstance(value, bool):
        number = 1.0 if value else 0.0
    elif isinstance(value, int | float):
        number = float(value)
    elif isinstance(value, str):
        if value in _LETTERS:
            number, label = _LETTERS[value]
        elif value.lower() in _WORDS:
            number = _WORDS[value.lower()]
        else:
            try:
                number = float(value)
            except ValueError:
                return None, f"score value {value[:40]!r} of {name} has no numeric meaning"
    else:
        return None, f"score value of {name} is {'a list' if isinstance(value, list) else 'an object'}, not one number"
    if not math.isfinite(number) or not 0 <= number <= 1:
        return None, f"score value {value} of {name} is outside [0, 1]"
    return {"grader": f"{GRADER}:{name}", "score": number, "label": label}, None


def parse_inspect_sample(obj: Any, context: ParseContext) -> ParsedRun:
    """``{"eval": …, "sample": …}`` → ParsedRun (DocumentError names the JSON path)."""
    need(isinstance(obj, dict), "$", "an inspect sample document must be a JSON object")
    spec = get_field(obj, "eval", "$", dict, "the eval spec (an object)")
    task = get_field(spec, "task", "$.eval", str, "a string")
    model = get_field(spec, "model", "$.eval", str, "a string")
    sample = get_field(obj, "sample", "$", dict, "an object")
    sample_id = sample.get("id")
    need(isinstance(sample_id, int | str) and not isinstance(sample_id, bool) and str(sample_id) != "",
         "$.sample.id", "must be a string or an integer")
    epoch = sample.get("epoch")
    need(isinstance(epoch, int) and not isinstance(epoch, bool) and epoch >= 1, "$.sample.epoch",
         "must be a whole number from 1")
    messages = get_field(sample, "messages", "$.sample", list, "a list of messages")
    attachments = sample.get("attachments") if isinstance(sample.get("attachments"), dict) else {}
    agent = context.agent or eval_agent(spec)
    grade, because = score_grade(sample.get("scores"), "$.sample.scores")
    scored = bool(sample.get("scores"))
    run = context.new_run(sample_run_id(spec, sample_id, epoch, agent), "inspect", agent=agent,
                          grading_open=not scored)
    run.named = isinstance(spec.get("eval_id"), str) and bool(spec["eval_id"])  # the eval names the trial
    run.marks = tuple(spec[key][:8] for key in ("run_id", "task_id") if isinstance(spec.get(key), str) and spec[key])
    usage = _usage_by_message(sample.get("events"))
    prompt = _prompt(sample, messages, attachments)
    error = sample.get("error")
    limit = sample.get("limit") if isinstance(sample.get("limit"), dict) else {}
    metadata = scalars({
        "format": "inspect log", "model": model, "solver": spec.get("solver"), "eval_id": spec.get("eval_id"),
        "error": _first_line(error.get("message")) if isinstance(error, dict) else None,
        "limit": f"{limit.get('type')} {limit.get('limit')}" if limit else None,
        "total_time": sample.get("total_time"), "working_time": sample.get("working_time"),
        "ungraded_because": because if scored else None})
    run.start(task_id=f"{task}/{sample_id}", prompt=prompt, metadata=metadata, trial=sample_trial(spec, epoch))
    branch = run.branch("main")
    prompted = False
    for index, message in enumerate(messages):
        where = ("$.sample.messages", index)
        need(isinstance(message, dict), where, "must be an object")
        role = message.get("role")
        need(role in _ROLES, subpath(where, "role"), f"must be one of {', '.join(_ROLES)}")
        text = _content(message.get("content"), subpath(where, "content"), attachments)
        if role == "assistant":
            _assistant(run, branch, message, text, where, usage)
        elif role == "tool":
            run.step(branch, "tool", output=(message.get("function") if isinstance(message.get("function"), str)
                                             else None, text or _error_text(message.get("error")), None))
        elif role == "user" and not prompted:
            prompted = True
            run.step(branch, "user", text=with_marker(text or "", prompt, TASK_MARKER))
        else:
            run.step(branch, role, text=text)
    if scored:
        run.events.extend(settle_events(run.run_id, True, grade))
    return run


def _prompt(sample: dict[str, Any], messages: list[Any], attachments: dict[str, Any]) -> str | None:
    if isinstance(sample.get("input"), str):
        return _resolve(sample["input"], attachments)
    for index, message in enumerate(messages):
        if isinstance(message, dict) and message.get("role") == "user":
            return _content(message.get("content"), ("$.sample.messages", index, "content"), attachments)
    return None


def _assistant(run: ParsedRun, branch: str, message: dict[str, Any], text: str | None, where: JsonPath,
               usage: dict[str, dict[str, int]]) -> None:
    calls = message.get("tool_calls") or []
    need(isinstance(calls, list), subpath(where, "tool_calls"), "must be a list")
    parsed = []
    for index, call in enumerate(calls):
        at = subpath(where, "tool_calls", index)
        need(isinstance(call, dict), at, "must be an object")
        parsed.append((get_field(call, "function", at, str, "a string"), call.get("arguments")))
    call_usage = usage.get(message["id"]) if isinstance(message.get("id"), str) else None
    for index in range(max(1, len(parsed))):
        run.step(branch, "assistant", text=text if index == 0 else None, call=parsed[index] if parsed else None,
                 usage=call_usage if index == 0 else None)


def _usage_by_message(events: Any) -> dict[str, dict[str, int]]:
    """Message id → the usage of the model call that produced it (from the sample's ``model`` events)."""
    found: dict[str, dict[str, int]] = {}
    for event in events if isinstance(events, list) else ():
        if not (isinstance(event, dict) and event.get("event") == "model" and isinstance(event.get("output"), dict)):
            continue
        output = event["output"]
        choices = output.get("choices")
        message = choices[0].get("message") if isinstance(choices, list) and choices and isinstance(
            choices[0], dict) else None
        usage = output.get("usage")
        if not (isinstance(message, dict) and isinstance(message.get("id"), str) and isinstance(usage, dict)):
            continue
        counts = {key: usage.get(key) for key in ("input_tokens", "output_tokens", "input_tokens_cache_read",
                                                   "input_tokens_cache_write")}
        if all(value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 0)
               for value in counts.values()) and counts["input_tokens"] is not None:
            found[message["id"]] = {
                "input_tokens": counts["input_tokens"] + (counts["input_tokens_cache_read"] or 0)
                + (counts["input_tokens_cache_write"] or 0),
                **({"output_tokens": counts["output_tokens"]} if counts["output_tokens"] is not None else {})}
    return found


def _content(content: Any, path: JsonPath, attachments: dict[str, Any]) -> str | None:
    """Message content as text: a string, or its parts — reasoning (unless redacted), then text; other parts
    named. ``attachment://`` references are resolved."""
    if content is None or isinstance(content, str):
        return _resolve(content, attachments) if content is not None else None
    if not isinstance(content, list):
        raise DocumentError(path, "must be a string or a list of content parts")
    reasoning, texts = [], []
    for index, part in enumerate(content):
        need(isinstance(part, dict) and isinstance(part.get("type"), str), subpath(path, index),
             "a content part needs a string type")
        kind = part["type"]
        if kind == "text":
            need(isinstance(part.get("text"), str), subpath(path, index, "text"), "a text part needs its text")
            texts.append(_resolve(part["text"], attachments))
        elif kind == "reasoning":
            if not part.get("redacted") and isinstance(part.get("reasoning"), str):
                reasoning.append(_resolve(part["reasoning"], attachments))
        else:
            texts.append(f"[{kind} part not imported]")
    return "\n".join(reasoning + texts)


def _resolve(text: str, attachments: dict[str, Any]) -> str:
    if text.startswith(ATTACHMENT):
        found = attachments.get(text[len(ATTACHMENT):])
        if isinstance(found, str):
            return found
    return text


def _error_text(error: Any) -> str:
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        return f"[{error.get('type', 'error')}] {error['message']}"
    return ""


def _first_line(text: Any) -> str | None:
    if not isinstance(text, str) or not text.strip():
        return None
    return text.strip().splitlines()[0][:200]


FORMAT = Format(
    name="inspect", summary="inspect_ai eval logs (`*.eval`, `.json`), each sample of each epoch and eval a run",
    recognises=is_inspect_sample, parse=lambda obj, context, document: parse_inspect_sample(obj, context),
    files=("*.eval",))
