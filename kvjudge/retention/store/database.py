"""The store file: opening it (checks, pragmas, migrations) and its transactions.

Every write is an explicit ``BEGIN IMMEDIATE`` transaction (WAL, ``synchronous=FULL``); each has a fault point
``<label>.txn`` just before COMMIT (see :mod:`kvjudge.retention.faults`). Within one process, the write transactions
of every connection to one store file take turns on a lock of that file's (:func:`_write_lock`).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

from kvjudge.errors import StoreError, UsageError
from kvjudge.retention.faults import fault_point
from kvjudge.retention.store.schema import (
    APPLICATION_ID,
    MIGRATIONS,
    PROJECTION_TABLES,
    PROJECTION_MIGRATIONS,
    REPROJECTING_MIGRATIONS,
    SCHEMA_VERSION,
    statements,
)
from kvjudge.settings import data_dir

STORE_FILENAME = "store.sqlite"
#: Refs bound in one ``IN (…)`` look-up (SQLite's limit on bound values is far above; more buys nothing).
REFS_PER_QUERY = 500

_WRITE_LOCKS: dict[Path, threading.RLock] = {}
_WRITE_LOCKS_GUARD = threading.Lock()


def _write_lock(path: Path) -> threading.RLock:
    """This process's lock on the write transactions of the store file at ``path``. Threads writing one store
    through connections of their own (tiering's finishers) queue on it, in turn, as SQLite would have them anyway:
    left to SQLite, a connection that meets the write lock taken polls for it with sleeps of up to 100 ms (256 MiB
    tiered at 469 MB/s on average in turn, 427 polling: 6 rounds each, same load). Reentrant: a thread that opens
    a second connection's transaction inside its first waits in SQLite, as before, not on itself for ever."""
    key = path.resolve()
    with _WRITE_LOCKS_GUARD:
        return _WRITE_LOCKS.setdefault(key, threading.RLock())


def default_store_path() -> Path:
    """Where a store lives when no path is given: ``data_dir()/store.sqlite``."""
    return data_dir() / STORE_FILENAME


class Database:
    """One connection to a store file, and its transactions: the store's parts read and write through it (each
    holds the connection and this object's :meth:`transaction`). Open with :meth:`connect`, then :meth:`prepare`."""

    def __init__(self, conn: sqlite3.Connection, path: Path) -> None:
        self.conn = conn
        self.path = path
        self.location = str(path)
        self._in_txn = False
        self._write_lock = _write_lock(path)

    @classmethod
    def connect(cls, path: str | os.PathLike[str] | None = None) -> Database:
        """Connect to (creating when absent) the store file at ``path`` (None: ``data_dir()/store.sqlite``)."""
        target = Path(path).expanduser() if path is not None else default_store_path()
        if target.is_dir():
            raise StoreError(f"{target} is a directory; --store takes the path of a store file")
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            conn = sqlite3.connect(str(target), isolation_level=None, timeout=30.0)
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open store {target} ({exc}); check the path and its permissions") from exc
        return cls(conn, target)

    def prepare(self, *, rebuild: Callable[[], object], reproject: Callable[[], object]) -> None:
        """Check the file is a kvjudge store, set its pragmas and migrate it; ``rebuild`` folds the projection
        afresh from the log (when its tables were dropped), ``reproject`` writes it again from the states it holds
        (after a migration adds columns). Closes the connection on failure."""
        try:
            self._prepare(rebuild, reproject)
        except sqlite3.DatabaseError as exc:
            self.conn.close()
            raise StoreError(f"{self.path} is not a kvjudge store (SQLite says: {exc}); pass the right --store") \
                from exc
        except BaseException:
            self.conn.close()
            raise

    def _prepare(self, rebuild: Callable[[], object], reproject: Callable[[], object]) -> None:
        conn = self.conn
        # Reading the header first makes a non-SQLite file fail here, before anything is written.
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        app_id = conn.execute("PRAGMA application_id").fetchone()[0]
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if version > SCHEMA_VERSION:
            raise StoreError(f"store {self.path} has schema version {version}; this kvjudge reads up to "
                             f"{SCHEMA_VERSION} — upgrade kvjudge")
        if app_id not in (0, APPLICATION_ID) or (version == 0 and tables):
            raise StoreError(f"{self.path} is an SQLite file but not a kvjudge store; pass another --store")
        if version == 0:
            # A new store keeps pointer maps (settable only before the first table): freeing a deleted body's
            # overflow pages (reduction, tiering) then reads no page of it, instead of every 4 KiB page in turn.
            # INCREMENTAL, not FULL: nothing is moved at commit; free pages stay for reuse.
            conn.execute("PRAGMA auto_vacuum = INCREMENTAL")
        mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise StoreError(f"store {self.path} cannot use WAL journaling (got {mode}); put it on a local disk")
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("PRAGMA foreign_keys=ON")
        # Projections are derived: when someone dropped them, they are folded back from the log.
        dropped = version > 0 and not PROJECTION_TABLES <= tables
        if version < SCHEMA_VERSION:
            with self.transaction("migrate"):
                self._migrate(version, projection_dropped=dropped)
                if dropped:
                    rebuild()
                elif version > 0 and REPROJECTING_MIGRATIONS.intersection(range(version + 1, SCHEMA_VERSION + 1)):
                    reproject()
        elif dropped:
            rebuild()

    def _migrate(self, version: int, *, projection_dropped: bool) -> None:
        for target in range(version + 1, SCHEMA_VERSION + 1):
            if not (projection_dropped and target in PROJECTION_MIGRATIONS):
                for statement in statements(MIGRATIONS[target]):
                    self.conn.execute(statement)
            self.conn.execute(f"PRAGMA user_version = {int(target)}")
        self.conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")

    def close(self) -> None:
        self.conn.close()

    def another(self) -> Database:
        """Another connection to the same store file (for another thread)."""
        return Database.connect(self.path)

    def schema_version(self) -> int:
        return int(self.conn.execute("PRAGMA user_version").fetchone()[0])

    @contextlib.contextmanager
    def transaction(self, label: str, *, durable: bool = True) -> Iterator[None]:
        """``BEGIN IMMEDIATE`` … ``COMMIT`` (ROLLBACK on error); fault point ``<label>.txn`` before COMMIT.

        Nested calls join the outer transaction. ``durable=False`` commits without waiting for the disk: the
        transaction survives a crash of the process, and a power loss only once a later durable commit (or a
        checkpoint) has synced the log — the log is written in order, so that sync covers it too. For writes whose
        loss at a power cut is harmless and redone by the next run: a summary nothing names yet, the deletion of a
        body the log already explains.
        """
        if self._in_txn:
            yield
            return
        if not durable:
            self.conn.execute("PRAGMA synchronous=NORMAL")
        try:
            with self._write_lock:
                self.conn.execute("BEGIN IMMEDIATE")
                self._in_txn = True
                try:
                    yield
                    fault_point(f"{label}.txn")
                    self.conn.execute("COMMIT")
                except BaseException:
                    if self.conn.in_transaction:
                        self.conn.execute("ROLLBACK")
                    raise
                finally:
                    self._in_txn = False
        finally:
            if not durable:
                self.conn.execute("PRAGMA synchronous=FULL")

    @contextlib.contextmanager
    def page_cache(self, mib: int) -> Iterator[None]:
        """Within: SQLite keeps up to ``mib`` MiB of pages in memory on this connection (its default is 2 MiB), then
        the previous size again. For writes in large transactions (an import's batches): a transaction whose
        changed pages outgrow the cache writes them to the WAL before COMMIT (and again when changed again), and
        each index page it evicted is read back for the next insert."""
        previous = int(self.conn.execute("PRAGMA cache_size").fetchone()[0])
        self.conn.execute(f"PRAGMA cache_size = {-int(mib) * 1024}")
        try:
            yield
        finally:
            self.conn.execute(f"PRAGMA cache_size = {previous}")

    @contextlib.contextmanager
    def savepoint(self, name: str) -> Iterator[None]:
        """A SAVEPOINT inside the open :meth:`transaction`: released when the block ends, rolled back to when it
        raises (the rest of the transaction stays), so one part of a batch can fail alone."""
        if not self._in_txn:
            raise UsageError("a savepoint needs an open transaction (Store.transaction)")
        self.conn.execute(f"SAVEPOINT {name}")
        try:
            yield
        except BaseException:
            self.conn.execute(f"ROLLBACK TO {name}")
            self.conn.execute(f"RELEASE {name}")
            raise
        self.conn.execute(f"RELEASE {name}")
