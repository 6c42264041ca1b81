"""`kvjudge runs`: list the runs in the store."""

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
from kvjudge.retention.reduce import run_tokens
from kvjudge.retention.state import DROPPED, REDUCED, TIERED, RunState
from kvjudge.retention.store import Store
from kvjudge.tokens import TokenCounter


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("runs", help="list the runs in the store")
    parser.add_argument("--tenant", metavar="NAME", help="only this tenant's runs")
    add_store_args(parser)
    add_output_args(parser)
    parser.set_defaults(func=_runs)


def _run_row(store: Store, state: RunState, counter: TokenCounter) -> dict[str, Any]:
    gone = sum(1 for loc in state.bodies.values() if loc.status in (REDUCED, DROPPED))
    return {"id": state.id, "tenant": state.tenant, "state": state.state, "tokens": run_tokens(store, state, counter),
            "reduced": state.reduced, "branches": len(state.branches),
            "transitions": sum(len(b.transitions) for b in state.branches), "bodies": len(state.bodies),
            "bodies_reduced_or_dropped": gone,
            "bodies_tiered": sum(1 for loc in state.bodies.values() if loc.status == TIERED)}


def _runs(args: argparse.Namespace) -> int:
    config = config_from(args)
    with open_store(args, config) as store:
        ids = store.run_ids(args.tenant)
        counter = counter_for(args, config) if ids else None
        rows = []
        with progress("counting", len(ids)) as advance:
            for state in store.iter_runs(args.tenant):
                rows.append(_run_row(store, state, counter))
                advance()
    emit(args, rows, lambda: print_table(
        ("run", "tenant", "state", "tokens", "reduced", "branches", "transitions"),
        [(r["id"], r["tenant"], r["state"], r["tokens"], "yes" if r["reduced"] else "no", r["branches"],
          r["transitions"]) for r in rows], title=f"{len(rows)} run(s)" + (f" ({counter.name})" if counter else "")))
    return 0
