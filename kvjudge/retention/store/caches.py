"""The caches on SQLite, kept beside the log (not history, so not events): token counts and the judge's judgments."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from kvjudge.retention.events import canonical_json
from kvjudge.retention.store.database import REFS_PER_QUERY, Database
from kvjudge.retention.store.projection import Projector


class SqliteCaches:
    """:class:`~kvjudge.retention.store.interfaces.TokenCounts` on ``blob_tokens`` (a count is a fact about
    immutable bytes: stored once per body and counter, never recounted; each run's total follows in the projection,
    through ``projector``) and :class:`~kvjudge.retention.store.interfaces.Judgments` on ``judgments`` (the judge's
    verdict cache, keyed by what identifies a verdict)."""

    def __init__(self, db: Database, projector: Projector) -> None:
        self._conn = db.conn
        self._transaction = db.transaction
        self._total_runs_naming = projector.total_runs_naming

    def cached_counts(self, refs: Iterable[str], counter: str) -> dict[str, int]:
        """Stored counts of ``refs`` under ``counter`` (refs never counted are absent)."""
        wanted = list(dict.fromkeys(refs))
        found: dict[str, int] = {}
        for start in range(0, len(wanted), REFS_PER_QUERY):
            chunk = wanted[start:start + REFS_PER_QUERY]
            marks = ",".join("?" * len(chunk))
            for ref, tokens in self._conn.execute(
                    f"SELECT ref, tokens FROM blob_tokens WHERE counter = ? AND ref IN ({marks})", (counter, *chunk)):
                found[ref] = int(tokens)
        return found

    def put_counts(self, counter: str, counts: Mapping[str, int], *, label: str = "put_counts") -> None:
        """Record counts (first write wins: a count of immutable bytes never changes), and the totals of the runs
        whose every shown body is now counted, in the same transaction. Not waited for on disk (a cache: counts
        lost at a power cut are counted again; a later durable commit syncs them)."""
        if not counts:
            return
        with self._transaction(label, durable=False):
            self._conn.executemany("INSERT OR IGNORE INTO blob_tokens(ref, counter, tokens) VALUES (?, ?, ?)",
                                   [(ref, counter, int(n)) for ref, n in counts.items()])
            self._total_runs_naming(list(counts), counter)

    def iter_counts(self) -> Iterator[tuple[str, str, int]]:
        """Every stored count as ``(ref, counter, tokens)``, in (ref, counter) order (the table's key), a page at
        a time."""
        last = ("", "")
        while rows := self._conn.execute(
                "SELECT ref, counter, tokens FROM blob_tokens WHERE (ref, counter) > (?, ?) ORDER BY ref, counter "
                "LIMIT 1000", last).fetchall():
            for ref, counter, tokens in rows:
                yield ref, counter, int(tokens)
            last = (rows[-1][0], rows[-1][1])

    def get_judgment(self, key: str) -> dict[str, Any] | None:
        """A cached judgment payload, or None."""
        row = self._conn.execute("SELECT payload FROM judgments WHERE key = ?", (key,)).fetchone()
        return None if row is None else json.loads(row[0])

    def get_judgments(self, keys: Iterable[str]) -> dict[str, dict[str, Any]]:
        """The cached judgment payloads of ``keys`` that are cached, by key (a few queries for any number)."""
        wanted = list(dict.fromkeys(keys))
        found: dict[str, dict[str, Any]] = {}
        for start in range(0, len(wanted), REFS_PER_QUERY):
            chunk = wanted[start:start + REFS_PER_QUERY]
            marks = ",".join("?" * len(chunk))
            for key, payload in self._conn.execute(f"SELECT key, payload FROM judgments WHERE key IN ({marks})", chunk):
                found[key] = json.loads(payload)
        return found

    def iter_judgments(self) -> Iterator[tuple[str, dict[str, Any]]]:
        """Every cached ``(key, payload)``, in key order, a page at a time."""
        last = ""
        while rows := self._conn.execute(
                "SELECT key, payload FROM judgments WHERE key > ? ORDER BY key LIMIT 1000", (last,)).fetchall():
            for key, payload in rows:
                yield key, json.loads(payload)
            last = rows[-1][0]

    def put_judgment(self, key: str, payload: dict[str, Any]) -> None:
        """Cache a judgment payload under ``key`` (replaces an older one: a cache, not history)."""
        with self._transaction("put_judgment"):
            self._conn.execute("INSERT OR REPLACE INTO judgments(key, payload) VALUES (?, ?)",
                               (key, canonical_json(payload)))
