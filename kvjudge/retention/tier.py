"""Tiering: move the bodies of terminal runs to a cold store — moved, not copied; idempotent; crash-proof.

The move, as events (seed 002 step 6; every step is durable before the next starts):

1. only terminal runs (graded / ungraded / archived) are eligible; anything else is a RunStateError;
2. ``TierStarted{target, manifest_ref}`` is appended — the log now says a move is under way, and to where.
   The manifest (run, event range, every ref with its sha256 and size) is a pure function of the log before
   that event and the blob sizes, so it is rebuilt from the log whenever needed and never stored locally;
3. every local body of the run is uploaded (content-addressed keys: a retry rewrites identical bytes),
   then the manifest, last and conditionally — its presence is the remote's commit;
4. what the remote holds is read back and checked (sizes, and the remote's own SHA-256 where it keeps
   one; a full re-hash with ``verify_remote``);
5. ``Tiered{target, manifest_ref, refs}`` is appended — the local record that the remote committed;
6. only then are the local bodies deleted, in one transaction.

A crash anywhere leaves one of three logs, and :func:`recover` (run at the start of every ``tier`` and
``verify``) finishes each: no tier events → nothing happened locally (remote objects, if any, are
identical re-uploadable copies); ``TierStarted`` without ``Tiered`` → redo steps 3–6 for the recorded
manifest, skipping objects the remote already holds; ``Tiered`` with bodies still here → step 6. A crash
therefore leaves at most a duplicate (remote and local), never a loss.

Reading a tiered body goes through :class:`ColdReader`, the store's fallback reader
(:func:`fallback_reader`); :func:`rehydrate_run` brings bodies back as a ``Rehydrated`` fact.
:func:`verify_checks` recovers, then gives ``kvjudge verify`` the check that every tiered ref is at its target.
"""

from __future__ import annotations

import concurrent.futures
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from kvjudge.config import Config, data_dir
from kvjudge.errors import ColdStoreError, IntegrityError, RunStateError, StoreError
from kvjudge.retention import events as ev
from kvjudge.retention.blobs import ref_of, short
from kvjudge.retention.cold import ColdStore, blob_key, manifest_key, open_cold_store
from kvjudge.retention.events import canonical_json
from kvjudge.retention.faults import fault_point
from kvjudge.retention.lifecycle import REDUCIBLE, is_reducible
from kvjudge.retention.state import LOCAL, TIERED, RunState, fold
from kvjudge.retention.store import Store
from kvjudge.retention.verify import Check, Violation

MANIFEST_FORMAT = "kvjudge-tier-manifest/1"

#: Every fault point of tiering, in the order a move meets them (tests kill a real process at each).
TIER_POINTS = (
    "tier_start.txn",               # inside the transaction that appends TierStarted
    "tier.after_started",           # TierStarted committed, nothing uploaded
    "tier.blob_response_lost",      # a blob PUT applied remotely, its acknowledgement never processed
    "tier.after_blobs",             # every blob uploaded, manifest not yet written
    "tier.manifest_response_lost",  # the manifest PUT applied remotely, its acknowledgement never processed
    "tier.after_verify",            # remote read back and checked, Tiered not yet appended
    "tiered.txn",                   # inside the transaction that appends Tiered
    "tier.after_tiered",            # Tiered committed, local bodies still here
    "tier_delete.txn",              # inside the transaction that deletes the local bodies
)
REHYDRATE_POINTS = ("rehydrate.after_bodies", "rehydrated.txn")

ProgressFn = Callable[[int], None]
_MAX_IN_FLIGHT_BYTES = 64 * 1024 * 1024


# --------------------------------------------------------------------------------------------------
# Targets


def default_target() -> str:
    """The built-in cold store: a ``cold`` directory next to the default store."""
    return "file://" + str(data_dir() / "cold")


def resolve_target(config: Config, to: str | None = None) -> str:
    """The target URL: ``to`` (``--to``), else ``[retention] cold``, else :func:`default_target`."""
    return to or config.get("retention.cold", str, None) or default_target()


