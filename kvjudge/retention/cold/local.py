"""A directory as cold store (:class:`LocalDirColdStore`): each object written crash-safely, durable in the order a
move needs (its bodies before its manifest)."""

from __future__ import annotations

import concurrent.futures
import hashlib
import os
import secrets
import socket
import threading
import urllib.parse
from collections.abc import Iterable
from pathlib import Path

from kvjudge.errors import ColdStoreError
from kvjudge.retention.cold.interface import (BlobBody, ManifestWrite, ObjectInfo, body_chunks, checked,
                                              compare_manifest, not_the_ref)
from kvjudge.retention.cold.keys import blob_key, ref_hex


class LocalDirColdStore:
    """A directory as cold store: packs, content-addressed blobs and manifests, each file written crash-safely.

    Every object is written to a temporary name in its final directory (a blob hashed as it is written, and
    renamed only when it hashes to its ref), fsynced, then renamed into place — so after a crash an object is
    either absent or complete, never torn. A blob's writer syncs the directory its rename changed; the parents of
    the directories it created (``objects/ab``, ``objects``: shared by many blobs) are synced by :meth:`flush`,
    which every manifest write runs first — once per directory however many blobs created entries there, several
    at a time, instead of one more directory sync per blob on its writer's thread (each waits for a journal
    commit and a device flush). A manifest is therefore never durable before the blobs it names. :meth:`flush`
    also syncs what this store cannot vouch for: a directory found already there (another writer, killed before
    its flush, may have left its entry unsynced) and the directory of a blob found by :meth:`stat_blob` that this
    store did not write. Only those directories are synced, never the whole file system: what other processes
    write there costs a move nothing. Manifests are linked into place with ``os.link`` (fails if the name
    exists), the local equivalent of S3's ``If-None-Match: *``, and their directory is synced at once. A pack's
    writer leaves the sync of its rename's directory to :meth:`flush` too: a move's packs share one directory
    (``packs/<run>/``), synced once before its manifest.
    """

    def __init__(self, root: str | os.PathLike[str], *, create: bool = False) -> None:
        self.root = Path(root).expanduser().resolve()
        self.url = "file://" + urllib.parse.quote(str(self.root))
        self.endpoint_url: str | None = None
        self._create = create
        self._host = socket.gethostname().replace("-", "_")
        # Several writer threads share one store: directories known to exist, those of them whose entry in their
        # parent may not be durable yet, directories awaiting a sync, and the objects this store renamed into place
        # (their directory synced, or awaiting the next flush).
        self._lock = threading.Lock()
        # One flush at a time: a flush that finds nothing pending must not return while another's syncs (which may
        # cover this caller's objects) are still under way.
        self._flush_lock = threading.Lock()
        self._known_dirs: set[Path] = set()
        self._unvouched_dirs: set[Path] = set()
        self._unsynced: set[Path] = set()
        self._written: set[Path] = set()

    def __repr__(self) -> str:
        return f"LocalDirColdStore({str(self.root)!r})"

    def check(self) -> None:
        if not self.root.is_dir():
            if self._create:
                try:
                    self.root.mkdir(parents=True, exist_ok=True)
                except OSError as exc:
                    raise ColdStoreError(f"cannot create cold store directory {self.root}: {exc.strerror}") from exc
            else:
                raise ColdStoreError(
                    f"cold store directory {self.root} does not exist; create it (or mount the disk) and retry"
                )
        if not os.access(self.root, os.W_OK | os.X_OK):
            raise ColdStoreError(f"cold store directory {self.root} is not writable; fix its permissions")

    def _path(self, key: str) -> Path:
        return self.root / key

    def _make_dirs(self, directory: Path) -> list[Path]:
        """Create ``directory`` and its missing parents; returns those this call created, whose entries await a
        sync of their parents (the caller schedules it). Every other directory on the way whose entry in its
        parent may not be durable yet (found there, or created by another thread and not flushed yet) has its
        parent synced by the next :meth:`flush`."""
        chain: list[Path] = []
        while directory != self.root:
            chain.append(directory)
            directory = directory.parent
        created: list[Path] = []
        for step in reversed(chain):
            if step in self._known_dirs:
                with self._lock:
                    if step in self._unvouched_dirs:
                        self._unsynced.add(step.parent)
                continue
            try:
                os.mkdir(step)
            except FileExistsError:
                with self._lock:
                    self._unsynced.add(step.parent)
            except OSError as exc:
                raise ColdStoreError(f"cannot create {step} in the cold store: {exc.strerror}") from exc
            else:
                created.append(step)
            with self._lock:
                self._known_dirs.add(step)
                self._unvouched_dirs.add(step)
        return created

    def _write_temp(self, final: Path, parts: Iterable[tuple[str | None, BlobBody]]) -> Path:
        """Write ``parts`` one after the other to a fresh temp file beside ``final`` (its directory exists) and
        fsync it; a part with a ref is hashed on the way (each chunk while it is in cache) and the file kept only
        when every such part hashes to its ref. Removed on any failure."""
        # The writer's host and pid are in the name, so a later run can tell a dead writer's leftovers.
        temp = final.parent / f".tmp-{final.name}-{self._host}-{os.getpid()}-{secrets.token_hex(6)}"
        try:
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                for ref, body in parts:
                    digest = hashlib.sha256() if ref is not None else None
                    for chunk in body_chunks(body):
                        if digest is not None:
                            digest.update(chunk)
                        view = memoryview(chunk)
                        while view:
                            view = view[os.write(fd, view):]
                    if digest is not None and ref is not None and digest.hexdigest() != ref_hex(ref):
                        raise not_the_ref(ref, self.url)
                os.fsync(fd)
            finally:
                os.close(fd)
        except BaseException as exc:
            temp.unlink(missing_ok=True)
            if isinstance(exc, OSError):
                raise ColdStoreError(f"cannot write {final} in the cold store: {exc.strerror}") from exc
            raise
        return temp

    @staticmethod
    def _fsync_dir(directory: Path) -> None:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def put_blob(self, ref: str, body: BlobBody) -> None:
        final = self._path(blob_key(ref))
        created = self._make_dirs(final.parent)
        temp = self._write_temp(final, [(ref, body)])
        try:
            # Content-addressed: replacing an existing object writes the same bytes (or repairs a bad copy).
            os.replace(temp, final)
        except OSError as exc:
            temp.unlink(missing_ok=True)
            raise ColdStoreError(f"cannot store {final} in the cold store: {exc.strerror}") from exc
        # The rename's directory now (each blob its own, almost always); the parents of the directories this call
        # created at the next flush, once for every blob that shared them (objects/ab, objects).
        try:
            self._fsync_dir(final.parent)
        except OSError as exc:
            with self._lock:
                self._unsynced.add(final.parent)  # the next flush tries again, before any manifest
                self._unsynced.update(directory.parent for directory in created)
            raise ColdStoreError(f"cannot sync {final.parent} in the cold store: {exc.strerror}") from exc
        with self._lock:
            self._unsynced.update(directory.parent for directory in created)
            self._written.add(final)

    def put_pack(self, key: str, bodies: Iterable[tuple[str, BlobBody]]) -> None:
        final = self._path(key)
        created = self._make_dirs(final.parent)
        temp = self._write_temp(final, bodies)
        try:
            # Derived from its move: a retry writes the same bytes (or repairs a bad copy).
            os.replace(temp, final)
        except OSError as exc:
            temp.unlink(missing_ok=True)
            raise ColdStoreError(f"cannot store {final} in the cold store: {exc.strerror}") from exc
        # The rename's directory (shared by the move's packs) and the new directories' parents: at the next flush.
        with self._lock:
            self._unsynced.add(final.parent)
            self._unsynced.update(directory.parent for directory in created)
            self._written.add(final)

    def flush(self) -> None:
        with self._flush_lock:
            self._flush()

    def _flush(self) -> None:
        with self._lock:
            pending, self._unsynced = self._unsynced, set()
            # Entries that existed before these syncs start are durable once they are done.
            covered = {directory for directory in self._unvouched_dirs if directory.parent in pending}
        if not pending:
            return
        try:
            # Each fsync waits on the device: several at a time, so the waits overlap. Not syncfs(2): it would wait
            # for every dirty byte of the file system, other processes' too (on a shared disk, the time of a move
            # would depend on what else runs).
            with concurrent.futures.ThreadPoolExecutor(max_workers=min(8, len(pending)),
                                                       thread_name_prefix="kvjudge-sync") as pool:
                list(pool.map(self._fsync_dir, pending))
        except OSError as exc:
            with self._lock:
                self._unsynced |= pending
            raise ColdStoreError(f"cannot sync the cold store directory {self.root}: {exc.strerror}") from exc
        with self._lock:
            self._unvouched_dirs -= covered

    def stat_blob(self, ref: str) -> ObjectInfo | None:
        return self.stat_object(blob_key(ref))

    def stat_object(self, key: str) -> ObjectInfo | None:
        path = self._path(key)
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise ColdStoreError(f"cannot stat {path}: {exc.strerror}") from exc
        # Found is not durable unless this store wrote it (then its directory was synced, and the directories above
        # are flushed like every other it created): a writer killed before its syncs (or still running) may have
        # renamed it into a directory not synced yet. A move that counts on it syncs that directory before its
        # manifest.
        with self._lock:
            if path not in self._written:
                self._unsynced.add(path.parent)
        return ObjectInfo(key=key, size=size, sha256=None)

    def _read(self, key: str) -> bytes | None:
        try:
            return self._path(key).read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise ColdStoreError(f"cannot read {self._path(key)}: {exc.strerror}") from exc

    def get_blob(self, ref: str) -> bytes | None:
        key = blob_key(ref)
        body = self._read(key)
        return None if body is None else checked(ref, body, str(self._path(key)))

    def get_range(self, ref: str, key: str, offset: int, size: int) -> bytes | None:
        path = self._path(key)
        try:
            with open(path, "rb") as handle:
                handle.seek(offset)
                body = handle.read(size)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise ColdStoreError(f"cannot read {path}: {exc.strerror}") from exc
        return checked(ref, body, f"{path} at offset {offset}")

    def put_manifest(self, key: str, data: bytes) -> ManifestWrite:
        final = self._path(key)
        new_dirs = self._make_dirs(final.parent)
        with self._lock:
            self._unsynced.update(directory.parent for directory in new_dirs)
        self.flush()  # the blobs (and new directories) first: a manifest is never durable without them
        temp = self._write_temp(final, [(None, data)])
        try:
            try:
                os.link(temp, final)  # atomic create-if-absent: never replaces an existing manifest
                created = True
            except FileExistsError:
                created = False
            self._fsync_dir(final.parent)
        except OSError as exc:
            raise ColdStoreError(f"cannot store manifest {final}: {exc.strerror}") from exc
        finally:
            temp.unlink(missing_ok=True)
        if not created:
            compare_manifest(key, data, self._read(key), str(final))
        return ManifestWrite(key=key, created=created)

    def get_manifest(self, key: str) -> bytes | None:
        return self._read(key)

    def discard_partial(self, keys: Iterable[str]) -> int:
        removed = 0
        for directory in sorted({self._path(key).parent for key in keys}):
            try:
                for temp in directory.glob(".tmp-*"):
                    host, pid = _temp_writer(temp.name)
                    if host == self._host and pid is not None and not _alive(pid):
                        temp.unlink(missing_ok=True)
                        removed += 1
            except OSError as exc:
                raise ColdStoreError(f"cannot clean up unfinished writes in {directory} of the cold store: "
                                     f"{exc.strerror}") from exc
        return removed


def _temp_writer(name: str) -> tuple[str | None, int | None]:
    """(host, pid) of the writer that named a temp file ``.tmp-<final>-<host>-<pid>-<random>``."""
    parts = name.rsplit("-", 3)
    if len(parts) != 4 or not parts[2].isdigit():
        return None, None
    return parts[1], int(parts[2])


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True

