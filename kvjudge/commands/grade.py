"""`kvjudge grade RUN... | --all --results FILE...`: attach evaluation results that arrived after the import."""

from __future__ import annotations

import argparse

from kvjudge.commands._args import add_results_args, add_store_args, command, target_from
from kvjudge.commands._output import emit, info, unmatched_results_line
from kvjudge.errors import UsageError
from kvjudge.retention.events import canonical_json
from kvjudge.retention.late_grades import GradeReport, attach_grades


def register(subparsers: argparse._SubParsersAction) -> None:
    with command(subparsers, "grade", _grade, shared=(add_store_args,),
                 help="attach evaluation results that arrived after the import (a new fact in each run's "
                      "log)") as parser:
        parser.add_argument("runs", nargs="*", metavar="RUN", help="run ids to grade (or --all)")
        parser.add_argument("--all", action="store_true", help="every run in the store (or the tenant's)")
        parser.add_argument("--tenant", metavar="NAME", help="with --all: only this tenant's runs")
        parser.add_argument("--trial", metavar="LABEL",
                            help="with --all: only the runs of this trial (results that name no trial, such as a "
                                 "SWE-bench report, are one trial's: ingest --trial LABEL names them)")
        add_results_args(parser)
        parser.add_argument("--replace", action="store_true",
                            help="record a different grade in place of the one a run holds (the old one stays in "
                                 "the run's log); without it such a run refuses the whole command")


def _grade(args: argparse.Namespace) -> int:
    """Read evaluation results (SWE-bench reports, OpenHands evaluation output, Harbor result.json files, inspect
    logs, as --results of ingest) and append each run's grade to its log: an ungraded run becomes graded; what was
    imported is not changed. Running it again changes nothing; a different grade for a graded run is refused unless
    --replace. One RUN with no task named, and one result for another run id (a trial's result.json for a
    trajectory imported alone): that result grades RUN."""
    if bool(args.runs) == bool(args.all):
        raise UsageError("name the runs to grade (RUN...) or pass --all")
    for option in ("tenant", "trial"):
        if getattr(args, option) is not None and not args.all:
            raise UsageError(f"--{option} selects runs for --all; with RUN... name the runs")
    if not args.results:
        raise UsageError("pass the results to attach: --results [AGENT=]FILE (repeatable)")
    target = target_from(args)
    with target.open_store(read_tiered=False) as store:
        report = attach_grades(store, args.results, None if args.all else args.runs, tenant=args.tenant,
                               trial=args.trial, replace=args.replace)
    if report.unmatched_results:
        info(unmatched_results_line(report.unmatched_results, "run graded here"))
    emit(args, report.to_dict(), lambda: _human(report))
    return 0


def _human(report: GradeReport) -> None:
    print(f"graded {len(report.graded)} run(s), replaced {len(report.replaced)} grade(s), {len(report.unchanged)} "
          f"unchanged, {len(report.no_result)} without a result — {report.store}")
    for entry in report.graded:
        print(f"  {entry['run']}: {canonical_json(entry['grade'])} → {entry['state']}")
    for entry in report.replaced:
        old = ", ".join(canonical_json(grade) for grade in entry["replaces"])
        print(f"  {entry['run']}: {old} replaced by {canonical_json(entry['grade'])}")
    if report.bound:
        print(f"  {report.bound['results']} (the result of {report.bound['result_for']}) bound to "
              f"{report.bound['run']}, the one run named")
    if report.evaluation_errors:
        print(f"  {report.evaluation_errors} result(s) were evaluation errors: those runs stay as they are")
