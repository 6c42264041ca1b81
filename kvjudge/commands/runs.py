"""`kvjudge ingest | runs | mark | show | reduce | verify`: the run store from the command line.

Every subcommand takes ``--store PATH`` (else ``[retention] store``, else ``<data dir>/store.sqlite``).
Tiering (``kvjudge.retention.tier``) may expose two hooks this module uses when present:
``fallback_reader(config, store, endpoint_url=None) -> ref -> bytes | None`` (read bodies that moved to cold
storage) and ``verify_checks(config, store, rehash=, endpoint_url=) -> list[Check]`` (recovery, then extra
checks for ``kvjudge verify``).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from kvjudge import models
from kvjudge.budget import configured_ceiling, effective_ceiling
from kvjudge.commands._common import add_output_args, config_from, emit, info, open_store, print_table, progress
from kvjudge.config import Config
from kvjudge.errors import RunStateError, UsageError
from kvjudge.retention.blobs import short
from kvjudge.retention.ingest import FORMATS
from kvjudge.retention.lifecycle import STATES
from kvjudge.retention.reduce import apply_plan, plan_reduction, resolve, run_tokens, store_counter_view
from kvjudge.retention.state import DROPPED, REDUCED, TIERED, RunState
from kvjudge.retention.store import Store
from kvjudge.retention.tier import verify_checks
from kvjudge.retention.verify import verify
from kvjudge.tokens import TokenCounter, make_counter

# Human output cuts each text here (``--json`` always carries the whole text).
_SHOW_CHARS = 1200


def register(subparsers: argparse._SubParsersAction) -> None:
    ingest = subparsers.add_parser("ingest", help="import runs from a JSONL file (native or OpenAI chat format)")
    ingest.add_argument("file", help="JSONL file, one run per line")
    ingest.add_argument("--tenant", metavar="NAME", help="tenant for runs that name none (default: default)")
    ingest.add_argument("--format", choices=FORMATS, help="file format (default: detected from the first line)")
    _common(ingest, _ingest)

    runs = subparsers.add_parser("runs", help="list the runs in the store")
    runs.add_argument("--tenant", metavar="NAME", help="only this tenant's runs")
    _common(runs, _runs)

    mark = subparsers.add_parser("mark", help="move a run along its lifecycle (running → grading → graded | "
                                              "ungraded → archived)")
    mark.add_argument("run", help="run id")
    mark.add_argument("state", choices=STATES, help="the state to move to")
    _common(mark, _mark)

    show = subparsers.add_parser("show", help="render one run: transitions, text or summary, tools, verifier, grades")
    show.add_argument("run", help="run id")
    show.add_argument("--full", action="store_true", help="do not shorten long texts")
    _common(show, _show)

    reduce = subparsers.add_parser(
        "reduce", help="reduce runs to the effective ceiling (min(configured, max_context_tokens // 2))",
        description="Reduce a run (or every run whose grading has terminated, with --all) to the effective "
                    "ceiling of the judge model: min(configured ceiling, max_context_tokens // 2). Loss order: "
                    "bodies → summaries, dead branches → summary, then dead-branch text dropped.")
    target = reduce.add_mutually_exclusive_group(required=True)
    target.add_argument("run", nargs="?", help="run id")
    target.add_argument("--all", action="store_true", help="every graded, ungraded or archived run")
    reduce.add_argument("--tenant", metavar="NAME", help="with --all: only this tenant's runs")
    reduce.add_argument("--ceiling", type=int, metavar="N",
                        help="lower the configured ceiling to N tokens (the hardware bound still applies)")
    reduce.add_argument("--dry-run", action="store_true", help="plan and report; write nothing")
    reduce.add_argument("--capabilities", metavar="FILE",
                        help="capability cache file (e.g. copied from the judge host; default: in the cache dir)")
    reduce.add_argument("--model", metavar="PATH", help="judge model GGUF (default: [judge] model or the default "
                                                        "judge model)")
    _common(reduce, _reduce)

    check = subparsers.add_parser("verify", help="re-hash bodies, re-fold runs from LSN 0, check every missing "
                                                 "body is explained")
    check.add_argument("run", nargs="?", help="only this run (default: the whole store)")
    check.add_argument("--verify-remote", action="store_true", help="also download and re-hash tiered bodies")
    check.add_argument("--endpoint-url", metavar="URL", help="S3 endpoint of tiered runs (default: [retention] "
                                                            "endpoint_url, else AWS_ENDPOINT_URL)")
    _common(check, _verify)


def _common(parser: argparse.ArgumentParser, func: Any) -> None:
    parser.add_argument("--store", metavar="PATH", help="store file (default: [retention] store, else "
                                                        "<data dir>/store.sqlite)")
    add_output_args(parser)
    parser.set_defaults(func=func)


# ------------------------------------------------------------------- helpers
def judge_model(args: argparse.Namespace, config: Config) -> Path:
    """``--model``, else ``[judge] model``, else the default judge model."""
    chosen = getattr(args, "model", None) or config.get("judge.model", str, None)
    return models.resolve_model(chosen) if chosen else models.judge_model_path()


def counter_for(args: argparse.Namespace, config: Config) -> TokenCounter:
    """``[retention] counter``: ``model`` (the judge model's tokenizer, default), ``tiktoken`` or ``chars``."""
    spec = config.get("retention.counter", str, "model")
    if spec.partition(":")[0] == "model":
        return make_counter(spec, judge_model(args, config))
    return make_counter(spec)


def _run_row(store: Store, state: RunState, counter: TokenCounter) -> dict[str, Any]:
    gone = sum(1 for loc in state.bodies.values() if loc.status in (REDUCED, DROPPED))
    return {"id": state.id, "tenant": state.tenant, "state": state.state, "tokens": run_tokens(store, state, counter),
            "reduced": state.reduced, "branches": len(state.branches),
            "transitions": sum(len(b.transitions) for b in state.branches), "bodies": len(state.bodies),
            "bodies_reduced_or_dropped": gone,
            "bodies_tiered": sum(1 for loc in state.bodies.values() if loc.status == TIERED)}


# ------------------------------------------------------------------ commands
def _ingest(args: argparse.Namespace) -> int:
    config = config_from(args)
    with open_store(args, config) as store, progress("ingesting", None) as advance:
        ids = store.ingest_file(args.file, tenant=args.tenant, fmt=args.format, progress=advance)
    payload = {"store": str(store.path), "ingested": ids, "count": len(ids)}
    emit(args, payload, lambda: print(f"ingested {len(ids)} run(s) into {store.path}"))
    return 0


def _runs(args: argparse.Namespace) -> int:
    config = config_from(args)
    with open_store(args, config) as store:
        ids = store.run_ids(args.tenant)
        counter = counter_for(args, config) if ids else None
        rows = []
        with progress("counting", len(ids)) as advance:
            for state in store.iter_runs(args.tenant):
                rows.append(_run_row(store, state, counter))
                advance()
    emit(args, rows, lambda: print_table(
        ("run", "tenant", "state", "tokens", "reduced", "branches", "transitions"),
        [(r["id"], r["tenant"], r["state"], r["tokens"], "yes" if r["reduced"] else "no", r["branches"],
          r["transitions"]) for r in rows], title=f"{len(rows)} run(s)" + (f" ({counter.name})" if counter else "")))
    return 0


def _mark(args: argparse.Namespace) -> int:
    config = config_from(args)
    with open_store(args, config) as store:
        state = store.mark(args.run, args.state)
    payload = {"run": state.id, "state": state.state, "lifecycle": list(state.lifecycle)}
    emit(args, payload, lambda: print(f"{state.id}: {' → '.join(state.lifecycle)}"))
    return 0


def _text_entry(store: Store, state: RunState, ref: str | None) -> dict[str, Any] | None:
    """What a reader sees for ``ref``: the text, a summary standing in for it, or why it is gone."""
    if ref is None:
        return None
    location = state.bodies[ref]
    seen = resolve(state, ref)
    entry: dict[str, Any] = {"ref": ref, "status": location.status, "lsn": location.lsn}
    if seen is None:
        entry["text"] = None
        entry["note"] = f"[text dropped: {short(ref)}, Dropped at LSN {state.bodies[_last_in_chain(state, ref)].lsn}]"
    else:
        if seen != ref:
            entry["summary_ref"] = seen
        text = store.text(seen)
        entry["text"] = text
        if text is None:
            where = state.bodies[seen]
            entry["note"] = (f"[body of {short(seen)} is in cold storage at {where.target}]" if where.status == TIERED
                             else f"[body of {short(seen)} is missing: run `kvjudge verify`]")
    return entry


def _last_in_chain(state: RunState, ref: str) -> str:
    current = ref
    while state.bodies[current].status == REDUCED and state.bodies[current].summary_ref in state.bodies:
        current = state.bodies[current].summary_ref  # type: ignore[assignment]
    return current


def render_run(store: Store, state: RunState) -> dict[str, Any]:
    """The run as a reader sees it now (JSON-ready): every transition, its text or what stands in its place."""
    branches = []
    for branch in state.branches:
        transitions = []
        for t in branch.transitions:
            item: dict[str, Any] = {"seq": t.seq, "role": t.role, "text": _text_entry(store, state, t.text_ref),
                                    "usage": t.usage, "context": t.context}
            if t.tool_call:
                item["tool_call"] = {"name": t.tool_call.get("name"),
                                     "arguments": _text_entry(store, state, t.tool_call.get("arguments_ref"))}
            if t.tool_output:
                item["tool_output"] = {"name": t.tool_output.get("name"), "exit_code": t.tool_output.get("exit_code"),
                                       "output": _text_entry(store, state, t.tool_output.get("output_ref"))}
            transitions.append(item)
        branches.append({"id": branch.id, "status": branch.status, "parent": branch.parent, "fork_at": branch.fork_at,
                         "summary": _text_entry(store, state, branch.summary_ref), "transitions": transitions})
    return {"id": state.id, "tenant": state.tenant, "state": state.state, "lifecycle": list(state.lifecycle),
            "reduced": state.reduced, "task": {"id": state.task_id,
                                               "prompt": _text_entry(store, state, state.task_prompt_ref)},
            "branches": branches, "verifier": list(state.verifier), "grades": list(state.grades), "tier": state.tier}


def _shown(entry: dict[str, Any] | None, full: bool) -> str:
    if entry is None:
        return ""
    text = entry.get("text")
    if text is None:
        return entry.get("note", "")
    prefix = f"(summary {short(entry['summary_ref'])} of {short(entry['ref'])}) " if "summary_ref" in entry else ""
    if not full and len(text) > _SHOW_CHARS:
        text = text[:_SHOW_CHARS] + f"\n[… {len(text) - _SHOW_CHARS} more characters; --full shows them]"
    return prefix + text


def _show(args: argparse.Namespace) -> int:
    config = config_from(args)
    with open_store(args, config) as store:
        state = store.run(args.run)
        rendered = render_run(store, state)

    def human() -> None:
        print(f"run {state.id}  tenant {state.tenant}  state {state.state}  lifecycle {' → '.join(state.lifecycle)}"
              f"  reduced {'yes' if state.reduced else 'no'}")
        if state.task_id or state.task_prompt_ref:
            print(f"task {state.task_id or '-'}: {_shown(rendered['task']['prompt'], args.full)}")
        for branch in rendered["branches"]:
            fork = f" (from {branch['parent']} at {branch['fork_at']})" if branch["parent"] else ""
            print(f"\n== branch {branch['id']} [{branch['status']}]{fork}")
            if branch["summary"] is not None:
                summary = branch["summary"]
                label = "branch text dropped" if summary.get("text") is None else "branch read as one summary"
                print(f"   {label}: {_shown(summary, args.full)}")
            for t in branch["transitions"]:
                line = f"-- #{t['seq']} {t['role']}"
                if t["usage"]:
                    line += "  usage " + ", ".join(f"{k}={v}" for k, v in sorted(t["usage"].items()))
                if t["context"]:
                    line += "  context " + ", ".join(f"{k}={v}" for k, v in sorted(t["context"].items()))
                print(line)
                if t["text"] is not None:
                    print(_shown(t["text"], args.full))
                if "tool_call" in t:
                    print(f"   → tool {t['tool_call']['name']}: {_shown(t['tool_call']['arguments'], args.full)}")
                if "tool_output" in t:
                    out = t["tool_output"]
                    print(f"   ← {out['name'] or 'tool'} (exit {out['exit_code']}): {_shown(out['output'], args.full)}")
        for result in state.verifier:
            print(f"verifier {result.get('name')}: {'passed' if result.get('passed') else 'FAILED'}"
                  f"{' — ' + str(result['detail']) if result.get('detail') else ''}")
        for grade in state.grades:
            print(f"grade by {grade.get('grader')}: {grade.get('score')}"
                  f"{' (' + str(grade['label']) + ')' if grade.get('label') else ''}")

    emit(args, rendered, human)
    return 0


def _max_context_tokens(model_path: Path, capabilities: str | None) -> tuple[int | None, Any]:
    """``max_context_tokens`` of the judge model on this device from the capability cache (None when unknown)."""
    from kvjudge.commands.budget import entry_summary, lookup_entry

    entry = lookup_entry(model_path, capabilities)
    if entry is not None and getattr(entry, "stale", False):
        info(f"the capability entry for {model_path.name} is stale; rerun `kvjudge probe --model {model_path}`")
    return (None if entry is None else entry.max_context_tokens), entry_summary(entry)


def _reduce(args: argparse.Namespace) -> int:
    config = config_from(args)
    if args.ceiling is not None and args.ceiling <= 0:
        raise UsageError(f"--ceiling must be a positive number of tokens, got {args.ceiling}")
    if args.tenant is not None and not args.all:
        raise UsageError("--tenant only applies with --all; name a run or add --all")
    model_path = judge_model(args, config)
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
        counter = counter_for(args, config)
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
    payload = {"store": str(store.path), "model": str(model_path), "counter": counter.name, "ceilings": targets,
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


def _verify(args: argparse.Namespace) -> int:
    config = config_from(args)
    with open_store(args, config) as store:
        # Tiering finishes crashed moves first (recovery), then adds its remote check.
        checks = verify_checks(config, store, rehash=args.verify_remote, endpoint_url=args.endpoint_url)
        if args.run is not None:
            store.run(args.run)  # StoreError for an unknown run
        total = 1 if args.run is not None else len(store.run_ids())
        with progress("verifying", total) as advance:
            report = verify(store, [args.run] if args.run is not None else None, extra_checks=checks,
                            progress=advance)
    payload = report.to_dict()

    def human() -> None:
        print(f"{'OK' if report.ok else 'VIOLATIONS'}: {report.runs} run(s), {report.blobs_rehashed} bodies re-hashed")
        if report.violations:
            print_table(("check", "run", "ref", "problem"),
                        [(v.check, v.run or "", short(v.ref) if v.ref else "", v.message) for v in report.violations])
        for note in report.notes:
            info(f"note: {note}")

    emit(args, payload, human)
    return 0 if report.ok else 1
