"""Pairwise verdicts: both orders, forced-choice probabilities, un-swap and average.

The pair (a, b) is asked twice: with a shown first (order ``ab``) and with b shown first (``ba``).
Each call yields the probability that the run in position A is better; in order ``ba`` that is run b,
so it is un-swapped (``1 − p``) before the two are averaged into ``p_a`` — the probability that run a
is the better run.

Outcomes: ``a`` / ``b`` (a decisive winner), ``tie`` (``|p_a − 0.5| < margin``), ``inconsistent``
(both orders are decisive and disagree: the model chose by position), ``overflow`` (even the skeleton
of a run does not fit the window) and ``error`` (the backend failed). The last two never carry a score.

Two caches, both in the store's judgment cache:

- each order's call, keyed by the prompt itself (:func:`judgment_key`: the judge's settings and the text of both
  views): a cached answer is never read for another prompt;
- each verdict, keyed by what identifies it (:func:`verdict_key`): the judge's settings, the digest of what each
  run's views are derived from (:func:`~kvjudge.judge.render.view_source`), the window's cap (a pair that fits is
  read whole in any window; one that must be cut is cut to the cap), the code that derives views, ``reduce_to``
  and ``full``. Those decide the two views exactly, so a cached
  verdict is found without rendering or counting the pair. A verdict enters it only when both views read every
  body they show and it was computed with the settings it is keyed by; an error never does.
"""

from __future__ import annotations

import functools
import hashlib
import json
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from kvjudge.errors import JudgeError, UsageError
from kvjudge.judge.evidence import RunEvidence, visibility_from_json
from kvjudge.judge.labels import LabelScore, PromptOverflow
from kvjudge.judge.ledger import Ledger
from kvjudge.judge.pack import PackedView, RunTokens
from kvjudge.judge.prompt import TEMPLATE_VERSION, Prompt
from kvjudge.judge.protocols.base import by_criterion, mean_spread
from kvjudge.judge.render import view_source
from kvjudge.judge.runfacts import RunFacts
from kvjudge.settings import DEFAULT_MARGIN

if TYPE_CHECKING:
    from kvjudge.retention import Store
    from kvjudge.retention.state import RunState

OUTCOMES: tuple[str, ...] = ("a", "b", "tie", "inconsistent", "overflow", "error")
# Outcomes that carry a score (p_a from both orders). Coverage counts these.
SCORED = frozenset({"a", "b", "tie", "inconsistent"})
ORDERS: tuple[str, str] = ("ab", "ba")
SIDES: tuple[str, str] = ("a", "b")
# The verdict cache's keys, beside the order cache's bare sha256 keys in the same table.
VERDICT_KEY_PREFIX = "verdict-v1:"


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
    criterion: str | None = None  # the criterion asked (None: the letter question)
    reading: str | None = None  # the reading's id (criterion/variant/order) where the protocol has several an order


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
    cost: Ledger | None = None  # the calls this verdict made, as their answerers measured them (None: not tracked)

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
            "cost": None if self.cost is None else self.cost.to_json(),
            **self.reading_figures(),
        }

    def reading_figures(self) -> dict[str, Any]:
        """A scale protocol's readings: each reading's un-swapped score, per criterion the mean and spread (sd)
        over its repeats and orders, and the spread over all readings (nothing for the letter protocol)."""
        if not any(o.criterion for o in self.orders):
            return {}
        _, spread = mean_spread([o.p_a for o in self.orders])
        return {"criteria": by_criterion([(o.criterion, o.p_a) for o in self.orders]), "spread": spread,
                "readings": [{"reading": o.reading, "p_a": o.p_a, "label_mass": o.label_mass} for o in self.orders]}


# ------------------------------------------------------------------------------------------- the order cache
_SETTINGS = ("model_sha256", "model", "backend", "backend_version", "n_batch", "server", "top_logprobs", "template",
             "chat_template_sha256", "show_verifier", "show_grades")
# What a scale protocol adds (the letter protocol adds nothing: its keys are those it always had).
_PROTOCOL_SETTINGS = ("protocol", "protocol_version", "levels", "repeats", "rubric", "min_label_mass")


