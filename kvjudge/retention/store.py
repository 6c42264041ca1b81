"""The run store: one SQLite file holding the append-only event log, the blobs, and derived projections.

Tables (schema version in ``PRAGMA user_version``, kvjudge's mark in ``PRAGMA application_id``):

- ``events(lsn, run, kind, payload)`` — append-only; triggers RAISE on UPDATE and DELETE.
- ``blobs(ref, size, body)`` — content-addressed; ``body`` NULL once deleted (the log says why).
- ``blob_tokens(ref, counter, tokens)`` — a count is a fact about immutable bytes: stored once per
  (blob, counter), never recounted.
- ``runs`` and ``run_bodies`` — projections, derived only by folding the log; dropped tables are rebuilt
  on open, and :meth:`Store.rebuild_projection` re-folds everything from LSN 0.
- ``judgments(key, payload)`` — the judge's cache (not history, so not events).

Every write is an explicit ``BEGIN IMMEDIATE`` transaction (WAL, ``synchronous=FULL``); each has a
fault point ``<label>.txn`` just before COMMIT (see :mod:`kvjudge.retention.faults`).
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvjudge.settings import data_dir
from kvjudge.errors import IntegrityError, StoreError, UsageError
from kvjudge.retention import events as ev
from kvjudge.retention.blobs import BlobStore, short
from kvjudge.retention.events import canonical_json, event_from
from kvjudge.retention.faults import fault_point
from kvjudge.retention.lifecycle import check_state_name, check_transition
from kvjudge.retention.state import DROPPED, LOCAL, REDUCED, TIERED, BodyLocation, RunFolder, RunState, fold

if TYPE_CHECKING:
    from kvjudge.retention.ingest import IngestReport, ParsedRun

SCHEMA_VERSION = 1
APPLICATION_ID = 0x6B766A64  # "kvjd"
STORE_FILENAME = "store.sqlite"

#: A reader for bodies that are not local (tiering plugs the cold store in): ref → bytes or None.
FallbackReader = Callable[[str], "bytes | None"]

_PROJECTION_SQL = """
CREATE TABLE IF NOT EXISTS runs (
    id TEXT PRIMARY KEY, tenant TEXT NOT NULL, state TEXT NOT NULL, reduced INTEGER NOT NULL,
    last_lsn INTEGER NOT NULL, state_json BLOB NOT NULL);
CREATE INDEX IF NOT EXISTS runs_tenant ON runs(tenant, id);
CREATE TABLE IF NOT EXISTS run_bodies (
    run TEXT NOT NULL, ref TEXT NOT NULL, status TEXT NOT NULL, summary_ref TEXT, lsn INTEGER NOT NULL,
    target TEXT, manifest_ref TEXT, PRIMARY KEY (run, ref));
CREATE INDEX IF NOT EXISTS run_bodies_ref ON run_bodies(ref, status);
"""

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
""" + _PROJECTION_SQL,
}


@dataclass(frozen=True)
class Explanation:
    """What the log says about a ref: whether its body is here and, if not, which event says why.

    ``status`` is ``local`` when any run still reads the body here, else the status the log gives
    (``reduced``, ``dropped``, ``tiered``), or ``unknown`` when no run names the ref.
    """

    ref: str
    body_present: bool
    status: str
    summary_ref: str | None
    run: str | None
    lsn: int | None
    event: str | None  # kind of the explaining event ("Reduced", "Dropped", "Tiered", …)
    target: str | None
    locations: tuple[tuple[str, BodyLocation], ...]

    @property
    def explained(self) -> bool:
        """True when the body is here or the log says where it went."""
        return self.body_present or self.status in (REDUCED, DROPPED, TIERED)

    def to_dict(self) -> dict[str, Any]:
        return {"ref": self.ref, "body_present": self.body_present, "status": self.status,
                "summary_ref": self.summary_ref, "run": self.run, "lsn": self.lsn, "event": self.event,
                "target": self.target, "explained": self.explained}


def default_store_path() -> Path:
    return data_dir() / STORE_FILENAME


