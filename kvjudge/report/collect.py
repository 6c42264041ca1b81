"""What a report shows, gathered from the store, the judge and its verdicts — never recomputed on the side.

The figures are the library's own: :func:`~kvjudge.judge.evaluate.evaluate` (what ``kvjudge eval`` prints) and
:func:`~kvjudge.judge.ranking.rank` over the verdicts between different agents (what ``kvjudge rank`` prints).
The views are the judge's own packing (:meth:`~kvjudge.judge.Judge.pack_pair`, in the window each verdict was judged in) and its prompts
(:meth:`~kvjudge.judge.Judge.order_prompts`), checked against the hash of the view each verdict records. What
reduction removed comes from the runs' logs (``Reduced`` / ``BranchReduced`` / ``Dropped`` events).
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvjudge import __version__
from kvjudge.judge import SCORED, Judge, Verdict
from kvjudge.judge.verdict import OrderPrompt
from kvjudge.judge.evaluate import evaluate, grade_score, truth
from kvjudge.judge.ranking import BOOTSTRAP, agent_of, rank
from kvjudge.retention import RunState
from kvjudge.retention import events as ev
from kvjudge.retention.store import EventRecorder, Store

# Verdict fields the report shows by name; any other field of Verdict.to_json() is listed as it is.
KNOWN_VERDICT_FIELDS = frozenset({
    "a", "b", "outcome", "p_a", "p_a_by_order", "tokens", "further_reduced", "seconds", "manifest", "margin",
    "position_consistent", "cached", "tokens_saved", "error", "notes", "label_mass", "view_sha256", "answered_by",
    "evidence", "evidence_hidden", "common_tokens",
})

# How a verdict stands against the held-out grades (the pairs table's "judged" column and its filter).
RIGHT, WRONG, NO_PREFERENCE, UNSCORED, EQUAL_GRADES, UNGRADED = (
    "right", "wrong", "no preference", "unscored", "equal grades", "ungraded")


def judged_against(outcome: str, truth_of_pair: str | None) -> str:
    """``right`` / ``wrong`` for a decisive verdict on a pair with different grades (what ``eval`` counts as
    correct or not), ``no preference`` for a tie or an inconsistent verdict (half right in ``eval``), else why
    the pair does not count: ``unscored`` (overflow, error), ``equal grades`` or ``ungraded``."""
    if truth_of_pair is None:
        return UNGRADED
    if truth_of_pair == "equal":
        return EQUAL_GRADES
    if outcome not in SCORED:
        return UNSCORED
    if outcome not in ("a", "b"):
        return NO_PREFERENCE
    return RIGHT if outcome == truth_of_pair else WRONG


@dataclass(frozen=True)
class Reduction:
    """One fact of a run's log about what reduction removed (``kind``: Reduced, BranchReduced or Dropped)."""

    kind: str
    where: str                 # the transitions (or branch) the body belongs to
    tokens_before: int | None  # None for a dropped body (the log records no count)
    tokens_after: int | None
    counter: str | None


@dataclass(frozen=True)
class RunRow:
    """One run of the report: who, what, where it stands, and its tokens before and after reduction."""

    id: str
    agent: str
    task: str | None
    state: str
    grade: float | None
    full_tokens: int | None      # the judge's view with every original body (None: some originals are gone)
    view_tokens: int | None      # the judge's view of the run as stored
    reductions: tuple[Reduction, ...]
    tiered: str | None           # the tier status (started | tiered | rehydrated), None when never moved

    @property
    def removed(self) -> tuple[int, int, str | None]:
        """Tokens before and after over the reduced bodies and branches, and the counter the log names."""
        counted = [r for r in self.reductions if r.tokens_before is not None]
        counters = {r.counter for r in counted}
        return (sum(r.tokens_before or 0 for r in counted), sum(r.tokens_after or 0 for r in counted),
                counters.pop() if len(counters) == 1 else None)