def resolve_endpoint(config: Config, endpoint_url: str | None = None) -> str | None:
    """``--endpoint-url``, else ``[retention] endpoint_url``, else None (boto3 reads ``AWS_ENDPOINT_URL``)."""
    return endpoint_url or config.get("retention.endpoint_url", str, None)


class ColdStores:
    """Opens each target URL once (an S3 client is not free) and remembers it.

    The built-in default directory may be created on first use; any other directory must exist (a missing
    one is more likely an unmounted disk than a wish for a new directory).
    """

    def __init__(self, endpoint_url: str | None = None) -> None:
        self.endpoint_url = endpoint_url
        self._open: dict[str, ColdStore] = {}

    def get(self, target: str) -> ColdStore:
        store = self._open.get(target)
        if store is None:
            create = target == default_target()
            store = open_cold_store(target, endpoint_url=self.endpoint_url, create=create)
            self._open[target] = store
            self._open[store.url] = store
        return store


# --------------------------------------------------------------------------------------------------
# Manifest


@dataclass(frozen=True)
class ManifestEntry:
    ref: str
    sha256: str
    size: int


@dataclass(frozen=True)
class Manifest:
    """What one tiering of a run moved: the run, the log range it covers, and every ref with sha256 and size."""

    run: str
    tenant: str
    first_lsn: int
    last_lsn: int
    target: str
    entries: tuple[ManifestEntry, ...]

    @property
    def key(self) -> str:
        return manifest_key(self.run, self.last_lsn)

    @property
    def refs(self) -> list[str]:
        return [entry.ref for entry in self.entries]

    @property
    def total_bytes(self) -> int:
        return sum(entry.size for entry in self.entries)

    def to_bytes(self) -> bytes:
        """Canonical JSON: the same move always yields the same bytes (and so the same manifest ref)."""
        return canonical_json({
            "format": MANIFEST_FORMAT, "run": self.run, "tenant": self.tenant,
            "events": {"first_lsn": self.first_lsn, "last_lsn": self.last_lsn}, "target": self.target,
            "blobs": [{"ref": e.ref, "sha256": e.sha256, "size": e.size} for e in self.entries],
        }).encode("utf-8")

    @classmethod
    def from_bytes(cls, raw: bytes) -> Manifest:
        try:
            data = json.loads(raw)
            if data.get("format") != MANIFEST_FORMAT:
                raise ValueError(f"format {data.get('format')!r}")
            return cls(run=data["run"], tenant=data["tenant"], first_lsn=int(data["events"]["first_lsn"]),
                       last_lsn=int(data["events"]["last_lsn"]), target=data["target"],
                       entries=tuple(ManifestEntry(b["ref"], b["sha256"], int(b["size"])) for b in data["blobs"]))
        except (ValueError, KeyError, TypeError) as exc:
            raise IntegrityError(f"a tier manifest is not readable ({exc}); the store or cold store is damaged") from exc


def _event_range(store: Store, run_id: str) -> tuple[int, int]:
    row = store.connection.execute("SELECT MIN(lsn), MAX(lsn) FROM events WHERE run = ?", (run_id,)).fetchone()
    if row is None or row[0] is None:
        raise StoreError(f"no run {run_id!r} in the store; list runs with `kvjudge runs`")
    return int(row[0]), int(row[1])


def _build_manifest(store: Store, state: RunState, target: str, first_lsn: int, last_lsn: int, *,
                    require_bodies: bool) -> Manifest:
    """The manifest of every body of ``state`` the log says is local (sizes from the blob rows, which stay)."""
    refs = sorted(ref for ref, loc in state.bodies.items() if loc.status == LOCAL)
    entries = []
    for ref in refs:
        # typeof(), not "body IS NOT NULL": SQLite answers it from the row header instead of reading the body.
        row = store.connection.execute("SELECT size, typeof(body) != 'null' FROM blobs WHERE ref = ?",
                                       (ref,)).fetchone()
        if row is None or (require_bodies and not row[1]):
            raise IntegrityError(
                f"run {state.id}: the log says {short(ref)} is local but its body is missing; "
                "run `kvjudge verify` before tiering")
        entries.append(ManifestEntry(ref=ref, sha256=ref.removeprefix("sha256:"), size=int(row[0])))
    return Manifest(run=state.id, tenant=state.tenant, first_lsn=first_lsn, last_lsn=last_lsn, target=target,
                    entries=tuple(entries))