def judge_settings(manifest: Mapping[str, Any]) -> dict[str, Any]:
    """What in a manifest decides the model's answer to a prompt (not n_ctx: the window decides what fits, not
    what the model computes for the same tokens), and the protocol, its scale, K and rubric unless it is the letter
    protocol (so a verdict of another protocol, scale, K or rubric is never read for this one)."""
    settings = {k: manifest.get(k) for k in _SETTINGS}
    if manifest.get("protocol") not in (None, "letter"):
        settings.update({k: manifest.get(k) for k in _PROTOCOL_SETTINGS})
    return settings


def text_sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def judgment_key(manifest: dict[str, Any], view_first: str, view_second: str, common: str = "", *,
                 hashes: tuple[str, str, str] | None = None) -> str:
    """Cache key of one order's call: sha256 of (model, backend settings, framing, what is held out, and the sha256
    of both views and of the block of text common to both). ``hashes`` gives those three sha256 when known."""
    first, second, block = hashes or (text_sha256(view_first), text_sha256(view_second), text_sha256(common))
    blob = json.dumps({"settings": judge_settings(manifest), "template_version": TEMPLATE_VERSION,
                       "first": first, "second": second, "common": block}, sort_keys=True)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def score_payload(score: LabelScore, manifest: Mapping[str, Any]) -> dict[str, Any]:
    """What the order cache keeps of one call."""
    return {"probs": score.probs, "label_mass": score.label_mass, "prompt_tokens": score.prompt_tokens,
            "reused_tokens": score.reused_tokens, "template_version": TEMPLATE_VERSION,
            "template": manifest.get("template"), "model_sha256": manifest.get("model_sha256")}


def score_from_payload(payload: Mapping[str, Any]) -> LabelScore:
    """A cached call's score (from :func:`score_payload`)."""
    return LabelScore(probs={k: float(v) for k, v in payload["probs"].items()},
                      label_mass=float(payload["label_mass"]), prompt_tokens=int(payload["prompt_tokens"]),
                      reused_tokens=int(payload.get("reused_tokens", 0)))


@dataclass(frozen=True)
class OrderPrompt(Prompt):
    """One order's call, ready for a backend: the segments, the shared prefix, the order and the cache key."""

    order: str = "ab"
    key: str = ""
    criterion: str | None = None
    reading: str | None = None


def order_score(order: str, score: LabelScore, cached: bool, *, p_first: float | None = None,
                criterion: str | None = None, reading: str | None = None) -> OrderScore:
    """One order's result, un-swapped: ``p_a`` is the probability that run a (not position A) is better.
    ``p_first``: the score of the run shown first, where the protocol reads it otherwise than as label A's
    probability (a scale's expected score)."""
    p_first = score.probs["A"] if p_first is None else p_first
    return OrderScore(order=order, p_a=p_first if order == "ab" else 1.0 - p_first, label_mass=score.label_mass,
                      prompt_tokens=score.prompt_tokens, reused_tokens=score.reused_tokens, cached=cached,
                      server=None if cached else score.server, criterion=criterion, reading=reading)


# ------------------------------------------------------------------------------------------------ deciding
@dataclass(frozen=True)
class SideRecord:
    """One run of a pair as the verdict reports it: what the judge read of it, without the text."""

    run_id: str
    tokens: RunTokens
    notes: tuple[str, ...]
    sha256: str | None  # None: even its skeleton did not fit
    evidence: RunEvidence

    @classmethod
    def of(cls, view: PackedView) -> SideRecord:
        return cls(view.run_id, view.tokens, view.notes, view.sha256,
                   RunEvidence(view.evidence_full, view.evidence))

    def to_json(self) -> dict[str, Any]:
        return {"tokens": asdict(self.tokens), "notes": list(self.notes), "sha256": self.sha256,
                "evidence": self.evidence.to_json()}

    @classmethod
    def from_json(cls, run_id: str, data: Mapping[str, Any]) -> SideRecord:
        evidence = data["evidence"]
        return cls(run_id, RunTokens(**data["tokens"]), tuple(data["notes"]), data["sha256"],
                   RunEvidence(visibility_from_json(evidence["full"]), visibility_from_json(evidence["view"])))


