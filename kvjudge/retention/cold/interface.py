"""What a cold store is: the protocol every implementation offers, what it answers, and the checks they share (a
cold store never stores, nor hands back, bytes that are not their ref)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from kvjudge.errors import ColdStoreError, IntegrityError
from kvjudge.retention.blobs import ref_of, short

#: Where a run's bodies are tiered to, as the log records it: a cold store's URL (``file:///abs/path`` or
#: ``s3://bucket[/prefix]``), or a plain local path before it is resolved. Not a token target (an int) and not a
#: judge target (:class:`~kvjudge.target.JudgeTarget`).
ColdTarget = str

#: What :meth:`ColdStore.put_blob` takes: a blob's bytes whole, or in chunks, in order (streamed from the store).
BlobBody = bytes | Iterable[bytes]


@dataclass(frozen=True)
class ObjectInfo:
    """What the cold store says about an object without reading its bytes.

    ``sha256`` is the hex digest the store itself vouches for (S3's stored SHA-256 checksum), or ``None``
    when the store keeps none (a local directory: checking it means reading it back).
    """

    key: str
    size: int
    sha256: str | None


@dataclass(frozen=True)
class ManifestWrite:
    """Outcome of a conditional manifest write: ``created`` False means identical bytes were already there."""

    key: str
    created: bool


@runtime_checkable
class ColdStore(Protocol):
    """The small interface every cold store implements.

    ``url`` is the canonical target recorded in the log (``file:///abs/path`` or ``s3://bucket/prefix``);
    ``endpoint_url`` is where an S3 store is reached (recorded in the log beside the target, so every later
    read goes there), None for a local directory. Every method raises :class:`~kvjudge.errors.ColdStoreError` (one actionable line) when the store is
    unreachable or refuses; none of them ever deletes a stored object.
    """

    url: ColdTarget
    endpoint_url: str | None

    def check(self) -> None:
        """Raise ColdStoreError unless the store is reachable and writable-looking."""

    def put_blob(self, ref: str, body: BlobBody) -> None:
        """Store ``body`` (bytes, or its chunks in order) under its ref's key, provided it hashes to ``ref``
        (IntegrityError otherwise, and nothing is stored: a cold store never holds bytes that are not their ref):
        complete or absent after a crash, durable once :meth:`flush` (or :meth:`put_manifest`) returned."""

    def put_pack(self, key: str, bodies: Iterable[tuple[str, BlobBody]]) -> None:
        """Store the concatenation of ``bodies`` (``(ref, body)`` in order) under ``key``, provided each body hashes
        to its ref (IntegrityError otherwise, and nothing is stored): complete or absent after a crash, durable
        once :meth:`flush` (or :meth:`put_manifest`) returned."""

    def flush(self) -> None:
        """Make every object put (or found by :meth:`stat_object`) so far durable."""

    def stat_object(self, key: str) -> ObjectInfo | None:
        """Size (and the store's own checksum when it keeps one) of the object at ``key``, None when absent. An
        object found is made durable by the next :meth:`flush` like one put (another process may have written it
        unsynced)."""

    def stat_blob(self, ref: str) -> ObjectInfo | None:
        """:meth:`stat_object` of the blob of ``ref``."""

    def get_blob(self, ref: str) -> bytes | None:
        """The blob's bytes, checked against the ref (IntegrityError on mismatch), None when absent."""

    def get_range(self, ref: str, key: str, offset: int, size: int) -> bytes | None:
        """The ``size`` bytes at ``offset`` of the object at ``key`` (a body in a pack), checked against ``ref``
        (IntegrityError on mismatch, a short object included), None when the object is absent."""

    def put_manifest(self, key: str, data: bytes) -> ManifestWrite:
        """Create the manifest at ``key`` unless it exists; if it does, it must hold exactly ``data``.

        Every blob put before is durable first: a manifest present means its move's blobs are there."""

    def get_manifest(self, key: str) -> bytes | None:
        """The manifest's bytes, None when absent."""

    def discard_partial(self, keys: Iterable[str]) -> int:
        """Remove what writes of ``keys`` killed mid-way left behind; returns how many objects went.

        A local directory may hold temp files of a dead writer; S3 has nothing to discard (a PUT applies
        whole or not at all).
        """


def body_chunks(body: BlobBody) -> Iterable[bytes]:
    """A body handed over whole or in chunks, as its chunks."""
    return (body,) if isinstance(body, bytes | bytearray | memoryview) else body


def not_the_ref(ref: str, where: str) -> IntegrityError:
    """The bytes handed over to be stored under ``ref`` are not that ref (a corrupt source): nothing is stored."""
    return IntegrityError(f"the bytes given for {short(ref)} do not hash to it; nothing was stored in {where}")


def checked(ref: str, body: bytes, where: str) -> bytes:
    """``body`` if it hashes to ``ref``; a cold store must never hand back bytes that are not the ref."""
    if ref_of(body) != ref:
        raise IntegrityError(
            f"cold store object {where} does not hash to {ref}: the remote copy was altered; "
            "restore it from a backup or re-tier the run from a rehydrated copy"
        )
    return body



def compare_manifest(key: str, wanted: bytes, existing: bytes | None, where: str) -> None:
    if existing != wanted:
        raise ColdStoreError(
            f"manifest {where} already exists with different content; the cold store holds another "
            "tiering of this run — inspect it, or tier to another target with --to"
        )

