"""Cold stores: where tiered bodies live once their run has left the local store.

A cold store holds three kinds of objects:

- **packs**, many bodies each (what a move writes today): the concatenation of a move's bodies in the order its
  manifest lists them, under a key derived from the move (:func:`pack_key`), so writing a pack twice writes
  identical bytes under the same key; a body is read back by its offset and length, and checked against its ref;
- **blobs**, one body each, content-addressed: the key is derived from the ref (``sha256:<hex>``), so writing a
  blob twice writes identical bytes under the same key — the layout of moves made before packs (still read, and
  still written to finish such a move after a crash);
- **manifests**, one per tiering of a run: written last, conditionally (never overwritten with other
  bytes), so their presence is the remote's commit of the whole move.

Two implementations: :class:`LocalDirColdStore` (a directory, e.g. a mounted disk; the default) and
:class:`S3ColdStore` (any S3-compatible object store through boto3 — AWS, or SeaweedFS, MinIO, …).
:func:`open_cold_store` picks one from a ``file://`` or ``s3://`` URL.
"""

from __future__ import annotations

import base64
import concurrent.futures
import hashlib
import os
import secrets
import socket
import threading
import urllib.parse
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from kvjudge.errors import ColdStoreError, IntegrityError, UsageError
from kvjudge.retention.blobs import REF_PREFIX, check_ref, ref_of, short

#: What :meth:`ColdStore.put_blob` takes: a blob's bytes whole, or in chunks, in order (streamed from the store).
BlobBody = bytes | Iterable[bytes]


def ref_hex(ref: str) -> str:
    """The hex digest of a ``sha256:<hex>`` ref (UsageError for anything else)."""
    return check_ref(ref).removeprefix(REF_PREFIX)


def blob_key(ref: str) -> str:
    """The object key of a blob, relative to the store root: ``objects/ab/cd/<hex>``.

    Two levels of fan-out keep any one directory small on a local disk; S3 uses the same layout so one
    store's objects can be copied to the other with a plain sync.
    """
    hexdigest = ref_hex(ref)
    return f"objects/{hexdigest[:2]}/{hexdigest[2:4]}/{hexdigest}"


# A run id names one directory of a local cold store; file systems cap a name at 255 bytes.
_MAX_RUN_SEGMENT = 160


def _run_segment(run_id: str) -> str:
    """``run_id`` as one path segment: percent-escaped; ``.`` and ``..`` escaped too (they would name the
    directory itself or its parent); a long id cut, with a digest of the whole id after a ``%-`` that
    percent-escaping never produces, so two ids never share a segment."""
    quoted = urllib.parse.quote(run_id, safe="-._")
    if quoted in (".", ".."):
        return "%2E" * len(quoted)
    if len(quoted) > _MAX_RUN_SEGMENT:
        digest = hashlib.sha256(run_id.encode("utf-8", "surrogatepass")).hexdigest()[:40]
        return f"{quoted[:_MAX_RUN_SEGMENT - 42]}%-{digest}"
    return quoted


def manifest_key(run_id: str, last_lsn: int) -> str:
    """The object key of the manifest of ``run_id`` covering the log up to ``last_lsn``.

    One key per tiering of a run (a run rehydrated and tiered again covers a longer log), so a manifest is
    never replaced by another; the run id stays one path segment whatever it holds (:func:`_run_segment`).
    """
    return f"manifests/{_run_segment(run_id)}/{last_lsn:012d}.json"


def pack_key(run_id: str, last_lsn: int, index: int) -> str:
    """The object key of pack ``index`` of the move of ``run_id`` covering the log up to ``last_lsn``: beside its
    manifest's key (one directory per run), so one move's packs share a directory."""
    return f"packs/{_run_segment(run_id)}/{last_lsn:012d}-{index:04d}.pack"


@dataclass(frozen=True)
class ObjectInfo:
    """What the cold store says about an object without reading its bytes.

    ``sha256`` is the hex digest the store itself vouches for (S3's stored SHA-256 checksum), or ``None``
    when the store keeps none (a local directory: checking it means reading it back).
    """

    key: str
    size: int
    sha256: str | None


@dataclass(frozen=True)
class ManifestWrite:
    """Outcome of a conditional manifest write: ``created`` False means identical bytes were already there."""

    key: str
    created: bool


