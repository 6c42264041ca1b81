"""The tier manifest: what one tiering of a run moved (the run, its log range, every ref with sha256 and size, and
where each body lives in the cold store).

Two formats, both read: ``kvjudge-tier-manifest/2`` (written today) packs a move's bodies, in ref order, into packs
of up to :data:`PACK_BYTES` (a larger body gets a pack of its own) and names each body's pack key and offset (its
length is its size); ``kvjudge-tier-manifest/1`` (moves made before packs) names no location: each body is a
content-addressed blob (:func:`~kvjudge.retention.cold.blob_key`). Where the bodies go is a pure function of the
refs and sizes, so a rebuild from the log yields the very bytes uploaded.

The manifest is a pure function of the log before the move's ``TierStarted`` and of the blob sizes, so it is
rebuilt from the log whenever needed and never stored locally; ``TierStarted.manifest_ref`` (the sha256 of its
canonical bytes) proves a rebuild is byte-identical to what was uploaded. The one exception is a log copied into
another store (:mod:`kvjudge.retention.store_copy`): its LSNs are the destination's, so the copy keeps the
manifest's bytes as a blob under that very ref.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from dataclasses import dataclass

from kvjudge.errors import IntegrityError
from kvjudge.retention import events as ev
from kvjudge.retention.blobs import ref_of, short
from kvjudge.retention.cold.keys import blob_key, manifest_key, pack_key
from kvjudge.retention.events import canonical_json
from kvjudge.retention.state import LOCAL, RunState, fold
from kvjudge.retention.store import BlobStore, EventRecorder, Store

#: The format new moves write, and the one before it (read, rebuilt and finished after a crash; never started).
MANIFEST_FORMAT = "kvjudge-tier-manifest/2"
LOOSE_FORMAT = "kvjudge-tier-manifest/1"
FORMATS = (MANIFEST_FORMAT, LOOSE_FORMAT)

#: A pack is cut before the body that would take it past this size. Part of format 2: a rebuild from the log must
#: cut the same packs, so changing it means a new format. Few enough files that a local disk writes a move at the
#: speed of a plain copy; many enough per move that a network store gets several uploads in flight.
PACK_BYTES = 8 * 1024 * 1024


@dataclass(frozen=True)
class ManifestEntry:
    """One body of a move: its ref, sha256 and size, and (format 2) the pack holding it and its offset there."""

    ref: str
    sha256: str
    size: int
    pack: str | None = None
    offset: int = 0

    @property
    def key(self) -> str:
        """The object holding the body: its pack, else its own blob (format 1)."""
        return self.pack if self.pack is not None else blob_key(self.ref)


@dataclass(frozen=True)
class RemoteObject:
    """One object a move writes: a pack of bodies (format 2), or one body's blob (``packed`` False, format 1)."""

    key: str
    entries: tuple[ManifestEntry, ...]
    packed: bool

    @property
    def size(self) -> int:
        return sum(entry.size for entry in self.entries)


@dataclass(frozen=True)
class Manifest:
    """What one tiering of a run moved: the run, the log range it covers, and every ref with sha256 and size."""

    run: str
    tenant: str
    first_lsn: int
    last_lsn: int
    target: str
    entries: tuple[ManifestEntry, ...]
    format: str = MANIFEST_FORMAT

    @property
    def key(self) -> str:
        return manifest_key(self.run, self.last_lsn)

    @property
    def objects(self) -> list[RemoteObject]:
        """What the move writes before its manifest, in order: its packs, or (format 1) one blob per body."""
        if self.format == LOOSE_FORMAT:
            return [RemoteObject(blob_key(entry.ref), (entry,), packed=False) for entry in self.entries]
        packs: dict[str, list[ManifestEntry]] = {}
        for entry in self.entries:
            packs.setdefault(entry.key, []).append(entry)
        return [RemoteObject(key, tuple(entries), packed=True) for key, entries in packs.items()]

    def entry(self, ref: str) -> ManifestEntry | None:
        """Where the move put ``ref`` (None: not in this move)."""
        return self._by_ref.get(ref)

    @functools.cached_property
    def _by_ref(self) -> dict[str, ManifestEntry]:
        return {entry.ref: entry for entry in self.entries}

    @property
    def refs(self) -> list[str]:
        return [entry.ref for entry in self.entries]

    @property
    def total_bytes(self) -> int:
        return sum(entry.size for entry in self.entries)

    def to_bytes(self) -> bytes:
        """Canonical JSON: the same move always yields the same bytes (and so the same manifest ref)."""
        packed = self.format != LOOSE_FORMAT
        return canonical_json({
            "format": self.format, "run": self.run, "tenant": self.tenant,
            "events": {"first_lsn": self.first_lsn, "last_lsn": self.last_lsn}, "target": self.target,
            "blobs": [{"ref": e.ref, "sha256": e.sha256, "size": e.size,
                       **({"pack": e.pack, "offset": e.offset} if packed else {})} for e in self.entries],
        }).encode("utf-8")

    @classmethod
    def from_bytes(cls, raw: bytes) -> Manifest:
        try:
            data = json.loads(raw)
            if data.get("format") not in FORMATS:
                raise ValueError(f"format {data.get('format')!r}")
            packed = data["format"] != LOOSE_FORMAT
            return cls(run=data["run"], tenant=data["tenant"], first_lsn=int(data["events"]["first_lsn"]),
                       last_lsn=int(data["events"]["last_lsn"]), target=data["target"], format=data["format"],
                       entries=tuple(ManifestEntry(b["ref"], b["sha256"], int(b["size"]),
                                                   str(b["pack"]) if packed else None,
                                                   int(b["offset"]) if packed else 0) for b in data["blobs"]))
        except (ValueError, KeyError, TypeError) as exc:
            raise IntegrityError(f"a tier manifest is not readable ({exc}); the store or cold store is damaged") from exc

    def in_format(self, manifest_format: str) -> Manifest:
        """This move's manifest in ``manifest_format``: format 2 cuts the bodies into packs (:data:`PACK_BYTES`)."""
        if manifest_format == LOOSE_FORMAT:
            entries = tuple(dataclasses.replace(entry, pack=None, offset=0) for entry in self.entries)
            return dataclasses.replace(self, format=manifest_format, entries=entries)
        if manifest_format != MANIFEST_FORMAT:
            raise IntegrityError(f"unknown tier manifest format {manifest_format!r}; upgrade kvjudge")
        packed: list[ManifestEntry] = []
        index = offset = 0
        for entry in self.entries:
            if offset and offset + entry.size > PACK_BYTES:
                index, offset = index + 1, 0
            packed.append(dataclasses.replace(entry, pack=pack_key(self.run, self.last_lsn, index), offset=offset))
            offset += entry.size
        return dataclasses.replace(self, format=manifest_format, entries=tuple(packed))


