"""`kvjudge ingest FILE`: import runs into the store."""

from __future__ import annotations

import argparse

from kvjudge.commands._common import add_output_args, add_store_args, config_from, emit, open_store, progress
from kvjudge.retention.ingest import FORMATS
from kvjudge.retention.text_check import describe_repair


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("ingest", help="import runs from a JSONL file (native or OpenAI chat format)")
    parser.add_argument("file", help="JSONL file, one run per line")
    parser.add_argument("--tenant", metavar="NAME", help="tenant for runs that name none (default: default)")
    parser.add_argument("--format", choices=FORMATS, help="file format (default: detected from the first line)")
    parser.add_argument("--repair-text", action="store_true",
                        help="store text that is not valid Unicode (lone surrogates, bytes not UTF-8) with U+FFFD "
                             "in place of each bad code unit, and note it on the run (default: refuse the file)")
    add_store_args(parser)
    add_output_args(parser)
    parser.set_defaults(func=_ingest)


def _ingest(args: argparse.Namespace) -> int:
    config = config_from(args)
    with open_store(args, config) as store, progress("ingesting", None) as advance:
        ids = store.ingest_file(args.file, tenant=args.tenant, fmt=args.format, progress=advance,
                                repair_text=args.repair_text)
        repaired = {run_id: store.run(run_id).text_repairs for run_id in ids}
    payload = {"store": str(store.path), "ingested": ids, "count": len(ids),
               "repaired": {run_id: [dict(note) for note in notes] for run_id, notes in repaired.items() if notes}}

    def human() -> None:
        print(f"ingested {len(ids)} run(s) into {store.path}")
        for run_id, notes in payload["repaired"].items():
            for note in notes:
                print(f"repaired {run_id}: {describe_repair(note)}")

    emit(args, payload, human)
    return 0