def _logged_manifest(store: Store, run_id: str, manifest_ref: str) -> Manifest:
    """The manifest a ``TierStarted`` recorded, rebuilt from the log alone (the events before it, folded).

    The manifest is a function of the log, so it is never stored locally; its ref in the event proves the
    rebuild is byte-identical to what was uploaded.
    """
    before: list[tuple[int, ev.Event]] = []
    started: ev.TierStarted | None = None
    for lsn, event in store.iter_events(run_id):
        if isinstance(event, ev.TierStarted) and event.manifest_ref == manifest_ref:
            started = event
            break
        before.append((lsn, event))
    if started is None or not before:
        raise IntegrityError(f"run {run_id}: no TierStarted names manifest {short(manifest_ref)}; the store is damaged")
    state = fold(before)[run_id]
    manifest = _build_manifest(store, state, started.target, before[0][0], before[-1][0], require_bodies=False)
    if ref_of(manifest.to_bytes()) != manifest_ref:
        raise IntegrityError(f"run {run_id}: the log no longer rebuilds manifest {short(manifest_ref)}; "
                             "the store is damaged")
    return manifest


# --------------------------------------------------------------------------------------------------
# The move


@dataclass(frozen=True)
class TierResult:
    """Outcome of tiering (or recovering) one run.

    ``status``: ``tiered`` (moved now), ``already_tiered`` (nothing to do), ``nothing_local`` (no body to
    move). ``recovered`` names the step a crashed earlier attempt was resumed at (None: a fresh move).
    """

    run: str
    status: str
    target: str | None
    manifest_ref: str | None
    refs: int = 0
    bytes: int = 0
    uploaded: int = 0
    deleted: int = 0
    recovered: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"run": self.run, "status": self.status, "target": self.target, "manifest_ref": self.manifest_ref,
                "refs": self.refs, "bytes": self.bytes, "uploaded": self.uploaded, "deleted": self.deleted,
                "recovered": self.recovered}


def local_body_bytes(store: Store, run_id: str) -> int:
    """Bytes of the bodies of ``run_id`` the log says are local (what a move would upload)."""
    row = store.connection.execute(
        "SELECT COALESCE(SUM(b.size), 0) FROM run_bodies AS r JOIN blobs AS b ON b.ref = r.ref "
        "WHERE r.run = ? AND r.status = ?", (run_id, LOCAL)).fetchone()
    return int(row[0])


def check_eligible(state: RunState) -> None:
    """RunStateError unless grading of ``state`` terminated (graded, ungraded, archived)."""
    if not is_reducible(state.state):
        raise RunStateError(
            f"run {state.id} is {state.state}; only {', '.join(sorted(REDUCIBLE))} runs can be tiered — "
            "finish grading it first (`kvjudge mark RUN graded`)")


