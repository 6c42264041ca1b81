"""The store object callers hold: one SQLite file, its transactions, and one part per protocol of
:mod:`.interfaces`, composed (not inherited).

``store.events`` (:class:`~.interfaces.EventRecorder`), ``store.blobs`` (:class:`~.interfaces.BlobStore`),
``store.runs`` (:class:`~.interfaces.RunQueries`), ``store.caches`` (:class:`~.interfaces.TokenCounts` and
:class:`~.interfaces.Judgments`) and ``store.claims`` (:class:`~.interfaces.WorkClaims`); :meth:`Store.transaction`
spans them all. A caller takes the narrowest part it
needs.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path

from kvjudge.retention import events as ev
from kvjudge.retention.store.blobs import SqliteBlobStore
from kvjudge.retention.store.caches import SqliteCaches
from kvjudge.retention.store.claims import SqliteWorkClaims
from kvjudge.retention.store.database import Database
from kvjudge.retention.store.interfaces import FallbackReader
from kvjudge.retention.store.log import SqliteEventRecorder
from kvjudge.retention.store.projection import Projector
from kvjudge.retention.store.queries import SqliteRunQueries


class Store:
    """A kvjudge run store. Open with :meth:`Store.open`; use as a context manager."""

    def __init__(self, db: Database) -> None:
        self._db = db
        self._conn = db.conn  # the connection itself, for tests that read its pragmas
        self.path: Path = db.path
        projector = Projector(db)
        self._projector = projector
        self.blobs = SqliteBlobStore(db, projector.read_locally)
        self.events = SqliteEventRecorder(db, projector, self.blobs.has_body)
        self.runs = SqliteRunQueries(db, projector, self.blobs.has_body, self.events)
        self.caches = SqliteCaches(db, projector)
        self.claims = SqliteWorkClaims(db)
        self.transaction = db.transaction
        self.savepoint = db.savepoint
        self.page_cache = db.page_cache

    @classmethod
    def open(cls, path: str | os.PathLike[str] | None = None, *, fallback: FallbackReader | None = None) -> Store:
        """Open (creating when absent) the store at ``path`` (None: ``data_dir()/store.sqlite``); ``fallback``
        reads bodies that are not local (see :attr:`~.interfaces.BlobStore.fallback`)."""
        db = Database.connect(path)
        store = cls(db)
        db.prepare(rebuild=store.rebuild_projection, reproject=store._projector.reproject)
        store.blobs.fallback = fallback
        return store

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def schema_version(self) -> int:
        return self._db.schema_version()

    def rebuild_projection(self) -> int:
        """Drop the projection and fold every run again from LSN 0. Returns runs folded."""
        return self._projector.rebuild(self.events)

    def write_run(self, run_id: str, bodies: Iterable[tuple[str, bytes]], events: Sequence[ev.Event]) -> int:
        """Write one run's bodies (refs computed from these very bytes), then its events, in one transaction
        (joining the caller's). Returns the bytes of bodies it stored (the others were stored already)."""
        with self.transaction("ingest"):
            stored = self.blobs.put_hashed(bodies)
            self.events.append_many(run_id, events)
        return stored
