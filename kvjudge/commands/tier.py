"""`kvjudge tier RUN | --all`: move the bodies of terminal runs to cold storage."""

from __future__ import annotations

import argparse
from typing import Any

from kvjudge.commands._common import (
    add_endpoint_args,
    add_output_args,
    add_store_args,
    cold_stores,
    config_from,
    emit,
    info,
    megabytes,
    open_store,
    print_table,
    progress,
)
from kvjudge.errors import UsageError
from kvjudge.retention.tiering import local_body_bytes, plan_all, recover, resolve_target, tier_run


def register(subparsers: argparse._SubParsersAction) -> None:
    tier = subparsers.add_parser(
        "tier", help="move the bodies of terminal runs to cold storage (a directory or S3)",
        description="Move the local bodies of graded/ungraded/archived runs to a cold store: upload, write the "
                    "manifest last, read back and check, record Tiered, then delete the local copies. "
                    "Idempotent; a crashed move is finished first. Reading a tiered run fetches its bodies.")
    tier.add_argument("run", nargs="?", metavar="RUN", help="run id to tier")
    tier.add_argument("--all", action="store_true", help="every eligible run not tiered yet")
    tier.add_argument("--to", metavar="URL",
                      help="cold store: file:///path or s3://bucket/prefix (default: [retention] cold, else a "
                           "'cold' directory in the data dir)")
    tier.add_argument("--verify-remote", action="store_true",
                      help="re-hash every uploaded body by downloading it (default: sizes and stored checksums)")
    add_store_args(tier)
    add_endpoint_args(tier)
    add_output_args(tier)
    tier.set_defaults(func=_tier)


def _tier(args: argparse.Namespace) -> int:
    if bool(args.run) == bool(args.all):
        raise UsageError("name one RUN or pass --all (not both)")
    config = config_from(args)
    stores = cold_stores(args, config)
    cold = stores.get(resolve_target(config, args.to))
    results: list[dict[str, Any]] = []
    skipped: dict[str, str] = {}
    with open_store(args, config, read_tiered=False) as store:
        # Recovery first: a move a crash left half done is finished before anything new starts.
        results.extend(r.to_dict() for r in recover(store, stores))
        finished = {r["run"] for r in results}
        if args.all:
            plan = plan_all(store)
            run_ids, skipped = plan.runs, plan.skipped
        else:
            run_ids = [args.run]
        for run_id in run_ids:
            if run_id in finished and store.run(run_id).tier["status"] == "tiered":
                continue
            total = local_body_bytes(store, run_id) if store.has_run(run_id) else None
            with progress(f"tiering {run_id}", total) as advance:
                result = tier_run(store, run_id, cold, stores=stores, verify_remote=args.verify_remote,
                                  progress=lambda n: advance(n))
            results.append(result.to_dict())
    payload = {"target": cold.url, "endpoint": cold.endpoint_url, "runs": results, "skipped": skipped}

    def human() -> None:
        if results:
            print_table(["run", "status", "bodies", "MB", "uploaded", "deleted", "recovered", "target"],
                        [[r["run"], r["status"], r["refs"], megabytes(r["bytes"]), r["uploaded"], r["deleted"],
                          r["recovered"] or "", r["target"]] for r in results])
        else:
            info("no run to tier")
        for run_id, reason in skipped.items():
            info(f"skipped {run_id}: {reason}")

    emit(args, payload, human)
    return 0
