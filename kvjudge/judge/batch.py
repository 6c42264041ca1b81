"""One batch of pairs run through the pipeline's stages (:mod:`kvjudge.judge.pipeline` names them): verdicts
already known, views, prompts, scores, verdicts; cache writes gathered and written a few dozen at a time in one
transaction; interrupted, everything answered so far written first. With a shared job
(:mod:`kvjudge.retention.shared_job`) each pair is claimed before its views are packed, its verdict written in the
transaction that releases the claim, and the pairs other workers hold waited for and read from the cache."""

from __future__ import annotations

import dataclasses
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kvjudge.errors import JudgeError
from kvjudge.judge.evidence import RunEvidence
from kvjudge.judge.labels import LabelScore, PromptOverflow
from kvjudge.judge.ledger import Ledger
from kvjudge.judge.pack import (
    BaseView,
    PackedView,
    PairBases,
    RunTokens,
    pack_pair,
    pair_bases,
)
from kvjudge.judge.verdict import (
    SCORED,
    OrderPrompt,
    OrderScore,
    PairReduce,
    SideRecord,
    Verdict,
    conclude,
    judge_settings,
    score_from_payload,
    score_payload,
    verdict_from_record,
    verdict_key,
    verdict_record,
    view_sources,
)

if TYPE_CHECKING:
    from kvjudge.judge.pipeline import Judge
    from kvjudge.retention.shared_job import SharedJob, Sharing
    from kvjudge.retention import Store
    from kvjudge.retention.state import RunState

VerdictFn = Callable[[int, Verdict], None]
# on_plan(calls at most, verdicts from the cache): said once the cache has been read, before any call is sent.
PlanFn = Callable[[int, int], None]
# Cache writes gathered before one transaction writes them.
_WRITE_BATCH = 64


@dataclass
class _Pending:
    """A pair on its way: its views, the orders scored so far, the calls it waits for, its own seconds."""

    index: int
    view_a: PackedView
    view_b: PackedView
    started: float
    seconds: float
    complete: bool
    orders: list[OrderScore] = field(default_factory=list)
    waiting: int = 0
    failure: JudgeError | None = None
    cost: Ledger = field(default_factory=Ledger)  # the calls this pair sent (an answer it only read costs nothing)


