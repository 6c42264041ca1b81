"""The tier manifest: what one tiering of a run moved (the run, its log range, every ref with sha256 and size).

The manifest is a pure function of the log before the move's ``TierStarted`` and of the blob sizes, so it is
rebuilt from the log whenever needed and never stored locally; ``TierStarted.manifest_ref`` (the sha256 of its
canonical bytes) proves a rebuild is byte-identical to what was uploaded.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from kvjudge.errors import IntegrityError
from kvjudge.retention import events as ev
from kvjudge.retention.blobs import ref_of, short
from kvjudge.retention.cold import manifest_key
from kvjudge.retention.events import canonical_json
from kvjudge.retention.state import LOCAL, RunState, fold
from kvjudge.retention.store import Store

MANIFEST_FORMAT = "kvjudge-tier-manifest/1"

@dataclass(frozen=True)
class ManifestEntry:
    ref: str
    sha256: str
    size: int


@dataclass(frozen=True)
class Manifest:
    """What one tiering of a run moved: the run, the log range it covers, and every ref with sha256 and size."""

    run: str
    tenant: str
    first_lsn: int
    last_lsn: int
    target: str
    entries: tuple[ManifestEntry, ...]

    @property
    def key(self) -> str:
        return manifest_key(self.run, self.last_lsn)

    @property
    def refs(self) -> list[str]:
        return [entry.ref for entry in self.entries]

    @property
    def total_bytes(self) -> int:
        return sum(entry.size for entry in self.entries)

    def to_bytes(self) -> bytes:
        """Canonical JSON: the same move always yields the same bytes (and so the same manifest ref)."""
        return canonical_json({
            "format": MANIFEST_FORMAT, "run": self.run, "tenant": self.tenant,
            "events": {"first_lsn": self.first_lsn, "last_lsn": self.last_lsn}, "target": self.target,
            "blobs": [{"ref": e.ref, "sha256": e.sha256, "size": e.size} for e in self.entries],
        }).encode("utf-8")

    @classmethod
    def from_bytes(cls, raw: bytes) -> Manifest:
        try:
            data = json.loads(raw)
            if data.get("format") != MANIFEST_FORMAT:
                raise ValueError(f"format {data.get('format')!r}")
            return cls(run=data["run"], tenant=data["tenant"], first_lsn=int(data["events"]["first_lsn"]),
                       last_lsn=int(data["events"]["last_lsn"]), target=data["target"],
                       entries=tuple(ManifestEntry(b["ref"], b["sha256"], int(b["size"])) for b in data["blobs"]))
        except (ValueError, KeyError, TypeError) as exc:
            raise IntegrityError(f"a tier manifest is not readable ({exc}); the store or cold store is damaged") from exc


def build_manifest(store: Store, state: RunState, target: str, first_lsn: int, last_lsn: int, *,
                    require_bodies: bool) -> Manifest:
    """The manifest of every body of ``state`` the log says is local (sizes from the blob rows, which stay)."""
    refs = sorted(ref for ref, loc in state.bodies.items() if loc.status == LOCAL)
    entries = []
    for ref in refs:
        row = store.blobs.stat(ref)
        if row is None or (require_bodies and not row[1]):
            raise IntegrityError(
                f"run {state.id}: the log says {short(ref)} is local but its body is missing; "
                "run `kvjudge verify` before tiering")
        entries.append(ManifestEntry(ref=ref, sha256=ref.removeprefix("sha256:"), size=int(row[0])))
    return Manifest(run=state.id, tenant=state.tenant, first_lsn=first_lsn, last_lsn=last_lsn, target=target,
                    entries=tuple(entries))


def started_event(store: Store, run_id: str, manifest_ref: str) -> ev.TierStarted:
    """The ``TierStarted`` of ``run_id`` that names ``manifest_ref`` (where that move went, and how)."""
    for _lsn, event in store.iter_events(run_id, kind=ev.TierStarted.kind):
        if isinstance(event, ev.TierStarted) and event.manifest_ref == manifest_ref:
            return event
    raise IntegrityError(f"run {run_id}: no TierStarted names manifest {short(manifest_ref)}; the store is damaged")


def logged_manifest(store: Store, run_id: str, manifest_ref: str) -> Manifest:
    """The manifest a ``TierStarted`` recorded, rebuilt from the log alone (the events before it, folded).

    The manifest is a function of the log, so it is never stored locally; its ref in the event proves the
    rebuild is byte-identical to what was uploaded.
    """
    before: list[tuple[int, ev.Event]] = []
    started: ev.TierStarted | None = None
    for lsn, event in store.iter_events(run_id):
        if isinstance(event, ev.TierStarted) and event.manifest_ref == manifest_ref:
            started = event
            break
        before.append((lsn, event))
    if started is None or not before:
        raise IntegrityError(f"run {run_id}: no TierStarted names manifest {short(manifest_ref)}; the store is damaged")
    state = fold(before)[run_id]
    manifest = build_manifest(store, state, started.target, before[0][0], before[-1][0], require_bodies=False)
    if ref_of(manifest.to_bytes()) != manifest_ref:
        raise IntegrityError(f"run {run_id}: the log no longer rebuilds manifest {short(manifest_ref)}; "
                             "the store is damaged")
    return manifest


