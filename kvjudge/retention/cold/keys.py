"""Where each object of a cold store lives: its key, derived from what it holds (a blob from its ref, a pack and
a manifest from the move that wrote them), the same in a directory and in a bucket."""

from __future__ import annotations

import hashlib
import urllib.parse

from kvjudge.retention.blobs import REF_PREFIX, check_ref


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
