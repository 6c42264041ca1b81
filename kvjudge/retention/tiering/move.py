"""The move of a run's bodies to a cold store, and its recovery after a crash.

Every step is durable before the next starts (remote commit acknowledged before any local delete):

1. only terminal runs (graded / ungraded / archived) are eligible; anything else is a RunStateError; with a
   :class:`TierGate`, only runs within their token ceiling (reduce first), unless the gate says ``unreduced``;
2. ``TierStarted{target, endpoint, manifest_ref}`` is appended — the log now says a move is under way, and to
   where (the manifest is rebuilt from the log whenever needed, see :mod:`.manifest`); whether to move is
   decided inside that transaction, on the committed state; its commit does not wait for the disk (``Tiered``'s
   does, and syncs it too);
3. every local body of the run is uploaded, in packs (keys derived from the move: a retry rewrites identical
   bytes; a move logged before packs finishes with one content-addressed blob per body), then the manifest, last
   and conditionally — its presence is the remote's commit (a local directory syncs the packs' directories
   first);
4. what the remote holds is read back and checked (sizes, and the remote's own SHA-256 where it keeps
   one; a full re-hash with ``verify_remote``);
5. ``Tiered{target, manifest_ref, refs}`` is appended — the local record that the remote committed;
6. only then are the local bodies deleted, in one transaction.

A crash anywhere leaves one of three logs, and :func:`recover` (run at the start of every ``tier`` and
``verify``) finishes each: no tier events → nothing happened locally (remote objects, if any, are
identical re-uploadable copies); ``TierStarted`` without ``Tiered`` → redo steps 3–6 for the recorded
manifest, skipping objects the remote already holds; ``Tiered`` with bodies still here → step 6. A crash
therefore leaves at most a duplicate (remote and local), never a loss.

Moves of several runs overlap (:func:`tier_runs`): while one run's bodies upload, the runs before take steps
3 (manifest) to 6 on threads of their own, several at once — each run still in the order above.
"""

from __future__ import annotations

import dataclasses
import queue
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvjudge.errors import ColdStoreError, RunStateError, StoreError, UsageError
from kvjudge.retention import events as ev
from kvjudge.retention.blobs import ref_of
from kvjudge.retention.cold import ColdStore
from kvjudge.retention.faults import fault_point
from kvjudge.retention.lifecycle import REDUCIBLE, is_reducible
from kvjudge.retention.reduce_apply import in_cold_storage
from kvjudge.retention.stored_tokens import count_ahead, run_tokens
from kvjudge.retention.state import RunState
from kvjudge.retention.store import Store
from kvjudge.retention.tiering.manifest import Manifest, build_manifest, logged_manifest
from kvjudge.retention.tiering.targets import ColdStores
from kvjudge.retention.tiering.transfer import (
    Batch,
    BodyVanished,
    FinishedElsewhere,
    ProgressFn,
    Uploader,
    check_manifest,
    check_remote,
    upload_and_check,
    vanished,
)
from kvjudge.tokens import TokenCounter


#: Threads finishing moves at once (:class:`_Finisher`): a move's finishing is mostly waits on the disk.
FINISHERS = 4

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
    return store.runs.local_body_bytes(run_id)


def check_eligible(state: RunState) -> None:
    """RunStateError unless grading of ``state`` terminated (graded, ungraded, archived)."""
    if not is_reducible(state.state):
        raise RunStateError(
            f"run {state.id} is {state.state}; only {', '.join(sorted(REDUCIBLE))} runs can be tiered — "
            "finish grading it first (`kvjudge mark RUN graded`)")


def tier_run(store: Store, run_id: str, cold: ColdStore, *, gate: TierGate | None = None,
             stores: ColdStores | None = None, verify_remote: bool = False,
             progress: ProgressFn | None = None) -> TierResult:
    """Move the local bodies of ``run_id`` to ``cold`` (see the module doc for the steps); :func:`tier_runs`
    for one run."""
    return tier_runs(store, [run_id], cold, gates=(lambda _state: gate), stores=stores, verify_remote=verify_remote,
                     progress=progress)[0]


