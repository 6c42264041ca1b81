"""The store object callers hold: one database (a SQLite file, or a PostgreSQL database), its transactions, and one
part per protocol of :mod:`.interfaces`, composed (not inherited).

``store.events`` (:class:`~.interfaces.EventRecorder`), ``store.blobs`` (:class:`~.interfaces.BlobStore`),
``store.runs`` (:class:`~.interfaces.RunQueries`), ``store.caches`` (:class:`~.interfaces.TokenCounts` and
:class:`~.interfaces.Judgments`) and ``store.claims`` (:class:`~.interfaces.WorkClaims`); :meth:`Store.transaction`
spans them all. A caller takes the narrowest part it
needs. :meth:`Store.open` picks the implementation from the location: a path is SQLite, a ``postgresql://`` URL
is PostgreSQL (:mod:`.postgres`, imported only then).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from kvjudge.errors import StoreError
from kvjudge.retention import events as ev
from kvjudge.retention.store.database import Database, default_store_path
from kvjudge.retention.store.interfaces import BodyReading, FallbackReader
from kvjudge.retention.store.location import StoreLocation
from kvjudge.retention.store.parts import StoreParts, sqlite_parts


class Store:
    """A kvjudge run store. Open with :meth:`Store.open`; use as a context manager.

    ``location`` says where it is, fit to show (a URL without its password); ``path`` is the SQLite file (None on
    PostgreSQL)."""

    def __init__(self, db: Any, compose: Callable[[Any], StoreParts] = sqlite_parts) -> None:
        self._db = db
        self._conn = db.conn  # the connection itself, for tests that read its settings
        self.path: Path | None = db.path
        self.location: str = db.location
        self._compose = compose  # the implementation's parts over a database (another store object takes them too)
        self._parts = parts = compose(db)
        self.blobs = parts.blobs
        self.events = parts.events
        self.runs = parts.runs
        self.caches = parts.caches
        self.claims = parts.claims
        self.transaction = db.transaction
        self.savepoint = db.savepoint
        self.page_cache = db.page_cache

    @classmethod
    def open(cls, location: str | os.PathLike[str] | None = None, *, fallback: FallbackReader | None = None,
             create: bool = True, password: str | None = None) -> Store:
        """Open the store at ``location``: a SQLite file's path (None: ``data_dir()/store.sqlite``) or a
        ``postgresql://`` URL. ``create=False`` refuses a store that is not there yet (a file that does not exist, a
        database without kvjudge's tables) instead of making one. ``password`` (PostgreSQL only): the role's
        password (``[store] password_env``'s); without it libpq's own conventions apply (PGPASSWORD, the password
        file, the service file); a password in the URL wins over both. ``fallback`` reads bodies that are not local
        (see :attr:`~.interfaces.BlobStore.fallback`)."""
        where = StoreLocation.parse(location if location is not None else default_store_path())
        if where.is_postgres:
            from kvjudge.retention.store.postgres import open_postgres

            db, compose = open_postgres(where, password=password, create=create)
        else:
            assert where.path is not None
            if not create and not where.path.exists():
                raise StoreError(f"no store at {where}: `kvjudge ingest PATH...` creates one there (or pass --store / "
                                 f"set [store] url to an existing store)")
            db, compose = Database.connect(where.path), sqlite_parts
        return cls._prepared(db, compose, fallback=fallback)

    @classmethod
    def _prepared(cls, db: Any, compose: Callable[[Any], StoreParts], *,
                  fallback: FallbackReader | None = None) -> Store:
        store = cls(db, compose)
        db.prepare(rebuild=store.rebuild_projection, reproject=store._parts.reproject)
        store.blobs.fallback = fallback
        return store

    def open_another(self) -> Store:
        """Another store object on the same database, for another thread (tiering's finishers): a connection of
        its own (on PostgreSQL, from this store's pool)."""
        return Store._prepared(self._db.another(), self._compose)

    def body_readers(self) -> BodyReading:
        """Readers of this store's bodies for several threads at once (close after)."""
        return self._parts.body_readers()

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Store({self.location!r})"

    def schema_version(self) -> int:
        return self._db.schema_version()

    def rebuild_projection(self) -> int:
        """Drop the projection and fold every run again from LSN 0. Returns runs folded."""
        return self._parts.rebuild()

    def write_run(self, run_id: str, bodies: Iterable[tuple[str, bytes]], events: Sequence[ev.Event]) -> int:
        """Write one run's bodies (refs computed from these very bytes), then its events, in one transaction
        (joining the caller's). Returns the bytes of bodies it stored (the others were stored already)."""
        with self.transaction("ingest"):
            stored = self.blobs.put_hashed(bodies)
            self.events.append_many(run_id, events)
        return stored
