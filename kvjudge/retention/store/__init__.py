"""The run store: the append-only event log, the blobs, derived projections and caches — in one SQLite file (the
embedded default) or in a PostgreSQL database (a lab's shared store, :mod:`.postgres`).

No SQL runs outside this package. What the store offers is a few small protocols (:mod:`.interfaces`): the
event recorder, the blob store, run queries and the caches; :class:`Store` composes one implementation's parts
(``store.events``, ``store.blobs``, ``store.runs``, ``store.caches``) over its database's transactions, chosen by
the location (:class:`StoreLocation`: a path or a ``postgresql://`` URL).
"""

from kvjudge.retention.store.database import default_store_path
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
from kvjudge.retention.store.location import StoreLocation
from kvjudge.retention.store.runstore import Store

__all__ = ["BlobStore", "EventRecorder", "Explanation", "FallbackReader", "Judgments", "RunListing", "RunQueries",
           "Store", "StoreLocation", "TokenCounts", "Transactions", "default_store_path"]
