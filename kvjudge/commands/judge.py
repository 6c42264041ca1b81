"""`kvjudge judge`: pairwise verdicts on runs in the store, and the still-grades check.

    kvjudge judge RUN_A RUN_B [--still-grades] [--model PATH | --server URL] [--n-ctx N] [--template T]
                              [--show-verifier] [--no-certify] [--json]
    kvjudge judge --pairs FILE.jsonl        (lines {"a": RUN, "b": RUN})
    kvjudge judge --task TASK               (every pair of runs on one task)
    kvjudge judge … --server URL --server URL [--parallel N]   (a pool: every pair's orders in flight at once)

With ``--json``: one JSON object per pair, then one ``{"summary": …}`` object.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

from kvjudge.commands._args import READS_TIERED, command, records_settings, target_from
from kvjudge.commands._judging import add_judge_args, announce, job_summary, opened_judge, select_pairs, shown
from kvjudge.commands._output import emit, print_fields, print_table, print_wrapped, progress
from kvjudge.judge import Judge, StillGrades, Verdict, judge_batch, summarize_verdicts
from kvjudge.judge.evidence import describe, summary_line
from kvjudge.judge.jury import JuryVerdict, jury_cost, jury_verdicts, summarize_jury
from kvjudge.judge.ledger import Ledger
from kvjudge.target import JudgeTarget


def register(subparsers: argparse._SubParsersAction) -> None:
    with command(subparsers, "judge", _judge, shared=READS_TIERED,
                 help="judge pairs of runs with a local model (both orders, forced choice), and check that reduced "
                      "runs still grade") as parser:
        parser.add_argument("--still-grades", action="store_true",
                            help="judge each pair from the full runs (in a window that holds them, up to the "
                                 "analytic bound) and from the reduced runs; report agreement over pairs whose views "
                                 "differ")
        parser.add_argument("--reduce-to", type=int, metavar="N",
                            help="with --still-grades: reduce each run's bodies to N tokens, as retention counts "
                                 "them (the view adds its markup, so it comes out somewhat above N; default: the "
                                 "effective ceiling, min(configured, max_context_tokens // 2))")
        parser.add_argument("--jury", metavar="JUDGE", action="append",
                            help="a jury member: a GGUF path, a server URL, or URLs joined by commas (a pool); "
                                 "repeat for each (default: [judge] jury, else no jury). The members' verdicts are "
                                 "combined: the mean p_a, the majority label")
        add_judge_args(parser)
        records_settings(parser, "jury")


def _judge(args: argparse.Namespace) -> int:
    """Judge which of two runs is better from the model's own next-token probabilities, asked in both orders.
    Outcomes: a, b, tie, inconsistent (the orders disagree), overflow, error. Verifier results and grades are held
    out of the judge's input unless asked for. With a jury, each member judges and the verdicts are combined."""
    target = target_from(args)
    if target.settings.judge.jury and not args.still_grades:
        return _judge_by_jury(args, target)
    with target.open_store() as store:
        selection = select_pairs(args, store.runs)
        pairs = selection.pairs
        with opened_judge(args, target, store=None if args.still_grades else store) as judge:
            sides = 2 if args.still_grades else 1
            with progress("judging", len(pairs) * judge.protocol.calls * sides) as advance:
                judge.planner.progress = lambda message: advance(0, description=message)
                tracker = _PairProgress(advance, len(pairs) * sides)
                shown(judge, advance, "judging")
                if args.still_grades:
                    check = target.still_grades(judge, store, pairs, reduce_to=args.reduce_to, on_call=tracker.call,
                                                on_verdict=tracker.verdict)
                else:
                    def decided(index: int, verdict: Verdict) -> None:
                        tracker.verdict(index, verdict)
                        _emit_pair(args, verdict, None)  # each pair as soon as it and those before it are decided

                    verdicts = judge_batch(judge, store, pairs, on_call=tracker.call, on_verdict=decided,
                                           on_plan=announce(judge))
            if args.still_grades:
                for result in check.results:
                    _emit_pair(args, result.reduced, result)
                summary = dict(check.summary)
            else:
                summary = summarize_verdicts(verdicts)
            summary.update(_run_figures(judge, tracker, len(pairs) * sides))
            summary["pairing"] = selection.to_json()
            summary["job"] = job_summary(judge.sharing)
            if args.still_grades:
                summary["full_window"] = None if check.full_window is None else check.full_window.to_json()
                summary["reduce_to"] = check.reduce_to
    emit(args, {"summary": summary}, lambda: _print_summary(summary, args.still_grades))
    return 0


