"""A run's decisive evidence: what a grader must be able to read, found from the folded state.

Four things decide how a coding-agent run is graded, and reduction keeps them for as long as the ceiling allows:

- the **task**: the run's task prompt;
- the **final submission**: the live branch's last transition, in whichever shape the run's harness left it:

  - a submission tool call (:data:`SUBMIT_TOOLS`), or the output answering one that ends the run (inspect's
    ``submit(answer)``): the call's arguments (the importers of mini-swe-agent, SWE-agent and OpenHands runs make
    the final patch a ``submit`` call's arguments), or the text of the message that made the call when the call
    has no arguments (Terminus's ``mark_task_complete``);
  - a tool output that ends the run and is a submission: its command is a submit command (it prints a
    :data:`SUBMIT_SENTINELS` word, as mini-swe-agent's ``echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && git add -A
    && git diff --cached`` in a native run, or it is a bare ``submit``), or the output starts with such a word, or
    it is a unified diff;
  - else the text of a last assistant message: a final answer (Harbor, inspect and chat runs).

  A run that ends on any other tool output, or on a user message, submitted nothing;
- the **last verification** the agent ran itself: the last tool call on the live branch whose command runs tests
  (:data:`TEST_COMMANDS`: pytest, unittest, tox, nox, ``make test``, npm/yarn/pnpm test, go test, cargo test, a
  project's own test runner, a test or reproduce script). Its outcome is the final lines of its output
  (:data:`OUTCOME_LINES`) and its exit code (the exit code lives in the transition record, which every view keeps);
- the **final assistant message**: the text of the live branch's last assistant transition that has any.

:func:`find_evidence` reads refs, roles and tool calls from the state and reads bodies only for tool-call
arguments (to tell a test or submit command from any other) and the output that ends the run (to tell a
submission). :func:`measure` says how much of that evidence a view text shows: the share of the submission's lines
it shows (for a patch its changed lines, ``+``/``-`` inside hunks, never the ``+++``/``---`` file headers; for
anything else its non-blank lines) and whether the last verification's outcome lines all appear in it.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from kvjudge.retention.state import Branch, RunState, Transition, resolve

TextOf = Callable[[str], "str | None"]

#: Tool calls whose arguments are the run's submission (a patch or a final answer).
SUBMIT_TOOLS = frozenset({"submit", "submit_patch", "finish", "final_answer", "attempt_completion",
                          "mark_task_complete"})
# Arguments that carry nothing: a submit call made without any (its message is the answer).
_NO_ARGUMENTS = frozenset({"", "{}", "[]", "null", '""'})

#: Words a submit command prints before the submission: mini-swe-agent's ``echo
#: COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && git add -A && git diff --cached`` (and the word its older releases used).
SUBMIT_SENTINELS = ("COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT", "MINI_SWE_AGENT_FINAL_OUTPUT")

#: Commands that run tests, matched at the start of each simple command of a tool call (after ``&&``, ``||``,
#: ``;``, ``|`` or a newline, and after environment assignments and wrappers such as ``timeout 60``): a name
#: for reports, and the pattern. A command given as JSON (``{"command": "pytest -q"}``) is read through the
#: keys in :data:`COMMAND_KEYS`.
TEST_COMMANDS: tuple[tuple[str, str], ...] = (
    ("pytest", r"(?:\S*/)?(?:py\.test|pytest)(?:\s|$)"),
    ("python -m pytest/unittest/tox/nox",
     r"(?:\S*/)?python[\d.]*(?:\s+-[A-Za-z]+)*\s+-m\s+(?:pytest|unittest|tox|nox)\b"),
    ("tox/nox", r"(?:tox|nox)(?:\s|$)"),
    ("make test", r"make(?:\s+\S+)*?\s+(?:test|tests|check)(?:[-_:]\w+)?(?:\s|$)"),
    ("npm/yarn/pnpm test", r"(?:npm|yarn|pnpm)\s+(?:run\s+)?test\b"),
    ("go test", r"go\s+test\b"),
    ("cargo test", r"cargo\s+test\b"),
    ("project test runner", r"(?:\S*/)?(?:python[\d.]*\s+)?(?:\S*/)?(?:runtests\.py|manage\.py\s+test|bin/test)\b"),
    ("test or reproduce script",
     r"(?:\S*/)?python[\d.]*(?:\s+-[A-Za-z]+)*\s+(?:\S*/)?[\w.-]*(?:test|repro|reproduce|verify|check)[\w.-]*\.py\b"),
)
COMMAND_KEYS = ("command", "cmd", "script")
#: Lines of a verification's output that are its outcome (the last non-blank ones: a test summary).
OUTCOME_LINES = 3

_TESTS = tuple((name, re.compile(pattern)) for name, pattern in TEST_COMMANDS)
_SIMPLE_COMMANDS = re.compile(r"&&|\|\||[;|\n]")
_WRAPPERS = re.compile(r"^(?:[({]\s*|\w+=\S*\s+|(?:sudo|env|time|nice|command|exec)\s+"
                       r"|timeout\s+(?:-\S+\s+)*\d+\w?\s+)*")
_HUNK = re.compile(r"^@@ -\d+(?:,(\d+))? \+\d+(?:,(\d+))? @@")


def runs_tests(command: str) -> str | None:
    """The name of the :data:`TEST_COMMANDS` rule ``command`` matches (None: it runs no tests)."""
    for simple in _SIMPLE_COMMANDS.split(_command_text(command)):
        simple = _WRAPPERS.sub("", simple.strip())
        for name, pattern in _TESTS:
            if pattern.match(simple):
                return name
    return None


def _command_text(arguments: str) -> str:
    """A tool call's command: the arguments themselves, or the command keys of JSON arguments."""
    text = arguments.strip()
    if text.startswith("{"):
        try:
            decoded = json.loads(text)
        except ValueError:
            return arguments
        if isinstance(decoded, dict):
            return "\n".join(v for k in COMMAND_KEYS if isinstance(v := decoded.get(k), str))
    return arguments