@dataclass(frozen=True)
class PairDetail:
    """One judged pair: the verdict, the views and prompts as the judge read them, and how it stands."""

    number: int                          # 1-based: the pair page's file name
    verdict: Verdict
    task: str | None
    agents: tuple[str, str]
    grades: tuple[float | None, float | None]
    judged: str                          # right | wrong | no preference | unscored | equal grades | ungraded
    views: tuple[str | None, str | None]
    views_match: bool                    # the views shown hash to what the verdict recorded it read
    prompts: tuple[OrderPrompt, ...]
    common: str = ""                     # the block of text both views share, quoted once (empty: none)
    view_segments: tuple[tuple[str, ...], tuple[str, ...]] = ((), ())  # each view as its segments in a prompt
    evidence: dict[str, Any] = field(default_factory=dict)  # per run: its evidence in the full view and as read
    extra: dict[str, Any] = field(default_factory=dict)  # verdict fields the report does not know by name


@dataclass(frozen=True)
class Report:
    """Everything one report shows (see :func:`build_report`)."""

    header: dict[str, Any]
    evaluation: dict[str, Any]   # kvjudge eval --json's object for this framing
    ranking: dict[str, Any]      # kvjudge rank --json's object (without its PNG)
    pairs: tuple[PairDetail, ...]
    runs: tuple[RunRow, ...]
    selection: dict[str, Any] | None = None  # kvjudge select --json's object, for the best-of-N section (None: none)
    critic: dict[str, Any] | None = None  # a pointwise critic's figures over the runs (kvjudge eval --protocol
    # pointwise's "pointwise" object, critic_eval.score_figures), for the index's critic section (None: none)


def judge_description(judge: Judge) -> dict[str, Any]:
    """Who judged: the model file and its sha256, or the server pool and the model it serves."""
    manifest = judge.manifest()
    model_path = judge.backend.model_path
    return {"model": manifest.get("model"), "model_sha256": manifest.get("model_sha256"),
            "model_file": None if model_path is None else str(model_path),
            "servers": list(judge.backend.servers),
            "backend": manifest.get("backend"), "backend_version": manifest.get("backend_version"),
            "template": manifest.get("template"), "chat_template_sha256": manifest.get("chat_template_sha256"),
            "template_version": manifest.get("template_version"), "show_verifier": manifest.get("show_verifier"),
            "show_grades": manifest.get("show_grades"), "margin": judge.margin}


def _where(state: RunState) -> dict[str, list[str]]:
    """Every body ref of ``state`` and where the run names it (``task prompt``, ``main step 3 (tool): text``)."""
    places: dict[str, list[str]] = {}
    if state.task_prompt_ref:
        places.setdefault(state.task_prompt_ref, []).append("task prompt")
    for branch in state.branches:
        for t in branch.transitions:
            step = f"{branch.id} step {t.seq} ({t.role}):"
            if t.text_ref:
                places.setdefault(t.text_ref, []).append(f"{step} text")
            if t.tool_call and t.tool_call.get("arguments_ref"):
                places.setdefault(t.tool_call["arguments_ref"], []).append(f"{step} tool call")
            if t.tool_output and t.tool_output.get("output_ref"):
                places.setdefault(t.tool_output["output_ref"], []).append(f"{step} tool output")
    return places


def reductions(log: EventRecorder, state: RunState) -> tuple[Reduction, ...]:
    """What reduction removed from the run, in log order, one row per Reduced / BranchReduced / Dropped."""
    places = _where(state)
    found = []
    for _lsn, event in log.iter_events(state.id):
        if isinstance(event, ev.Reduced):
            found.append(Reduction("Reduced", ", ".join(places.get(event.original, ["(no transition)"])),
                                   event.tokens_before, event.tokens_after, event.counter))
        elif isinstance(event, ev.BranchReduced):
            steps = len(state.branch(event.branch).transitions)
            found.append(Reduction("BranchReduced", f"abandoned branch {event.branch} ({steps} steps)",
                                   event.tokens_before, event.tokens_after, event.counter))
        elif isinstance(event, ev.Dropped):
            found.append(Reduction("Dropped", ", ".join(places.get(event.original, ["(no transition)"])),
                                   None, None, None))
    return tuple(found)


