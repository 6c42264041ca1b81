"""What each body a reader sees is worth: the order in which reduction cuts bodies down to extracts.

Every body a reader of a run sees (:func:`~kvjudge.retention.reduce.view_refs`) gets a *rank* — the lower, the
sooner it is cut — and an extract *shape*:

====================  ==========================================================================  =========
rank                  bodies                                                                      shape
====================  ==========================================================================  =========
0 ``exploration``     tool output of anything but a test run (listings, file dumps, search hits,   head_tail
                      install logs); a dead branch's extract
1 ``boilerplate``     system and developer messages, user messages before the agent's first step  tail for
                      (a harness's prompt and instance template); output of earlier test runs     test logs
2 ``steps``           everything else: the agent's messages, tool-call arguments (commands,       head_tail
                      edits), other user messages
3 ``final_message``   the final assistant message                                                 head_tail
4 ``task``            the task prompt                                                             head_tail
5 ``verification``    the output of the last verification the agent ran                          tail
6 ``submission``      the final submission                                                        submission
====================  ==========================================================================  =========

Ranks 3–6 are the run's decisive evidence (:mod:`kvjudge.retention.evidence`): they are cut only when every
body ranked below them is down to its marker. Within a rank a body on a dead branch goes before one on a live
branch, and an earlier body before a later one (its *order*). A body a reader sees in several places takes
its highest rank and its latest place.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvjudge.retention.evidence import Evidence, TextOf, testing_runs, tool_runs
from kvjudge.retention.state import RunState, resolve

RANKS: tuple[str, ...] = ("exploration", "boilerplate", "steps", "final_message", "task", "verification",
                          "submission")
EXPLORATION, BOILERPLATE, STEPS, FINAL_MESSAGE, TASK, VERIFICATION, SUBMISSION = range(len(RANKS))
#: Extract shapes: "head_tail" (half start, half end), "tail" (a quarter start, the rest end: the outcome of a
#: test log is its last lines), "submission" (a diff keeps its changed lines first, anything else head_tail).
SHAPES = ("head_tail", "tail", "submission")
_BOILERPLATE_ROLES = frozenset({"system", "developer"})


@dataclass(frozen=True)
class Worth:
    """One body's rank, shape and order within its rank (``(live, place)``: dead branches first, then reading
    order)."""

    rank: int
    shape: str
    order: tuple[int, int]


def body_worth(state: RunState, evidence: Evidence, command_of: TextOf) -> dict[str, Worth]:
    """The worth of every ref a reader of ``state`` sees (refs as read: a summary stands for its original).

    ``command_of(ref)`` reads a tool call's arguments (to tell test runs from other tool calls).
    """
    decisive: dict[str, tuple[int, str]] = {}
    for ref, rank, shape in ((evidence.final_message_ref, FINAL_MESSAGE, "head_tail"),
                             (evidence.task_ref, TASK, "head_tail"),
                             (evidence.verification.output_ref if evidence.verification else None, VERIFICATION,
                              "tail"),
                             (evidence.submission_ref, SUBMISSION, "submission")):
        if ref:
            decisive[ref] = (rank, shape)
    worth: dict[str, Worth] = {}
    place = 0

    def see(ref: str | None, rank: int, shape: str, live: bool) -> None:
        nonlocal place
        if not ref:
            return
        if ref in decisive and decisive[ref][0] > rank:
            rank, shape = decisive[ref]
        seen = resolve(state, ref)
        if seen is None:
            return
        place += 1
        known = worth.get(seen)
        if known is not None and known.rank > rank:
            rank, shape = known.rank, known.shape
        worth[seen] = Worth(rank, shape, (int(live), place))

    see(state.task_prompt_ref, TASK, "head_tail", True)
    for branch in state.branches:
        live = branch.status == "live"
        if not live and branch.summary_ref is not None:
            see(branch.summary_ref, EXPLORATION, "head_tail", False)
            continue
        tested = {run.output_ref for run, _ in testing_runs(tool_runs(branch), command_of) if run.output_ref}
        acted = False
        for t in branch.transitions:
            acted = acted or t.role == "assistant"
            prompt = t.role in _BOILERPLATE_ROLES or (t.role == "user" and not acted)
            see(t.text_ref, BOILERPLATE if prompt else STEPS, "head_tail", live)
            if t.tool_call:
                see(t.tool_call.get("arguments_ref"), STEPS, "head_tail", live)
            if t.tool_output:
                ref = t.tool_output.get("output_ref")
                see(ref, *((BOILERPLATE, "tail") if ref in tested else (EXPLORATION, "head_tail")), live)
    return worth


__all__ = ["BOILERPLATE", "EXPLORATION", "FINAL_MESSAGE", "RANKS", "SHAPES", "STEPS", "SUBMISSION", "TASK",
           "VERIFICATION", "Worth", "body_worth"]
