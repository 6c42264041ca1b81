"""`kvjudge runs`: list the runs in the store, by agent, task and state."""

from __future__ import annotations

import argparse
from typing import Any

from kvjudge.commands._args import add_store_args, command, target_from
from kvjudge.commands._output import Column, emit, info, print_table, progress
from kvjudge.errors import KvjudgeError
from kvjudge.retention.lifecycle import STATES
from kvjudge.retention.stored_tokens import count_ahead
from kvjudge.retention.state import best_grade
from kvjudge.retention.store import RunListing, Store
from kvjudge.target import JudgeTarget
from kvjudge.tokens import TokenCounter


def register(subparsers: argparse._SubParsersAction) -> None:
    with command(subparsers, "runs", _runs, shared=(add_store_args,),
                 help="list the runs in the store (agent, task, trial, state, grade)") as parser:
        parser.add_argument("--tenant", metavar="NAME", help="only this tenant's runs")
        parser.add_argument("--agent", metavar="NAME", help="only this agent's runs (the agent column)")
        parser.add_argument("--task", metavar="TASK", help="only runs on this task id")
        parser.add_argument("--state", choices=STATES, help="only runs in this lifecycle state")
        parser.add_argument("--count", action="store_true",
                            help="count the tokens of runs not counted yet with the judge's counter ([retention] "
                                 "counter; by default the listing shows the counts the store already has)")


def _run_row(run: RunListing) -> dict[str, Any]:
    return {"id": run.id, "tenant": run.tenant, "agent": run.agent, "task": run.task_id, "trial": run.trial,
            "state": run.state, "grade": best_grade(run), "grades": list(run.grades), "tokens": run.tokens,
            "reduced": run.reduced, "branches": run.branches, "transitions": run.transitions, "bodies": run.bodies,
            "bodies_reduced_or_dropped": run.bodies_gone, "bodies_tiered": run.bodies_tiered}


def _count(store: Store, run_ids: list[str], counter: TokenCounter) -> None:
    """Count (and store) what each run shows that was never counted; each run's bodies in one batch."""
    with progress("counting", len(run_ids)) as advance:
        for run_id in run_ids:
            count_ahead(store, store.runs.run(run_id), counter)
            advance()


def _counter_name(judge: JudgeTarget) -> str | None:
    """The name the judge's counts are stored under; a judge out of reach only hides the tokens of a listing."""
    try:
        return judge.counter_name()
    except KvjudgeError as exc:
        info(f"tokens not shown: {exc}")
        return None


def _runs(args: argparse.Namespace) -> int:
    judge = target_from(args)
    # The agent column falls back to the run-id prefix or the tenant (as rank groups runs): filtered on what it shows.
    filters = {"tenant": args.tenant, "task": args.task, "state": args.state, "agent": args.agent}
    with judge.open_store() as store:
        run_ids = store.runs.run_ids(**filters)
        name: str | None = None
        if run_ids and args.count:
            counter = judge.counter()
            _count(store, run_ids, counter)
            name = counter.name
        elif run_ids:
            # Only what the store already holds, under the counter's name: a listing never waits for a tokenizer.
            name = _counter_name(judge)
        rows = [_run_row(run) for run in store.runs.listing(**filters, counter=name)]
    uncounted = sum(row["tokens"] is None for row in rows)
    if uncounted and name is not None:
        info(f"{uncounted} of {len(rows)} run(s) not counted yet with {name} (tokens "
             f"shown as -): `kvjudge runs --count` counts them, and so does `kvjudge reduce`")
    emit(args, rows, lambda: _table(rows, name))
    return 0


def _grade_cell(grade: dict[str, Any] | None) -> str:
    if grade is None:
        return "-"
    label = grade.get("label")
    return f"{label} ({grade.get('score')})" if label else str(grade.get("score"))


# When the table is too wide, what goes first: the agent and the trial (a run id of a harness's run spells both),
# then the tenant and the task; the run id, its state, grade, tokens and whether it was reduced stay longest.
_COLUMNS = {"run": Column("run", 0), "agent": Column("agent", 8), "task": Column("task", 6),
            "trial": Column("trial", 7), "tenant": Column("tenant", 5), "state": Column("state", 1),
            "grade": Column("grade", 2), "tokens": Column("tokens", 3), "reduced": Column("reduced", 4)}


def _table(rows: list[dict[str, Any]], counter: str | None) -> None:
    names = ["run", "agent", "task"]
    trials = any(r["trial"] is not None for r in rows)
    tenants = len({r["tenant"] for r in rows}) > 1
    names += ["trial"] * trials + ["tenant"] * tenants + ["state", "grade", "tokens", "reduced"]
    table = [[r["id"], r["agent"], r["task"], *([r["trial"]] * trials), *([r["tenant"]] * tenants), r["state"],
              _grade_cell(r["grade"]), "-" if r["tokens"] is None else r["tokens"], "yes" if r["reduced"] else "no"]
             for r in rows]
    # print_table never cuts a cell: run ids, agents and tasks are what users copy into the next command.
    print_table([_COLUMNS[name] for name in names], table,
                title=f"{len(rows)} run(s)" + (f" ({counter})" if counter else ""))
