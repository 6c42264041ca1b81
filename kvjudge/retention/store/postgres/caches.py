"""The caches on PostgreSQL, kept beside the log (not history, so not events): token counts and the judge's
judgments — as the SQLite store's (:mod:`..caches`)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from kvjudge.retention.events import canonical_json
from kvjudge.retention.store.postgres.database import PostgresDatabase
from kvjudge.retention.store.postgres.projection import PostgresProjector


class PostgresCaches:
    """:class:`~kvjudge.retention.store.interfaces.TokenCounts` on ``blob_tokens`` (first write wins; each run's
    total follows in the projection, through ``projector``) and :class:`~kvjudge.retention.store.interfaces.Judgments`
    on ``judgments``."""

    def __init__(self, db: PostgresDatabase, projector: PostgresProjector) -> None:
        self._conn = db.conn
        self._transaction = db.transaction
        self._total_runs_naming = projector.total_runs_naming

    def cached_counts(self, refs: Iterable[str], counter: str) -> dict[str, int]:
        """Stored counts of ``refs`` under ``counter`` (refs never counted are absent)."""
        wanted = list(dict.fromkeys(refs))
        return {ref: int(tokens) for ref, tokens in self._conn.execute(
            "SELECT ref, tokens FROM blob_tokens WHERE counter = %s AND ref = ANY(%s)", (counter, wanted))}

    def put_counts(self, counter: str, counts: Mapping[str, int], *, label: str = "put_counts") -> None:
        """Record counts (first write wins) and the totals of the runs they complete, in one transaction not waited
        for on disk (a cache: counts lost at a crash of the server are counted again)."""
        if not counts:
            return
        with self._transaction(label, durable=False):
            with self._conn.cursor() as cursor:
                cursor.executemany("INSERT INTO blob_tokens(ref, counter, tokens) VALUES (%s, %s, %s) "
                                   "ON CONFLICT DO NOTHING", [(ref, counter, int(n)) for ref, n in counts.items()])
            self._total_runs_naming(list(counts), counter)

    def get_judgment(self, key: str) -> dict[str, Any] | None:
        """A cached judgment payload, or None."""
        row = self._conn.execute("SELECT payload FROM judgments WHERE key = %s", (key,)).fetchone()
        return None if row is None else json.loads(row[0])

    def get_judgments(self, keys: Iterable[str]) -> dict[str, dict[str, Any]]:
        """The cached judgment payloads of ``keys`` that are cached, by key (one query for any number)."""
        wanted = list(dict.fromkeys(keys))
        return {key: json.loads(payload) for key, payload in self._conn.execute(
            "SELECT key, payload FROM judgments WHERE key = ANY(%s)", (wanted,))}

    def put_judgment(self, key: str, payload: dict[str, Any]) -> None:
        """Cache a judgment payload under ``key`` (replaces an older one: a cache, not history)."""
        with self._transaction("put_judgment"):
            self._conn.execute("INSERT INTO judgments(key, payload) VALUES (%s, %s) "
                               "ON CONFLICT (key) DO UPDATE SET payload = excluded.payload",
                               (key, canonical_json(payload)))
