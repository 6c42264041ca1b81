"""Reduction planning: what shrinking one run to a token target takes, decided without writing anything.

Loss order, fixed (stop as soon as the run fits):

1. blob bodies → summary blobs, each an extract (:mod:`kvjudge.retention.extract`), in the order of their worth
   (:mod:`kvjudge.retention.worth`): exploration output first, then a harness's prompts and earlier test logs,
   then the agent's steps, and the run's decisive evidence (:mod:`kvjudge.retention.evidence`: final message,
   task, last verification, final submission) last — earlier before later within each, the least cutting
   that fits;
2. dead-branch attempts → one summary blob (an extract of the branch's text) per dead branch (largest first);
3. drop the text on dead branches (its raw bodies and its summary), largest first.

Transitions, context partitions, tool info, usage, verifier results and grades are never touched.

Step 1 is :mod:`kvjudge.retention.reduce_bodies`, steps 2 and 3 :mod:`kvjudge.retention.reduce_branches`; each works
on the plan's working memory, :class:`~kvjudge.retention.reduce_planner.Planner`.

:func:`plan_reduction` is pure: it reads the folded state, texts and counts, and returns a
:class:`ReductionPlan` (the events to append, the summary blobs to put, the state they fold to) — the
judge uses it to derive a further-reduced *view* without storing anything. Applying a plan to a store is
:mod:`kvjudge.retention.reduce_apply`'s job; reducing a selection of runs, :mod:`kvjudge.retention.reduce_runs`'s.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvjudge.errors import RunStateError, UsageError
from kvjudge.retention import events as ev
from kvjudge.retention.reduce_bodies import reduce_bodies
from kvjudge.retention.reduce_branches import drop_dead_text, extract_dead_branches
from kvjudge.retention.reduce_planner import CountFn, EndsFn, Planner, TextOf
from kvjudge.retention.state import RunState, branch_view, resolve, view_refs
from kvjudge.tokens import SplicingCounter, TokenCounter, count_texts


# ----------------------------------------------------------------------- the view
def view_tokens(state: RunState, counts: Mapping[str, int]) -> int:
    """Tokens of text a reader of the run sees (bodies only; markers of dropped text are not counted)."""
    return sum(counts[ref] for ref in view_refs(state))


# ------------------------------------------------------------------------ the plan
@dataclass(frozen=True)
class ReductionPlan:
    """What reducing one run to ``token_target`` takes. Pure data: nothing is written by planning."""

    run_id: str
    counter: str
    token_target: int
    tokens_before: int
    tokens_after: int
    events: tuple[ev.Event, ...]
    blobs: Mapping[str, str]  # ref → text of each new summary blob
    new_counts: Mapping[str, int]  # counts made while planning (store them: never count a body twice)
    state_after: RunState  # the state the events fold to (planned events carry LSN 0)
    base_digest: str  # sha256 of the canonical state the plan was made from
    steps: Mapping[str, int] = field(default_factory=dict)

    @property
    def fits(self) -> bool:
        return self.tokens_after <= self.token_target

    @property
    def noop(self) -> bool:
        return not self.events

    def text_of(self, ref: str, fallback: TextOf) -> str | None:
        """Text of ``ref`` in the reduced view: a planned summary, else ``fallback(ref)``."""
        return self.blobs[ref] if ref in self.blobs else fallback(ref)

    def to_dict(self) -> dict[str, Any]:
        return {"run": self.run_id, "counter": self.counter, "target_tokens": self.token_target,
                "tokens_before": self.tokens_before, "tokens_after": self.tokens_after, "fits": self.fits,
                "events": len(self.events), "steps": dict(self.steps)}


def state_digest(state: RunState) -> str:
    """sha256 of ``state``'s canonical bytes: what a plan records of the state it was made from."""
    return hashlib.sha256(state.canonical_bytes()).hexdigest()


def plan_reduction(state: RunState, text_of: TextOf, count: TokenCounter | CountFn, token_target: int, *,
                   counts: Mapping[str, int] | None = None, counter_name: str | None = None,
                   quoted_elsewhere: Mapping[str, int] | None = None) -> ReductionPlan:
    """Plan the reduction of ``state`` to at most ``token_target`` tokens of visible text. Pure.

    ``text_of(ref)`` returns a body's text (or None); ``count`` is a TokenCounter or ``text → int``;
    ``counts`` are already-known counts by ref under this counter (so no body is counted twice).
    ``quoted_elsewhere`` names refs the reader reads elsewhere (a judge's block of text common to both runs of a
    pair), with the tokens of what stands in for them in the view: they are counted so and never cut.
    Refuses (RunStateError) a run whose grading has not terminated. ``plan.fits`` is False when even
    the last loss step cannot reach the target (the plan then goes as far as the loss order allows).
    """
    if not state.is_reducible:
        raise RunStateError(f"run {state.id} is {state.state}; only graded, ungraded or archived runs can be "
                            f"reduced (finish grading first: `kvjudge mark {state.id} graded|ungraded`)")
    if not isinstance(token_target, int) or isinstance(token_target, bool) or token_target <= 0:
        raise UsageError(f"the reduction target must be a positive number of tokens, got {token_target!r}")
    ends_of: EndsFn | None = None
    if isinstance(count, TokenCounter):
        counter = count
        count_fn: CountFn = counter.count
        name = counter_name or counter.name
        if isinstance(counter, SplicingCounter):
            ends_of = counter.token_ends

        def count_many(texts: Sequence[str]) -> list[int]:
            return count_texts(counter, texts)
    else:
        count_fn, name = count, counter_name or "custom"

        def count_many(texts: Sequence[str]) -> list[int]:
            return [count_fn(text) for text in texts]
    planner = Planner(state, text_of, count_fn, count_many, name, counts or {}, quoted_elsewhere or {}, ends_of)
    tokens_before = planner.tokens()
    steps = {"bodies_reduced": 0, "branches_reduced": 0, "dropped": 0}
    if tokens_before > token_target:
        steps["bodies_reduced"] = reduce_bodies(planner, token_target)
    if planner.tokens() > token_target:
        steps["branches_reduced"] = extract_dead_branches(planner, token_target)
    if planner.tokens() > token_target:
        steps["dropped"] = drop_dead_text(planner, token_target)
    return ReductionPlan(
        run_id=state.id, counter=name, token_target=token_target, tokens_before=tokens_before,
        tokens_after=planner.tokens(), events=tuple(planner.events), blobs=dict(planner.blobs),
        new_counts=dict(planner.new_counts), state_after=planner.state, base_digest=state_digest(state),
        steps=steps)


__all__ = ["CountFn", "ReductionPlan", "TextOf", "branch_view", "plan_reduction", "resolve", "state_digest",
           "view_refs", "view_tokens"]