def tier_run(store: Store, run_id: str, cold: ColdStore, *, stores: ColdStores | None = None,
             verify_remote: bool = False, progress: ProgressFn | None = None) -> TierResult:
    """Move the local bodies of ``run_id`` to ``cold`` (see the module doc for the steps).

    Idempotent: a run already tiered is left alone (``already_tiered``); a run whose earlier move crashed
    is finished first, at its recorded target (``stores`` opens it; default: ``cold``'s endpoint).
    """
    state = store.run(run_id)
    check_eligible(state)
    stores = stores or ColdStores(getattr(cold, "endpoint_url", None))
    if state.tier and state.tier["status"] in ("started", "tiered"):
        result = recover_run(store, run_id, stores, verify_remote=verify_remote, progress=progress)
        if result is not None:
            return result
        state = store.run(run_id)
        return TierResult(run_id, "already_tiered", state.tier["target"] if state.tier else None,
                          state.tier["manifest_ref"] if state.tier else None)
    cold.check()  # a store that is down fails here, before anything is written locally
    first_lsn, last_lsn = _event_range(store, run_id)
    manifest = _build_manifest(store, state, cold.url, first_lsn, last_lsn, require_bodies=True)
    if not manifest.entries:
        return TierResult(run_id, "nothing_local", cold.url, None)
    raw = manifest.to_bytes()
    manifest_ref = ref_of(raw)
    with store.transaction("tier_start"):
        # Re-read inside the write lock: another `kvjudge tier` may have started this run meanwhile.
        current = store.run(run_id)
        if current.tier and current.tier["status"] in ("started", "tiered"):
            raise StoreError(f"run {run_id} is being tiered by another process; retry when it has finished")
        if _event_range(store, run_id)[1] != manifest.last_lsn:
            raise StoreError(f"run {run_id} changed while preparing its move; retry")
        store.append(run_id, ev.TierStarted(run=run_id, target=cold.url, manifest_ref=manifest_ref))
    fault_point("tier.after_started")
    return _finish_move(store, manifest, manifest_ref, cold, verify_remote=verify_remote, progress=progress,
                        skip_present=False, recovered=None)


def _finish_move(store: Store, manifest: Manifest, manifest_ref: str, cold: ColdStore, *, verify_remote: bool,
                 progress: ProgressFn | None, skip_present: bool, recovered: str | None) -> TierResult:
    """Steps 3–6 for a move whose TierStarted is committed."""
    raw = manifest.to_bytes()
    remote = cold.get_manifest(manifest.key)
    if remote is None:
        # Each body is read back (stat, or a full re-hash with verify_remote) right after its own upload.
        uploaded, problems = _upload_and_check(store, manifest, cold, skip_present=skip_present,
                                               rehash=verify_remote, progress=progress)
        fault_point("tier.after_blobs")
        cold.put_manifest(manifest.key, raw)
        fault_point("tier.manifest_response_lost")
        problems += _check_manifest(cold, manifest, raw)
    elif remote != raw:
        raise ColdStoreError(f"{cold.url}/{manifest.key} holds a different manifest than run {manifest.run}'s "
                             "move recorded; inspect the cold store before retrying")
    else:
        uploaded = 0
        if progress is not None:
            progress(manifest.total_bytes)
        problems = check_remote(cold, manifest, raw, rehash=verify_remote)
    if problems:
        # One repair pass (the local bodies are all still here): rewrite every body — same bytes, same keys —
        # and the manifest, then check again. A remote that still disagrees is an error; nothing is deleted.
        rewritten, problems = _upload_and_check(store, manifest, cold, skip_present=False, rehash=verify_remote,
                                                progress=None)
        uploaded += rewritten
        cold.put_manifest(manifest.key, raw)
        problems += _check_manifest(cold, manifest, raw)
    if problems:
        raise ColdStoreError(f"run {manifest.run}: the cold store does not hold what was written "
                             f"({problems[0]}{'' if len(problems) == 1 else f'; and {len(problems) - 1} more'}); "
                             "nothing was deleted locally — check the cold store and re-run `kvjudge tier`")
    fault_point("tier.after_verify")
    with store.transaction("tiered"):
        current = store.run(manifest.run)
        if not (current.tier and current.tier["status"] == "started" and current.tier["manifest_ref"] == manifest_ref):
            raise StoreError(f"run {manifest.run}'s move was finished by another process; nothing to do")
        store.append(manifest.run, ev.Tiered(run=manifest.run, target=manifest.target, manifest_ref=manifest_ref,
                                             refs=manifest.refs))
    fault_point("tier.after_tiered")
    deleted = _release(store, manifest.run)
    return TierResult(manifest.run, "tiered", manifest.target, manifest_ref, refs=len(manifest.entries),
                      bytes=manifest.total_bytes, uploaded=uploaded, deleted=deleted, recovered=recovered)


