"""`kvjudge reduce RUN | --all`: reduce runs to the effective ceiling of the judge model."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from kvjudge.budget import configured_ceiling, effective_ceiling
from kvjudge.commands._common import (
    add_output_args,
    add_store_args,
    config_from,
    counter_for,
    emit,
    entry_summary,
    info,
    judge_model,
    judge_servers,
    lookup_entry,
    open_store,
    print_table,
    progress,
    served_entry,
    warn_if_stale,
)
from kvjudge.errors import RunStateError, UsageError
from kvjudge.retention.reduce import apply_plan, plan_reduction, store_counter_view


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "reduce", help="reduce runs to the effective ceiling (min(configured, max_context_tokens // 2))",
        description="Reduce a run (or every run whose grading has terminated, with --all) to the effective "
                    "ceiling of the judge model: min(configured ceiling, max_context_tokens // 2). Loss order: "
                    "bodies → summaries, dead branches → summary, then dead-branch text dropped.")
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("run", nargs="?", help="run id")
    target.add_argument("--all", action="store_true", help="every graded, ungraded or archived run")
    parser.add_argument("--tenant", metavar="NAME", help="with --all: only this tenant's runs")
    parser.add_argument("--ceiling", type=int, metavar="N",
                        help="lower the configured ceiling to N tokens (the hardware bound still applies)")
    parser.add_argument("--dry-run", action="store_true", help="plan and report; write nothing")
    parser.add_argument("--capabilities", metavar="FILE",
                        help="capability cache file (e.g. copied from the judge host; default: in the cache dir)")
    parser.add_argument("--model", metavar="PATH", help="judge model GGUF (default: [judge] model or the default "
                                                        "judge model); with --server: a local copy of the served "
                                                        "GGUF to count tokens with")
    parser.add_argument("--server", metavar="URL",
                        help="the judge is this OpenAI-compatible server: the ceiling comes from its `kvjudge probe "
                             "--server` entry (default: [judge] server, unless --model is given)")
    add_store_args(parser)
    add_output_args(parser)
    parser.set_defaults(func=_reduce)


def _max_context_tokens(model_path: Path, capabilities: str | None) -> tuple[int | None, Any]:
    """``max_context_tokens`` of the judge model on this device from the capability cache (None when unknown)."""
    entry = lookup_entry(model_path, capabilities)
    warn_if_stale(entry, model_path)
    return (None if entry is None else entry.max_context_tokens), entry_summary(entry)


def _reduce(args: argparse.Namespace) -> int:
    config = config_from(args)
    if args.ceiling is not None and args.ceiling <= 0:
        raise UsageError(f"--ceiling must be a positive number of tokens, got {args.ceiling}")
    if args.tenant is not None and not args.all:
        raise UsageError("--tenant only applies with --all; name a run or add --all")
    served = None
    servers = [args.server] if args.server else ([] if args.model else judge_servers(args, config))
    if servers:
        # The judge that will read the runs is a server: its entry bounds the ceiling (and its tokenizer counts).
        served = served_entry(args, servers[0], args.capabilities)
        assert served is not None
        judge_label = f"{served.server['model_id']} @ {served.server['url']}"
        max_context, capability = served.max_context_tokens, entry_summary(served)
    else:
        model_path = judge_model(args, config)
        judge_label = str(model_path)
        max_context, capability = _max_context_tokens(model_path, args.capabilities)
    with open_store(args, config) as store:
        if args.all:
            candidates = [store.run(run_id) for run_id in store.run_ids(args.tenant)]
        else:
            candidates = [store.run(args.run)]
        refused = [s for s in candidates if not s.is_reducible]
        if not args.all and refused:
            state = refused[0]
            raise RunStateError(f"run {state.id} is {state.state}; only graded, ungraded or archived runs can be "
                                f"reduced (finish grading first: `kvjudge mark {state.id} graded|ungraded`)")
        counter = counter_for(args, config, served)
        results: list[dict[str, Any]] = []
        targets: dict[str, dict[str, Any]] = {}
        reducible = [s for s in candidates if s.is_reducible]
        with progress("reducing", len(reducible)) as advance:
            for listed in reducible:
                state = store.run(listed.id)
                configured = configured_ceiling(config, state.tenant)
                if args.ceiling is not None:
                    configured = min(configured, args.ceiling)
                # Never the configured value alone: without max_context_tokens this raises CapabilityMissing.
                bound = effective_ceiling(configured, max_context)
                targets[state.tenant] = {"configured": bound.configured, "max_context_tokens": max_context,
                                         "hardware_bound": bound.hardware_bound, "effective": bound.effective,
                                         "winner": bound.winner}
                plan = plan_reduction(state, store.text, counter, bound.effective,
                                      counts=store_counter_view(store, state, counter))
                if args.dry_run:
                    outcome = {**plan.to_dict(), "dry_run": True}
                else:
                    outcome = apply_plan(store, plan).to_dict()
                outcome["tenant"] = state.tenant
                results.append(outcome)
                if not outcome["fits"]:
                    info(f"run {state.id}: {outcome['tokens_after']} tokens remain above the target "
                         f"{bound.effective} after every loss step (kept: transitions, live-branch markers)")
                advance(description=f"reducing {state.id}")
    payload = {"store": str(store.path), "model": judge_label, "counter": counter.name, "ceilings": targets,
               "capability": capability, "runs": results,
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
    return 0
