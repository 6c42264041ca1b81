"""Pointwise scores: each run read on its own by a pointwise protocol (a critic), its readings combined into the
probability that it succeeded — per criterion (the mean over its K repeats, and their spread) and combined (the mean
of the criteria) — and cached in the store.

:func:`score_runs` is the one entry point: a run's score is looked up by what identifies it (the judge's settings
with the protocol, scale, K and rubric, the window's cap, what the run's view derives from and the code deriving
it — :func:`score_key`), so a cached score of another protocol, rubric, scale or K is never read; otherwise the
run's view is rendered, fitted into the window alone, and every reading asked (``backend.score_many``: one run's
readings one after the other, on one server, so its prefix cache reuses the run). An overflow or a failed reading
is an outcome of its own (``overflow``, ``error``), never a score, and is never cached.

With a :class:`~kvjudge.retention.shared_job.Sharing`, several processes score one job: each run is claimed before
its readings are sent, its score cached in the transaction that releases the claim, and the runs others scored read
from the cache.

Each score carries its cost (:class:`~kvjudge.judge.ledger.Ledger`: the calls its readings sent, as the answerers
measured them; a score read from the cache cost nothing), and ``on_plan`` hears, once the cache has been read and
before any call, how many calls the misses will send.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kvjudge.errors import JudgeError, UsageError
from kvjudge.judge.labels import LabelScore, PromptOverflow
from kvjudge.judge.ledger import Ledger
from kvjudge.judge.pack import BaseView, PackedView, RunTokens, fit_view
from kvjudge.judge.prompt import TEMPLATE_VERSION, Prompt
from kvjudge.judge.protocols.base import Reading, by_criterion, combined, mean_spread
from kvjudge.judge.verdict import judge_settings, view_code, view_sources
from kvjudge.retention.shared_job import SharedJob, Sharing

if TYPE_CHECKING:
    from kvjudge.judge.pipeline import Judge
    from kvjudge.retention import Store
    from kvjudge.retention.state import RunState

SCORE_KEY_PREFIX = "score-v1:"
SCORE_OUTCOMES = ("scored", "overflow", "error")
ScoreFn = Callable[[int, "RunScore"], None]
PlanFn = Callable[[int, int], None]  # (calls at most, scores from the cache)


@dataclass(frozen=True)
class ScoreReading:
    """One reading of a run: its id (criterion/variant), criterion, score in [0, 1] and label mass."""

    reading: str
    criterion: str
    score: float
    label_mass: float
    prompt_tokens: int
    server: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"reading": self.reading, "criterion": self.criterion, "score": self.score,
                "label_mass": self.label_mass, "prompt_tokens": self.prompt_tokens}


@dataclass(frozen=True)
class RunScore:
    """A run's pointwise score: ``p_success`` combined over the criteria (None unless ``outcome`` is scored),
    ``criteria`` each criterion's mean, spread and count, ``spread`` the sd over all readings."""

    run_id: str
    outcome: str
    p_success: float | None
    criteria: dict[str, dict[str, Any]]
    spread: float | None
    readings: tuple[ScoreReading, ...]
    tokens: RunTokens | None
    manifest: dict[str, Any]
    seconds: float
    cached: bool = False
    error: str | None = None
    view_sha256: str | None = None
    cost: Ledger = field(default_factory=Ledger)  # the calls its readings sent (from the cache: none)

    @property
    def scored(self) -> bool:
        return self.outcome == "scored"

    def to_json(self) -> dict[str, Any]:
        return {"run": self.run_id, "outcome": self.outcome, "p_success": self.p_success, "criteria": self.criteria,
                "spread": self.spread, "readings": [r.to_json() for r in self.readings],
                "tokens": None if self.tokens is None else vars(self.tokens).copy(), "manifest": self.manifest,
                "seconds": round(self.seconds, 3), "cached": self.cached, "error": self.error,
                "view_sha256": self.view_sha256, "cost": self.cost.to_json()}

    def record(self) -> dict[str, Any]:
        """What the score cache keeps (the figures are computed again on reading)."""
        return {"readings": [r.to_json() for r in self.readings], "manifest": self.manifest,
                "tokens": None if self.tokens is None else vars(self.tokens).copy(), "view_sha256": self.view_sha256}


