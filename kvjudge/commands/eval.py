"""`kvjudge eval`: is the judge right? Accuracy against held-out grades, beside simple baselines.

    kvjudge eval [--task TASK | --pairs FILE | RUN_A RUN_B] [--trials matched|all] [--template auto|chat|raw|both]
                 [--png PATH] [--json]

By default every same-task pair of the store is judged (judgments come from the cache when they are there; an
agent's trials paired as :mod:`kvjudge.judge.pairing` says) and scored against the grades the judge never saw;
see :mod:`kvjudge.judge.evaluate` for the figures. Counts are of pairs, never runs; the output says how the pairs
were chosen and how many trials per agent and task they use.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from kvjudge.commands._args import READS_TIERED, command, target_from
from kvjudge.commands._judging import (add_judge_args, announce, job_summary, judged, opened_judge, select_pairs,
                                      shown, spent)
from kvjudge.commands._output import emit, info, print_table, print_wrapped, progress
from kvjudge.errors import UsageError
from kvjudge.judge.critic_eval import score_figures
from kvjudge.judge.evaluate import BASELINES, EVIDENCE_SIDES, evaluate, grade_score, plot_reliability
from kvjudge.judge.evidence import summary_line
from kvjudge.judge.ledger import Ledger
from kvjudge.judge.pointwise import score_runs, summarize_scores
from kvjudge.retention.state import RunState
from kvjudge.target import JudgeTarget

DEFAULT_PNG = "kvjudge-eval.png"


def register(subparsers: argparse._SubParsersAction) -> None:
    with command(subparsers, "eval", _eval, shared=READS_TIERED,
                 help="score the judge against held-out grades beside simple baselines (accuracy, κ, position "
                      "bias)") as parser:
        add_judge_args(parser, also_templates=("both",), kinds=("pairwise", "pointwise"))
        parser.add_argument("--png", metavar="PATH", default=DEFAULT_PNG,
                            help=f"reliability plot (p_a against the truth, binned; default ./{DEFAULT_PNG})")


def _eval(args: argparse.Namespace) -> int:
    """Judge every same-task pair (or the pairs named) and compare the verdicts with the grades the judge never saw:
    coverage, accuracy (ties as half, and ties excluded) with Wilson 95 % intervals, Cohen's kappa, position
    consistency and bias, tie/inconsistent rates, label mass; the same for the baselines always-first,
    longer-run-wins and last-exit-code-0-wins."""
    target = target_from(args)
    if target.protocol(args.protocol).kind == "pointwise":
        return _eval_pointwise(args, target)
    # --template both: each framing in turn; otherwise the one named, else [judge] template.
    templates = ["chat", "raw"] if args.template == "both" else [args.template]
    results: dict[str, dict[str, Any]] = {}
    with target.open_store() as store:
        selection = select_pairs(args, store.runs, default_all=True)
        states: dict[str, RunState] = {}  # the runs the judge folds, folded once for the baselines too
        for template in templates:
            with opened_judge(args, target, template=template, store=store) as judge:
                label = judge.framing.name
                verdicts = judged(judge, store, selection, f"judging ({label} framing)", states=states)
                result = evaluate(store, verdicts, {**selection.runs, **states}, use_cache=not args.no_cache)
                result["manifest"] = judge.manifest()
                result["window"] = None if judge.window is None else judge.window.to_json()
                result["cost"] = spent(judge).to_json()
                result["job"] = job_summary(judge.sharing)
                results[label] = result
    png = Path(args.png)
    plot_reliability(results, png)
    info(f"reliability plot: {png}")
    payload = {"templates": results, "png": str(png), "pairing": selection.to_json()}
    emit(args, payload, lambda: _print(results, selection.describe()))
    return 0


def _eval_pointwise(args: argparse.Namespace, target: JudgeTarget) -> int:
    """A pointwise protocol's eval: every run of the store (or of --task, or of the pairs named) scored, and the
    scores against the runs' grades as a critic is measured (:func:`~kvjudge.judge.critic_eval.score_figures`)."""
    with target.open_store() as store:
        if args.runs or args.pairs is not None:
            run_ids = sorted({run for pair in select_pairs(args, store.runs).pairs for run in pair})
        else:
            run_ids = store.runs.run_ids(task=args.task)
        if not run_ids:
            raise UsageError("no runs to score: ingest runs, or name them")
        with opened_judge(args, target, template=None if args.template == "both" else args.template,
                          store=store) as judge:
            with progress("scoring", len(run_ids) * judge.protocol.calls) as advance:
                judge.planner.progress = lambda message: advance(0, description=message)
                shown(judge, advance, "scoring")
                scores = score_runs(judge, store, run_ids, on_call=advance, on_plan=announce(judge, "score"))
            grades = {run_id: grade_score(store.runs.run(run_id)) for run_id in run_ids}
            figures = score_figures(scores, grades)
            payload = {"protocol": judge.protocol.name, "pointwise": figures, "summary": summarize_scores(scores),
                       "manifest": judge.manifest(), "cost": spent(judge).to_json(), "job": job_summary(judge.sharing)}
    emit(args, payload, lambda: _print_pointwise(payload))
    return 0


