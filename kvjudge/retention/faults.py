"""Named crash points for tests that kill a real process mid-operation.

``fault_point(name)`` does nothing unless the environment variable ``KVJUDGE_FAULTS`` (comma-separated)
names ``name``; then the process sends itself SIGKILL on the spot, so no ``finally`` block, no
SQLite rollback handler and no atexit hook runs — exactly what a power cut or OOM kill does.

Points used by the store and reduction (tiering adds its own with the same function):

- ``<label>.txn`` inside every write transaction, after its statements and before COMMIT, where
  ``<label>`` is one of ``ingest``, ``append``, ``put_summary``, ``commit_reduction``, ``delete_body``,
  ``rebuild``;
- ``after_put_summary``, ``after_commit_reduction``, ``after_delete_body`` between the three durable
  steps of a reduction;
- ``copy_run.txn``, ``after_copy_run`` and ``copy_caches.txn`` in a store copy (before a run's commit at the
  destination, after it, before a batch of caches' commit).
"""

from __future__ import annotations

import os
import signal

FAULTS_ENV = "KVJUDGE_FAULTS"

REDUCTION_POINTS = (
    "put_summary.txn",
    "after_put_summary",
    "commit_reduction.txn",
    "after_commit_reduction",
    "delete_body.txn",
    "after_delete_body",
)


def armed(name: str) -> bool:
    """True when ``KVJUDGE_FAULTS`` names ``name``."""
    value = os.environ.get(FAULTS_ENV, "")
    return bool(value) and name in {part.strip() for part in value.split(",")}


def fault_point(name: str) -> None:
    """SIGKILL this process when ``KVJUDGE_FAULTS`` names ``name`` (a test hook; a no-op otherwise)."""
    if armed(name):
        os.kill(os.getpid(), signal.SIGKILL)
