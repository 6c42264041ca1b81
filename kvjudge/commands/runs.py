"""`kvjudge runs`: list the runs in the store, by agent, task and state."""

from __future__ import annotations

import argparse
from typing import Any

from kvjudge.commands._common import (
    add_output_args,
    add_store_args,
    config_from,
    counter_for,
    emit,
    open_store,
    print_table,
    progress,
)
from kvjudge.judge.evaluate import best_grade
from kvjudge.judge.ranking import agent_of
from kvjudge.retention.lifecycle import STATES
from kvjudge.retention.reduce import run_tokens
from kvjudge.retention.state import DROPPED, REDUCED, TIERED, RunState
from kvjudge.retention.store import Store
from kvjudge.tokens import TokenCounter


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("runs", help="list the runs in the store (agent, task, trial, state, grade)")
    parser.add_argument("--tenant", metavar="NAME", help="only this tenant's runs")
    parser.add_argument("--agent", metavar="NAME", help="only this agent's runs (the agent column)")
    parser.add_argument("--task", metavar="TASK", help="only runs on this task id")
    parser.add_argument("--state", choices=STATES, help="only runs in this lifecycle state")
    add_store_args(parser)
    add_output_args(parser)
    parser.set_defaults(func=_runs)


def _run_row(store: Store, state: RunState, counter: TokenCounter) -> dict[str, Any]:
    gone = sum(1 for loc in state.bodies.values() if loc.status in (REDUCED, DROPPED))
    return {"id": state.id, "tenant": state.tenant, "agent": agent_of(state), "task": state.task_id,
            "trial": state.trial, "state": state.state, "grade": best_grade(state), "grades": list(state.grades),
            "tokens": run_tokens(store, state, counter), "reduced": state.reduced, "branches": len(state.branches),
            "transitions": sum(len(b.transitions) for b in state.branches), "bodies": len(state.bodies),
            "bodies_reduced_or_dropped": gone,
            "bodies_tiered": sum(1 for loc in state.bodies.values() if loc.status == TIERED)}


def _runs(args: argparse.Namespace) -> int:
    config = config_from(args)
    filters = {"tenant": args.tenant, "task": args.task, "state": args.state}
    with open_store(args, config) as store:
        ids = store.run_ids(**filters)
        counter = counter_for(args, config) if ids else None
        rows = []
        with progress("counting", len(ids)) as advance:
            for run_id in ids:
                state = store.run(run_id)
                # The agent column falls back to the run-id prefix or the tenant (as rank groups runs): filtered
                # here, on what the column shows.
                if args.agent is None or agent_of(state) == args.agent:
                    rows.append(_run_row(store, state, counter))
                advance()
    emit(args, rows, lambda: _table(rows, counter))
    return 0


def _grade_cell(grade: dict[str, Any] | None) -> str:
    if grade is None:
        return "-"
    label = grade.get("label")
    return f"{label} ({grade.get('score')})" if label else str(grade.get("score"))


def _table(rows: list[dict[str, Any]], counter: TokenCounter | None) -> None:
    columns = ["run", "agent", "task"]
    trials = any(r["trial"] is not None for r in rows)
    tenants = len({r["tenant"] for r in rows}) > 1
    columns += ["trial"] * trials + ["tenant"] * tenants + ["state", "grade", "tokens", "reduced"]
    table = [[r["id"], r["agent"], r["task"], *([r["trial"]] * trials), *([r["tenant"]] * tenants), r["state"],
              _grade_cell(r["grade"]), r["tokens"], "yes" if r["reduced"] else "no"] for r in rows]
    # print_table never cuts a cell: run ids, agents and tasks are what users copy into the next command.
    print_table(columns, table, title=f"{len(rows)} run(s)" + (f" ({counter.name})" if counter else ""))
