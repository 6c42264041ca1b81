"""`kvjudge demo`: the main job end to end on the bundled models (see kvjudge.demo)."""

from __future__ import annotations

import argparse
from pathlib import Path

from kvjudge.commands._args import command, settings_from
from kvjudge.commands._output import emit, info, progress
from kvjudge.demo import DEFAULT_CONTEXT_TARGET, DemoOptions, run_demo


def register(subparsers: argparse._SubParsersAction) -> None:
    with command(subparsers, "demo", _demo, help="the whole story on the bundled models: probe, budget, ingest, "
                                                 "judge, reduce, tier, verify") as parser:
        parser.add_argument("--out", metavar="DIR", default="kvjudge-demo",
                            help="output directory for the store, cold files and report (default: ./kvjudge-demo)")
        parser.add_argument("--model", metavar="PATH", help="judge model GGUF (default: the bundled judge model)")
        parser.add_argument("--runs", metavar="FILE", help="runs to use instead of the bundled sample (native JSONL)")
        parser.add_argument("--context-target", type=int, default=DEFAULT_CONTEXT_TARGET, metavar="N",
                            help="cap the probe's usable memory at what an N-token context needs "
                                 f"(default {DEFAULT_CONTEXT_TARGET}: certification stays quick on a CPU)")
        parser.add_argument("--ceiling", type=int, metavar="N", help="lower the configured retention ceiling to N")


def _demo(args: argparse.Namespace) -> int:
    """Probe and certify the judge model, resolve budgets and the retention ceiling, ingest the sample runs, judge
    every same-task pair from the full and the reduced runs, tier them to a local cold directory, verify, and write
    report.json, report.png and report.html."""
    options = DemoOptions(out_dir=Path(args.out).resolve(), model=Path(args.model) if args.model else None,
                          context_target=args.context_target, ceiling=args.ceiling,
                          runs_file=Path(args.runs) if args.runs else None, settings=settings_from(args))
    report = run_demo(options, say=info, progress=progress)
    out = options.out_dir
    emit(args, report, lambda: print(f"report: {out / 'report.json'}\nchart:  {out / 'report.png'}\n"
                                     f"html:   {out / 'report.html'}"))
    return 0
