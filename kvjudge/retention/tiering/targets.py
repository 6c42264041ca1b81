"""Where tiered bodies go and where they are read back from: cold targets (:data:`~kvjudge.retention.cold.ColdTarget`,
a cold store's URL), S3 endpoints, and the cold stores a command opens (each once).

A new move goes to the endpoint the command resolves (``--endpoint-url``, else ``[retention] endpoint_url``,
else boto3's own resolution: ``AWS_ENDPOINT_URL``, ``~/.aws``), and its ``TierStarted`` / ``Tiered`` record the
endpoint really used. Every later read of that move (show, judge, rehydrate, verify, recovery) goes to the
recorded endpoint, never to whatever the environment says today. An explicit ``--endpoint-url`` that differs
means the user says the store moved: it is used only once the copy of the run's manifest it holds hashes to
the ``manifest_ref`` the log recorded. Logs written before endpoints were recorded keep today's resolution,
with a one-line notice.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Callable

from kvjudge.errors import ColdStoreError
from kvjudge.retention.blobs import ref_of, short
from kvjudge.retention.cold import ColdStore, ColdTarget, open_cold_store
from kvjudge.retention.store import Store
from kvjudge.retention.tiering.manifest import Manifest, logged_manifest, started_event
from kvjudge.settings import RetentionSettings, data_dir

Notice = Callable[[str], None]


def default_cold_target() -> ColdTarget:
    """The built-in cold store: a ``cold`` directory next to the default store."""
    return "file://" + str(data_dir() / "cold")


def resolve_cold_target(retention: RetentionSettings, to: ColdTarget | None = None) -> ColdTarget:
    """The cold target: ``to`` (``--to``), else ``[retention] cold``, else :func:`default_cold_target`."""
    return to or retention.cold or default_cold_target()


def resolve_endpoint(retention: RetentionSettings, endpoint_url: str | None = None) -> str | None:
    """``--endpoint-url``, else ``[retention] endpoint_url``, else None (boto3 reads ``AWS_ENDPOINT_URL``)."""
    return endpoint_url or retention.endpoint_url


def _is_s3(cold_target: ColdTarget) -> bool:
    return urllib.parse.urlparse(cold_target).scheme == "s3"


class ColdStores:
    """Opens cold stores once each (an S3 client is not free): for new moves, and for reading recorded ones; and
    rebuilds each recorded move's manifest once (:meth:`manifest`).

    ``endpoint_url`` is where new moves go (None: boto3's own resolution). ``override`` is an explicit
    ``--endpoint-url``: a recorded move at another endpoint is read from it only after its manifest checks out
    (see the module doc). ``notice`` receives one line, once, when a run's log predates recorded endpoints.

    The built-in default directory may be created on first use; any other directory must exist (a missing
    one is more likely an unmounted disk than a wish for a new directory).
    """

    def __init__(self, endpoint_url: str | None = None, *, override: str | None = None,
                 notice: Notice | None = None) -> None:
        self.endpoint_url = endpoint_url
        self.override = override
        self._notice = notice
        self._noticed = False
        self._open: dict[tuple[ColdTarget, str | None], ColdStore] = {}
        self._moves: dict[tuple[str, str], ColdStore] = {}
        self._manifests: dict[tuple[str, str], Manifest] = {}

    @classmethod
    def from_settings(cls, retention: RetentionSettings, endpoint_url: str | None = None, *,
                      notice: Notice | None = None) -> ColdStores:
        """A command's cold stores: ``endpoint_url`` is its ``--endpoint-url`` (None when not given)."""
        return cls(resolve_endpoint(retention, endpoint_url), override=endpoint_url, notice=notice)

    def get(self, cold_target: ColdTarget) -> ColdStore:
        """The cold store at ``cold_target`` for a new move (at :attr:`endpoint_url`)."""
        return self.at(cold_target, self.endpoint_url)

    def at(self, cold_target: ColdTarget, endpoint: str | None) -> ColdStore:
        """The cold store at ``cold_target`` reached through ``endpoint`` (ignored for a local directory)."""
        key = (cold_target, endpoint if _is_s3(cold_target) else None)
        store = self._open.get(key)
        if store is None:
            store = open_cold_store(cold_target, endpoint_url=endpoint, create=cold_target == default_cold_target())
            self._open[key] = store
        return store

    def for_move(self, store: Store, run_id: str, manifest_ref: str) -> ColdStore:
        """The cold store a recorded move of ``run_id`` (its ``TierStarted`` naming ``manifest_ref``) went to.

        ColdStoreError when an explicit ``--endpoint-url`` names another endpoint whose copy of the manifest is
        missing or different: nothing is read from a store that cannot be shown to be the same one.
        """
        cached = self._moves.get((run_id, manifest_ref))
        if cached is not None:
            return cached
        started = started_event(store.events, run_id, manifest_ref)
        cold_target, recorded = started.target, started.endpoint
        if not _is_s3(cold_target):
            cold = self.at(cold_target, None)
        elif recorded is None:
            cold = self._unrecorded(run_id, cold_target)
        elif self.override is None or self.override == recorded:
            cold = self.at(cold_target, recorded)
        else:
            cold = self.at(cold_target, self.override)
            self._check_moved(store, run_id, manifest_ref, cold, recorded)
        self._moves[(run_id, manifest_ref)] = cold
        return cold

    def manifest(self, store: Store, run_id: str, manifest_ref: str) -> Manifest:
        """The manifest of a recorded move of ``run_id`` (rebuilt from the log once per command): where each of its
        bodies lives in the cold store."""
        manifest = self._manifests.get((run_id, manifest_ref))
        if manifest is None:
            manifest = self._manifests[(run_id, manifest_ref)] = logged_manifest(store, run_id, manifest_ref)
        return manifest

    def _unrecorded(self, run_id: str, cold_target: ColdTarget) -> ColdStore:
        """A move logged before endpoints were recorded: today's resolution, said once."""
        endpoint = self.override or self.endpoint_url
        cold = self.at(cold_target, endpoint)
        if self._notice is not None and not self._noticed:
            self._noticed = True
            source = ("--endpoint-url" if self.override else "[retention] endpoint_url" if endpoint
                      else "AWS_ENDPOINT_URL / AWS config")
            self._notice(f"note: run {run_id} (and any like it) was tiered before kvjudge recorded S3 endpoints; "
                         f"reading {cold_target} at {cold.endpoint_url} (from {source})")
        return cold

    @staticmethod
    def _check_moved(store: Store, run_id: str, manifest_ref: str, cold: ColdStore, recorded: str) -> None:
        """The override holds the very manifest the log recorded, or ColdStoreError naming both endpoints."""
        manifest = logged_manifest(store, run_id, manifest_ref)
        remote = cold.get_manifest(manifest.key)
        if remote is not None and ref_of(remote) == manifest_ref:
            return
        found = "no manifest" if remote is None else f"another manifest ({short(ref_of(remote))})"
        raise ColdStoreError(
            f"run {run_id} was tiered to {manifest.target} at {recorded}, but {cold.endpoint_url} holds {found} "
            f"at {manifest.key} where {short(manifest_ref)} was written; it is not the same store — drop "
            f"--endpoint-url to read from {recorded}")
