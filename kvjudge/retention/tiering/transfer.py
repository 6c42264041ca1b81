"""Moving bytes to a cold store and checking what it holds: parallel uploads, each read back right after.

A few worker threads each take one object at a time — a pack of a move's bodies (or, finishing a move made
before packs, one body's blob): stream its bodies from the store to the cold store in chunks (each worker with a
read-only connection of its own, so reading is as parallel as writing), the cold store hashing each chunk as it
writes it and keeping the object only when every body hashes to its ref, then check the object is there. The
caller only hands out objects, at most two per worker ahead.
"""

from __future__ import annotations

import concurrent.futures
import functools
import threading
from collections.abc import Callable, Iterator

from kvjudge.errors import IntegrityError
from kvjudge.retention.blobs import ref_of, short
from kvjudge.retention.cold import ColdStore
from kvjudge.retention.faults import fault_point
from kvjudge.retention.store import Store
from kvjudge.retention.store.interfaces import BodyReading, OpenBody
from kvjudge.retention.tiering.manifest import Manifest, ManifestEntry, RemoteObject

# Objects in flight at once. Network stores hide latency with more; so does a local disk, whose writes wait
# on fsync (ext4 batches concurrent fsyncs into one journal commit: 8 beat 4 and 2 here).
WORKERS = 8

ProgressFn = Callable[[int], None]
MAX_IN_FLIGHT_BYTES = 64 * 1024 * 1024
# A body is streamed in chunks this size: each is hashed and written while it is still in the CPU's cache, and
# no body is ever whole in memory (a 4 MB body read whole costs two copies and fresh pages for each).
CHUNK_BYTES = 128 * 1024


class FinishedElsewhere(Exception):
    """A body of a move vanished locally because another process (a concurrent ``tier`` or ``verify``) finished
    the same move and released it: nothing is wrong, and nothing is left to do."""


class BodyVanished(IntegrityError):
    """A body of a move was not in the local store when its upload came to read it."""


def vanished(store: Store, manifest: Manifest, exc: BodyVanished) -> Exception:
    """What a vanished body means: FinishedElsewhere when the log says this very move was committed by another
    process (which then released the bodies), else the IntegrityError it is."""
    tier = store.runs.run(manifest.run).tier or {}
    if tier.get("status") == "tiered" and tier.get("manifest_ref") == ref_of(manifest.to_bytes()):
        return FinishedElsewhere(manifest.run)
    return exc


class Batch:
    """The uploads of one move, each read back right after its write (results come in as they finish)."""

    def __init__(self, run_id: str) -> None:
        self.run = run_id
        self.sent = 0
        self._futures: list[concurrent.futures.Future[tuple[int, str | None]]] = []

    def add(self, future: concurrent.futures.Future[tuple[int, str | None]]) -> None:
        self._futures.append(future)

    def wait(self) -> list[str]:
        """Wait for every upload of the move; the problems the read-backs found (:attr:`sent` counts the bodies
        written, those of a pack included). Re-raises the first failure (ColdStoreError, IntegrityError,
        BodyVanished)."""
        problems: list[str] = []
        for index, future in enumerate(concurrent.futures.as_completed(self._futures)):
            sent, problem = future.result()
            if index == 0:
                fault_point("tier.blob_response_lost")
            self.sent += sent
            if problem is not None:
                problems.append(problem)
        return problems


class Uploader:
    """A few worker threads writing to one cold store, shared by the moves of one call (so one move's uploads
    overlap the finishing of the one before). The bodies come from the store ``source`` (its readers, one connection
    per worker); ``progress`` gets the bytes of each finished upload.
    """

    def __init__(self, cold: ColdStore, source: Store, *, rehash: bool, progress: ProgressFn | None) -> None:
        self._cold = cold
        self._readers = source.body_readers()
        self._rehash = rehash
        self._progress = progress
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="kvjudge-tier")
        # Two uploads per worker in flight; a slot frees when one finishes (a semaphore: waiting on the futures
        # themselves costs the caller a lock per future in flight for every body sent).
        self._slots = threading.Semaphore(WORKERS * 2)
        self._failure: BaseException | None = None

    def __enter__(self) -> Uploader:
        return self

    def __exit__(self, kind: type[BaseException] | None, *rest: object) -> None:
        self._pool.shutdown(wait=True, cancel_futures=kind is not None)
        self._readers.close()

    def send(self, batch: Batch, remote: RemoteObject, *, skip_present: bool = False) -> None:
        """Upload ``remote`` (a pack, or one body's blob) as part of ``batch`` (with ``skip_present``, not when the
        remote holds it already with the right size and checksum: recovery). Blocks while two per worker wait;
        raises the failure of any upload that failed meanwhile."""
        self._slots.acquire()
        if self._failure is not None:
            self._slots.release()
            raise self._failure
        future = self._pool.submit(_move_one, self._cold, self._readers, batch.run, remote, self._rehash,
                                   skip_present)
        future.add_done_callback(lambda done: self._finished(done, remote.size))
        batch.add(future)

    def _finished(self, future: concurrent.futures.Future[tuple[int, str | None]], size: int) -> None:
        self._slots.release()
        if future.cancelled():
            return
        failure = future.exception()
        if failure is not None:
            self._failure = self._failure or failure
        elif self._progress is not None:
            self._progress(size)


