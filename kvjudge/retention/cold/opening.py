"""Which cold store a target names: ``file://`` (or a plain path) a directory, ``s3://`` a bucket."""

from __future__ import annotations

import urllib.parse

from kvjudge.errors import UsageError
from kvjudge.retention.cold.interface import ColdStore, ColdTarget
from kvjudge.retention.cold.local import LocalDirColdStore
from kvjudge.retention.cold.s3 import S3ColdStore


def open_cold_store(url: ColdTarget, *, endpoint_url: str | None = None, create: bool = False) -> ColdStore:
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
