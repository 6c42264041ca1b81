"""The judge's view of a run.

A view is rendered from the folded :class:`~kvjudge.retention.RunState`: the task, every transition
(the skeleton that always survives), each body's text — or the extract standing in for it, with a visible
elision marker, or a marker saying it was dropped — and tool calls and results. It is rendered as segments
(:func:`render_parts`): the markup the judge writes, and each body as stored, so that the view's token count adds
up from counts kept once per body. :func:`view_source` is the digest of everything a view is derived from, by
which a verdict is found in the cache without rendering the run again. What the judge is scored
against is hidden unless asked for: grades always, and verifier results too (grades are often derived from
them, so a judge that read them would be reading the answer key). The stored run keeps both.

Run text is quoted between delimiter lines it cannot close: :func:`escape` rewrites every run of two or
more angle brackets, so no episode can write ``<<<END RUN A>>>`` and continue as the instructions. The
prompt that quotes two views is built in :mod:`kvjudge.judge.prompt`.
"""

from __future__ import annotations

import functools
import hashlib
import json
import operator
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kvjudge.display import invisible_class
from kvjudge.retention.reduce import resolve as seen_ref
from kvjudge.retention.state import DROPPED, REDUCED

if TYPE_CHECKING:
    from kvjudge.retention.state import RunState

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


def body_resolver(state: RunState, text_of: TextOf, *, originals: bool = False) -> BodyResolver:
    """Bodies as ``state`` says a reader sees them: the original, or the summary standing in for it.

    ``text_of(ref)`` reads a body (``store.blobs.text``, or ``plan.text_of`` for a view derived on the fly).
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


_ABSENT = object()


def _field(obj: Any, name: str, default: Any = None) -> Any:
    if isinstance(obj, dict):  # a concrete type first: this runs for every field of every step rendered
        return obj.get(name, default)
    value = getattr(obj, name, _ABSENT)
    if value is _ABSENT:
        return obj.get(name, default) if isinstance(obj, Mapping) else default
    return value


# A body a view shows: its ref, and whether escaping changed its text (then its stored count does not apply).
BodyPart = tuple[str, bool]


@dataclass(frozen=True)
class ViewParts:
    """A view as the segments it is quoted in: the markup the judge writes (headings, markers, references) and
    each body's text as stored, escaped. ``bodies[i]`` names the body ``texts[i]`` shows (None: markup), so the
    view's token count is the sum of the markup's counts and the bodies' stored counts; ``missing`` counts the
    bodies that could not be read (shown as a marker)."""

    texts: tuple[str, ...]
    bodies: tuple[BodyPart | None, ...]
    missing: int = 0

    @property
    def text(self) -> str:
        """The view's text (the segments joined)."""
        return "".join(self.texts)


class _Parts:
    """Builds a view line by line: markup lines (escaped here) and bodies, joined by newlines; consecutive markup
    (newlines included) becomes one segment. Every body is a whole line or more, so escaping each piece on its own
    gives the text escaping the whole would."""

    def __init__(self) -> None:
        self.texts: list[str] = []
        self.bodies: list[BodyPart | None] = []
        self.markup: list[str] = []
        self.missing = 0
        self.lines = 0

    def _separate(self) -> None:
        if self.lines:
            self.markup.append("\n")
        self.lines += 1

    def line(self, text: str) -> None:
        self._separate()
        self.markup.append(escape(text))

    def body(self, body: Body) -> None:
        if body.kind not in ("original", "summary") or body.ref is None:
            self.missing += body.kind == "missing"
            self.line(body.shown())
            return
        self._separate()
        raw = body.text or ""
        if not raw:
            return
        self._flush()
        shown = escape(raw)
        self.texts.append(shown)
        self.bodies.append((body.ref, shown != raw))

    def _flush(self) -> None:
        if self.markup:
            self.texts.append("".join(self.markup))
            self.bodies.append(None)
            self.markup = []

    def done(self) -> ViewParts:
        self._flush()
        return ViewParts(tuple(self.texts), tuple(self.bodies), self.missing)


def _transition(t: Any, resolve: BodyResolver, out: _Parts) -> None:
    role = _field(t, "role", "?")
    seq = _field(t, "seq", "?")
    tool_output = _field(t, "tool_output")
    if tool_output:
        exit_code = _field(tool_output, "exit_code")
        code = "" if exit_code is None else f", exit {exit_code}"
        out.line(f"[step {seq}] {role} ({_field(tool_output, 'name', 'tool')}{code}):")
    else:
        out.line(f"[step {seq}] {role}:")
    text_ref = _field(t, "text_ref")
    if text_ref:
        out.body(resolve(text_ref))
    tool_call = _field(t, "tool_call")
    if tool_call:
        out.line(f"-> calls {_field(tool_call, 'name', 'tool')}:")
        arguments_ref = _field(tool_call, "arguments_ref")
        if arguments_ref:
            out.body(resolve(arguments_ref))
    if tool_output:
        output_ref = _field(tool_output, "output_ref")
        if output_ref:
            out.body(resolve(output_ref))