def upload_and_check(store: Store, manifest: Manifest, cold: ColdStore, *, skip_present: bool, rehash: bool,
                     progress: ProgressFn | None) -> tuple[int, list[str]]:
    """Upload the manifest's bodies, each read back right after (several in flight at once).

    Returns how many were sent and the problems the read-backs found. With ``skip_present`` (recovery) an
    object the remote already holds with the right size (and checksum) is not sent again. A body another
    process's finishing of the same move released meanwhile raises :class:`FinishedElsewhere`.
    """
    batch = Batch(manifest.run)
    try:
        with Uploader(cold, store, rehash=rehash, progress=progress) as uploader:
            for remote in manifest.objects:
                uploader.send(batch, remote, skip_present=skip_present)
            problems = batch.wait()  # counts what was sent: read batch.sent only after it
            return batch.sent, problems
    except BodyVanished as exc:
        raise vanished(store, manifest, exc) from exc


def _move_one(cold: ColdStore, readers: BodyReading, run_id: str, remote: RemoteObject, rehash: bool,
              skip_present: bool) -> tuple[int, str | None]:
    """On a worker thread: read the bodies of ``remote``, check each is its ref, upload them, check the object.

    Returns how many bodies were sent, and what the read-back found wrong (None: nothing).
    """
    if skip_present and _present(cold, remote):
        # Already there (a crashed attempt uploaded it): that stat was the check, unless asked to re-hash.
        return 0, _check_object(cold, remote, rehash) if rehash else None
    current = remote.entries[0].ref  # the body being written: the one a refusal is about

    def bodies() -> Iterator[tuple[str, Iterator[bytes]]]:
        nonlocal current
        for entry in remote.entries:
            current = entry.ref
            yield entry.ref, _streamed(readers, run_id, entry.ref)

    # The cold store never keeps bytes that are not the ref: a corrupt local body must not become the only copy.
    try:
        if remote.packed:
            cold.put_pack(remote.key, bodies())
        else:
            cold.put_blob(*next(bodies()))
    except BodyVanished:
        raise
    except IntegrityError as exc:
        raise IntegrityError(f"run {run_id}: the local body of {short(current)} does not hash to its ref; "
                             "nothing was tiered — run `kvjudge verify`") from exc
    return len(remote.entries), _check_object(cold, remote, rehash)


def _streamed(readers: BodyReading, run_id: str, ref: str) -> Iterator[bytes]:
    """The body of ``ref`` in chunks, opened only when its first chunk is asked for (a pack's bodies one by one)."""
    body = readers.open(ref)
    if body is None:
        raise BodyVanished(f"run {run_id}: {short(ref)} vanished locally during its move; run `kvjudge verify`")
    with body:
        yield from _chunks(body)


def _chunks(body: OpenBody) -> Iterator[bytes]:
    return iter(functools.partial(body.read, CHUNK_BYTES), b"")


def _present(cold: ColdStore, remote: RemoteObject) -> bool:
    """The remote holds ``remote`` with the right size (and, for a blob, the store's own checksum where it keeps
    one)."""
    info = cold.stat_object(remote.key)
    if info is None or info.size != remote.size:
        return False
    return remote.packed or info.sha256 in (None, remote.entries[0].sha256)


def fetch_body(cold: ColdStore, entry: ManifestEntry) -> bytes | None:
    """The body of ``entry`` from where its move put it (in a pack, or its own blob), checked against its ref
    (IntegrityError when the remote bytes are not the ref); None when the object is absent."""
    if entry.pack is None:
        return cold.get_blob(entry.ref)
    return cold.get_range(entry.ref, entry.pack, entry.offset, entry.size)


def _check_object(cold: ColdStore, remote: RemoteObject, rehash: bool) -> str | None:
    """What is wrong with the remote copy of ``remote`` (None: present, right size and checksum; with ``rehash``
    every body in it re-hashes to its ref)."""
    name = remote.key if remote.packed else short(remote.entries[0].ref)
    info = cold.stat_object(remote.key)
    if info is None:
        return f"{name} is missing"
    if info.size != remote.size:
        return f"{name} has {info.size} bytes, not {remote.size}"
    if not remote.packed and info.sha256 is not None and info.sha256 != remote.entries[0].sha256:
        return f"{name} has checksum {info.sha256[:12]}…"
    if rehash:
        for entry in remote.entries:
            try:
                if fetch_body(cold, entry) is None:
                    return f"{name} is missing"
            except IntegrityError:
                return f"{short(entry.ref)} in {remote.key} does not re-hash to its ref"
    return None


def check_manifest(cold: ColdStore, manifest: Manifest, raw: bytes) -> list[str]:
    remote = cold.get_manifest(manifest.key)
    return [] if remote == raw else [f"manifest {manifest.key} is {'missing' if remote is None else 'different'}"]


def check_remote(cold: ColdStore, manifest: Manifest, raw: bytes | None = None, *, rehash: bool = False
                 ) -> list[str]:
    """Problems with what ``cold`` holds for ``manifest`` (empty: all there, right sizes and checksums).

    Checks the manifest's bytes (when ``raw`` is given), every pack's (or blob's) size, a blob's SHA-256 where the
    store keeps one, and with ``rehash`` downloads and re-hashes every body.
    """
    problems = check_manifest(cold, manifest, raw) if raw is not None else []
    # One round trip per object: a few in flight at once (a HEAD is mostly latency).
    with concurrent.futures.ThreadPoolExecutor(max_workers=WORKERS,
                                               thread_name_prefix="kvjudge-check") as pool:
        problems.extend(problem for problem in pool.map(lambda o: _check_object(cold, o, rehash), manifest.objects)
                        if problem is not None)
    return problems
