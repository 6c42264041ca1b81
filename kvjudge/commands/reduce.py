"""`kvjudge reduce RUN | --all`: reduce runs to the effective ceiling of the judge model.

A run whose bodies are in cold storage is not reduced: reduction reads local bodies only, so such a run above its
ceiling is listed with the command that makes it reducible (`kvjudge rehydrate RUN`). Whenever a run is left
above its ceiling the command exits 1. Several `kvjudge reduce --all` started on one store share the job: each claims
a run before reducing it (``--lease``), and each reports every run as it ends up.
"""

from __future__ import annotations

import argparse

from kvjudge.commands._args import add_ceiling_args, add_lease_args, add_store_args, command, target_from
from kvjudge.commands._output import emit, info, print_table, progress
from kvjudge.errors import UsageError
from kvjudge.retention.reduce_runs import reduce_runs
from kvjudge.retention.shared_job import Sharing
from kvjudge.target import entry_summary


def register(subparsers: argparse._SubParsersAction) -> None:
    with command(subparsers, "reduce", _reduce, shared=(add_ceiling_args, add_store_args),
                 help="reduce runs to the effective ceiling (min(configured, max_context_tokens // 2))") as parser:
        which = parser.add_mutually_exclusive_group(required=True)
        which.add_argument("run", nargs="?", help="run id")
        which.add_argument("--all", action="store_true", help="every graded, ungraded or archived run")
        parser.add_argument("--tenant", metavar="NAME", help="with --all: only this tenant's runs")
        parser.add_argument("--dry-run", action="store_true", help="plan and report; write nothing")
        add_lease_args(parser)


def _reduce(args: argparse.Namespace) -> int:
    """Reduce a run (or every run whose grading has terminated, with --all) to the effective ceiling of the judge
    model: min(configured ceiling, max_context_tokens // 2). Loss order: bodies → head-and-tail extracts, each dead
    branch → one extract, then dead-branch text dropped. A tiered run is not reduced (rehydrate it first). Exits 1
    when any run is left above its ceiling."""
    if args.tenant is not None and not args.all:
        raise UsageError("--tenant only applies with --all; name a run or add --all")
    judge = target_from(args, ceiling=args.ceiling)
    with judge.open_store() as store, progress("reducing", None) as advance:
        sharing = None if args.dry_run else Sharing(store.claims, judge.settings.store.lease_seconds)
        # Never the configured ceiling alone: without a probe figure token_target_of raises CapabilityMissing, before
        # the counter is built (a served one asks its servers).
        done = reduce_runs(store, None if args.all else [args.run], lambda tenant: judge.ceiling(tenant).effective,
                           judge.counter, tenant=args.tenant, dry_run=args.dry_run, sharing=sharing,
                           on_run=lambda run_id, _done, _total: advance(description=f"reducing {run_id}"))
        job = None if sharing is None else sharing.summary()
    targets = {tenant: judge.ceiling_figures(tenant) for tenant in done.token_targets}
    results, above = done.runs, done.above
    payload = {"store": store.location, "model": judge.label, "counter": done.counter,
               "ceilings": targets, "capability": entry_summary(judge.entry), "runs": list(results),
               "above_ceiling": list(above), "refused": list(done.refused), "job": job}

    def human() -> None:
        for tenant, bound in targets.items():
            info(f"tenant {tenant}: target {bound['effective']} tokens = min(configured {bound['configured']}, "
                 f"max_context_tokens {bound['max_context_tokens']} // 2) — {bound['winner']} wins")
        print_table(("run", "before", "after", "target", "fits", "events", "bodies deleted"),
                    [(r["run"], r["tokens_before"], r["tokens_after"], r["target_tokens"], "yes" if r["fits"] else "NO",
                      r["events"], r.get("bodies_deleted", "-" if args.dry_run else 0)) for r in results],
                    title=("planned (dry run)" if args.dry_run else "reduced") + f" — {done.counter}")
        for item in payload["refused"]:
            info(f"refused {item['run']}: it is {item['state']}; {item['reason']}")

    emit(args, payload, human)
    # Stderr names every run left above its ceiling, --json or not (the exit code says there is one).
    for item in above:
        info(item["reason"])
    if above:
        info(f"{len(above)} run(s) left above their ceiling: {', '.join(item['run'] for item in above)}")
    return 1 if above else 0
