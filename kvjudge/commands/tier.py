"""`kvjudge tier RUN | --all`: move the bodies of terminal runs that are within their ceiling to cold storage.

Reduce runs to their ceiling, then move them. A run above its effective ceiling (the
same one `kvjudge reduce` targets) is not moved: one line names `kvjudge reduce RUN`, and the command exits 1.
`--unreduced` moves such runs anyway (raw archives); their log records it.
"""

from __future__ import annotations

import argparse

from kvjudge.commands._args import (READS_TIERED, add_ceiling_args, add_lease_args, command, records_settings,
                                   target_from)
from kvjudge.commands._output import emit, info, megabytes, print_table, progress
from kvjudge.errors import CapabilityMissing, UsageError
from kvjudge.budget.estimation import DEFAULT_CHARS_PER_TOKEN
from kvjudge.retention.shared_job import Sharing
from kvjudge.retention.tiering import tier_requested
from kvjudge.target import JudgeTarget
from kvjudge.tokens import CharsPerToken, TokenCounter


def register(subparsers: argparse._SubParsersAction) -> None:
    with command(subparsers, "tier", _tier, shared=(add_ceiling_args, *READS_TIERED),
                 help="move the bodies of terminal runs within their ceiling to cold storage (a directory or "
                      "S3)") as tier:
        tier.add_argument("run", nargs="?", metavar="RUN", help="run id to tier")
        tier.add_argument("--all", action="store_true", help="every eligible run not tiered yet")
        tier.add_argument("--to", metavar="URL",
                          help="cold store: file:///path or s3://bucket/prefix (default: [retention] cold, else a "
                               "'cold' directory in the data dir)")
        records_settings(tier, "to")
        tier.add_argument("--unreduced", action="store_true",
                          help="also move runs above their ceiling (raw archives); the log records it")
        tier.add_argument("--verify-remote", action="store_true",
                          help="re-hash every uploaded body by downloading it (default: sizes and stored checksums)")
        add_lease_args(tier)


def _tier(args: argparse.Namespace) -> int:
    """Move the local bodies of graded/ungraded/archived runs that are within their effective ceiling
    (min(configured, max_context_tokens // 2), as `kvjudge reduce` targets) to a cold store: upload, write the
    manifest last, read back and check, record Tiered, then delete the local copies. Idempotent; a crashed move is
    finished first. Reading a tiered run fetches its bodies. Exits 1 when a run above its ceiling was left behind.
    Several started on one store share the job: each claims a run before moving it (--lease)."""
    if bool(args.run) == bool(args.all):
        raise UsageError("name one RUN or pass --all (not both)")
    judge = target_from(args, ceiling=args.ceiling)
    stores = judge.cold_stores()
    cold = stores.get(judge.cold_target())
    with judge.open_store(read_tiered=False) as store, progress("tiering", None) as advance:
        sharing = Sharing(store.claims, judge.settings.store.lease_seconds)
        outcome = tier_requested(store, cold, stores, run_id=args.run, sharing=sharing,
                                 ceiling=lambda tenant: _ceiling(judge, tenant, args.unreduced),
                                 counter=lambda: _counter(judge, args.unreduced), unreduced=args.unreduced,
                                 verify_remote=args.verify_remote,
                                 progress=lambda landed, total: advance(landed, total=total))
        job = sharing.summary()
    payload = {**outcome.to_dict(), "job": job}
    results = payload["runs"]
    left = [r for r in results if r["status"] == "above_ceiling"]

    def human() -> None:
        shown = [r for r in results if r["status"] != "above_ceiling"]
        targets = {r["target"] for r in shown}
        if shown:
            # One cold store for every run (the usual case): named once above the table, not in every row.
            one = len(targets) == 1
            print_table(["run", "status", "bodies", "MB", "uploaded", "deleted", "recovered"] + ["target"] * (not one),
                        [[r["run"], r["status"], r["refs"], megabytes(r["bytes"]), r["uploaded"], r["deleted"],
                          r["recovered"] or "", *[r["target"]] * (not one)] for r in shown],
                        title=f"to {next(iter(targets))}" if one else None)
        elif not left:
            info("no run to tier")
        for run_id, reason in outcome.skipped.items():
            info(f"skipped {run_id}: {reason}")

    emit(args, payload, human)
    for r in results:
        if r["unreduced"]:
            ceiling = r["unreduced"]["ceiling"]
            info(f"run {r['run']}: moved unreduced as asked ({r['unreduced']['tokens']} tokens, ceiling "
                 f"{'unknown' if ceiling is None else ceiling}); its log records it")
    # Stderr names every run left behind, --json or not (the exit code says there is one).
    for r in left:
        info(f"run {r['run']}: {r['tokens']} tokens, above its ceiling {r['ceiling']}; not moved — run "
             f"`kvjudge reduce {r['run']}` first (or `kvjudge tier {r['run']} --unreduced` to move it as it is)")
    return 1 if left else 0


def _ceiling(judge: JudgeTarget, tenant: str, unreduced: bool) -> int | None:
    """The tenant's effective ceiling; with ``--unreduced`` a missing probe figure is no reason to stop."""
    try:
        return judge.ceiling(tenant).effective
    except CapabilityMissing:
        if unreduced:
            return None
        raise


def _counter(judge: JudgeTarget, unreduced: bool) -> TokenCounter:
    """The judge's counter; with ``--unreduced`` a judge nobody can reach counts chars/4 (the log names it)."""
    try:
        return judge.counter()
    except CapabilityMissing as exc:
        if not unreduced:
            raise
        info(f"{exc}; the sizes recorded for runs moved unreduced are counted as chars/4")
        return CharsPerToken(DEFAULT_CHARS_PER_TOKEN)