@dataclass(frozen=True)
class ToolRun:
    """One tool call and the output that answered it (either may sit on its own transition)."""

    call_seq: int
    command_ref: str | None
    output_seq: int | None
    output_ref: str | None
    exit_code: int | None


def tool_runs(branch: Branch) -> list[ToolRun]:
    """Every tool call of ``branch`` with its output, in order.

    A transition that carries both a call and an output is one run; otherwise outputs answer the calls
    before them first-in first-out (parallel calls are answered in the order they were made).
    """
    runs: list[ToolRun] = []
    pending: list[tuple[int, str | None]] = []
    for t in branch.transitions:
        call, output = t.tool_call, t.tool_output
        if call and output:
            runs.append(ToolRun(t.seq, call.get("arguments_ref"), t.seq, output.get("output_ref"),
                                output.get("exit_code")))
        elif call:
            pending.append((t.seq, call.get("arguments_ref")))
        elif output and pending:
            seq, ref = pending.pop(0)
            runs.append(ToolRun(seq, ref, t.seq, output.get("output_ref"), output.get("exit_code")))
    runs.extend(ToolRun(seq, ref, None, None, None) for seq, ref in pending)
    return sorted(runs, key=lambda run: run.call_seq)


def live_branch(state: RunState) -> Branch | None:
    """The branch the run ended on: the last live branch with transitions (None when there is none)."""
    live = [branch for branch in state.branches if branch.status == "live" and branch.transitions]
    return live[-1] if live else None


def readable(state: RunState, text_of: TextOf) -> TextOf:
    """``text_of`` that falls back to what stands in for a ref whose original is gone (a summary)."""
    def read(ref: str) -> str | None:
        text = text_of(ref)
        if text is None and (seen := resolve(state, ref)) not in (None, ref):
            text = text_of(seen)  # type: ignore[arg-type]
        return text
    return read


@dataclass(frozen=True)
class Verification:
    """The last tool call on the live branch that ran tests, and its outcome."""

    runner: str               # the TEST_COMMANDS rule it matched
    call_seq: int
    command_ref: str
    output_ref: str | None
    exit_code: int | None


@dataclass(frozen=True)
class Evidence:
    """Refs of a run's decisive evidence (original refs, as the transitions name them)."""

    run_id: str
    branch: str | None
    task_ref: str | None
    submission_ref: str | None
    final_message_ref: str | None
    verification: Verification | None

    def refs(self) -> dict[str, str]:
        """``{"task", "submission", "verification", "final_message"}`` → ref, for the ones the run has."""
        found = {"task": self.task_ref, "submission": self.submission_ref,
                 "verification": self.verification.output_ref if self.verification else None,
                 "final_message": self.final_message_ref}
        return {name: ref for name, ref in found.items() if ref}


def submission_ref(branch: Branch, text_of: TextOf) -> str | None:
    """The body of the run's final submission: the live branch's last transition (see the module doc).

    ``text_of`` reads the last transition's tool output and the call it answers (nothing else is read).
    """
    last = branch.transitions[-1]
    answered = None  # the tool run whose output ends the run
    if last.tool_output:
        answered = next((run for run in tool_runs(branch) if run.output_seq == last.seq), None)
    caller = last  # the transition that made the last call: the last one, or the one its output answers
    if not last.tool_call and answered is not None:
        caller = next(t for t in branch.transitions if t.seq == answered.call_seq)
    if caller.tool_call and caller.tool_call.get("name") in SUBMIT_TOOLS:
        return _submitted_call(caller, text_of)
    if last.tool_output:
        return _submitted_output(last, answered, text_of)
    if last.role == "assistant" and last.text_ref:
        return last.text_ref
    return None


