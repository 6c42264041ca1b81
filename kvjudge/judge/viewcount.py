"""A view's token count as the sum of its parts' counts: each body's counted once per counter, ever.

A view is quoted as segments (:class:`~kvjudge.judge.render.ViewParts`): markup the judge writes, and bodies as
stored. The in-process backend tokenizes a prompt segment by segment, so the sum of the segments' counts *is* the
prompt's length, exactly; a server tokenizes the prompt whole, where a segment boundary can only merge tokens (each
body stands on lines of its own), within the slack a server backend keeps.

So counting a view never tokenizes it: a body's count comes from the store's count cache (``store.caches``, a
:class:`~kvjudge.retention.store.interfaces.TokenCounts`, under the judge's counter, filled by ingest, reduction or
an earlier judgment, and completed here for the bodies nobody counted yet), the counts of extracts a view derives
on the fly from the reduction plan that made them, and the markup's from a memo (the same headings recur in every
run).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING

from kvjudge.judge.render import ViewParts

if TYPE_CHECKING:
    from kvjudge.retention.store.interfaces import TokenCounts

CountFn = Callable[[str], int]


class ViewCounter:
    """Counts views from their parts with ``count`` (one segment's tokens).

    ``name`` is the counter's name in the store's count cache (``model:<sha>`` for a GGUF's tokenizer, the served
    model's for a server's): with it, body counts are read from and written to the store — a body by its ref, a body
    that escaping changed by the sha256 of the text the view shows (a count is a fact about bytes); without it (a
    bare function) they are kept for this counter's life only. ``calls`` is how many times ``count`` ran.
    """

    def __init__(self, count: CountFn, name: str | None = None) -> None:
        self.count_fn = count
        self.name = name
        self.calls = 0
        self._markup: dict[str, int] = {}
        self._bodies: dict[str, int] = {}      # ref (or sha256 of an escaped body's text) → tokens
        self._escaped: dict[str, str] = {}     # ref of a body escaping changed → sha256 of its text as shown
        self._fresh: dict[str, int] = {}       # counted here, not yet in the store's cache
        self._looked_up: set[str] = set()

    def count(self, text: str) -> int:
        """Tokens of ``text`` as one segment (the tokenizer itself, no memo)."""
        self.calls += 1
        return self.count_fn(text)

    def markup(self, text: str) -> int:
        """Tokens of a piece of markup (memoised: headings and markers recur)."""
        tokens = self._markup.get(text)
        if tokens is None:
            tokens = self._markup[text] = self.count(text)
        return tokens

    def load(self, counts: TokenCounts, refs: Iterable[str]) -> None:
        """Read the stored counts of ``refs`` under this counter (one query; refs asked before are skipped)."""
        wanted = [ref for ref in refs if ref not in self._looked_up and ref not in self._bodies]
        if not wanted:
            return
        self._looked_up.update(wanted)
        if self.name is not None:
            self._bodies.update(counts.cached_counts(wanted, self.name))

    def load_parts(self, counts: TokenCounts, parts: ViewParts, refs: Iterable[str] = ()) -> None:
        """Read the stored counts of ``refs`` and of the bodies ``parts`` shows escaped, in one query."""
        escaped = [self._key(body[0], text) for text, body in zip(parts.texts, parts.bodies)
                   if body is not None and body[1]]
        self.load(counts, [*refs, *escaped])

    def learn(self, counts: Mapping[str, int]) -> None:
        """Counts made elsewhere with the same counter (a reduction plan's extracts: text, not stored)."""
        self._bodies.update(counts)

    def known(self) -> Mapping[str, int]:
        """Every body count known (for a reduction plan, so that it counts no body again)."""
        return self._bodies

    def _key(self, ref: str, text: str) -> str:
        """Where a body's count is kept: its ref, or for a body escaping changed, the sha256 of the text shown."""
        key = self._escaped.get(ref)
        if key is None:
            key = self._escaped[ref] = hashlib.sha256(text.encode("utf-8")).hexdigest()
        return key

    def body(self, ref: str, text: str, escaped: bool = False) -> int:
        """Tokens of the body ``ref`` shown as ``text`` (``escaped``: the view shows it escaped, changed)."""
        key = self._key(ref, text) if escaped else ref
        tokens = self._bodies.get(key)
        if tokens is None:
            tokens = self._bodies[key] = self._fresh[key] = self.count(text)
        return tokens

    def parts(self, parts: ViewParts) -> int:
        """Tokens of a view: its markup's and its bodies' counts summed."""
        total = 0
        for text, body in zip(parts.texts, parts.bodies):
            total += self.markup(text) if body is None else self.body(body[0], text, body[1])
        return total

    def save(self, counts: TokenCounts) -> None:
        """Write the counts made here to the store's count cache: each text is counted once, ever."""
        if self.name is not None and self._fresh:
            counts.put_counts(self.name, self._fresh)
        self._fresh = {}


# What view code accepts as a counter: a ViewCounter, or a bare function (wrapped, no store cache).
AnyCounter = ViewCounter | CountFn


def view_counter(count: AnyCounter) -> ViewCounter:
    """``count`` as a :class:`ViewCounter` (a bare function gets one of its own, without a store cache)."""
    return count if isinstance(count, ViewCounter) else ViewCounter(count)


__all__ = ["AnyCounter", "CountFn", "ViewCounter", "view_counter"]