def _judge_by_jury(args: argparse.Namespace, target: JudgeTarget) -> int:
    with target.open_store() as store:
        selection = select_pairs(args, store.runs)
        target.protocol()  # a bad protocol, rubric or scale: one line, before any member opens
        members = target.open_jury(n_ctx=args.n_ctx, certify=not args.no_certify, show_verifier=args.show_verifier,
                                   show_grades=args.show_grades, use_cache=not args.no_cache)
        try:
            present = [m for _, m in members if isinstance(m, Judge)]
            calls = sum(m.protocol.calls for m in present) * len(selection.pairs)
            with progress("judging (jury)", calls) as advance:
                verdicts = jury_verdicts(members, store, selection.pairs,
                                         judge=lambda m, pairs: judge_batch(m, store, pairs, on_call=advance,
                                                                            on_plan=announce(m)))
            total, each = jury_cost(members)
        finally:
            for _, member in members:
                if isinstance(member, Judge):
                    member.backend.close()
    for verdict in verdicts:
        emit(args, verdict.to_json(), lambda v=verdict: _print_jury_pair(v))
    summary = {**summarize_jury(verdicts), "pairing": selection.to_json(), "cost": total.to_json(),
               "member_costs": {name: ledger.to_json() for name, ledger in each.items()}}
    emit(args, {"summary": summary}, lambda: _print_jury_summary(summary))
    return 0


def _print_jury_summary(summary: dict[str, Any]) -> None:
    print_table(["", "value"], [["pairs", summary["pairs"]], ["jury outcomes", ", ".join(
        f"{k} {v}" for k, v in summary["outcomes"].items())], ["coverage", _fmt(summary["coverage"])],
        *[[f"member {name}", ", ".join(f"{k} {v}" for k, v in counts.items())]
          for name, counts in summary["members"].items()]], title="jury summary")
    for name, cost in summary["member_costs"].items():
        print_wrapped(f"member {name}: " + Ledger.from_json(cost).line())
    print_wrapped("jury " + Ledger.from_json(summary["cost"]).line())


def _print_jury_pair(verdict: JuryVerdict) -> None:
    rows = [[m.member, m.outcome, _fmt(m.verdict.p_a if m.verdict else None), m.error or
             (m.verdict.error if m.verdict else "") or ""] for m in verdict.members]
    rows.append(["jury", verdict.outcome, _fmt(verdict.p_a), ""])
    print_table(["judge", "outcome", "p_a", "error"], rows, title=f"{verdict.a} vs {verdict.b}")


def _run_figures(judge: Judge, tracker: _PairProgress, judged: int) -> dict[str, Any]:
    """What the summary says of the run itself: prefix tokens saved, time, pairs per minute, servers, window."""
    backend = judge.backend
    wall = time.monotonic() - tracker.started
    figures: dict[str, Any] = {"prefix_tokens_saved": backend.tokens_saved, "wall_seconds": round(wall, 3),
                               "pairs_per_minute": round(judged / (wall / 60), 2) if wall > 0 else None,
                               "cost": backend.ledger.to_json()}
    if backend.servers:
        figures["servers"] = backend.stats()
    figures["window"] = None if judge.window is None else judge.window.to_json()
    figures["room"] = judge.room
    return figures


class _PairProgress:
    """The bar advances per call; its description says pairs done, pairs per minute and errors."""

    def __init__(self, advance: Callable[..., None], total: int) -> None:
        self.advance = advance
        self.total = total
        self.started = time.monotonic()
        self.done = 0
        self.errors = 0

    def call(self) -> None:
        self.advance(1)

    def verdict(self, _index: int, verdict: Verdict) -> None:
        self.done += 1
        self.errors += verdict.outcome == "error"
        minutes = max(time.monotonic() - self.started, 1e-6) / 60
        self.advance(0, description=f"judging · {self.done}/{self.total} pairs · {self.done / minutes:.1f} "
                                    f"pairs/min · {self.errors} error(s)")