def _iter_bodies(store: Store, manifest: Manifest, cold: ColdStore, skip_present: bool
                 ) -> Iterator[tuple[ManifestEntry, bytes | None]]:
    for entry in manifest.entries:
        if skip_present:
            info = cold.stat_blob(entry.ref)
            if info is not None and info.size == entry.size and info.sha256 in (None, entry.sha256):
                yield entry, None  # already there (a crashed attempt uploaded it)
                continue
        body = store.blobs.get(entry.ref)
        if body is None:
            raise IntegrityError(f"run {manifest.run}: {short(entry.ref)} vanished locally during its move; "
                                 "run `kvjudge verify`")
        yield entry, body


def _upload_and_check(store: Store, manifest: Manifest, cold: ColdStore, *, skip_present: bool, rehash: bool,
                      progress: ProgressFn | None) -> tuple[int, list[str]]:
    """Upload the manifest's bodies, each read back right after (several in flight at once).

    Returns how many were sent and the problems the read-backs found. With ``skip_present`` (recovery) an
    object the remote already holds with the right size (and checksum) is not sent again.
    """
    # Bodies are read on this thread (the SQLite connection is not shared); writes and checks run in parallel.
    workers = _workers(cold)
    sent = 0
    problems: list[str] = []
    acknowledged_once = False
    in_flight: dict[concurrent.futures.Future[str | None], int] = {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="kvjudge-tier") as pool:
        def wait_one() -> None:
            nonlocal acknowledged_once
            done, _ = concurrent.futures.wait(in_flight, return_when=concurrent.futures.FIRST_COMPLETED)
            for future in done:
                size = in_flight.pop(future)
                problem = future.result()  # re-raises the first failure (ColdStoreError, IntegrityError)
                if not acknowledged_once:
                    acknowledged_once = True
                    fault_point("tier.blob_response_lost")
                if problem is not None:
                    problems.append(problem)
                if progress is not None:
                    progress(size)

        try:
            for entry, body in _iter_bodies(store, manifest, cold, skip_present):
                if body is None and not rehash:
                    if progress is not None:
                        progress(entry.size)  # already there, and its stat was the check
                    continue
                in_flight[pool.submit(_move_one, cold, manifest.run, entry, body, rehash)] = entry.size
                sent += body is not None
                # Bound memory and queue length: a few writes per worker, at most 64 MiB of bodies held.
                while in_flight and (len(in_flight) >= workers * 2
                                     or sum(in_flight.values()) >= _MAX_IN_FLIGHT_BYTES):
                    wait_one()
            while in_flight:
                wait_one()
        except BaseException:
            for future in in_flight:
                future.cancel()
            raise
    return sent, problems


def _move_one(cold: ColdStore, run_id: str, entry: ManifestEntry, body: bytes | None, rehash: bool) -> str | None:
    """Upload ``body`` (None: already there) after checking it is the ref, then read the object back.

    Runs on a worker thread, so hashing and the read-back overlap the next body's read.
    """
    if body is not None:
        # Never send bytes that are not the ref: a corrupt local body must not become the only copy.
        if ref_of(body) != entry.ref:
            raise IntegrityError(f"run {run_id}: the local body of {short(entry.ref)} does not hash to its ref; "
                                 "nothing was tiered — run `kvjudge verify`")
        cold.put_blob(entry.ref, body)
    return _check_entry(cold, entry, rehash)


def _check_entry(cold: ColdStore, entry: ManifestEntry, rehash: bool) -> str | None:
    """What is wrong with the remote copy of ``entry`` (None: present, right size and checksum)."""
    info = cold.stat_blob(entry.ref)
    if info is None:
        return f"{short(entry.ref)} is missing"
    if info.size != entry.size:
        return f"{short(entry.ref)} has {info.size} bytes, not {entry.size}"
    if info.sha256 is not None and info.sha256 != entry.sha256:
        return f"{short(entry.ref)} has checksum {info.sha256[:12]}…"
    if rehash:
        try:
            cold.get_blob(entry.ref)
        except IntegrityError:
            return f"{short(entry.ref)} does not re-hash to its ref"
    return None