def _submitted_call(caller: Transition, text_of: TextOf) -> str | None:
    """What a submit call submitted: its arguments, or when they carry nothing (``mark_task_complete()``) the
    text of the message that made it (the final answer)."""
    arguments_ref = caller.tool_call.get("arguments_ref") if caller.tool_call else None
    if arguments_ref is not None:
        arguments = text_of(arguments_ref)
        if arguments is None or arguments.strip() not in _NO_ARGUMENTS:
            return arguments_ref
    return caller.text_ref


def _submitted_output(last: Transition, answered: ToolRun | None, text_of: TextOf) -> str | None:
    """The output ``last`` ends the run on, when it is a submission: its command is a submit command, or it starts
    with a :data:`SUBMIT_SENTINELS` word, or it is a unified diff (None: it submits nothing)."""
    output_ref = last.tool_output.get("output_ref") if last.tool_output else None
    if output_ref is None:
        return None
    command = text_of(answered.command_ref) if answered is not None and answered.command_ref else None
    if command is not None and _submits(_command_text(command)):
        return output_ref
    output = text_of(output_ref)
    if output is not None:
        first = next((line.strip() for line in output.splitlines() if line.strip()), "")
        if first in SUBMIT_SENTINELS or is_patch(output):
            return output_ref
    return None


def _submits(command: str) -> bool:
    """A submit command: it prints a :data:`SUBMIT_SENTINELS` word, or it is a bare submit tool (SWE-agent's
    ``submit``)."""
    return any(word in command for word in SUBMIT_SENTINELS) or command.strip() in SUBMIT_TOOLS


def testing_runs(runs: Iterable[ToolRun], command_of: TextOf) -> Iterator[tuple[ToolRun, str]]:
    """The tool runs whose command runs tests, with the rule each matched."""
    for run in runs:
        command = command_of(run.command_ref) if run.command_ref else None
        runner = runs_tests(command) if command else None
        if runner is not None:
            yield run, runner


def find_evidence(state: RunState, text_of: TextOf) -> Evidence:
    """The decisive evidence of ``state``; ``text_of`` reads tool-call arguments and the last tool output
    (nothing else is read)."""
    branch = live_branch(state)
    if branch is None:
        return Evidence(state.id, None, state.task_prompt_ref, None, None, None)
    final_message = next((t.text_ref for t in reversed(branch.transitions) if t.role == "assistant" and t.text_ref),
                         None)
    read = readable(state, text_of)
    found = list(testing_runs(tool_runs(branch), read))
    verification = None
    if found:
        run, runner = found[-1]
        assert run.command_ref is not None
        verification = Verification(runner, run.call_seq, run.command_ref, run.output_ref, run.exit_code)
    return Evidence(state.id, branch.id, state.task_prompt_ref, submission_ref(branch, read), final_message,
                    verification)


# --------------------------------------------------------------------------------------------- the measure
def is_patch(text: str) -> bool:
    """A unified diff: it has a hunk header and a ``diff --git`` line or a ``---``/``+++`` file header pair."""
    lines = text.splitlines()
    if not any(_HUNK.match(line) for line in lines):
        return False
    return any(line.startswith("diff --git ") for line in lines) or any(
        a.startswith("--- ") and b.startswith("+++ ") for a, b in zip(lines, lines[1:]))


def diff_lines(patch: str) -> Iterator[tuple[str, str]]:
    """Each line of a unified diff (line ending kept) with its kind: ``changed`` (``+``/``-`` inside a hunk),
    ``context`` (an unchanged line inside a hunk) or ``header`` (everything else: file headers, hunk headers,
    ``\\ No newline at end of file``). Hunk headers' line counts tell a ``---``/``+++`` line inside a hunk
    from a file header."""
    old = new = 0
    for line in patch.splitlines(keepends=True):
        hunk = _HUNK.match(line)
        if hunk:
            old = int(hunk.group(1)) if hunk.group(1) is not None else 1
            new = int(hunk.group(2)) if hunk.group(2) is not None else 1
            yield "header", line
        elif (old > 0 or new > 0) and line[:1] in ("-", "+"):
            if line[0] == "-":
                old -= 1
            else:
                new -= 1
            yield "changed", line
        elif (old > 0 or new > 0) and not line.startswith("\\"):
            old, new = old - 1, new - 1
            yield "context", line
        else:
            yield "header", line


def changed_lines(patch: str) -> list[str]:
    """The changed lines of a unified diff (``+``/``-`` lines inside hunks, never the file headers)."""
    return [line.rstrip("\r\n") for kind, line in diff_lines(patch) if kind == "changed"]


