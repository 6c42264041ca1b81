"""Judging many pairs at once: every uncached order of every pair in flight across a server pool.

The stages are the sequential judge's own (:meth:`~kvjudge.judge.verdict.Judge.prepare_pairs` — one window
for the batch —, :meth:`~kvjudge.judge.verdict.Judge.order_prompts`, the judgment cache,
:meth:`~kvjudge.judge.verdict.Judge.conclude`), so a batch gives the same cache keys, manifests and decisions
as :meth:`~kvjudge.judge.verdict.Judge.judge_pairs`; only the model calls are sent concurrently
(``backend.score_many``). A backend without ``score_many`` (in-process llama-cpp-python) is judged by
``judge_pairs`` itself. Verdicts are reported in the order of the pairs, each as soon as it and every pair
before it are decided.

Identical calls within a batch (the same views in the same order) are sent once; the later ones read the answer
as the sequential path reads its cache.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

from kvjudge.errors import JudgeError
from kvjudge.judge.backends import LabelScore
from kvjudge.judge.verdict import Judge, OrderPrompt, OrderScore, PackedPair, PairReduce, Verdict, order_score

VerdictFn = Callable[[int, Verdict], None]


class _Collector:
    """Gathers each pair's order scores and reports finished verdicts in pair order."""

    def __init__(self, judge: Judge, prepared: list[PackedPair | Verdict], on_verdict: VerdictFn | None) -> None:
        self.judge = judge
        self.prepared = prepared
        self.on_verdict = on_verdict
        self.orders: dict[int, list[OrderScore]] = defaultdict(list)
        self.failures: dict[int, JudgeError] = {}
        self.waiting = [0] * len(prepared)
        self.seconds = [item.pack_seconds if isinstance(item, PackedPair) else 0.0 for item in prepared]
        self.verdicts: list[Verdict | None] = [None] * len(prepared)
        self._next = 0

    def add(self, index: int, order: OrderScore | None, failure: JudgeError | None) -> None:
        if order is not None:
            self.orders[index].append(order)
        if failure is not None and index not in self.failures:
            self.failures[index] = failure
        self.waiting[index] -= 1
        self.flush()

    def flush(self) -> None:
        while self._next < len(self.prepared) and self.waiting[self._next] == 0:
            index = self._next
            item = self.prepared[index]
            if isinstance(item, Verdict):
                verdict = item
            else:
                # In a batch the wall clock since packing counts the queue: report the pair's own time.
                verdict = self.judge.conclude(item.view_a, item.view_b, self.orders.pop(index, []),
                                              self.failures.pop(index, None), started=item.started,
                                              seconds=self.seconds[index])
            self.verdicts[index] = verdict
            self._next += 1
            if self.on_verdict is not None:
                self.on_verdict(index, verdict)


def judge_batch(judge: Judge, store: Any, pairs: Sequence[tuple[str, str]], *, reduce_to: PairReduce = None,
                full: bool = False, bound: str = "certified", on_call: Callable[[], None] | None = None,
                on_verdict: VerdictFn | None = None) -> list[Verdict]:
    """Judge ``pairs`` as :meth:`Judge.judge_pairs` does; ``on_call()`` hears of each order scored (or read
    from the cache), ``on_verdict(index, verdict)`` of each verdict, in pair order."""
    score_many = getattr(judge.backend, "score_many", None)
    if score_many is None:
        verdicts = judge.judge_pairs(store, pairs, reduce_to=reduce_to, full=full, bound=bound, on_call=on_call)
        for index, verdict in enumerate(verdicts):
            if on_verdict is not None:
                on_verdict(index, verdict)
        return verdicts
    prepared = judge.prepare_pairs(store, pairs, reduce_to=reduce_to, full=full, bound=bound)
    manifest = judge.manifest()
    collector = _Collector(judge, prepared, on_verdict)
    # One request per distinct call; every (pair, prompt) that waits for it, in pair order.
    distinct: dict[str, list[tuple[int, OrderPrompt]]] = {}
    cached: list[tuple[int, OrderScore]] = []
    for index, item in enumerate(prepared):
        if isinstance(item, Verdict) or item.view_a.text is None or item.view_b.text is None:
            continue  # decided before any call (an error while counting, or a view that does not fit)
        for prompt in judge.order_prompts(item.view_a, item.view_b):
            collector.waiting[index] += 1
            hit = judge.cached_score(store, prompt)
            if hit is not None:
                cached.append((index, order_score(prompt.order, hit, True)))
            else:
                distinct.setdefault(prompt.key, []).append((index, prompt))
    for index, order in cached:
        collector.add(index, order, None)
        if on_call is not None:
            on_call()
    collector.flush()  # pairs decided from the cache alone, or before any call
    keys = list(distinct)

    def on_result(job: int, score: LabelScore | None, failure: JudgeError | None, _server: str | None,
                  took: float) -> None:
        waiters = distinct[keys[job]]
        collector.seconds[waiters[0][0]] += took
        if score is not None:
            judge.record_score(store, waiters[0][1], score, manifest)
        for position, (index, prompt) in enumerate(waiters):
            # The later waiters read the answer as the sequential path would read its cache.
            collector.add(index, None if score is None else order_score(prompt.order, score,
                                                                        position > 0 and judge.use_cache), failure)
            if on_call is not None:
                on_call()

    if keys:
        score_many([distinct[key][0][1].segments for key in keys], on_result)
    missing = [i for i, v in enumerate(collector.verdicts) if v is None]
    if missing:  # every call reports exactly once; anything else is a bug, never a silent gap
        raise JudgeError(f"internal: {len(missing)} pair(s) were never decided")
    return [v for v in collector.verdicts if v is not None]
