"""kvjudge's native run format: one JSON object per run, checked against ``kvjudge/schemas/run.schema.json``.

The shipped JSON Schema is the single statement of the format (validated through ``jsonschema``). What a
schema cannot say stays here as small checks: a branch's parent names an earlier branch, branch ids are
unique, and the lifecycle is a legal path.
"""

from __future__ import annotations

import functools
import json
from importlib import resources
from typing import TYPE_CHECKING, Any

from kvjudge.errors import RunStateError
from kvjudge.retention import events as ev
from kvjudge.retention.ingest.format import Format
from kvjudge.retention.ingest.model import DocumentError, ParseContext, ParsedRun, jpath, need
from kvjudge.retention.lifecycle import GRADING, RUNNING, check_path

if TYPE_CHECKING:
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import ValidationError

_TYPE_NAMES = {"string": "a string", "integer": "an integer", "number": "a number", "boolean": "a boolean",
               "object": "an object", "array": "an array", "null": "null"}


@functools.cache
def schema() -> dict[str, Any]:
    """The shipped JSON Schema of a native run."""
    return json.loads(resources.files("kvjudge").joinpath("schemas/run.schema.json").read_text("utf-8"))


@functools.cache
def _validator() -> Draft202012Validator:
    from jsonschema import Draft202012Validator  # imported on first use: trajectories never need it

    return Draft202012Validator(schema())


def _described(error: ValidationError) -> DocumentError:
    """One schema violation as ``(JSON path, what is wrong)`` — short, whatever the size of the instance."""
    path = error.json_path
    value = error.validator_value
    kind = error.validator
    if kind == "type":
        types = value if isinstance(value, list) else [value]
        return DocumentError(path, "must be " + " or ".join(_TYPE_NAMES.get(t, t) for t in types))
    if kind == "enum":
        return DocumentError(path, "must be one of " + ", ".join(json.dumps(v) for v in value))
    if kind == "required":
        missing = [name for name in value if isinstance(error.instance, dict) and name not in error.instance]
        return DocumentError(path, f"is missing the required field {', '.join(missing) or value}")
    if kind == "additionalProperties":
        extra = sorted(set(error.instance) - set(error.schema.get("properties", {})))
        allowed = ", ".join(sorted(error.schema.get("properties", {})))
        return DocumentError(path, f"has unknown field(s) {', '.join(extra)} (allowed: {allowed})")
    if kind == "minimum":
        return DocumentError(path, f"must be at least {value}")
    if kind in ("minLength", "minItems"):
        return DocumentError(path, "must not be empty")
    if kind == "pattern":
        return DocumentError(path, "must not be blank")
    message = error.message
    return DocumentError(path, message if len(message) <= 200 else message[:200] + "…")


def parse_native(obj: Any, context: ParseContext | None = None) -> ParsedRun:
    """A native run object → ParsedRun (raises DocumentError naming the JSON path)."""
    from jsonschema.exceptions import best_match

    context = context or ParseContext()
    error = best_match(_validator().iter_errors(obj))
    if error is not None:
        raise _described(error)
    run_id = obj["id"]
    run = context.new_run(run_id, "native", agent=obj.get("agent"), tenant=obj.get("tenant"))
    run.named = True
    lifecycle = obj.get("lifecycle", [RUNNING])
    try:
        check_path(lifecycle)
    except RunStateError as exc:
        raise DocumentError("$.lifecycle", str(exc)) from None
    task = obj.get("task") or {}
    run.start(task_id=task.get("id"), prompt=task.get("prompt"), metadata=obj.get("metadata"), trial=obj.get("trial"))
    seen: set[str] = set()
    for b_index, branch in enumerate(obj["branches"]):
        where = jpath("$", "branches", b_index)
        branch_id = branch["id"]
        need(branch_id not in seen, jpath(where, "id"), f"branch id {branch_id!r} is used twice")
        parent = branch.get("parent")
        need(parent is None or parent in seen, jpath(where, "parent"), f"{parent!r} must name an earlier branch")
        seen.add(branch_id)
        run.branch(branch_id, branch.get("status", "live"), parent, branch.get("fork_at"))
        for transition in branch.get("transitions", []):
            call = transition.get("tool_call")
            output = transition.get("tool_output")
            run.step(branch_id, transition["role"], text=transition.get("text"),
                     call=(call["name"], call.get("arguments")) if call is not None else None,
                     output=(output.get("name"), output.get("output"), output.get("exit_code"))
                     if output is not None else None,
                     usage=transition.get("usage"), context=transition.get("context"))
    # Verifier results and grades are facts of the grading step: they follow the move to grading.
    facts: list[ev.Event] = [ev.VerifierRecorded(run=run_id, result=r) for r in obj.get("verifier", [])]
    facts += [ev.GradeRecorded(run=run_id, grade=g) for g in obj.get("grades", [])]
    if GRADING not in lifecycle:
        run.events.extend(facts)
    for state in lifecycle[1:]:
        run.events.append(ev.StateChanged(run=run_id, state=state))
        if state == GRADING:
            run.events.extend(facts)
    return run


FORMAT = Format(
    name="native", summary="kvjudge's own runs, one JSON object per run (JSONL), checked against "
                           "`kvjudge/schemas/run.schema.json`",
    recognises=lambda obj: "branches" in obj or ("id" in obj and "messages" not in obj),
    parse=lambda obj, context, document: parse_native(obj, context))
