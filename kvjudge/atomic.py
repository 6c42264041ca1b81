"""Atomic file replacement: what the capability cache and the checksum memo both need.

Write to a temp file beside the target, fsync it, rename it over the target, fsync the directory: a reader
sees the old bytes or the new bytes, never a torn file, and the rename survives a power cut.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def atomic_write(path: Path, payload: bytes) -> None:
    """Replace ``path`` with ``payload`` atomically and durably (the parent directory must exist)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(payload)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
