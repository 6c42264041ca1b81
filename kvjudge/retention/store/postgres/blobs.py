"""The blob store on PostgreSQL (the ``blobs`` table, bodies as ``bytea``): bodies under their content-addressed refs,
and readers of them for several threads at once. The same rules as the SQLite store's (:mod:`..blobs`): a body is
never rewritten under its ref; deleting one keeps its row (``body`` NULL) and the log says why it is gone."""

from __future__ import annotations

import io
import itertools
import threading
from collections.abc import Callable, Iterable, Iterator

import psycopg

from kvjudge.retention.store.content import checked_body, text_of
from kvjudge.retention.store.interfaces import FallbackReader
from kvjudge.retention.store.postgres.database import PostgresDatabase

#: Bodies written per statement batch (a chunk's look-up and its inserts).
BODIES_PER_CHUNK = 500


class PostgresBlobStore:
    """:class:`~kvjudge.retention.store.interfaces.BlobStore` on the ``blobs`` table. Each write is a transaction of
    its own or joins the caller's. ``read_locally`` says whether some run's log still reads a body here (the
    projection knows): :meth:`release` keeps those."""

    def __init__(self, db: PostgresDatabase, read_locally: Callable[[str], bool]) -> None:
        self._conn = db.conn
        self._transaction = db.transaction
        self._read_locally = read_locally
        #: Reader for bodies that are not local (e.g. the cold store); set by tiering.
        self.fallback: FallbackReader | None = None

    def get(self, ref: str) -> bytes | None:
        """The body of ``ref``, or None when it is not (or no longer) here."""
        row = self._conn.execute("SELECT body FROM blobs WHERE ref = %s", (ref,)).fetchone()
        return None if row is None or row[0] is None else bytes(row[0])

    def has_body(self, ref: str) -> bool:
        # IS NOT NULL reads the row's null bitmap, never the (toasted) body.
        row = self._conn.execute("SELECT body IS NOT NULL FROM blobs WHERE ref = %s", (ref,)).fetchone()
        return bool(row and row[0])

    def stat(self, ref: str) -> tuple[int, bool] | None:
        """``(size, body present)`` of ``ref``'s row (the size stays when the body goes), None when there is none."""
        row = self._conn.execute("SELECT size, body IS NOT NULL FROM blobs WHERE ref = %s", (ref,)).fetchone()
        return None if row is None else (int(row[0]), bool(row[1]))

    def known(self, ref: str) -> bool:
        """True when the ref has a row (its body may be gone)."""
        return self._conn.execute("SELECT 1 FROM blobs WHERE ref = %s", (ref,)).fetchone() is not None

    def text(self, ref: str) -> str | None:
        """The body of ``ref`` as text: local, else through :attr:`fallback` (cold store), else None."""
        return text_of(ref, self.get, self.fallback)

    def put(self, body: bytes, expected_ref: str | None = None, *, label: str = "put_blob") -> str:
        """Store ``body`` under its sha256 ref and return the ref. Idempotent; IntegrityError (nothing written) when
        it does not hash to ``expected_ref``."""
        ref, data = checked_body(body, expected_ref)
        with self._transaction(label):
            self._put_hashed([(ref, data)])
        return ref

    def put_hashed(self, items: Iterable[tuple[str, bytes]]) -> int:
        """Store bodies whose refs the caller computed from these very bytes; returns the bytes really stored
        (bodies already here cost nothing). Joins the caller's transaction (or opens one)."""
        with self._transaction("put_blob"):
            return self._put_hashed(items)

    def _put_hashed(self, items: Iterable[tuple[str, bytes]]) -> int:
        stored = 0
        pending = iter(items)
        # A chunk at a time: one query finds the bodies already here, one batch writes the others (a new row, or a
        # deleted body filled in again: the same bytes under the same ref).
        while chunk := dict(itertools.islice(pending, BODIES_PER_CHUNK)):
            present = {row[0] for row in self._conn.execute(
                "SELECT ref FROM blobs WHERE ref = ANY(%s) AND body IS NOT NULL", (list(chunk),))}
            missing = [(ref, len(body), body) for ref, body in chunk.items() if ref not in present]
            if missing:
                # One statement (arrays unnested: executemany would sync once per call).
                self._conn.execute(
                    "INSERT INTO blobs(ref, size, body) SELECT * FROM unnest(%s::text[], %s::bigint[], %s::bytea[]) "
                    "ON CONFLICT (ref) DO UPDATE SET body = excluded.body WHERE blobs.body IS NULL",
                    [list(column) for column in zip(*missing)])
            stored += sum(size for _, size, _ in missing)
        return stored

    def release(self, refs: Iterable[str], *, label: str = "delete_body", scrub: bool = True,
                durable: bool = True) -> list[str]:
        """Delete the local bodies of ``refs`` that no run still reads locally; returns those deleted. Call only after
        the event explaining the loss has committed. (``scrub``: the server frees a deleted body's pages at its next
        VACUUM; nothing to choose here.)"""
        deleted: list[str] = []
        with self._transaction(label, durable=durable):
            for ref in dict.fromkeys(refs):
                if not self._read_locally(ref) and self._conn.execute(
                        "UPDATE blobs SET body = NULL WHERE ref = %s AND body IS NOT NULL", (ref,)).rowcount > 0:
                    deleted.append(ref)
        return deleted

    def iter_bodies(self) -> Iterator[tuple[str, bytes]]:
        """Every (ref, body) still present, streamed in ref order."""
        last = ""
        while True:
            rows = self._conn.execute(
                "SELECT ref, body FROM blobs WHERE ref > %s AND body IS NOT NULL ORDER BY ref LIMIT 256", (last,)
            ).fetchall()
            if not rows:
                return
            for ref, body in rows:
                yield ref, bytes(body)
            last = rows[-1][0]


class PostgresBodyReaders:
    """Bodies of a store read by several threads at once: one pooled connection per thread (given back at
    :meth:`close`). A body is read whole, then handed out in chunks (one round trip per body)."""

    def __init__(self, db: PostgresDatabase) -> None:
        self._db = db
        self._local = threading.local()
        self._lock = threading.Lock()
        self._lent: list[psycopg.Connection] = []

    def _connection(self) -> psycopg.Connection:
        conn: psycopg.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._db.lend()
            with self._lock:
                self._lent.append(conn)
            self._local.conn = conn
        return conn

    def open(self, ref: str) -> io.BytesIO | None:
        """The body of ``ref`` open for reading (close it after), None when it is not here."""
        row = self._connection().execute("SELECT body FROM blobs WHERE ref = %s", (ref,)).fetchone()
        return None if row is None or row[0] is None else io.BytesIO(bytes(row[0]))

    def close(self) -> None:
        with self._lock:
            for conn in self._lent:
                self._db.give_back(conn)
            self._lent.clear()
