"""Reading tiered bodies: the store's fallback reader fetches a body from where the log says it went."""

from __future__ import annotations

from kvjudge.errors import ColdStoreError
from kvjudge.retention.blobs import short
from kvjudge.retention.cold import ColdStore
from kvjudge.retention.state import TIERED
from kvjudge.retention.store import Store
from kvjudge.retention.tiering.manifest import ManifestEntry
from kvjudge.retention.tiering.targets import ColdStores, Notice
from kvjudge.retention.tiering.transfer import fetch_body
from kvjudge.settings import RetentionSettings


class ColdReader:
    """The store's fallback reader: the bytes of a tiered ref, fetched from the target and endpoint its move
    recorded (:meth:`ColdStores.for_move`), where that move's manifest says it lives (a pack's range, or its blob).

    Every fetched body is checked against its ref by the cold store; a store that is down raises
    ColdStoreError (the reader never turns "unreachable" into "absent").
    """

    def __init__(self, store: Store, stores: ColdStores) -> None:
        self._store = store
        self._stores = stores
        self._checked: set[int] = set()

    def __call__(self, ref: str) -> bytes | None:
        colds: dict[int, ColdStore] = {}
        entries: dict[int, list[ManifestEntry]] = {}
        for run_id, loc in self._store.runs.explain(ref).locations:
            if loc.status == TIERED and loc.manifest_ref:
                cold = self._stores.for_move(self._store, run_id, loc.manifest_ref)
                colds.setdefault(id(cold), cold)
                entry = self._stores.manifest(self._store, run_id, loc.manifest_ref).entry(ref)
                if entry is not None:
                    entries.setdefault(id(cold), []).append(entry)
        for key, cold in colds.items():
            if key not in self._checked:  # once per store: "down" must not read as "object missing"
                cold.check()
                self._checked.add(key)
            for entry in entries.get(key, []):  # where each move that carried it put it
                body = fetch_body(cold, entry)
                if body is not None:
                    return body
        if colds:
            first = next(iter(colds.values()))
            raise ColdStoreError(f"{short(ref)} is tiered to {first.url} but the cold store does not have it; "
                                 "run `kvjudge verify --verify-remote`")
        return None


def fallback_reader(retention: RetentionSettings | None, store: Store, *, endpoint_url: str | None = None,
                    notice: Notice | None = None) -> ColdReader:
    """The reader ``kvjudge`` commands plug into ``store.blobs.fallback``, so reading a tiered run fetches its bodies.

    Each body is read where its move recorded; ``endpoint_url`` (``--endpoint-url``) says an S3 store moved
    (checked against each run's manifest before anything is read, see :mod:`.targets`).
    """
    stores = ColdStores.from_settings(retention or RetentionSettings(), endpoint_url, notice=notice)
    return ColdReader(store, stores)
