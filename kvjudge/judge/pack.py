"""Packing two runs into one judge window.

A pair fits when framing + both views + the answer fit the window: then both are read whole. When they do
not, the window is shared fairly: a view under half of the room keeps its whole text and the other gets
the rest; otherwise each gets half. A run whose view is over its allowance is shown as a *further-reduced
view*: the retention's own pure :func:`~kvjudge.retention.reduce.plan_reduction` derives it on the fly
(same deterministic summaries, same loss order), and nothing is stored. If even the skeleton (every
transition, no text) does not fit, the run cannot be judged in this window: its view is ``None`` and the
verdict's outcome is ``overflow``.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kvjudge.errors import UsageError
from kvjudge.judge.render import TextOf, body_resolver, elided_resolver, render_view
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

    @property
    def sha256(self) -> str | None:
        """sha256 of the text the judge read (None on overflow): two views differ exactly when these do."""
        return None if self.text is None else hashlib.sha256(self.text.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class BaseView:
    """One run's view before it is fitted to a window: the text and the state it was rendered from."""

    run_id: str
    state: Any
    text_of: TextOf
    text: str
    tokens: int
    full_tokens: int | None
    reduced_tokens: int
    show: dict[str, bool]
    notes: tuple[str, ...] = ()
    # Fitted views by allowance: a run met in many pairs is fitted once per allowance (PackedView is frozen).
    fitted: dict[int, PackedView] = dataclasses.field(default_factory=dict, compare=False, repr=False)


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


def base_view(store: Any, state: Any, count: CountFn, *, show_grades: bool = False, show_verifier: bool = False,
              reduce_to: int | None = None, full: bool = False) -> BaseView:
    """Render ``state`` from ``store`` as the judge would read it in an unlimited window.

    ``reduce_to``: first reduce the view to that many body tokens (derived, never stored: the reduced
    side of a still-grades check on runs not yet reduced in the store). ``full``: start from the original
    bodies wherever the store can still read them (the full side); when some are gone, the stored view is
    used and a note says so.
    """
    show = {"show_grades": show_grades, "show_verifier": show_verifier}
    notes: list[str] = []
    text_of: TextOf = store.text
    stored = render_view(state, body_resolver(state, text_of), **show)
    reduced_tokens = count(stored)
    if state.reduced:
        originals = body_resolver(state, text_of, originals=True)
        full_text = render_view(state, originals, full=True, **show)
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
            base_state, base_text_of = _plan_view(state, text_of, count, reduce_to, {})
            planned = render_view(base_state, body_resolver(base_state, base_text_of), **show)
            if planned != base_text:
                base_text, base_tokens = planned, count(planned)
                notes.append(f"reduced to a {reduce_to}-token target for this check (a view, not stored)")
            else:
                notes.append(f"nothing left to reduce toward a {reduce_to}-token target: the view is unchanged")
        reduced_tokens = base_tokens
    return BaseView(state.id, base_state, base_text_of, base_text, base_tokens, full_tokens, reduced_tokens, show,
                    tuple(notes))


def fit_view(base: BaseView, count: CountFn, allowance: int) -> PackedView:
    """``base`` within ``allowance`` tokens: whole, further reduced (a view, never stored), or None."""
    if allowance not in base.fitted:
        base.fitted[allowance] = _fit_view(base, count, allowance)
    return base.fitted[allowance]


def _fit_view(base: BaseView, count: CountFn, allowance: int) -> PackedView:
    notes = list(base.notes)

    def packed(text: str | None, view_tokens: int | None, further: bool) -> PackedView:
        return PackedView(base.run_id, text, RunTokens(full=base.full_tokens, reduced=base.reduced_tokens,
                                                       view=view_tokens, further_reduced=further), tuple(notes))

    if base.tokens <= allowance:
        return packed(base.text, base.tokens, False)
    skeleton = render_view(base.state, elided_resolver, **base.show)
    skeleton_tokens = count(skeleton)
    if skeleton_tokens > allowance:
        notes.append(f"even the skeleton takes {skeleton_tokens} tokens, over the {allowance}-token allowance")
        return packed(None, None, True)
    # Largest body target whose rendered view fits: bisect on the target (summaries carry markers and the
    # view carries step headers, so the body count alone does not tell).
    counts: dict[str, int] = {}
    low, high = 0, base.tokens
    best: tuple[str, int] | None = None
    target = max(1, allowance - skeleton_tokens)
    for _ in range(_FURTHER_ROUNDS):
        if target <= low or target >= high:
            break
        view_state, view_text_of = _plan_view(base.state, base.text_of, count, target, counts)
        text = render_view(view_state, body_resolver(view_state, view_text_of), **base.show)
        tokens = count(text)
        if tokens <= allowance:
            low, best = target, (text, tokens) if best is None or tokens > best[1] else best
        else:
            high = target
        target = (low + high) // 2
    if best is not None:
        notes.append(f"further reduced from {base.tokens} to {best[1]} tokens to fit the {allowance}-token "
                     f"allowance (a view, not stored)")
        return packed(best[0], best[1], True)
    notes.append(f"only the skeleton fits the {allowance}-token allowance: all text elided")
    return packed(skeleton, skeleton_tokens, True)


def allowances(tokens_a: int, tokens_b: int, room: int) -> tuple[int, int]:
    """Each view's share of ``room`` tokens: both whole when they fit; else a view under half keeps its
    whole text and the other gets the rest; else half each."""
    if tokens_a + tokens_b <= room:
        return tokens_a, tokens_b
    half = room // 2
    if tokens_a <= half:
        return tokens_a, room - tokens_a
    if tokens_b <= half:
        return room - tokens_b, tokens_b
    return half, room - half


def pack_pair(base_a: BaseView, base_b: BaseView, count: CountFn, room: int) -> tuple[PackedView, PackedView]:
    """Fit two views into ``room`` tokens (the window less the framing and the answer)."""
    if room <= 0:
        raise UsageError(f"the window leaves no room for the runs after the framing ({room} tokens); "
                         f"use a larger --n-ctx")
    allow_a, allow_b = allowances(base_a.tokens, base_b.tokens, room)
    return fit_view(base_a, count, allow_a), fit_view(base_b, count, allow_b)


def pack_run(store: Any, state: Any, count: CountFn, allowance: int, *, show_grades: bool = False,
             show_verifier: bool = False, reduce_to: int | None = None, full: bool = False) -> PackedView:
    """Render ``state`` from ``store`` and fit it into ``allowance`` tokens (see :func:`base_view`)."""
    return fit_view(base_view(store, state, count, show_grades=show_grades, show_verifier=show_verifier,
                              reduce_to=reduce_to, full=full), count, allowance)