def _emit_pair(args: argparse.Namespace, verdict: Verdict, still: StillGrades | None) -> None:
    payload = verdict.to_json()
    if still is not None:
        payload.update({"full": still.full.to_json(), **still.comparison()})
    emit(args, payload, lambda: _print_pair(verdict, still))


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _print_pair(verdict: Verdict, still: StillGrades | None) -> None:
    def row(label: str, v: Verdict) -> list[Any]:
        return [label, v.outcome, _fmt(v.p_a), _fmt(v.p_a_by_order.get("ab")), _fmt(v.p_a_by_order.get("ba")),
                f"{v.tokens['a'].view}/{v.tokens['b'].view}", "yes" if v.further_reduced else "no",
                "yes" if v.cached else "no", f"{v.seconds:.1f}"]

    columns = ["view", "outcome", "p_a", "a first", "b first", "tokens a/b", "further", "cached", "s"]
    rows = [row("full", still.full), row("reduced", still.reduced)] if still is not None else [row("as stored", verdict)]
    print_table(columns, rows, title=f"{verdict.a} vs {verdict.b}")
    if still is not None:
        held = {True: "yes", False: "no", None: "n/a (no score)"}[still.held]
        left_out = ("  (left out: the full side was cut to fit)" if still.full_cut else
                    "  (left out: both sides read the same views)" if not still.views_differ else "")
        print_wrapped(f"winner held: {held}   Δp_a: {_fmt(still.delta_p_a)}{left_out}")
        sides = still.run_evidence()
        print_wrapped("evidence: " + "; ".join(f"{name} {describe(e.full)} (full) → {describe(e.view)} (reduced)"
                                               for name, e in sides.items())
                      + (" — REDUCTION HIDES EVIDENCE" if still.evidence_hidden else ""))
    else:
        read = "; ".join(f"{name} {describe(e.view)}" for name, e in verdict.evidence.items())
        print_wrapped(f"evidence read: {read}"
                      + (" — the views hide evidence their full runs show" if verdict.evidence_hidden else ""))
    criteria = verdict.reading_figures().get("criteria", {})
    if criteria:
        print_wrapped("criteria (p_a ± sd over repeats and orders): " + "; ".join(
            f"{name} {_fmt(c['mean'])} ± {_fmt(c['spread'])}" for name, c in criteria.items()))
    for v in ([still.full, still.reduced] if still is not None else [verdict]):
        if v.error:
            print_wrapped(f"{v.outcome}: {v.error}", indent="  ")
        for note in v.notes:
            print_wrapped(f"note: {note}", indent="  ")


def _print_summary(summary: dict[str, Any], still: bool) -> None:
    if still:
        rows = [["pairs", summary["pairs"]], ["full side cut to fit (full_cut, left out)", summary["full_cut"]],
                ["same views on both sides (left out)", summary["same_views"]], ["compared", summary["compared"]],
                ["agreement", _fmt(summary["agreement"])], ["flips", summary["flips"]],
                ["decisions lost (a winner became a tie or inconsistent)", summary["lost"]],
                ["Cohen's kappa", _fmt(summary["kappa"])], ["mean |Δp_a|", _fmt(summary["mean_abs_delta_p_a"])],
                ["coverage full / reduced", f"{_fmt(summary['coverage']['full'])} / "
                                            f"{_fmt(summary['coverage']['reduced'])}"],
                ["position consistency full / reduced", f"{_fmt(summary['position_consistency']['full'])} / "
                                                        f"{_fmt(summary['position_consistency']['reduced'])}"]]
    else:
        outcomes = ", ".join(f"{k} {v}" for k, v in summary["outcomes"].items() if v)
        rows = [["pairs", summary["pairs"]], ["outcomes", outcomes], ["coverage", _fmt(summary["coverage"])],
                ["position consistency", _fmt(summary["position_consistency"])],
                ["cached", summary["cached"]], ["further reduced", summary["further_reduced"]]]
    if summary.get("window"):
        window = summary["window"]
        rows.append(["window n_ctx", f"{window['n_ctx']} (needed {window['needed']}, cap {window['cap']} from "
                                     f"{window['cap_source']}; {'measured' if window['measured'] else 'not certified'})"])
    rows.append(["prefix tokens saved", summary["prefix_tokens_saved"]])
    if "servers" in summary:
        pool = summary["servers"]
        rows.append(["servers (calls answered)", ", ".join(f"{url} {n}" for url, n in pool["calls"].items())])
        if pool["dropped"]:
            rows.append(["servers dropped", ", ".join(pool["dropped"])])
        rows.append(["requests sent to another server", pool["resent"]])
    print_fields(rows, title="summary")
    print_wrapped(Ledger.from_json(summary["cost"]).line())
    if still:
        print_wrapped(summary_line(summary["evidence"], ("full", "reduced")))
