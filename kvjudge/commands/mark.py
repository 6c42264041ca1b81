"""`kvjudge mark RUN STATE`: one lifecycle step."""

from __future__ import annotations

import argparse

from kvjudge.commands._args import add_store_args, command, target_from
from kvjudge.commands._output import emit
from kvjudge.retention.lifecycle import STATES


def register(subparsers: argparse._SubParsersAction) -> None:
    with command(subparsers, "mark", _mark, shared=(add_store_args,),
                 help="move a run along its lifecycle (running → grading → graded | ungraded → "
                      "archived)") as parser:
        parser.add_argument("run", help="run id")
        parser.add_argument("state", choices=STATES, help="the state to move to")


def _mark(args: argparse.Namespace) -> int:
    target = target_from(args)
    with target.open_store() as store:
        store.events.mark(args.run, args.state)
        state = store.runs.run(args.run)
    payload = {"run": state.id, "state": state.state, "lifecycle": list(state.lifecycle)}
    emit(args, payload, lambda: print(f"{state.id}: {' → '.join(state.lifecycle)}"))
    return 0