def tier_runs(store: Store, run_ids: Sequence[str], cold: ColdStore, *,
              gates: Callable[[RunState], TierGate | None] | None = None, stores: ColdStores | None = None,
              verify_remote: bool = False, progress: ProgressFn | None = None) -> list[TierResult]:
    """Move the local bodies of each run to ``cold``, in order; one result per run.

    With a gate (``gates(state)``) a run above its ceiling is not moved (``above_ceiling``) unless the gate says
    ``unreduced``. Whether to move is decided inside the transaction that appends ``TierStarted``, on the
    committed state: a run another process reduced, tiered or started to tier meanwhile is judged as it is now
    (a move already under way is joined: its recovery is idempotent). Idempotent: a run already tiered is left
    alone (``already_tiered``); a run whose earlier move crashed is finished first, where its log says
    (``stores`` opens it; default: ``cold``'s endpoint).

    The moves overlap: while one run's bodies upload, the run before is finished (manifest, read-back,
    ``Tiered``, local delete) on a thread with a connection of its own. Each move still takes its steps in
    order, each durable before the next.
    """
    if not run_ids:
        return []
    stores = stores or ColdStores(cold.endpoint_url)
    results: dict[str, TierResult] = {}
    checked = False
    with Uploader(cold, store, rehash=verify_remote, progress=progress) as uploader, \
            _Finisher(store, cold, verify_remote=verify_remote) as finisher:
        for run_id in run_ids:
            finisher.raise_failure()
            state = store.runs.run(run_id)
            check_eligible(state)
            if not in_cold_storage(state):
                if not checked:
                    cold.check()  # a store that is down fails here, before anything is written locally
                    checked = True
                gate = gates(state) if gates else None
                if gate is not None:
                    count_ahead(store, state, gate.counter)  # tokenizing is slow: never under the write lock
                started: _Started | TierResult | None = None
                # TierStarted is not waited for on disk (one sync less per run, on the thread that starts every
                # move, while the uploads keep the disk busy). Lost at a power cut it takes nothing with it: nothing
                # is deleted before Tiered, whose durable commit syncs the log up to it first (the log is written in
                # order); what the move wrote remotely is what a new move of the same log writes again, under the
                # same keys — the events before it were durable, so the same last LSN means the same manifest.
                with store.transaction("tier_start", durable=False):
                    current = store.runs.run(run_id)  # the committed state, under the write lock
                    check_eligible(current)
                    if not in_cold_storage(current):
                        started = _start(store, current, cold, gate)
                if isinstance(started, TierResult):
                    results[run_id] = started
                    continue
                if started is not None:
                    fault_point("tier.after_started")
                    moved = _send(store, started, cold, uploader, finisher, verify_remote=verify_remote,
                                  progress=progress)
                    if moved is not None:
                        results[run_id] = moved
                    continue
            recovered = recover_run(store, run_id, stores, verify_remote=verify_remote, progress=progress)
            results[run_id] = recovered or _already_tiered(store, run_id)
        results.update(finisher.close())
    return [results[run_id] for run_id in run_ids]


def _send(store: Store, started: _Started, cold: ColdStore, uploader: Uploader, finisher: _Finisher, *,
          verify_remote: bool, progress: ProgressFn | None) -> TierResult | None:
    """Step 3 for a move just started: hand its bodies to the uploader, then the move to the finisher (None: the
    finisher has it). A remote already holding the manifest is finished here and now."""
    manifest = started.manifest
    if cold.get_manifest(manifest.key) is not None:  # another process got this far first
        return started.apply(_finish_move(store, manifest, started.manifest_ref, cold, cold.endpoint_url,
                                          verify_remote=verify_remote, progress=progress, skip_present=False,
                                          recovered=None))
    batch = Batch(manifest.run)
    for remote in manifest.objects:
        uploader.send(batch, remote)
    finisher.add(started, batch)
    return None


def _already_tiered(store: Store, run_id: str) -> TierResult:
    """Nothing to do: the run's move is committed (by this process earlier, or by another)."""
    tier = store.runs.run(run_id).tier or {}
    return TierResult(run_id, "already_tiered", tier.get("target"), tier.get("manifest_ref"),
                      endpoint=tier.get("endpoint"))


