"""`kvjudge reduce RUN | --all`: reduce runs to the effective ceiling of the judge model.

A run whose bodies are in cold storage is not reduced: reduction reads local bodies only, so such a run above its
ceiling is listed with the command that makes it reducible (`kvjudge rehydrate RUN`). Whenever a run is left
above its ceiling the command exits 1.
"""

from __future__ import annotations

import argparse
from typing import Any

from kvjudge.commands._args import add_ceiling_args, add_output_args, add_store_args, target_from
from kvjudge.commands._output import emit, info, print_table, progress
from kvjudge.errors import RunStateError, UsageError
from kvjudge.retention.reduce import ReductionPlan, RunInColdStorage, plan_stored, reduce_run
from kvjudge.target import entry_summary

# What each loss step did, as plan.steps names it.
_STEPS = (("bodies_reduced", "bodies reduced to extracts"), ("branches_reduced", "dead branches reduced to extracts"),
          ("dropped", "dead-branch texts dropped"))


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "reduce", help="reduce runs to the effective ceiling (min(configured, max_context_tokens // 2))",
        description="Reduce a run (or every run whose grading has terminated, with --all) to the effective "
                    "ceiling of the judge model: min(configured ceiling, max_context_tokens // 2). Loss order: "
                    "bodies → head-and-tail extracts, each dead branch → one extract, then dead-branch text dropped. "
                    "A tiered run is not reduced (rehydrate it first). Exits 1 when any run is left above its ceiling.")
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("run", nargs="?", help="run id")
    target.add_argument("--all", action="store_true", help="every graded, ungraded or archived run")
    parser.add_argument("--tenant", metavar="NAME", help="with --all: only this tenant's runs")
    parser.add_argument("--dry-run", action="store_true", help="plan and report; write nothing")
    add_ceiling_args(parser)
    add_store_args(parser)
    add_output_args(parser)
    parser.set_defaults(func=_reduce)


def _left_above(plan: ReductionPlan) -> str:
    """Why a planned run stays above its target: only the loss steps that were taken are named."""
    taken = [f"{plan.steps.get(key, 0)} {label}" for key, label in _STEPS if plan.steps.get(key, 0)]
    how = f"after every loss step ({', '.join(taken)})" if taken else "and no loss step could shrink it"
    return (f"run {plan.run_id}: {plan.tokens_after} tokens remain above the target {plan.target_tokens} {how}; "
            "kept: transitions, live-branch markers")


def _reduce(args: argparse.Namespace) -> int:
    if args.tenant is not None and not args.all:
        raise UsageError("--tenant only applies with --all; name a run or add --all")
    judge = target_from(args, ceiling=args.ceiling)
    with judge.open_store() as store:
        if args.all:
            candidates = [store.run(run_id) for run_id in store.run_ids(args.tenant)]
        else:
            candidates = [store.run(args.run)]
        refused = [s for s in candidates if not s.is_reducible]
        if not args.all and refused:
            state = refused[0]
            raise RunStateError(f"run {state.id} is {state.state}; only graded, ungraded or archived runs can be "
                                f"reduced (finish grading first: `kvjudge mark {state.id} graded|ungraded`)")
        reducible = [s for s in candidates if s.is_reducible]
        # Every tenant's ceiling before anything is counted or written. Never the configured value alone: without
        # a probe figure this raises CapabilityMissing.
        targets = {tenant: judge.ceiling_figures(tenant) for tenant in sorted({s.tenant for s in reducible})}
        counter = judge.counter()
        results: list[dict[str, Any]] = []
        above: list[dict[str, Any]] = []
        with progress("reducing", len(reducible)) as advance:
            for listed in reducible:
                state = store.run(listed.id)
                target = targets[state.tenant]["effective"]
                try:
                    if args.dry_run:
                        plan = plan_stored(store, state, target, counter)
                        outcome = {**plan.to_dict(), "dry_run": True}
                    else:
                        result = reduce_run(store, state.id, target, counter)
                        plan, outcome = result.plan, result.to_dict()
                    if not plan.fits:
                        above.append({"run": state.id, "tokens": plan.tokens_after, "target": target,
                                      "reason": _left_above(plan), "fix": None})
                except RunInColdStorage as exc:
                    outcome = {"run": state.id, "counter": counter.name, "target_tokens": target,
                               "tokens_before": exc.tokens, "tokens_after": exc.tokens, "fits": False, "events": 0,
                               "in_cold_storage": True}
                    above.append({"run": state.id, "tokens": exc.tokens, "target": target, "reason": str(exc),
                                  "fix": f"kvjudge rehydrate {state.id}"})
                outcome["tenant"] = state.tenant
                results.append(outcome)
                advance(description=f"reducing {state.id}")
    payload = {"store": str(store.path), "model": judge.label, "counter": counter.name,
               "ceilings": targets, "capability": entry_summary(judge.entry), "runs": results, "above_ceiling": above,
               "refused": [{"run": s.id, "state": s.state,
                            "reason": "grading has not terminated (only graded, ungraded, archived reduce)"}
                           for s in refused]}

    def human() -> None:
        for tenant, bound in targets.items():
            info(f"tenant {tenant}: target {bound['effective']} tokens = min(configured {bound['configured']}, "
                 f"max_context_tokens {bound['max_context_tokens']} // 2) — {bound['winner']} wins")
        print_table(("run", "before", "after", "target", "fits", "events", "bodies deleted"),
                    [(r["run"], r["tokens_before"], r["tokens_after"], r["target_tokens"], "yes" if r["fits"] else "NO",
                      r["events"], r.get("bodies_deleted", "-" if args.dry_run else 0)) for r in results],
                    title=("planned (dry run)" if args.dry_run else "reduced") + f" — {counter.name}")
        for item in payload["refused"]:
            info(f"refused {item['run']}: it is {item['state']}; {item['reason']}")

    emit(args, payload, human)
    # Stderr names every run left above its ceiling, --json or not (the exit code says there is one).
    for item in above:
        info(item["reason"])
    if above:
        info(f"{len(above)} run(s) left above their ceiling: {', '.join(item['run'] for item in above)}")
    return 1 if above else 0
