"""Runs read straight from an S3 bucket: ``kvjudge ingest s3://bucket/prefix/`` (or ``s3://bucket/key`` of one
file), and ``--results s3://…``.

The objects under a prefix are listed page by page and downloaded as they are listed, a few at a time
(:data:`THREADS`), into a scratch folder that mirrors their keys (``<scratch>/<bucket>/<key>``): each is streamed
to disk in chunks, so memory stays bounded whatever an object's size. The import then walks that folder as it
walks any directory — the same format registry; a run file's companions are the objects beside it under the same
"folder"; a Harbor job's trial folders and an inspect log directory are folders of objects — and every path it
names (in its report and in an error) is written back as the object's URL. One object's key is read with the
objects beside it (and one folder up) that can be its companions, as a file named on the command line is; a key
that names no object is read as a prefix. Nothing is written to the bucket. The scratch folder is removed after
the import; one a killed import left is removed by the next (its process is gone).

Credentials, region and (without ``--endpoint-url``) the endpoint come from boto3's chain
(:mod:`kvjudge.retention.s3client`): kvjudge writes none of them anywhere.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import tempfile
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from kvjudge.errors import IngestError, KvjudgeError
from kvjudge.retention.ingest import harbor, registry
from kvjudge.retention.s3client import failure_line, http_status, make_s3_client, s3_errors

SCHEME = "s3://"
#: Objects downloaded at once; each streams in :data:`CHUNK_BYTES` pieces, so a few chunks are all it holds.
THREADS = 4
CHUNK_BYTES = 1 << 20
#: One retry at most: an endpoint that is down fails in seconds (the connect timeout), not after minutes.
MAX_ATTEMPTS = 2
_SCRATCH_PREFIX = "kvjudge-s3-"
#: ``kvjudge-s3-<host>-<pid>-<random>``: the host keeps one machine from sweeping another's through a shared /tmp.
_SCRATCH = re.compile(rf"^{_SCRATCH_PREFIX}(?P<host>.+)-(?P<pid>\d+)-[a-z0-9_]+$")
# Bucket names as S3 and its look-alikes accept them (AWS's rules are stricter; the server has the last word).
_BUCKET = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{1,254}$")
_USAGE = "write s3://BUCKET/PREFIX/ (the runs under a prefix) or s3://BUCKET/KEY (one file)"

#: ``progress(objects, description)``: objects downloaded since the last call, and what the download is at.
Progress = Callable[[int, str], None]
Report = TypeVar("Report")


def is_s3_url(value: object) -> bool:
    """Whether a path given on the command line names an S3 object or prefix."""
    return isinstance(value, str) and value[: len(SCHEME)].lower() == SCHEME


@dataclass(frozen=True)
class S3Location:
    """``s3://bucket/key``: ``key`` is an object's key, a prefix (ending in ``/``) or empty (the whole bucket)."""

    bucket: str
    key: str

    @property
    def url(self) -> str:
        return f"{SCHEME}{self.bucket}/{self.key}"

    @property
    def is_prefix(self) -> bool:
        return self.key == "" or self.key.endswith("/")


def parse_s3_url(value: str) -> S3Location:
    """``s3://BUCKET[/KEY]`` → S3Location; IngestError (one line) when it is malformed."""
    bucket, _, key = value[len(SCHEME):].partition("/")
    if not _BUCKET.match(bucket):
        raise IngestError(f"{value}: not an S3 URL kvjudge reads (bucket {bucket!r}); {_USAGE}")
    if not _is_safe_key(key.rstrip("/")) and key.strip("/"):
        raise IngestError(f"{value}: an S3 key with an empty, '.' or '..' part; {_USAGE}")
    return S3Location(bucket, key.lstrip("/") if key.strip("/") else "")


def _is_safe_key(key: str) -> bool:
    """A key that is a relative path inside the scratch folder (no empty, ``.`` or ``..`` part)."""
    return bool(key) and all(part not in ("", ".", "..") for part in key.split("/"))


