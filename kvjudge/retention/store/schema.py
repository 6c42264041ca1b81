"""The store's schema: its tables, the migrations that bring an older store up to date, and the projection
tables' current shape.

Schema version in ``PRAGMA user_version``, kvjudge's mark in ``PRAGMA application_id``:

- ``events(lsn, run, kind, payload)`` — append-only; triggers RAISE on UPDATE and DELETE.
- ``blobs(ref, size, body)`` — content-addressed; ``body`` NULL once deleted (the log says why).
- ``blob_tokens(ref, counter, tokens)`` — a count is a fact about immutable bytes: stored once per
  (blob, counter), never recounted.
- ``runs``, ``run_bodies`` and ``run_tokens`` — projections, derived only from the log and the counts (see
  :mod:`.projection`): a run's folded state and the columns a listing shows; where each body is and how often a
  reader of the run sees it; a run's visible tokens per counter, once every body it shows is counted.
- ``judgments(key, payload)`` — the judge's cache (not history, so not events).
- ``claims(unit, …)`` — the units of work of a job several processes share (:mod:`.claims`): who holds each one
  and until when, and what a finished one cost (coordination, not history, so not events).
"""

from __future__ import annotations

import sqlite3

SCHEMA_VERSION = 4
APPLICATION_ID = 0x6B766A64  # "kvjd"

# The projection tables as version 1 created them (part of migration 1: never edited).
_PROJECTION_V1 = """
CREATE TABLE IF NOT EXISTS runs (
    id TEXT PRIMARY KEY, tenant TEXT NOT NULL, state TEXT NOT NULL, reduced INTEGER NOT NULL,
    last_lsn INTEGER NOT NULL, state_json BLOB NOT NULL);
CREATE INDEX IF NOT EXISTS runs_tenant ON runs(tenant, id);
CREATE TABLE IF NOT EXISTS run_bodies (
    run TEXT NOT NULL, ref TEXT NOT NULL, status TEXT NOT NULL, summary_ref TEXT, lsn INTEGER NOT NULL,
    target TEXT, manifest_ref TEXT, PRIMARY KEY (run, ref));
CREATE INDEX IF NOT EXISTS run_bodies_ref ON run_bodies(ref, status);
"""

#: The projection tables now: what a rebuild creates. Columns after version 1's are the ones migration 2 adds,
#: in the same order and with the same defaults, and ``runs_listing`` is migration 3's, so a migrated store and a
#: rebuilt one have one shape.
PROJECTION_SQL = """
CREATE TABLE IF NOT EXISTS runs (
    id TEXT PRIMARY KEY, tenant TEXT NOT NULL, state TEXT NOT NULL, reduced INTEGER NOT NULL,
    last_lsn INTEGER NOT NULL, state_json BLOB NOT NULL,
    agent TEXT NOT NULL DEFAULT '', task TEXT, trial TEXT, grades TEXT NOT NULL DEFAULT '[]',
    branches INTEGER NOT NULL DEFAULT 0, transitions INTEGER NOT NULL DEFAULT 0, bodies INTEGER NOT NULL DEFAULT 0,
    bodies_gone INTEGER NOT NULL DEFAULT 0, bodies_tiered INTEGER NOT NULL DEFAULT 0);
CREATE INDEX IF NOT EXISTS runs_tenant ON runs(tenant, id);
CREATE INDEX IF NOT EXISTS runs_listing ON runs(
    id, tenant, agent, task, trial, state, grades, reduced, branches, transitions, bodies, bodies_gone, bodies_tiered);
CREATE TABLE IF NOT EXISTS run_bodies (
    run TEXT NOT NULL, ref TEXT NOT NULL, status TEXT NOT NULL, summary_ref TEXT, lsn INTEGER NOT NULL,
    target TEXT, manifest_ref TEXT, uses INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (run, ref));
CREATE INDEX IF NOT EXISTS run_bodies_ref ON run_bodies(ref, status);
CREATE TABLE IF NOT EXISTS run_tokens (
    run TEXT NOT NULL, counter TEXT NOT NULL, tokens INTEGER NOT NULL, PRIMARY KEY (run, counter)) WITHOUT ROWID;
"""

#: The projection tables (dropped ones are rebuilt by folding the log again).
PROJECTION_TABLES = frozenset({"runs", "run_bodies", "run_tokens"})

