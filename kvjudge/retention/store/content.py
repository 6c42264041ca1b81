"""Bodies as both blob stores take and give them, whatever database holds them: a body checked against the ref its
caller expects before anything is written, and a body's text read locally, else through the fallback."""

from __future__ import annotations

from collections.abc import Callable

from kvjudge.errors import IntegrityError, UsageError
from kvjudge.retention.blobs import ref_of, short
from kvjudge.retention.store.interfaces import FallbackReader


def checked_body(body: bytes, expected_ref: str | None) -> tuple[str, bytes]:
    """``(ref, bytes)`` of ``body``; IntegrityError when it does not hash to ``expected_ref`` (an import that names
    refs), UsageError when it is not bytes."""
    if not isinstance(body, bytes | bytearray):
        raise UsageError("a blob body must be bytes")
    data = bytes(body)
    ref = ref_of(data)
    if expected_ref is not None and expected_ref != ref:
        raise IntegrityError(f"body does not hash to {short(expected_ref)} (it hashes to {short(ref)}); "
                             f"the import is corrupt — re-export it")
    return ref, data


def text_of(ref: str, local: Callable[[str], bytes | None], fallback: FallbackReader | None) -> str | None:
    """The body of ``ref`` as text: ``local``, else through ``fallback`` (the cold store), else None."""
    body = local(ref)
    if body is None and fallback is not None:
        body = fallback(ref)
    return None if body is None else body.decode("utf-8")