def from_readings(run_id: str, readings: Sequence[ScoreReading], *, manifest: dict[str, Any], seconds: float,
                  tokens: RunTokens | None, cached: bool, view_sha256: str | None,
                  cost: Ledger | None = None) -> RunScore:
    """A scored run from its readings (``cost``: what they cost; None: nothing, read from the cache)."""
    criteria = by_criterion([(r.criterion, r.score) for r in readings])
    _, spread = mean_spread([r.score for r in readings])
    return RunScore(run_id, "scored", combined(criteria), criteria, spread, tuple(readings), tokens, manifest,
                    seconds, cached=cached, view_sha256=view_sha256, cost=cost or Ledger())


def from_record(run_id: str, record: Mapping[str, Any], seconds: float) -> RunScore:
    readings = [ScoreReading(r["reading"], r["criterion"], float(r["score"]), float(r["label_mass"]),
                             int(r["prompt_tokens"])) for r in record["readings"]]
    tokens = None if record.get("tokens") is None else RunTokens(**record["tokens"])
    return from_readings(run_id, readings, manifest=dict(record["manifest"]), seconds=seconds, tokens=tokens,
                         cached=True, view_sha256=record.get("view_sha256"))


def failed(run_id: str, outcome: str, message: str, *, manifest: dict[str, Any], seconds: float,
           tokens: RunTokens | None = None, cost: Ledger | None = None) -> RunScore:
    """A run not scored (``cost``: the readings that were answered before one failed)."""
    return RunScore(run_id, outcome, None, {}, None, (), tokens, manifest, seconds, error=message,
                    cost=cost or Ledger())


def score_key(settings: Mapping[str, Any], *, window: int, slack: int, source: str) -> str:
    """The score cache's key of a run: the judge's settings (protocol, scale, K, rubric included), the window's
    cap and slack, what the run's view derives from, and the code deriving views."""
    blob = json.dumps({"settings": dict(settings), "template_version": TEMPLATE_VERSION, "window": window,
                       "slack": slack, "view": source, "code": view_code()}, sort_keys=True)
    return SCORE_KEY_PREFIX + hashlib.sha256(blob.encode("utf-8")).hexdigest()


@dataclass
class _Pending:
    index: int
    view: PackedView
    readings: list[Reading]
    started: float
    answers: dict[int, ScoreReading] = field(default_factory=dict)
    cost: Ledger = field(default_factory=Ledger)
    failure: JudgeError | None = None
    waiting: int = 0


def score_runs(judge: Judge, store: Store, run_ids: Sequence[str], *, on_call: Callable[[], None] | None = None,
               on_score: ScoreFn | None = None, states: dict[str, RunState] | None = None,
               bound: str = "certified", on_plan: PlanFn | None = None,
               sharing: Sharing | None = None) -> list[RunScore]:
    """Score ``run_ids`` of ``store`` with ``judge`` (a pointwise protocol), each run's readings asked on its own
    (see the module docstring). ``on_call()`` hears of each reading asked or read from the cache, ``on_score(index,
    score)`` of each run's score as it is decided, ``on_plan(calls, cached)`` of the calls about to be sent (before
    the first); ``states`` as :func:`~kvjudge.judge.pipeline.judge_batch`. With ``sharing`` (and the cache on), each
run to score is a unit of a job other processes may share: see :mod:`kvjudge.retention.shared_job`."""
    protocol = judge.protocol
    if protocol.kind != "pointwise":
        raise UsageError(f"the {protocol.name} protocol judges pairs; score runs with a pointwise protocol "
                         f"(--protocol pointwise)")
    folded: dict[str, RunState] = states if states is not None else {}

    def state(run_id: str) -> RunState:
        if run_id not in folded:
            folded[run_id] = store.runs.run(run_id)
        return folded[run_id]

    manifest = judge.manifest()
    settings = judge_settings(manifest)
    cap = judge.window_cap(bound)
    judge.check_room(cap)
    sources = view_sources(store, run_ids, state, show_grades=judge.show_grades, show_verifier=judge.show_verifier)
    keys = [score_key(settings, window=cap, slack=judge.backend.slack_tokens, source=sources[r]) for r in run_ids]
    records = store.caches.get_judgments(keys) if judge.use_cache else {}
    scores: list[RunScore | None] = [None] * len(run_ids)
    calls = protocol.calls

    def decided(index: int, score: RunScore) -> None:
        scores[index] = score
        if on_score is not None:
            on_score(index, score)

    misses = []
    for index, (run_id, key) in enumerate(zip(run_ids, keys)):
        if key in records:
            for _ in range(calls):
                if on_call is not None:
                    on_call()
            decided(index, from_record(run_id, records[key], 0.0))
        else:
            misses.append(index)
    if on_plan is not None:
        on_plan(len(misses) * calls, len(run_ids) - len(misses))
    def work(indexes: list[int], job: SharedJob | None) -> list[int]:
        return _score_misses(judge, store, run_ids, indexes, state, keys, manifest, settings, on_call, decided,
                             bound, job) if indexes else []

    sharing = sharing if sharing is not None else judge.sharing
    if misses and sharing is not None and judge.use_cache:
        _score_shared(judge, store, run_ids, misses, keys, sharing, [key for key in keys if key in records], work,
                      on_call, decided)
    else:
        work(misses, None)
    judge.counter.save(store.caches)
    return [score for score in scores if score is not None]


