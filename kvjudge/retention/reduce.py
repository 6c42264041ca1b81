"""Reduction: shrink a run to a token target without rewriting a blob or editing the log.

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
judge uses it to derive a further-reduced *view* without storing anything. :func:`apply_plan` executes a
plan in three durable steps, each committed before the next starts:

    put summary blobs → commit Reduced / BranchReduced / Dropped events → delete the original bodies

A crash anywhere leaves either an unreferenced summary blob (harmless; the re-run puts the same bytes
under the same ref) or a body the log already explains (the re-run deletes it). Never a missing body the
log does not explain.
"""

from __future__ import annotations

import hashlib
import math
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from kvjudge.errors import ColdStoreError, IntegrityError, RunStateError, UsageError
from kvjudge.retention import events as ev
from kvjudge.retention.blobs import ref_of, short
from kvjudge.retention.faults import fault_point
from kvjudge.retention.evidence import find_evidence, is_patch
from kvjudge.retention.extract import HeadTail, diff_extract, head_tail_cut, head_tail_extract
from kvjudge.retention.state import (
    DROPPED,
    LOCAL,
    REDUCED,
    TIERED,
    Branch,
    RunState,
    branch_view,
    fold_onto,
    resolve,
    view_refs,
)
from kvjudge.retention.store import Store
from kvjudge.retention.worth import body_worth
from kvjudge.tokens import BatchCounter, SplicingCounter, TokenCounter, TokenEnds, count_texts

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
    """What reducing one run to ``target_tokens`` takes. Pure data: nothing is written by planning."""

    run_id: str
    counter: str
    target_tokens: int
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
        return self.tokens_after <= self.target_tokens

    @property
    def noop(self) -> bool:
        return not self.events

    def text_of(self, ref: str, fallback: TextOf) -> str | None:
        """Text of ``ref`` in the reduced view: a planned summary, else ``fallback(ref)``."""
        return self.blobs[ref] if ref in self.blobs else fallback(ref)

    def to_dict(self) -> dict[str, Any]:
        return {"run": self.run_id, "counter": self.counter, "target_tokens": self.target_tokens,
                "tokens_before": self.tokens_before, "tokens_after": self.tokens_after, "fits": self.fits,
                "events": len(self.events), "steps": dict(self.steps)}


def _state_digest(state: RunState) -> str:
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


