"""`kvjudge rehydrate RUN`: bring a tiered run's bodies back into the local store."""

from __future__ import annotations

import argparse

from kvjudge.commands._args import add_endpoint_args, add_output_args, add_store_args, target_from
from kvjudge.commands._output import emit, megabytes, print_table, progress
from kvjudge.retention.tiering import rehydrate_run


def register(subparsers: argparse._SubParsersAction) -> None:
    rehydrate = subparsers.add_parser(
        "rehydrate", help="bring a tiered run's bodies back into the local store",
        description="Fetch the bodies of a tiered run from its cold store (checked against their refs), put them "
                    "back locally and record Rehydrated. The cold copies stay.")
    rehydrate.add_argument("run", metavar="RUN", help="run id to rehydrate")
    add_store_args(rehydrate)
    add_endpoint_args(rehydrate)
    add_output_args(rehydrate)
    rehydrate.set_defaults(func=_rehydrate)


def _rehydrate(args: argparse.Namespace) -> int:
    target = target_from(args)
    stores = target.cold_stores(args.endpoint_url)
    with target.open_store(read_tiered=False) as store:
        tiered = sum(1 for loc in store.run(args.run).bodies.values() if loc.status == "tiered")
        with progress(f"rehydrating {args.run}", tiered) as advance:
            result = rehydrate_run(store, args.run, stores, progress=lambda n: advance(n))
    payload = result.to_dict()

    def human() -> None:
        source = (result.target or "") + (f" at {result.endpoint}" if result.endpoint else "")
        print_table(["run", "status", "bodies", "MB", "from"],
                    [[result.run, result.status, result.refs, megabytes(result.bytes), source]])

    emit(args, payload, human)
    return 0
