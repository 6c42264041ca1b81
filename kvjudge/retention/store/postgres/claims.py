"""Claims on units of work on PostgreSQL (the ``claims`` table): processes on many hosts share one job, as the
SQLite store's claims let processes on one host (:mod:`..claims`).

A claim is ``SELECT … FOR UPDATE SKIP LOCKED`` over the units free to take (no one holds them, or their lease
expired; never one done), then the rows taken are marked with the worker and the lease's expiry, in one short
transaction: two workers claiming at once each skip the rows the other has locked, and never wait on each other
(nor on the store's write lock: a claim writes only its own rows). Lease times are the database server's clock,
so the hosts' clocks need not agree. A finished unit is marked in the caller's transaction, the one that writes its
result.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from kvjudge.retention.store.claim_rows import job_view, with_try
from kvjudge.retention.store.interfaces import JobView
from kvjudge.retention.store.postgres.database import PostgresDatabase

_NOW = "extract(epoch from clock_timestamp())"


class PostgresWorkClaims:
    """:class:`~kvjudge.retention.store.interfaces.WorkClaims` on the ``claims`` table of one database."""

    def __init__(self, db: PostgresDatabase) -> None:
        self._db = db
        self._conn = db.conn
        self._transaction = db.transaction
        self._owner = threading.get_ident()
        self._renewers = threading.local()

    def available(self) -> bool:
        """True when the store's schema has the claims table (migration 2 on)."""
        return "claims" in self._db.tables()

    def claim(self, units: Sequence[str], kind: str, worker: str, lease_seconds: float, *, limit: int = 1,
              skip: Iterable[str] = ()) -> list[str]:
        """Take up to ``limit`` of ``units`` (in their order) that are free, skipping rows another worker is
        claiming this very moment; never one done, nor one in ``skip``. Returns the units taken."""
        wanted = [unit for unit in dict.fromkeys(units) if unit not in set(skip)]
        if not wanted:
            return []
        conn = self._conn
        # The rows first, each in its own statement: a unit no one has claimed yet has one to lock.
        conn.execute("INSERT INTO claims(unit, kind) SELECT unnest(%s::text[]), %s ON CONFLICT DO NOTHING",
                     (wanted, kind))
        with conn.transaction():
            taken = [row[0] for row in conn.execute(
                f"SELECT unit FROM claims WHERE unit = ANY(%s) AND done = 0 AND (worker IS NULL OR expires <= {_NOW}) "
                f"ORDER BY array_position(%s::text[], unit) LIMIT %s FOR UPDATE SKIP LOCKED",
                (wanted, wanted, limit))]
            if taken:
                conn.execute(f"UPDATE claims SET worker = %s, expires = {_NOW} + %s WHERE unit = ANY(%s)",
                             (worker, lease_seconds, taken))
        return sorted(taken, key=wanted.index)

    def renew(self, worker: str, lease_seconds: float) -> int:
        """Extend every live claim of ``worker`` by ``lease_seconds`` from now; returns how many. Safe from another
        thread (a lease keeper's): there it writes through a connection of the store's pool."""
        db = self._db if threading.get_ident() == self._owner else self._renewer()
        return db.conn.execute(f"UPDATE claims SET expires = {_NOW} + %s WHERE worker = %s AND done = 0",
                               (lease_seconds, worker)).rowcount

    def _renewer(self) -> PostgresDatabase:
        db = getattr(self._renewers, "db", None)
        if db is None:
            db = self._renewers.db = self._db.another()
        return db

    def close_renewer(self) -> None:
        """Give this thread's connection back to the pool (a lease keeper's, when it stops)."""
        db = getattr(self._renewers, "db", None)
        if db is not None:
            db.close()
            self._renewers.db = None

    def finish(self, unit: str, worker: str, cost: Mapping[str, Any] | None, *, done: bool) -> bool:
        """Release ``unit`` in the caller's transaction (see :meth:`..claims.SqliteWorkClaims.finish`)."""
        with self._transaction("finish_claim"):
            row = self._conn.execute("SELECT worker, cost FROM claims WHERE unit = %s FOR UPDATE", (unit,)).fetchone()
            if row is None:
                return False
            held = row[0] == worker
            spent = with_try(row[1], cost)
            if held:
                self._conn.execute(
                    f"UPDATE claims SET worker = NULL, expires = NULL, done = %s, finished_by = %s, "
                    f"finished = CASE WHEN %s THEN {_NOW} END, cost = %s WHERE unit = %s",
                    (int(done), worker if done else None, done, spent, unit))
            else:
                self._conn.execute("UPDATE claims SET cost = %s WHERE unit = %s", (spent, unit))
            return held

    def release(self, units: Iterable[str], worker: str) -> int:
        """Give back ``worker``'s unfinished claims on ``units``; returns how many."""
        return self._conn.execute("UPDATE claims SET worker = NULL, expires = NULL WHERE worker = %s AND done = 0 "
                                  "AND unit = ANY(%s)", (worker, list(units))).rowcount

    def view(self, units: Sequence[str], worker: str) -> JobView:
        """What the job of ``units`` holds now, as ``worker`` sees it (leases against the server's clock)."""
        now = float(self._conn.execute(f"SELECT {_NOW}").fetchone()[0])
        return job_view(self._rows(units), units, worker, now)

    def finished(self, units: Iterable[str]) -> set[str]:
        """Of ``units``, those some worker finished (their results are stored)."""
        return {row[0] for row in self._conn.execute("SELECT unit FROM claims WHERE done = 1 AND unit = ANY(%s)",
                                                     (list(units),))}

    def holders(self, units: Iterable[str]) -> set[str]:
        """The workers holding unfinished claims on ``units``."""
        return {row[0] for row in self._conn.execute(
            "SELECT DISTINCT worker FROM claims WHERE done = 0 AND worker IS NOT NULL AND unit = ANY(%s)",
            (list(units),))}

    def expire(self, worker: str) -> int:
        """End every unfinished claim of ``worker`` now (a worker known dead); returns how many."""
        return self._conn.execute("UPDATE claims SET expires = 0 WHERE worker = %s AND done = 0",
                                  (worker,)).rowcount

    def costs(self, units: Sequence[str]) -> list[dict[str, Any]]:
        """What each try of each unit of ``units`` cost, as recorded with it."""
        return [cost for (kept,) in self._conn.execute(
            "SELECT cost FROM claims WHERE cost IS NOT NULL AND unit = ANY(%s)", (list(dict.fromkeys(units)),))
            for cost in json.loads(kept)]

    def _rows(self, units: Iterable[str]) -> dict[str, tuple[Any, ...]]:
        return {unit: (holder, None if expires is None else float(expires), done, by)
                for unit, holder, expires, done, by in self._conn.execute(
                    "SELECT unit, worker, expires, done, finished_by FROM claims WHERE unit = ANY(%s)",
                    (list(dict.fromkeys(units)),))}