def overflow_message(over: Sequence[str], room: int, n_ctx: int | None) -> str:
    return (f"even the skeleton of {', '.join(over)} exceeds its share of the {room}-token room for views "
            f"(n_ctx {n_ctx})")


def conclude(sides: tuple[SideRecord, SideRecord], orders: Sequence[OrderScore], failure: JudgeError | None, *,
             margin: float, manifest: dict[str, Any], common_tokens: int, seconds: float, overflow: str | None,
             cached: bool | None = None, readings: int = len(ORDERS)) -> Verdict:
    """The verdict from the orders scored (in any order) and the failure that stopped the rest: overflow when a
    view does not fit (``overflow``: why) or the backend refused the prompt as too long, error on any other failure,
    else the decision. ``cached`` overrides "every order was read from the cache". ``readings``: the calls a
    verdict takes (a scale protocol's criteria × repeats × orders); each order's p_a is the mean of its readings'."""
    first, second = sides
    ordered = tuple(sorted(orders, key=lambda o: ORDERS.index(o.order)))

    def finish(outcome: str, p_a: float | None, by_order: dict[str, float | None], *,
               error: str | None = None) -> Verdict:
        return Verdict(a=first.run_id, b=second.run_id, outcome=outcome, p_a=p_a, p_a_by_order=by_order,
                       tokens={"a": first.tokens, "b": second.tokens},
                       further_reduced=first.tokens.further_reduced or second.tokens.further_reduced,
                       seconds=seconds, manifest=manifest, margin=margin,
                       cached=(bool(ordered) and all(o.cached for o in ordered)) if cached is None else cached,
                       tokens_saved=sum(o.reused_tokens for o in ordered if not o.cached), error=error,
                       notes=tuple(f"{side.run_id}: {note}" for side in sides for note in side.notes),
                       orders=ordered, view_sha256={"a": first.sha256, "b": second.sha256},
                       evidence={"a": first.evidence, "b": second.evidence}, common_tokens=common_tokens)

    if overflow is not None:
        return finish("overflow", None, {"ab": None, "ba": None}, error=overflow)
    if isinstance(failure, PromptOverflow):
        return finish("overflow", None, {"ab": None, "ba": None}, error=str(failure))
    means = {order: mean_spread([o.p_a for o in ordered if o.order == order])[0] for order in ORDERS}
    if failure is not None or len(ordered) != readings or None in means.values():
        return finish("error", None, means, error=str(failure) if failure is not None else "an order was never scored")
    outcome, p_a = decide(means["ab"], means["ba"], margin)  # type: ignore[arg-type]
    return finish(outcome, p_a, means)


# ----------------------------------------------------------------------------------------- the verdict cache
# The modules whose code decides what a view shows: a change to any of them is a change of the views a verdict
# was read from, so it is part of the verdict cache's key.
VIEW_MODULES = ("kvjudge.judge.render", "kvjudge.judge.pack", "kvjudge.judge.prompt", "kvjudge.judge.viewcount",
                 "kvjudge.retention.reduce", "kvjudge.retention.extract", "kvjudge.retention.worth",
                 "kvjudge.retention.evidence", "kvjudge.retention.state")


def view_code() -> str:
    """sha256 of the source of the modules that derive views (or of their names and kvjudge's version, where the
    source cannot be read)."""
    return code_digest(VIEW_MODULES)


@functools.cache
def code_digest(modules: tuple[str, ...]) -> str:
    """sha256 of the source of ``modules`` (module names), in order (or of their names and kvjudge's version, where
    the source cannot be read): what a cache key takes from the code that computed the entry."""
    import importlib
    from importlib import metadata

    digest = hashlib.sha256()
    for name in modules:
        module = sys.modules.get(name) or importlib.import_module(name)
        try:
            with open(module.__file__ or "", "rb") as source:
                digest.update(source.read())
        except OSError:
            digest.update(f"{name}@{metadata.version('kvjudge')}".encode())
    return digest.hexdigest()


