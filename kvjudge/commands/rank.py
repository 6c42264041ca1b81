"""`kvjudge rank`: agents ranked from pairwise verdicts (Bradley–Terry, bootstrap 95 % intervals).

    kvjudge rank [--task TASK | --pairs FILE] [--verdicts FILE] [--png PATH] [--json]

By default every same-task pair of runs by two different agents is judged (cached judgments are reused);
``--verdicts FILE`` ranks the JSON lines a ``kvjudge judge --json`` wrote instead, without a model.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from kvjudge.commands._args import READS_TIERED, command, jsonl_objects, target_from
from kvjudge.commands._judging import add_judge_args, job_summary, judged, opened_judge, select_pairs, spent
from kvjudge.commands._output import emit, info, print_table, print_wrapped
from kvjudge.errors import UsageError
from kvjudge.judge.ledger import Ledger
from kvjudge.judge.ranking import BOOTSTRAP, agent_of, plot_ranking, rank
from kvjudge.retention.store import RunListing

DEFAULT_PNG = "kvjudge-rank.png"


def register(subparsers: argparse._SubParsersAction) -> None:
    with command(subparsers, "rank", _rank, shared=READS_TIERED,
                 help="rank agents from pairwise verdicts (Bradley-Terry strengths with bootstrap "
                      "intervals)") as parser:
        add_judge_args(parser)
        parser.add_argument("--verdicts", metavar="FILE", help="rank the verdicts in this JSONL file (kvjudge judge "
                                                               "--json output) instead of judging")
        parser.add_argument("--bootstrap", type=int, default=BOOTSTRAP, metavar="N",
                            help=f"bootstrap resamples for the intervals (default {BOOTSTRAP})")
        parser.add_argument("--png", metavar="PATH", default=DEFAULT_PNG,
                            help=f"strengths with intervals (default ./{DEFAULT_PNG})")


def _verdicts_from_file(path: str) -> list[Any]:
    verdicts = []
    for number, item in jsonl_objects(path, "verdicts file", "verdicts (`kvjudge judge ... --json > FILE`)"):
        if "summary" in item:
            continue
        if not all(isinstance(item.get(k), str) for k in ("a", "b", "outcome")):
            raise UsageError(f"{Path(path)}:{number}: a verdict needs string fields \"a\", \"b\" and \"outcome\"")
        verdicts.append(SimpleNamespace(a=item["a"], b=item["b"], outcome=item["outcome"]))
    if not verdicts:
        raise UsageError(f"verdicts file {path} holds no verdicts")
    return verdicts


def _rank(args: argparse.Namespace) -> int:
    """Turn verdicts between runs of different agents on the same task into a ranking of agents: Bradley-Terry
    strengths (ties as half-wins) with bootstrap 95 % intervals over pairs, win/tie/loss counts and coverage. An
    agent is the run's agent field, else the run-id prefix before '/', else the tenant."""
    if args.bootstrap < 1:
        raise UsageError(f"--bootstrap must be at least 1, got {args.bootstrap}")
    target = target_from(args)
    with target.open_store() as store:
        agents: dict[str, str] = {}
        chosen: Mapping[str, RunListing] = {}  # the runs read to select the pairs

        def agent(run_id: str) -> str:
            if run_id not in agents:
                agents[run_id] = agent_of(chosen[run_id] if run_id in chosen else store.runs.run(run_id))
            return agents[run_id]

        if args.verdicts is not None:
            if args.runs or args.pairs or args.task:
                raise UsageError("--verdicts ranks a file of verdicts; do not name pairs as well")
            verdicts = _verdicts_from_file(args.verdicts)
        else:
            selection = select_pairs(args, store.runs, default_all=True, keep=lambda a, b: agent_of(a) != agent_of(b))
            chosen = selection.runs
            with opened_judge(args, target, store=store) as judge:
                verdicts = judged(judge, store, selection)
        ranking = rank(verdicts, agent, bootstrap=args.bootstrap)
        if args.verdicts is None:
            ranking["pairing"] = selection.to_json()
            ranking["cost"] = spent(judge).to_json()
            ranking["job"] = job_summary(judge.sharing)
    if ranking["agents"]:
        png = Path(args.png)
        plot_ranking(ranking, png)
        ranking["png"] = str(png)
        info(f"ranking plot: {png}")
    emit(args, ranking, lambda: _print(ranking))
    return 0


def _print(ranking: dict[str, Any]) -> None:
    if "cost" in ranking:
        print_wrapped(Ledger.from_json(ranking["cost"]).line())
    if not ranking["agents"]:
        print_wrapped(ranking["note"])
        return
    rows = [[r["rank"], r["agent"], f"{r['strength']:+.2f}",
             "-" if r["ci95"] is None else f"[{r['ci95'][0]:+.2f}, {r['ci95'][1]:+.2f}]",
             f"{r['wins']}/{r['ties']}/{r['losses']}", "-" if r["coverage"] is None else f"{r['coverage']:.2f}"]
            for r in ranking["agents"]]
    print_table(["rank", "agent", "strength", "95 % interval", "W/T/L", "coverage"], rows,
                title=f"Bradley-Terry from {ranking['games']} games ({ranking['bootstrap']} bootstrap resamples)")
