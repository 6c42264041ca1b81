"""Reduction's last two loss steps, on dead branches (largest first) while the run is still over its target: each
read as one head-and-tail extract of its text, then its text dropped where no live reader still sees it. Called by
:func:`kvjudge.retention.reduce.plan_reduction` on its :class:`~kvjudge.retention.reduce_planner.Planner`."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from kvjudge.retention import events as ev
from kvjudge.retention.extract import head_tail_extract
from kvjudge.retention.reduce_planner import Planner
from kvjudge.retention.state import DROPPED, REDUCED, Branch, RunState, branch_view


def _dead_branches_by_size(planner: Planner) -> list[int]:
    state = planner.state
    sizes = [(sum(planner.count(ref) for ref in branch_view(state, index)), index)
             for index, branch in enumerate(state.branches) if branch.status == "dead"]
    return [index for size, index in sorted(sizes, key=lambda item: (-item[0], state.branches[item[1]].id))
            if size > 0]


def _dead_branches_while_over(planner: Planner, token_target: int) -> Iterator[tuple[RunState, int, Branch]]:
    """Each dead branch with text, largest first, with its index and the run as it stands, while the run is over
    ``token_target`` (what steps 2 and 3 go through)."""
    for index in _dead_branches_by_size(planner):
        if planner.tokens() <= token_target:
            return
        state = planner.state
        yield state, index, state.branches[index]


def extract_dead_branches(planner: Planner, token_target: int) -> int:
    """Step 2: each dead branch (largest first) is read as one head-and-tail extract of its text."""
    done = 0
    for state, index, branch in _dead_branches_while_over(planner, token_target):
        if branch.summary_ref is not None:
            continue
        refs = branch_view(state, index)
        before = sum(planner.count(ref) for ref in refs)
        body = "\n".join(planner.text(ref) for ref in refs)
        keep = max(0, min(before // 4, token_target // (2 * max(1, len(state.branches)))))
        text = head_tail_extract(body, tokens=before, keep_tokens=keep)
        summary_ref, after = planner.add_blob(text)
        if after >= before:
            continue
        planner.commit([ev.BranchReduced(run=state.id, branch=branch.id, summary=summary_ref, counter=planner.counter,
                                         tokens_before=before, tokens_after=after)])
        done += 1
    return done


def drop_dead_text(planner: Planner, token_target: int) -> int:
    """Step 3: drop the text of dead branches (largest first); refs a live reader still sees are kept.

    Passes repeat until one drops nothing: a ref two dead branches share (an extract can equal another body's)
    is kept while either still shows it, so it may only become droppable once the other has gone. Without the
    repeat, reducing the same run again to the same target would drop it then — not idempotent."""
    dropped = 0
    while planner.tokens() > token_target:
        dropped_now = _drop_dead_text_once(planner, token_target)
        dropped += dropped_now
        if dropped_now == 0:
            break
    return dropped


def _drop_dead_text_once(planner: Planner, token_target: int) -> int:
    dropped = 0
    for state, index, branch in _dead_branches_while_over(planner, token_target):
        elsewhere: set[str] = set()
        if state.task_prompt_ref:
            elsewhere.add(state.task_prompt_ref)
        for other_index, other in enumerate(state.branches):
            if other_index != index:
                elsewhere.update(other.refs())
                if other.summary_ref:
                    elsewhere.add(other.summary_ref)
        chain: list[str] = []
        for ref in [*branch.refs(), *([branch.summary_ref] if branch.summary_ref else [])]:
            current: str | None = ref
            # The original and every summary standing in for it.
            while current is not None and current not in chain:
                chain.append(current)
                location = state.bodies.get(current)
                current = location.summary_ref if location is not None and location.status == REDUCED else None
        protected = _closure(state, elsewhere)
        batch = [ev.Dropped(run=state.id, original=ref) for ref in chain
                 if ref not in protected and state.bodies[ref].status != DROPPED]
        if batch:
            planner.commit(batch)
            dropped += len(batch)
    return dropped


def _closure(state: RunState, refs: Iterable[str]) -> set[str]:
    """``refs`` plus every summary that stands in for one of them."""
    found: set[str] = set()
    for ref in refs:
        current: str | None = ref
        while current is not None and current not in found:
            found.add(current)
            location = state.bodies.get(current)
            current = location.summary_ref if location is not None and location.status == REDUCED else None
    return found



__all__ = ["drop_dead_text", "extract_dead_branches"]
