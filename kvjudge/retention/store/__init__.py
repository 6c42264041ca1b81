"""The run store: one SQLite file holding the append-only event log, the blobs, derived projections and caches.

No SQL runs outside this package. What the store offers is a few small protocols (:mod:`.interfaces`): the
event recorder, the blob store, run queries, the caches and the claims on a shared job's units; :class:`Store`
composes their SQLite implementations (``store.events``, ``store.blobs``, ``store.runs``, ``store.caches``,
``store.claims``) over one file's transactions.
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
from kvjudge.retention.store.runstore import Store

__all__ = ["BlobStore", "EventRecorder", "Explanation", "FallbackReader", "JobView", "Judgments", "RunListing",
           "RunQueries", "Store", "TokenCounts", "Transactions", "WorkClaims", "default_store_path"]
