"""Meta-evaluation: is the judge right, measured against grades it never saw, beside simple baselines?

Truth for a pair is which run has the higher held-out grade (pairs whose grades are equal, or missing,
have no preferred run and are left out, counted). For the judge and for each baseline, on the same pairs:

- coverage: scored verdicts / pairs (overflow and error are not scored, and are not counted as wrong);
- accuracy with ties as half (a tie or an inconsistent verdict expresses no preference: half right), and
  accuracy over decisive verdicts only, each with a Wilson 95 % interval;
- Cohen's κ of the verdicts (a | b | no preference) against the truth;
- position consistency (both orders on the same side of 0.5) and position bias (the mean probability
  given to the run shown first: 0.5 is none); tie and inconsistent rates; mean label mass;
- reliability: p_a against the truth, in bins;
- calibration of p_a against "a has the higher grade" (:func:`kvjudge.judge.metrics.calibration_figures`): Brier,
  ECE over equal-mass bins, and isotonic and Platt maps fitted on half the pairs and measured on the other half.

Baselines (no model): ``always_first`` (the run listed first in each pair wins), ``longer_run`` (the
longer run as the judge would read it wins), ``last_exit_zero`` (the run whose last tool call exited 0
wins). A judge that does not beat them is reported as such, plainly.

Beside them, evidence retention (:mod:`kvjudge.judge.evidence`): how much of each run's final submission and
last test outcome its full view and the view judged show, and the pairs judged from views that hide some.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kvjudge.judge.evidence import batch
from kvjudge.judge.metrics import Z95, calibration_figures, wilson  # noqa: F401 - Z95, wilson re-exported
from kvjudge.judge.render import body_resolver, render_parts, render_view
from kvjudge.judge.runfacts import RunFacts
from kvjudge.judge.stillgrades import cohen_kappa
from kvjudge.judge.verdict import SCORED, VIEW_MODULES, Verdict, code_digest
from kvjudge.judge.critic_eval import pairwise_score_figures
from kvjudge.judge.metrics import length_controlled
from kvjudge.retention.state import RunState, best_grade

if TYPE_CHECKING:
    from kvjudge.retention import Store
    from kvjudge.retention.store import RunListing
    from kvjudge.retention.store.interfaces import BlobStore

BASELINES: tuple[str, ...] = ("always_first", "longer_run", "last_exit_zero")
NO_PREFERENCE = ("tie", "inconsistent")
RELIABILITY_BINS = 5
# The two views of each run whose evidence eval reports: the run's full view and the view the judge read.
EVIDENCE_SIDES = ("full", "judged")


def grade_score(state: RunState | RunListing) -> float | None:
    """The run's best held-out grade score (None when it has no grade)."""
    grade = best_grade(state)
    return None if grade is None else float(grade["score"])


def truth(state_a: RunState | RunListing, state_b: RunState | RunListing) -> str | None:
    """``"a"`` / ``"b"``: the run with the higher grade; ``"equal"``; None when either has no grade."""
    score_a, score_b = grade_score(state_a), grade_score(state_b)
    if score_a is None or score_b is None:
        return None
    if score_a == score_b:
        return "equal"
    return "a" if score_a > score_b else "b"


@dataclass(frozen=True)
class Decision:
    """One pair as a judge or a baseline decided it; ``p_ab`` / ``p_ba`` (un-swapped) only for a real judge."""

    a: str
    b: str
    outcome: str
    p_a: float | None
    p_ab: float | None = None
    p_ba: float | None = None
    label_mass: float | None = None

    @classmethod
    def of(cls, verdict: Verdict) -> Decision:
        masses = [o.label_mass for o in verdict.orders]
        return cls(verdict.a, verdict.b, verdict.outcome, verdict.p_a, verdict.p_a_by_order.get("ab"),
                   verdict.p_a_by_order.get("ba"), sum(masses) / len(masses) if masses else None)

    @property
    def scored(self) -> bool:
        return self.outcome in SCORED


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _preference(outcome: str) -> str:
    return "none" if outcome in NO_PREFERENCE else outcome


