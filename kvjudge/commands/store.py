"""`kvjudge store copy SRC DST`: move a store (a laptop's SQLite file into a lab's PostgreSQL, and back)."""

from __future__ import annotations

import argparse

from kvjudge.commands._args import command, target_from
from kvjudge.commands._output import emit, info, megabytes, print_fields, progress
from kvjudge.errors import UsageError
from kvjudge.retention.store.location import StoreLocation
from kvjudge.retention.store_copy import copy_store


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("store", help="move a store: its log, bodies and caches into another store")
    actions = parser.add_subparsers(dest="store_action", metavar="ACTION", required=True)
    with command(actions, "copy", _copy,
                 help="copy every run (log, bodies, reductions, tiered locations) and the verdict, score and "
                      "token-count caches into another store") as copy:
        copy.add_argument("source", metavar="SRC", help="the store to copy: a store file's path or a postgresql:// URL")
        copy.add_argument("destination", metavar="DST",
                          help="the store to copy into (created when absent; the runs it holds stay)")


def _copy(args: argparse.Namespace) -> int:
    """Copy every run of the store SRC into the store DST: the log in LSN order (each run's events in one
    transaction at DST, with its bodies), bodies re-hashed, reductions and tiered locations (they are events; a
    tiered body stays in its cold store), and the judge's caches and token counts. Run it again after an interruption:
    runs already at DST with the same events are skipped; a run DST holds with other events is refused, before
    anything is written. Copying into a store that holds other runs keeps them."""
    source, destination = StoreLocation.parse(args.source), StoreLocation.parse(args.destination)
    if _same(source, destination):
        raise UsageError(f"SRC and DST are the same store ({source}); name another DST")
    target = target_from(args)
    with target.open_store(args.source, read_tiered=False) as src, \
            target.open_store(args.destination, read_tiered=False, create=True) as dst, \
            progress("copying runs", None) as advance:
        report = copy_store(src, dst, progress=lambda done, total: advance(1, total=total))
    payload = {"source": source.display, "destination": destination.display, **report.to_dict()}

    def human() -> None:
        print_fields([
            ("runs", f"{report.runs_copied} copied, {report.runs_extended} extended, {report.runs_skipped} skipped "
                     f"(already there)"),
            ("events", str(report.events)),
            ("bodies", f"{report.bodies} ({megabytes(report.bytes)} MB, {megabytes(report.stored_bytes)} MB new "
                       f"there); {report.absent_bodies} reduced, dropped or tiered"),
            ("caches", f"{report.judgments} judgments, {report.counts} token counts"),
            ("time", f"{report.seconds:.1f} s" + (f", {report.mb_per_s} MB/s" if report.mb_per_s else "")),
        ])
    emit(args, payload, human)
    if report.manifests:
        info(f"note: kept {report.manifests} tier manifest(s) at DST (its LSNs differ from SRC's)")
    return 0


def _same(source: StoreLocation, destination: StoreLocation) -> bool:
    """Whether two locations name one store (a file by its resolved path; a URL as shown, without its password)."""
    if source.path is not None and destination.path is not None:
        return source.path.resolve() == destination.path.resolve()
    return source.display == destination.display