def _check_manifest(cold: ColdStore, manifest: Manifest, raw: bytes) -> list[str]:
    remote = cold.get_manifest(manifest.key)
    return [] if remote == raw else [f"manifest {manifest.key} is {'missing' if remote is None else 'different'}"]


def check_remote(cold: ColdStore, manifest: Manifest, raw: bytes | None = None, *, rehash: bool = False
                 ) -> list[str]:
    """Problems with what ``cold`` holds for ``manifest`` (empty: all there, right sizes and checksums).

    Checks the manifest's bytes (when ``raw`` is given), every blob's size, the store's own SHA-256 where
    it keeps one, and with ``rehash`` downloads and re-hashes every blob.
    """
    problems = _check_manifest(cold, manifest, raw) if raw is not None else []
    # One round trip per object: a few in flight at once (a HEAD is mostly latency).
    with concurrent.futures.ThreadPoolExecutor(max_workers=_workers(cold),
                                               thread_name_prefix="kvjudge-check") as pool:
        problems.extend(problem for problem in pool.map(lambda e: _check_entry(cold, e, rehash), manifest.entries)
                        if problem is not None)
    return problems


def _workers(cold: ColdStore) -> int:
    """Objects in flight at once. Network stores hide latency with more; so does a local disk, whose writes
    wait on fsync (ext4 batches concurrent fsyncs into one journal commit: 8 beat 4 and 2 here)."""
    return 8


def _release(store: Store, run_id: str) -> int:
    """Step 6: delete the local bodies the log says are tiered (one transaction). Returns how many went."""
    tiered = [row[0] for row in store.connection.execute(
        "SELECT r.ref FROM run_bodies AS r JOIN blobs AS b ON b.ref = r.ref "
        "WHERE r.run = ? AND r.status = ? AND typeof(b.body) != 'null'", (run_id, TIERED))]
    if not tiered:
        return 0
    # This SQLite build zeroes freed pages (secure_delete=1), which writes every deleted body once more to the
    # WAL and again at checkpoint: 2x the I/O of the move itself. A tiered body is not a secret to scrub (it
    # lives on in the cold store), so this one deletion uses FAST: freed pages are zeroed only when free to do.
    conn = store.connection
    previous = conn.execute("PRAGMA secure_delete").fetchone()[0]
    conn.execute("PRAGMA secure_delete = FAST")
    try:
        return len(store.release_bodies(tiered, label="tier_delete"))
    finally:
        conn.execute(f"PRAGMA secure_delete = {int(previous)}")


# --------------------------------------------------------------------------------------------------
# Recovery


def recover_run(store: Store, run_id: str, stores: ColdStores, *, verify_remote: bool = False,
                progress: ProgressFn | None = None) -> TierResult | None:
    """Finish a crashed move of ``run_id``; None when there is nothing to finish."""
    state = store.run(run_id)
    tier = state.tier
    if not tier:
        return None
    if tier["status"] == "started":
        manifest = _logged_manifest(store, run_id, tier["manifest_ref"])
        cold = stores.get(tier["target"])
        cold.check()
        # A writer killed mid-object may have left a partial temp file: the move's own keys are swept.
        cold.discard_partial([blob_key(ref) for ref in manifest.refs] + [manifest.key])
        return _finish_move(store, manifest, tier["manifest_ref"], cold, verify_remote=verify_remote,
                            progress=progress, skip_present=True, recovered="upload")
    if tier["status"] == "tiered":
        deleted = _release(store, run_id)
        if deleted:
            return TierResult(run_id, "tiered", tier["target"], tier["manifest_ref"], deleted=deleted,
                              recovered="delete")
    return None


def recover(store: Store, stores: ColdStores, *, verify_remote: bool = False,
            progress: ProgressFn | None = None) -> list[TierResult]:
    """Finish every crashed move in the store (run at the start of every ``tier`` and ``verify``); with
    ``verify_remote`` every remote body is re-hashed before the move is committed."""
    results = []
    for run_id in pending_runs(store):
        result = recover_run(store, run_id, stores, verify_remote=verify_remote, progress=progress)
        if result is not None:
            results.append(result)
    return results