def metrics(decisions: Sequence[Decision], truths: Mapping[tuple[str, str], str]) -> dict[str, Any]:
    """The figures of one judge (or baseline) over the pairs whose truth is ``"a"`` or ``"b"``."""
    judged = [d for d in decisions if truths.get((d.a, d.b)) in ("a", "b")]
    scored = [d for d in judged if d.scored]
    decisive = [d for d in scored if d.outcome in ("a", "b")]
    correct = sum(d.outcome == truths[(d.a, d.b)] for d in decisive)
    no_preference = sum(d.outcome in NO_PREFERENCE for d in scored)
    half_right = correct + 0.5 * no_preference
    ordered = [d for d in scored if d.p_ab is not None and d.p_ba is not None]
    masses = [d.label_mass for d in scored if d.label_mass is not None]
    return {
        "pairs": len(judged),
        "scored": len(scored),
        "coverage": len(scored) / len(judged) if judged else None,
        "correct": correct,
        "decisive": len(decisive),
        "accuracy_ties_half": half_right / len(scored) if scored else None,
        "accuracy_ties_half_ci95": wilson(half_right, len(scored)),
        "accuracy_decisive": correct / len(decisive) if decisive else None,
        "accuracy_decisive_ci95": wilson(correct, len(decisive)),
        "kappa": cohen_kappa([_preference(d.outcome) for d in scored], [truths[(d.a, d.b)] for d in scored],
                             categories=("a", "b", "none")),
        "position_consistency": _mean([float((d.p_ab > 0.5) == (d.p_ba > 0.5) or d.p_ab == d.p_ba)
                                       for d in ordered]),
        # Order ab shows a first (its p is P(a better)); order ba shows b first (P(b better) = 1 − p_ba).
        "position_bias": _mean([(d.p_ab + (1.0 - d.p_ba)) / 2 for d in ordered]),
        "tie_rate": sum(d.outcome == "tie" for d in scored) / len(scored) if scored else None,
        "inconsistent_rate": sum(d.outcome == "inconsistent" for d in scored) / len(scored) if scored else None,
        "mean_label_mass": _mean(masses),
        "reliability": reliability([d for d in scored if d.p_a is not None], truths),
    }


def reliability(decisions: Sequence[Decision], truths: Mapping[tuple[str, str], str],
                bins: int = RELIABILITY_BINS) -> list[dict[str, Any]]:
    """p_a against the truth in ``bins`` equal bins of p_a: count, mean p_a, share where a was better."""
    rows = []
    for index in range(bins):
        low, high = index / bins, (index + 1) / bins
        inside = [d for d in decisions if low <= d.p_a < high or (index == bins - 1 and d.p_a == 1.0)]
        rows.append({"low": low, "high": high, "pairs": len(inside),
                     "mean_p_a": _mean([d.p_a for d in inside]),
                     "a_better": _mean([float(truths[(d.a, d.b)] == "a") for d in inside])})
    return rows


def _decide(a: str, b: str, value_a: float | None, value_b: float | None) -> Decision:
    if value_a is None or value_b is None or value_a == value_b:
        return Decision(a, b, "tie", 0.5)
    return Decision(a, b, "a", 1.0) if value_a > value_b else Decision(a, b, "b", 0.0)


def last_exit_code(state: RunState) -> int | None:
    """The exit code of the run's last tool call on its live branches (None when it never ran a tool)."""
    codes = [t.tool_output.get("exit_code") for branch in state.branches if branch.status == "live"
             for t in branch.transitions if t.tool_output]
    return codes[-1] if codes else None


def view_length(blobs: BlobStore, state: RunState) -> int:
    """Characters of the run as the judge would read it, everything held out hidden."""
    return len(render_view(state, body_resolver(state, blobs.text)))


def baseline_inputs(store: Store, run_ids: Iterable[str], state: Callable[[str], RunState], *,
                    use_cache: bool = True) -> dict[str, dict[str, Any]]:
    """What the baselines read of each run, by id: ``length`` (:func:`view_length`) and ``last_exit_code``
    (:func:`last_exit_code`), kept under the digest of the run's state (:class:`~kvjudge.judge.runfacts.RunFacts`;
    a view with a body that could not be read is not kept). ``state(run_id)``: the folded run, read only where its
    inputs are not kept yet."""
    def compute(folded: RunState) -> tuple[dict[str, Any], bool]:
        parts = render_parts(folded, body_resolver(folded, store.blobs.text))
        return {"length": len(parts.text), "last_exit_code": last_exit_code(folded)}, not parts.missing

    facts = RunFacts("baseline_inputs", compute, code_digest((*VIEW_MODULES, __name__)))
    return facts.of(store, run_ids, state, use_cache=use_cache)


def baseline_decisions(name: str, pairs: Sequence[tuple[str, str]],
                       inputs: Mapping[str, Mapping[str, Any]]) -> list[Decision]:
    """A baseline's decisions on ``pairs`` (``inputs``: :func:`baseline_inputs` of their runs)."""
    if name == "always_first":
        return [Decision(a, b, "a", 1.0) for a, b in pairs]
    if name == "longer_run":
        return [_decide(a, b, inputs[a]["length"], inputs[b]["length"]) for a, b in pairs]
    if name == "last_exit_zero":
        def ok(run_id: str) -> float:
            return float(inputs[run_id]["last_exit_code"] == 0)
        return [_decide(a, b, ok(a), ok(b)) for a, b in pairs]
    raise ValueError(f"unknown baseline {name!r}")