@dataclass
class StagedInputs:
    """The paths and ``--results`` values of an import with every S3 URL replaced by its local mirror."""

    paths: list[str]
    results: list[str]
    root: Path | None = None  # the scratch folder (None: no S3 URL was given)
    objects: int = 0
    bytes: int = 0
    notes: list[str] = field(default_factory=list)

    def url_of(self, text: str) -> str:
        """``text`` with every path of the scratch folder written as its object's URL."""
        return text if self.root is None else text.replace(f"{self.root}/", SCHEME)

    def with_urls(self, report: Report) -> Report:
        """An import's report (:class:`~.importer.IngestReport`) naming objects by their URLs, with the notes of the
        download."""
        for name in ("companion_files", "settings_files", "notes", "skipped", "results", "unmatched_results"):
            setattr(report, name, self._urls_in(getattr(report, name)))
        getattr(report, "notes").extend(self.notes)
        return report

    def _urls_in(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.url_of(value)
        if isinstance(value, list):
            return [self._urls_in(item) for item in value]
        if isinstance(value, dict):
            return {key: self._urls_in(item) for key, item in value.items()}
        return value


@contextlib.contextmanager
def staged_inputs(paths: Sequence[Any], results: Sequence[str] = (), *, endpoint_url: str | None = None,
                  progress: Progress | None = None) -> Iterator[StagedInputs]:
    """``paths`` and ``results`` with their S3 URLs downloaded (see the module docstring); the scratch folder is
    removed on leaving, and an error raised inside names objects by their URLs."""
    wanted = [value for value in paths if is_s3_url(value)]
    graded = [_results_url(value) for value in results]
    if not wanted and not any(url for _, url in graded):
        yield StagedInputs(paths=list(paths), results=list(results))
        return
    locations = {value: parse_s3_url(value) for value in [*wanted, *(url for _, url in graded if url)]}
    _sweep_scratch()
    root = Path(tempfile.mkdtemp(prefix=f"{_SCRATCH_PREFIX}{socket.gethostname()}-{os.getpid()}-"))
    staged = StagedInputs(paths=[], results=[], root=root)
    try:
        with _Downloader(make_s3_client(endpoint_url, max_attempts=MAX_ATTEMPTS, max_pool_connections=2 * THREADS),
                         root, staged, progress) as downloader:
            local = {value: downloader.fetch(location) for value, location in locations.items()}
        staged.paths = [str(local[value]) if is_s3_url(value) else value for value in paths]
        staged.results = [value if url is None else f"{agent}={local[url]}" if agent else str(local[url])
                          for value, (agent, url) in zip(results, graded, strict=True)]
        yield staged
    except KvjudgeError as exc:
        exc.args = (staged.url_of(str(exc)),)
        raise
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _results_url(value: str) -> tuple[str | None, str | None]:
    """A ``--results`` value's agent and S3 URL (``[AGENT=]s3://…``); ``(None, None)`` for a local one."""
    if is_s3_url(value):
        return None, value
    agent, _, rest = value.partition("=")
    return (agent, rest) if agent and is_s3_url(rest) else (None, None)


def _sweep_scratch() -> None:
    """Remove the scratch folders of imports on this host that were killed (their process is gone)."""
    base, host = Path(tempfile.gettempdir()), socket.gethostname()
    with contextlib.suppress(OSError):
        for entry in base.iterdir():
            found = _SCRATCH.match(entry.name)
            if found is None or found["host"] != host or not entry.is_dir() or _alive(int(found["pid"])):
                continue
            shutil.rmtree(entry, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True


class _Downloader:
    """Objects downloaded into the scratch folder by a few threads, each key once."""

    def __init__(self, client: Any, root: Path, staged: StagedInputs, progress: Progress | None) -> None:
        self.client = client
        self.root = root
        self.staged = staged
        self.progress = progress
        self.endpoint = client.meta.endpoint_url
        self._pool = ThreadPoolExecutor(max_workers=THREADS, thread_name_prefix="kvjudge-s3")
        self._pending: set[Future[int]] = set()
        self._fetched: set[tuple[str, str]] = set()
        self._unsafe: list[str] = []

    def __enter__(self) -> _Downloader:
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            if exc[0] is None:
                self._drain(0)
        finally:
            for future in self._pending:
                future.cancel()
            self._pool.shutdown(wait=True)
        if self._unsafe:
            self.staged.notes.append(f"{len(self._unsafe)} object(s) passed over (a key with an empty, '.' or '..' "
                                     f"part is no path): {', '.join(self._unsafe[:5])}")

    def fetch(self, location: S3Location) -> Path:
        """Download what ``location`` names; the local path that stands for it (a folder for a prefix)."""
        if not location.is_prefix and self._head(location):
            self._download_all(location.bucket, [location.key, *self._beside(location)])
            return self.root / location.bucket / location.key
        prefix = location if location.is_prefix else S3Location(location.bucket, location.key + "/")
        count = 0
        for key in self._list(prefix):
            count += 1
            self._download_all(prefix.bucket, [key])
        if count == 0:
            what = "the bucket holds no objects" if not prefix.key else \
                "no object has this key or prefix" if prefix is not location else "no objects under this prefix"
            raise IngestError(f"{location.url}: {what} at {self.endpoint}; nothing to import ({_USAGE})")
        folder = self.root / prefix.bucket / prefix.key
        folder.mkdir(parents=True, exist_ok=True)  # a prefix of passed-over keys only: walked, found empty
        return folder

    # ------------------------------------------------------------------ listing
    def _head(self, location: S3Location) -> bool:
        """Whether ``location`` is one object (a 404 only says it is none: it may be a prefix)."""
        try:
            self.client.head_object(Bucket=location.bucket, Key=location.key)
        except s3_errors() as exc:
            if http_status(exc) == 404:
                return False
            raise self._failure(exc, "read", location) from None
        return True

    def _list(self, location: S3Location, *, delimiter: str | None = None) -> Iterator[str]:
        """The keys under ``location``, page by page (only those directly in it with ``delimiter``)."""
        paginator = self.client.get_paginator("list_objects_v2")
        options = {"Bucket": location.bucket, "Prefix": location.key}
        if delimiter:
            options["Delimiter"] = delimiter
        try:
            for page in paginator.paginate(**options):
                for item in page.get("Contents", ()):
                    yield item["Key"]
        except s3_errors() as exc:
            raise self._failure(exc, "list", location) from None

    def _beside(self, location: S3Location) -> list[str]:
        """The objects that may be companions of one object (those :func:`~.sources.walk` could read with it): in
        its folder and one up, those a format names as companions; an ATIF trajectory's continuations and, in a
        trial's ``agent/``, the trial's result and config."""
        folder = location.key.rpartition("/")[0]
        folders = [folder, folder.rpartition("/")[0]] if folder else [folder]
        trajectory = harbor.is_trajectory_name(location.key)
        trial = folder.rpartition("/")[0] if folder.rpartition("/")[2] == harbor.AGENT_DIR else None
        found = []
        for index, where in enumerate(folders):
            for key in self._list(S3Location(location.bucket, f"{where}/" if where else ""), delimiter="/"):
                name = key.rpartition("/")[2]
                base = name[:-3] if name.endswith(".gz") else name
                companion = registry.companion(base) is not None
                sibling = index == 0 and trajectory and harbor.is_trajectory_name(name)
                trial_head = trial is not None and where == trial and name in (harbor.RESULT, harbor.CONFIG)
                if key != location.key and (companion or sibling or trial_head):
                    found.append(key)
        return found

    # ------------------------------------------------------------------ downloading
    def _download_all(self, bucket: str, keys: list[str]) -> None:
        for key in keys:
            if key.endswith("/") or (bucket, key) in self._fetched:
                continue  # a "folder" marker object; a key fetched already (named twice, or as results too)
            self._fetched.add((bucket, key))
            if not _is_safe_key(key):
                self._unsafe.append(f"{SCHEME}{bucket}/{key}")
                continue
            self._drain(2 * THREADS - 1)  # a bounded queue: listing runs ahead of the downloads by a few keys
            self._pending.add(self._pool.submit(self._download, bucket, key))

    def _drain(self, keep: int) -> None:
        """Wait until at most ``keep`` downloads are pending; the first failure is raised."""
        while len(self._pending) > keep:
            done, self._pending = wait(self._pending, return_when=FIRST_COMPLETED)
            for future in done:
                self.staged.bytes += future.result()
                self.staged.objects += 1
                if self.progress is not None:
                    self.progress(1, f"downloading: {self.staged.objects} object(s), "
                                     f"{self.staged.bytes / 1e6:.1f} MB")

    def _download(self, bucket: str, key: str) -> int:
        """One object streamed to its mirror path (a ``.part`` file renamed once whole); its size."""
        target = self.root / bucket / key
        location = S3Location(bucket, key)
        partial = target.with_name(target.name + ".part")
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            response = self.client.get_object(Bucket=bucket, Key=key)
            expected = int(response.get("ContentLength", -1))
            written = 0
            with partial.open("wb") as handle:
                for chunk in response["Body"].iter_chunks(CHUNK_BYTES):
                    handle.write(chunk)
                    written += len(chunk)
        except s3_errors() as exc:
            raise self._failure(exc, "download", location) from None
        except OSError as exc:
            raise IngestError(f"{location.url}: cannot be kept in the scratch folder ({exc.strerror or exc}; an "
                              f"object and a prefix of the same name, or the disk is full)") from None
        if expected >= 0 and written != expected:
            raise IngestError(f"{location.url}: {written} of {expected} bytes arrived from {self.endpoint}; "
                              f"run the same command again")
        partial.replace(target)
        return written

    def _failure(self, exc: Exception, action: str, location: S3Location) -> IngestError:
        return IngestError(failure_line(exc, action=action, where=f"{location.url} at {self.endpoint}",
                                        bucket=location.bucket, missing="check the bucket's name and --endpoint-url",
                                        server="the S3 endpoint"))
