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
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from kvjudge.errors import JudgeError, UsageError
from kvjudge.judge.backends import Backend, LabelScore, PromptOverflow
from kvjudge.judge.pack import PackedView, RunTokens, pack_run, view_allowance
from kvjudge.judge.render import SHARED_SEGMENTS, TEMPLATE_VERSION, segments

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

    def to_json(self) -> dict[str, Any]:
        """The CLI contract's object for one pair."""
        return {
            "a": self.a, "b": self.b, "outcome": self.outcome, "p_a": self.p_a, "p_a_by_order": self.p_a_by_order,
            "tokens": {run: asdict(tokens) for run, tokens in self.tokens.items()},
            "further_reduced": self.further_reduced, "seconds": round(self.seconds, 3), "manifest": self.manifest,
            "margin": self.margin, "position_consistent": self.position_consistent, "cached": self.cached,
            "tokens_saved": self.tokens_saved, "error": self.error, "notes": list(self.notes),
            "label_mass": {o.order: o.label_mass for o in self.orders},
        }


def judgment_key(manifest: dict[str, Any], view_first: str, view_second: str) -> str:
    """Cache key of one order's call: sha256 of (model, backend settings, template version, both views in order)."""
    settings = {k: manifest.get(k) for k in ("model_sha256", "model", "backend", "backend_version", "n_ctx",
                                             "n_batch", "server", "top_logprobs")}
    blob = json.dumps({"settings": settings, "template": TEMPLATE_VERSION, "first": view_first,
                       "second": view_second}, sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


@dataclass
class Judge:
    """A backend plus the judging settings; judges pairs of runs held in a store.

    ``use_cache`` reads and writes judgments through ``store.get_judgment`` / ``store.put_judgment``
    (one entry per order), so a re-run of the same pair costs no model call.
    """

    backend: Backend
    margin: float = DEFAULT_MARGIN
    show_grades: bool = False
    use_cache: bool = True
    _allowance: int | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if not 0.0 <= self.margin < 0.5:
            raise UsageError(f"the tie margin must be in [0, 0.5), got {self.margin}; set [judge] margin")

    @property
    def allowance(self) -> int:
        """Tokens each run's view may take: ``(n_ctx − instructions − answer) // 2``."""
        if self._allowance is None:
            self._allowance = view_allowance(self.backend)
        return self._allowance

    def manifest(self) -> dict[str, Any]:
        return {**self.backend.manifest(), "template_version": TEMPLATE_VERSION}

    def pack(self, store: Any, run_id: str, *, reduce_to: int | None = None, full: bool = False) -> PackedView:
        """The view of one run that fits this judge's allowance (or says it cannot)."""
        return pack_run(store, store.run(run_id), self.backend.count, self.allowance,
                        show_grades=self.show_grades, reduce_to=reduce_to, full=full)

    def judge_pair(self, store: Any, a: str, b: str, *, reduce_to: int | None = None, full: bool = False,
                   on_call: Callable[[], None] | None = None) -> Verdict:
        """Judge runs ``a`` and ``b`` from ``store`` in both orders.

        ``reduce_to`` judges views reduced to that many tokens (derived on the fly, never stored) —
        the "reduced" side of a still-grades check on runs not yet reduced in the store. ``full`` starts
        from the original bodies wherever the store can still read them (the "full" side).
        """
        started = time.perf_counter()
        try:
            view_a = self.pack(store, a, reduce_to=reduce_to, full=full)
            view_b = self.pack(store, b, reduce_to=reduce_to, full=full)
        except JudgeError as exc:  # the backend failed while counting tokens: an outcome, not a crash
            unknown = RunTokens(full=None, reduced=None, view=None, further_reduced=False)
            return Verdict(a=a, b=b, outcome="error", p_a=None, p_a_by_order={o: None for o in ORDERS},
                           tokens={"a": unknown, "b": unknown}, further_reduced=False,
                           seconds=time.perf_counter() - started, manifest=self.manifest(), margin=self.margin,
                           error=str(exc))
        return self.judge_views(store, view_a, view_b, started=started, on_call=on_call)

    def judge_views(self, store: Any, view_a: PackedView, view_b: PackedView, *, started: float | None = None,
                    on_call: Callable[[], None] | None = None) -> Verdict:
        """Judge two packed views in both orders (the part of :meth:`judge_pair` after packing)."""
        started = time.perf_counter() if started is None else started
        manifest = self.manifest()
        tokens = {"a": view_a.tokens, "b": view_b.tokens}
        further = view_a.tokens.further_reduced or view_b.tokens.further_reduced
        notes = tuple(f"{v.run_id}: {n}" for v in (view_a, view_b) for n in v.notes)

        def finish(outcome: str, p_a: float | None, by_order: dict[str, float | None], *, error: str | None = None,
                   orders: tuple[OrderScore, ...] = ()) -> Verdict:
            return Verdict(a=view_a.run_id, b=view_b.run_id, outcome=outcome, p_a=p_a, p_a_by_order=by_order,
                           tokens=tokens, further_reduced=further, seconds=time.perf_counter() - started,
                           manifest=manifest, margin=self.margin, cached=bool(orders) and all(o.cached for o in orders),
                           tokens_saved=sum(o.reused_tokens for o in orders if not o.cached), error=error,
                           notes=notes, orders=orders)

        if view_a.text is None or view_b.text is None:
            over = [v.run_id for v in (view_a, view_b) if v.text is None]
            return finish("overflow", None, {"ab": None, "ba": None},
                          error=f"even the skeleton of {', '.join(over)} exceeds the view allowance "
                                f"{self.allowance} tokens (n_ctx {self.backend.n_ctx})")
        orders: list[OrderScore] = []
        try:
            for order in ORDERS:
                first, second = (view_a.text, view_b.text) if order == "ab" else (view_b.text, view_a.text)
                score, cached = self._score(store, manifest, first, second)
                p_first = score.probs["A"]
                orders.append(OrderScore(order=order, p_a=p_first if order == "ab" else 1.0 - p_first,
                                         label_mass=score.label_mass, prompt_tokens=score.prompt_tokens,
                                         reused_tokens=score.reused_tokens, cached=cached))
                if on_call is not None:
                    on_call()
        except PromptOverflow as exc:
            return finish("overflow", None, {"ab": None, "ba": None}, error=str(exc), orders=tuple(orders))
        except JudgeError as exc:
            by_order: dict[str, float | None] = {o: None for o in ORDERS}
            by_order.update({o.order: o.p_a for o in orders})
            return finish("error", None, by_order, error=str(exc), orders=tuple(orders))
        outcome, p_a = decide(orders[0].p_a, orders[1].p_a, self.margin)
        return finish(outcome, p_a, {o.order: o.p_a for o in orders}, orders=tuple(orders))

    def _score(self, store: Any, manifest: dict[str, Any], first: str, second: str) -> tuple[LabelScore, bool]:
        key = judgment_key(manifest, first, second)
        getter = getattr(store, "get_judgment", None) if self.use_cache else None
        if getter is not None:
            hit = getter(key)
            if hit is not None:
                return LabelScore(probs={k: float(v) for k, v in hit["probs"].items()},
                                  label_mass=float(hit["label_mass"]), prompt_tokens=int(hit["prompt_tokens"]),
                                  reused_tokens=int(hit.get("reused_tokens", 0))), True
        try:
            score = self.backend.score(segments(first, second), shared=SHARED_SEGMENTS)
        except JudgeError:
            raise
        except Exception as exc:  # a backend bug or a runtime crash is an outcome, never a score
            raise JudgeError(f"the judge backend failed ({type(exc).__name__}: {exc})") from exc
        putter = getattr(store, "put_judgment", None) if self.use_cache else None
        if putter is not None:
            putter(key, {"probs": score.probs, "label_mass": score.label_mass, "prompt_tokens": score.prompt_tokens,
                         "reused_tokens": score.reused_tokens, "template": TEMPLATE_VERSION,
                         "model_sha256": manifest.get("model_sha256")})
        return score, False


def judge_pair(store: Any, a: str, b: str, backend: Backend, *, margin: float = DEFAULT_MARGIN,
               show_grades: bool = False, use_cache: bool = True, reduce_to: int | None = None) -> Verdict:
    """Judge runs ``a`` and ``b`` of ``store`` with ``backend`` (both orders, cached in the store)."""
    return Judge(backend, margin=margin, show_grades=show_grades, use_cache=use_cache).judge_pair(
        store, a, b, reduce_to=reduce_to)
