"""`kvjudge store copy SRC DST`: move a store (a laptop's SQLite file into a lab's PostgreSQL, and back)."""

from __future__ import annotations

import argparse
from pathlib import Path

from kvjudge.commands._args import add_endpoint_args, command, target_from
from kvjudge.commands._output import emit, info, megabytes, print_fields, progress
from kvjudge.errors import UsageError
from kvjudge.retention.store_copy import copy_store

#: The schemes a store location may have besides a plain path.
URL_SCHEMES = ("postgresql", "postgres")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("store", help="move a store: its log, bodies and caches into another store")
    actions = parser.add_subparsers(dest="store_action", metavar="ACTION", required=True)
    with command(actions, "copy", _copy, shared=(add_endpoint_args,),
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
    source, destination = _location(args.source, "SRC"), _location(args.destination, "DST")
    if source == destination:
        raise UsageError(f"SRC and DST are the same store ({_shown(args.source)}); name another DST")
    target = target_from(args)
    with target.open_store(args.source) as src, \
            target.open_store(args.destination, read_tiered=False, create=True) as dst, \
            progress("copying runs", None) as advance:
        report = copy_store(src, dst, progress=lambda done, total: advance(1, total=total))
    payload = {"source": _shown(args.source), "destination": _shown(args.destination), **report.to_dict()}

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


def _location(text: str, name: str) -> str:
    """A store location as compared: a URL as given, a path resolved. A URL of another scheme is refused."""
    scheme, separator, _ = text.partition("://")
    if separator:
        if scheme.lower() not in URL_SCHEMES:
            raise UsageError(f"{name} {_shown(text)} has the unknown scheme {scheme!r}; pass a store file's path or a "
                             f"postgresql:// URL")
        return text
    return str(Path(text).expanduser().resolve())


def _shown(location: str) -> str:
    """``location`` fit to print: a URL's password never is."""
    scheme, separator, rest = location.partition("://")
    userinfo, at, host = rest.rpartition("@")
    if separator and at and ":" in userinfo:
        return f"{scheme}://{userinfo.split(':', 1)[0]}:***@{host}"
    return location
