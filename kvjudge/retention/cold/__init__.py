"""Cold stores: where tiered bodies live once their run has left the local store.

A cold store holds three kinds of objects:

- **packs**, many bodies each (what a move writes today): the concatenation of a move's bodies in the order its
  manifest lists them, under a key derived from the move (:func:`pack_key`), so writing a pack twice writes
  identical bytes under the same key; a body is read back by its offset and length, and checked against its ref;
- **blobs**, one body each, content-addressed: the key is derived from the ref (``sha256:<hex>``), so writing a
  blob twice writes identical bytes under the same key — the layout of moves made before packs (still read, and
  still written to finish such a move after a crash);
- **manifests**, one per tiering of a run: written last, conditionally (never overwritten with other
  bytes), so their presence is the remote's commit of the whole move.

One module per job: the protocol and the checks every store shares (:mod:`.interface`), where each object lives
(:mod:`.keys`), a directory (:mod:`.local`, the default), an S3-compatible bucket through boto3 — AWS, or SeaweedFS,
MinIO, … (:mod:`.s3`) — and which one a target names (:mod:`.opening`).
"""

from kvjudge.retention.cold.interface import BlobBody, ColdStore, ColdTarget, ManifestWrite, ObjectInfo
from kvjudge.retention.cold.keys import blob_key, manifest_key, pack_key, ref_hex
from kvjudge.retention.cold.local import LocalDirColdStore
from kvjudge.retention.cold.opening import open_cold_store
from kvjudge.retention.cold.s3 import S3ColdStore

__all__ = ["BlobBody", "ColdStore", "ColdTarget", "LocalDirColdStore", "ManifestWrite", "ObjectInfo", "S3ColdStore",
           "blob_key", "manifest_key", "open_cold_store", "pack_key", "ref_hex"]
