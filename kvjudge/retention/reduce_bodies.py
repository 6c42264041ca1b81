"""Reduction's first loss step: bodies cut to extracts in the order of their worth (:mod:`kvjudge.retention.worth`),
the cheapest to lose first, earlier before later, the run's decisive evidence (:mod:`kvjudge.retention.evidence`)
last; the least cutting that fits wins. Called by :func:`kvjudge.retention.reduce.plan_reduction` on its
:class:`~kvjudge.retention.reduce_planner.Planner`."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from kvjudge.retention import events as ev
from kvjudge.retention.blobs import ref_of
from kvjudge.retention.evidence import find_evidence, is_patch
from kvjudge.retention.extract import HeadTail, diff_extract, head_tail_cut
from kvjudge.retention.reduce_planner import Planner
from kvjudge.retention.state import LOCAL, view_refs
from kvjudge.retention.worth import body_worth

# Plans of step 1 made for smaller budgets while real extracts overshoot the estimate, before cutting all.
_ROUNDS = 8
# The line breaks that join an extract's kept parts to its marker (beyond the marker alone).
_JOIN_TOKENS = 2
# A summary must save at least this many tokens to be worth a blob and an event.
_MIN_SAVING = 8


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

    def __init__(self, planner: Planner) -> None:
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


def reduce_bodies(planner: Planner, token_target: int) -> int:
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



__all__ = ["reduce_bodies"]