def verdict_key(settings: Mapping[str, Any], *, window: int, slack: int, source_a: str, source_b: str,
                reduce_to: int | None, full: bool) -> str:
    """The verdict cache's key of a pair: the judge's settings (:func:`judge_settings`: with the template version
    they decide the framing and its tokens), the window's cap and the slack it keeps (so the room for views at the
    cap), what each run's views derive from (:func:`~kvjudge.judge.render.view_source`), the code deriving them,
    and ``reduce_to`` / ``full``."""
    blob = json.dumps({"settings": dict(settings), "template_version": TEMPLATE_VERSION, "window": window,
                       "slack": slack,
                       "views": [source_a, source_b], "code": view_code(), "reduce_to": reduce_to, "full": full},
                      sort_keys=True)
    return VERDICT_KEY_PREFIX + hashlib.sha256(blob.encode("utf-8")).hexdigest()


def view_sources(store: Store, run_ids: Iterable[str], state: Callable[[str], RunState], *,
                 show_grades: bool = False, show_verifier: bool = False) -> dict[str, str]:
    """What each run's views derive from (:func:`~kvjudge.judge.render.view_source`), by id, kept under the digest
    of the run's state (:class:`~kvjudge.judge.runfacts.RunFacts`): once kept, a pair's verdict key is found without
    decoding its runs. ``state(run_id)``: the folded run, read only where its source is not kept yet."""
    shown = {"show_grades": show_grades, "show_verifier": show_verifier}
    facts = RunFacts("view_source", lambda folded: (view_source(folded, **shown), True), view_code(), shown)
    return facts.of(store, run_ids, state)


def verdict_record(verdict: Verdict, sides: tuple[SideRecord, SideRecord]) -> dict[str, Any]:
    """What the verdict cache keeps of a verdict: each side as read, the orders' scores, the manifest, and why
    the pair overflowed (the decision itself is made again on reading, with the margin asked for then)."""
    return {"sides": [side.to_json() for side in sides], "common_tokens": verdict.common_tokens,
            "orders": [{"order": o.order, "p_a": o.p_a, "label_mass": o.label_mass, "prompt_tokens": o.prompt_tokens,
                        "reused_tokens": o.reused_tokens,
                        **({"criterion": o.criterion, "reading": o.reading} if o.criterion else {})}
                       for o in verdict.orders],
            "overflow": verdict.error if verdict.outcome == "overflow" else None, "manifest": verdict.manifest}


def verdict_from_record(record: Mapping[str, Any], a: str, b: str, *, margin: float, seconds: float) -> Verdict:
    """The verdict of runs ``a`` and ``b`` from its cache record (decided with ``margin``)."""
    first, second = (SideRecord.from_json(run, data) for run, data in zip((a, b), record["sides"]))
    orders = [OrderScore(o["order"], float(o["p_a"]), float(o["label_mass"]), int(o["prompt_tokens"]),
                         int(o["reused_tokens"]), cached=True, criterion=o.get("criterion"), reading=o.get("reading"))
              for o in record["orders"]]
    return conclude((first, second), orders, None, margin=margin, manifest=dict(record["manifest"]),
                    common_tokens=int(record["common_tokens"]), seconds=seconds, overflow=record["overflow"],
                    cached=True, readings=len(orders))


PairReduce = int | Mapping[tuple[str, str], int] | None


@dataclass(frozen=True)
class PackedPair:
    """A pair's two views, packed into the judge's window; ``started`` is when its packing began and
    ``pack_seconds`` how long it took; ``complete``: both views read every body they show."""

    view_a: PackedView
    view_b: PackedView
    started: float
    pack_seconds: float
    complete: bool = True


__all__ = ["DEFAULT_MARGIN", "ORDERS", "OUTCOMES", "SCORED", "SIDES", "VERDICT_KEY_PREFIX", "OrderPrompt",
           "OrderScore", "PackedPair", "PairReduce", "SideRecord", "VIEW_MODULES", "Verdict", "code_digest", "conclude", "decide",
           "judge_settings", "judgment_key", "order_score", "text_sha256", "overflow_message", "score_from_payload",
           "score_payload", "verdict_from_record", "verdict_key", "verdict_record", "view_code", "view_sources"]
