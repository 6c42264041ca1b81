"""`kvjudge select`: best of N — pick the run most likely to pass from each task's runs, and what the pick is worth.

    kvjudge select [--task TASK] [--agent AGENT] [--strategy tournament|all-pairs|pointwise] [--pass-score S]
                   [--picks PATH] [--html PATH] [--protocol P] [--levels G] [--repeats K] [--rubric FILE]
                   (+ the backend options) [--json]

Every task of the store with its runs as candidates (several trials of one agent, or several agents' runs pooled;
:mod:`kvjudge.judge.candidates`), one pick per task by the strategy (:mod:`kvjudge.judge.select`) — the pairwise
strategies with a pairwise protocol's verdicts (``letter``, ``pairwise-scale``), ``pointwise`` with a critic's scores
(cached per run: selecting again costs no model call); the picks go to a JSONL file, one line per task; where
grades exist, the selection table (:mod:`kvjudge.judge.selection_table`).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from kvjudge.atomic import atomic_write
from kvjudge.commands._args import READS_TIERED, command, target_from
from kvjudge.commands._judging import add_backend_args, job_summary, judged, opened_judge, shown
from kvjudge.commands._output import emit, info, print_table, print_wrapped, progress
from kvjudge.errors import UsageError
from kvjudge.judge.best_of_n import best_of_n, candidates_of, check_protocol, protocol_kind
from kvjudge.judge.candidates import DEFAULT_PASS_SCORE
from kvjudge.judge.pairing import PairSelection
from kvjudge.judge.pointwise import score_runs
from kvjudge.judge.protocols import PROTOCOLS
from kvjudge.judge.select import DEFAULT_STRATEGY, POINTWISE, STRATEGIES
from kvjudge.target import JudgeTarget

DEFAULT_PICKS = "kvjudge-picks.jsonl"
SHOWN_PICKS = 20  # the terminal lists each task's pick up to this many tasks (the JSONL file has them all)


def register(subparsers: argparse._SubParsersAction) -> None:
    with command(subparsers, "select", _select, shared=READS_TIERED,
                 help="best of N: pick one run per task with the judge, beside random, first, longest, "
                      "last-exit-0 and oracle picks") as parser:
        parser.add_argument("--task", metavar="TASK", help="only this task (default: every task of the store)")
        add_backend_args(parser, kinds=("pairwise", "pointwise"))
        parser.add_argument("--agent", metavar="AGENT", help="only this agent's runs compete (default: every run "
                                                             "on the task, agents pooled)")
        parser.add_argument("--strategy", choices=STRATEGIES, default=None,
                            help=f"how to pick (default: pointwise with a pointwise --protocol, else "
                                 f"{DEFAULT_STRATEGY}): tournament, a knockout (N-1 comparisons per task); "
                                 f"all-pairs, Bradley-Terry over every pair (N(N-1)/2); pointwise, the best critic "
                                 f"score (N runs scored, each cached)")
        parser.add_argument("--pass-score", type=float, default=DEFAULT_PASS_SCORE, metavar="S",
                            help=f"a run passed when its best held-out grade is at least S (default "
                                 f"{DEFAULT_PASS_SCORE:g})")
        parser.add_argument("--picks", metavar="PATH", default=DEFAULT_PICKS,
                            help=f"the picks as JSONL, one line per task (default ./{DEFAULT_PICKS})")
        parser.add_argument("--html", metavar="PATH", help="also write the best-of-N page (an .html file)")


def _select(args: argparse.Namespace) -> int:
    """For each task, pick one of its runs with the judge: a knockout tournament of pairwise verdicts (N-1
    comparisons), all pairs with Bradley-Terry inside the task, or pointwise scores. A task with one run has nothing
    to choose; ties and errors go to the run earliest in the task's order (trial, then run id). Where grades exist:
    pass@pick with Wilson 95 % intervals beside a random pick (expected), the first run, the longest run, the last
    run whose last test command exited 0, and the oracle; the gap closed; judge readings and tokens per task."""
    picks_path = Path(args.picks)
    if picks_path.is_dir():
        raise UsageError(f"--picks {picks_path} is a directory; name the JSONL file")
    if args.html is not None:
        from kvjudge.report.selection import check_selection_path

        check_selection_path(Path(args.html))
    target = target_from(args)
    strategy, protocol = _strategy_protocol(args, target)
    asks = "run(s) to score" if strategy == POINTWISE else "comparison(s)"
    with target.open_store() as store:
        states: dict[str, Any] = {}
        candidates = candidates_of(store, task=args.task, agent=args.agent, pass_score=args.pass_score,
                                   use_cache=not args.no_cache, states=states)
        with opened_judge(args, target, protocol=protocol, store=store) as judge:
            def scored(run_ids: list[str]) -> list[Any]:
                with progress(f"scoring {len(run_ids)} run(s)", len(run_ids) * judge.protocol.calls) as advance:
                    judge.planner.progress = lambda message: advance(0, description=message)
                    shown(judge, advance, "scoring")
                    return score_runs(judge, store, run_ids, on_call=advance, states=states)

            payload = best_of_n(store, judge, candidates, strategy, pass_score=args.pass_score, states=states,
                                judge_pairs=lambda pairs: judged(judge, store, PairSelection(list(pairs), "named"),
                                                                 f"comparing {len(pairs)} pair(s)", states=states),
                                score=scored, on_round=lambda number, asked: info(f"round {number}: {asked} {asks}"))
            payload["job"] = job_summary(judge.sharing)
    atomic_write(picks_path, "".join(json.dumps(r, sort_keys=True) + "\n" for r in payload["picks"]).encode("utf-8"))
    payload["picks_file"] = str(picks_path)
    info(f"picks: {picks_path}")
    if args.html is not None:
        from kvjudge.report.selection import write_selection

        payload["html"] = str(write_selection(payload, Path(args.html)))
        info(f"best-of-N page: {payload['html']}")
    emit(args, payload, lambda: _print(payload))
    return 0


def _strategy_protocol(args: argparse.Namespace, target: JudgeTarget) -> tuple[str, str]:
    """The strategy and the protocol its judge asks: ``--strategy`` (default pointwise with a pointwise
    ``--protocol``, else the default strategy) and ``--protocol`` (default ``[judge] protocol`` when it is of the
    kind the strategy needs, else the first protocol of that kind); a strategy and protocol that do not fit are a
    one-line error before any judge opens."""
    named = PROTOCOLS[args.protocol].kind if args.protocol is not None else None
    strategy = args.strategy or (POINTWISE if named == "pointwise" else DEFAULT_STRATEGY)
    kind = protocol_kind(strategy)
    configured = target.settings.judge.protocol
    fallback = configured if PROTOCOLS.get(configured) is not None and PROTOCOLS[configured].kind == kind else \
        next(name for name, cls in PROTOCOLS.items() if cls.kind == kind)
    protocol = args.protocol or fallback
    check_protocol(strategy, protocol, PROTOCOLS[protocol].kind)
    return strategy, protocol


def _fmt(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _print(payload: dict[str, Any]) -> None:
    table = payload["table"]
    print_wrapped(payload["rule"])
    if len(payload["picks"]) <= SHOWN_PICKS:
        rows = [[p["task"], p["n"], p["picked"], {True: "passed", False: "failed", None: "-"}[p["passed"]],
                 p["reason"]] for p in payload["picks"]]
        print_table(["task", "N", "picked", "pick", "why"], rows, title="Picks")
    if table["in_table"]:
        rows = [[r["name"], r["tasks"], f"{r['passed']:g}",
                 f"{_fmt(r['rate'], 3)} [{_fmt(r['ci95'][0], 3)}, {_fmt(r['ci95'][1], 3)}]", _fmt(r["gap_closed"])]
                for r in table["rows"]]
        print_table(["pick by", "tasks", "passed", "pass rate [95 %]", "gap closed"], rows,
                    title=f"Best of N ({payload['strategy']}) over {table['in_table']} graded task(s)")
    else:
        print_wrapped("no task with a choice has every run graded: no selection table")
    spent = table["spent"]
    if spent["tasks"]:
        print_wrapped(f"judge readings per task: mean {_fmt(spent['per_task_mean'], 1)}, max {spent['per_task_max']} "
                      f"(bound {spent['bound_max']}), {spent['errors']} error(s); prompt tokens per task "
                      f"{_fmt(spent['tokens_per_task'], 0)}")
    if table["note"]:
        print_wrapped(f"note: {table['note']}")
    print_wrapped(f"picks: {payload['picks_file']}")