class _Finisher:
    """Finishes started moves on a few threads of their own (steps 4–6: wait for the uploads, manifest,
    read-back, ``Tiered``, local delete), each with its own connection to the store, while the caller reads and
    sends the next run's bodies. Each move is finished by one thread, in its steps' order; moves of different runs
    are independent, so several finish at once — a move's finishing is mostly waits on the disk (its packs'
    directories, the manifest, the ``Tiered`` commit), and one thread finishing moves one after the other was the
    whole move's bottleneck. The first failure stops them; :meth:`raise_failure` hands it to the caller."""

    def __init__(self, source: Store, cold: ColdStore, *, verify_remote: bool) -> None:
        self._source = source
        self._cold = cold
        self._verify_remote = verify_remote
        # At most two moves per thread wait to be finished: the caller starts no run further ahead than that.
        self._queue: queue.Queue[tuple[_Started, Batch] | None] = queue.Queue(maxsize=2 * FINISHERS)
        self._results: dict[str, TierResult] = {}
        self._failure: BaseException | None = None
        self._threads = [threading.Thread(target=self._run, name=f"kvjudge-tier-finish-{index}", daemon=True)
                         for index in range(FINISHERS)]
        for thread in self._threads:
            thread.start()

    def __enter__(self) -> _Finisher:
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop()

    def add(self, started: _Started, batch: Batch) -> None:
        self._queue.put((started, batch))

    def raise_failure(self) -> None:
        if self._failure is not None:
            raise self._failure

    def close(self) -> dict[str, TierResult]:
        """Wait for every move handed over; their results (or the first failure)."""
        self._stop()
        self.raise_failure()
        return self._results

    def _stop(self) -> None:
        alive = [thread for thread in self._threads if thread.is_alive()]
        for _thread in alive:
            self._queue.put(None)  # one each: a thread takes one and stops
        for thread in alive:
            thread.join()

    def _run(self) -> None:
        store: Store | None = None
        try:
            while (item := self._queue.get()) is not None:
                if self._failure is not None:
                    continue  # after a failure the rest stay started: the next `tier` or `verify` finishes them
                started, batch = item
                store = store or self._source.open_another()
                try:
                    self._results[started.manifest.run] = started.apply(self._finish(store, started, batch))
                except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
                    self._failure = self._failure or exc
        finally:
            if store is not None:
                store.close()

    def _finish(self, store: Store, started: _Started, batch: Batch) -> TierResult:
        try:
            problems = batch.wait()
        except BodyVanished as exc:
            if isinstance(vanished(store, started.manifest, exc), FinishedElsewhere):
                return _already_tiered(store, started.manifest.run)
            raise
        return _complete_move(store, started.manifest, started.manifest_ref, self._cold, self._cold.endpoint_url,
                              uploaded=batch.sent, problems=problems, verify_remote=self._verify_remote,
                              recovered=None)


@dataclass(frozen=True)
class _Started:
    """A move whose ``TierStarted`` was appended (it commits with the transaction that appended it)."""

    manifest: Manifest
    manifest_ref: str
    tokens: int | None
    ceiling: int | None
    unreduced: dict[str, Any] | None

    def apply(self, result: TierResult) -> TierResult:
        """``result`` with the figures the move was gated on."""
        return dataclasses.replace(result, tokens=self.tokens, ceiling=self.ceiling, unreduced=self.unreduced)


