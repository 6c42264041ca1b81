"""Pairwise verdicts: both orders, forced-choice probabilities, un-swap and average.

The pair (a, b) is asked twice: with a shown first (order ``ab``) and with b shown first (``ba``).
Each call yields the probability that the run in position A is better; in order ``ba`` that is run b,
so it is un-swapped (``1 − p``) before the two are averaged into ``p_a`` — the probability that run a
is the better run.

Outcomes: ``a`` / ``b`` (a decisive winner), ``tie`` (``|p_a − 0.5| < margin``), ``inconsistent``
(both orders are decisive and disagree: the model chose by position), ``overflow`` (even the skeleton
of a run does not fit the window) and ``error`` (the backend failed). The last two never carry a score.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from kvjudge.errors import JudgeError, UsageError
from kvjudge.judge.backends import Backend, LabelScore, PromptOverflow
from kvjudge.judge.evidence import RunEvidence
from kvjudge.judge.pack import (
    ANSWER_TOKENS,
    BaseView,
    PackedView,
    PairBases,
    PairCache,
    RunTokens,
    base_view,
    fit_view,
    pack_pair,
    pair_bases,
)
from kvjudge.judge.prompt import TEMPLATE_VERSION, Framing
from kvjudge.judge.window import Window, WindowPlanner

DEFAULT_MARGIN = 0.05
OUTCOMES: tuple[str, ...] = ("a", "b", "tie", "inconsistent", "overflow", "error")
# Outcomes that carry a score (p_a from both orders). Coverage counts these.
SCORED = frozenset({"a", "b", "tie", "inconsistent"})
ORDERS: tuple[str, str] = ("ab", "ba")


def decide(p_ab: float, p_ba: float, margin: float = DEFAULT_MARGIN) -> tuple[str, float]:
    """Outcome and ``p_a`` from the two orders' (already un-swapped) probabilities that a is better."""
    if not 0.0 <= margin < 0.5:
        raise UsageError(f"the tie margin must be in [0, 0.5), got {margin}")
    p_a = (p_ab + p_ba) / 2.0
    first, second = p_ab - 0.5, p_ba - 0.5
    if abs(first) >= margin and abs(second) >= margin and (first > 0) != (second > 0):
        return "inconsistent", p_a
    if abs(p_a - 0.5) < margin:
        return "tie", p_a
    return ("a" if p_a > 0.5 else "b"), p_a


@dataclass(frozen=True)
class OrderScore:
    """One order's call: ``p_a`` is already un-swapped (probability that run a is better)."""

    order: str
    p_a: float
    label_mass: float
    prompt_tokens: int
    reused_tokens: int
    cached: bool
    server: str | None = None  # the server that answered (a server backend), None in-process or from the cache


@dataclass(frozen=True)
class Verdict:
    """The judge's answer for one pair, with everything needed to audit it."""

    a: str
    b: str
    outcome: str
    p_a: float | None
    p_a_by_order: dict[str, float | None]
    tokens: dict[str, RunTokens]
    further_reduced: bool
    seconds: float
    manifest: dict[str, Any]
    margin: float
    cached: bool = False
    tokens_saved: int = 0
    error: str | None = None
    notes: tuple[str, ...] = ()
    orders: tuple[OrderScore, ...] = field(default=(), repr=False)
    view_sha256: dict[str, str | None] = field(default_factory=dict)  # what each run's view was, by hash
    evidence: dict[str, RunEvidence] = field(default_factory=dict)  # each run's evidence, full view and judged
    common_tokens: int = 0  # the block of text both runs share, quoted once (0: none)

    @property
    def scored(self) -> bool:
        """The verdict carries a real score (not overflow, not error)."""
        return self.outcome in SCORED

    @property
    def position_consistent(self) -> bool | None:
        """Both orders pick the same side of 0.5 (None without a score)."""
        ab, ba = self.p_a_by_order.get("ab"), self.p_a_by_order.get("ba")
        if ab is None or ba is None:
            return None
        return (ab > 0.5) == (ba > 0.5) or ab == ba

    @property
    def evidence_hidden(self) -> bool:
        """A run's judged view shows less of its decisive evidence than its full view."""
        return any(e.hidden for e in self.evidence.values())

    def to_json(self) -> dict[str, Any]:
        """The CLI contract's object for one pair."""
        return {
            "a": self.a, "b": self.b, "outcome": self.outcome, "p_a": self.p_a, "p_a_by_order": self.p_a_by_order,
            "tokens": {run: asdict(tokens) for run, tokens in self.tokens.items()},
            "further_reduced": self.further_reduced, "seconds": round(self.seconds, 3), "manifest": self.manifest,
            "margin": self.margin, "position_consistent": self.position_consistent, "cached": self.cached,
            "tokens_saved": self.tokens_saved, "error": self.error, "notes": list(self.notes),
            "label_mass": {o.order: o.label_mass for o in self.orders}, "view_sha256": self.view_sha256,
            "answered_by": {o.order: o.server for o in self.orders if o.server},
            "common_tokens": self.common_tokens,
            "evidence": {run: e.to_json() for run, e in self.evidence.items()},
            "evidence_hidden": self.evidence_hidden,
        }