class Store:
    """A kvjudge run store. Open with :meth:`Store.open`; use as a context manager."""

    def __init__(self, conn: sqlite3.Connection, path: Path, fallback: FallbackReader | None = None) -> None:
        self._conn = conn
        self.path = path
        self.blobs = BlobStore(conn)
        #: Reader for bodies that are not local (e.g. the cold store); set by tiering.
        self.fallback = fallback
        self._in_txn = False

    # ----------------------------------------------------------------- opening
    @classmethod
    def open(cls, path: str | os.PathLike[str] | None = None, *, fallback: FallbackReader | None = None) -> Store:
        """Open (creating when absent) the store at ``path`` (None: ``data_dir()/store.sqlite``)."""
        target = Path(path).expanduser() if path is not None else default_store_path()
        if target.is_dir():
            raise StoreError(f"{target} is a directory; --store takes the path of a store file")
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            conn = sqlite3.connect(str(target), isolation_level=None, timeout=30.0)
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open store {target} ({exc}); check the path and its permissions") from exc
        try:
            store = cls(conn, target, fallback)
            store._prepare()
        except sqlite3.DatabaseError as exc:
            conn.close()
            raise StoreError(f"{target} is not a kvjudge store (SQLite says: {exc}); pass the right --store") from exc
        except BaseException:
            conn.close()
            raise
        return store

    def _prepare(self) -> None:
        conn = self._conn
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
        if version < SCHEMA_VERSION:
            self._migrate(version)
        elif not {"runs", "run_bodies"} <= tables:
            # Projections are derived: when someone dropped them, fold them back from the log.
            self.rebuild_projection()

    def _migrate(self, version: int) -> None:
        with self.transaction("migrate"):
            for target in range(version + 1, SCHEMA_VERSION + 1):
                for statement in _statements(MIGRATIONS[target]):
                    self._conn.execute(statement)
                self._conn.execute(f"PRAGMA user_version = {int(target)}")
            self._conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def connection(self) -> sqlite3.Connection:
        """The underlying connection (for tiering and tests; write only inside :meth:`transaction`)."""
        return self._conn

    def schema_version(self) -> int:
        return int(self._conn.execute("PRAGMA user_version").fetchone()[0])

    # ------------------------------------------------------------- transactions
    @contextlib.contextmanager
    def transaction(self, label: str) -> Iterator[sqlite3.Connection]:
        """``BEGIN IMMEDIATE`` … ``COMMIT`` (ROLLBACK on error); fault point ``<label>.txn`` before COMMIT.

        Nested calls join the outer transaction.
        """
        if self._in_txn:
            yield self._conn
            return
        self._conn.execute("BEGIN IMMEDIATE")
        self._in_txn = True
        try:
            yield self._conn
            fault_point(f"{label}.txn")
            self._conn.execute("COMMIT")
        except BaseException:
            if self._conn.in_transaction:
                self._conn.execute("ROLLBACK")
            raise
        finally:
            self._in_txn = False

    # --------------------------------------------------------------------- blobs
    def put_blob(self, body: bytes, *, label: str = "put_blob") -> str:
        """Put one body in its own transaction; returns its ref."""
        with self.transaction(label):
            return self.blobs.put(body)

    def text(self, ref: str) -> str | None:
        """The body of ``ref`` as text: local, else through :attr:`fallback` (cold store), else None."""
        body = self.blobs.get(ref)
        if body is None and self.fallback is not None:
            body = self.fallback(ref)
        return None if body is None else body.decode("utf-8")

    def release_bodies(self, refs: Iterable[str], *, label: str = "delete_body") -> list[str]:
        """Delete the local bodies of ``refs`` that no run still reads locally; returns those deleted.

        A body shared by two runs stays as long as the log of either still says it is local there.
        Call only after the event explaining the loss (Reduced, Dropped, Tiered) has committed.
        """
        deleted: list[str] = []
        with self.transaction(label):
            for ref in dict.fromkeys(refs):
                if not self.read_locally(ref) and self.blobs.delete_body(ref):
                    deleted.append(ref)
        return deleted

    def read_locally(self, ref: str) -> bool:
        """True while the log of some run still says ``ref`` is local there (so its body must stay)."""
        return self._conn.execute(
            "SELECT 1 FROM run_bodies WHERE ref = ? AND status = ? LIMIT 1", (ref, LOCAL)).fetchone() is not None

    # ------------------------------------------------------------ token counts
    def cached_counts(self, refs: Iterable[str], counter: str) -> dict[str, int]:
        """Stored counts of ``refs`` under ``counter`` (refs never counted are absent)."""
        wanted = list(dict.fromkeys(refs))
        found: dict[str, int] = {}
        for start in range(0, len(wanted), 500):
            chunk = wanted[start:start + 500]
            marks = ",".join("?" * len(chunk))
            for ref, tokens in self._conn.execute(
                    f"SELECT ref, tokens FROM blob_tokens WHERE counter = ? AND ref IN ({marks})", (counter, *chunk)):
                found[ref] = int(tokens)
        return found

    def put_counts(self, counter: str, counts: Mapping[str, int], *, label: str = "put_counts") -> None:
        """Record counts (first write wins: a count of immutable bytes never changes)."""
        if not counts:
            return
        with self.transaction(label):
            self._conn.executemany("INSERT OR IGNORE INTO blob_tokens(ref, counter, tokens) VALUES (?, ?, ?)",
                                   [(ref, counter, int(n)) for ref, n in counts.items()])

    # --------------------------------------------------------------------- log
    def append(self, run_id: str, event: ev.Event, *, label: str = "append") -> int:
        """Append one event in its own transaction (checked against the run's state); returns its LSN."""
        return self.append_many(run_id, [event], label=label)[0]

    def append_many(self, run_id: str, events: Sequence[ev.Event], *, label: str = "append") -> list[int]:
        """Append events of one run atomically, each checked against the state the ones before it left."""
        with self.transaction(label):
            current = self._projected(run_id)
            folder = RunFolder.thaw(current) if current is not None else None
            # AUTOINCREMENT gives each new row one more than the largest LSN the table ever had, and this
            # transaction holds the write lock: the LSNs are known before the rows go in, in one executemany.
            first = self._next_lsn()
            lsns = list(range(first, first + len(events)))
            previous: ev.Event | None = None
            for lsn, event in zip(lsns, events):
                if event.run != run_id:
                    raise UsageError(f"event for run {event.run!r} appended to run {run_id!r}")
                self._check_event(run_id, folder, event, after_grade=isinstance(previous, ev.GradeRecorded))
                previous = event
                if folder is None:
                    folder = RunFolder(id=run_id)
                folder.apply(lsn, event)
            self._conn.executemany("INSERT INTO events(run, kind, payload) VALUES (?, ?, ?)",
                                   [(run_id, event.kind, event.to_json()) for event in events])
            if lsns and self._next_lsn() != lsns[-1] + 1:
                raise IntegrityError(f"the log of {self.path} assigned unexpected LSNs; nothing was appended")
            if folder is not None and lsns:
                self._project(folder.freeze(), lsns[-1])
        return lsns

    def _next_lsn(self) -> int:
        row = self._conn.execute(
            "SELECT max(coalesce((SELECT seq FROM sqlite_sequence WHERE name = 'events'), 0), "
            "coalesce((SELECT max(lsn) FROM events), 0))").fetchone()
        return int(row[0]) + 1

    def _check_event(self, run_id: str, folder: RunFolder | None, event: ev.Event, *, after_grade: bool) -> None:
        if isinstance(event, ev.RunStarted):
            if folder is not None:
                raise StoreError(f"run {run_id} already exists in the store")
            return
        if folder is None:
            raise StoreError(f"no run {run_id!r} in the store; list runs with `kvjudge runs`")
        if isinstance(event, ev.StateChanged):
            check_transition(run_id, folder.state, event.state, after_grade=after_grade)
        elif isinstance(event, ev.GradeRecorded):
            missing = [grade for grade in event.replaces or () if grade not in folder.grades]
            if missing:
                raise StoreError(f"run {run_id}: a grade replaces {canonical_json(missing[0])}, which the run does "
                                 f"not hold")
        elif isinstance(event, ev.BranchOpened):
            if event.branch in folder.branches:
                raise StoreError(f"run {run_id} already has a branch {event.branch!r}")
        elif isinstance(event, ev.TransitionRecorded):
            if event.branch not in folder.branches:
                raise StoreError(f"run {run_id} has no branch {event.branch!r}")
        elif isinstance(event, ev.Reduced):
            location = folder.bodies.get(event.original)
            if location is None or location.status != LOCAL:
                status = location.status if location else "not named by the run"
                raise StoreError(f"run {run_id}: cannot reduce {short(event.original)}, it is {status}")
            self._require_body(event.summary, "Reduced")
        elif isinstance(event, ev.BranchReduced):
            entry = folder.branches.get(event.branch)
            if entry is None or entry["branch"].status != "dead":
                raise StoreError(f"run {run_id}: only a dead branch can be read as one extract, not {event.branch!r}")
            self._require_body(event.summary, "BranchReduced")
        elif isinstance(event, ev.Dropped):
            location = folder.bodies.get(event.original)
            if location is None or location.status == DROPPED:
                status = location.status if location else "not named by the run"
                raise StoreError(f"run {run_id}: cannot drop {short(event.original)}, it is {status}")

    def _require_body(self, ref: str, kind: str) -> None:
        # The summary must be durable before the event that points readers at it.
        if not self.blobs.has_body(ref):
            raise IntegrityError(f"{kind} names summary {short(ref)} whose body is not stored; put it first")

    def iter_events(self, run_id: str | None = None) -> Iterator[tuple[int, ev.Event]]:
        """``(lsn, event)`` of one run (or all runs, grouped by run), in LSN order, streamed."""
        if run_id is not None:
            query = self._conn.execute("SELECT lsn, kind, payload FROM events WHERE run = ? ORDER BY lsn", (run_id,))
            for lsn, kind, payload in query:
                yield int(lsn), event_from(kind, payload)
            return
        for run in self._all_logged_runs():
            yield from self.iter_events(run)

    def _all_logged_runs(self) -> list[str]:
        return [row[0] for row in self._conn.execute("SELECT DISTINCT run FROM events ORDER BY run")]

    def event_kind(self, lsn: int) -> str | None:
        row = self._conn.execute("SELECT kind FROM events WHERE lsn = ?", (lsn,)).fetchone()
        return row[0] if row else None

    # ----------------------------------------------------------- projections
    def _projected(self, run_id: str) -> RunState | None:
        if not _storable(run_id):
            return None
        row = self._conn.execute("SELECT state_json FROM runs WHERE id = ?", (run_id,)).fetchone()
        return None if row is None else RunState.from_bytes(row[0])

    def _project(self, state: RunState, last_lsn: int) -> None:
        self._conn.execute(
            "INSERT OR REPLACE INTO runs(id, tenant, state, reduced, last_lsn, state_json) VALUES (?, ?, ?, ?, ?, ?)",
            (state.id, state.tenant, state.state, int(state.reduced), last_lsn, state.canonical_bytes()))
        self._conn.execute("DELETE FROM run_bodies WHERE run = ?", (state.id,))
        self._conn.executemany(
            "INSERT INTO run_bodies(run, ref, status, summary_ref, lsn, target, manifest_ref) VALUES (?, ?, ?, ?, ?, ?, ?)",
            [(state.id, loc.ref, loc.status, loc.summary_ref, loc.lsn, loc.target, loc.manifest_ref)
             for loc in state.bodies.values()])

    def refold(self, run_id: str) -> RunState:
        """Fold one run from LSN 0 straight from the log (ignoring projections)."""
        states = fold(self.iter_events(run_id))
        if run_id not in states:
            raise StoreError(f"no run {run_id!r} in the store; list runs with `kvjudge runs`")
        return states[run_id]

    def rebuild_projection(self) -> int:
        """Drop and re-create the projection tables, re-folding every run from LSN 0. Returns runs folded."""
        with self.transaction("rebuild"):
            self._conn.execute("DROP TABLE IF EXISTS runs")
            self._conn.execute("DROP TABLE IF EXISTS run_bodies")
            for statement in _statements(_PROJECTION_SQL):
                self._conn.execute(statement)
            count = 0
            for run_id in self._all_logged_runs():
                state = self.refold(run_id)
                last = self._conn.execute("SELECT MAX(lsn) FROM events WHERE run = ?", (run_id,)).fetchone()[0]
                self._project(state, int(last))
                count += 1
        return count

    def projected_bytes(self, run_id: str) -> bytes | None:
        """The projection's canonical bytes for ``run_id`` (what verify compares a re-fold against)."""
        row = self._conn.execute("SELECT state_json FROM runs WHERE id = ?", (run_id,)).fetchone()
        return None if row is None else bytes(row[0])

    # ------------------------------------------------------------------ runs
    def run(self, run_id: str) -> RunState:
        """The folded state of ``run_id``; StoreError when the store has no such run."""
        state = self._projected(run_id)
        if state is None:
            raise StoreError(f"no run {run_id!r} in the store {self.path}; list runs with `kvjudge runs`")
        return state

    def has_run(self, run_id: str) -> bool:
        if not _storable(run_id):
            return False
        return self._conn.execute("SELECT 1 FROM runs WHERE id = ?", (run_id,)).fetchone() is not None

    def run_ids(self, tenant: str | None = None, *, task: str | None = None, state: str | None = None) -> list[str]:
        """Run ids, sorted; only those of ``tenant``, on ``task`` (its id) and in lifecycle ``state`` when given
        (read in SQL from the projection, no run decoded)."""
        where, values = [], []
        for column, value in (("tenant", tenant), ("json_extract(CAST(state_json AS TEXT), '$.task_id')", task),
                              ("state", state)):
            if value is not None:
                if not _storable(value):
                    return []
                where.append(f"{column} = ?")
                values.append(value)
        clause = f" WHERE {' AND '.join(where)}" if where else ""
        return [row[0] for row in self._conn.execute(f"SELECT id FROM runs{clause} ORDER BY id", values)]

    def run_ids_with_tier_status(self, status: str) -> list[str]:
        """Run ids whose projected state has ``tier.status == status``, sorted (read in SQL, no run decoded)."""
        return [row[0] for row in self._conn.execute(
            "SELECT id FROM runs WHERE json_extract(CAST(state_json AS TEXT), '$.tier.status') = ? ORDER BY id",
            (status,))]

    def iter_runs(self, tenant: str | None = None, **filters: str | None) -> Iterator[RunState]:
        """Folded states one at a time (never the whole store in memory); ``filters`` as :meth:`run_ids`."""
        for run_id in self.run_ids(tenant, **filters):
            yield self.run(run_id)

    def mark(self, run_id: str, state: str) -> RunState:
        """Append a lifecycle step; RunStateError when it is not a legal one."""
        new = check_state_name(state)
        self.append(run_id, ev.StateChanged(run=run_id, state=new), label="mark")
        return self.run(run_id)

    def explain(self, ref: str) -> Explanation:
        """Whether ``ref``'s body is here, and if not, which event of which run says where it went."""
        rows = self._conn.execute(
            "SELECT run, status, summary_ref, lsn, target, manifest_ref FROM run_bodies WHERE ref = ? ORDER BY lsn, run",
            (ref,)).fetchall()
        locations = tuple((run, BodyLocation(ref=ref, status=status, summary_ref=summary, lsn=int(lsn), target=target,
                                             manifest_ref=manifest))
                          for run, status, summary, lsn, target, manifest in rows)
        present = self.blobs.has_body(ref)
        if not locations:
            return Explanation(ref, present, "unknown", None, None, None, None, None, ())
        local = [item for item in locations if item[1].status == LOCAL]
        # A body any run still reads here is "local"; otherwise the latest fact about it explains it.
        run, loc = local[0] if local else locations[-1]
        kind = None if loc.status == LOCAL else self.event_kind(loc.lsn)
        return Explanation(ref=ref, body_present=present, status=loc.status, summary_ref=loc.summary_ref, run=run,
                           lsn=loc.lsn, event=kind, target=loc.target, locations=locations)

    # ---------------------------------------------------------------- ingest
    def ingest(self, paths: Iterable[str | os.PathLike[str]], **options: Any) -> IngestReport:
        """Import run files and directories; see :func:`kvjudge.retention.ingest.ingest_sources` for ``options``
        (``fmt``, ``tenant``, ``agent``, ``results``, ``skip_bad``, ``repair_text``, ``progress``).

        Each file is read once and stored whole or not at all: a malformed document raises IngestError naming the
        file, the line and the JSON path, and nothing of the open batch is written (batches committed before it
        stay, the message says how many runs). Runs already stored with the same content count as already present.
        """
        from kvjudge.retention.ingest import ingest_paths

        return ingest_paths(self, paths, **options)

    def ingest_file(self, path: str | os.PathLike[str], tenant: str | None = None, fmt: str | None = None,
                    progress: Callable[[int, str], None] | None = None, *, repair_text: bool = False) -> list[str]:
        """Import one file (native or OpenAI JSONL, or a trajectory); returns its run ids, in order — imported
        now or already present with the same content. Text that is not Unicode (lone surrogates) is malformed,
        unless ``repair_text``: then it is stored as U+FFFD and noted."""
        return self.ingest([path], tenant=tenant, fmt=fmt or "auto", progress=progress, repair_text=repair_text).runs

    def write_parsed(self, run: ParsedRun) -> int:
        """Write one :class:`~kvjudge.retention.ingest.ParsedRun` (bodies, then events) in one transaction
        (joining the caller's). Returns the bytes of bodies it stored (the others were stored already)."""
        if run.content_hash is None:
            run.settle(None)
        with self.transaction("ingest"):
            stored = self.blobs.put_hashed(run.bodies.items())
            self.append_many(run.run_id, run.events)
        return stored

    # ------------------------------------------------------------- judgments
    def get_judgment(self, key: str) -> dict[str, Any] | None:
        """A cached judgment payload, or None."""
        row = self._conn.execute("SELECT payload FROM judgments WHERE key = ?", (key,)).fetchone()
        return None if row is None else json.loads(row[0])

    def put_judgment(self, key: str, payload: dict[str, Any]) -> None:
        """Cache a judgment payload under ``key`` (replaces an older one: a cache, not history)."""
        with self.transaction("put_judgment"):
            self._conn.execute("INSERT OR REPLACE INTO judgments(key, payload) VALUES (?, ?)",
                               (key, canonical_json(payload)))

    @contextlib.contextmanager
    def savepoint(self, name: str) -> Iterator[None]:
        """A SAVEPOINT inside the open :meth:`transaction`: released when the block ends, rolled back to when it
        raises (the rest of the transaction stays), so one part of a batch can fail alone."""
        if not self._in_txn:
            raise UsageError("a savepoint needs an open transaction (Store.transaction)")
        self._conn.execute(f"SAVEPOINT {name}")
        try:
            yield
        except BaseException:
            self._conn.execute(f"ROLLBACK TO {name}")
            self._conn.execute(f"RELEASE {name}")
            raise
        self._conn.execute(f"RELEASE {name}")


def _storable(name: str) -> bool:
    """False for a name SQLite cannot hold (not valid Unicode, e.g. a stray byte on a command line, which
    Python hands over as a lone surrogate): it names no run, rather than raising UnicodeEncodeError."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _statements(script: str) -> list[str]:
    """Split a schema script into statements (triggers keep their inner ``;``)."""
    statements: list[str] = []
    buffer = ""
    for line in script.strip().splitlines():
        buffer += line + "\n"
        if sqlite3.complete_statement(buffer):
            statements.append(buffer.strip())
            buffer = ""
    if buffer.strip():
        statements.append(buffer.strip())
    return statements
