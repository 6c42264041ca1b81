"""Content-addressed refs: ``ref = "sha256:<hex of the body's bytes>"``.

The bodies themselves live in the store (:class:`kvjudge.retention.store.BlobStore`).
"""

from __future__ import annotations

import hashlib
import re

from kvjudge.errors import UsageError

REF_PREFIX = "sha256:"
_REF_RE = re.compile(r"^sha256:[0-9a-f]{64}$")


def ref_of(body: bytes) -> str:
    """The ref of ``body``."""
    return REF_PREFIX + hashlib.sha256(body).hexdigest()


def check_ref(ref: str) -> str:
    """``ref`` unchanged, or a UsageError when it is not ``sha256:<64 hex>``."""
    if not isinstance(ref, str) or not _REF_RE.match(ref):
        raise UsageError(f"{ref!r} is not a blob ref; refs look like sha256:<64 hex digits>")
    return ref


def short(ref: str) -> str:
    """``sha256:ab12cd34ef56…`` for messages."""
    return ref[: len(REF_PREFIX) + 12] + "…"
