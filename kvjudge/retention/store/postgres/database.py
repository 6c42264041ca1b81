"""The store's PostgreSQL database: connecting (one line for each way it fails, never the password), its
transactions, its migrations, and the pool that other threads' connections come from.

Every write is a transaction that first takes one advisory lock of the database's (``pg_advisory_xact_lock``,
held to COMMIT): write transactions take turns across every process and host, as SQLite's ``BEGIN IMMEDIATE``
has them take turns on one file — so what a transaction read before it wrote is still what is committed when it
commits, and the LSNs the log hands out commit in their order (a reader following the log never skips one). Each
has the fault point ``<label>.txn`` just before COMMIT. Reads run outside transactions, each statement on the
latest committed state.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import psycopg_pool

from kvjudge.errors import StoreError, UsageError
from kvjudge.retention.faults import fault_point
from kvjudge.retention.store.location import StoreLocation, scrub, url_password
from kvjudge.retention.store.postgres.schema import (
    MIGRATIONS,
    PROJECTION_TABLES,
    SCHEMA_TABLE,
    SCHEMA_TABLE_SQL,
    SCHEMA_VERSION,
)

#: The key of the advisory lock every write transaction holds ("kvjd").
WRITE_LOCK_KEY = 0x6B766A64
#: Seconds a connection attempt may take (libpq's connect_timeout) unless the URL says otherwise.
CONNECT_TIMEOUT_S = 5
#: Connections the pool lends to other threads of one process at most: tiering's uploads (8 readers), its finishers
#: (4), and a recovery's uploads beside them (8 more), with room to spare; opened only when asked for.
POOL_SIZE = 32


class _Pool:
    """The connections of one store's other threads, opened on first use and shared by every store object opened
    from it (:meth:`PostgresDatabase.another`)."""

    def __init__(self, url: str, kwargs: dict[str, Any]) -> None:
        self._url = url
        self._kwargs = kwargs
        self._pool: psycopg_pool.ConnectionPool | None = None
        self._lock = threading.Lock()

    def getconn(self) -> psycopg.Connection:
        with self._lock:
            if self._pool is None:
                self._pool = psycopg_pool.ConnectionPool(self._url, kwargs=self._kwargs, min_size=0,
                                                         max_size=POOL_SIZE, open=True, name="kvjudge-store")
        return self._pool.getconn()

    def putconn(self, conn: psycopg.Connection) -> None:
        assert self._pool is not None
        self._pool.putconn(conn)

    def close(self) -> None:
        with self._lock:
            if self._pool is not None:
                self._pool.close()
                self._pool = None


class PostgresDatabase:
    """One connection to a store's database, and its transactions: the store's parts read and write through it
    (each holds the connection and this object's :meth:`transaction`). Open with :meth:`connect`, then
    :meth:`prepare`."""

    def __init__(self, conn: psycopg.Connection, location: StoreLocation, pool: _Pool, *, create: bool,
                 owner: bool, release: Callable[[psycopg.Connection], None] | None = None) -> None:
        self.conn = conn
        self.path = None
        self.location = location.display
        self._where = location
        self._pool = pool
        self._create = create
        self._owner = owner  # the first store object: it closes the pool
        self._release = release
        self._in_txn = False

    @classmethod
    def connect(cls, location: StoreLocation, *, password: str | None = None, create: bool = True) -> PostgresDatabase:
        """Connect to the database ``location`` names. The password: the URL's, else ``password``, else libpq's
        own (PGPASSWORD, the password file, the service file)."""
        assert location.url is not None
        kwargs: dict[str, Any] = {"autocommit": True, "application_name": "kvjudge"}
        if "connect_timeout" not in location.url:
            kwargs["connect_timeout"] = CONNECT_TIMEOUT_S
        if password and not url_password(location.url):
            kwargs["password"] = password
        try:
            conn = psycopg.connect(location.url, **kwargs)
        except psycopg.Error as exc:
            raise connect_error(exc, location, password) from None
        return cls(conn, location, _Pool(location.url, kwargs), create=create, owner=True)

    def another(self) -> PostgresDatabase:
        """Another connection to the same database, from this store's pool (for another thread)."""
        conn = self._pool.getconn()
        return PostgresDatabase(conn, self._where, self._pool, create=False, owner=False, release=self._pool.putconn)

    def lend(self) -> psycopg.Connection:
        """A connection from the pool for a reader of another thread; give it back with :meth:`give_back`."""
        return self._pool.getconn()

    def give_back(self, conn: psycopg.Connection) -> None:
        self._pool.putconn(conn)

    def close(self) -> None:
        if self._release is not None:
            self._release(self.conn)
        else:
            self.conn.close()
        if self._owner:
            self._pool.close()

    # ---------------------------------------------------------------------------------------------- schema
    def prepare(self, *, rebuild: Callable[[], object], reproject: Callable[[], object]) -> None:
        """Check the database is a kvjudge store (or empty: then make it one, unless opened with ``create=False``),
        migrate it, and fold the projection afresh when its tables were dropped. Closes the connection on failure.
        (``reproject`` is for migrations that add projection columns: none yet on PostgreSQL.)"""
        try:
            # Up to date (the common case): nothing to write, so no write lock to wait for behind a long writer.
            if self._needs_work():
                with self.transaction("migrate"):
                    self._prepare(rebuild)  # checked again under the lock: another process may have done it
        except psycopg.Error as exc:
            self.close()
            raise StoreError(f"cannot prepare the store at {self.location}: {_first_line(exc)}; check the role's "
                             f"privileges on the database") from None
        except BaseException:
            self.close()
            raise

    def _needs_work(self) -> bool:
        """True unless the database is a kvjudge store of this schema with its projection in place (anything else —
        empty, older, newer, someone else's, projection dropped — is decided by :meth:`_prepare`, under the lock)."""
        tables = self.tables()
        return SCHEMA_TABLE not in tables or self.schema_version() != SCHEMA_VERSION or \
            not PROJECTION_TABLES <= tables

    def _prepare(self, rebuild: Callable[[], object]) -> None:
        tables = self.tables()
        version = self.schema_version() if SCHEMA_TABLE in tables else 0
        if version > SCHEMA_VERSION:
            raise StoreError(f"store {self.location} has schema version {version}; this kvjudge reads up to "
                             f"{SCHEMA_VERSION} — upgrade kvjudge")
        if version == 0 and tables:
            raise StoreError(f"database {self.location} holds tables but is not a kvjudge store; pass another "
                             f"--store (an empty database, or one kvjudge made)")
        if version == 0 and not self._create:
            raise StoreError(f"no store at {self.location}: the database is empty; `kvjudge ingest PATH... --store "
                             f"URL` creates one there")
        if version == 0:
            self.conn.execute(SCHEMA_TABLE_SQL)
        for target in range(version + 1, SCHEMA_VERSION + 1):
            name, sql = MIGRATIONS[target]
            self.conn.execute(sql)
            self.conn.execute(f"INSERT INTO {SCHEMA_TABLE}(version, name) VALUES (%s, %s)", (target, name))
        if version > 0 and not PROJECTION_TABLES <= tables:
            rebuild()

    def tables(self) -> set[str]:
        """The tables of the store's schema (the connection's current schema)."""
        return {row[0] for row in self.conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()")}

    def schema_version(self) -> int:
        row = self.conn.execute(f"SELECT COALESCE(MAX(version), 0) FROM {SCHEMA_TABLE}").fetchone()
        return int(row[0]) if row else 0

    # ------------------------------------------------------------------------------------------ transactions
    @contextlib.contextmanager
    def transaction(self, label: str, *, durable: bool = True) -> Iterator[None]:
        """BEGIN, the write lock, … COMMIT (ROLLBACK on error); fault point ``<label>.txn`` before COMMIT.

        Nested calls join the outer transaction. ``durable=False`` commits without waiting for the server's disk
        (``synchronous_commit = off``): lost only at a crash of the server, and only until a later durable commit
        flushes the WAL written before it — for writes whose loss is harmless and redone by the next run."""
        if self._in_txn:
            yield
            return
        conn = self.conn
        self._in_txn = True
        try:
            with conn.pipeline():  # one round trip
                conn.execute("BEGIN")
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (WRITE_LOCK_KEY,))
                if not durable:
                    conn.execute("SET LOCAL synchronous_commit = off")
            yield
            fault_point(f"{label}.txn")
            conn.execute("COMMIT")
        except BaseException:
            if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE and not conn.closed:
                conn.execute("ROLLBACK")
            raise
        finally:
            self._in_txn = False

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
            self.conn.execute(f"ROLLBACK TO SAVEPOINT {name}")
            self.conn.execute(f"RELEASE SAVEPOINT {name}")
            raise
        self.conn.execute(f"RELEASE SAVEPOINT {name}")

    @contextlib.contextmanager
    def page_cache(self, mib: int) -> Iterator[None]:
        """Nothing to do on PostgreSQL: the server sizes its own buffers (SQLite's connection cache, on a file)."""
        yield


def connect_error(exc: psycopg.Error, location: StoreLocation, password: str | None) -> StoreError:
    """What a failed connection means, in one line naming what to do; never a password."""
    text = scrub(str(exc), password, url_password(location.url or ""))
    said = " ".join(text.split())
    where = location.display
    if "does not exist" in said and "database" in said:
        name = said.split('database "', 1)[-1].split('"', 1)[0]
        return StoreError(f"database {name!r} does not exist on the server of {where}; create it (`createdb {name}`) "
                          f"or fix the URL")
    remedy = "set PGPASSWORD, a ~/.pgpass line or [store] password_env (the variable that holds it)"
    if "password authentication failed" in said:
        return StoreError(f"PostgreSQL refused the password for {where}; {remedy}")
    if "no password supplied" in said:
        return StoreError(f"PostgreSQL asks a password for {where} and none was given; {remedy}")
    if any(sign in said for sign in ("Connection refused", "timeout expired", "could not translate host name",
                                     "No route to host", "Network is unreachable", "could not connect")):
        return StoreError(f"cannot reach PostgreSQL at {where} ({_first_line(said)}); check the server is running "
                          f"and the URL's host and port")
    return StoreError(f"cannot connect to the store at {where}: {_first_line(said)}")


def _first_line(exc: object) -> str:
    text = " ".join(str(exc).split())
    for prefix in ("connection failed: ",):
        text = text.removeprefix(prefix)
    return text[:300]