def build_report(store: Store, judge: Judge, verdicts: Sequence[Verdict], *,
                 ceilings: Mapping[str, Any] | None = None, ceiling_note: str | None = None,
                 bootstrap: int = BOOTSTRAP, pairing: str | None = None,
                 now: datetime.datetime | None = None) -> Report:
    """The report of ``verdicts`` (as :func:`~kvjudge.judge.judge_batch` gave them, cached or fresh).

    ``judge`` is the judge that gave them, still open: its packing is asked again for the views of the same
    pairs (the same window, so the same views; each is checked against the hash its verdict recorded).
    ``ceilings``: the retention ceiling per tenant (``configured``, ``max_context_tokens``, ``hardware_bound``,
    ``effective``, ``winner``), or ``ceiling_note`` saying why none is known; ``pairing``: how the pairs were
    chosen (one line, as ``eval`` prints it).
    """
    states = {run_id: store.runs.run(run_id) for v in verdicts for run_id in (v.a, v.b)}
    agents = {run_id: agent_of(state) for run_id, state in states.items()}
    evaluation = evaluate(store, verdicts)
    evaluation["manifest"] = judge.manifest()
    evaluation["window"] = None if judge.window is None else judge.window.to_json()
    ranking = rank([v for v in verdicts if agents[v.a] != agents[v.b]], agents.__getitem__, bootstrap=bootstrap)
    pairs = []
    for number, verdict in enumerate(verdicts, start=1):
        state_a, state_b = states[verdict.a], states[verdict.b]
        views: tuple[str | None, str | None] = (None, None)
        prompts: tuple[OrderPrompt, ...] = ()
        common = ""
        segments: tuple[tuple[str, ...], ...] = ((), ())
        if verdict.outcome != "error":
            # The pair packed again in the window its verdict was judged in: the judge's own views and prompts.
            n_ctx = verdict.manifest.get("n_ctx") or judge.window_cap()
            view_a, view_b = judge.pack_pair(store, verdict.a, verdict.b, int(n_ctx))
            views, common = (view_a.text, view_b.text), view_a.common
            segments = tuple(tuple(v.segments) or ((v.text,) if v.text is not None else ()) for v in (view_a, view_b))
            if view_a.text is not None and view_b.text is not None:
                prompts = tuple(judge.order_prompts(view_a, view_b))
            matches = {"a": view_a.sha256, "b": view_b.sha256} == {
                side: verdict.view_sha256.get(side) for side in ("a", "b")}
        else:
            matches = not verdict.view_sha256 or not any(verdict.view_sha256.values())
        pairs.append(PairDetail(
            number=number, verdict=verdict, task=state_a.task_id, agents=(agents[verdict.a], agents[verdict.b]),
            grades=(grade_score(state_a), grade_score(state_b)),
            judged=judged_against(verdict.outcome, truth(state_a, state_b)), views=views, views_match=matches,
            prompts=prompts, common=common, view_segments=segments, evidence=verdict.to_json()["evidence"],
            extra={k: v for k, v in verdict.to_json().items() if k not in KNOWN_VERDICT_FIELDS}))
    runs = []
    tokens: dict[str, Any] = {}
    for verdict in verdicts:
        for side, run_id in (("a", verdict.a), ("b", verdict.b)):
            if tokens.get(run_id) is None or tokens[run_id].reduced is None:  # a verdict that failed counts none
                tokens[run_id] = verdict.tokens[side]
    for run_id in sorted(states):
        state = states[run_id]
        counted = tokens[run_id]
        runs.append(RunRow(id=run_id, agent=agents[run_id], task=state.task_id, state=state.state,
                           grade=grade_score(state), full_tokens=counted.full, view_tokens=counted.reduced,
                           reductions=reductions(store.events, state),
                           tiered=_tier_status(state)))
    when = (now or datetime.datetime.now(datetime.timezone.utc)).isoformat(timespec="seconds")
    header = {"judge": judge_description(judge), "framing": judge.framing.name,
              "window": evaluation["window"], "ceilings": dict(ceilings or {}), "ceiling_note": ceiling_note,
              "store": str(getattr(store, "location", getattr(store, "path", ""))),  # never a password
              "kvjudge_version": __version__, "generated": when,
              "pairs": len(verdicts), "runs": len(states), "cached_pairs": sum(v.cached for v in verdicts),
              "pairing": pairing}
    return Report(header=header, evaluation=evaluation, ranking=ranking, pairs=tuple(pairs), runs=tuple(runs))


def _tier_status(state: RunState) -> str | None:
    return None if state.tier is None else state.tier.get("status")


def with_tier_status(report: Report, store: Store) -> Report:
    """``report`` with each run's tier status as ``store`` says now (a report built before its runs were moved)."""
    runs = tuple(dataclasses.replace(run, tiered=_tier_status(store.runs.run(run.id))) for run in report.runs)
    return dataclasses.replace(report, runs=runs)
