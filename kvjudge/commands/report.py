"""`kvjudge report`: one HTML page that shows how the judge did and why (and a page per pair beside it).

    kvjudge report [--out PATH] [--task TASK | --pairs FILE | RUN_A RUN_B] [--trials matched|all] [--bootstrap N]
                   [--select tournament|all-pairs] [--protocol letter|pairwise-scale|pointwise] (+ the judge options)

With ``--protocol pointwise`` the pairs are judged by its pairwise counterpart (``pairwise-scale``: the same scale,
rubric and K) and every run of the report is also scored by the pointwise critic (scores cached per run), so the
index shows the critic's figures: ROC AUC with its interval, Brier, ECE and the reliability diagram, per criterion
AUC. Every same-task pair of the store by default (as ``eval``); verdicts come from the judgment cache where they are
there, and only the rest is judged. See :mod:`kvjudge.report` for what the page shows.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any

from kvjudge.commands._args import READS_TIERED, command, target_from
from kvjudge.commands._judging import add_judge_args, judged, opened_judge, select_pairs, spent
from kvjudge.commands._output import emit, print_wrapped, progress
from kvjudge.errors import UsageError
from kvjudge.judge.best_of_n import best_of_n, candidates_of
from kvjudge.judge.critic_eval import score_figures
from kvjudge.judge.evaluate import grade_score
from kvjudge.judge.ledger import Ledger
from kvjudge.judge.pairing import PairSelection
from kvjudge.judge.pointwise import score_runs
from kvjudge.judge.protocols import PROTOCOLS, PairwiseScaleProtocol
from kvjudge.judge.ranking import BOOTSTRAP
from kvjudge.judge.select import PAIRWISE
from kvjudge.report import build_report, check_output, write_report

DEFAULT_OUT = "kvjudge-report.html"
PAIRWISE_SCALE = PairwiseScaleProtocol.name  # how the pairs are judged beside a pointwise critic


def register(subparsers: argparse._SubParsersAction) -> None:
    with command(subparsers, "report", _report, shared=READS_TIERED,
                 help="write an HTML report: is the judge right, the agents' ranking, every pair with the views the "
                      "judge read") as parser:
        add_judge_args(parser, kinds=("pairwise", "pointwise"))
        parser.add_argument("--out", metavar="PATH", default=DEFAULT_OUT,
                            help=f"the report's HTML file; pair pages go to a folder beside it, named after it with "
                                 f"-pairs (default ./{DEFAULT_OUT})")
        parser.add_argument("--bootstrap", type=int, default=BOOTSTRAP, metavar="N",
                            help=f"bootstrap resamples for the ranking's intervals (default {BOOTSTRAP})")
        parser.add_argument("--ceiling", type=int, metavar="N", help="the configured ceiling the header shows, "
                                                                     "lowered to N tokens (as for kvjudge reduce)")
        parser.add_argument("--capabilities", metavar="FILE", help="capability cache file the header's ceiling is "
                                                                   "read from (default: in the cache dir)")
        parser.add_argument("--select", choices=PAIRWISE, metavar="STRATEGY",
                            help="add a best-of-N section: one run picked per task by this strategy (tournament or "
                                 "all-pairs), as kvjudge select")


def _report(args: argparse.Namespace) -> int:
    """Judge every same-task pair (or the pairs named; cached verdicts are reused) and write a self-contained HTML
    report: the judge's figures against held-out grades beside the baselines (as eval), the agents' ranking (as
    rank), a sortable and filterable table of pairs, and a page per pair with both views exactly as the judge read
    them."""
    if args.bootstrap < 1:
        raise UsageError(f"--bootstrap must be at least 1, got {args.bootstrap}")
    out = check_output(Path(args.out))
    target = target_from(args, ceiling=args.ceiling)
    critic = args.protocol is not None and PROTOCOLS[args.protocol].kind == "pointwise"
    pairwise = PAIRWISE_SCALE if critic else args.protocol
    with target.open_store() as store:
        selection = select_pairs(args, store.runs, default_all=True)
        with opened_judge(args, target, protocol=pairwise, store=store) as judge:
            verdicts = judged(judge, store, selection)
            # The ceiling as `kvjudge reduce` computes it, or no figures and the reason (no probe figure yet).
            ceilings, note = target.ceilings({store.runs.run(run_id).tenant for pair in selection.pairs for run_id in pair})
            report = build_report(store, judge, verdicts, ceilings=ceilings, ceiling_note=note,
                                  bootstrap=args.bootstrap, pairing=selection.describe())
            if args.select is not None:
                candidates = candidates_of(store, task=args.task, use_cache=not args.no_cache)
                picked = best_of_n(store, judge, candidates, args.select,
                                   judge_pairs=lambda pairs: judged(judge, store, PairSelection(list(pairs), "named"),
                                                                    "best of N"))
                report = dataclasses.replace(report, selection=picked)
            if critic:
                report = dataclasses.replace(report, critic=_critic(args, target, judge, store, report))
    written = write_report(report, out)
    cached = sum(v.cached for v in verdicts)
    payload = {**written.to_json(), "pairing": selection.to_json(), "pairs": len(verdicts), "cached": cached,
               "judged": len(verdicts) - cached, "conclusion": report.evaluation["conclusion"],
               "cost": spent(judge).to_json()}
    emit(args, payload, lambda: _print(payload))
    return 0


def _critic(args: argparse.Namespace, target: Any, judge: Any, store: Any, report: Any) -> dict[str, Any]:
    """The pointwise critic's figures over the report's runs (:func:`~kvjudge.judge.critic_eval.score_figures`):
    the judge's backend asked with the pointwise protocol, each run scored once (or read from the score cache)."""
    scorer = dataclasses.replace(judge, protocol=target.protocol(args.protocol), _framing_tokens=None)
    run_ids = [run.id for run in report.runs]
    with progress("scoring the runs", len(run_ids) * scorer.protocol.calls) as advance:
        scores = score_runs(scorer, store, run_ids, on_call=advance)
    figures = score_figures(scores, {run.id: grade_score(store.runs.run(run.id)) for run in report.runs})
    return {**figures, "manifest": scorer.manifest()}


def _print(payload: dict[str, Any]) -> None:
    print_wrapped(payload["conclusion"])
    print_wrapped(Ledger.from_json(payload["cost"]).line())
    print_wrapped(f"report: {payload['index']} ({payload['index_bytes'] / 1e3:.0f} kB)")
    print_wrapped(f"pairs: {payload['pair_dir']}/ ({payload['pair_pages']} pages, "
                  f"{payload['pair_bytes_total'] / 1e3:.0f} kB; {payload['cached']} of {payload['pairs']} verdicts "
                  f"from the cache)")
