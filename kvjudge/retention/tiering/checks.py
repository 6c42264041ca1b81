"""The checks tiering adds to ``kvjudge verify``: every tiered ref is named by its manifest and held remotely."""

from __future__ import annotations

from kvjudge.errors import IntegrityError
from kvjudge.retention.blobs import short
from kvjudge.retention.state import TIERED, RunState
from kvjudge.retention.store import Store
from kvjudge.retention.tiering.manifest import logged_manifest
from kvjudge.retention.tiering.move import recover
from kvjudge.retention.tiering.targets import ColdStores
from kvjudge.retention.tiering.transfer import check_remote
from kvjudge.retention.verify import Check, Violation


def verify_tiered_run(store: Store, state: RunState, stores: ColdStores, *, rehash: bool = False
                      ) -> list[Violation]:
    """Every ref the log says is tiered is named by its manifest, and every ref of that manifest exists at its
    target with the right size (and the store's own checksum); ``rehash`` downloads and re-hashes each body."""
    violations: list[Violation] = []
    tiered = {ref: loc for ref, loc in state.bodies.items() if loc.status == TIERED}
    for manifest_ref in sorted({loc.manifest_ref or "" for loc in tiered.values()}):
        if not manifest_ref:
            violations.append(Violation("tiered", state.id, None, "a tiered ref names no manifest"))
            continue
        try:
            manifest = logged_manifest(store, state.id, manifest_ref)
        except IntegrityError as exc:
            violations.append(Violation("tiered", state.id, manifest_ref, str(exc)))
            continue
        listed = set(manifest.refs)
        violations.extend(Violation("tiered", state.id, ref, f"{short(ref)} is tiered but not in its manifest")
                          for ref, loc in sorted(tiered.items())
                          if loc.manifest_ref == manifest_ref and ref not in listed)
        cold = stores.for_move(store, state.id, manifest_ref)
        violations.extend(Violation("tiered", state.id, None, f"{manifest.target}: {message}")
                          for message in check_remote(cold, manifest, manifest.to_bytes(), rehash=rehash))
    return violations


def tier_check(stores: ColdStores, *, rehash: bool = False) -> Check:
    """The extra check :func:`kvjudge.retention.verify.verify` runs per run for tiered bodies."""
    def check(store: Store, state: RunState) -> list[Violation]:
        return verify_tiered_run(store, state, stores, rehash=rehash)

    return check


def verify_checks(store: Store, stores: ColdStores, *, rehash: bool = False) -> list[Check]:
    """What ``kvjudge verify`` calls first: finish crashed moves (recovery), then hand back the tier check.

    ``rehash`` is ``--verify-remote`` (download and re-hash every tiered body).
    """
    recover(store, stores, verify_remote=rehash)
    return [tier_check(stores, rehash=rehash)]