class PairBatch:
    """One run of the pipeline over ``pairs`` (see the module docstring)."""

    def __init__(self, judge: Judge, store: Store, pairs: Sequence[tuple[str, str]], reduce_to: PairReduce,
                 full: bool, bound: str, on_call: Callable[[], None] | None, on_verdict: VerdictFn | None) -> None:
        self.judge, self.store, self.pairs = judge, store, list(pairs)
        self.reduce_to, self.full, self.bound = reduce_to, full, bound
        self.on_call, self.on_verdict = on_call, on_verdict
        self.verdicts: list[Verdict | None] = [None] * len(self.pairs)
        self.reported = 0
        self.states: dict[str, RunState] = {}
        self.bases: dict[tuple[str, int | None], BaseView] = {}
        self.uses: Counter[tuple[str, int | None]] = Counter()
        self.keys: dict[int, str] = {}
        self.fitted: dict[int, PairBases | Verdict] = {}
        self.asked: dict[str, list[tuple[_Pending, OrderPrompt]]] = {}   # order key → pairs waiting for it
        self.answered: dict[str, LabelScore] = {}                        # order key → its answer, this batch
        self.sent: list[tuple[_Pending, list[OrderPrompt]]] = []         # group → pair, prompts sent
        self.writes: dict[str, dict[str, Any]] = {}
        self.needed = 0
        self.manifest: dict[str, Any] = {}
        self.settings: dict[str, Any] = {}
        self.on_plan: PlanFn | None = None
        self.sharing: Sharing | None = None   # set: each pair to judge is a unit of a job shared with others
        self.job: SharedJob | None = None
        self.left: list[int] = []             # pairs another worker holds (sharing): waited for, then read
        self.all_keys: list[str] = []

    def target(self, pair: tuple[str, str]) -> int | None:
        return self.reduce_to.get(pair) if isinstance(self.reduce_to, Mapping) else self.reduce_to

    def state(self, run_id: str) -> RunState:
        if run_id not in self.states:
            self.states[run_id] = self.store.runs.run(run_id)
        return self.states[run_id]

    def run(self) -> list[Verdict]:
        judge = self.judge
        self.manifest = judge.manifest()
        self.settings = judge_settings(self.manifest)
        if judge.protocol.rubric is not None:
            judge.check_room(judge.window_cap(self.bound))
        misses = self.known() if judge.use_cache else list(range(len(self.pairs)))
        if self.on_plan is not None:
            self.on_plan(len(misses) * judge.protocol.calls, len(self.pairs) - len(misses))
        try:
            if misses and self.sharing is not None and judge.use_cache:
                cached = [key for index, key in enumerate(self.all_keys) if index not in self.keys]
                with self.sharing.job("verdict", self.all_keys, cached=cached) as self.job:
                    self.score(misses)
                    self.await_others()
            elif misses:
                self.score(misses)
        finally:
            # Also on Ctrl-C or a fatal error (a refused key): what was answered stays answered.
            self.flush()
        missing = [index for index, verdict in enumerate(self.verdicts) if verdict is None]
        if missing:  # every call reports exactly once; anything else is a bug, never a silent gap
            raise JudgeError(f"internal: {len(missing)} pair(s) were never decided")
        return [verdict for verdict in self.verdicts if verdict is not None]

    def score(self, misses: list[int]) -> None:
        """Stages 2 to 5 for the pairs of ``misses`` (with a shared job: those this worker claims)."""
        judge = self.judge
        if not judge.backend.window_fixed:
            # An in-process window is sized to the pairs: every pair's views first, then the window.
            for index in misses:
                self.fitted[index] = self.pair_views(index)
            if self.needed:
                judge.open_window(self.needed, self.bound)
        first = len(self.sent)  # a later round's groups are numbered from 0 again
        judge.backend.score_many(self.groups(misses), lambda group, *rest: self.on_result(first + group, *rest))
        if judge.backend.window_fixed and self.needed:
            judge.open_window(self.needed, self.bound)  # a server's window: only what it says of the pairs

    def await_others(self) -> None:
        """Wait for the pairs other workers hold: read each verdict they wrote, judge those whose leases expired."""
        assert self.job is not None
        while self.left:
            left, self.left = self.left, []
            taken, done = self.job.wait([self.keys[index] for index in left])
            started = time.perf_counter()
            records = self.store.caches.get_judgments([self.keys[index] for index in left
                                                       if self.keys[index] in done])
            for index in left:
                key = self.keys[index]
                if key in records:
                    self.from_cache(index, records[key], time.perf_counter() - started)
                elif key in done:  # settled, yet its verdict is not cached (it failed): said, never waited for
                    self.decided(index, self.failed(*self.pairs[index], "this pair's verdict is not in the store "
                                                    "(judging it failed, here or in another worker); judge it again",
                                                    started))
            self.left += [index for index in left if self.keys[index] not in taken and self.keys[index] not in done]
            again = [index for index in left if self.keys[index] in taken]
            if again:
                self.score(again)

    def from_cache(self, index: int, record: Mapping[str, Any], seconds: float) -> None:
        """Decide pair ``index`` from its cached verdict record (no call: its orders counted as read)."""
        a, b = self.pairs[index]
        verdict = dataclasses.replace(verdict_from_record(record, a, b, margin=self.judge.margin, seconds=seconds),
                                      cost=Ledger())  # read from the cache: no call
        for _ in range(self.judge.protocol.calls):
            self.called()
        self.decided(index, verdict)

    # -------------------------------------------------------------------- stage 1: verdicts already known
    def known(self) -> list[int]:
        """Decide every pair whose verdict is cached; the indexes of the others. Each run's view source is kept
        under its state's digest, and every pair's verdict looked up at once: once kept, no run is decoded."""
        started = time.perf_counter()
        window = self.judge.window_cap(self.bound)
        slack = self.judge.backend.slack_tokens
        sources = view_sources(self.store, (run_id for pair in self.pairs for run_id in pair), self.state,
                               show_grades=self.judge.show_grades, show_verifier=self.judge.show_verifier)
        keys = [verdict_key(self.settings, window=window, slack=slack, source_a=sources[a], source_b=sources[b],
                            reduce_to=self.target((a, b)), full=self.full) for a, b in self.pairs]
        records = self.store.caches.get_judgments(keys)
        self.all_keys = keys
        share = (time.perf_counter() - started) / max(1, len(self.pairs))  # each pair's part of the look-up
        misses = []
        for index, key in enumerate(keys):
            record = records.get(key)
            if record is None:
                self.keys[index] = key
                misses.append(index)
                continue
            self.from_cache(index, record, share)
        return misses

    # ----------------------------------------------------------------------------------- stage 2: views
    def pair_views(self, index: int) -> PairBases | Verdict:
        """The pair's two views and their common block (an error verdict where counting tokens failed)."""
        a, b = self.pairs[index]
        target = self.target((a, b))
        started = time.perf_counter()
        try:
            views = []
            for run_id in (a, b):
                key = (run_id, target)
                if key not in self.bases:
                    self.bases[key] = self.judge.base_of(self.store, self.state(run_id), reduce_to=target,
                                                         full=self.full)
                views.append(self.bases[key])
            pair = pair_bases(views[0], views[1], self.judge.counter)
            self.needed = max(self.needed, self.judge.framing_tokens + pair.tokens)
        except JudgeError as exc:  # the backend failed while counting tokens: an outcome, not a crash
            return self.failed(a, b, str(exc), started)
        return pair

    def failed(self, a: str, b: str, message: str, started: float) -> Verdict:
        unknown = RunTokens(full=None, reduced=None, view=None, further_reduced=False)
        side = {run: SideRecord(run, unknown, (), None, RunEvidence(None, None)) for run in (a, b)}
        return conclude((side[a], side[b]), [], JudgeError(message), margin=self.judge.margin,
                        manifest=self.manifest, common_tokens=0, seconds=time.perf_counter() - started,
                        overflow=None)

    def release(self, index: int) -> None:
        """Forget the runs' views once their last pair of the batch is packed."""
        a, b = self.pairs[index]
        target = self.target((a, b))
        for key in ((a, target), (b, target)):
            self.uses[key] -= 1
            if self.uses[key] <= 0:
                self.bases.pop(key, None)

    # ------------------------------------------------------------------------ stage 3: prompts (and packing)
    def groups(self, misses: list[int]) -> Iterator[list[OrderPrompt]]:
        """Each pair's calls still to make, prepared as the backend asks for them."""
        for index in misses:
            a, b = self.pairs[index]
            target = self.target((a, b))
            self.uses.update([(a, target), (b, target)])
        for index in misses:
            if self.job is not None and not self.job.take(self.keys[index]):
                self.left.append(index)  # another worker holds it, or did it: waited for afterwards
                self.fitted.pop(index, None)
                self.release(index)
                continue
            prompts = self.prepare(index)
            if prompts:
                yield prompts

    def prepare(self, index: int) -> list[OrderPrompt]:
        """Pack the pair and ask for its orders; the prompts to send (none: decided, or waiting on others)."""
        started = time.perf_counter()
        fitted = self.fitted.pop(index, None) or self.pair_views(index)
        if isinstance(fitted, Verdict):
            self.release(index)
            self.finish_unit(index, fitted, done=False)
            self.decided(index, fitted)
            return []
        view_a, view_b = pack_pair(fitted.a, fitted.b, self.judge.counter, self.judge.room, fitted)
        self.release(index)
        pending = _Pending(index, view_a, view_b, started, time.perf_counter() - started, fitted.complete)
        if view_a.text is None or view_b.text is None:
            self.conclude(pending)
            return []
        send: list[OrderPrompt] = []
        use_cache = self.judge.use_cache
        for prompt in self.judge.order_prompts(view_a, view_b):
            answer = self.answered.get(prompt.key)
            if answer is None and use_cache and prompt.key not in self.asked:
                payload = self.store.caches.get_judgment(prompt.key)
                if payload is not None:
                    answer = self.answered[prompt.key] = score_from_payload(payload)
                    pending.orders.append(self.judge.reading_score(prompt, answer, True))
                    self.called()
                    continue
            if answer is not None:  # answered earlier in this batch: read as from the cache
                pending.orders.append(self.judge.reading_score(prompt, answer, use_cache))
                self.called()
                continue
            pending.waiting += 1
            if prompt.key in self.asked:  # the same call is already on its way: wait for its answer
                self.asked[prompt.key].append((pending, prompt))
            else:
                self.asked[prompt.key] = [(pending, prompt)]
                send.append(prompt)
        if send:
            self.sent.append((pending, send))
        elif not pending.waiting:
            self.conclude(pending)
        return send

    # ----------------------------------------------------------------------------------- stage 4: scores
    def on_result(self, group: int, position: int, score: LabelScore | None, failure: JudgeError | None,
                  _server: str | None, seconds: float) -> None:
        sender, prompts = self.sent[group]
        prompt = prompts[position]
        sender.seconds += seconds
        if score is not None and score.cost is not None:
            sender.cost.add(score.cost)
        if score is not None:
            self.answered[prompt.key] = score
            if self.judge.use_cache:
                self.write(prompt.key, score_payload(score, self.manifest))
        for place, (pending, asked) in enumerate(self.asked.pop(prompt.key, [])):
            if score is not None:
                # The later waiters read the answer as a later batch would read the cache.
                pending.orders.append(self.judge.reading_score(asked, score, place > 0 and self.judge.use_cache))
            elif pending.failure is None:
                pending.failure = failure
            pending.waiting -= 1
            self.called()
            if not pending.waiting:
                self.conclude(pending)

    # ---------------------------------------------------------------------------------- stage 5: verdicts
    def conclude(self, pending: _Pending) -> None:
        verdict = dataclasses.replace(self.judge.conclude(pending.view_a, pending.view_b, pending.orders,
                                                          pending.failure, started=pending.started,
                                                          seconds=pending.seconds), cost=pending.cost)
        key = self.keys.get(pending.index)
        skeleton_overflow = verdict.outcome == "overflow" and not isinstance(pending.failure, PromptOverflow)
        cacheable = (key is not None and pending.complete and pending.failure is None
                     and (verdict.outcome in SCORED or skeleton_overflow)
                     and judge_settings(verdict.manifest) == self.settings)
        if cacheable:
            assert key is not None
            sides = (SideRecord.of(pending.view_a), SideRecord.of(pending.view_b))
            self.write(key, verdict_record(verdict, sides))
        self.finish_unit(pending.index, verdict, done=cacheable)
        self.decided(pending.index, verdict)

    def finish_unit(self, index: int, verdict: Verdict, *, done: bool) -> None:
        """With a shared job: the pair's claim released in the transaction that writes its verdict (and every
        answer gathered so far), with what its calls cost."""
        if self.job is not None:
            cost = verdict.cost.to_json() if verdict.cost.calls else None
            self.flush(lambda: self.job.finish(self.keys[index], cost, done=done))  # type: ignore[union-attr]

    def decided(self, index: int, verdict: Verdict) -> None:
        """Keep the verdict; report every verdict now decided in pair order."""
        self.verdicts[index] = verdict
        while self.reported < len(self.verdicts) and self.verdicts[self.reported] is not None:
            if self.on_verdict is not None:
                self.on_verdict(self.reported, self.verdicts[self.reported])  # type: ignore[arg-type]
            self.reported += 1

    def called(self) -> None:
        if self.on_call is not None:
            self.on_call()

    def write(self, key: str, payload: dict[str, Any]) -> None:
        self.writes[key] = payload
        if len(self.writes) >= _WRITE_BATCH:
            self.flush()

    def flush(self, also: Callable[[], None] | None = None) -> None:
        """Write the gathered cache entries in one transaction, ``also`` inside it (a claim released with the
        verdict it claimed), and the token counts made since the last."""
        self.judge.counter.save(self.store.caches)
        if not self.writes and also is None:
            return
        with self.store.transaction("put_judgments"):
            for key, payload in self.writes.items():
                self.store.caches.put_judgment(key, payload)
            if also is not None:
                also()
        self.writes.clear()


__all__ = ["PairBatch", "PlanFn", "VerdictFn"]
