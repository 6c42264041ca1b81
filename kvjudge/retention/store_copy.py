"""Moving a store (`kvjudge store copy SRC DST`): a laptop's SQLite store into a lab's PostgreSQL, and back.

Written against the store's protocols alone (:mod:`kvjudge.retention.store.interfaces`), so it moves any store
into any other. What moves:

- the log, run by run in the order of each run's first LSN; one destination transaction per run holds its events
  (appended, so checked and projected by the destination as any append is) and the bodies they need;
- bodies: those the run's log says are local, re-hashed on the way; a body the log says is reduced, dropped or
  tiered moves as a row without its body (its size, as the source keeps it), the event explaining it with it;
- tiering's manifests, kept as blobs under their refs (a manifest names the LSNs of the log it was built from,
  which the destination's differ from, so it could not rebuild it from its own log);
- the caches that do not depend on a device: the token counts (first, so each run's total is summed once, as it
  is projected) and the judge's payloads (verdicts, orders, pointwise scores, run facts); one already at the
  destination stays as it is.

Running it again after a kill finishes the job: a run the destination holds with the same events is skipped, one
whose events are the start of the source's gets the rest, and one with other events is refused before anything is
written. Copying into a store that holds other runs keeps them.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from kvjudge.errors import IntegrityError, StoreError
from kvjudge.retention import events as ev
from kvjudge.retention.blobs import ref_of, short
from kvjudge.retention.faults import fault_point
from kvjudge.retention.state import LOCAL, fold
from kvjudge.retention.store import Store
from kvjudge.retention.tiering.manifest import logged_manifest

#: Cache entries read, looked up at the destination and written per transaction.
CACHE_CHUNK = 500

#: ``progress(runs_done, runs_total)`` after each run copied or skipped.
Progress = Callable[[int, int], None]


@dataclass
class CopyReport:
    """What a copy moved. ``bytes`` counts the bodies read from the source and written (those the destination
    held already included); ``stored_bytes`` only those new to the destination."""

    runs_copied: int = 0
    runs_extended: int = 0
    runs_skipped: int = 0
    events: int = 0
    bodies: int = 0
    bytes: int = 0
    stored_bytes: int = 0
    absent_bodies: int = 0
    manifests: int = 0
    judgments: int = 0
    counts: int = 0
    seconds: float = 0.0

    @property
    def mb_per_s(self) -> float | None:
        """Body megabytes (10^6) moved per second of the whole copy (None: nothing timed)."""
        return round(self.bytes / 1e6 / self.seconds, 2) if self.seconds > 0 else None

    def to_dict(self) -> dict[str, Any]:
        return {"runs_copied": self.runs_copied, "runs_extended": self.runs_extended,
                "runs_skipped": self.runs_skipped, "events": self.events, "bodies": self.bodies, "bytes": self.bytes,
                "stored_bytes": self.stored_bytes, "absent_bodies": self.absent_bodies, "manifests": self.manifests,
                "caches": {"judgments": self.judgments, "counts": self.counts},
                "seconds": round(self.seconds, 3), "mb_per_s": self.mb_per_s}


def copy_store(source: Store, destination: Store, *, progress: Progress | None = None) -> CopyReport:
    """Copy every run of ``source`` (its log, bodies, reductions, tiered locations) and its device-independent
    caches into ``destination``. StoreError naming the run, before anything is written, when the destination holds
    a run of the same id with other events."""
    started = time.perf_counter()
    report = CopyReport()
    plan = _plan(source, destination)
    # Counts first: each run's total is then summed once, as its events are projected (counted after the runs, every
    # batch of counts would try again each run it completes a little more: 4 times the time of the runs).
    _copy_counts(source, destination, report)
    for done, (run_id, already) in enumerate(plan, start=1):
        if already is None:
            report.runs_skipped += 1
        else:
            _copy_run(source, destination, run_id, already, report)
            fault_point("after_copy_run")
        if progress is not None:
            progress(done, len(plan))
    _copy_judgments(source, destination, report)
    report.seconds = time.perf_counter() - started
    return report


def _plan(source: Store, destination: Store) -> list[tuple[str, int | None]]:
    """Each source run in the order of its first LSN, with how many of its events the destination holds already
    (None: all of them, so it is skipped). Refuses a run the destination holds with other events."""
    held = set(destination.events.logged_runs())
    plan: list[tuple[int, str, int | None]] = []
    for run_id in source.events.logged_runs():
        first = source.events.event_range(run_id)[0]
        if run_id not in held:
            plan.append((first, run_id, 0))
            continue
        theirs = [event.to_json() for _, event in destination.events.iter_events(run_id)]
        ours = [event.to_json() for _, event in source.events.iter_events(run_id)]
        if ours[:len(theirs)] != theirs:
            raise StoreError(f"run {run_id} is in the destination with other events than the source's; nothing was "
                             f"copied — copy into another store, or leave that run out of one of them")
        plan.append((first, run_id, None if len(theirs) == len(ours) else len(theirs)))
    return [(run_id, already) for _, run_id, already in sorted(plan)]


def _copy_run(source: Store, destination: Store, run_id: str, already: int, report: CopyReport) -> None:
    """The events of ``run_id`` after the first ``already``, with the bodies they need, in one destination
    transaction."""
    logged = list(source.events.iter_events(run_id))
    events = [event for _, event in logged[already:]]
    state = fold(logged)[run_id]  # of the very events copied, though the source may be written meanwhile
    local = {ref for ref, location in state.bodies.items() if location.status == LOCAL}
    # The bodies the run reads once all its events are in: a summary a later event took away again is read by no
    # state the destination commits, so it needs none (the append checks the batch whole).
    bodies, absent = _bodies(source, run_id, state.bodies, local)
    with destination.transaction("copy_run"):
        report.absent_bodies += destination.blobs.put_absent(absent)
        report.stored_bytes += destination.blobs.put_hashed(bodies.items())
        destination.events.append_many(run_id, events, label="copy_run")
        report.manifests += _keep_manifests(source, destination, run_id, events)
        # A run copied before and reduced since: the bodies its new events took away go (one another run still
        # reads here stays).
        if already:
            destination.blobs.release(set(state.bodies) - local)
    report.events += len(events)
    report.bodies += len(bodies)
    report.bytes += sum(len(body) for body in bodies.values())
    report.runs_copied += already == 0
    report.runs_extended += already > 0


def _bodies(source: Store, run_id: str, refs: Iterable[str], local: set[str]
            ) -> tuple[dict[str, bytes], list[tuple[str, int]]]:
    """The ``local`` bodies of ``run_id``, re-hashed, and the ``(ref, size)`` of its other ``refs`` the source has a
    row for."""
    bodies: dict[str, bytes] = {}
    absent: list[tuple[str, int]] = []
    for ref in refs:
        if ref in local:
            body = source.blobs.get(ref)
            if body is None:
                raise IntegrityError(f"run {run_id} of the source reads body {short(ref)}, which the source does not "
                                     f"have; run `kvjudge verify` on the source first")
            if ref_of(body) != ref:
                raise IntegrityError(f"body {short(ref)} of the source does not hash to its ref; run `kvjudge verify` "
                                     f"on the source first")
            bodies[ref] = body
        elif (row := source.blobs.stat(ref)) is not None:
            absent.append((ref, row[0]))
    return bodies, absent


def _keep_manifests(source: Store, destination: Store, run_id: str, events: Iterable[ev.Event]) -> int:
    """Keep the manifest of each move among ``events`` as a blob under its ref: a manifest names the LSNs of the log
    it was built from, which a copy renumbers (and a copy of a copy keeps the first store's), so the destination
    cannot rebuild it from its own log. Returns the manifests kept."""
    kept = 0
    for event in events:
        if isinstance(event, ev.TierStarted):
            raw = logged_manifest(source, run_id, event.manifest_ref).to_bytes()
            destination.blobs.put(raw, event.manifest_ref, label="copy_run")
            kept += 1
    return kept


def _chunks(items: Iterator[Any]) -> Iterator[list[Any]]:
    while chunk := list(itertools.islice(items, CACHE_CHUNK)):
        yield chunk


def _copy_judgments(source: Store, destination: Store, report: CopyReport) -> None:
    """Every cached judge payload the destination lacks (one it has stays)."""
    for chunk in _chunks(source.caches.iter_judgments()):
        held = destination.caches.get_judgments(key for key, _ in chunk)
        missing = [(key, payload) for key, payload in chunk if key not in held]
        if missing:
            with destination.transaction("copy_caches"):
                for key, payload in missing:
                    destination.caches.put_judgment(key, payload)
            report.judgments += len(missing)


def _copy_counts(source: Store, destination: Store, report: CopyReport) -> None:
    """Every token count the destination lacks (a count of immutable bytes: the first one written stays)."""
    for chunk in _chunks(source.caches.iter_counts()):
        by_counter: dict[str, dict[str, int]] = {}
        for ref, counter, tokens in chunk:
            by_counter.setdefault(counter, {})[ref] = tokens
        missing: dict[str, dict[str, int]] = {}
        for counter, counts in by_counter.items():
            held = destination.caches.cached_counts(counts, counter)
            missing[counter] = {ref: tokens for ref, tokens in counts.items() if ref not in held}
        if any(missing.values()):
            with destination.transaction("copy_caches"):
                for counter, counts in missing.items():
                    destination.caches.put_counts(counter, counts, label="copy_caches")
            report.counts += sum(len(counts) for counts in missing.values())
