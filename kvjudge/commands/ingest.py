"""`kvjudge ingest FILE`: import runs into the store."""

from __future__ import annotations

import argparse

from kvjudge.commands._common import add_output_args, add_store_args, config_from, emit, open_store, progress
from kvjudge.retention.ingest import FORMATS


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("ingest", help="import runs from a JSONL file (native or OpenAI chat format)")
    parser.add_argument("file", help="JSONL file, one run per line")
    parser.add_argument("--tenant", metavar="NAME", help="tenant for runs that name none (default: default)")
    parser.add_argument("--format", choices=FORMATS, help="file format (default: detected from the first line)")
    add_store_args(parser)
    add_output_args(parser)
    parser.set_defaults(func=_ingest)


def _ingest(args: argparse.Namespace) -> int:
    config = config_from(args)
    with open_store(args, config) as store, progress("ingesting", None) as advance:
        ids = store.ingest_file(args.file, tenant=args.tenant, fmt=args.format, progress=advance)
    payload = {"store": str(store.path), "ingested": ids, "count": len(ids)}
    emit(args, payload, lambda: print(f"ingested {len(ids)} run(s) into {store.path}"))
    return 0
