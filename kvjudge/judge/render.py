"""The judge's view of a run.

A view is rendered from the folded :class:`~kvjudge.retention.RunState`: the task, every transition
(the skeleton that always survives), each body's text — or the extract standing in for it, with a visible
elision marker, or a marker saying it was dropped — and tool calls and results. What the judge is scored
against is hidden unless asked for: grades always, and verifier results too (grades are often derived from
them, so a judge that read them would be reading the answer key). The stored run keeps both.

Run text is quoted between delimiter lines it cannot close: :func:`escape` rewrites every run of two or
more angle brackets, so no episode can write ``<<<END RUN A>>>`` and continue as the instructions. The
prompt that quotes two views is built in :mod:`kvjudge.judge.prompt`.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kvjudge.display import invisible_class
from kvjudge.retention.reduce import resolve as seen_ref

# Markers the judge sees in place of text that is not there (visible elision, never silent). An extract
# carries its own marker from kvjudge.retention.extract: "[212 lines cut]".
DROPPED_MARKER = "[text dropped by retention]"
MISSING_MARKER = "[text unavailable]"
ELIDED_MARKER = "[text elided]"


@functools.cache
def _bracket_runs() -> re.Pattern[str]:
    # Brackets with only invisible code points between them (``<\x00<\u200b<``) are a run too: a tokenizer
    # or a model that skips those would otherwise read a delimiter.
    hidden = invisible_class()
    return re.compile(f"<(?:{hidden}*<)+|>(?:{hidden}*>)+")


def escape(text: str) -> str:
    """Quote run text so it cannot close or open a delimiter.

    Every run of two or more ``<`` or ``>`` (invisible code points between them allowed) has its brackets
    turned into ``‹`` / ``›``, one for one: the delimiters need three in a row, so no escaped text contains
    one (nor anything one bracket away from one), even read without its control and format characters.
    """
    if "<" not in text and ">" not in text:
        return text
    return _bracket_runs().sub(lambda m: m.group().replace("<", "‹").replace(">", "›"), text)


@dataclass(frozen=True)
class Body:
    """One body as a view shows it. ``kind``: original | summary | common | dropped | missing | elided.

    ``ref`` is the ref whose text is shown (the original, or the summary standing in for it); a ``common`` body
    shows the reference to a block of text both runs of a pair share (see :func:`quoting_resolver`)."""

    text: str | None
    kind: str
    ref: str | None = None

    def shown(self) -> str:
        if self.kind in ("original", "summary", "common"):
            return self.text or ""
        return {"dropped": DROPPED_MARKER, "elided": ELIDED_MARKER}.get(self.kind, MISSING_MARKER)


BodyResolver = Callable[[str], Body]
TextOf = Callable[[str], "str | None"]


def body_resolver(state: Any, text_of: TextOf, *, originals: bool = False) -> BodyResolver:
    """Bodies as ``state`` says a reader sees them: the original, or the summary standing in for it.

    ``text_of(ref)`` reads a body (``store.text``, or ``plan.text_of`` for a view derived on the fly).
    With ``originals`` every ref reads its own text whatever the log says (the full run, where the
    originals still exist somewhere); a body that cannot be read is ``missing``.
    """
    memo: dict[str, Body] = {}

    def resolve(ref: str) -> Body:
        if ref not in memo:
            location = state.bodies.get(ref)
            status = getattr(location, "status", "local")
            if originals or status not in ("reduced", "dropped"):
                text = text_of(ref)
                memo[ref] = Body(text, "original", ref) if text is not None else Body(None, "missing")
            else:
                target = seen_ref(state, ref)
                text = text_of(target) if target is not None else None
                if text is not None:
                    memo[ref] = Body(text, "summary", target)
                else:
                    memo[ref] = Body(None, "dropped" if target is None else "missing")
        return memo[ref]

    return resolve


def quoting_resolver(resolve: BodyResolver, references: Mapping[str, str]) -> BodyResolver:
    """``resolve``, except that a body whose shown ref is in ``references`` reads as its reference: the text is
    quoted once in a block common to both runs of a pair (``references``: shown ref → ``[common text N]``)."""
    def read(ref: str) -> Body:
        body = resolve(ref)
        if body.ref is not None and body.ref in references:
            return Body(references[body.ref], "common", body.ref)
        return body

    return read


def recording_resolver(resolve: BodyResolver, shown: dict[str, str]) -> BodyResolver:
    """``resolve``, noting in ``shown`` (shown ref → text, in reading order) every body with text it reads."""
    def read(ref: str) -> Body:
        body = resolve(ref)
        if body.ref is not None and body.text is not None and body.kind != "common":
            shown.setdefault(body.ref, body.text)
        return body

    return read


def elided_resolver(_ref: str) -> Body:
    """The skeleton: every body elided (the least a view can show)."""
    return Body(None, "elided")


def _field(obj: Any, name: str, default: Any = None) -> Any:
    if isinstance(obj, Mapping):
        return obj.get(name, default)
    return getattr(obj, name, default)


def _indent(text: str, prefix: str = "  ") -> str:
    return "\n".join(prefix + line if line else line for line in text.split("\n"))


def _transition(t: Any, resolve: BodyResolver) -> list[str]:
    role = _field(t, "role", "?")
    seq = _field(t, "seq", "?")
    lines: list[str] = []
    tool_output = _field(t, "tool_output")
    if tool_output:
        exit_code = _field(tool_output, "exit_code")
        code = "" if exit_code is None else f", exit {exit_code}"
        lines.append(f"[step {seq}] {role} ({_field(tool_output, 'name', 'tool')}{code}):")
    else:
        lines.append(f"[step {seq}] {role}:")
    text_ref = _field(t, "text_ref")
    if text_ref:
        lines.append(_indent(resolve(text_ref).shown()))
    tool_call = _field(t, "tool_call")
    if tool_call:
        arguments_ref = _field(tool_call, "arguments_ref")
        arguments = resolve(arguments_ref).shown() if arguments_ref else ""
        lines.append(_indent(f"-> calls {_field(tool_call, 'name', 'tool')}: {arguments}"))
    if tool_output:
        output_ref = _field(tool_output, "output_ref")
        if output_ref:
            lines.append(_indent(resolve(output_ref).shown()))
    return lines


def render_view(state: Any, resolve: BodyResolver, *, show_grades: bool = False, show_verifier: bool = False,
                full: bool = False) -> str:
    """The escaped text of one run as the judge reads it (deterministic: same state and bodies, same text).

    Verifier results and grades appear only with ``show_verifier`` / ``show_grades`` (experiments: they are
    what the judge is measured against). ``full`` shows every dead branch step by step even where a summary
    stands in for it (the full run).
    """
    lines: list[str] = []
    task_id = _field(state, "task_id")
    lines.append(f"Task {task_id}:" if task_id else "Task:")
    prompt_ref = _field(state, "task_prompt_ref")
    if prompt_ref:
        lines.append(_indent(resolve(prompt_ref).shown()))
    for branch in _field(state, "branches", ()) or ():
        status = _field(branch, "status", "live")
        transitions = _field(branch, "transitions", ()) or ()
        if status == "dead":
            fork = _field(branch, "fork_at")
            where = f" (forked at step {fork})" if fork is not None else ""
            lines.append(f"Abandoned attempt {_field(branch, 'id')}{where}, {len(transitions)} steps:")
            summary_ref = _field(branch, "summary_ref")
            if summary_ref and not full:
                lines.append(_indent(resolve(summary_ref).shown()))
                continue
        else:
            lines.append(f"Branch {_field(branch, 'id')}, {len(transitions)} steps:")
        for t in transitions:
            lines.extend(_transition(t, resolve))
    verifier = _field(state, "verifier", ()) or ()
    if not show_verifier:
        pass  # held out: not even a line saying so, so a view with and without results differ only there
    elif verifier:
        lines.append("Verifier results:")
        for result in verifier:
            passed = _field(result, "passed")
            verdict = "passed" if passed else ("failed" if passed is not None else "no result")
            detail = _field(result, "detail")
            lines.append(f"  - {_field(result, 'name', 'verifier')}: {verdict}" + (f" ({detail})" if detail else ""))
    else:
        lines.append("Verifier results: none recorded")
    if show_grades:
        grades = _field(state, "grades", ()) or ()
        lines.append("Grades:" if grades else "Grades: none recorded")
        for grade in grades:
            lines.append(f"  - {_field(grade, 'grader', '?')}: score {_field(grade, 'score')} "
                         f"label {_field(grade, 'label')}")
    return escape("\n".join(lines))