# Migration N brings a store from version N-1 to N. Never edit a published one; add the next.
MIGRATIONS: dict[int, str] = {
    1: """
CREATE TABLE events (
    lsn INTEGER PRIMARY KEY AUTOINCREMENT, run TEXT NOT NULL, kind TEXT NOT NULL, payload TEXT NOT NULL);
CREATE INDEX events_run ON events(run, lsn);
CREATE TRIGGER events_no_update BEFORE UPDATE ON events
    BEGIN SELECT RAISE(ABORT, 'kvjudge events are append-only: UPDATE refused'); END;
CREATE TRIGGER events_no_delete BEFORE DELETE ON events
    BEGIN SELECT RAISE(ABORT, 'kvjudge events are append-only: DELETE refused'); END;
CREATE TABLE blobs (ref TEXT PRIMARY KEY, size INTEGER NOT NULL, body BLOB);
CREATE TABLE blob_tokens (
    ref TEXT NOT NULL, counter TEXT NOT NULL, tokens INTEGER NOT NULL, PRIMARY KEY (ref, counter));
CREATE TABLE judgments (key TEXT PRIMARY KEY, payload TEXT NOT NULL);
""" + _PROJECTION_V1,
    # The listing's columns (a listing reads them instead of decoding every run), how often a reader of each run
    # sees each body, and each run's tokens per counter (a listing reads them instead of summing every count).
    2: """
ALTER TABLE runs ADD COLUMN agent TEXT NOT NULL DEFAULT '';
ALTER TABLE runs ADD COLUMN task TEXT;
ALTER TABLE runs ADD COLUMN trial TEXT;
ALTER TABLE runs ADD COLUMN grades TEXT NOT NULL DEFAULT '[]';
ALTER TABLE runs ADD COLUMN branches INTEGER NOT NULL DEFAULT 0;
ALTER TABLE runs ADD COLUMN transitions INTEGER NOT NULL DEFAULT 0;
ALTER TABLE runs ADD COLUMN bodies INTEGER NOT NULL DEFAULT 0;
ALTER TABLE runs ADD COLUMN bodies_gone INTEGER NOT NULL DEFAULT 0;
ALTER TABLE runs ADD COLUMN bodies_tiered INTEGER NOT NULL DEFAULT 0;
ALTER TABLE run_bodies ADD COLUMN uses INTEGER NOT NULL DEFAULT 0;
CREATE TABLE run_tokens (
    run TEXT NOT NULL, counter TEXT NOT NULL, tokens INTEGER NOT NULL, PRIMARY KEY (run, counter)) WITHOUT ROWID;
""",
    # The listing's columns as a covering index: a listing reads them there, never walking past a run's folded
    # state (tens of KB of overflow pages a run, stored before them in the row).
    3: """
CREATE INDEX runs_listing ON runs(
    id, tenant, agent, task, trial, state, grades, reduced, branches, transitions, bodies, bodies_gone, bodies_tiered);
""",
    # Claims on units of work (a pair's verdict, a run's scores, reduction or tiering), so several processes share
    # one job: a unit is held by one worker until its lease expires; a finished one keeps what its calls cost.
    4: """
CREATE TABLE claims (
    unit TEXT PRIMARY KEY, kind TEXT NOT NULL, worker TEXT, expires REAL, done INTEGER NOT NULL DEFAULT 0,
    finished_by TEXT, finished REAL, cost TEXT);
CREATE INDEX claims_worker ON claims(worker, done);
""",
}

#: Migrations that change only the projection tables: where those were dropped they are skipped (the projection
#: is folded afresh, its tables created as :data:`PROJECTION_SQL` has them).
PROJECTION_MIGRATIONS = frozenset({2, 3})
#: Of those, the ones that add columns: after them every run is projected again from its stored state.
REPROJECTING_MIGRATIONS = frozenset({2})


def statements(script: str) -> list[str]:
    """Split a schema script into statements (triggers keep their inner ``;``)."""
    found: list[str] = []
    buffer = ""
    for line in script.strip().splitlines():
        buffer += line + "\n"
        if sqlite3.complete_statement(buffer):
            found.append(buffer.strip())
            buffer = ""
    if buffer.strip():
        found.append(buffer.strip())
    return found