def pending_runs(store: Store) -> list[str]:
    """Runs whose move is unfinished: TierStarted without Tiered, or Tiered with local bodies left."""
    rows = store.connection.execute(
        "SELECT DISTINCT b.run FROM run_bodies AS b JOIN blobs ON blobs.ref = b.ref "
        "WHERE b.status = ? AND typeof(blobs.body) != 'null' ORDER BY b.run", (TIERED,)).fetchall()
    pending = {row[0] for row in rows}
    for run_id in store.run_ids():
        tier = store.run(run_id).tier
        if tier and tier["status"] == "started":
            pending.add(run_id)
    return sorted(pending)


# --------------------------------------------------------------------------------------------------
# Reading and rehydrating


class ColdReader:
    """The store's fallback reader: the bytes of a tiered ref, fetched from where the log says it is.

    Every fetched body is checked against its ref by the cold store; a store that is down raises
    ColdStoreError (the reader never turns "unreachable" into "absent").
    """

    def __init__(self, store: Store, stores: ColdStores) -> None:
        self._store = store
        self._stores = stores
        self._checked: set[str] = set()

    def __call__(self, ref: str) -> bytes | None:
        targets = [loc.target for _, loc in self._store.explain(ref).locations if loc.status == TIERED and loc.target]
        for target in dict.fromkeys(targets):
            cold = self._stores.get(target)
            if target not in self._checked:  # once per target: "down" must not read as "object missing"
                cold.check()
                self._checked.add(target)
            body = cold.get_blob(ref)
            if body is not None:
                return body
        if targets:
            raise ColdStoreError(f"{short(ref)} is tiered to {targets[0]} but the cold store does not have it; "
                                 "run `kvjudge verify --verify-remote`")
        return None


def fallback_reader(config: Config | None, store: Store, *, endpoint_url: str | None = None) -> ColdReader:
    """The reader ``kvjudge`` commands plug into ``store.fallback``, so reading a tiered run fetches its bodies.

    The S3 endpoint is ``endpoint_url``, else ``[retention] endpoint_url``, else boto3's own resolution.
    """
    endpoint = resolve_endpoint(config, endpoint_url) if config is not None else endpoint_url
    return ColdReader(store, ColdStores(endpoint))


@dataclass(frozen=True)
class RehydrateResult:
    run: str
    status: str  # "rehydrated" | "not_tiered"
    refs: int = 0
    bytes: int = 0
    target: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"run": self.run, "status": self.status, "refs": self.refs, "bytes": self.bytes,
                "target": self.target}


def rehydrate_run(store: Store, run_id: str, stores: ColdStores, *, progress: ProgressFn | None = None
                  ) -> RehydrateResult:
    """Bring the tiered bodies of ``run_id`` back into the local store and append ``Rehydrated``.

    Bodies are put first (each batch its own transaction; a body put back is the same bytes, so the ref
    stays true), the event last. The remote copies stay: cold storage is never deleted from.
    """
    recover_run(store, run_id, stores)  # a move left half done is finished first
    state = store.run(run_id)
    refs = sorted(ref for ref, loc in state.bodies.items() if loc.status == TIERED)
    if not refs:
        return RehydrateResult(run_id, "not_tiered")
    total = 0
    batch: list[bytes] = []
    batch_bytes = 0

    def flush() -> None:
        nonlocal batch, batch_bytes
        if batch:
            with store.transaction("rehydrate_put"):
                for body in batch:
                    store.blobs.put(body)
            batch, batch_bytes = [], 0

    for ref in refs:
        target = state.bodies[ref].target
        body = None if store.blobs.has_body(ref) else _fetch(stores, target, ref)
        if body is not None:
            batch.append(body)
            batch_bytes += len(body)
            total += len(body)
            if batch_bytes >= _MAX_IN_FLIGHT_BYTES:
                flush()
        if progress is not None:
            progress(1)
    flush()
    fault_point("rehydrate.after_bodies")
    with store.transaction("rehydrated"):
        # Under the write lock: a concurrent `tier` recovery may have released bodies put above (to it they
        # were tiered bodies left behind); fetch those again so the event never names a body that is not here.
        for ref in refs:
            if not store.blobs.has_body(ref):
                store.blobs.put(_fetch(stores, state.bodies[ref].target, ref))
        store.append(run_id, ev.Rehydrated(run=run_id, refs=refs))
    return RehydrateResult(run_id, "rehydrated", refs=len(refs), bytes=total,
                           target=state.tier["target"] if state.tier else None)


