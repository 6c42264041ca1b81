"""Packing two runs into one judge window.

Both runs get the same allowance, ``(n_ctx − instructions − answer) // 2`` tokens, counted with the
model's own tokenizer. A run whose view is over its allowance is shown as a *further-reduced view*:
the retention's own pure :func:`~kvjudge.retention.reduce.plan_reduction` derives it on the fly (same
deterministic summaries, same loss order), and nothing is stored. If even the skeleton (every
transition, no text) does not fit, the run cannot be judged in this window: its view is ``None`` and
the verdict's outcome is ``overflow``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kvjudge.errors import UsageError
from kvjudge.judge.render import (
    TextOf,
    body_resolver,
    elided_resolver,
    framing_segments,
    render_view,
)
from kvjudge.retention.reduce import plan_reduction

# The answer is one label token.
ANSWER_TOKENS = 1
# Bisection rounds for the further-reduced view's body target (each: one plan, one render, one count).
_FURTHER_ROUNDS = 8

CountFn = Callable[[str], int]


@dataclass(frozen=True)
class RunTokens:
    """Token counts of one run in a verdict (the model's own tokenizer).

    ``full``: the run with every original body (None when some originals are gone);
    ``reduced``: the run as the store holds it (or as reduced for a still-grades check; None when the
    backend failed before counting);
    ``view``: what the judge read (None on overflow); ``further_reduced``: the view was cut further to fit.
    """

    full: int | None
    reduced: int | None
    view: int | None
    further_reduced: bool


@dataclass(frozen=True)
class PackedView:
    """One run's view for the judge; ``text`` is None when even its skeleton exceeds the allowance."""

    run_id: str
    text: str | None
    tokens: RunTokens
    notes: tuple[str, ...] = ()


def instruction_tokens(count: CountFn) -> int:
    """Tokens of the prompt without the two views (instructions, delimiters, question)."""
    return sum(count(segment) for segment in framing_segments())


def view_allowance(backend: Any) -> int:
    """``(n_ctx − instructions − answer) // 2`` for ``backend`` (a server backend keeps a little slack)."""
    slack = getattr(backend, "slack_tokens", 0)
    allowance = (backend.n_ctx - instruction_tokens(backend.count) - ANSWER_TOKENS - slack) // 2
    if allowance <= 0:
        raise UsageError(f"n_ctx {backend.n_ctx} leaves no room for the runs after the instructions; "
                         f"use a larger --n-ctx")
    return allowance


def _view_state(state: Any) -> Any:
    # plan_reduction refuses runs whose grading has not terminated, because it plans what will be
    # *stored*. A judge view is never stored (and judging is part of grading), so the lifecycle gate
    # does not apply to it: plan on a copy that says "graded".
    return state if state.is_reducible else dataclasses.replace(state, state="graded")


def _plan_view(state: Any, text_of: TextOf, count: CountFn, target: int,
               counts: dict[str, int] | None) -> tuple[Any, TextOf]:
    """The state and body reader of ``state`` reduced to ``target`` body tokens (nothing stored)."""
    plan = plan_reduction(_view_state(state), text_of, count, max(1, target), counts=counts)
    if counts is not None:
        counts.update(plan.new_counts)
    return plan.state_after, (lambda ref, _plan=plan: _plan.text_of(ref, text_of))


def pack_run(store: Any, state: Any, count: CountFn, allowance: int, *, show_grades: bool = False,
             reduce_to: int | None = None, full: bool = False) -> PackedView:
    """Render ``state`` from ``store`` and fit it into ``allowance`` tokens.

    ``reduce_to``: first reduce the view to that many body tokens (derived, never stored: the reduced
    side of a still-grades check on runs not yet reduced in the store). ``full``: start from the original
    bodies wherever the store can still read them (the full side); when some are gone, the stored view is
    used and a note says so.
    """
    notes: list[str] = []
    text_of: TextOf = store.text
    counts: dict[str, int] = {}
    stored = render_view(state, body_resolver(state, text_of), show_grades=show_grades)
    reduced_tokens = count(stored)
    if state.reduced:
        originals = body_resolver(state, text_of, originals=True)
        full_text = render_view(state, originals, show_grades=show_grades, full=True)
        complete = all(originals(ref).kind == "original" for ref in state.bodies
                       if state.bodies[ref].status in ("reduced", "dropped"))
        full_tokens = count(full_text) if complete else None
    else:
        full_text, full_tokens = stored, reduced_tokens
    base_state, base_text_of, base_text, base_tokens = state, text_of, stored, reduced_tokens
    if full:
        if full_tokens is not None:
            base_text, base_tokens = full_text, full_tokens
            if state.reduced:
                notes.append("full view from the original bodies the store can still read")
        else:
            notes.append("originals of reduced bodies are gone: the full side reads the stored (reduced) view")
    if reduce_to is not None:
        if reduce_to <= 0:
            raise UsageError(f"--reduce-to must be a positive number of tokens, got {reduce_to}")
        if base_tokens > reduce_to:
            base_state, base_text_of = _plan_view(state, text_of, count, reduce_to, counts)
            base_text = render_view(base_state, body_resolver(base_state, base_text_of), show_grades=show_grades)
            base_tokens = count(base_text)
            notes.append(f"reduced to a {reduce_to}-token target for this check (a view, not stored)")
        reduced_tokens = base_tokens

    def packed(text: str | None, view_tokens: int | None, further: bool) -> PackedView:
        return PackedView(state.id, text, RunTokens(full=full_tokens, reduced=reduced_tokens, view=view_tokens,
                                                    further_reduced=further), tuple(notes))

    if base_tokens <= allowance:
        return packed(base_text, base_tokens, False)
    skeleton = render_view(base_state, elided_resolver, show_grades=show_grades)
    skeleton_tokens = count(skeleton)
    if skeleton_tokens > allowance:
        notes.append(f"even the skeleton takes {skeleton_tokens} tokens, over the {allowance}-token allowance")
        return packed(None, None, True)
    # Largest body target whose rendered view fits: bisect on the target (summaries carry markers and the
    # view carries step headers, so the body count alone does not tell).
    low, high = 0, base_tokens
    best: tuple[str, int] | None = None
    target = max(1, allowance - skeleton_tokens)
    for _ in range(_FURTHER_ROUNDS):
        if target <= low or target >= high:
            break
        view_state, view_text_of = _plan_view(base_state, base_text_of, count, target, counts)
        text = render_view(view_state, body_resolver(view_state, view_text_of), show_grades=show_grades)
        tokens = count(text)
        if tokens <= allowance:
            low, best = target, (text, tokens) if best is None or tokens > best[1] else best
        else:
            high = target
        target = (low + high) // 2
    if best is not None:
        notes.append(f"further reduced from {base_tokens} to {best[1]} tokens to fit the {allowance}-token "
                     f"allowance (a view, not stored)")
        return packed(best[0], best[1], True)
    notes.append(f"only the skeleton fits the {allowance}-token allowance: all text elided")
    return packed(skeleton, skeleton_tokens, True)