def judgment_key(manifest: dict[str, Any], view_first: str, view_second: str, common: str = "") -> str:
    """Cache key of one order's call: sha256 of (model, backend settings, framing, what is held out, both views
    and the block of text common to both).

    n_ctx is not in it: the window decides what fits, not what the model computes for the same tokens.
    """
    settings = {k: manifest.get(k) for k in ("model_sha256", "model", "backend", "backend_version", "n_batch",
                                             "server", "top_logprobs", "template", "chat_template_sha256",
                                             "show_verifier", "show_grades")}
    blob = json.dumps({"settings": settings, "template_version": TEMPLATE_VERSION, "first": view_first,
                       "second": view_second, "common": common}, sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class OrderPrompt:
    """One order's call, ready for a backend: the segments, the shared prefix and the cache key."""

    order: str
    segments: list[str]
    shared: int
    key: str


PairReduce = int | Mapping[tuple[str, str], int] | None


@dataclass(frozen=True)
class PackedPair:
    """A pair's two views, packed into the judge's window; ``started`` is when its packing began and
    ``pack_seconds`` how long it took."""

    view_a: PackedView
    view_b: PackedView
    started: float
    pack_seconds: float


@dataclass
class Judge:
    """A backend plus the judging settings; judges pairs of runs held in a store.

    ``template`` (auto | chat | raw) picks the prompt framing; ``show_verifier`` / ``show_grades`` put what
    the judge is measured against into its input (experiments only). ``use_cache`` reads and writes
    judgments through ``store.get_judgment`` / ``store.put_judgment`` (one entry per order), so a re-run of
    the same pair costs no model call. ``planner`` sizes the backend's window to the pairs; without one a
    backend that has no window yet gets a default planner (certifying the size it needs).
    """

    backend: Backend
    margin: float = DEFAULT_MARGIN
    show_grades: bool = False
    show_verifier: bool = False
    use_cache: bool = True
    template: str = "auto"
    planner: WindowPlanner | None = None
    window: Window | None = field(default=None, repr=False)
    _framing: Framing | None = field(default=None, repr=False)
    _framing_tokens: int | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if not 0.0 <= self.margin < 0.5:
            raise UsageError(f"the tie margin must be in [0, 0.5), got {self.margin}; set [judge] margin")

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
            framing = self.framing.framing_segments()
            # The backend's own prompt ids where it has them: they include the BOS the model adds.
            exact = getattr(self.backend, "prompt_tokens", None)
            self._framing_tokens = len(exact(framing)) if exact else sum(self.backend.count(s) for s in framing)
        return self._framing_tokens

    @property
    def room(self) -> int:
        """Tokens both views may take together in the current window."""
        if self.backend.n_ctx is None:
            raise JudgeError("the judge backend has no window yet; judge through Judge.judge_pairs")
        return self.room_at(self.backend.n_ctx)

    def room_at(self, n_ctx: int) -> int:
        """Tokens both views (and the block common to both) may take together in a window of ``n_ctx``."""
        return n_ctx - self.framing_tokens - ANSWER_TOKENS - getattr(self.backend, "slack_tokens", 0)

    @property
    def allowance(self) -> int:
        """Half the room: what each view may take when both are long."""
        return self.room // 2

    def manifest(self) -> dict[str, Any]:
        return {**self.backend.manifest(), "template_version": TEMPLATE_VERSION, **self.framing.manifest(),
                "show_verifier": self.show_verifier, "show_grades": self.show_grades}

    def base(self, store: Any, run_id: str, *, reduce_to: int | None = None, full: bool = False) -> BaseView:
        """One run's view before it is fitted to a window."""
        return base_view(store, store.run(run_id), self.backend.count, show_grades=self.show_grades,
                         show_verifier=self.show_verifier, reduce_to=reduce_to, full=full)

    def pack(self, store: Any, run_id: str, *, reduce_to: int | None = None, full: bool = False,
             allowance: int | None = None) -> PackedView:
        """The view of one run as it would be read beside a run as long as itself (half the room), or within
        ``allowance`` tokens."""
        return fit_view(self.base(store, run_id, reduce_to=reduce_to, full=full), self.backend.count,
                        self.allowance if allowance is None else allowance)

    def pack_pair(self, store: Any, a: str, b: str, n_ctx: int) -> tuple[PackedView, PackedView]:
        """The two views of a pair as a window of ``n_ctx`` gets them (what :meth:`judge_pairs` sends)."""
        count = self.backend.count
        pair = pair_bases(self.base(store, a), self.base(store, b), count)
        return pack_pair(pair.a, pair.b, count, self.room_at(n_ctx), pair)

    def needed_tokens(self, base_a: BaseView, base_b: BaseView) -> int:
        """Prompt tokens of the pair read whole (framing + the block common to both + both views)."""
        return self.framing_tokens + pair_bases(base_a, base_b, self.backend.count).tokens

    def _open_window(self, needed: int, bound: str) -> None:
        planner = self.planner
        if planner is None:
            if self.backend.n_ctx is not None:
                return  # a window chosen by the caller (LlamaBackend(n_ctx=...)): pairs are fitted into it
            planner = self.planner = WindowPlanner(self.backend)
        self.window = planner.open(needed, bound=bound)

    def judge_pairs(self, store: Any, pairs: Sequence[tuple[str, str]], *, reduce_to: PairReduce = None,
                    full: bool = False, bound: str = "certified",
                    on_call: Callable[[], None] | None = None) -> list[Verdict]:
        """Judge ``pairs`` of ``store`` in one window sized to the largest pair (both orders each).

        ``reduce_to`` (tokens, or tokens per pair) judges views reduced that far (derived, never stored): the
        reduced side of a still-grades check. ``full`` starts from the original bodies wherever the store can
        still read them (the full side); ``bound`` "analytic" lets the window grow to the analytic bound.
        """
        verdicts = []
        for item in self.prepare_pairs(store, pairs, reduce_to=reduce_to, full=full, bound=bound):
            if isinstance(item, Verdict):
                verdicts.append(item)
            else:
                verdicts.append(self.judge_views(store, item.view_a, item.view_b, started=item.started,
                                                 on_call=on_call))
        return verdicts

    def prepare_pairs(self, store: Any, pairs: Sequence[tuple[str, str]], *, reduce_to: PairReduce = None,
                      full: bool = False, bound: str = "certified") -> list[PackedPair | Verdict]:
        """The first stage of :meth:`judge_pairs`: every pair's views, packed into one window sized to the
        largest pair (a verdict instead where counting tokens failed). A batch path sends the calls itself
        (:meth:`order_prompts`) and decides with :meth:`conclude`."""
        started = time.perf_counter()
        bases: dict[tuple[str, int | None, bool], BaseView] = {}
        paired: PairCache = {}
        prepared: list[PairBases | Verdict] = []
        for a, b in pairs:
            target = reduce_to.get((a, b)) if isinstance(reduce_to, Mapping) else reduce_to
            try:
                views = []
                for run_id in (a, b):
                    key = (run_id, target, full)
                    if key not in bases:
                        bases[key] = self.base(store, run_id, reduce_to=target, full=full)
                    views.append(bases[key])
                prepared.append(pair_bases(views[0], views[1], self.backend.count, paired))
            except JudgeError as exc:  # the backend failed while counting tokens: an outcome, not a crash
                prepared.append(self._error(a, b, str(exc), started))
        needed = [self.framing_tokens + p.tokens for p in prepared if not isinstance(p, Verdict)]
        if needed:
            self._open_window(max(needed), bound)
        packed: list[PackedPair | Verdict] = []
        for item in prepared:
            if isinstance(item, Verdict):
                packed.append(item)
                continue
            # A verdict's seconds are its own packing and calls, not the window's certification.
            started = time.perf_counter()
            view_a, view_b = pack_pair(item.a, item.b, self.backend.count, self.room, item)
            packed.append(PackedPair(view_a, view_b, started, time.perf_counter() - started))
        return packed

    def judge_pair(self, store: Any, a: str, b: str, *, reduce_to: int | None = None, full: bool = False,
                   on_call: Callable[[], None] | None = None) -> Verdict:
        """Judge runs ``a`` and ``b`` from ``store`` in both orders (see :meth:`judge_pairs`)."""
        return self.judge_pairs(store, [(a, b)], reduce_to=reduce_to, full=full, on_call=on_call)[0]

    def _error(self, a: str, b: str, message: str, started: float) -> Verdict:
        unknown = RunTokens(full=None, reduced=None, view=None, further_reduced=False)
        return Verdict(a=a, b=b, outcome="error", p_a=None, p_a_by_order={o: None for o in ORDERS},
                       tokens={"a": unknown, "b": unknown}, further_reduced=False,
                       seconds=time.perf_counter() - started, manifest=self.manifest(), margin=self.margin,
                       error=message)

    def order_prompts(self, view_a: PackedView, view_b: PackedView) -> list[OrderPrompt]:
        """The two orders' prompts for two views that fit (a batch path sends these itself)."""
        manifest = self.manifest()
        prompts = []
        common = view_a.common  # the same block in both orders (both views carry it)
        for order in ORDERS:
            first, second = (view_a.text, view_b.text) if order == "ab" else (view_b.text, view_a.text)
            assert first is not None and second is not None
            prompts.append(OrderPrompt(order, self.framing.segments(first, second, common), self.framing.shared,
                                       judgment_key(manifest, first, second, common)))
        return prompts

    def judge_views(self, store: Any, view_a: PackedView, view_b: PackedView, *, started: float | None = None,
                    on_call: Callable[[], None] | None = None) -> Verdict:
        """Judge two packed views in both orders (the part of :meth:`judge_pairs` after packing)."""
        started = time.perf_counter() if started is None else started
        if view_a.text is None or view_b.text is None:
            return self.conclude(view_a, view_b, [], started=started)
        manifest = self.manifest()
        orders: list[OrderScore] = []
        try:
            for prompt in self.order_prompts(view_a, view_b):
                score = self.cached_score(store, prompt)
                cached = score is not None
                if score is None:
                    score = self.score_prompt(prompt)
                    self.record_score(store, prompt, score, manifest)
                orders.append(order_score(prompt.order, score, cached))
                if on_call is not None:
                    on_call()
        except JudgeError as exc:
            return self.conclude(view_a, view_b, orders, exc, started=started)
        return self.conclude(view_a, view_b, orders, started=started)

    def conclude(self, view_a: PackedView, view_b: PackedView, orders: Sequence[OrderScore],
                 failure: JudgeError | None = None, *, started: float, seconds: float | None = None) -> Verdict:
        """The verdict from the orders scored (in any order) and the failure that stopped the rest: overflow
        when a view does not fit or the backend refused the prompt as too long, error on any other failure,
        else the decision. ``seconds`` overrides the time since ``started`` (a batch counts a pair's own calls)."""
        manifest = self.manifest()
        tokens = {"a": view_a.tokens, "b": view_b.tokens}
        further = view_a.tokens.further_reduced or view_b.tokens.further_reduced
        notes = tuple(f"{v.run_id}: {n}" for v in (view_a, view_b) for n in v.notes)
        hashes = {"a": view_a.sha256, "b": view_b.sha256}
        evidence = {side: RunEvidence(v.evidence_full, v.evidence) for side, v in (("a", view_a), ("b", view_b))}
        ordered = tuple(sorted(orders, key=lambda o: ORDERS.index(o.order)))

        def finish(outcome: str, p_a: float | None, by_order: dict[str, float | None], *,
                   error: str | None = None) -> Verdict:
            return Verdict(a=view_a.run_id, b=view_b.run_id, outcome=outcome, p_a=p_a, p_a_by_order=by_order,
                           tokens=tokens, further_reduced=further,
                           seconds=time.perf_counter() - started if seconds is None else seconds,
                           manifest=manifest, margin=self.margin, cached=bool(ordered) and all(o.cached for o in ordered),
                           tokens_saved=sum(o.reused_tokens for o in ordered if not o.cached), error=error,
                           notes=notes, orders=ordered, view_sha256=hashes, evidence=evidence,
                           common_tokens=view_a.common_tokens)

        if view_a.text is None or view_b.text is None:
            over = [v.run_id for v in (view_a, view_b) if v.text is None]
            return finish("overflow", None, {"ab": None, "ba": None},
                          error=f"even the skeleton of {', '.join(over)} exceeds its share of the "
                                f"{self.room}-token room for views (n_ctx {self.backend.n_ctx})")
        if isinstance(failure, PromptOverflow):
            return finish("overflow", None, {"ab": None, "ba": None}, error=str(failure))
        if failure is not None or len(ordered) != len(ORDERS):
            by_order: dict[str, float | None] = {o: None for o in ORDERS}
            by_order.update({o.order: o.p_a for o in ordered})
            return finish("error", None, by_order,
                          error=str(failure) if failure is not None else "an order was never scored")
        outcome, p_a = decide(ordered[0].p_a, ordered[1].p_a, self.margin)
        return finish(outcome, p_a, {o.order: o.p_a for o in ordered})

    def cached_score(self, store: Any, prompt: OrderPrompt) -> LabelScore | None:
        """The cached judgment for ``prompt`` (None when caching is off or nothing is cached)."""
        getter = getattr(store, "get_judgment", None) if self.use_cache else None
        hit = getter(prompt.key) if getter is not None else None
        if hit is None:
            return None
        return LabelScore(probs={k: float(v) for k, v in hit["probs"].items()}, label_mass=float(hit["label_mass"]),
                          prompt_tokens=int(hit["prompt_tokens"]), reused_tokens=int(hit.get("reused_tokens", 0)))

    def score_prompt(self, prompt: OrderPrompt) -> LabelScore:
        """Ask the backend (any failure is a JudgeError: an outcome, never a score)."""
        try:
            return self.backend.score(prompt.segments, shared=prompt.shared)
        except JudgeError:
            raise
        except Exception as exc:  # a backend bug or a runtime crash is an outcome, never a score
            raise JudgeError(f"the judge backend failed ({type(exc).__name__}: {exc})") from exc

    def record_score(self, store: Any, prompt: OrderPrompt, score: LabelScore, manifest: dict[str, Any]) -> None:
        """Cache a fresh score for ``prompt`` (when caching is on)."""
        putter = getattr(store, "put_judgment", None) if self.use_cache else None
        if putter is not None:
            putter(prompt.key, {"probs": score.probs, "label_mass": score.label_mass,
                                "prompt_tokens": score.prompt_tokens, "reused_tokens": score.reused_tokens,
                                "template_version": TEMPLATE_VERSION, "template": self.framing.name,
                                "model_sha256": manifest.get("model_sha256")})


def order_score(order: str, score: LabelScore, cached: bool) -> OrderScore:
    """One order's result, un-swapped: ``p_a`` is the probability that run a (not position A) is better."""
    p_first = score.probs["A"]
    return OrderScore(order=order, p_a=p_first if order == "ab" else 1.0 - p_first, label_mass=score.label_mass,
                      prompt_tokens=score.prompt_tokens, reused_tokens=score.reused_tokens, cached=cached,
                      server=None if cached else score.server)


def judge_pair(store: Any, a: str, b: str, backend: Backend, *, margin: float = DEFAULT_MARGIN,
               show_grades: bool = False, show_verifier: bool = False, use_cache: bool = True,
               reduce_to: int | None = None, template: str = "auto") -> Verdict:
    """Judge runs ``a`` and ``b`` of ``store`` with ``backend`` (both orders, cached in the store)."""
    return Judge(backend, margin=margin, show_grades=show_grades, show_verifier=show_verifier, use_cache=use_cache,
                 template=template).judge_pair(store, a, b, reduce_to=reduce_to)