def _fetch(stores: ColdStores, target: str | None, ref: str) -> bytes:
    if target is None:
        raise IntegrityError(f"{short(ref)} is tiered but the log names no target; the store is damaged")
    body = stores.get(target).get_blob(ref)
    if body is None:
        raise ColdStoreError(f"{short(ref)} is missing from {target}; it cannot be rehydrated — "
                             "run `kvjudge verify --verify-remote`")
    return body


# --------------------------------------------------------------------------------------------------
# Verify


def verify_tiered_run(store: Store, state: RunState, stores: ColdStores, *, rehash: bool = False
                      ) -> list[Violation]:
    """Every ref the log says is tiered is named by its manifest, and every ref of that manifest exists at its
    target with the right size (and the store's own checksum); ``rehash`` downloads and re-hashes each body."""
    violations: list[Violation] = []
    tiered = {ref: loc for ref, loc in state.bodies.items() if loc.status == TIERED}
    for manifest_ref in sorted({loc.manifest_ref or "" for loc in tiered.values()}):
        if not manifest_ref:
            violations.append(Violation("tiered", state.id, None, "a tiered ref names no manifest"))
            continue
        try:
            manifest = _logged_manifest(store, state.id, manifest_ref)
        except IntegrityError as exc:
            violations.append(Violation("tiered", state.id, manifest_ref, str(exc)))
            continue
        listed = set(manifest.refs)
        violations.extend(Violation("tiered", state.id, ref, f"{short(ref)} is tiered but not in its manifest")
                          for ref, loc in sorted(tiered.items())
                          if loc.manifest_ref == manifest_ref and ref not in listed)
        cold = stores.get(manifest.target)
        violations.extend(Violation("tiered", state.id, None, f"{manifest.target}: {message}")
                          for message in check_remote(cold, manifest, manifest.to_bytes(), rehash=rehash))
    return violations


def tier_check(stores: ColdStores, *, rehash: bool = False) -> Check:
    """The extra check :func:`kvjudge.retention.verify.verify` runs per run for tiered bodies."""
    def check(store: Any, state: RunState) -> list[Violation]:
        return verify_tiered_run(store, state, stores, rehash=rehash)

    return check


def verify_checks(config: Config | None, store: Store, *, rehash: bool = False,
                  endpoint_url: str | None = None) -> list[Check]:
    """What ``kvjudge verify`` calls first: finish crashed moves (recovery), then hand back the tier check.

    ``rehash`` is ``--verify-remote`` (download and re-hash every tiered body).
    """
    stores = ColdStores(resolve_endpoint(config, endpoint_url) if config is not None else endpoint_url)
    recover(store, stores, verify_remote=rehash)
    return [tier_check(stores, rehash=rehash)]


@dataclass
class TierPlan:
    """Which runs ``tier --all`` would move (eligible, with local bodies, not yet tiered)."""

    runs: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)


def plan_all(store: Store) -> TierPlan:
    """Eligible runs for ``tier --all``; ineligible ones are listed with the reason (not an error)."""
    plan = TierPlan()
    for state in store.iter_runs():
        if not is_reducible(state.state):
            plan.skipped[state.id] = f"{state.state} (not terminal)"
        elif state.tier and state.tier["status"] == "tiered":
            plan.skipped[state.id] = "already tiered"
        else:
            plan.runs.append(state.id)
    return plan