def _print_pointwise(payload: dict[str, Any]) -> None:
    f = payload["pointwise"]
    rows: list[list[Any]] = [["runs scored / graded", f"{f['scored']} / {f['graded']} ({f['succeeded']} succeeded)"],
                             ["ROC AUC [95 %]", _interval(f["auc"], f["auc_ci95"])], ["Brier", _fmt(f["brier"])],
                             ["ECE (10 equal-mass bins)", _fmt(f["ece"])]]
    for method, held in f["calibration"].items():
        rows.append([f"held-out {method} map: ECE before → after", f"{_fmt(held['before']['ece'])} → "
                                                                    f"{_fmt(held['after']['ece'])} "
                                                                    f"(fit {held['fit']}, measured {held['held_out']})"])
    for name, c in f["criteria"].items():
        rows.append([f"criterion {name}: AUC [95 %]", _interval(c["auc"], c["auc_ci95"])])
    print_table(["", "value"], rows, title=f"{payload['manifest'].get('model')}, {payload['protocol']} protocol")
    print_wrapped("reliability (mean P(success) → observed): " + ", ".join(
        f"{b['mean_p']:.2f}→{b['observed']:.2f}" for b in f["reliability"]))
    print_wrapped(Ledger.from_json(payload["cost"]).line())


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _ci(interval: Any) -> str:
    return f"[{interval[0]:+.3f}, {interval[1]:+.3f}]" if interval else ""


def _interval(value: float | None, interval: Any) -> str:
    if value is None:
        return "-"
    return f"{value:.2f} [{interval[0]:.2f}, {interval[1]:.2f}]" if interval else f"{value:.2f}"


def _row(name: str, m: dict[str, Any]) -> list[Any]:
    return [name, m["pairs"], _fmt(m["coverage"]), _interval(m["accuracy_ties_half"], m["accuracy_ties_half_ci95"]),
            _interval(m["accuracy_decisive"], m["accuracy_decisive_ci95"]) + f" (n={m['decisive']})",
            _fmt(m["kappa"]), _fmt(m["position_consistency"]), _fmt(m["position_bias"]), _fmt(m["tie_rate"]),
            _fmt(m["inconsistent_rate"]), _fmt(m["mean_label_mass"])]


def calibration_line(judge: dict[str, Any]) -> str:
    """p_a's calibration: Brier, equal-mass ECE, the maps fitted on half the pairs and measured on the other half."""
    calibration = judge["calibration"]
    held_out = "; ".join(f"{method} map fitted on {c['fit']}, on the other {c['held_out']}: ECE "
                         f"{_fmt(c['before']['ece'])} -> {_fmt(c['after']['ece'])}"
                         for method, c in calibration["calibration"].items())
    return (f"calibration of p_a over {calibration['items']} graded pairs: Brier {_fmt(calibration['brier'])}, ECE "
            f"{_fmt(calibration['ece'])} ({calibration['bins']} equal-mass bins)" + (f"; {held_out}" if held_out else ""))


def _print(results: dict[str, dict[str, Any]], pairing: str | None = None) -> None:
    if pairing is not None:
        print_wrapped(f"judged {pairing}")
    columns = ["", "pairs", "coverage", "accuracy, ties ½ [95 %]", "accuracy, decisive [95 %]", "κ",
               "pos. consistency", "pos. bias", "ties", "inconsistent", "label mass"]
    for label, result in results.items():
        rows = [_row(f"judge ({label})", result["judge"])]
        rows += [_row(name.replace("_", "-"), result["baselines"][name]) for name in BASELINES]
        model = result["manifest"].get("model")
        print_table(columns, rows, title=f"{model}, {label} framing: {result['graded_pairs']} pairs with different "
                                         f"grades ({result['equal_grades']} equal, {result['ungraded']} ungraded "
                                         f"left out)")
        print_wrapped(result["conclusion"])
        score = result["score"]
        print_wrapped(f"p_a as a score of 'a is better': AUC {_interval(score['auc'], score['auc_ci95'])} over "
                      f"{score['pairs']} pairs" + "".join(f"; {name} {_interval(c['auc'], c['auc_ci95'])}"
                                                          for name, c in score["criteria"].items()))
        length = result["length_controlled"]
        if length is not None and length["slope"] is not None:
            print_wrapped(f"length: p_a moves {length['slope']:+.3f} per {length['unit_chars']} characters of length "
                          f"difference {_ci(length['slope_ci95'])}; the longer run preferred in "
                          f"{_fmt(length['longer_preferred'])} of the pairs that lean (beside position bias "
                          f"{_fmt(result['judge']['position_bias'])})")
        print_wrapped(summary_line(result["evidence"], EVIDENCE_SIDES))
        print_wrapped(calibration_line(result["judge"]))
        print_wrapped(Ledger.from_json(result["cost"]).line())
