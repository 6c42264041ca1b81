"""Where tiered bodies go: the target URL and S3 endpoint a command resolves, and the cold stores it opens."""

from __future__ import annotations

from kvjudge.config import Config, data_dir
from kvjudge.retention.cold import ColdStore, open_cold_store


def default_target() -> str:
    """The built-in cold store: a ``cold`` directory next to the default store."""
    return "file://" + str(data_dir() / "cold")


def resolve_target(config: Config, to: str | None = None) -> str:
    """The target URL: ``to`` (``--to``), else ``[retention] cold``, else :func:`default_target`."""
    return to or config.get("retention.cold", str, None) or default_target()


def resolve_endpoint(config: Config, endpoint_url: str | None = None) -> str | None:
    """``--endpoint-url``, else ``[retention] endpoint_url``, else None (boto3 reads ``AWS_ENDPOINT_URL``)."""
    return endpoint_url or config.get("retention.endpoint_url", str, None)


class ColdStores:
    """Opens each target URL once (an S3 client is not free) and remembers it.

    The built-in default directory may be created on first use; any other directory must exist (a missing
    one is more likely an unmounted disk than a wish for a new directory).
    """

    def __init__(self, endpoint_url: str | None = None) -> None:
        self.endpoint_url = endpoint_url
        self._open: dict[str, ColdStore] = {}

    def get(self, target: str) -> ColdStore:
        store = self._open.get(target)
        if store is None:
            create = target == default_target()
            store = open_cold_store(target, endpoint_url=self.endpoint_url, create=create)
            self._open[target] = store
            self._open[store.url] = store
        return store
