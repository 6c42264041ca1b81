"""`kvjudge verify [RUN]`: re-hash bodies, re-fold from LSN 0, every missing body explained."""

from __future__ import annotations

import argparse

from kvjudge.commands._args import READS_TIERED, command, target_from
from kvjudge.commands._output import emit, info, print_table, print_wrapped, progress
from kvjudge.retention.blobs import short
from kvjudge.retention.tiering import verify_checks
from kvjudge.retention.verify import verify


def register(subparsers: argparse._SubParsersAction) -> None:
    with command(subparsers, "verify", _verify, shared=READS_TIERED,
                 help="re-hash bodies, re-fold runs from LSN 0, check every missing body is explained") as parser:
        parser.add_argument("run", nargs="?", help="only this run (default: the whole store)")
        parser.add_argument("--verify-remote", action="store_true", help="also download and re-hash tiered bodies")


def _verify(args: argparse.Namespace) -> int:
    target = target_from(args)
    with target.open_store() as store:
        # Tiering finishes crashed moves first (recovery), then adds its remote check.
        checks = verify_checks(store, target.cold_stores(), rehash=args.verify_remote)
        if args.run is not None:
            store.runs.run(args.run)  # StoreError for an unknown run
        total = 1 if args.run is not None else len(store.runs.run_ids())
        with progress("verifying", total) as advance:
            report = verify(store, [args.run] if args.run is not None else None, extra_checks=checks,
                            progress=advance)
    payload = report.to_dict()

    def human() -> None:
        shared = f"; {report.shared_bodies} reduced bodies kept for other runs that still read them" \
            if report.shared_bodies else ""
        print_wrapped(f"{'OK' if report.ok else 'VIOLATIONS'}: {report.runs} run(s), {report.blobs_rehashed} "
                      f"bodies re-hashed{shared}")
        if report.violations:
            print_table(("check", "run", "ref", "problem"),
                        [(v.check, v.run or "", short(v.ref) if v.ref else "", v.message) for v in report.violations])
        for note in report.notes:
            info(f"note: {note}")

    emit(args, payload, human)
    return 0 if report.ok else 1
