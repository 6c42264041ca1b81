"""Claims on units of work on SQLite (the ``claims`` table): several processes on one host share one job.

A unit (a pair's verdict, a run's scores, a run's reduction or tiering) is named by the key of its result. A worker
claims a unit before it sends the unit's calls: the row names the worker and the lease's expiry. Another worker
takes only a unit with no row, a row no one holds, or a row whose lease has expired. ``BEGIN IMMEDIATE`` makes each
claim a critical section for every process on the file (the database's write lock), as ``FOR UPDATE SKIP LOCKED``
does on a server. A finished unit is marked in the caller's transaction, the one that writes its result.

Lease times are this host's clock (``time.time()``): every process sharing an SQLite file runs on one host. A
claim, a renewal and a release are not waited for on disk (they survive their process's crash, which is what another
process must see; a power cut ends every worker with them); a unit's finish commits with its result, durably.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from kvjudge.retention.store.claim_rows import job_view, with_try
from kvjudge.retention.store.database import REFS_PER_QUERY, Database
from kvjudge.retention.store.interfaces import JobView


class SqliteWorkClaims:
    """:class:`~kvjudge.retention.store.interfaces.WorkClaims` on the ``claims`` table of one store file."""

    def __init__(self, db: Database) -> None:
        self._db = db
        self._conn = db.conn
        self._transaction = db.transaction
        self._owner = threading.get_ident()
        self._renewers = threading.local()

    def available(self) -> bool:
        """True when the store has the claims table (schema 4 on)."""
        return self._conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'claims'").fetchone() is not None

    def claim(self, units: Sequence[str], kind: str, worker: str, lease_seconds: float, *, limit: int = 1,
              skip: Iterable[str] = ()) -> list[str]:
        """Take up to ``limit`` of ``units`` (in their order) that are free: no row, held by no one, or held under
        a lease that has expired; never one done, nor one in ``skip``. Returns the units taken."""
        passed = set(skip)
        taken: list[str] = []
        with self._transaction("claim", durable=False):
            now = time.time()
            rows = self._rows(units)
            for unit in units:
                if len(taken) >= limit:
                    break
                if unit in passed or unit in taken:
                    continue
                row = rows.get(unit)
                if row is not None and (row[2] or (row[0] is not None and row[1] is not None and row[1] > now)):
                    continue
                self._conn.execute(
                    "INSERT INTO claims(unit, kind, worker, expires) VALUES (?, ?, ?, ?) "
                    "ON CONFLICT(unit) DO UPDATE SET worker = excluded.worker, expires = excluded.expires",
                    (unit, kind, worker, now + lease_seconds))
                taken.append(unit)
        return taken

    def renew(self, worker: str, lease_seconds: float) -> int:
        """Extend every live claim of ``worker`` by ``lease_seconds`` from now; returns how many. Safe from another
        thread (a lease keeper's): there it writes through a connection of its own."""
        db = self._db if threading.get_ident() == self._owner else self._renewer()
        with db.transaction("renew", durable=False):
            return db.conn.execute("UPDATE claims SET expires = ? WHERE worker = ? AND done = 0",
                                   (time.time() + lease_seconds, worker)).rowcount

    def _renewer(self) -> Database:
        db = getattr(self._renewers, "db", None)
        if db is None:
            db = self._renewers.db = self._db.another()
        return db

    def close_renewer(self) -> None:
        """Close this thread's own connection (a lease keeper's, when it stops)."""
        db = getattr(self._renewers, "db", None)
        if db is not None:
            db.close()
            self._renewers.db = None

    def finish(self, unit: str, worker: str, cost: Mapping[str, Any] | None, *, done: bool) -> bool:
        """Release ``unit``, in the caller's transaction (the one writing its result): ``done`` marks it finished
        (its result is stored), else it is free again (it failed here; another worker may try it). ``cost``: what
        its calls cost, kept with the unit beside what earlier tries cost. False when the claim was no longer
        ``worker``'s (its lease expired and another took it)."""
        with self._transaction("finish_claim"):
            row = self._conn.execute("SELECT worker, cost FROM claims WHERE unit = ?", (unit,)).fetchone()
            if row is None:
                return False
            held = row[0] == worker
            spent = with_try(row[1], cost)
            if held:
                self._conn.execute(
                    "UPDATE claims SET worker = NULL, expires = NULL, done = ?, finished_by = ?, finished = ?, "
                    "cost = ? WHERE unit = ?", (int(done), worker if done else None, time.time() if done else None,
                                                spent, unit))
            else:
                self._conn.execute("UPDATE claims SET cost = ? WHERE unit = ?", (spent, unit))
            return held

    def release(self, units: Iterable[str], worker: str) -> int:
        """Give back ``worker``'s unfinished claims on ``units`` (a worker stopping early); returns how many."""
        wanted = list(units)
        released = 0
        with self._transaction("release_claims", durable=False):
            for start in range(0, len(wanted), REFS_PER_QUERY):
                chunk = wanted[start:start + REFS_PER_QUERY]
                marks = ",".join("?" * len(chunk))
                released += self._conn.execute(
                    f"UPDATE claims SET worker = NULL, expires = NULL WHERE worker = ? AND done = 0 "
                    f"AND unit IN ({marks})", (worker, *chunk)).rowcount
        return released

    def view(self, units: Sequence[str], worker: str) -> JobView:
        """What the job of ``units`` holds now, as ``worker`` sees it."""
        return job_view(self._rows(units, finished_by=True), units, worker, time.time())

    def finished(self, units: Iterable[str]) -> set[str]:
        """Of ``units``, those some worker finished (their results are stored)."""
        return {unit for unit, row in self._rows(units).items() if row[2]}

    def holders(self, units: Iterable[str]) -> set[str]:
        """The workers holding unfinished claims on ``units``."""
        return {row[0] for row in self._rows(units).values() if row[0] is not None and not row[2]}

    def expire(self, worker: str) -> int:
        """End every unfinished claim of ``worker`` now (a worker known dead); returns how many."""
        with self._transaction("expire_claims", durable=False):
            return self._conn.execute("UPDATE claims SET expires = 0 WHERE worker = ? AND done = 0",
                                      (worker,)).rowcount

    def costs(self, units: Sequence[str]) -> list[dict[str, Any]]:
        """What each try of each unit of ``units`` cost, as recorded with it (a unit never tried has none)."""
        found: list[dict[str, Any]] = []
        wanted = list(dict.fromkeys(units))
        for start in range(0, len(wanted), REFS_PER_QUERY):
            chunk = wanted[start:start + REFS_PER_QUERY]
            marks = ",".join("?" * len(chunk))
            for (cost,) in self._conn.execute(
                    f"SELECT cost FROM claims WHERE cost IS NOT NULL AND unit IN ({marks})", chunk):
                found.extend(json.loads(cost))
        return found

    def _rows(self, units: Iterable[str], *, finished_by: bool = False) -> dict[str, tuple[Any, ...]]:
        wanted = list(dict.fromkeys(units))
        columns = "worker, expires, done, finished_by" if finished_by else "worker, expires, done"
        found: dict[str, tuple[Any, ...]] = {}
        for start in range(0, len(wanted), REFS_PER_QUERY):
            chunk = wanted[start:start + REFS_PER_QUERY]
            marks = ",".join("?" * len(chunk))
            for unit, *row in self._conn.execute(f"SELECT unit, {columns} FROM claims WHERE unit IN ({marks})",
                                                 chunk):
                found[unit] = tuple(row)
        return found