def _score_shared(judge: Judge, store: Store, run_ids: Sequence[str], misses: list[int], keys: list[str],
                  sharing: Sharing, cached: Sequence[str], work: Callable[[list[int], SharedJob | None], list[int]],
                  on_call: Callable[[], None] | None, decided: ScoreFn) -> None:
    """The misses as one unit each of a job several workers share: this worker does those it claims, waits for
    the others, and reads what others scored from the cache (:mod:`kvjudge.retention.shared_job`)."""
    calls = judge.protocol.calls
    with sharing.job("score", keys, cached=cached) as job:
        left = work(misses, job)
        while left:
            taken, done = job.wait([keys[index] for index in left])
            records = store.caches.get_judgments([keys[index] for index in left if keys[index] in done])
            for index in left:
                if keys[index] in records:
                    for _ in range(calls):
                        if on_call is not None:
                            on_call()
                    decided(index, from_record(run_ids[index], records[keys[index]], 0.0))
                elif keys[index] in done:  # settled, yet its score is not cached (it failed): said, never waited for
                    decided(index, failed(run_ids[index], "error", "this run's score is not in the store (scoring "
                                          "it failed, here or in another worker); score it again",
                                          manifest=judge.manifest(), seconds=0.0))
            again = work([index for index in left if keys[index] in taken], job)
            left = [index for index in left if keys[index] not in taken and keys[index] not in done] + again


