"""Packing two runs into one judge window.

Text both runs of a pair show word for word (a harness's system prompt and instance template, the task) is quoted
once, in a block common to both runs (:mod:`kvjudge.judge.prompt`), and each view shows ``[common text N]`` in
its place: the tokens saved go to what differs. A pair fits when framing + common block + both views + the answer
fit the window: then both are read whole. When they do not, the block keeps only the shared pieces that are
decisive evidence (the task: :mod:`kvjudge.retention.worth`) — the rest, cut first anyway, is cut in each view to
its marker — and the room left beside the block is shared fairly: a view under half of it keeps its whole text
and the other gets the rest; otherwise each gets half. A run whose view is over its allowance is shown as a
*further-reduced view*: the retention's own pure :func:`~kvjudge.retention.reduce.plan_reduction` derives it on
the fly (same deterministic extracts, same loss order, so the run's decisive evidence is cut last), and nothing
is stored. If even the skeleton (every transition, no text) does not fit, the run cannot be judged in this
window: its view is ``None`` and the verdict's outcome is ``overflow``.

A pair that fits is read whole, its block included, whatever the window: so what a pair reads depends on the
window only when it must be cut, and then the window is the largest the judge may open (its cap) — which is what
lets a verdict be found in the cache from what identifies it (:mod:`kvjudge.judge.verdict`).

Token counts are sums of parts (:mod:`kvjudge.judge.viewcount`): no view is tokenized whole.

Every packed view also says how much of its run's decisive evidence it shows
(:mod:`kvjudge.retention.evidence`: the share of the final submission, whether the last test outcome is there),
beside the same figures for the run's full view.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kvjudge.errors import UsageError
from kvjudge.judge.prompt import COMMON_CLOSING, COMMON_OPENING, common_reference
from kvjudge.judge.render import (
    BodyResolver,
    TextOf,
    ViewParts,
    body_resolver,
    elided_resolver,
    escape,
    quoting_resolver,
    recording_resolver,
    render_parts,
)
from kvjudge.judge.viewcount import AnyCounter, CountFn, ViewCounter, view_counter
from kvjudge.retention.evidence import EvidenceLines, Visibility, evidence_lines, find_evidence, readable, visibility
from kvjudge.retention.reduce import plan_reduction, view_refs
from kvjudge.retention.state import LOCAL, TIERED
from kvjudge.retention.worth import FINAL_MESSAGE, body_worth

if TYPE_CHECKING:
    from kvjudge.retention import Store
    from kvjudge.retention.state import RunState

# The answer is one label token.
ANSWER_TOKENS = 1
# Bisection rounds for the further-reduced view's body target (each: one plan, one render, one sum of counts).
_FURTHER_ROUNDS = 8
# A body both runs show goes to the common block only from this many characters on: below it, the reference
# and the piece's heading would save little or nothing.
COMMON_MIN_CHARS = 120

__all__ = ["ANSWER_TOKENS", "COMMON_MIN_CHARS", "BaseView", "CommonBlock", "CountFn", "PackedView", "PairBases",
           "RunTokens", "allowances", "base_view", "common_block", "fit_view", "pack_pair", "pack_run", "pair_bases",
           "with_common"]


@dataclass(frozen=True)
class RunTokens:
    """Token counts of one run in a verdict (the model's own tokenizer).

    ``full``: the run with every original body (None when some originals are gone);
    ``reduced``: the run as the store holds it (or as reduced for a still-grades check; None when the
    backend failed before counting);
    ``view``: what the judge read of the run itself (None on overflow; the common block is counted apart);
    ``further_reduced``: the view was cut further to fit.
    """

    full: int | None
    reduced: int | None
    view: int | None
    further_reduced: bool


@dataclass(frozen=True)
class PackedView:
    """One run's view for the judge; ``text`` is None when even its skeleton exceeds the allowance.

    ``segments`` are the view's segments in the prompt (``text`` joined), ``common`` the block of text both runs of
    the pair share (its inner text; empty when there is none) and ``common_segments`` its segments; ``evidence``
    how much of the run's decisive evidence the judge reads (view and common block together), ``evidence_full``
    the same for the run's full view; ``missing`` the bodies the view could not read (shown as a marker)."""

    run_id: str
    text: str | None
    tokens: RunTokens
    notes: tuple[str, ...] = ()
    common: str = ""
    common_tokens: int = 0
    evidence: Visibility | None = None
    evidence_full: Visibility | None = None
    segments: tuple[str, ...] = dataclasses.field(default=(), repr=False)
    common_segments: tuple[str, ...] = dataclasses.field(default=(), repr=False)
    missing: int = 0

    @functools.cached_property
    def sha256(self) -> str | None:
        """sha256 of the text the judge read (None on overflow): two views differ exactly when these do."""
        return None if self.text is None else hashlib.sha256(self.text.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class CommonBlock:
    """Bodies both runs of a pair show, quoted once: ``text`` (escaped, the pieces under their headings) and its
    ``parts``, ``tokens`` (its segments in the prompt, delimiters included) and ``references`` (shown ref →
    reference)."""

    text: str
    tokens: int
    references: Mapping[str, str]
    parts: ViewParts = dataclasses.field(default=ViewParts((), ()), repr=False)


@dataclass(frozen=True)
class BaseView:
    """One run's view before it is fitted to a window: the text, the state it was rendered from and how.

    ``parts`` are the view's segments (``text`` joined); ``resolver`` reads the bodies ``text`` shows and
    ``render_full`` says whether dead branches were shown step by step; ``shown`` maps each body the view shows
    with its text (shown ref → text, in reading order). ``ranks`` the worth rank of each body the view shows
    (:mod:`kvjudge.retention.worth`). ``references`` (shown ref → ``[common text N]``) are the bodies a pair's
    common block quotes for this view, ``quoted_tokens`` their references' tokens by view ref, ``block`` that
    block. ``complete``: every body the view shows was read (none missing, and a full view from every original)."""

    run_id: str
    state: RunState
    text_of: TextOf
    text: str
    tokens: int
    full_tokens: int | None
    reduced_tokens: int
    show: dict[str, bool]
    notes: tuple[str, ...] = ()
    resolver: BodyResolver | None = dataclasses.field(default=None, compare=False, repr=False)
    render_full: bool = False
    shown: Mapping[str, str] = dataclasses.field(default_factory=dict, compare=False, repr=False)
    evidence: EvidenceLines | None = None
    evidence_full: Visibility | None = None
    ranks: Mapping[str, int] = dataclasses.field(default_factory=dict, compare=False, repr=False)
    references: Mapping[str, str] = dataclasses.field(default_factory=dict)
    quoted_tokens: Mapping[str, int] = dataclasses.field(default_factory=dict)
    block: CommonBlock | None = None
    parts: ViewParts = dataclasses.field(default=ViewParts((), ()), compare=False, repr=False)
    complete: bool = True
    # Fitted views by allowance, and this view beside a block by the block's references: a run met in many pairs
    # is fitted and quoted once each (the views are frozen).
    fitted: dict[int, PackedView] = dataclasses.field(default_factory=dict, compare=False, repr=False)
    beside: dict[tuple[tuple[str, str], ...], BaseView] = dataclasses.field(default_factory=dict, compare=False,
                                                                            repr=False)

    @property
    def common(self) -> str:
        """The text of the block this view is read beside (empty: none)."""
        return "" if self.block is None else self.block.text

    @property
    def common_tokens(self) -> int:
        return 0 if self.block is None else self.block.tokens

    def measure(self, text: str | None) -> Visibility | None:
        """How much of the run's evidence ``text`` (with the common block) shows."""
        if self.evidence is None:
            return None
        return visibility(self.evidence, f"{self.common}\n{text or ''}", escape)


def _view_state(state: RunState) -> RunState:
    # plan_reduction refuses runs whose grading has not terminated, because it plans what will be *stored*. A judge
    # view is never stored (and judging is part of grading), so the lifecycle gate does not apply to it: plan on a
    # copy that says "graded". Likewise a body in cold storage is read through the store like a local one: the
    # view of a tiered run is the view of the same run kept local.
    if state.is_reducible and not any(loc.status == TIERED for loc in state.bodies.values()):
        return state
    bodies = {ref: dataclasses.replace(loc, status=LOCAL) if loc.status == TIERED else loc
              for ref, loc in state.bodies.items()}
    return dataclasses.replace(state, state=state.state if state.is_reducible else "graded", bodies=bodies)


def _plan_view(state: RunState, text_of: TextOf, counter: ViewCounter, target: int,
               quoted: Mapping[str, int] | None = None) -> tuple[RunState, TextOf]:
    """The state and body reader of ``state`` reduced to ``target`` body tokens (nothing stored)."""
    plan = plan_reduction(_view_state(state), text_of, counter.count, max(1, target), counts=counter.known(),
                          quoted_elsewhere=quoted)
    counter.learn(plan.new_counts)
    return plan.state_after, (lambda ref, _plan=plan: _plan.text_of(ref, text_of))


def _rendered(state: RunState, resolver: BodyResolver, show: dict[str, bool], *,
              full: bool = False) -> tuple[ViewParts, dict[str, str]]:
    shown: dict[str, str] = {}
    return render_parts(state, recording_resolver(resolver, shown), full=full, **show), shown


def _memo(text_of: TextOf) -> TextOf:
    """``text_of`` reading each body once (rendering, evidence and worth all read the same bodies)."""
    read: dict[str, str | None] = {}

    def text(ref: str) -> str | None:
        if ref not in read:
            read[ref] = text_of(ref)
        return read[ref]

    return text


def base_view(store: Store, state: RunState, count: AnyCounter, *, show_grades: bool = False,
              show_verifier: bool = False, reduce_to: int | None = None, full: bool = False) -> BaseView:
    """Render ``state`` from ``store`` as the judge would read it in an unlimited window.

    ``reduce_to``: first reduce the view to that many body tokens (derived, never stored: the reduced
    side of a still-grades check on runs not yet reduced in the store). ``full``: start from the original
    bodies wherever the store can still read them (the full side); when some are gone, the stored view is
    used and a note says so. ``count`` is a :class:`~kvjudge.judge.viewcount.ViewCounter` (bodies counted once,
    through the store's count cache) or a bare function.
    """
    counter = view_counter(count)
    show = {"show_grades": show_grades, "show_verifier": show_verifier}
    notes: list[str] = []
    text_of: TextOf = _memo(store.blobs.text)
    stored_resolver = body_resolver(state, text_of)
    stored, stored_shown = _rendered(state, stored_resolver, show)
    counter.load_parts(store.caches, stored, state.bodies)
    reduced_tokens = counter.parts(stored)
    complete = not stored.missing
    if state.reduced:
        originals = body_resolver(state, text_of, originals=True)
        full_parts, full_shown = _rendered(state, originals, show, full=True)
        counter.load_parts(store.caches, full_parts)
        readable_all = all(originals(ref).kind == "original" for ref in state.bodies
                           if state.bodies[ref].status in ("reduced", "dropped"))
        full_tokens = counter.parts(full_parts) if readable_all else None
    else:
        full_parts, full_tokens, originals, full_shown = stored, reduced_tokens, stored_resolver, stored_shown
    found = find_evidence(state, text_of)
    evidence = evidence_lines(found, text_of)
    evidence_full = visibility(evidence, full_parts.text, escape)
    base_state, base_text_of, base_parts, base_tokens = state, text_of, stored, reduced_tokens
    resolver, render_full, shown = stored_resolver, False, stored_shown
    if full:
        if full_tokens is not None:
            base_parts, base_tokens = full_parts, full_tokens
            resolver, render_full, shown = originals, state.reduced, full_shown
            complete = not full_parts.missing
            if state.reduced:
                notes.append("full view from the original bodies the store can still read")
        else:
            complete = False
            notes.append("originals of reduced bodies are gone: the full side reads the stored (reduced) view")
    if reduce_to is not None:
        if reduce_to <= 0:
            raise UsageError(f"--reduce-to must be a positive number of tokens, got {reduce_to}")
        if base_tokens > reduce_to:
            base_state, base_text_of = _plan_view(state, text_of, counter, reduce_to)
            planned_resolver = body_resolver(base_state, base_text_of)
            planned, planned_shown = _rendered(base_state, planned_resolver, show)
            if planned.text != base_parts.text:
                base_parts, base_tokens = planned, counter.parts(planned)
                resolver, render_full, shown = planned_resolver, False, planned_shown
                notes.append(f"reduced to a {reduce_to}-token target for this check (a view, not stored)")
            else:
                notes.append(f"nothing left to reduce toward a {reduce_to}-token target: the view is unchanged")
        reduced_tokens = base_tokens
    counter.save(store.caches)
    worth = body_worth(base_state, found, readable(base_state, base_text_of))
    ranks = {ref: value.rank for ref, value in worth.items()}
    return BaseView(state.id, base_state, base_text_of, base_parts.text, base_tokens, full_tokens, reduced_tokens,
                    show, tuple(notes), resolver=resolver, render_full=render_full, shown=shown, evidence=evidence,
                    evidence_full=evidence_full, ranks=ranks, parts=base_parts, complete=complete)


def fit_view(base: BaseView, count: AnyCounter, allowance: int) -> PackedView:
    """``base`` within ``allowance`` tokens: whole, further reduced (a view, never stored), or None."""
    if allowance not in base.fitted:
        base.fitted[allowance] = _fit_view(base, view_counter(count), allowance)
    return base.fitted[allowance]


def _resolver_of(base: BaseView, state: RunState, text_of: TextOf) -> BodyResolver:
    resolver = body_resolver(state, text_of)
    return quoting_resolver(resolver, base.references) if base.references else resolver


def _fit_view(base: BaseView, counter: ViewCounter, allowance: int) -> PackedView:
    notes = list(base.notes)
    block = base.block

    def packed(parts: ViewParts | None, view_tokens: int | None, further: bool) -> PackedView:
        text = None if parts is None else parts.text
        return PackedView(base.run_id, text, RunTokens(full=base.full_tokens, reduced=base.reduced_tokens,
                                                       view=view_tokens, further_reduced=further), tuple(notes),
                          base.common, base.common_tokens, base.measure(text), base.evidence_full,
                          () if parts is None else parts.texts, () if block is None else block.parts.texts,
                          0 if parts is None else parts.missing)

    if base.tokens <= allowance:
        return packed(base.parts, base.tokens, False)
    skeleton = render_parts(base.state, elided_resolver, **base.show)
    skeleton_tokens = counter.parts(skeleton)
    if skeleton_tokens > allowance:
        notes.append(f"even the skeleton takes {skeleton_tokens} tokens, over the {allowance}-token allowance")
        return packed(None, None, True)
    # Largest body target whose rendered view fits: bisect on the target (extracts carry markers and the
    # view carries step headers, so the body count alone does not tell).
    visible = set(view_refs(base.state))
    quoted = {ref: tokens for ref, tokens in base.quoted_tokens.items() if ref in visible}
    low, high = 0, base.tokens
    best: tuple[ViewParts, int] | None = None
    target = max(1, allowance - skeleton_tokens)
    for _ in range(_FURTHER_ROUNDS):
        if target <= low or target >= high:
            break
        view_state, view_text_of = _plan_view(base.state, base.text_of, counter, target, quoted)
        parts = render_parts(view_state, _resolver_of(base, view_state, view_text_of), **base.show)
        tokens = counter.parts(parts)
        if tokens <= allowance:
            low, best = target, (parts, tokens) if best is None or tokens > best[1] else best
        else:
            high = target
        target = (low + high) // 2
    if best is not None:
        notes.append(f"further reduced from {base.tokens} to {best[1]} tokens to fit the {allowance}-token "
                     f"allowance (a view, not stored)")
        return packed(best[0], best[1], True)
    notes.append(f"only the skeleton fits the {allowance}-token allowance: all text elided")
    return packed(skeleton, skeleton_tokens, True)


# ------------------------------------------------------------------------------------ the common block
def common_block(base_a: BaseView, base_b: BaseView, count: AnyCounter, *,
                 decisive_only: bool = False) -> CommonBlock | None:
    """The block of text both views show word for word (None when they share nothing worth quoting once).

    Pieces are the bodies both views show (the same ref: the same bytes) of at least :data:`COMMON_MIN_CHARS`
    characters — with ``decisive_only``, only those both rank as decisive evidence — numbered by the sum of
    their first places in the two views, so both orders get the same block.
    """
    places_a = {ref: place for place, ref in enumerate(base_a.shown)}
    places_b = {ref: place for place, ref in enumerate(base_b.shown)}

    def quoted(ref: str) -> bool:
        if len(base_a.shown[ref]) < COMMON_MIN_CHARS:
            return False
        return not decisive_only or min(base_a.ranks.get(ref, -1), base_b.ranks.get(ref, -1)) >= FINAL_MESSAGE

    shared = sorted((places_a[ref] + places_b[ref], ref) for ref in places_a.keys() & places_b.keys() if quoted(ref))
    if not shared:
        return None
    counter = view_counter(count)
    references = {ref: common_reference(number) for number, (_, ref) in enumerate(shared, start=1)}
    texts: list[str] = []
    bodies: list[tuple[str, bool] | None] = []
    for index, (_, ref) in enumerate(shared):
        raw = base_a.shown[ref]
        shown = escape(raw)
        texts += [("\n" if index else "") + references[ref] + "\n", shown]
        bodies += [None, (ref, shown != raw)]
    parts = ViewParts(tuple(texts), tuple(bodies))
    tokens = counter.markup(COMMON_OPENING) + counter.parts(parts) + counter.markup(COMMON_CLOSING)
    return CommonBlock(parts.text, tokens, references, parts)


def with_common(base: BaseView, block: CommonBlock, count: AnyCounter) -> BaseView:
    """``base`` as it reads beside the other run of its pair: the block's bodies as their references."""
    assert base.resolver is not None, "a base view from base_view() knows its resolver"
    counter = view_counter(count)
    parts = render_parts(base.state, quoting_resolver(base.resolver, block.references), full=base.render_full,
                         **base.show)
    # The state's own view refs whose text is quoted (a summary is quoted under its own ref).
    quoted = {ref: counter.markup(block.references[ref]) for ref in set(view_refs(base.state))
              if ref in block.references}
    return dataclasses.replace(base, text=parts.text, tokens=counter.parts(parts), references=block.references,
                               quoted_tokens=quoted, block=block, parts=parts, fitted={}, beside={})


@dataclass(frozen=True)
class PairBases:
    """Two runs' views prepared for one prompt, with the block of text both share (``a``, ``b``, ``block``; no
    block: the views as they are). ``plain`` are the views without any block."""

    a: BaseView
    b: BaseView
    block: CommonBlock | None
    plain: tuple[BaseView, BaseView]

    @property
    def tokens(self) -> int:
        """Tokens of both views and the common block: what the pair needs beside the framing."""
        return self.a.tokens + self.b.tokens + (self.block.tokens if self.block else 0)

    @property
    def complete(self) -> bool:
        """Both views read every body they show."""
        return self.plain[0].complete and self.plain[1].complete

    def tight(self, count: AnyCounter) -> PairBases:
        """The pair as it is read when it must be cut: the block quotes only shared decisive evidence."""
        if self.block is None:
            return self
        return pair_bases(*self.plain, count, decisive_only=True)


def pair_bases(base_a: BaseView, base_b: BaseView, count: AnyCounter, cache: Any = None, *,
               decisive_only: bool = False) -> PairBases:
    """The pair's views with the block of text both share (see :func:`common_block`); each run's view beside a
    block is kept on its base view, so a run met in many pairs is quoted once per block. (``cache`` is accepted
    for older callers and unused.)"""
    block = common_block(base_a, base_b, count, decisive_only=decisive_only)
    if block is None:
        return PairBases(base_a, base_b, None, (base_a, base_b))
    key = tuple(sorted(block.references.items()))
    views = []
    for base in (base_a, base_b):
        if key not in base.beside:
            base.beside[key] = with_common(base, block, count)
        views.append(base.beside[key])
    return PairBases(views[0], views[1], block, (base_a, base_b))


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


def pack_pair(base_a: BaseView, base_b: BaseView, count: AnyCounter, room: int,
              pair: PairBases | None = None) -> tuple[PackedView, PackedView]:
    """Fit two views into ``room`` tokens (the window less the framing and the answer), quoting what both show
    once (``pair``: :func:`pair_bases` of the two, when already made). A pair that fits is read whole, block and
    all; one that does not is cut as the module docstring says."""
    if room <= 0:
        raise UsageError(f"the window leaves no room for the runs after the framing ({room} tokens); "
                         f"use a larger --n-ctx")
    pair = pair or pair_bases(base_a, base_b, count)
    if pair.tokens > room:
        pair = pair.tight(count)
    if pair.block is not None and (pair.tokens <= room or pair.block.tokens <= room // 2):
        view_a, view_b = pair.a, pair.b
        room -= pair.block.tokens
    else:
        view_a, view_b = pair.plain
    allow_a, allow_b = allowances(view_a.tokens, view_b.tokens, room)
    return fit_view(view_a, count, allow_a), fit_view(view_b, count, allow_b)


def pack_run(store: Store, state: RunState, count: AnyCounter, allowance: int, *, show_grades: bool = False,
             show_verifier: bool = False, reduce_to: int | None = None, full: bool = False) -> PackedView:
    """Render ``state`` from ``store`` and fit it into ``allowance`` tokens (see :func:`base_view`)."""
    counter = view_counter(count)
    return fit_view(base_view(store, state, counter, show_grades=show_grades, show_verifier=show_verifier,
                              reduce_to=reduce_to, full=full), counter, allowance)