def _outcome(output: str) -> tuple[str, ...]:
    lines = [line for line in output.splitlines() if line.strip()]
    return tuple(lines[-OUTCOME_LINES:])


@dataclass(frozen=True)
class EvidenceLines:
    """The lines of a run's evidence a view must show: ``submission_lines`` (None when the run submitted nothing,
    or its text is gone) and ``outcome_lines`` (None when it ran no verification, or its output is gone)."""

    submission: str | None  # "patch" | "answer" | None (nothing submitted)
    submission_lines: tuple[str, ...] | None
    verification: str | None  # the runner of the last verification (None: none ran)
    outcome_lines: tuple[str, ...] | None
    exit_code: int | None


def evidence_lines(evidence: Evidence, text_of: TextOf) -> EvidenceLines:
    """What :func:`visibility` looks for; ``text_of`` reads the original bodies (None where they are gone)."""
    kind = lines = None
    if evidence.submission_ref:
        text = text_of(evidence.submission_ref)
        if text is not None:
            kind = "patch" if is_patch(text) else "answer"
            lines = tuple(changed_lines(text) if kind == "patch" else [line for line in text.splitlines()
                                                                        if line.strip()])
        else:
            kind = "unknown"
    verification = evidence.verification
    outcome = None
    if verification is not None:
        if verification.output_ref is None:
            outcome = ()
        elif (output := text_of(verification.output_ref)) is not None:
            outcome = _outcome(output)
    return EvidenceLines(kind, lines, verification.runner if verification else None, outcome,
                         verification.exit_code if verification else None)


@dataclass(frozen=True)
class Visibility:
    """How much of a run's evidence one view shows."""

    submission: str | None        # "patch" | "answer" | "unknown" (its original is gone) | None (nothing submitted)
    lines: int | None             # submission lines measured (changed lines of a patch, else non-blank lines)
    visible: int | None           # of those, how many the view shows
    verification: str | None      # the runner of the last verification (None: the run ran none)
    outcome_visible: bool | None  # every outcome line shown (None: no verification, or its output is gone)

    @property
    def share(self) -> float | None:
        """Share of the submission's lines the view shows (None: nothing to measure)."""
        if self.lines is None or self.visible is None:
            return None
        return self.visible / self.lines if self.lines else 1.0

    @property
    def whole(self) -> bool | None:
        return None if self.share is None else self.share == 1.0

    def to_json(self) -> dict[str, Any]:
        return {"submission": self.submission, "submission_lines": self.lines, "submission_visible": self.visible,
                "submission_share": self.share, "submission_whole": self.whole, "verification": self.verification,
                "verification_outcome_visible": self.outcome_visible}


def _shown(needles: Iterable[str], view_lines: list[str], quote: Callable[[str], str]) -> int:
    """How many of ``needles`` are lines of the view (each view line used once). A needle may also end a view
    line: the first line of a body can follow a label on its line (``-> calls submit: …``)."""
    pool = Counter(view_lines)
    found = 0
    for index, needle in enumerate(needles):
        key = quote(needle).strip()
        if pool[key] > 0:
            pool[key] -= 1
            found += 1
        elif index == 0 and key and any(line.endswith(key) for line in view_lines):
            found += 1
    return found


def visibility(lines: EvidenceLines, view: str, quote: Callable[[str], str] = lambda text: text) -> Visibility:
    """How much of ``lines`` the text ``view`` shows; ``quote`` is what the view did to run text (escaping)."""
    view_lines = [line.strip() for line in view.splitlines()]
    visible = None if lines.submission_lines is None else _shown(lines.submission_lines, view_lines, quote)
    outcome = None
    if lines.outcome_lines is not None:
        outcome = _shown(lines.outcome_lines, view_lines, quote) == len(lines.outcome_lines)
    return Visibility(lines.submission, None if lines.submission_lines is None else len(lines.submission_lines),
                      visible, lines.verification, outcome)


def measure(state: RunState, text_of: TextOf, view: str, quote: Callable[[str], str] = lambda text: text) -> Visibility:
    """The share of ``state``'s final submission and whether its last verification outcome ``view`` shows
    (``text_of`` reads the original bodies)."""
    return visibility(evidence_lines(find_evidence(state, text_of), text_of), view, quote)


__all__ = ["COMMAND_KEYS", "OUTCOME_LINES", "SUBMIT_SENTINELS", "SUBMIT_TOOLS", "TEST_COMMANDS", "Evidence",
           "EvidenceLines", "ToolRun", "Verification", "Visibility", "changed_lines", "diff_lines", "evidence_lines",
           "find_evidence", "is_patch", "live_branch", "measure", "readable", "submission_ref", "runs_tests",
           "testing_runs", "tool_runs", "visibility"]
