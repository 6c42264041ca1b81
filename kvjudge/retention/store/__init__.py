"""The run store: one SQLite file holding the append-only event log, the blobs, derived projections and caches.

No SQL runs outside this package: other modules ask the :class:`Store` (or its :class:`BlobStore`) a named
question. See :mod:`.runstore` for how the store's jobs are split.
"""

from kvjudge.retention.store.blobs import Blob, BlobStore, BodyReaders
from kvjudge.retention.store.database import STORE_FILENAME, default_store_path
from kvjudge.retention.store.projection import Explanation
from kvjudge.retention.store.queries import RunListing
from kvjudge.retention.store.runstore import FallbackReader, Store
from kvjudge.retention.store.schema import SCHEMA_VERSION

__all__ = ["SCHEMA_VERSION", "STORE_FILENAME", "Blob", "BlobStore", "BodyReaders", "Explanation", "FallbackReader",
           "RunListing", "Store", "default_store_path"]
