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

:func:`plan_reduction` is pure: it reads the folded state, texts and counts, and returns a
:class:`ReductionPlan` (the events to append, the summary blobs to put, the state they fold to) — the
judge uses it to derive a further-reduced *view* without storing anything. Applying a plan to a store is
:mod:`kvjudge.retention.reduce_apply`'s job; reducing a selection of runs, :mod:`kvjudge.retention.reduce_runs`'s.
"""

from __future__ import annotations

import hashlib
import math
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvjudge.errors import IntegrityError, RunStateError, UsageError
from kvjudge.retention import events as ev
from kvjudge.retention.blobs import ref_of, short
from kvjudge.retention.evidence import find_evidence, is_patch
from kvjudge.retention.extract import HeadTail, diff_extract, head_tail_cut, head_tail_extract
from kvjudge.retention.state import (
    DROPPED,
    LOCAL,
    REDUCED,
    Branch,
    RunState,
    branch_view,
    fold_onto,
    resolve,
    view_refs,
)
from kvjudge.retention.worth import body_worth
from kvjudge.tokens import SplicingCounter, TokenCounter, TokenEnds, count_texts

TextOf = Callable[[str], "str | None"]
CountFn = Callable[[str], int]
CountManyFn = Callable[[Sequence[str]], list[int]]
EndsFn = Callable[[str], "TokenEnds | None"]

# Plans of step 1 made for smaller budgets while real extracts overshoot the estimate, before cutting all.
_ROUNDS = 8
# The line breaks that join an extract's kept parts to its marker (beyond the marker alone).
_JOIN_TOKENS = 2
# Bodies up to this size stay in memory while a run is planned (commands and messages are read several times),
# and larger ones while the run's kept text stays under _KEPT_RUN_CHARS (each extract of a body reads it again;
# past that, the largest tool outputs are read again from the store rather than held).
_KEPT_TEXT_CHARS = 16_384
_KEPT_RUN_CHARS = 8 << 20
# A summary must save at least this many tokens to be worth a blob and an event.
_MIN_SAVING = 8
# Bodies from this size on are counted with where their tokens end (a splicing counter), so an extract of one is
# counted by tokenizing only the lines around its marker, not its kept head and tail again.
_ENDS_MIN_CHARS = 2048


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


class _Planner:
    """Working memory of one plan_reduction call."""

    def __init__(self, state: RunState, text_of: TextOf, count: CountFn, count_many: CountManyFn, counter: str,
                 counts: Mapping[str, int], quoted: Mapping[str, int], ends_of: EndsFn | None = None) -> None:
        self.state = state
        self.base = state
        self.text_of_store = text_of
        self.count_fn = count
        self.count_many = count_many
        self.ends_of = ends_of
        self.ends: dict[str, TokenEnds] = {}  # where the tokens of the large bodies counted here end
        self.counter = counter
        self.counts: dict[str, int] = {**counts, **quoted}
        self.quoted = frozenset(quoted)
        self.new_counts: dict[str, int] = {}
        self.blobs: dict[str, str] = {}
        self.events: list[ev.Event] = []
        self.read_texts: dict[str, str | None] = {}  # bodies read once while planning (the small ones are kept)
        self.last_tokens: tuple[RunState, int] | None = None  # the last state counted, and its tokens
        self.kept_chars = 0  # characters of the large bodies in read_texts

    def text(self, ref: str) -> str:
        text = self.read(ref)
        if text is None:
            raise IntegrityError(f"run {self.state.id}: the body of {short(ref)} is missing but the log says it "
                                 f"is {self.state.bodies[ref].status}; run `kvjudge verify`")
        return text

    def read(self, ref: str) -> str | None:
        """A body's text, or None when it is not there (tool calls' commands are read several times: kept)."""
        if ref in self.blobs:
            return self.blobs[ref]
        if ref in self.read_texts:
            return self.read_texts[ref]
        text = self.text_of_store(ref)
        if text is None or len(text) <= _KEPT_TEXT_CHARS:
            self.read_texts[ref] = text
        elif self.kept_chars + len(text) <= _KEPT_RUN_CHARS:
            self.read_texts[ref] = text
            self.kept_chars += len(text)
        return text

    def count(self, ref: str) -> int:
        if ref not in self.counts:
            text = self.text(ref)
            ends = self.ends_of(text) if self.ends_of is not None and len(text) >= _ENDS_MIN_CHARS else None
            if ends is not None:
                self.ends[ref] = ends
            self.counts[ref] = self.new_counts[ref] = ends.count if ends is not None else self.count_fn(text)
        return self.counts[ref]

    def count_text(self, text: str) -> int:
        return self.count_fn(text) if text else 0

    def tokens(self, state: RunState | None = None) -> int:
        state = state or self.state
        if self.last_tokens is not None and self.last_tokens[0] is state:  # states are immutable: asked again
            return self.last_tokens[1]
        tokens = sum(self.count(ref) for ref in view_refs(state))
        self.last_tokens = (state, tokens)
        return tokens

    def add_blob(self, text: str) -> tuple[str, int]:
        ref = ref_of(text.encode("utf-8"))
        if ref not in self.blobs:
            self.blobs[ref] = text
            self.counts[ref] = self.new_counts[ref] = self.count_fn(text)
        return ref, self.counts[ref]

    def commit(self, new_events: Iterable[ev.Event]) -> None:
        batch = list(new_events)
        self.events.extend(batch)
        self.state = fold_onto(self.state, self.state.id, [(0, event) for event in batch])


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
    planner = _Planner(state, text_of, count_fn, count_many, name, counts or {}, quoted_elsewhere or {}, ends_of)
    tokens_before = planner.tokens()
    steps = {"bodies_reduced": 0, "branches_reduced": 0, "dropped": 0}
    if tokens_before > token_target:
        steps["bodies_reduced"] = _reduce_bodies(planner, token_target)
    if planner.tokens() > token_target:
        steps["branches_reduced"] = _extract_dead_branches(planner, token_target)
    if planner.tokens() > token_target:
        steps["dropped"] = _drop_dead_text(planner, token_target)
    return ReductionPlan(
        run_id=state.id, counter=name, token_target=token_target, tokens_before=tokens_before,
        tokens_after=planner.tokens(), events=tuple(planner.events), blobs=dict(planner.blobs),
        new_counts=dict(planner.new_counts), state_after=planner.state, base_digest=state_digest(state),
        steps=steps)


@dataclass
class _Cut:
    """One body step 1 may cut: its tokens, how often a reader sees it, its extract shape and its weight in its
    rank (earlier bodies keep a smaller share of the rank's cap)."""

    ref: str
    tokens: int
    seen: int
    shape: str
    weight: float


class _Step1:
    """The bodies step 1 may cut, grouped by rank (lowest first), the extracts made of them and the arithmetic of
    a cut setting.

    A setting ``(level, cap)`` cuts every body in the groups before ``level`` to its marker, each body of group
    ``level`` to ``floor(cap × weight)`` tokens (the latest body of a group has weight 1, the earliest 1/n), and
    leaves the groups after it whole. A body is cut only when that saves at least ``_MIN_SAVING`` tokens.
    """

    def __init__(self, planner: _Planner) -> None:
        self.planner = planner
        state = planner.state
        view = Counter(view_refs(state))
        worth = body_worth(state, find_evidence(state, planner.read), planner.read)
        cuttable = [ref for ref in view if state.bodies[ref].status == LOCAL and ref not in planner.quoted]
        by_rank: dict[int, list[str]] = {}
        for ref in cuttable:
            by_rank.setdefault(worth[ref].rank, []).append(ref)
        self.groups: list[list[_Cut]] = []
        for rank in sorted(by_rank):
            refs = sorted(by_rank[rank], key=lambda ref: worth[ref].order)
            self.groups.append([_Cut(ref, planner.count(ref), view[ref], worth[ref].shape, (index + 1) / len(refs))
                                for index, ref in enumerate(refs)])
        cut_set = set(cuttable)
        self.fixed = sum(planner.count(ref) * n for ref, n in view.items() if ref not in cut_set)
        self.reading = {ref: index for index, ref in enumerate(view)}
        self.made: dict[tuple[str, int], tuple[str, int]] = {}  # (ref, keep) → (extract, tokens): made once

    def extract(self, cut: _Cut, keep: int) -> tuple[str, int]:
        """The extract of ``cut`` keeping ``keep`` tokens, and its tokens (each counted once)."""
        if (cut.ref, keep) not in self.made:
            original = self.planner.text(cut.ref)
            text, spliced = _extract(cut.shape, original, cut.tokens, keep)
            summary_ref = ref_of(text.encode("utf-8"))
            if summary_ref not in self.planner.counts:
                ends = self.planner.ends.get(cut.ref) if spliced is not None else None
                self.planner.counts[summary_ref] = (
                    ends.spliced_count(original, spliced.head_end, spliced.middle(original), spliced.tail_start,
                                       self.planner.count_text)
                    if ends is not None and spliced is not None else self.planner.count_text(text))
            self.made[(cut.ref, keep)] = (text, self.planner.counts[summary_ref])
        return self.made[(cut.ref, keep)]

    def prepare(self, wanted: Iterable[tuple[_Cut, int]]) -> None:
        """Make the extracts ``wanted`` (cut, keep) and count those never counted in one batch (a counter that asks
        servers has them all in flight at once, not one round trip after another)."""
        counts = self.planner.counts
        made: dict[tuple[str, int], tuple[str, str]] = {}
        fresh: dict[str, str] = {}
        for cut, keep in wanted:
            if (cut.ref, keep) in self.made or (cut.ref, keep) in made:
                continue
            if cut.ref in self.planner.ends:  # counted from its original's tokens: nothing to batch
                self.extract(cut, keep)
                continue
            text, _ = _extract(cut.shape, self.planner.text(cut.ref), cut.tokens, keep)
            summary_ref = ref_of(text.encode("utf-8"))
            made[(cut.ref, keep)] = (text, summary_ref)
            if summary_ref not in counts:
                fresh[summary_ref] = text
        written = {summary_ref: text for summary_ref, text in fresh.items() if text}
        counts.update(zip(written, self.planner.count_many(list(written.values()))))
        counts.update((summary_ref, 0) for summary_ref in fresh.keys() - written.keys())
        for key, (text, summary_ref) in made.items():
            self.made[key] = (text, counts[summary_ref])

    def reduced(self, cut: _Cut, keep: int) -> int | None:
        """Tokens ``cut`` is expected to take kept to ``keep`` (exact for its marker alone); None: not worth it."""
        if cut.tokens <= _MIN_SAVING:
            return None  # no marker is that short
        tokens = self.extract(cut, 0)[1] + (keep + _JOIN_TOKENS if keep else 0)
        return tokens if cut.tokens - tokens >= _MIN_SAVING else None

    def keeps(self, level: int, cap: int) -> dict[str, int]:
        """Tokens each body keeps at ``(level, cap)`` (bodies left whole are not named)."""
        keeps: dict[str, int] = {}
        for index, group in enumerate(self.groups[:level + 1]):
            for cut in group:
                keep = 0 if index < level else int(cap * cut.weight)
                if self.reduced(cut, keep) is not None:
                    keeps[cut.ref] = keep
        return keeps

    def estimate(self, level: int, cap: int) -> int:
        """Tokens a reader would see at ``(level, cap)``, each cut body counted as its keep plus its marker."""
        total = self.fixed
        for index, group in enumerate(self.groups):
            for cut in group:
                reduced = None if index > level else self.reduced(cut, 0 if index < level else int(cap * cut.weight))
                total += cut.seen * (cut.tokens if reduced is None else reduced)
        return total

    def setting(self, budget: int) -> tuple[int, int]:
        """The setting that cuts least while its estimate stays within ``budget`` (the last group at cap 0 when
        none does)."""
        for level, group in enumerate(self.groups):
            if self.estimate(level, 0) > budget:
                continue
            low, high = 0, max(math.ceil(cut.tokens / cut.weight) for cut in group)
            while low < high:
                middle = (low + high + 1) // 2
                if self.estimate(level, middle) <= budget:
                    low = middle
                else:
                    high = middle - 1
            return level, low
        return len(self.groups) - 1, 0


def _extract(shape: str, text: str, tokens: int, keep: int) -> tuple[str, HeadTail | None]:
    """The extract of ``text`` in ``shape``, and the cut when it is the text's head and tail around a marker."""
    if shape == "submission" and is_patch(text):
        return diff_extract(text, tokens=tokens, keep_tokens=keep), None
    cut = head_tail_cut(text, tokens=tokens, keep_tokens=keep, head_share=0.25 if shape == "tail" else 0.5)
    return (text, None) if cut is None else (cut.of(text), cut)


def _reduce_bodies(planner: _Planner, token_target: int) -> int:
    """Step 1: cut bodies to extracts in the order of their worth (:mod:`kvjudge.retention.worth`): the cheapest
    to lose first, earlier before later, the run's decisive evidence last; the least cutting that fits wins."""
    step = _Step1(planner)
    if not step.groups:
        return 0
    shapes = {cut.ref: cut for group in step.groups for cut in group}
    step.prepare((cut, 0) for cut in shapes.values() if cut.tokens > _MIN_SAVING)  # every marker, in one batch

    def after(cut: _Cut, keep: int | None) -> int:
        """Tokens ``cut`` takes kept to ``keep`` (None, or an extract not worth it: the original's)."""
        if keep is None:
            return cut.tokens
        tokens = step.extract(cut, keep)[1]
        return tokens if cut.tokens - tokens >= _MIN_SAVING else cut.tokens

    def total(keeps: dict[str, int]) -> int:
        return step.fixed + sum(cut.seen * after(cut, keeps.get(ref)) for ref, cut in shapes.items())

    def trimmed(level: int, keeps: dict[str, int], over: int) -> int:
        """Take ``over`` tokens from the bodies of group ``level`` that keep text, earliest first (each recounted
        alone); returns what is still over."""
        for cut in step.groups[level]:
            keep = keeps.get(cut.ref)
            if over <= 0 or not keep:
                continue
            before = after(cut, keep)
            keeps[cut.ref] = max(0, keep - -(-over // cut.seen) - _JOIN_TOKENS)
            over -= cut.seen * (before - after(cut, keeps[cut.ref]))
        return over

    # The estimate counts each cut body as its keep plus its marker; real extracts differ a little. An overshoot
    # is taken from the earliest bodies of the last group cut (a few extracts made again, not all); failing that,
    # plan again for a budget smaller by the overshoot, until the extracts fit or everything is cut.
    budget, deepest = token_target, (len(step.groups) - 1, 0)
    for _ in range(_ROUNDS):
        level, cap = step.setting(budget)
        keeps = step.keeps(level, cap)
        step.prepare((shapes[ref], keep) for ref, keep in keeps.items())
        over = total(keeps) - token_target
        if over <= 0 or trimmed(level, keeps, over) <= 0 or (level, cap) == deepest:
            break
        budget -= max(1, over)
    else:
        keeps = step.keeps(*deepest)
    events: list[ev.Event] = []
    for ref, cut in sorted(shapes.items(), key=lambda item: step.reading[item[0]]):
        keep = keeps.get(ref)
        if keep is None or after(cut, keep) == cut.tokens:  # not worth an extract: keep the original
            continue
        text, tokens = step.extract(cut, keep)
        summary_ref = ref_of(text.encode("utf-8"))
        planner.blobs[summary_ref] = text
        planner.new_counts[summary_ref] = tokens
        events.append(ev.Reduced(run=planner.state.id, original=ref, summary=summary_ref, counter=planner.counter,
                                 tokens_before=cut.tokens, tokens_after=tokens))
    planner.commit(events)
    return len(events)


def _dead_branches_by_size(planner: _Planner) -> list[int]:
    state = planner.state
    sizes = [(sum(planner.count(ref) for ref in branch_view(state, index)), index)
             for index, branch in enumerate(state.branches) if branch.status == "dead"]
    return [index for size, index in sorted(sizes, key=lambda item: (-item[0], state.branches[item[1]].id))
            if size > 0]


def _dead_branches_while_over(planner: _Planner, token_target: int) -> Iterator[tuple[RunState, int, Branch]]:
    """Each dead branch with text, largest first, with its index and the run as it stands, while the run is over
    ``token_target`` (what steps 2 and 3 go through)."""
    for index in _dead_branches_by_size(planner):
        if planner.tokens() <= token_target:
            return
        state = planner.state
        yield state, index, state.branches[index]


def _extract_dead_branches(planner: _Planner, token_target: int) -> int:
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


def _drop_dead_text(planner: _Planner, token_target: int) -> int:
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


def _drop_dead_text_once(planner: _Planner, token_target: int) -> int:
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


__all__ = ["CountFn", "ReductionPlan", "TextOf", "branch_view", "plan_reduction", "resolve", "state_digest",
           "view_refs", "view_tokens"]
