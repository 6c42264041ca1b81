"""Tiering as ``kvjudge tier RUN | --all`` asks for it, in one call: crashed moves finished first, the runs picked,
each tenant's ceiling resolved before anything moves, then the moves (:func:`.move.tier_runs`) — with a
:class:`~kvjudge.retention.shared_job.Sharing`, only those of the runs this process claims, a few at a time."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kvjudge.retention.cold import ColdStore
from kvjudge.retention.shared_job import Sharing
from kvjudge.retention.store import Store
from kvjudge.retention.tiering.move import TierGate, TierResult, local_body_bytes, plan_all, recover, tier_runs
from kvjudge.retention.tiering.targets import ColdStores
from kvjudge.tokens import TokenCounter

#: ``progress(bytes, total)``: ``bytes`` more of the ``total`` the moves upload have landed (first call: 0).
TierProgress = Callable[[int, int], None]
#: Runs a worker sharing a job claims, then moves in one :func:`.move.tier_runs` (their moves overlap), at a time.
SHARED_BATCH = 4


@dataclass(frozen=True)
class TierOutcome:
    """What one ``tier`` did: every run recovered or moved (or left behind above its ceiling), the runs ``--all``
    skipped and why, and each tenant's ceiling the moves were gated on (None: unknown, moved unreduced)."""

    target: str
    endpoint: str | None
    results: list[TierResult] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    ceilings: dict[str, int | None] = field(default_factory=dict)

    @property
    def left_behind(self) -> list[TierResult]:
        """The runs not moved because they are above their ceiling (reduce them first)."""
        return [result for result in self.results if result.status == "above_ceiling"]

    def to_dict(self) -> dict[str, Any]:
        return {"target": self.target, "endpoint": self.endpoint, "runs": [r.to_dict() for r in self.results],
                "skipped": self.skipped, "ceilings": self.ceilings,
                "left_behind": [result.run for result in self.left_behind]}


def tier_requested(store: Store, cold: ColdStore, stores: ColdStores, *, run_id: str | None,
                   ceiling: Callable[[str], int | None], counter: Callable[[], TokenCounter],
                   unreduced: bool = False, verify_remote: bool = False,
                   progress: TierProgress | None = None, sharing: Sharing | None = None) -> TierOutcome:
    """Tier ``run_id`` (None: every eligible run not tiered yet, the others listed as skipped) to ``cold``.

    Every crashed move in the store is finished first (``stores`` opens where each went); a run that recovery
    left tiered is not moved again. ``ceiling(tenant)`` is asked for every tenant of the runs to move before
    anything moves (its errors first; a StoreError for an unknown run), ``counter()`` once, only when a run is
    to move; a run above its tenant's ceiling is left behind unless ``unreduced``. ``verify_remote`` re-hashes
    every uploaded body by downloading it. With ``sharing``, each run's move is a unit of a job other processes
    started on the store share: claimed before its bodies are read, released once its local copies are deleted; a
    run another worker moved is reported as it now stands (``already_tiered``).
    """
    results = list(recover(store, stores, verify_remote=verify_remote))
    finished = {result.run for result in results}
    skipped: dict[str, str] = {}
    if run_id is None:
        plan = plan_all(store)
        run_ids, skipped = plan.runs, plan.skipped
    else:
        run_ids = [run_id]
    run_ids = [run for run in run_ids if not (run in finished and store.runs.run(run).tier["status"] == "tiered")]
    ceilings = {tenant: ceiling(tenant) for tenant in sorted({store.runs.run(run).tenant for run in run_ids})}
    gates: dict[str, TierGate] = {}
    if run_ids:
        counted_by = counter()
        gates = {tenant: TierGate(limit, counted_by, unreduced) for tenant, limit in ceilings.items()}
    total = sum(local_body_bytes(store, run) for run in run_ids) if progress is not None else 0

    def landed(size: int) -> None:
        if progress is not None:
            progress(size, total)

    landed(0)

    def move(runs: list[str]) -> list[TierResult]:
        return tier_runs(store, runs, cold, gates=lambda state: gates[state.tenant], stores=stores,
                         verify_remote=verify_remote, progress=landed)

    results += move(run_ids) if sharing is None or not run_ids else _moved_shared(store, run_ids, cold, sharing, move)
    return TierOutcome(cold.url, cold.endpoint_url, results, skipped, ceilings)


def _moved_shared(store: Store, run_ids: list[str], cold: ColdStore, sharing: Sharing,
                  move: Callable[[list[str]], list[TierResult]]) -> list[TierResult]:
    """``run_ids`` moved as a job shared with other processes: a few claimed runs at a time, then the runs others
    held, once they are done (read as they stand) or their leases expired (moved here)."""
    digests = store.runs.state_digests(run_ids)
    units = {run: f"tier:{run}:{digests[run]}:{cold.url}" for run in run_ids}
    results: dict[str, TierResult] = {}

    def settle(runs: list[str], claimed: set[str]) -> None:
        for result in move(runs):
            results[result.run] = result
        with store.transaction("finish_claim"):
            for run in runs:
                if units[run] in claimed:
                    job.finish(units[run], None, done=True)

    with sharing.job("tier", list(units.values())) as job:
        left: list[str] = []
        for start in range(0, len(run_ids), SHARED_BATCH):
            batch = run_ids[start:start + SHARED_BATCH]
            mine = [run for run in batch if job.take(units[run])]
            left += [run for run in batch if run not in mine]
            if mine:
                settle(mine, {units[run] for run in mine})
        while left:
            taken, done = job.wait([units[run] for run in left])
            ready = [run for run in left if units[run] in taken or units[run] in done]
            settle(ready, set(taken))
            left = [run for run in left if run not in ready]
    return [results[run] for run in run_ids]
