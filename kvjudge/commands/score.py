"""`kvjudge score`: pointwise scores — each run read on its own by a critic, P(success) per criterion and combined.

    kvjudge score [RUN ...] [--task TASK] [--protocol pointwise] [--repeats K] [--levels G] [--rubric FILE]
                  [--model PATH | --server URL ...] [--json]

Without runs named, every run of the store (or of ``--task``) is scored. Scores are cached in the store under what
identifies them (protocol, scale, K, rubric, the run's view): scoring again costs no model call. With ``--json``:
one object per run (its ``cost``: the calls its readings sent), then one ``{"summary": …}`` object (its
``cost``: the calls this process sent; its ``job``: what the job holds, what this process did in it, and the job's
cost, whoever sent the calls). Before the first call, one line says how many calls it is about to send.

Several ``kvjudge score`` started at once on one store share the job: each claims a run before sending its
readings, and each exits 0 with every run's score once the job is done, whoever did it (``--lease``).
"""

from __future__ import annotations

import argparse
from typing import Any

from kvjudge.commands._args import READS_TIERED, command, target_from
from kvjudge.commands._judging import add_backend_args, announce, job_summary, opened_judge, shown, spent
from kvjudge.commands._output import emit, print_table, print_wrapped, progress
from kvjudge.errors import UsageError
from kvjudge.judge.ledger import Ledger
from kvjudge.judge.pointwise import RunScore, score_runs, summarize_scores
from kvjudge.judge.protocols import POINTWISE, PROTOCOLS


def register(subparsers: argparse._SubParsersAction) -> None:
    with command(subparsers, "score", _score, shared=READS_TIERED,
                 help="score runs one at a time with a pointwise critic (P(success) per criterion and combined, "
                      "cached)") as parser:
        parser.add_argument("runs", nargs="*", metavar="RUN", help="run ids (default: every run, or --task's)")
        parser.add_argument("--task", metavar="TASK", help="every run on this task id")
        add_backend_args(parser, kinds=("pointwise",))


def _score(args: argparse.Namespace) -> int:
    """Read each run alone and ask, per criterion of the rubric and K times (each another question variant), for one
    level of a letter scale from A (certainly failed) on; the score is the probability-weighted mean of the levels
    (never a sampled token), per criterion the mean and spread over the repeats, combined the mean of the criteria.
    A reading with too little probability on the scale, an overflow or a failure is an outcome, never a score."""
    if args.runs and args.task is not None:
        raise UsageError("name the runs one way: RUN ... or --task TASK")
    target = target_from(args)
    configured = target.settings.judge.protocol
    protocol = args.protocol or (configured if PROTOCOLS.get(configured, None) is not None
                                 and configured in POINTWISE else POINTWISE[0])
    with target.open_store() as store:
        run_ids = list(args.runs) or store.runs.run_ids(task=args.task)
        if not run_ids:
            raise UsageError("no runs to score: ingest runs, or name them")
        for run_id in args.runs:
            store.runs.run(run_id)  # an unknown run is an error before any model call
        with opened_judge(args, target, protocol=protocol, store=store) as judge:
            with progress("scoring", len(run_ids) * judge.protocol.calls) as advance:
                judge.planner.progress = lambda message: advance(0, description=message)
                shown(judge, advance, "scoring")
                scores = score_runs(judge, store, run_ids, on_call=advance, on_plan=announce(judge, "score"),
                                    on_score=lambda _i, score: emit(args, score.to_json(), lambda: _print_run(score)))
            summary = {**summarize_scores(scores), "manifest": judge.manifest(), "cost": spent(judge).to_json(),
                       "job": job_summary(judge.sharing)}
    emit(args, {"summary": summary}, lambda: _print_summary(summary))
    return 0


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _print_run(score: RunScore) -> None:
    rows: list[list[Any]] = [[name, _fmt(c["mean"]), _fmt(c["spread"]), c["n"]] for name, c in score.criteria.items()]
    rows.append(["combined", _fmt(score.p_success), _fmt(score.spread), len(score.readings)])
    title = f"{score.run_id}: {score.outcome}" + (" (cached)" if score.cached else "")
    if not score.scored:
        print_table(["", "value"], [["error", score.error or "-"]], title=title)
        return
    print_table(["criterion", "P(success)", "spread (sd)", "readings"], rows, title=title)


def _print_summary(summary: dict[str, Any]) -> None:
    outcomes = ", ".join(f"{k} {v}" for k, v in summary["outcomes"].items() if v)
    manifest = summary["manifest"]
    rows = [["runs", summary["runs"]], ["outcomes", outcomes], ["coverage", _fmt(summary["coverage"])],
            ["cached", summary["cached"]], ["mean spread over repeats", _fmt(summary["mean_spread"])],
            ["mean label mass", _fmt(summary["mean_label_mass"])],
            ["protocol", f"{manifest['protocol']} (levels {' '.join(manifest['levels'])}, K {manifest['repeats']}, "
                         f"criteria {', '.join(c['name'] for c in manifest['rubric'])})"]]
    print_table(["", "value"], rows, title="summary")
    print_wrapped(Ledger.from_json(summary["cost"]).line())
