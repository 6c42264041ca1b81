"""Rehydrate: bring a tiered run's bodies back into the local store, as a new fact (``Rehydrated``) in its log."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvjudge.errors import ColdStoreError, IntegrityError
from kvjudge.retention import events as ev
from kvjudge.retention.blobs import short
from kvjudge.retention.faults import fault_point
from kvjudge.retention.state import TIERED, BodyLocation
from kvjudge.retention.store import Store
from kvjudge.retention.tiering.move import recover_run
from kvjudge.retention.tiering.targets import ColdStores
from kvjudge.retention.tiering.transfer import MAX_IN_FLIGHT_BYTES, ProgressFn, fetch_body

REHYDRATE_POINTS = ("rehydrate.after_bodies", "rehydrated.txn")


@dataclass(frozen=True)
class RehydrateResult:
    run: str
    status: str  # "rehydrated" | "not_tiered"
    refs: int = 0
    bytes: int = 0
    target: str | None = None
    endpoint: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"run": self.run, "status": self.status, "refs": self.refs, "bytes": self.bytes,
                "target": self.target, "endpoint": self.endpoint}


def rehydrate_run(store: Store, run_id: str, stores: ColdStores, *, progress: ProgressFn | None = None
                  ) -> RehydrateResult:
    """Bring the tiered bodies of ``run_id`` back into the local store and append ``Rehydrated``.

    Bodies are put first (each batch its own transaction; a body put back is the same bytes, so the ref
    stays true), the event last. The remote copies stay: cold storage is never deleted from.
    """
    recover_run(store, run_id, stores)  # a move left half done is finished first
    state = store.runs.run(run_id)
    refs = sorted(ref for ref, loc in state.bodies.items() if loc.status == TIERED)
    if not refs:
        return RehydrateResult(run_id, "not_tiered")
    total = 0
    batch: list[tuple[str, bytes]] = []  # (ref, body): each body was checked against its ref as it was read
    batch_bytes = 0

    def flush() -> None:
        nonlocal batch, batch_bytes
        if batch:
            with store.transaction("rehydrate_put"):
                store.blobs.put_hashed(batch)
            batch, batch_bytes = [], 0

    for ref in refs:
        body = None if store.blobs.has_body(ref) else _fetch(store, stores, run_id, state.bodies[ref])
        if body is not None:
            batch.append((ref, body))
            batch_bytes += len(body)
            total += len(body)
            if batch_bytes >= MAX_IN_FLIGHT_BYTES:
                flush()
        if progress is not None:
            progress(1)
    flush()
    fault_point("rehydrate.after_bodies")
    with store.transaction("rehydrated"):
        # Under the write lock: a concurrent `tier` recovery may have released bodies put above (to it they
        # were tiered bodies left behind); fetch those again so the event never names a body that is not here.
        for ref in refs:
            if not store.blobs.has_body(ref):
                store.blobs.put_hashed([(ref, _fetch(store, stores, run_id, state.bodies[ref]))])
        store.events.append(run_id, ev.Rehydrated(run=run_id, refs=refs))
    return RehydrateResult(run_id, "rehydrated", refs=len(refs), bytes=total,
                           target=state.tier["target"] if state.tier else None,
                           endpoint=state.tier.get("endpoint") if state.tier else None)


def _fetch(store: Store, stores: ColdStores, run_id: str, location: BodyLocation) -> bytes:
    """The body at ``location`` from the cold store its move recorded (checked against its ref)."""
    if location.target is None or location.manifest_ref is None:
        raise IntegrityError(f"{short(location.ref)} is tiered but the log names no target; the store is damaged")
    cold = stores.for_move(store, run_id, location.manifest_ref)
    entry = stores.manifest(store, run_id, location.manifest_ref).entry(location.ref)
    if entry is None:
        raise IntegrityError(f"{short(location.ref)} is tiered but its move's manifest does not name it; "
                             "run `kvjudge verify`")
    body = fetch_body(cold, entry)
    if body is None:
        raise ColdStoreError(f"{short(location.ref)} is missing from {cold.url}; it cannot be rehydrated — "
                             "run `kvjudge verify --verify-remote`")
    return body


