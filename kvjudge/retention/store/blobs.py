"""The blob store on SQLite (the ``blobs`` table): bodies under their content-addressed refs
(:mod:`kvjudge.retention.blobs`), and readers of them for several threads at once.

A body is never rewritten under its ref. Putting the same bytes twice is a no-op (or brings back a body
that reduction or tiering had deleted — the same bytes, so the ref stays true). Deleting a body keeps the
row (``body`` NULL); the log says why it is gone.
"""

from __future__ import annotations

import contextlib
import itertools
import sqlite3
import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from kvjudge.retention.store.content import checked_body, text_of
from kvjudge.retention.store.database import REFS_PER_QUERY, Database
from kvjudge.retention.store.interfaces import FallbackReader

_MMAP_BYTES = 1 << 40  # SQLite caps it at its compile-time maximum

#: A body open for reading in chunks (:meth:`BodyReaders.open`): ``read(n)``, ``len()``, ``close()``.
Blob = sqlite3.Blob


class SqliteBlobStore:
    """:class:`~kvjudge.retention.store.interfaces.BlobStore` on the ``blobs`` table. Each write is a transaction
    of its own or joins the caller's. ``read_locally`` says whether some run's log still reads a body here (the
    projection knows): :meth:`release` keeps those."""

    def __init__(self, db: Database, read_locally: Callable[[str], bool]) -> None:
        self._conn = db.conn
        self._transaction = db.transaction
        self._read_locally = read_locally
        #: Reader for bodies that are not local (e.g. the cold store); set by tiering.
        self.fallback: FallbackReader | None = None

    def get(self, ref: str) -> bytes | None:
        """The body of ``ref``, or None when it is not (or no longer) here."""
        row = self._conn.execute("SELECT body FROM blobs WHERE ref = ?", (ref,)).fetchone()
        return None if row is None or row[0] is None else bytes(row[0])

    def has_body(self, ref: str) -> bool:
        # typeof() is answered from the row header; "body IS NOT NULL" makes SQLite read the whole body.
        row = self._conn.execute("SELECT typeof(body) != 'null' FROM blobs WHERE ref = ?", (ref,)).fetchone()
        return bool(row and row[0])

    def stat(self, ref: str) -> tuple[int, bool] | None:
        """``(size, body present)`` of ``ref``'s row (the size stays when the body goes), None when there is none."""
        # typeof(), not "body IS NOT NULL": SQLite answers it from the row header instead of reading the body.
        row = self._conn.execute("SELECT size, typeof(body) != 'null' FROM blobs WHERE ref = ?", (ref,)).fetchone()
        return None if row is None else (int(row[0]), bool(row[1]))

    def known(self, ref: str) -> bool:
        """True when the ref has a row (its body may be gone)."""
        return self._conn.execute("SELECT 1 FROM blobs WHERE ref = ?", (ref,)).fetchone() is not None

    def text(self, ref: str) -> str | None:
        """The body of ``ref`` as text: local, else through :attr:`fallback` (cold store), else None."""
        return text_of(ref, self.get, self.fallback)

    def put(self, body: bytes, expected_ref: str | None = None, *, label: str = "put_blob") -> str:
        """Store ``body`` under its sha256 ref and return the ref. Idempotent.

        ``expected_ref``: the ref the caller believes the bytes have (an import that names refs);
        a mismatch is an :class:`IntegrityError` and nothing is written.
        """
        ref, data = checked_body(body, expected_ref)
        with self._transaction(label):
            self._put_hashed([(ref, data)])
        return ref

    def put_hashed(self, items: Iterable[tuple[str, bytes]]) -> int:
        """Store bodies whose refs the caller computed with :func:`ref_of` from these very bytes, or checked
        them against (an importer hashes each body once, to name it in events; a cold read checks each body
        against its ref). Returns the bytes really stored: bodies already here cost nothing. Joins the caller's
        transaction (or opens one)."""
        with self._transaction("put_blob"):
            return self._put_hashed(items)

    def _put_hashed(self, items: Iterable[tuple[str, bytes]]) -> int:
        stored = 0
        pending = iter(items)
        # A chunk at a time: one query finds the bodies already here (most of a run's prompts and templates), one
        # executemany writes the others — each a new row or a missing body filled in, so each stores its bytes.
        # Same ref, same bytes: a body already here is never touched. typeof(), not "body IS NULL": SQLite answers
        # it from the row header instead of reading the body.
        while chunk := dict(itertools.islice(pending, REFS_PER_QUERY)):
            marks = ",".join("?" * len(chunk))
            present = {row[0] for row in self._conn.execute(
                f"SELECT ref FROM blobs WHERE ref IN ({marks}) AND typeof(body) != 'null'", list(chunk))}
            missing = [(ref, len(body), body) for ref, body in chunk.items() if ref not in present]
            self._conn.executemany(
                "INSERT INTO blobs(ref, size, body) VALUES (?, ?, ?) "
                "ON CONFLICT(ref) DO UPDATE SET body = excluded.body WHERE typeof(blobs.body) = 'null'", missing)
            stored += sum(size for _, size, _ in missing)
        return stored

    def release(self, refs: Iterable[str], *, label: str = "delete_body", scrub: bool = True,
                durable: bool = True) -> list[str]:
        """Delete the local bodies of ``refs`` that no run still reads locally; returns those deleted.

        A body shared by two runs stays as long as the log of either still says it is local there.
        Call only after the event explaining the loss (Reduced, Dropped, Tiered) has committed. ``scrub=False``
        for bodies that live on elsewhere (tiered): their freed pages are zeroed only when that is free to do.
        ``durable=False``: the deletion does not wait for the disk (see ``transaction``; a deletion lost at a power
        cut leaves a body the log explains, deleted again by the next run).
        """
        deleted: list[str] = []
        with self._scrubbing(scrub), self._transaction(label, durable=durable):
            for ref in dict.fromkeys(refs):
                if not self._read_locally(ref) and self._delete_body(ref):
                    deleted.append(ref)
        return deleted

    def _delete_body(self, ref: str) -> bool:
        """Forget the body of ``ref`` (the row stays). True when a body was deleted."""
        cursor = self._conn.execute("UPDATE blobs SET body = NULL WHERE ref = ? AND body IS NOT NULL", (ref,))
        return cursor.rowcount > 0

    @contextlib.contextmanager
    def _scrubbing(self, scrub: bool) -> Iterator[None]:
        """Within: deleted bodies' pages are zeroed (``scrub``, this SQLite build's default), or only where that
        costs nothing (``secure_delete = FAST``). Zeroing writes every deleted body once more to the WAL and again
        at checkpoint (2x the I/O of a move); a body that lives on elsewhere (tiered) is not a secret to scrub."""
        if scrub:
            yield
            return
        previous = self._conn.execute("PRAGMA secure_delete").fetchone()[0]
        self._conn.execute("PRAGMA secure_delete = FAST")
        try:
            yield
        finally:
            self._conn.execute(f"PRAGMA secure_delete = {int(previous)}")

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


