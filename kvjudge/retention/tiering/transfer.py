"""Moving bytes to a cold store and checking what it holds: parallel uploads, each read back right after.

Bodies are read on the caller's thread (the SQLite connection is not shared); hashing, writes and read-back
checks run on a few worker threads, with a bound on the bytes held in flight.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable, Iterator

from kvjudge.errors import IntegrityError
from kvjudge.retention.blobs import ref_of, short
from kvjudge.retention.cold import ColdStore
from kvjudge.retention.faults import fault_point
from kvjudge.retention.store import Store
from kvjudge.retention.tiering.manifest import Manifest, ManifestEntry

ProgressFn = Callable[[int], None]
MAX_IN_FLIGHT_BYTES = 64 * 1024 * 1024


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


def upload_and_check(store: Store, manifest: Manifest, cold: ColdStore, *, skip_present: bool, rehash: bool,
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
                                     or sum(in_flight.values()) >= MAX_IN_FLIGHT_BYTES):
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


def check_manifest(cold: ColdStore, manifest: Manifest, raw: bytes) -> list[str]:
    remote = cold.get_manifest(manifest.key)
    return [] if remote == raw else [f"manifest {manifest.key} is {'missing' if remote is None else 'different'}"]


def check_remote(cold: ColdStore, manifest: Manifest, raw: bytes | None = None, *, rehash: bool = False
                 ) -> list[str]:
    """Problems with what ``cold`` holds for ``manifest`` (empty: all there, right sizes and checksums).

    Checks the manifest's bytes (when ``raw`` is given), every blob's size, the store's own SHA-256 where
    it keeps one, and with ``rehash`` downloads and re-hashes every blob.
    """
    problems = check_manifest(cold, manifest, raw) if raw is not None else []
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


