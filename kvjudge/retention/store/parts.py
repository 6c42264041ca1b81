"""The parts a :class:`~kvjudge.retention.store.Store` composes, and the SQLite implementation's (the PostgreSQL
one's are :mod:`.postgres.parts`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kvjudge.retention.store.blobs import BodyReaders, SqliteBlobStore
from kvjudge.retention.store.caches import SqliteCaches
from kvjudge.retention.store.claims import SqliteWorkClaims
from kvjudge.retention.store.database import Database
from kvjudge.retention.store.interfaces import BlobStore, BodyReading, EventRecorder, RunQueries, WorkClaims
from kvjudge.retention.store.log import SqliteEventRecorder
from kvjudge.retention.store.projection import Projector
from kvjudge.retention.store.queries import SqliteRunQueries


@dataclass(frozen=True)
class StoreParts:
    """One implementation's parts over one database: what :class:`Store` composes."""

    events: EventRecorder
    blobs: BlobStore
    runs: RunQueries
    caches: Any  # TokenCounts and Judgments
    claims: WorkClaims
    rebuild: Callable[[], int]  # drop the projection and fold every run again from LSN 0
    reproject: Callable[[], int]  # write every run's projection again from the state it holds
    body_readers: Callable[[], BodyReading]


def sqlite_parts(db: Database) -> StoreParts:
    """The SQLite implementation's parts over the store file ``db``."""
    projector = Projector(db)
    blobs = SqliteBlobStore(db, projector.read_locally)
    events = SqliteEventRecorder(db, projector, blobs.has_body)
    return StoreParts(events=events, blobs=blobs, runs=SqliteRunQueries(db, projector, blobs.has_body, events),
                      caches=SqliteCaches(db, projector), claims=SqliteWorkClaims(db), rebuild=lambda: projector.rebuild(events),
                      reproject=projector.reproject, body_readers=lambda: BodyReaders(db.path))


