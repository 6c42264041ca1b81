"""`kvjudge rehydrate RUN`: bring a tiered run's bodies back into the local store."""

from __future__ import annotations

import argparse

from kvjudge.commands._args import READS_TIERED, command, target_from
from kvjudge.commands._output import emit, megabytes, print_table, progress
from kvjudge.retention.tiering import rehydrate_run


def register(subparsers: argparse._SubParsersAction) -> None:
    with command(subparsers, "rehydrate", _rehydrate, shared=READS_TIERED,
                 help="bring a tiered run's bodies back into the local store") as parser:
        parser.add_argument("run", metavar="RUN", help="run id to rehydrate")


def _rehydrate(args: argparse.Namespace) -> int:
    """Fetch the bodies of a tiered run from its cold store (checked against their refs), put them back locally and
    record Rehydrated. The cold copies stay."""
    target = target_from(args)
    with target.open_store(read_tiered=False) as store:
        tiered = sum(1 for loc in store.runs.run(args.run).bodies.values() if loc.status == "tiered")
        with progress(f"rehydrating {args.run}", tiered) as advance:
            result = rehydrate_run(store, args.run, target.cold_stores(), progress=lambda n: advance(n))
    payload = result.to_dict()

    def human() -> None:
        source = (result.target or "") + (f" at {result.endpoint}" if result.endpoint else "")
        print_table(["run", "status", "bodies", "MB", "from"],
                    [[result.run, result.status, result.refs, megabytes(result.bytes), source]])

    emit(args, payload, human)
    return 0