@runtime_checkable
class ColdStore(Protocol):
    """The small interface every cold store implements.

    ``url`` is the canonical target recorded in the log (``file:///abs/path`` or ``s3://bucket/prefix``);
    ``endpoint_url`` is where an S3 store is reached (recorded in the log beside the target, so every later
    read goes there), None for a local directory. Every method raises :class:`~kvjudge.errors.ColdStoreError` (one actionable line) when the store is
    unreachable or refuses; none of them ever deletes a stored object.
    """

    url: str
    endpoint_url: str | None

    def check(self) -> None:
        """Raise ColdStoreError unless the store is reachable and writable-looking."""

    def put_blob(self, ref: str, body: BlobBody) -> None:
        """Store ``body`` (bytes, or its chunks in order) under its ref's key, provided it hashes to ``ref``
        (IntegrityError otherwise, and nothing is stored: a cold store never holds bytes that are not their ref):
        complete or absent after a crash, durable once :meth:`flush` (or :meth:`put_manifest`) returned."""

    def put_pack(self, key: str, bodies: Iterable[tuple[str, BlobBody]]) -> None:
        """Store the concatenation of ``bodies`` (``(ref, body)`` in order) under ``key``, provided each body hashes
        to its ref (IntegrityError otherwise, and nothing is stored): complete or absent after a crash, durable
        once :meth:`flush` (or :meth:`put_manifest`) returned."""

    def flush(self) -> None:
        """Make every object put (or found by :meth:`stat_object`) so far durable."""

    def stat_object(self, key: str) -> ObjectInfo | None:
        """Size (and the store's own checksum when it keeps one) of the object at ``key``, None when absent. An
        object found is made durable by the next :meth:`flush` like one put (another process may have written it
        unsynced)."""

    def stat_blob(self, ref: str) -> ObjectInfo | None:
        """:meth:`stat_object` of the blob of ``ref``."""

    def get_blob(self, ref: str) -> bytes | None:
        """The blob's bytes, checked against the ref (IntegrityError on mismatch), None when absent."""

    def get_range(self, ref: str, key: str, offset: int, size: int) -> bytes | None:
        """The ``size`` bytes at ``offset`` of the object at ``key`` (a body in a pack), checked against ``ref``
        (IntegrityError on mismatch, a short object included), None when the object is absent."""

    def put_manifest(self, key: str, data: bytes) -> ManifestWrite:
        """Create the manifest at ``key`` unless it exists; if it does, it must hold exactly ``data``.

        Every blob put before is durable first: a manifest present means its move's blobs are there."""

    def get_manifest(self, key: str) -> bytes | None:
        """The manifest's bytes, None when absent."""

    def discard_partial(self, keys: Iterable[str]) -> int:
        """Remove what writes of ``keys`` killed mid-way left behind; returns how many objects went.

        A local directory may hold temp files of a dead writer; S3 has nothing to discard (a PUT applies
        whole or not at all).
        """


def _chunks(body: BlobBody) -> Iterable[bytes]:
    return (body,) if isinstance(body, bytes | bytearray | memoryview) else body


def _not_the_ref(ref: str, where: str) -> IntegrityError:
    """The bytes handed over to be stored under ``ref`` are not that ref (a corrupt source): nothing is stored."""
    return IntegrityError(f"the bytes given for {short(ref)} do not hash to it; nothing was stored in {where}")


def _checked(ref: str, body: bytes, where: str) -> bytes:
    """``body`` if it hashes to ``ref``; a cold store must never hand back bytes that are not the ref."""
    if ref_of(body) != ref:
        raise IntegrityError(
            f"cold store object {where} does not hash to {ref}: the remote copy was altered; "
            "restore it from a backup or re-tier the run from a rehydrated copy"
        )
    return body


# --------------------------------------------------------------------------------------------------
# Local directory


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
                    for chunk in _chunks(body):
                        if digest is not None:
                            digest.update(chunk)
                        view = memoryview(chunk)
                        while view:
                            view = view[os.write(fd, view):]
                    if digest is not None and ref is not None and digest.hexdigest() != ref_hex(ref):
                        raise _not_the_ref(ref, self.url)
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
        return None if body is None else _checked(ref, body, str(self._path(key)))

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
        return _checked(ref, body, f"{path} at offset {offset}")

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
            _compare_manifest(key, data, self._read(key), str(final))
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


def _compare_manifest(key: str, wanted: bytes, existing: bytes | None, where: str) -> None:
    if existing != wanted:
        raise ColdStoreError(
            f"manifest {where} already exists with different content; the cold store holds another "
            "tiering of this run — inspect it, or tier to another target with --to"
        )


# --------------------------------------------------------------------------------------------------
# S3


