"""A stored run's tokens: read from the counts the store holds, counting (and storing) only bodies never counted."""

from __future__ import annotations

from typing import Protocol

from kvjudge.errors import ColdStoreError, IntegrityError
from kvjudge.retention.blobs import short
from kvjudge.retention.state import TIERED, RunState, view_refs
from kvjudge.retention.store import BlobStore, TokenCounts
from kvjudge.tokens import TokenCounter, count_texts


class StoredTexts(Protocol):
    """What counting a stored run asks of the store: its token-count cache and its bodies."""

    caches: TokenCounts
    blobs: BlobStore


def run_tokens(store: StoredTexts, state: RunState, counter: TokenCounter) -> int:
    """Tokens of visible text in ``state`` under ``counter``, counting (and storing) only bodies never counted."""
    total = _count_view(store, state, counter, missing_ok=False)
    assert total is not None
    return total


def stored_tokens(counts: TokenCounts, state: RunState, counter_name: str) -> int | None:
    """Tokens of visible text in ``state`` from the counts the store already has under ``counter_name``; None
    when a body it shows was never counted (nothing is read or counted here: it costs one query)."""
    known = counts.cached_counts(state.bodies.keys(), counter_name)
    if not known:  # never counted (the common case before a reduction): no need to work out what a reader sees
        return None
    refs = view_refs(state)
    if any(ref not in known for ref in refs):
        return None
    return sum(known[ref] for ref in refs)


def count_ahead(store: StoredTexts, state: RunState, counter: TokenCounter) -> None:
    """Count and store what :func:`run_tokens` of ``state`` would count, without holding any lock, so a later
    :func:`run_tokens` under a write lock reads stored counts only. Best effort: a body gone meanwhile (another
    process reduced or tiered the run) is skipped — the later call counts whatever the new state shows."""
    _count_view(store, state, counter, missing_ok=True)


def _count_view(store: StoredTexts, state: RunState, counter: TokenCounter, *, missing_ok: bool) -> int | None:
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