def build_manifest(blobs: BlobStore, state: RunState, target: str, first_lsn: int, last_lsn: int, *,
                    require_bodies: bool, manifest_format: str = MANIFEST_FORMAT) -> Manifest:
    """The manifest of every body of ``state`` the log says is local (sizes from the blob rows, which stay), in
    ``manifest_format``."""
    refs = sorted(ref for ref, loc in state.bodies.items() if loc.status == LOCAL)
    entries = []
    for ref in refs:
        row = blobs.stat(ref)
        if row is None or (require_bodies and not row[1]):
            raise IntegrityError(
                f"run {state.id}: the log says {short(ref)} is local but its body is missing; "
                "run `kvjudge verify` before tiering")
        entries.append(ManifestEntry(ref=ref, sha256=ref.removeprefix("sha256:"), size=int(row[0])))
    return Manifest(run=state.id, tenant=state.tenant, first_lsn=first_lsn, last_lsn=last_lsn, target=target,
                    entries=tuple(entries), format=LOOSE_FORMAT).in_format(manifest_format)


def started_event(log: EventRecorder, run_id: str, manifest_ref: str) -> ev.TierStarted:
    """The ``TierStarted`` of ``run_id`` that names ``manifest_ref`` (where that move went, and how)."""
    for _lsn, event in log.iter_events(run_id, kind=ev.TierStarted.kind):
        if isinstance(event, ev.TierStarted) and event.manifest_ref == manifest_ref:
            return event
    raise IntegrityError(f"run {run_id}: no TierStarted names manifest {short(manifest_ref)}; the store is damaged")


def logged_manifest(store: Store, run_id: str, manifest_ref: str) -> Manifest:
    """The manifest a ``TierStarted`` recorded, rebuilt from the log alone (the events before it, folded).

    The manifest is a function of the log, so it is never stored locally; its ref in the event proves the
    rebuild is byte-identical to what was uploaded (in whichever format the move wrote: packs, or before them one
    blob per body).
    """
    before: list[tuple[int, ev.Event]] = []
    started: ev.TierStarted | None = None
    for lsn, event in store.events.iter_events(run_id):
        if isinstance(event, ev.TierStarted) and event.manifest_ref == manifest_ref:
            started = event
            break
        before.append((lsn, event))
    if started is None or not before:
        raise IntegrityError(f"run {run_id}: no TierStarted names manifest {short(manifest_ref)}; the store is damaged")
    state = fold(before)[run_id]
    manifest = build_manifest(store.blobs, state, started.target, before[0][0], before[-1][0], require_bodies=False)
    for manifest_format in FORMATS:
        rebuilt = manifest.in_format(manifest_format)
        if ref_of(rebuilt.to_bytes()) == manifest_ref:
            return rebuilt
    # A log copied into another store (`kvjudge store copy`) has other LSNs, and the manifest names the source's:
    # the copy keeps the manifest's bytes under its ref, which proves them the ones uploaded.
    kept = store.blobs.get(manifest_ref)
    if kept is not None and ref_of(kept) == manifest_ref:
        return Manifest.from_bytes(kept)
    raise IntegrityError(f"run {run_id}: the log no longer rebuilds manifest {short(manifest_ref)}; "
                         "the store is damaged")