def render_parts(state: RunState, resolve: BodyResolver, *, show_grades: bool = False, show_verifier: bool = False,
                 full: bool = False) -> ViewParts:
    """One run as the judge reads it, as segments (deterministic: same state and bodies, same parts).

    Each body stands on the lines after its heading, as stored (escaped). Verifier results and grades appear only
    with ``show_verifier`` / ``show_grades`` (experiments: they are what the judge is measured against). ``full``
    shows every dead branch step by step even where a summary stands in for it (the full run).
    """
    out = _Parts()
    task_id = _field(state, "task_id")
    out.line(f"Task {task_id}:" if task_id else "Task:")
    prompt_ref = _field(state, "task_prompt_ref")
    if prompt_ref:
        out.body(resolve(prompt_ref))
    for branch in _field(state, "branches", ()) or ():
        status = _field(branch, "status", "live")
        transitions = _field(branch, "transitions", ()) or ()
        if status == "dead":
            fork = _field(branch, "fork_at")
            where = f" (forked at step {fork})" if fork is not None else ""
            out.line(f"Abandoned attempt {_field(branch, 'id')}{where}, {len(transitions)} steps:")
            summary_ref = _field(branch, "summary_ref")
            if summary_ref and not full:
                out.body(resolve(summary_ref))
                continue
        else:
            out.line(f"Branch {_field(branch, 'id')}, {len(transitions)} steps:")
        for t in transitions:
            _transition(t, resolve, out)
    verifier = _field(state, "verifier", ()) or ()
    if not show_verifier:
        pass  # held out: not even a line saying so, so a view with and without results differ only there
    elif verifier:
        out.line("Verifier results:")
        for result in verifier:
            passed = _field(result, "passed")
            verdict = "passed" if passed else ("failed" if passed is not None else "no result")
            detail = _field(result, "detail")
            out.line(f"  - {_field(result, 'name', 'verifier')}: {verdict}" + (f" ({detail})" if detail else ""))
    else:
        out.line("Verifier results: none recorded")
    if show_grades:
        grades = _field(state, "grades", ()) or ()
        out.line("Grades:" if grades else "Grades: none recorded")
        for grade in grades:
            out.line(f"  - {_field(grade, 'grader', '?')}: score {_field(grade, 'score')} "
                     f"label {_field(grade, 'label')}")
    return out.done()


def render_view(state: RunState, resolve: BodyResolver, *, show_grades: bool = False, show_verifier: bool = False,
                full: bool = False) -> str:
    """The escaped text of one run as the judge reads it (:func:`render_parts` joined)."""
    return render_parts(state, resolve, show_grades=show_grades, show_verifier=show_verifier, full=full).text


# Every field of a folded run, step and branch is either read here (what every view of the run derives from) or
# named as read by no view, no evidence figure and no view reduction (a test holds the two lists to the dataclasses).
VIEW_FIELDS = {"run": ("task_id", "task_prompt_ref", "branches", "bodies", "reduced", "verifier", "grades"),
               "branch": ("id", "status", "parent", "fork_at", "transitions", "summary_ref"),
               "step": ("seq", "role", "text_ref", "tool_call", "tool_output")}
NOT_VIEW_FIELDS = {"run": ("id", "tenant", "state", "lifecycle", "tier", "text_repairs", "agent", "metadata", "trial"),
                   "branch": (), "step": ("usage", "context")}


def view_source(state: RunState, *, show_grades: bool = False, show_verifier: bool = False) -> str:
    """sha256 of what every view of ``state`` is derived from: its steps and refs as a reader sees them (each body
    local unless reduced to a summary or dropped — refs name bytes, so equal digests read equal text), and its
    verifier results and grades only where a view shows them. The run's names, lifecycle, tier status and held-out
    grades are not in it: grading a run or moving it to cold storage does not change its views."""
    step = operator.attrgetter(*VIEW_FIELDS["step"])
    branch = operator.attrgetter(*(name for name in VIEW_FIELDS["branch"] if name != "transitions"))
    shown = {"verifier": show_verifier, "grades": show_grades}
    data: dict[str, Any] = {}
    for name in VIEW_FIELDS["run"]:
        if name == "branches":
            data[name] = [[*branch(b), [step(t) for t in b.transitions]] for b in state.branches]
        elif name == "bodies":  # a body is local (read as itself) unless the log says a reader sees another
            data[name] = sorted([ref, loc.status, loc.summary_ref] for ref, loc in state.bodies.items()
                                if loc.status in (REDUCED, DROPPED))
        else:
            data[name] = getattr(state, name) if shown.get(name, True) else None
    return hashlib.sha256(json.dumps(data, sort_keys=True, separators=(",", ":")).encode("utf-8")).hexdigest()
