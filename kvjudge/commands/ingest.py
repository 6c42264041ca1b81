"""`kvjudge ingest PATH...`: import runs (files, directories, S3 objects and prefixes) into the store."""

from __future__ import annotations

import argparse
import contextlib
import sys

from kvjudge.commands._args import add_results_args, add_store_args, command, target_from
from kvjudge.commands._output import emit, info, megabytes, progress, unmatched_results_line
from kvjudge.retention.ingest import IngestReport, ingest_sources, registry, staged_inputs, walk
from kvjudge.retention.text_check import describe_repair


def register(subparsers: argparse._SubParsersAction) -> None:
    with command(subparsers, "ingest", _ingest, shared=(add_store_args,),
                 help="import runs in any format kvjudge reads (" + ", ".join(registry.names()[1:]) + "); "
                      "files or directories, .gz read transparently") as parser:
        parser.add_argument("paths", nargs="+", metavar="PATH",
                            help="run file or directory (walked for *.jsonl, *.traj.json, *.traj, each optionally "
                                 ".gz, *.eval and inspect .json logs, ATIF trajectories, Harbor trials: result.json "
                                 "beside agent/, OpenHands llm_completions/<instance_id>/*.json and folders of "
                                 "event-*.json, .json lists of a session's records, YAML with a top-level history "
                                 "(SWE-agent demonstrations), " + ", ".join(registry.walked_names()) + "; the "
                                 "companions beside them read or passed over, with a note), or s3://BUCKET/PREFIX/ "
                                 "(read as a directory) or s3://BUCKET/KEY (one file); --results takes s3:// URLs too")
        parser.add_argument("--endpoint-url", metavar="URL",
                            help="S3 endpoint of s3:// paths and results (default: [retention] endpoint_url, else "
                                 "AWS_ENDPOINT_URL / AWS config); credentials from AWS_* variables, ~/.aws or an "
                                 "instance role")
        parser.add_argument("--format", choices=registry.names(), default=registry.AUTO, metavar="FORMAT",
                            help=registry.help_text())
        parser.add_argument("--tenant", metavar="NAME", help="tenant for runs that name none (default: default)")
        parser.add_argument("--agent", metavar="NAME", help="agent of every run, overriding the model named in the "
                                                            "trajectory (run ids of trajectories are "
                                                            "AGENT/INSTANCE_ID)")
        parser.add_argument("--trial", metavar="LABEL",
                            help="which run of each agent on each instance these files are (mini-swe-agent, "
                                 "SWE-agent, OpenHands: their files name no trial), for a repeated run: run ids "
                                 "become AGENT/INSTANCE_ID/LABEL and kvjudge judge/eval/rank pair them by trial "
                                 "(without it, a second run of a task gets a trial label of its own)")
        add_results_args(parser)
        parser.add_argument("--skip-bad", action="store_true",
                            help="import the other files when one is malformed, and list it at the end")
        parser.add_argument("--repair-text", action="store_true",
                            help="store text that is not valid Unicode (lone surrogates, bytes not UTF-8) with "
                                 "U+FFFD in place of each bad code unit, and note it on the run (default: refuse the "
                                 "file)")


def _ingest(args: argparse.Namespace) -> int:
    target = target_from(args)
    with contextlib.ExitStack() as staging:
        with progress("downloading", None) as fetched:  # S3 objects first, to a scratch folder (none: no bar)
            inputs = staging.enter_context(staged_inputs(
                args.paths, args.results, endpoint_url=args.endpoint_url or target.settings.retention.endpoint_url,
                progress=lambda n, description: fetched(n, description=description)))
        walked = walk(inputs.paths)
        sources = walked.sources
        total = sum(source.size for source in sources)
        if sys.stderr.isatty():
            info(f"{len(sources)} file(s), {megabytes(total)} MB: importing")
        with target.open_store(read_tiered=False, create=True) as store, \
                progress("ingesting", len(sources)) as advance:
            report = inputs.with_urls(ingest_sources(
                store, sources, walked=walked, fmt=args.format, tenant=args.tenant, agent=args.agent,
                results=inputs.results, skip_bad=args.skip_bad, trial=args.trial, repair_text=args.repair_text,
                progress=lambda n, description: advance(n, description=description)))
    if report.unmatched_results:
        info(unmatched_results_line(report.unmatched_results))
    for note in report.notes:
        info(note)
    emit(args, report.to_dict(), lambda: _human(report))
    return 0


def _human(report: IngestReport) -> None:
    print(f"imported {len(report.imported)} run(s), {len(report.already_present)} already present, "
          f"{len(report.skipped)} file(s) skipped — {report.files} file(s), {megabytes(report.bytes)} MB, "
          f"into {report.store}")
    if report.states:
        print("  states: " + ", ".join(f"{state} {count}" for state, count in sorted(report.states.items())))
    if report.body_bytes:
        print(f"  deduplication saved {megabytes(report.dedup_saved_bytes)} MB: {megabytes(report.stored_bytes)} MB "
              f"stored for {megabytes(report.body_bytes)} MB of bodies")
    for results in report.results:
        whose = f"{results['agent']}'s runs" if results["agent"] else \
            "the runs it names" if results["agent_from"] == "run ids" else "runs of any agent"
        print(f"  results {results['results']}: graded {results['graded']} of {whose}"
              f"{' (agent from the ' + results['agent_from'] + ')' if results['agent_from'] == 'file name' else ''}")
    if report.evaluation_errors:
        print(f"  {report.evaluation_errors} result(s) were evaluation errors: those runs stay ungraded")
    if report.finished_since:
        print(f"  {len(report.finished_since)} Harbor trial(s) imported before they finished have finished since: "
              f"their runs stay as imported; `kvjudge grade --all --results JOB_DIR` attaches their results")
    for run_id, notes in report.repaired.items():
        for note in notes:
            print(f"repaired {run_id}: {describe_repair(note)}")
    for skipped in report.skipped:
        print(f"skipped {skipped['path']}: {skipped['error']}")
