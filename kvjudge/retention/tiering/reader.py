"""Reading tiered bodies: the store's fallback reader fetches a body from where the log says it went."""

from __future__ import annotations

from kvjudge.config import Config
from kvjudge.errors import ColdStoreError
from kvjudge.retention.blobs import short
from kvjudge.retention.state import TIERED
from kvjudge.retention.store import Store
from kvjudge.retention.tiering.targets import ColdStores, resolve_endpoint


class ColdReader:
    """The store's fallback reader: the bytes of a tiered ref, fetched from where the log says it is.

    Every fetched body is checked against its ref by the cold store; a store that is down raises
    ColdStoreError (the reader never turns "unreachable" into "absent").
    """

    def __init__(self, store: Store, stores: ColdStores) -> None:
        self._store = store
        self._stores = stores
        self._checked: set[str] = set()

    def __call__(self, ref: str) -> bytes | None:
        targets = [loc.target for _, loc in self._store.explain(ref).locations if loc.status == TIERED and loc.target]
        for target in dict.fromkeys(targets):
            cold = self._stores.get(target)
            if target not in self._checked:  # once per target: "down" must not read as "object missing"
                cold.check()
                self._checked.add(target)
            body = cold.get_blob(ref)
            if body is not None:
                return body
        if targets:
            raise ColdStoreError(f"{short(ref)} is tiered to {targets[0]} but the cold store does not have it; "
                                 "run `kvjudge verify --verify-remote`")
        return None


def fallback_reader(config: Config | None, store: Store, *, endpoint_url: str | None = None) -> ColdReader:
    """The reader ``kvjudge`` commands plug into ``store.fallback``, so reading a tiered run fetches its bodies.

    The S3 endpoint is ``endpoint_url``, else ``[retention] endpoint_url``, else boto3's own resolution.
    """
    endpoint = resolve_endpoint(config, endpoint_url) if config is not None else endpoint_url
    return ColdReader(store, ColdStores(endpoint))


