"""The look-ahead of a reduction of many runs with a counter that asks servers: the next run counted and planned in a
background thread while the current one is written, and the counts of short texts remembered from run to run."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

from kvjudge.errors import IntegrityError, RunStateError, UsageError
from kvjudge.retention.reduce import ReductionPlan, plan_reduction
from kvjudge.retention.reduce_apply import in_cold_storage
from kvjudge.retention.state import TIERED, view_refs
from kvjudge.retention.store import Store
from kvjudge.tokens import BatchCounter

# Texts up to this long have their counts remembered through a selection of runs (cut markers, short extracts).
_REMEMBERED_CHARS = 256


class RememberedShortTexts:
    """A batch counter with the counts of short texts remembered: the cut markers (``[212 lines cut]``) recur in
    every run, and a counter that asks servers would be asked for each again, run after run."""

    def __init__(self, counter: BatchCounter) -> None:
        self.counter = counter
        self.known: dict[str, int] = {}

    @property
    def name(self) -> str:
        return self.counter.name

    def count(self, text: str) -> int:
        return self.count_many([text])[0]

    def count_many(self, texts: Sequence[str]) -> list[int]:
        asked = [text for text in dict.fromkeys(texts) if text not in self.known]
        fresh = dict(zip(asked, self.counter.count_many(asked))) if asked else {}
        self.known.update((text, tokens) for text, tokens in fresh.items() if len(text) <= _REMEMBERED_CHARS)
        return [self.known[text] if text in self.known else fresh[text] for text in texts]


# A run whose bodies hold more text than this is only counted ahead, and planned in its turn (planning ahead holds
# every body of the run in memory until its turn).
_AHEAD_RUN_CHARS = 8 << 20


class PlanningAhead:
    """Counts and plans the next run in a background thread while the current run is written: the writes wait on
    the disk, the counting on the servers, so neither waits for the other.

    The store stays on its own thread: the run's state, stored counts and texts are read here, the background thread
    counts the uncounted bodies (one batch) and plans from them (:func:`plan_reduction`, pure: the same plan as in
    its turn). In its turn the counts are stored and the plan applied; :func:`apply_plan` refuses a plan whose run
    changed meanwhile (StalePlan), which is then planned again in turn. A run in cold storage, or with more text than
    ``_AHEAD_RUN_CHARS``, is only counted ahead; a run that cannot be planned ahead (not reducible now, a body
    missing) is planned in its turn, where its error is raised as before."""

    def __init__(self, store: Store, counter: BatchCounter, token_targets: Mapping[str, int]) -> None:
        self.store, self.counter, self.token_targets = store, counter, token_targets
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kvjudge-plan-ahead")
        self.pending: Future[tuple[dict[str, int], ReductionPlan | None]] | None = None

    def start(self, run_id: str) -> None:
        state = self.store.runs.run(run_id)
        if in_cold_storage(state) or any(loc.status == TIERED for loc in state.bodies.values()):
            return
        known = self.store.caches.cached_counts(state.bodies.keys(), self.counter.name)
        texts: dict[str, str | None] = {}
        chars = 0
        for ref in state.bodies:
            texts[ref] = text = self.store.blobs.text(ref)
            chars += len(text) if text is not None else 0
        uncounted = {ref: text for ref in dict.fromkeys(view_refs(state))
                     if ref not in known and (text := texts.get(ref)) is not None}
        token_target = self.token_targets.get(state.tenant)
        plan_too = chars <= _AHEAD_RUN_CHARS and state.is_reducible and token_target is not None
        if not (uncounted or plan_too):
            return
        kept = texts if plan_too else {}  # held until the run's turn only when it is planned ahead
        del texts

        def job() -> tuple[dict[str, int], ReductionPlan | None]:
            fresh = dict(zip(uncounted, self.counter.count_many(list(uncounted.values())))) if uncounted else {}
            if not plan_too:
                return fresh, None
            assert token_target is not None
            try:
                plan = plan_reduction(state, kept.get, self.counter, token_target, counts={**known, **fresh})
            except (IntegrityError, RunStateError, UsageError):
                plan = None  # planned again in its turn, which raises or handles it as it always has
            return fresh, plan

        self.pending = self.executor.submit(job)

    def settle(self) -> ReductionPlan | None:
        """Store the counts of the run started last and return its plan (None: plan it in turn). A counting error is
        raised here, as if counted now."""
        if self.pending is None:
            return None
        pending, self.pending = self.pending, None
        fresh, plan = pending.result()
        self.store.caches.put_counts(self.counter.name, fresh)
        return plan

    def close(self) -> None:
        self.executor.shutdown(wait=True, cancel_futures=True)

