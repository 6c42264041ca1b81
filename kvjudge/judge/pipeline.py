"""The judging pipeline: pairs → views → prompts → scores → verdicts, each stage run once per pair, in one direction.

:func:`judge_batch` is the one entry point (``Judge.judge_pairs`` and ``judge_pair`` are it too), for every
backend:

1. **verdicts already known**: each pair's verdict is looked up in the verdict cache by what identifies it
   (:func:`~kvjudge.judge.verdict.verdict_key`) — the folded runs are read, nothing is rendered or counted;
2. **views**: each run's view is rendered once per batch (:mod:`kvjudge.judge.pack`; token counts added up from
   counts kept per body, :mod:`kvjudge.judge.viewcount`), the pair's common block found, the pair fitted into the
   window. A server's window is its own, so its pairs are prepared one by one while earlier pairs' requests are in
   flight; an in-process window is sized to the pairs, so theirs are all prepared first;
3. **prompts**: both orders; an order already answered (the order cache, or earlier in this batch) is not sent
   again, and one being asked is waited for;
4. **scores**: ``backend.score_many`` takes each pair's calls as they are needed (a pool sends the two orders to
   the same server one after the other; in-process calls run in turn);
5. **verdicts**: decided (:func:`~kvjudge.judge.verdict.conclude`), written to both caches, and reported in the
   order of the pairs, each as soon as it and every pair before it are decided.

Cache writes are gathered and written a few dozen at a time in one transaction.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kvjudge.errors import JudgeError, UsageError
from kvjudge.judge.backends import Backend
from kvjudge.judge.batch import PairBatch, PlanFn, VerdictFn
from kvjudge.judge.labels import LabelScore
from kvjudge.judge.pack import (
    ANSWER_TOKENS,
    BaseView,
    PackedView,
    base_view,
    fit_view,
    pack_pair,
    pair_bases,
)
from kvjudge.judge.prompt import TEMPLATE_VERSION, Framing
from kvjudge.judge.protocols import JudgeProtocol, LetterProtocol
from kvjudge.judge.protocols.base import reading_key
from kvjudge.judge.verdict import (DEFAULT_MARGIN, OrderPrompt, OrderScore, PairReduce, SideRecord, Verdict, conclude,
                                   judgment_key, order_score, overflow_message, text_sha256)
from kvjudge.judge.viewcount import ViewCounter
from kvjudge.judge.window import Window, WindowPlanner, default_planner

if TYPE_CHECKING:
    from kvjudge.retention import Store
    from kvjudge.retention.shared_job import Sharing
    from kvjudge.retention.state import RunState

# The fewest tokens a rubric's longest question may leave the views of a window.
MIN_VIEW_ROOM = 256


@dataclass
class Judge:
    """A backend plus the judging settings; judges pairs of runs held in a store.

    ``template`` (auto | chat | raw) picks the prompt framing; ``show_verifier`` / ``show_grades`` put what
    the judge is measured against into its input (experiments only). ``use_cache`` reads and writes
    judgments through ``store.caches.get_judgment`` / ``store.caches.put_judgment`` (one entry per order, one per
    verdict), so a re-run of the same pair costs no model call — nor, for a verdict, any rendering. ``planner`` sizes
    the backend's window to the pairs; without one a backend that has no window yet gets a default planner (certifying
    the size it needs). ``protocol`` turns views into prompts and answers into scores
    (:mod:`kvjudge.judge.protocols`; default: the letter protocol).
    """

    backend: Backend
    margin: float = DEFAULT_MARGIN
    show_grades: bool = False
    show_verifier: bool = False
    use_cache: bool = True
    template: str = "auto"
    planner: WindowPlanner | None = None
    protocol: JudgeProtocol = field(default_factory=LetterProtocol)
    window: Window | None = field(default=None, repr=False)
    #: Set: the work this judge does is shared with other processes on its store (a command's; see
    #: :mod:`kvjudge.retention.shared_job`), unless a call names another.
    sharing: Sharing | None = field(default=None, repr=False)
    _framing: Framing | None = field(default=None, repr=False)
    _framing_tokens: int | None = field(default=None, repr=False)
    _counter: ViewCounter | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if not 0.0 <= self.margin < 0.5:
            raise UsageError(f"the tie margin must be in [0, 0.5), got {self.margin}; set [judge] margin")
        scale, limit = self.protocol.scale, getattr(self.backend, "label_limit", None)
        if scale is not None and limit is not None and scale.size > limit:
            raise UsageError(f"a {scale.size}-level scale cannot be read from the judge server's top {limit} "
                             f"logprobs; use --levels {limit} or fewer")

    @property
    def framing(self) -> Framing:
        """The prompt framing (the model's chat template, or raw), resolved once from ``template``."""
        if self._framing is None:
            self._framing = self.backend.framing(self.template)
        return self._framing

    @property
    def framing_tokens(self) -> int:
        """Tokens of the prompt without the two views (template, instructions, delimiters, question)."""
        if self._framing_tokens is None:
            self._framing_tokens = self.backend.count_prompt(self.protocol.framing_segments(self.framing))
        return self._framing_tokens

    @property
    def counter(self) -> ViewCounter:
        """Counts views from their parts, bodies through the store's count cache under the backend's counter."""
        if self._counter is None:
            self._counter = ViewCounter(self.backend.count, self.backend.counter_name)
        return self._counter

    @property
    def room(self) -> int:
        """Tokens both views may take together in the current window (before any window is open: in the largest
        one the judge may open, as when every verdict came from the cache)."""
        return self.room_at(self.backend.n_ctx if self.backend.n_ctx is not None else self.window_cap())

    def room_at(self, n_ctx: int) -> int:
        """Tokens both views (and the block common to both) may take together in a window of ``n_ctx``."""
        return n_ctx - self.framing_tokens - ANSWER_TOKENS - self.backend.slack_tokens

    @property
    def allowance(self) -> int:
        """Half the room: what each view may take when both are long."""
        return self.room // 2

    def window_cap(self, bound: str = "certified") -> int:
        """The largest window a batch may get: a pair that must be cut is cut to fit it, and only then does what a
        pair reads depend on the window (nothing is loaded or counted to know it)."""
        planner = self.window_planner()
        if planner is None:
            assert self.backend.n_ctx is not None
            return self.backend.n_ctx
        return planner.cap(bound)[0]

    def window_planner(self) -> WindowPlanner | None:
        """What sizes this judge's window: the planner given, else :func:`~kvjudge.judge.window.default_planner`."""
        if self.planner is None:
            self.planner = default_planner(self.backend)
        return self.planner

    def manifest(self) -> dict[str, Any]:
        return {**self.backend.manifest(), "template_version": TEMPLATE_VERSION, **self.framing.manifest(),
                "show_verifier": self.show_verifier, "show_grades": self.show_grades, **self.protocol.manifest()}

    def check_room(self, n_ctx: int) -> None:
        """A rubric whose criterion leaves the views too little of an ``n_ctx`` window is a one-line error."""
        criterion = self.protocol.longest_criterion()
        if criterion is not None and self.room_at(n_ctx) < MIN_VIEW_ROOM:
            raise UsageError(f"criterion {criterion.name!r} ({self.backend.count(criterion.text)} tokens) leaves the "
                             f"runs {max(0, self.room_at(n_ctx))} tokens of the {n_ctx}-token window (at least "
                             f"{MIN_VIEW_ROOM} needed); shorten it")

    def reading_score(self, prompt: OrderPrompt, score: LabelScore, cached: bool) -> OrderScore:
        """One call's answer as the protocol reads it, un-swapped."""
        return order_score(prompt.order, score, cached, p_first=self.protocol.score_of(score),
                           criterion=prompt.criterion, reading=prompt.reading)

    def base_of(self, store: Store, state: RunState, *, reduce_to: int | None = None,
                full: bool = False) -> BaseView:
        """One folded run's view before it is fitted to a window."""
        return base_view(store, state, self.counter, show_grades=self.show_grades, show_verifier=self.show_verifier,
                         reduce_to=reduce_to, full=full)

    def base(self, store: Store, run_id: str, *, reduce_to: int | None = None, full: bool = False) -> BaseView:
        """One run's view before it is fitted to a window."""
        return self.base_of(store, store.runs.run(run_id), reduce_to=reduce_to, full=full)

    def pack(self, store: Store, run_id: str, *, reduce_to: int | None = None, full: bool = False,
             allowance: int | None = None) -> PackedView:
        """The view of one run as it would be read beside a run as long as itself (half the room), or within
        ``allowance`` tokens."""
        return fit_view(self.base(store, run_id, reduce_to=reduce_to, full=full), self.counter,
                        self.allowance if allowance is None else allowance)

    def pack_pair(self, store: Store, a: str, b: str, n_ctx: int) -> tuple[PackedView, PackedView]:
        """The two views of a pair as a window of ``n_ctx`` gets them (what :meth:`judge_pairs` sends)."""
        pair = pair_bases(self.base(store, a), self.base(store, b), self.counter)
        return pack_pair(pair.a, pair.b, self.counter, self.room_at(n_ctx), pair)

    def needed_tokens(self, base_a: BaseView, base_b: BaseView) -> int:
        """Prompt tokens of the pair read whole (framing + the block common to both + both views)."""
        return self.framing_tokens + pair_bases(base_a, base_b, self.counter).tokens

    def open_window(self, needed: int, bound: str = "certified") -> None:
        """Size the backend's window for prompts of up to ``needed`` tokens (see :class:`WindowPlanner`)."""
        planner = self.window_planner()
        if planner is not None:
            self.window = planner.open(needed, bound=bound)

    def order_prompts(self, view_a: PackedView, view_b: PackedView) -> list[OrderPrompt]:
        """The protocol's prompts for two views that fit (the letter protocol: the two orders)."""
        manifest = self.manifest()
        common = view_a.common_segments or view_a.common  # the same block in both orders (both views carry it)
        block = text_sha256(view_a.common)
        protocol = self.protocol
        prompts = []
        for reading in protocol.readings():
            order = reading.order or "ab"
            first, second = (view_a, view_b) if order == "ab" else (view_b, view_a)
            assert first.text is not None and second.text is not None and first.sha256 and second.sha256
            segments = protocol.segments(self.framing, reading, first.segments or first.text,
                                         second.segments or second.text, common)
            key = judgment_key(manifest, first.text, second.text, view_a.common,
                               hashes=(first.sha256, second.sha256, block))
            if reading.criterion is not None:
                key = reading_key(key, reading, protocol)
            prompts.append(OrderPrompt(segments, protocol.shared(self.framing), protocol.scale, order=order, key=key,
                                       criterion=reading.criterion.name if reading.criterion else None,
                                       reading=reading.id if reading.criterion else None))
        return prompts

    def conclude(self, view_a: PackedView, view_b: PackedView, orders: Sequence[OrderScore],
                 failure: JudgeError | None = None, *, started: float, seconds: float | None = None) -> Verdict:
        """The verdict from the orders scored and the failure that stopped the rest (see
        :func:`~kvjudge.judge.verdict.conclude`). ``seconds`` overrides the time since ``started``."""
        over = [v.run_id for v in (view_a, view_b) if v.text is None]
        overflow = overflow_message(over, self.room, self.backend.n_ctx) if over else None
        return conclude((SideRecord.of(view_a), SideRecord.of(view_b)), orders, failure, margin=self.margin,
                        manifest=self.manifest(), common_tokens=view_a.common_tokens,
                        seconds=time.perf_counter() - started if seconds is None else seconds, overflow=overflow,
                        readings=self.protocol.calls)

    def judge_pairs(self, store: Store, pairs: Sequence[tuple[str, str]], *, reduce_to: PairReduce = None,
                    full: bool = False, bound: str = "certified",
                    on_call: Callable[[], None] | None = None) -> list[Verdict]:
        """Judge ``pairs`` of ``store`` (both orders each): :func:`judge_batch`."""
        return judge_batch(self, store, pairs, reduce_to=reduce_to, full=full, bound=bound, on_call=on_call)

    def judge_pair(self, store: Store, a: str, b: str, *, reduce_to: int | None = None, full: bool = False,
                   on_call: Callable[[], None] | None = None) -> Verdict:
        """Judge runs ``a`` and ``b`` from ``store`` in both orders (see :func:`judge_batch`)."""
        return self.judge_pairs(store, [(a, b)], reduce_to=reduce_to, full=full, on_call=on_call)[0]


def judge_pair(store: Store, a: str, b: str, backend: Backend, *, margin: float = DEFAULT_MARGIN,
               show_grades: bool = False, show_verifier: bool = False, use_cache: bool = True,
               reduce_to: int | None = None, template: str = "auto") -> Verdict:
    """Judge runs ``a`` and ``b`` of ``store`` with ``backend`` (both orders, cached in the store)."""
    return Judge(backend, margin=margin, show_grades=show_grades, show_verifier=show_verifier, use_cache=use_cache,
                 template=template).judge_pair(store, a, b, reduce_to=reduce_to)


def judge_batch(judge: Judge, store: Store, pairs: Sequence[tuple[str, str]], *, reduce_to: PairReduce = None,
                full: bool = False, bound: str = "certified", on_call: Callable[[], None] | None = None,
                on_verdict: VerdictFn | None = None, states: Mapping[str, RunState] | None = None,
                on_plan: PlanFn | None = None, sharing: Sharing | None = None) -> list[Verdict]:
    """Judge ``pairs`` of ``store``, both orders each, in one window (the stages in the module docstring).

    ``reduce_to`` (tokens, or tokens per pair) judges views reduced that far (derived, never stored): the reduced
    side of a still-grades check. ``full`` starts from the original bodies wherever the store can still read them
    (the full side); ``bound`` "analytic" lets an in-process window grow to the analytic bound. ``on_call()`` hears
    of each order scored or read from a cache; ``on_verdict(index, verdict)`` of each verdict, in pair order.
    ``states``: folded runs already read, by id (``PairSelection.runs`` of folded runs); the others are read from
    the store, and added to a dict given (so a caller scoring the verdicts next reads no run twice). ``on_plan`` hears
    how many calls at most are about to be sent and how many verdicts came from the cache, before the first call.
    Interrupted (Ctrl-C), every verdict and order answered so far is written to the caches first. With ``sharing``
    (and the cache on), each pair is a unit of a job other processes may share (:mod:`kvjudge.retention.shared_job`).
    """
    if judge.protocol.kind != "pairwise":
        raise UsageError(f"the {judge.protocol.name} protocol scores one run at a time: use `kvjudge score`, or a "
                         f"pairwise protocol to judge pairs")
    batch = PairBatch(judge, store, pairs, reduce_to, full, bound, on_call, on_verdict)
    batch.on_plan = on_plan
    batch.sharing = sharing if sharing is not None else judge.sharing
    if isinstance(states, dict):
        batch.states = states
    else:
        batch.states.update(states or {})
    return batch.run()



__all__ = ["Judge", "VerdictFn", "judge_batch", "judge_pair"]
