"""The run store: one SQLite file holding the append-only event log, the blobs, derived projections and caches.

No SQL runs outside this package. What the store offers is a few small protocols (:mod:`.interfaces`): the
event recorder, the blob store, run queries and the caches; :class:`Store` composes their SQLite implementations
(``store.events``, ``store.blobs``, ``store.runs``, ``store.caches``) over one file's transactions.
"""

from kvjudge.retention.store.blobs import Blob, BodyReaders
from kvjudge.retention.store.database import STORE_FILENAME, default_store_path
from kvjudge.retention.store.interfaces import (
    BlobStore,
    EventRecorder,
    Explanation,
    FallbackReader,
    Judgments,
    RunListing,
    RunQueries,
    TokenCounts,
    Transactions,
)
from kvjudge.retention.store.runstore import Store
from kvjudge.retention.store.schema import SCHEMA_VERSION

__all__ = ["SCHEMA_VERSION", "STORE_FILENAME", "Blob", "BlobStore", "BodyReaders", "EventRecorder", "Explanation",
           "FallbackReader", "Judgments", "RunListing", "RunQueries", "Store", "TokenCounts", "Transactions",
           "default_store_path"]