class S3ColdStore:
    """An S3-compatible bucket (AWS, SeaweedFS, MinIO, …) as cold store, through boto3.

    Blobs are uploaded with their SHA-256 as the S3 checksum (``ChecksumSHA256``), so the server refuses a
    body that does not hash to its ref and keeps the checksum for a cheap read-back check (HEAD). Manifests
    are written with ``If-None-Match: *``; if one exists it is read back and compared. Credentials, region
    and (when ``endpoint_url`` is None) the endpoint come from boto3's usual sources: ``AWS_*`` environment
    variables, ``~/.aws``, instance roles; ``endpoint_url`` is then the endpoint boto3 resolved.
    """

    def __init__(self, bucket: str, prefix: str = "", *, endpoint_url: str | None = None,
                 client: Any = None) -> None:
        if not bucket:
            raise UsageError("an s3:// target needs a bucket: s3://BUCKET[/PREFIX]")
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.url = f"s3://{bucket}/{self.prefix}" if self.prefix else f"s3://{bucket}"
        self._client = client if client is not None else _make_s3_client(endpoint_url)
        # The endpoint really used (boto3's resolution when none was given): the one a move records.
        self.endpoint_url: str | None = endpoint_url or self._client.meta.endpoint_url

    def __repr__(self) -> str:
        return f"S3ColdStore({self.url!r}, endpoint_url={self.endpoint_url!r})"

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def _where(self) -> str:
        return f"{self.url} at {self.endpoint_url}"

    def _fail(self, exc: Exception, action: str) -> ColdStoreError:
        """One actionable line for any boto3/botocore failure."""
        from botocore.exceptions import ClientError, NoCredentialsError, ParamValidationError

        if isinstance(exc, NoCredentialsError):
            return ColdStoreError(
                f"no S3 credentials to {action} {self._where()}; set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"
            )
        if isinstance(exc, ClientError):
            code = exc.response.get("Error", {}).get("Code", "?")
            if code == "NoSuchBucket":
                return ColdStoreError(f"bucket {self.bucket!r} does not exist at {self._where()}; create it first")
            if code in {"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch"}:
                return ColdStoreError(f"S3 refused to {action} {self._where()} ({code}); check the credentials")
            message = exc.response.get("Error", {}).get("Message", "")
            return ColdStoreError(f"S3 failed to {action} {self._where()}: {code} {message}".strip())
        if isinstance(exc, ParamValidationError):
            return ColdStoreError(f"bad S3 request to {action} {self._where()}: {exc}")
        return ColdStoreError(
            f"cannot reach the cold store to {action} {self._where()} ({type(exc).__name__}: {exc}); "
            "check --endpoint-url / AWS_ENDPOINT_URL and that the server is up"
        )

    @staticmethod
    def _errors() -> tuple[type[Exception], ...]:
        from botocore.exceptions import BotoCoreError, ClientError

        return (BotoCoreError, ClientError)

    @staticmethod
    def _status(exc: Exception) -> int | None:
        response = getattr(exc, "response", None) or {}
        return response.get("ResponseMetadata", {}).get("HTTPStatusCode")

    def check(self) -> None:
        try:
            self._client.head_bucket(Bucket=self.bucket)
        except self._errors() as exc:
            if self._status(exc) == 404:
                raise ColdStoreError(f"bucket {self.bucket!r} does not exist at {self._where()}; create it first") from exc
            raise self._fail(exc, "reach") from exc

    def put_blob(self, ref: str, body: BlobBody) -> None:
        data = b"".join(_chunks(body))
        digest = hashlib.sha256(data).digest()
        if digest.hex() != ref_hex(ref):
            raise _not_the_ref(ref, self.url)
        # The server checks it too: a body that does not hash to its checksum is refused.
        checksum = base64.b64encode(digest).decode()
        try:
            response = self._client.put_object(
                Bucket=self.bucket, Key=self._key(blob_key(ref)), Body=data, ChecksumSHA256=checksum
            )
        except self._errors() as exc:
            raise self._fail(exc, f"upload {ref} to") from exc
        echoed = response.get("ChecksumSHA256")
        if echoed is not None and echoed != checksum:
            raise ColdStoreError(f"{self._where()} acknowledged {ref} with checksum {echoed}; refusing to trust it")

    def put_pack(self, key: str, bodies: Iterable[tuple[str, BlobBody]]) -> None:
        chunks: list[bytes] = []
        pack = hashlib.sha256()
        for ref, body in bodies:
            digest = hashlib.sha256()
            for chunk in _chunks(body):
                digest.update(chunk)
                pack.update(chunk)
                chunks.append(chunk)
            if digest.hexdigest() != ref_hex(ref):
                raise _not_the_ref(ref, self.url)
        # The whole pack's SHA-256 as its checksum: the server refuses bytes that are not the ones hashed here.
        checksum = base64.b64encode(pack.digest()).decode()
        try:
            response = self._client.put_object(Bucket=self.bucket, Key=self._key(key), Body=b"".join(chunks),
                                               ChecksumSHA256=checksum)
        except self._errors() as exc:
            raise self._fail(exc, f"upload {key} to") from exc
        echoed = response.get("ChecksumSHA256")
        if echoed is not None and echoed != checksum:
            raise ColdStoreError(f"{self._where()} acknowledged {key} with checksum {echoed}; refusing to trust it")

    def stat_blob(self, ref: str) -> ObjectInfo | None:
        return self.stat_object(blob_key(ref))

    def stat_object(self, key: str) -> ObjectInfo | None:
        try:
            head = self._client.head_object(Bucket=self.bucket, Key=self._key(key), ChecksumMode="ENABLED")
        except self._errors() as exc:
            if self._status(exc) == 404:
                return None
            raise self._fail(exc, f"stat {key} in") from exc
        checksum = head.get("ChecksumSHA256")
        digest = base64.b64decode(checksum).hex() if checksum and "-" not in checksum else None
        return ObjectInfo(key=key, size=int(head["ContentLength"]), sha256=digest)

    def _get(self, key: str, what: str) -> bytes | None:
        try:
            response = self._client.get_object(Bucket=self.bucket, Key=self._key(key))
            return response["Body"].read()
        except self._errors() as exc:
            if self._status(exc) == 404:
                return None
            raise self._fail(exc, f"read {what} from") from exc

    def get_blob(self, ref: str) -> bytes | None:
        body = self._get(blob_key(ref), ref)
        return None if body is None else _checked(ref, body, f"{self.url}/{blob_key(ref)}")

    def get_range(self, ref: str, key: str, offset: int, size: int) -> bytes | None:
        where = f"{self.url}/{key} at offset {offset}"
        if size == 0:  # no byte range names nothing: the object need only exist
            return None if self.stat_object(key) is None else _checked(ref, b"", where)
        try:
            response = self._client.get_object(Bucket=self.bucket, Key=self._key(key),
                                               Range=f"bytes={offset}-{offset + size - 1}")
            body = response["Body"].read()
        except self._errors() as exc:
            if self._status(exc) == 404:
                return None
            if self._status(exc) == 416:  # the object ends before the range starts: it was cut
                return _checked(ref, b"", where)
            raise self._fail(exc, f"read {ref} from") from exc
        return _checked(ref, body, where)

    def flush(self) -> None:
        pass  # every acknowledged PUT is durable already

    def put_manifest(self, key: str, data: bytes) -> ManifestWrite:
        checksum = base64.b64encode(hashlib.sha256(data).digest()).decode()
        try:
            self._client.put_object(Bucket=self.bucket, Key=self._key(key), Body=data,
                                    ChecksumSHA256=checksum, IfNoneMatch="*",
                                    ContentType="application/json")
            created = True
        except self._errors() as exc:
            # 412: it exists. 409: a concurrent conditional write is in flight (S3 ConditionalRequestConflict).
            if self._status(exc) not in (412, 409):
                raise self._fail(exc, f"write manifest {key} to") from exc
            created = False
        if not created:
            _compare_manifest(key, data, self._get(key, "manifest"), f"{self.url}/{key}")
        return ManifestWrite(key=key, created=created)

    def get_manifest(self, key: str) -> bytes | None:
        return self._get(key, "manifest")

    def discard_partial(self, keys: Iterable[str]) -> int:
        return 0  # a PUT applies whole or not at all: nothing partial to discard


