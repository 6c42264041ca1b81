"""The run store: the append-only event log, the blobs, derived projections and caches — in one SQLite file (the
embedded default) or in a PostgreSQL database (a lab's shared store, :mod:`.postgres`).

No SQL runs outside this package. What the store offers is a few small protocols (:mod:`.interfaces`): the
event recorder, the blob store, run queries, the caches and the claims on a shared job's units; :class:`Store`
composes one implementation's parts (``store.events``, ``store.blobs``, ``store.runs``, ``store.caches``,
``store.claims``) over its database's transactions, chosen by
the location (:class:`StoreLocation`: a path or a ``postgresql://`` URL).
"""

from kvjudge.retention.store.database import default_store_path
from kvjudge.retention.store.interfaces import (
    BlobStore,
    EventRecorder,
    Explanation,
    FallbackReader,
    JobView,
    Judgments,
    RunListing,
    RunQueries,
    TokenCounts,
    Transactions,
    WorkClaims,
)
from kvjudge.retention.store.location import StoreLocation
from kvjudge.retention.store.runstore import Store

__all__ = ["BlobStore", "EventRecorder", "Explanation", "FallbackReader", "JobView", "Judgments", "RunListing",
           "RunQueries", "Store", "StoreLocation", "TokenCounts", "Transactions", "WorkClaims", "default_store_path"]