def plan_reduction(state: RunState, text_of: TextOf, count: TokenCounter | CountFn, target_tokens: int, *,
                   counts: Mapping[str, int] | None = None, counter_name: str | None = None,
                   quoted_elsewhere: Mapping[str, int] | None = None) -> ReductionPlan:
    """Plan the reduction of ``state`` to at most ``target_tokens`` tokens of visible text. Pure.

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
    if not isinstance(target_tokens, int) or isinstance(target_tokens, bool) or target_tokens <= 0:
        raise UsageError(f"the reduction target must be a positive number of tokens, got {target_tokens!r}")
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
    if tokens_before > target_tokens:
        steps["bodies_reduced"] = _reduce_bodies(planner, target_tokens)
    if planner.tokens() > target_tokens:
        steps["branches_reduced"] = _extract_dead_branches(planner, target_tokens)
    if planner.tokens() > target_tokens:
        steps["dropped"] = _drop_dead_text(planner, target_tokens)
    return ReductionPlan(
        run_id=state.id, counter=name, target_tokens=target_tokens, tokens_before=tokens_before,
        tokens_after=planner.tokens(), events=tuple(planner.events), blobs=dict(planner.blobs),
        new_counts=dict(planner.new_counts), state_after=planner.state, base_digest=_state_digest(state),
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


def _reduce_bodies(planner: _Planner, target: int) -> int:
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
    budget, deepest = target, (len(step.groups) - 1, 0)
    for _ in range(_ROUNDS):
        level, cap = step.setting(budget)
        keeps = step.keeps(level, cap)
        step.prepare((shapes[ref], keep) for ref, keep in keeps.items())
        over = total(keeps) - target
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


def _dead_branches_while_over(planner: _Planner, target: int) -> Iterator[tuple[RunState, int, Branch]]:
    """Each dead branch with text, largest first, with its index and the run as it stands, while the run is over
    ``target`` (what steps 2 and 3 go through)."""
    for index in _dead_branches_by_size(planner):
        if planner.tokens() <= target:
            return
        state = planner.state
        yield state, index, state.branches[index]


def _extract_dead_branches(planner: _Planner, target: int) -> int:
    """Step 2: each dead branch (largest first) is read as one head-and-tail extract of its text."""
    done = 0
    for state, index, branch in _dead_branches_while_over(planner, target):
        if branch.summary_ref is not None:
            continue
        refs = branch_view(state, index)
        before = sum(planner.count(ref) for ref in refs)
        body = "\n".join(planner.text(ref) for ref in refs)
        keep = max(0, min(before // 4, target // (2 * max(1, len(state.branches)))))
        text = head_tail_extract(body, tokens=before, keep_tokens=keep)
        summary_ref, after = planner.add_blob(text)
        if after >= before:
            continue
        planner.commit([ev.BranchReduced(run=state.id, branch=branch.id, summary=summary_ref, counter=planner.counter,
                                         tokens_before=before, tokens_after=after)])
        done += 1
    return done


def _drop_dead_text(planner: _Planner, target: int) -> int:
    """Step 3: drop the text of dead branches (largest first); refs a live reader still sees are kept.

    Passes repeat until one drops nothing: a ref two dead branches share (an extract can equal another body's)
    is kept while either still shows it, so it may only become droppable once the other has gone. Without the
    repeat, reducing the same run again to the same target would drop it then — not idempotent."""
    dropped = 0
    while planner.tokens() > target:
        dropped_now = _drop_dead_text_once(planner, target)
        dropped += dropped_now
        if dropped_now == 0:
            break
    return dropped


def _drop_dead_text_once(planner: _Planner, target: int) -> int:
    dropped = 0
    for state, index, branch in _dead_branches_while_over(planner, target):
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


# ----------------------------------------------------------------------- applying
@dataclass(frozen=True)
class ReductionResult:
    """What :func:`apply_plan` did."""

    plan: ReductionPlan
    appended: int  # events committed
    blobs_put: int
    bodies_deleted: int

    def to_dict(self) -> dict[str, Any]:
        return {**self.plan.to_dict(), "appended": self.appended, "blobs_put": self.blobs_put,
                "bodies_deleted": self.bodies_deleted, "reduced": self.plan.state_after.reduced}


class StalePlan(RunStateError):
    """The run changed (another process reduced or tiered it) since the plan was made: plan again."""


class RunInColdStorage(RunStateError):
    """The run's bodies are in cold storage (or on their way there): reduction reads local bodies only, so the
    run must be rehydrated first. Carries the run's visible ``tokens`` and the ``target`` it is above."""

    def __init__(self, state: RunState, tokens: int, target: int) -> None:
        tier = state.tier or {}
        where = "are in cold storage" if tier.get("status") == "tiered" else "are being moved to cold storage"
        super().__init__(f"run {state.id}: {tokens} tokens, above the target {target}; its bodies {where} at "
                         f"{tier.get('target')} — run `kvjudge rehydrate {state.id}`, then reduce it")
        self.run_id, self.tokens, self.target = state.id, tokens, target


def in_cold_storage(state: RunState) -> bool:
    """True when a move of the run's bodies to cold storage has started or finished (and no rehydrate since)."""
    return bool(state.tier) and state.tier["status"] in ("started", "tiered")  # type: ignore[index]


def _check_applicable(store: Store, plan: ReductionPlan, *, unchanged_only: bool = False) -> None:
    """Raise unless ``plan`` applies to the run's committed state; ``unchanged_only``: only check that the run is
    still the state it was planned from. The stored state's bytes are hashed as they are (they are its canonical
    bytes, as written); parsed and hashed again only when they differ."""
    raw = store.runs.projected_bytes(plan.run_id)
    if raw is None:
        store.runs.run(plan.run_id)  # raises: no such run
    assert raw is not None
    unchanged = hashlib.sha256(raw).hexdigest() == plan.base_digest
    if unchanged and unchanged_only:
        return
    state = RunState.from_bytes(raw)
    unchanged = unchanged or _state_digest(state) == plan.base_digest
    if not state.is_reducible:
        raise RunStateError(f"run {state.id} is {state.state}; only graded, ungraded or archived runs can be reduced")
    if not unchanged:
        raise StalePlan(f"run {plan.run_id} changed since this reduction was planned; plan it again")
    if plan.events and in_cold_storage(state):
        raise RunInColdStorage(state, plan.tokens_before, plan.target_tokens)


def apply_plan(store: Store, plan: ReductionPlan) -> ReductionResult:
    """Execute ``plan`` on ``store``: put summaries → commit events → delete bodies, each durable first.

    Also finishes a crashed earlier reduction: a body the log already explains is deleted here. Whether the
    events commit is decided inside their own write transaction, on the committed state: a plan made from a
    state the run no longer has (another process reduced or tiered it meanwhile) raises :class:`StalePlan`,
    and nothing of it is appended.
    """
    _check_applicable(store, plan, unchanged_only=True)  # early: no summaries put for a plan already stale
    put = 0
    if plan.blobs or plan.new_counts:
        # Not waited for on disk: the commit of the events below syncs the log, and these pages are before them in
        # it; lost at a power cut before that, the summaries were named by nothing and the counts are redone.
        with store.transaction("put_summary", durable=False):
            for text in plan.blobs.values():
                store.blobs.put(text.encode("utf-8"))
                put += 1
            store.caches.put_counts(plan.counter, plan.new_counts)
        if plan.blobs:
            fault_point("after_put_summary")
    appended = 0
    if plan.events:
        with store.transaction("commit_reduction"):
            _check_applicable(store, plan)
            appended = len(store.events.append_many(plan.run_id, list(plan.events), label="commit_reduction"))
        fault_point("after_commit_reduction")
    # The run's statuses as just committed (a later change by another process can only reduce, drop or tier more).
    deleted = finish_deletions(store, plan.run_id, plan.state_after)
    return ReductionResult(plan=plan, appended=appended, blobs_put=put, bodies_deleted=deleted)


def finish_deletions(store: Store, run_id: str, state: RunState | None = None) -> int:
    """Delete every local body the run's log says is reduced or dropped (and no other run reads). Idempotent.
    ``state``: the run's state when the caller has just read or committed it (else it is read here)."""
    state = state if state is not None else store.runs.run(run_id)
    pending = [ref for ref, loc in state.bodies.items()
               if loc.status in (REDUCED, DROPPED) and store.blobs.has_body(ref)]
    if not pending:
        return 0
    deleted = store.blobs.release(pending, label="delete_body", durable=False)
    fault_point("after_delete_body")
    return len(deleted)


def store_counter_view(store: Store, state: RunState, counter: TokenCounter) -> dict[str, int]:
    """Stored counts of every ref ``state`` names (so planning recounts nothing already counted)."""
    return store.caches.cached_counts(state.bodies.keys(), counter.name)


def plan_stored(store: Store, state: RunState, target_tokens: int, counter: TokenCounter) -> ReductionPlan:
    """:func:`plan_reduction` of a stored run (its texts, its stored counts).

    A run in cold storage is never planned from its cold bodies: RunInColdStorage when it is above
    ``target_tokens`` (counted from stored counts, reading through the store's fallback only for bodies never
    counted), else the no-op plan.
    """
    if in_cold_storage(state):
        tokens = run_tokens(store, state, counter)
        if tokens > target_tokens:
            raise RunInColdStorage(state, tokens, target_tokens)
    if isinstance(counter, BatchCounter):  # the run's bodies counted in one batch, not one request each
        count_ahead(store, state, counter)
    return plan_reduction(state, store.text, counter, target_tokens, counts=store_counter_view(store, state, counter))


def reduce_run(store: Store, run_id: str, target_tokens: int, counter: TokenCounter, *,
               attempts: int = 5) -> ReductionResult:
    """Plan and apply the reduction of one run (a no-op when it already fits; resumes a crashed one).

    When another process changes the run between planning and committing, the reduction is planned again from
    the new state (up to ``attempts`` times). A run in cold storage above the target is refused
    (:class:`RunInColdStorage`: ``kvjudge rehydrate`` it first); the deletions a crashed reduction left are
    finished first all the same.
    """
    for _ in range(attempts):
        state = store.runs.run(run_id)
        try:
            plan = plan_stored(store, state, target_tokens, counter)
        except RunInColdStorage:
            finish_deletions(store, run_id)
            raise
        except IntegrityError:
            if _state_digest(store.runs.run(run_id)) != _state_digest(state):
                continue  # a body went with another process's reduction while this one read it: plan again
            raise
        try:
            return apply_plan(store, plan)
        except StalePlan:
            continue
    raise RunStateError(f"run {run_id} changed {attempts} times while its reduction was planned; run `kvjudge "
                        f"reduce {run_id}` again")


def run_tokens(store: Store, state: RunState, counter: TokenCounter) -> int:
    """Tokens of visible text in ``state`` under ``counter``, counting (and storing) only bodies never counted."""
    total = _count_view(store, state, counter, missing_ok=False)
    assert total is not None
    return total


def stored_tokens(store: Store, state: RunState, counter_name: str) -> int | None:
    """Tokens of visible text in ``state`` from the counts the store already has under ``counter_name``; None
    when a body it shows was never counted (nothing is read or counted here: it costs one query)."""
    known = store.caches.cached_counts(state.bodies.keys(), counter_name)
    if not known:  # never counted (the common case before a reduction): no need to work out what a reader sees
        return None
    refs = view_refs(state)
    if any(ref not in known for ref in refs):
        return None
    return sum(known[ref] for ref in refs)


def count_ahead(store: Store, state: RunState, counter: TokenCounter) -> None:
    """Count and store what :func:`run_tokens` of ``state`` would count, without holding any lock, so a later
    :func:`run_tokens` under a write lock reads stored counts only. Best effort: a body gone meanwhile (another
    process reduced or tiered the run) is skipped — the later call counts whatever the new state shows."""
    _count_view(store, state, counter, missing_ok=True)


def _count_view(store: Store, state: RunState, counter: TokenCounter, *, missing_ok: bool) -> int | None:
    known = store.caches.cached_counts(state.bodies.keys(), counter.name)
    refs = view_refs(state)
    texts: dict[str, str] = {}
    missing = False
    for ref in refs:
        if ref in known or ref in texts:
            continue
        text = store.blobs.text(ref)
        if text is None:
            if missing_ok:
                missing = True
                continue
            location = state.bodies[ref]
            if location.status == TIERED:  # a store opened without its cold reader
                raise ColdStoreError(f"run {state.id}: {short(ref)} is in cold storage at {location.target}; "
                                     "counting it needs the store's cold reader")
            raise IntegrityError(f"run {state.id}: the body of {short(ref)} is missing and no event explains it; "
                                 f"run `kvjudge verify`")
        texts[ref] = text
    # One batch: a counter that asks servers has every body of the run in flight at once.
    fresh = dict(zip(texts, count_texts(counter, list(texts.values()))))
    store.caches.put_counts(counter.name, fresh)
    if missing:
        return None
    return sum(known.get(ref, fresh.get(ref, 0)) for ref in refs)


# ------------------------------------------------------------------------------------- a selection of runs
# What each loss step did, as ReductionPlan.steps names it.
_STEPS = (("bodies_reduced", "bodies reduced to extracts"), ("branches_reduced", "dead branches reduced to extracts"),
          ("dropped", "dead-branch texts dropped"))


def left_above(plan: ReductionPlan) -> str:
    """Why a planned run stays above its target: only the loss steps that were taken are named."""
    taken = [f"{plan.steps.get(key, 0)} {label}" for key, label in _STEPS if plan.steps.get(key, 0)]
    how = f"after every loss step ({', '.join(taken)})" if taken else "and no loss step could shrink it"
    return (f"run {plan.run_id}: {plan.tokens_after} tokens remain above the target {plan.target_tokens} {how}; "
            "kept: transitions, live-branch markers")


@dataclass(frozen=True)
class RunsReduction:
    """What :func:`reduce_runs` did (or, for a dry run, planned) over a selection of runs.

    ``runs``: each reducible run's outcome (``ReductionPlan.to_dict`` or ``ReductionResult.to_dict``, with its
    ``tenant``; ``in_cold_storage`` for a tiered run left alone); ``above``: every run left above its target, with
    the ``reason`` and the command that would let it reduce (``fix``, or None); ``refused``: runs whose grading has
    not terminated (only with a whole selection: a named run is refused with RunStateError).
    """

    counter: str
    dry_run: bool
    targets: Mapping[str, int]
    runs: tuple[dict[str, Any], ...]
    above: tuple[dict[str, Any], ...]
    refused: tuple[dict[str, str], ...]


RunFn = Callable[[str, int, int], None]
# Texts up to this long have their counts remembered through a selection of runs (cut markers, short extracts).
_REMEMBERED_CHARS = 256


class _RememberedShortTexts:
    """A batch counter with the counts of short texts remembered: the cut markers (``[212 lines cut]``) recur in
    every run, and a counter that asks servers would be asked for each again, run after run."""

    def __init__(self, counter: BatchCounter) -> None:
        self.counter = counter
        self.known: dict[str, int] = {}

    @property
    def name(self) -> str:
        return self.counter.name

    def count(self, text: str) -> int:
        return self.count_many([text])[0]

    def count_many(self, texts: Sequence[str]) -> list[int]:
        asked = [text for text in dict.fromkeys(texts) if text not in self.known]
        fresh = dict(zip(asked, self.counter.count_many(asked))) if asked else {}
        self.known.update((text, tokens) for text, tokens in fresh.items() if len(text) <= _REMEMBERED_CHARS)
        return [self.known[text] if text in self.known else fresh[text] for text in texts]


# A run whose bodies hold more text than this is only counted ahead, and planned in its turn (planning ahead holds
# every body of the run in memory until its turn).
_AHEAD_RUN_CHARS = 8 << 20


class _PlanningAhead:
    """Counts and plans the next run in a background thread while the current run is written: the writes wait on
    the disk, the counting on the servers, so neither waits for the other.

    The store stays on its own thread: the run's state, stored counts and texts are read here, the background thread
    counts the uncounted bodies (one batch) and plans from them (:func:`plan_reduction`, pure: the same plan as in
    its turn). In its turn the counts are stored and the plan applied; :func:`apply_plan` refuses a plan whose run
    changed meanwhile (StalePlan), which is then planned again in turn. A run in cold storage, or with more text than
    ``_AHEAD_RUN_CHARS``, is only counted ahead; a run that cannot be planned ahead (not reducible now, a body
    missing) is planned in its turn, where its error is raised as before."""

    def __init__(self, store: Store, counter: BatchCounter, targets: Mapping[str, int]) -> None:
        self.store, self.counter, self.targets = store, counter, targets
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kvjudge-plan-ahead")
        self.pending: Future[tuple[dict[str, int], ReductionPlan | None]] | None = None

    def start(self, run_id: str) -> None:
        state = self.store.runs.run(run_id)
        if in_cold_storage(state) or any(loc.status == TIERED for loc in state.bodies.values()):
            return
        known = self.store.caches.cached_counts(state.bodies.keys(), self.counter.name)
        texts: dict[str, str | None] = {}
        chars = 0
        for ref in state.bodies:
            texts[ref] = text = self.store.blobs.text(ref)
            chars += len(text) if text is not None else 0
        uncounted = {ref: text for ref in dict.fromkeys(view_refs(state))
                     if ref not in known and (text := texts.get(ref)) is not None}
        target = self.targets.get(state.tenant)
        plan_too = chars <= _AHEAD_RUN_CHARS and state.is_reducible and target is not None
        if not (uncounted or plan_too):
            return
        kept = texts if plan_too else {}  # held until the run's turn only when it is planned ahead
        del texts

        def job() -> tuple[dict[str, int], ReductionPlan | None]:
            fresh = dict(zip(uncounted, self.counter.count_many(list(uncounted.values())))) if uncounted else {}
            if not plan_too:
                return fresh, None
            assert target is not None
            try:
                plan = plan_reduction(state, kept.get, self.counter, target, counts={**known, **fresh})
            except (IntegrityError, RunStateError, UsageError):
                plan = None  # planned again in its turn, which raises or handles it as it always has
            return fresh, plan

        self.pending = self.executor.submit(job)

    def settle(self) -> ReductionPlan | None:
        """Store the counts of the run started last and return its plan (None: plan it in turn). A counting error is
        raised here, as if counted now."""
        if self.pending is None:
            return None
        pending, self.pending = self.pending, None
        fresh, plan = pending.result()
        self.store.caches.put_counts(self.counter.name, fresh)
        return plan

    def close(self) -> None:
        self.executor.shutdown(wait=True, cancel_futures=True)


def reduce_runs(store: Store, run_ids: Sequence[str] | None, target_of: Callable[[str], int],
                counter: TokenCounter | Callable[[], TokenCounter], *, tenant: str | None = None,
                dry_run: bool = False, on_run: RunFn | None = None) -> RunsReduction:
    """Reduce the runs named (None: every run of the store, or of ``tenant``) to their tenant's target.

    ``target_of(tenant)`` is the tenant's target in tokens; every tenant's is asked for before anything is counted
    or written (a ceiling without a probe figure raises there). A named run whose grading has not terminated is
    refused (RunStateError); in a whole selection such runs are listed in ``refused``. With ``dry_run`` each run
    is planned and nothing is written. ``counter`` may be a function that builds it: it is called once the targets
    are known. ``on_run(run_id, done, total)`` hears of each run as it starts.

    A counter that counts batches (a served tokenizer: :class:`~kvjudge.tokens.BatchCounter`) is asked as little
    as it can be, and never waited for while there is writing to do: each run is counted (its bodies in one batch)
    and planned (its cut markers and each round of extracts in one batch) in a background thread while the run before
    is being written; a short text's count is remembered from run to run.
    """
    chosen = run_ids if run_ids is not None else store.runs.run_ids(tenant)
    candidates = [store.runs.run(run_id) for run_id in chosen]
    refused = [state for state in candidates if not state.is_reducible]
    if run_ids is not None and refused:
        state = refused[0]
        raise RunStateError(f"run {state.id} is {state.state}; only graded, ungraded or archived runs can be "
                            f"reduced (finish grading first: `kvjudge mark {state.id} graded|ungraded`)")
    reducible = [state.id for state in candidates if state.is_reducible]
    targets = {name: target_of(name) for name in sorted({state.tenant for state in candidates if state.is_reducible})}
    del candidates  # each run is read again as it is reduced (another process may have changed it meanwhile)
    if not isinstance(counter, TokenCounter):
        counter = counter()
    ahead: _PlanningAhead | None = None
    if isinstance(counter, BatchCounter):  # a counter that asks servers: no round trip it can spare or overlap
        counter = _RememberedShortTexts(counter)
        ahead = _PlanningAhead(store, counter, targets)
    try:
        outcomes, above = _reduce_each(store, reducible, targets, counter, ahead, dry_run, on_run)
    finally:
        if ahead is not None:
            ahead.close()
    return RunsReduction(counter=counter.name, dry_run=dry_run, targets=targets, runs=tuple(outcomes),
                         above=tuple(above),
                         refused=tuple({"run": state.id, "state": state.state,
                                        "reason": "grading has not terminated (only graded, ungraded, archived reduce)"}
                                       for state in refused))


def _reduce_each(store: Store, reducible: Sequence[str], targets: Mapping[str, int], counter: TokenCounter,
                 ahead: _PlanningAhead | None, dry_run: bool,
                 on_run: RunFn | None) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    outcomes: list[dict[str, Any]] = []
    above: list[dict[str, Any]] = []
    if ahead is not None and reducible:
        ahead.start(reducible[0])
    for done, run_id in enumerate(reducible):
        if on_run is not None:
            on_run(run_id, done, len(reducible))
        planned = None
        if ahead is not None:
            planned = ahead.settle()
            if done + 1 < len(reducible):
                ahead.start(reducible[done + 1])
        state = store.runs.run(run_id)
        target = targets[state.tenant]
        try:
            if dry_run:
                if planned is None or planned.base_digest != _state_digest(state):
                    planned = plan_stored(store, state, target, counter)
                plan, outcome = planned, {**planned.to_dict(), "dry_run": True}
            else:
                result = _applied_ahead(store, planned) if planned is not None else None
                if result is None:
                    result = reduce_run(store, run_id, target, counter)
                plan, outcome = result.plan, result.to_dict()
            if not plan.fits:
                above.append({"run": run_id, "tokens": plan.tokens_after, "target": target,
                              "reason": left_above(plan), "fix": None})
        except RunInColdStorage as exc:
            outcome = {"run": run_id, "counter": counter.name, "target_tokens": target, "tokens_before": exc.tokens,
                       "tokens_after": exc.tokens, "fits": False, "events": 0, "in_cold_storage": True}
            above.append({"run": run_id, "tokens": exc.tokens, "target": target, "reason": str(exc),
                          "fix": f"kvjudge rehydrate {run_id}"})
        outcome["tenant"] = state.tenant
        outcomes.append(outcome)
    return outcomes, above


def _applied_ahead(store: Store, plan: ReductionPlan) -> ReductionResult | None:
    """``plan``, made ahead, applied; None when its run changed since (it is then planned again in its turn)."""
    try:
        return apply_plan(store, plan)
    except StalePlan:
        return None


__all__ = ["ReductionPlan", "ReductionResult", "RunInColdStorage", "RunsReduction", "StalePlan", "apply_plan",
           "branch_view", "count_ahead", "finish_deletions", "in_cold_storage", "left_above", "plan_reduction",
           "plan_stored", "reduce_run", "reduce_runs", "resolve", "run_tokens", "stored_tokens", "view_refs",
           "view_tokens"]
