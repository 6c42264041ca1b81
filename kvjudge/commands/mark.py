"""`kvjudge mark RUN STATE`: one lifecycle step."""

from __future__ import annotations

import argparse

from kvjudge.commands._common import add_output_args, add_store_args, config_from, emit, open_store
from kvjudge.retention.lifecycle import STATES


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("mark", help="move a run along its lifecycle (running → grading → graded | "
                                                "ungraded → archived)")
    parser.add_argument("run", help="run id")
    parser.add_argument("state", choices=STATES, help="the state to move to")
    add_store_args(parser)
    add_output_args(parser)
    parser.set_defaults(func=_mark)


def _mark(args: argparse.Namespace) -> int:
    config = config_from(args)
    with open_store(args, config) as store:
        state = store.mark(args.run, args.state)
    payload = {"run": state.id, "state": state.state, "lifecycle": list(state.lifecycle)}
    emit(args, payload, lambda: print(f"{state.id}: {' → '.join(state.lifecycle)}"))
    return 0
