"""The PostgreSQL implementation's parts composed over one database connection (what ``Store.open`` takes for a
``postgresql://`` URL)."""

from __future__ import annotations

from collections.abc import Callable

from kvjudge.retention.store.location import StoreLocation
from kvjudge.retention.store.postgres.blobs import PostgresBlobStore, PostgresBodyReaders
from kvjudge.retention.store.postgres.caches import PostgresCaches
from kvjudge.retention.store.postgres.claims import PostgresWorkClaims
from kvjudge.retention.store.postgres.database import PostgresDatabase
from kvjudge.retention.store.postgres.log import PostgresEventRecorder
from kvjudge.retention.store.postgres.projection import PostgresProjector
from kvjudge.retention.store.postgres.queries import PostgresRunQueries
from kvjudge.retention.store.parts import StoreParts


def postgres_parts(db: PostgresDatabase) -> StoreParts:
    """The PostgreSQL parts over ``db``'s connection."""
    projector = PostgresProjector(db)
    blobs = PostgresBlobStore(db, projector.read_locally)
    events = PostgresEventRecorder(db, projector, blobs.has_body)
    return StoreParts(events=events, blobs=blobs, runs=PostgresRunQueries(db, projector, blobs.has_body, events),
                      caches=PostgresCaches(db, projector), claims=PostgresWorkClaims(db),
                      rebuild=lambda: projector.rebuild(events),
                      reproject=projector.reproject, body_readers=lambda: PostgresBodyReaders(db))


def open_postgres(location: StoreLocation, *, password: str | None = None,
                  create: bool = True) -> tuple[PostgresDatabase, Callable[[PostgresDatabase], StoreParts]]:
    """Connect to the database at ``location``: the database, and how to compose the store's parts over it."""
    return PostgresDatabase.connect(location, password=password, create=create), postgres_parts