def _make_s3_client(endpoint_url: str | None) -> Any:
    import boto3
    from botocore.config import Config as BotoConfig

    # Few retries and short timeouts: a cold store that is down must fail in seconds with a clear error,
    # not hang a `kvjudge tier` for minutes. Path-style addressing works with every S3-compatible server.
    config = BotoConfig(
        retries={"max_attempts": 3, "mode": "standard"},
        connect_timeout=5,
        read_timeout=60,
        s3={"addressing_style": "path"},
        max_pool_connections=16,
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
    )
    session = boto3.session.Session()
    region = session.region_name or "us-east-1"
    return session.client("s3", endpoint_url=endpoint_url, region_name=region, config=config)


# --------------------------------------------------------------------------------------------------


def open_cold_store(url: str, *, endpoint_url: str | None = None, create: bool = False) -> ColdStore:
    """The cold store named by ``url``: ``file:///abs/path`` (or a plain path) or ``s3://bucket[/prefix]``.

    ``endpoint_url`` applies to ``s3://`` only (None: boto3's own resolution, e.g. ``AWS_ENDPOINT_URL``).
    ``create`` lets a local directory be created on first use (only for the built-in default target; an
    explicit directory that is missing is more likely an unmounted disk than a wish to create it).
    """
    parsed = urllib.parse.urlparse(url)
    if parsed.scheme == "s3":
        return S3ColdStore(parsed.netloc, urllib.parse.unquote(parsed.path), endpoint_url=endpoint_url)
    if parsed.scheme == "file":
        if parsed.netloc not in ("", "localhost"):
            raise UsageError(f"{url}: a file:// target must be local (file:///abs/path)")
        return LocalDirColdStore(urllib.parse.unquote(parsed.path), create=create)
    if parsed.scheme == "" and url:
        return LocalDirColdStore(url, create=create)
    raise UsageError(f"unsupported cold store {url!r}: use file:///path or s3://bucket/prefix")
