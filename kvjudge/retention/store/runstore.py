"""The run store: one SQLite file holding the append-only event log, the blobs, derived projections and caches.

:class:`Store` is one object for callers, made of the store's jobs, each in its own module: the file and its
transactions (:mod:`.database`, tables and migrations in :mod:`.schema`), the event log (:mod:`.log`), the
projection of each run (:mod:`.projection`), named read queries (:mod:`.queries`), the token-count and judgment
caches (:mod:`.caches`) and the blobs (:mod:`.blobs`). Here: what joins them — bodies in and out, and the
ingest front.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvjudge.retention.store.blobs import BlobStore
from kvjudge.retention.store.queries import Queries

if TYPE_CHECKING:
    from kvjudge.retention.ingest import IngestReport, ParsedRun

#: A reader for bodies that are not local (tiering plugs the cold store in): ref → bytes or None.
FallbackReader = Callable[[str], "bytes | None"]


class Store(Queries):
    """A kvjudge run store. Open with :meth:`Store.open`; use as a context manager."""

    def __init__(self, conn: sqlite3.Connection, path: Path, fallback: FallbackReader | None = None) -> None:
        super().__init__(conn, path)
        self.blobs = BlobStore(conn)
        #: Reader for bodies that are not local (e.g. the cold store); set by tiering.
        self.fallback = fallback

    @classmethod
    def open(cls, path: str | os.PathLike[str] | None = None, *,  # type: ignore[override]
             fallback: FallbackReader | None = None) -> Store:
        """Open (creating when absent) the store at ``path`` (None: ``data_dir()/store.sqlite``)."""
        return super().open(path, fallback=fallback)

    # --------------------------------------------------------------------- bodies
    def put_blob(self, body: bytes, *, label: str = "put_blob") -> str:
        """Put one body in its own transaction; returns its ref."""
        with self.transaction(label):
            return self.blobs.put(body)

    def text(self, ref: str) -> str | None:
        """The body of ``ref`` as text: local, else through :attr:`fallback` (cold store), else None."""
        body = self.blobs.get(ref)
        if body is None and self.fallback is not None:
            body = self.fallback(ref)
        return None if body is None else body.decode("utf-8")

    def release_bodies(self, refs: Iterable[str], *, label: str = "delete_body", scrub: bool = True,
                       durable: bool = True) -> list[str]:
        """Delete the local bodies of ``refs`` that no run still reads locally; returns those deleted.

        A body shared by two runs stays as long as the log of either still says it is local there.
        Call only after the event explaining the loss (Reduced, Dropped, Tiered) has committed. ``scrub=False``
        for bodies that live on elsewhere (tiered): their freed pages are zeroed only when that is free to do.
        ``durable=False``: the deletion does not wait for the disk (see ``transaction``; a deletion lost at a power
        cut leaves a body the log explains, deleted again by the next run).
        """
        deleted: list[str] = []
        with self.blobs.scrubbing(scrub), self.transaction(label, durable=durable):
            for ref in dict.fromkeys(refs):
                if not self.read_locally(ref) and self.blobs.delete_body(ref):
                    deleted.append(ref)
        return deleted

    # --------------------------------------------------------------------- ingest
    def ingest(self, paths: Iterable[str | os.PathLike[str]], **options: Any) -> IngestReport:
        """Import run files and directories; see :func:`kvjudge.retention.ingest.ingest_sources` for ``options``
        (``fmt``, ``tenant``, ``agent``, ``results``, ``skip_bad``, ``repair_text``, ``progress``).

        Each file is read once and stored whole or not at all: a malformed document raises IngestError naming the
        file, the line and the JSON path, and nothing of the open batch is written (batches committed before it
        stay, the message says how many runs). Runs already stored with the same content count as already present.
        """
        from kvjudge.retention.ingest import ingest_paths

        return ingest_paths(self, paths, **options)

    def ingest_file(self, path: str | os.PathLike[str], tenant: str | None = None, fmt: str | None = None,
                    progress: Callable[[int, str], None] | None = None, *, repair_text: bool = False) -> list[str]:
        """Import one file (native or OpenAI JSONL, or a trajectory); returns its run ids, in order — imported
        now or already present with the same content. Text that is not Unicode (lone surrogates) is malformed,
        unless ``repair_text``: then it is stored as U+FFFD and noted."""
        return self.ingest([path], tenant=tenant, fmt=fmt or "auto", progress=progress, repair_text=repair_text).runs

    def write_parsed(self, run: ParsedRun) -> int:
        """Write one :class:`~kvjudge.retention.ingest.ParsedRun` (bodies, then events) in one transaction
        (joining the caller's). Returns the bytes of bodies it stored (the others were stored already)."""
        if run.content_hash is None:
            run.settle(None)
        with self.transaction("ingest"):
            stored = self.blobs.put_hashed(run.bodies.items())
            self.append_many(run.run_id, run.events)
        return stored