def _score_misses(judge: Judge, store: Store, run_ids: Sequence[str], misses: list[int],
                  state: Callable[[str], RunState], keys: list[str], manifest: dict[str, Any],
                  settings: dict[str, Any], on_call: Callable[[], None] | None, decided: ScoreFn, bound: str,
                  job: SharedJob | None) -> list[int]:
    """Score the runs of ``misses`` (with ``job``: only those this worker claims, each claimed just before its
    view is fitted); returns the indexes left to other workers."""
    protocol, backend = judge.protocol, judge.backend
    started = time.perf_counter()
    bases: dict[int, BaseView | RunScore] = {}

    def base(index: int) -> BaseView | RunScore:
        """The run's view before fitting, or its error where counting failed (an outcome, never a crash)."""
        if index not in bases:
            try:
                bases[index] = judge.base_of(store, state(run_ids[index]))
            except JudgeError as exc:
                bases[index] = failed(run_ids[index], "error", str(exc), manifest=manifest,
                                      seconds=time.perf_counter() - started)
        return bases[index]

    needed = 0
    if not backend.window_fixed:
        # An in-process window is sized to the runs: every run's view first, then the window.
        needed = max((judge.framing_tokens + b.tokens for b in map(base, misses) if isinstance(b, BaseView)),
                     default=0)
        if needed:
            judge.open_window(needed, bound)
    pending: list[_Pending] = []
    left: list[int] = []
    writes: dict[str, dict[str, Any]] = {}

    def finish(index: int, score: RunScore, record: dict[str, Any] | None) -> None:
        """Decide the run; its score cached (with ``job``: in the transaction that releases its claim)."""
        if job is not None:
            with store.transaction("put_judgments"):
                if record is not None:
                    store.caches.put_judgment(keys[index], record)
                job.finish(keys[index], score.cost.to_json() if score.cost.calls else None, done=record is not None)
        elif record is not None:
            writes[keys[index]] = record
        decided(index, score)

    def groups() -> Iterator[list[Prompt]]:
        nonlocal needed
        for index in misses:
            if job is not None and not job.take(keys[index]):
                left.append(index)
                continue
            fitted = base(index)
            del bases[index]  # fitted once: the rendered view is not kept past its run
            if isinstance(fitted, RunScore):
                finish(index, fitted, None)
                continue
            needed = max(needed, judge.framing_tokens + fitted.tokens)
            view = fit_view(fitted, judge.counter, judge.room)
            if view.text is None:
                finish(index, failed(run_ids[index], "overflow", f"even the skeleton of {run_ids[index]} exceeds "
                                     f"the {judge.room}-token room for its view (n_ctx {backend.n_ctx})",
                                     manifest=manifest, seconds=time.perf_counter() - started, tokens=view.tokens),
                       None)
                continue
            readings = protocol.readings()
            pending.append(_Pending(index, view, readings, time.perf_counter(), waiting=len(readings)))
            yield [Prompt(protocol.segments(judge.framing, reading, view.segments or view.text),
                          protocol.shared(judge.framing), protocol.scale) for reading in readings]

    def on_result(group: int, position: int, answer: LabelScore | None, failure: JudgeError | None,
                  server: str | None, _seconds: float) -> None:
        item = pending[group]
        reading = item.readings[position]
        if answer is not None and answer.cost is not None:
            item.cost.add(answer.cost)
        if answer is not None:
            assert reading.criterion is not None
            item.answers[position] = ScoreReading(reading.id, reading.criterion.name, protocol.score_of(answer),
                                                  answer.label_mass, answer.prompt_tokens, server)
        elif item.failure is None:
            item.failure = failure
        item.waiting -= 1
        if on_call is not None:
            on_call()
        if item.waiting:
            return
        run_id, seconds = run_ids[item.index], time.perf_counter() - item.started
        if item.failure is not None:
            outcome = "overflow" if isinstance(item.failure, PromptOverflow) else "error"
            finish(item.index, failed(run_id, outcome, str(item.failure), manifest=manifest, seconds=seconds,
                                      tokens=item.view.tokens, cost=item.cost), None)
            return
        score = from_readings(run_id, [item.answers[p] for p in sorted(item.answers)], manifest=manifest,
                              seconds=seconds, tokens=item.view.tokens, cached=False, view_sha256=item.view.sha256,
                              cost=item.cost)
        cacheable = judge.use_cache and judge_settings(score.manifest) == settings and item.view.missing == 0
        finish(item.index, score, score.record() if cacheable else None)

    backend.score_many(groups(), on_result)
    if needed and backend.window_fixed:
        judge.open_window(needed, bound)
    if writes:
        with store.transaction("put_judgments"):
            for key, payload in writes.items():
                store.caches.put_judgment(key, payload)
    return left


def summarize_scores(scores: Sequence[RunScore]) -> dict[str, Any]:
    """Outcome counts, coverage, the mean spread over repeats and the mean label mass of the scores."""
    outcomes = {outcome: sum(s.outcome == outcome for s in scores) for outcome in SCORE_OUTCOMES}
    scored = [s for s in scores if s.scored]
    spreads = [s.spread for s in scored if s.spread is not None]
    masses = [r.label_mass for s in scored for r in s.readings]
    return {"runs": len(scores), "outcomes": outcomes, "coverage": len(scored) / len(scores) if scores else None,
            "cached": sum(s.cached for s in scores),
            "mean_spread": sum(spreads) / len(spreads) if spreads else None,
            "mean_label_mass": sum(masses) / len(masses) if masses else None}


__all__ = ["RunScore", "SCORE_KEY_PREFIX", "SCORE_OUTCOMES", "ScoreReading", "score_key", "score_runs",
           "summarize_scores"]
