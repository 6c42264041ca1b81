"""The move of a run's bodies to a cold store, and its recovery after a crash.

Every step is durable before the next starts (seed 002 step 6):

1. only terminal runs (graded / ungraded / archived) are eligible; anything else is a RunStateError;
2. ``TierStarted{target, manifest_ref}`` is appended — the log now says a move is under way, and to where
   (the manifest is rebuilt from the log whenever needed, see :mod:`.manifest`);
3. every local body of the run is uploaded (content-addressed keys: a retry rewrites identical bytes),
   then the manifest, last and conditionally — its presence is the remote's commit;
4. what the remote holds is read back and checked (sizes, and the remote's own SHA-256 where it keeps
   one; a full re-hash with ``verify_remote``);
5. ``Tiered{target, manifest_ref, refs}`` is appended — the local record that the remote committed;
6. only then are the local bodies deleted, in one transaction.

A crash anywhere leaves one of three logs, and :func:`recover` (run at the start of every ``tier`` and
``verify``) finishes each: no tier events → nothing happened locally (remote objects, if any, are
identical re-uploadable copies); ``TierStarted`` without ``Tiered`` → redo steps 3–6 for the recorded
manifest, skipping objects the remote already holds; ``Tiered`` with bodies still here → step 6. A crash
therefore leaves at most a duplicate (remote and local), never a loss.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from kvjudge.errors import ColdStoreError, RunStateError, StoreError, UsageError
from kvjudge.retention import events as ev
from kvjudge.retention.blobs import ref_of
from kvjudge.retention.cold import ColdStore, blob_key
from kvjudge.retention.faults import fault_point
from kvjudge.retention.lifecycle import REDUCIBLE, is_reducible
from kvjudge.retention.reduce import run_tokens
from kvjudge.retention.state import LOCAL, TIERED, RunState
from kvjudge.retention.store import Store
from kvjudge.retention.tiering.manifest import Manifest, build_manifest, event_range, logged_manifest
from kvjudge.retention.tiering.targets import ColdStores
from kvjudge.retention.tiering.transfer import ProgressFn, check_manifest, check_remote, upload_and_check
from kvjudge.tokens import TokenCounter


#: Every fault point of tiering, in the order a move meets them (tests kill a real process at each).
TIER_POINTS = (
    "tier_start.txn",               # inside the transaction that appends TierStarted
    "tier.after_started",           # TierStarted committed, nothing uploaded
    "tier.blob_response_lost",      # a blob PUT applied remotely, its acknowledgement never processed
    "tier.after_blobs",             # every blob uploaded, manifest not yet written
    "tier.manifest_response_lost",  # the manifest PUT applied remotely, its acknowledgement never processed
    "tier.after_verify",            # remote read back and checked, Tiered not yet appended
    "tiered.txn",                   # inside the transaction that appends Tiered
    "tier.after_tiered",            # Tiered committed, local bodies still here
    "tier_delete.txn",              # inside the transaction that deletes the local bodies
)



@dataclass(frozen=True)
class TierResult:
    """Outcome of tiering (or recovering) one run.

    ``status``: ``tiered`` (moved now), ``already_tiered`` (nothing to do, or another process finished the
    move), ``nothing_local`` (no body to move), ``above_ceiling`` (not moved: ``tokens`` above ``ceiling``).
    ``recovered`` names the step a crashed earlier attempt was resumed at (None: a fresh move). ``unreduced``
    is what the log recorded when a run not known to be within its ceiling was moved anyway.
    """

    run: str
    status: str
    target: str | None
    manifest_ref: str | None
    endpoint: str | None = None
    refs: int = 0
    bytes: int = 0
    uploaded: int = 0
    deleted: int = 0
    recovered: str | None = None
    tokens: int | None = None
    ceiling: int | None = None
    unreduced: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"run": self.run, "status": self.status, "target": self.target, "endpoint": self.endpoint,
                "manifest_ref": self.manifest_ref, "refs": self.refs, "bytes": self.bytes, "uploaded": self.uploaded,
                "deleted": self.deleted, "recovered": self.recovered, "tokens": self.tokens, "ceiling": self.ceiling,
                "unreduced": self.unreduced}


@dataclass(frozen=True)
class TierGate:
    """What a run must satisfy to be moved: at most ``ceiling`` tokens of visible text under ``counter`` (the
    measure reduction targets). The caller resolves the ceiling (retention takes it as a number).

    ``unreduced`` moves a run above its ceiling (or whose ceiling is unknown: ``ceiling`` None) anyway, for raw
    archives; its ``TierStarted`` then records ``{"tokens", "ceiling", "counter"}``.
    """

    ceiling: int | None
    counter: TokenCounter
    unreduced: bool = False

    def __post_init__(self) -> None:
        if self.ceiling is None and not self.unreduced:
            raise UsageError("a tier gate needs a ceiling (or unreduced=True to move runs whatever their size)")


def local_body_bytes(store: Store, run_id: str) -> int:
    """Bytes of the bodies of ``run_id`` the log says are local (what a move would upload)."""
    row = store.connection.execute(
        "SELECT COALESCE(SUM(b.size), 0) FROM run_bodies AS r JOIN blobs AS b ON b.ref = r.ref "
        "WHERE r.run = ? AND r.status = ?", (run_id, LOCAL)).fetchone()
    return int(row[0])


def check_eligible(state: RunState) -> None:
    """RunStateError unless grading of ``state`` terminated (graded, ungraded, archived)."""
    if not is_reducible(state.state):
        raise RunStateError(
            f"run {state.id} is {state.state}; only {', '.join(sorted(REDUCIBLE))} runs can be tiered — "
            "finish grading it first (`kvjudge mark RUN graded`)")


def _moving(state: RunState) -> bool:
    return bool(state.tier) and state.tier["status"] in ("started", "tiered")  # type: ignore[index]


def tier_run(store: Store, run_id: str, cold: ColdStore, *, gate: TierGate | None = None,
             stores: ColdStores | None = None, verify_remote: bool = False,
             progress: ProgressFn | None = None) -> TierResult:
    """Move the local bodies of ``run_id`` to ``cold`` (see the module doc for the steps).

    With ``gate`` a run above its ceiling is not moved (``above_ceiling``) unless the gate says ``unreduced``.
    Whether to move is decided inside the transaction that appends ``TierStarted``, on the committed state: a
    run another process reduced, tiered or started to tier meanwhile is judged as it is now (a move already
    under way is joined: its recovery is idempotent). Idempotent: a run already tiered is left alone
    (``already_tiered``); a run whose earlier move crashed is finished first, where its log says (``stores``
    opens it; default: ``cold``'s endpoint).
    """
    state = store.run(run_id)
    check_eligible(state)
    stores = stores or ColdStores(cold.endpoint_url)
    if not _moving(state):
        cold.check()  # a store that is down fails here, before anything is written locally
        started: _Started | TierResult | None = None
        with store.transaction("tier_start"):
            current = store.run(run_id)  # the committed state, under the write lock
            check_eligible(current)
            if not _moving(current):
                started = _start(store, current, cold, gate)
        if isinstance(started, TierResult):
            return started
        if started is not None:
            fault_point("tier.after_started")
            result = _finish_move(store, started.manifest, started.manifest_ref, cold, cold.endpoint_url,
                                  verify_remote=verify_remote, progress=progress, skip_present=False, recovered=None)
            return dataclasses.replace(result, tokens=started.tokens, ceiling=started.ceiling,
                                       unreduced=started.unreduced)
    result = recover_run(store, run_id, stores, verify_remote=verify_remote, progress=progress)
    if result is not None:
        return result
    tier = store.run(run_id).tier or {}
    return TierResult(run_id, "already_tiered", tier.get("target"), tier.get("manifest_ref"),
                      endpoint=tier.get("endpoint"))


@dataclass(frozen=True)
class _Started:
    """A move whose ``TierStarted`` was appended (it commits with the transaction that appended it)."""

    manifest: Manifest
    manifest_ref: str
    tokens: int | None
    ceiling: int | None
    unreduced: dict[str, Any] | None


def _start(store: Store, state: RunState, cold: ColdStore, gate: TierGate | None) -> _Started | TierResult:
    """Inside the ``tier_start`` transaction: gate ``state`` on its ceiling and append ``TierStarted`` — or say
    why nothing moves (``above_ceiling``, ``nothing_local``)."""
    unreduced = None
    tokens = ceiling = None
    if gate is not None:
        # Counted on the committed state (whose visible bodies are all here); a run reduced first has its
        # counts stored already, so this reads only bodies never counted.
        tokens, ceiling = run_tokens(store, state, gate.counter), gate.ceiling
        if ceiling is None or tokens > ceiling:
            if not gate.unreduced:
                return TierResult(state.id, "above_ceiling", cold.url, None, endpoint=cold.endpoint_url,
                                  tokens=tokens, ceiling=ceiling)
            unreduced = {"tokens": tokens, "ceiling": ceiling, "counter": gate.counter.name}
    first_lsn, last_lsn = event_range(store, state.id)
    manifest = build_manifest(store, state, cold.url, first_lsn, last_lsn, require_bodies=True)
    if not manifest.entries:
        return TierResult(state.id, "nothing_local", cold.url, None, endpoint=cold.endpoint_url, tokens=tokens,
                          ceiling=ceiling)
    manifest_ref = ref_of(manifest.to_bytes())
    store.append(state.id, ev.TierStarted(run=state.id, target=cold.url, manifest_ref=manifest_ref,
                                          endpoint=cold.endpoint_url, unreduced=unreduced))
    return _Started(manifest, manifest_ref, tokens, ceiling, unreduced)


def _finish_move(store: Store, manifest: Manifest, manifest_ref: str, cold: ColdStore, endpoint: str | None, *,
                 verify_remote: bool, progress: ProgressFn | None, skip_present: bool,
                 recovered: str | None) -> TierResult:
    """Steps 3–6 for a move whose TierStarted (recording ``endpoint``) is committed."""
    raw = manifest.to_bytes()
    remote = cold.get_manifest(manifest.key)
    if remote is None:
        # Each body is read back (stat, or a full re-hash with verify_remote) right after its own upload.
        uploaded, problems = upload_and_check(store, manifest, cold, skip_present=skip_present,
                                               rehash=verify_remote, progress=progress)
        fault_point("tier.after_blobs")
        cold.put_manifest(manifest.key, raw)
        fault_point("tier.manifest_response_lost")
        problems += check_manifest(cold, manifest, raw)
    elif remote != raw:
        raise ColdStoreError(f"{cold.url}/{manifest.key} holds a different manifest than run {manifest.run}'s "
                             "move recorded; inspect the cold store before retrying")
    else:
        uploaded = 0
        if progress is not None:
            progress(manifest.total_bytes)
        problems = check_remote(cold, manifest, raw, rehash=verify_remote)
    if problems:
        # One repair pass (the local bodies are all still here): rewrite every body — same bytes, same keys —
        # and the manifest, then check again. A remote that still disagrees is an error; nothing is deleted.
        rewritten, problems = upload_and_check(store, manifest, cold, skip_present=False, rehash=verify_remote,
                                                progress=None)
        uploaded += rewritten
        cold.put_manifest(manifest.key, raw)
        problems += check_manifest(cold, manifest, raw)
    if problems:
        raise ColdStoreError(f"run {manifest.run}: the cold store does not hold what was written "
                             f"({problems[0]}{'' if len(problems) == 1 else f'; and {len(problems) - 1} more'}); "
                             "nothing was deleted locally — check the cold store and re-run `kvjudge tier`")
    fault_point("tier.after_verify")
    with store.transaction("tiered"):
        current = store.run(manifest.run)
        tier = current.tier or {}
        finished_elsewhere = tier.get("status") == "tiered" and tier.get("manifest_ref") == manifest_ref
        if not finished_elsewhere:
            if not (tier.get("status") == "started" and tier.get("manifest_ref") == manifest_ref):
                raise StoreError(f"run {manifest.run}'s move changed under it (now {tier.get('status')}); "
                                 "run `kvjudge verify`")
            store.append(manifest.run, ev.Tiered(run=manifest.run, target=manifest.target, manifest_ref=manifest_ref,
                                                 refs=manifest.refs, endpoint=endpoint))
    fault_point("tier.after_tiered")
    deleted = _release(store, manifest.run)
    # Another process (a concurrent `tier` or `verify`) committed this very move first: nothing was lost.
    return TierResult(manifest.run, "already_tiered" if finished_elsewhere else "tiered", manifest.target,
                      manifest_ref, endpoint=endpoint, refs=len(manifest.entries), bytes=manifest.total_bytes,
                      uploaded=uploaded, deleted=deleted, recovered=recovered)




def _release(store: Store, run_id: str) -> int:
    """Step 6: delete the local bodies the log says are tiered (one transaction). Returns how many went."""
    tiered = [row[0] for row in store.connection.execute(
        "SELECT r.ref FROM run_bodies AS r JOIN blobs AS b ON b.ref = r.ref "
        "WHERE r.run = ? AND r.status = ? AND typeof(b.body) != 'null'", (run_id, TIERED))]
    if not tiered:
        return 0
    # This SQLite build zeroes freed pages (secure_delete=1), which writes every deleted body once more to the
    # WAL and again at checkpoint: 2x the I/O of the move itself. A tiered body is not a secret to scrub (it
    # lives on in the cold store), so this one deletion uses FAST: freed pages are zeroed only when free to do.
    conn = store.connection
    previous = conn.execute("PRAGMA secure_delete").fetchone()[0]
    conn.execute("PRAGMA secure_delete = FAST")
    try:
        return len(store.release_bodies(tiered, label="tier_delete"))
    finally:
        conn.execute(f"PRAGMA secure_delete = {int(previous)}")


def recover_run(store: Store, run_id: str, stores: ColdStores, *, verify_remote: bool = False,
                progress: ProgressFn | None = None) -> TierResult | None:
    """Finish a crashed move of ``run_id``; None when there is nothing to finish."""
    state = store.run(run_id)
    tier = state.tier
    if not tier:
        return None
    if tier["status"] == "started":
        manifest = logged_manifest(store, run_id, tier["manifest_ref"])
        cold = stores.for_move(store, run_id, tier["manifest_ref"])  # where the log says the move goes
        cold.check()
        # A writer killed mid-object may have left a partial temp file: the move's own keys are swept.
        cold.discard_partial([blob_key(ref) for ref in manifest.refs] + [manifest.key])
        return _finish_move(store, manifest, tier["manifest_ref"], cold, tier.get("endpoint"),
                            verify_remote=verify_remote, progress=progress, skip_present=True, recovered="upload")
    if tier["status"] == "tiered":
        deleted = _release(store, run_id)
        if deleted:
            return TierResult(run_id, "tiered", tier["target"], tier["manifest_ref"], endpoint=tier.get("endpoint"),
                              deleted=deleted, recovered="delete")
    return None


def recover(store: Store, stores: ColdStores, *, progress: ProgressFn | None = None) -> list[TierResult]:
    """Finish every crashed move in the store (run at the start of every ``tier`` and ``verify``)."""
    results = []
    for run_id in pending_runs(store):
        result = recover_run(store, run_id, stores, progress=progress)
        if result is not None:
            results.append(result)
    return results


def pending_runs(store: Store) -> list[str]:
    """Runs whose move is unfinished: TierStarted without Tiered, or Tiered with local bodies left."""
    rows = store.connection.execute(
        "SELECT DISTINCT b.run FROM run_bodies AS b JOIN blobs ON blobs.ref = b.ref "
        "WHERE b.status = ? AND typeof(blobs.body) != 'null' ORDER BY b.run", (TIERED,)).fetchall()
    pending = {row[0] for row in rows}
    for run_id in store.run_ids():
        tier = store.run(run_id).tier
        if tier and tier["status"] == "started":
            pending.add(run_id)
    return sorted(pending)



@dataclass
class TierPlan:
    """Which runs ``tier --all`` would move (eligible, with local bodies, not yet tiered)."""

    runs: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)


def plan_all(store: Store) -> TierPlan:
    """Eligible runs for ``tier --all``; ineligible ones are listed with the reason (not an error)."""
    plan = TierPlan()
    for state in store.iter_runs():
        if not is_reducible(state.state):
            plan.skipped[state.id] = f"{state.state} (not terminal)"
        elif state.tier and state.tier["status"] == "tiered":
            plan.skipped[state.id] = "already tiered"
        else:
            plan.runs.append(state.id)
    return plan