class BodyReaders:
    """Bodies of the store file at ``path`` read in chunks by several threads at once: one read-only connection
    per thread (an SQLite connection is not shared), so reading is as parallel as the writing it feeds."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._local = threading.local()
        self._lock = threading.Lock()
        self._opened: list[sqlite3.Connection] = []

    def _connection(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(f"{self._path.absolute().as_uri()}?mode=ro", uri=True, timeout=30.0,
                                   check_same_thread=False)
            # Bodies are read once, in full: mapped pages cost no read() call each (half the CPU of reading
            # 4 KiB pages one by one). Only these read-only connections map the file.
            conn.execute(f"PRAGMA mmap_size = {_MMAP_BYTES}")
            with self._lock:
                self._opened.append(conn)
            self._local.conn = conn
        return conn

    def open(self, ref: str) -> sqlite3.Blob | None:
        """The body of ``ref`` opened for reading in chunks (close it after), None when it is not here. An open
        body is a snapshot: a concurrent release of it does not change what is read."""
        conn = self._connection()
        row = conn.execute("SELECT rowid FROM blobs WHERE ref = ?", (ref,)).fetchone()
        if row is None:
            return None
        try:
            return conn.blobopen("blobs", "body", row[0], readonly=True)
        except sqlite3.OperationalError:
            # NULL: released since (a concurrent finish of the same move); anything else is a real error.
            if conn.execute("SELECT typeof(body) FROM blobs WHERE rowid = ?", row).fetchone() == ("null",):
                return None
            raise

    def close(self) -> None:
        with self._lock:
            for conn in self._opened:
                conn.close()
            self._opened.clear()