def conclusion(judge: Mapping[str, Any], baselines: Mapping[str, Mapping[str, Any]]) -> str:
    """One plain sentence: does the judge beat the baselines on these pairs?"""
    score = judge.get("accuracy_ties_half")
    if score is None:
        return "no scored verdicts on pairs with different grades: nothing to compare"
    ranked = sorted(((m["accuracy_ties_half"], name) for name, m in baselines.items()
                     if m.get("accuracy_ties_half") is not None), reverse=True)
    if not ranked:
        return "no baseline could be computed on these pairs"
    best, name = ranked[0]
    low = (judge.get("accuracy_ties_half_ci95") or (score, score))[0]
    if score <= best:
        return (f"the judge does not beat the baselines: accuracy {score:.2f} (ties as half) against "
                f"{name} {best:.2f} on {judge['pairs']} pairs")
    if low <= best:
        return (f"the judge scores above every baseline ({score:.2f} vs {name} {best:.2f}), but its 95 % interval "
                f"reaches down to {low:.2f}: not shown to beat {name} on {judge['pairs']} pairs")
    return f"the judge beats every baseline: {score:.2f} (95 % interval from {low:.2f}) vs {name} {best:.2f}"


def evaluate(store: Store, verdicts: Sequence[Verdict], states: Mapping[str, RunState | RunListing] | None = None,
             *, use_cache: bool = True) -> dict[str, Any]:
    """The judge's figures and the baselines' on the pairs of ``verdicts`` (truth from the store's grades).
    ``states``: runs already read, by id — folded runs, or listings (their grades are all the truth needs); the
    others are read from the store. The baselines' inputs are kept in the store (``use_cache``: read and written;
    see :func:`baseline_inputs`), so a run is folded only where they are not kept yet."""
    read: dict[str, RunState | RunListing] = dict(states or {})

    def run(run_id: str) -> RunState:
        current = read.get(run_id)
        if not isinstance(current, RunState):
            current = read[run_id] = store.runs.run(run_id)
        return current

    def graded(run_id: str) -> RunState | RunListing:
        return read[run_id] if run_id in read else run(run_id)

    pairs = [(v.a, v.b) for v in verdicts]
    truths = {(a, b): t for a, b in pairs if (t := truth(graded(a), graded(b))) is not None}
    inputs = baseline_inputs(store, (run_id for pair in pairs for run_id in pair), run, use_cache=use_cache)
    judge = metrics([Decision.of(v) for v in verdicts], truths)
    # p_a's calibration against "a has the higher grade", over the scored pairs with different grades.
    decided = [v for v in verdicts if v.outcome in SCORED and v.p_a is not None and truths.get((v.a, v.b)) in ("a", "b")]
    judge["calibration"] = calibration_figures([v.p_a for v in decided], [truths[(v.a, v.b)] == "a" for v in decided])
    baselines = {name: metrics(baseline_decisions(name, pairs, inputs), truths) for name in BASELINES}
    return {
        "pairs": len(pairs),
        "graded_pairs": sum(t in ("a", "b") for t in truths.values()),
        "equal_grades": sum(t == "equal" for t in truths.values()),
        "ungraded": len(pairs) - len(truths),
        "judge": judge,
        "baselines": baselines,
        "conclusion": conclusion(judge, baselines),
        "evidence": batch([(v.a, v.b, list(v.evidence.values())) for v in verdicts], EVIDENCE_SIDES),
        "score": pairwise_score_figures(verdicts, truths),
        "length_controlled": _length_controlled(verdicts, inputs),
    }


def _length_controlled(verdicts: Sequence[Verdict], inputs: Mapping[str, Mapping[str, Any]]) -> dict[str, Any] | None:
    """How far the judge's p_a moves with the length difference of the two runs' views (None under two scores)."""
    scored = [v for v in verdicts if v.scored and v.p_a is not None]
    if len(scored) < 2:
        return None
    return length_controlled([float(v.p_a) for v in scored],  # type: ignore[arg-type]
                             [inputs[v.a]["length"] - inputs[v.b]["length"] for v in scored])


def plot_reliability(results: Mapping[str, Mapping[str, Any]], path: Any) -> None:
    """PNG: mean p_a per bin against the share of pairs where run a was better, one line per judge setting."""
    # The figure alone, drawn by Agg: pyplot's state machine and backend loading cost a command a tenth of a second.
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6, 5))
    ax = fig.subplots()
    ax.plot([0, 1], [0, 1], color="grey", linewidth=1, label="perfectly calibrated")
    for label, result in results.items():
        rows = [r for r in result["judge"]["reliability"] if r["pairs"]]
        ax.plot([r["mean_p_a"] for r in rows], [r["a_better"] for r in rows], marker="o",
                label=f"{label} (n={sum(r['pairs'] for r in rows)})")
        for r in rows:
            ax.annotate(str(r["pairs"]), (r["mean_p_a"], r["a_better"]), fontsize=7, xytext=(3, 3),
                        textcoords="offset points")
    ax.set_xlim(0, 1)
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("judge's p_a (binned)")
    ax.set_ylabel("share of pairs where run a has the higher grade")
    ax.set_title("Reliability against held-out grades")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
