"""The working memory of one reduction plan (:func:`kvjudge.retention.reduce.plan_reduction`): the run as planned so
far, the bodies it read, the counts it made and the events it decided. Each loss step
(:mod:`kvjudge.retention.reduce_bodies`, :mod:`kvjudge.retention.reduce_branches`) reads and counts through it, so no
body is read or counted twice within a plan."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

from kvjudge.errors import IntegrityError
from kvjudge.retention import events as ev
from kvjudge.retention.blobs import ref_of, short
from kvjudge.retention.state import RunState, fold_onto, view_refs
from kvjudge.tokens import TokenEnds

TextOf = Callable[[str], "str | None"]
CountFn = Callable[[str], int]
CountManyFn = Callable[[Sequence[str]], list[int]]
EndsFn = Callable[[str], "TokenEnds | None"]

# Bodies up to this size stay in memory while a run is planned (commands and messages are read several times),
# and larger ones while the run's kept text stays under KEPT_RUN_CHARS (each extract of a body reads it again;
# past that, the largest tool outputs are read again from the store rather than held).
KEPT_TEXT_CHARS = 16_384
KEPT_RUN_CHARS = 8 << 20
# Bodies from this size on are counted with where their tokens end (a splicing counter), so an extract of one is
# counted by tokenizing only the lines around its marker, not its kept head and tail again.
ENDS_MIN_CHARS = 2048


class Planner:
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
        if text is None or len(text) <= KEPT_TEXT_CHARS:
            self.read_texts[ref] = text
        elif self.kept_chars + len(text) <= KEPT_RUN_CHARS:
            self.read_texts[ref] = text
            self.kept_chars += len(text)
        return text

    def count(self, ref: str) -> int:
        if ref not in self.counts:
            text = self.text(ref)
            ends = self.ends_of(text) if self.ends_of is not None and len(text) >= ENDS_MIN_CHARS else None
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



__all__ = ["CountFn", "CountManyFn", "EndsFn", "Planner", "TextOf"]