def _start(store: Store, state: RunState, cold: ColdStore, gate: TierGate | None) -> _Started | TierResult:
    """Inside the ``tier_start`` transaction: gate ``state`` on its ceiling and append ``TierStarted`` — or say
    why nothing moves (``above_ceiling``, ``nothing_local``)."""
    unreduced = None
    tokens = ceiling = None
    if gate is not None:
        # On the committed state (whose visible bodies are all here), from the counts stored ahead: only a body
        # a concurrent reduction added since is counted under the lock.
        tokens, ceiling = run_tokens(store, state, gate.counter), gate.ceiling
        if ceiling is None or tokens > ceiling:
            if not gate.unreduced:
                return TierResult(state.id, "above_ceiling", cold.url, None, endpoint=cold.endpoint_url,
                                  tokens=tokens, ceiling=ceiling)
            unreduced = {"tokens": tokens, "ceiling": ceiling, "counter": gate.counter.name}
    first_lsn, last_lsn = store.events.event_range(state.id)
    manifest = build_manifest(store.blobs, state, cold.url, first_lsn, last_lsn, require_bodies=True)
    if not manifest.entries:
        return TierResult(state.id, "nothing_local", cold.url, None, endpoint=cold.endpoint_url, tokens=tokens,
                          ceiling=ceiling)
    manifest_ref = ref_of(manifest.to_bytes())
    store.events.append(state.id, ev.TierStarted(run=state.id, target=cold.url, manifest_ref=manifest_ref,
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
        try:
            uploaded, problems = upload_and_check(store, manifest, cold, skip_present=skip_present,
                                                  rehash=verify_remote, progress=progress)
        except FinishedElsewhere:
            return _already_tiered(store, manifest.run)
        return _complete_move(store, manifest, manifest_ref, cold, endpoint, uploaded=uploaded, problems=problems,
                              verify_remote=verify_remote, recovered=recovered)
    if remote != raw:
        raise ColdStoreError(f"{cold.url}/{manifest.key} holds a different manifest than run {manifest.run}'s "
                             "move recorded; inspect the cold store before retrying")
    if progress is not None:
        progress(manifest.total_bytes)
    problems = check_remote(cold, manifest, raw, rehash=verify_remote)
    return _commit_move(store, manifest, manifest_ref, cold, endpoint, uploaded=0, problems=problems,
                        verify_remote=verify_remote, recovered=recovered)


def _complete_move(store: Store, manifest: Manifest, manifest_ref: str, cold: ColdStore, endpoint: str | None, *,
                   uploaded: int, problems: list[str], verify_remote: bool, recovered: str | None) -> TierResult:
    """Steps 3 (the manifest, last) to 6, once every body of the move was uploaded and read back."""
    raw = manifest.to_bytes()
    fault_point("tier.after_blobs")
    cold.put_manifest(manifest.key, raw)  # its presence is the remote's commit (blobs made durable first)
    fault_point("tier.manifest_response_lost")
    problems = problems + check_manifest(cold, manifest, raw)
    return _commit_move(store, manifest, manifest_ref, cold, endpoint, uploaded=uploaded, problems=problems,
                        verify_remote=verify_remote, recovered=recovered)


def _commit_move(store: Store, manifest: Manifest, manifest_ref: str, cold: ColdStore, endpoint: str | None, *,
                 uploaded: int, problems: list[str], verify_remote: bool, recovered: str | None) -> TierResult:
    """Steps 4–6: a remote that disagrees gets one repair pass; then ``Tiered``; then the local delete."""
    raw = manifest.to_bytes()
    if problems:
        # One repair pass (the local bodies are all still here): rewrite every body — same bytes, same keys —
        # and the manifest, then check again. A remote that still disagrees is an error; nothing is deleted.
        try:
            rewritten, problems = upload_and_check(store, manifest, cold, skip_present=False, rehash=verify_remote,
                                                   progress=None)
        except FinishedElsewhere:
            return _already_tiered(store, manifest.run)
        uploaded += rewritten
        cold.put_manifest(manifest.key, raw)
        problems += check_manifest(cold, manifest, raw)
    if problems:
        raise ColdStoreError(f"run {manifest.run}: the cold store does not hold what was written "
                             f"({problems[0]}{'' if len(problems) == 1 else f'; and {len(problems) - 1} more'}); "
                             "nothing was deleted locally — check the cold store and re-run `kvjudge tier`")
    fault_point("tier.after_verify")
    with store.transaction("tiered"):
        current = store.runs.run(manifest.run)
        tier = current.tier or {}
        finished_elsewhere = tier.get("status") == "tiered" and tier.get("manifest_ref") == manifest_ref
        if not finished_elsewhere:
            if not (tier.get("status") == "started" and tier.get("manifest_ref") == manifest_ref):
                raise StoreError(f"run {manifest.run}'s move changed under it (now {tier.get('status')}); "
                                 "run `kvjudge verify`")
            store.events.append(manifest.run, ev.Tiered(run=manifest.run, target=manifest.target, manifest_ref=manifest_ref,
                                                 refs=manifest.refs, endpoint=endpoint))
    fault_point("tier.after_tiered")
    deleted = _release(store, manifest.run)
    # Another process (a concurrent `tier` or `verify`) committed this very move first: nothing was lost.
    return TierResult(manifest.run, "already_tiered" if finished_elsewhere else "tiered", manifest.target,
                      manifest_ref, endpoint=endpoint, refs=len(manifest.entries), bytes=manifest.total_bytes,
                      uploaded=uploaded, deleted=deleted, recovered=recovered)


def _release(store: Store, run_id: str) -> int:
    """Step 6: delete the local bodies the log says are tiered (one transaction). Returns how many went."""
    tiered = store.runs.tiered_bodies_here(run_id)
    if not tiered:
        return 0
    # A tiered body lives on in the cold store: not a secret to scrub, and zeroing it would double the move's I/O.
    # Nor is the deletion waited for on disk: lost at a power cut, it leaves bodies the log says are tiered, which
    # recovery deletes (the Tiered event before it was).
    return len(store.blobs.release(tiered, label="tier_delete", scrub=False, durable=False))


def recover_run(store: Store, run_id: str, stores: ColdStores, *, verify_remote: bool = False,
                progress: ProgressFn | None = None) -> TierResult | None:
    """Finish a crashed move of ``run_id``; None when there is nothing to finish."""
    state = store.runs.run(run_id)
    tier = state.tier
    if not tier:
        return None
    if tier["status"] == "started":
        manifest = logged_manifest(store, run_id, tier["manifest_ref"])
        cold = stores.for_move(store, run_id, tier["manifest_ref"])  # where the log says the move goes
        cold.check()
        # A writer killed mid-object may have left a partial temp file: the move's own keys are swept.
        cold.discard_partial([remote.key for remote in manifest.objects] + [manifest.key])
        return _finish_move(store, manifest, tier["manifest_ref"], cold, tier.get("endpoint"),
                            verify_remote=verify_remote, progress=progress, skip_present=True, recovered="upload")
    if tier["status"] == "tiered":
        deleted = _release(store, run_id)
        if deleted:
            return TierResult(run_id, "tiered", tier["target"], tier["manifest_ref"], endpoint=tier.get("endpoint"),
                              deleted=deleted, recovered="delete")
    return None


def recover(store: Store, stores: ColdStores, *, verify_remote: bool = False,
            progress: ProgressFn | None = None) -> list[TierResult]:
    """Finish every crashed move in the store (run at the start of every ``tier`` and ``verify``); with
    ``verify_remote`` every remote body is re-hashed before the move is committed."""
    results = []
    for run_id in pending_runs(store):
        result = recover_run(store, run_id, stores, verify_remote=verify_remote, progress=progress)
        if result is not None:
            results.append(result)
    return results


def pending_runs(store: Store) -> list[str]:
    """Runs whose move is unfinished: TierStarted without Tiered, or Tiered with local bodies left."""
    return sorted(set(store.runs.runs_with_tiered_bodies_here()) | set(store.runs.run_ids_with_tier_status("started")))



@dataclass
class TierPlan:
    """Which runs ``tier --all`` would move (eligible, with local bodies, not yet tiered)."""

    runs: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)


def plan_all(store: Store) -> TierPlan:
    """Eligible runs for ``tier --all``; ineligible ones are listed with the reason (not an error)."""
    plan = TierPlan()
    for state in store.runs.iter_runs():
        if not is_reducible(state.state):
            plan.skipped[state.id] = f"{state.state} (not terminal)"
        elif state.tier and state.tier["status"] == "tiered":
            plan.skipped[state.id] = "already tiered"
        else:
            plan.runs.append(state.id)
    return plan
