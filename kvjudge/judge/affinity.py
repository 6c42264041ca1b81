"""The affinity key of a group of calls (one pair's orders, or every call a protocol makes of one pair): the same
for every call of the group and for the same group in a later command, so that behind a router every call of it
meets the replica that holds its prefix (sent as the ``X-Session-ID`` header and the ``user`` field:
:mod:`kvjudge.server_client.client`)."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from kvjudge.judge.prompt import Prompt


def affinity_key(prompts: Sequence[Prompt]) -> str:
    """``kvjudge-`` and 16 hex digits of the sha256 of the group's prompts (in any order: the same set, the same
    key). It names no run and carries no text."""
    digests = sorted(hashlib.sha256("".join(p.segments).encode("utf-8")).digest() for p in prompts)
    return "kvjudge-" + hashlib.sha256(b"".join(digests)).hexdigest()[:16]


__all__ = ["affinity_key"]
