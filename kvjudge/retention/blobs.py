"""Content-addressed blobs: ``ref = "sha256:<hex of the body's bytes>"``.

A body is never rewritten under its ref. Putting the same bytes twice is a no-op (or brings back a body
that reduction or tiering had deleted — the same bytes, so the ref stays true). Deleting a body keeps the
row (``body`` NULL); the log says why it is gone.
"""

from __future__ import annotations

import hashlib
import re
import sqlite3
from collections.abc import Iterable, Iterator

from kvjudge.errors import IntegrityError, UsageError

REF_PREFIX = "sha256:"
_REF_RE = re.compile(r"^sha256:[0-9a-f]{64}$")


def ref_of(body: bytes) -> str:
    """The ref of ``body``."""
    return REF_PREFIX + hashlib.sha256(body).hexdigest()


def check_ref(ref: str) -> str:
    """``ref`` unchanged, or a UsageError when it is not ``sha256:<64 hex>``."""
    if not isinstance(ref, str) or not _REF_RE.match(ref):
        raise UsageError(f"{ref!r} is not a blob ref; refs look like sha256:<64 hex digits>")
    return ref


def short(ref: str) -> str:
    """``sha256:ab12cd34ef56…`` for messages."""
    return ref[: len(REF_PREFIX) + 12] + "…"


class BlobStore:
    """The ``blobs`` table of a store. Writes happen inside the caller's transaction."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    def get(self, ref: str) -> bytes | None:
        """The body of ``ref``, or None when it is not (or no longer) here."""
        row = self._conn.execute("SELECT body FROM blobs WHERE ref = ?", (ref,)).fetchone()
        return None if row is None or row[0] is None else bytes(row[0])

    def has_body(self, ref: str) -> bool:
        # typeof() is answered from the row header; "body IS NOT NULL" makes SQLite read the whole body.
        row = self._conn.execute("SELECT typeof(body) != 'null' FROM blobs WHERE ref = ?", (ref,)).fetchone()
        return bool(row and row[0])

    def known(self, ref: str) -> bool:
        """True when the ref has a row (its body may be gone)."""
        return self._conn.execute("SELECT 1 FROM blobs WHERE ref = ?", (ref,)).fetchone() is not None

    def put(self, body: bytes, expected_ref: str | None = None) -> str:
        """Store ``body`` under its sha256 ref and return the ref. Idempotent.

        ``expected_ref``: the ref the caller believes the bytes have (an import that names refs);
        a mismatch is an :class:`IntegrityError` and nothing is written.
        Call inside a store transaction (``Store.put_blob`` does this for you).
        """
        if not isinstance(body, bytes | bytearray):
            raise UsageError("a blob body must be bytes")
        ref = ref_of(bytes(body))
        if expected_ref is not None and expected_ref != ref:
            raise IntegrityError(f"body does not hash to {short(expected_ref)} (it hashes to {short(ref)}); "
                                 f"the import is corrupt — re-export it")
        self.put_hashed([(ref, bytes(body))])
        return ref

    def put_hashed(self, items: Iterable[tuple[str, bytes]]) -> int:
        """Store bodies whose refs the caller computed with :func:`ref_of` from these very bytes, or checked
        them against (an importer hashes each body once, to name it in events; a cold read checks each body
        against its ref). Returns the bytes really stored: bodies already here cost nothing. Call inside a
        store transaction."""
        stored = 0
        for ref, body in items:
            # Same ref, same bytes: only a missing body is filled in; an existing one is never touched.
            cursor = self._conn.execute(
                "INSERT INTO blobs(ref, size, body) VALUES (?, ?, ?) "
                "ON CONFLICT(ref) DO UPDATE SET body = excluded.body WHERE blobs.body IS NULL",
                (ref, len(body), body),
            )
            if cursor.rowcount > 0:
                stored += len(body)
        return stored

    def delete_body(self, ref: str) -> bool:
        """Forget the body of ``ref`` (the row stays). True when a body was deleted. Inside a transaction."""
        cursor = self._conn.execute("UPDATE blobs SET body = NULL WHERE ref = ? AND body IS NOT NULL", (ref,))
        return cursor.rowcount > 0

    def iter_bodies(self) -> Iterator[tuple[str, bytes]]:
        """Every (ref, body) still present, streamed in ref order."""
        last = ""
        while True:
            rows = self._conn.execute(
                "SELECT ref, body FROM blobs WHERE ref > ? AND body IS NOT NULL ORDER BY ref LIMIT 256", (last,)
            ).fetchall()
            if not rows:
                return
            for ref, body in rows:
                yield ref, bytes(body)
            last = rows[-1][0]
