"""`kvjudge show RUN`: one run as a reader sees it now (text, or what stands in its place, and why).

``--judge-view`` prints instead exactly the view the judge would be given — rendered, reduced further to fit and
marked by the judge's own functions (:meth:`kvjudge.judge.Judge.pack`): the view of the run beside a run as long as
itself in the largest window the judge may open (half its room), within ``--allowance N`` tokens, or beside a
named run (``--beside RUN``, with the block of text both runs share, in the window the judge would size for them).
"""

from __future__ import annotations

import argparse
from typing import Any

from kvjudge.commands._args import READS_TIERED, command, records_settings, target_from
from kvjudge.commands._output import emit, info, print_wrapped
from kvjudge.errors import UsageError
from kvjudge.judge.evidence import describe
from kvjudge.judge.prompt import COMMON_CLOSING, COMMON_OPENING
from kvjudge.retention.blobs import short
from kvjudge.retention.reduce import resolve
from kvjudge.retention.state import REDUCED, TIERED, RunState
from kvjudge.retention.store import BlobStore
from kvjudge.retention.text_check import describe_repair

# Human output cuts each text here (``--json`` always carries the whole text).
_SHOW_CHARS = 1200


def register(subparsers: argparse._SubParsersAction) -> None:
    with command(subparsers, "show", _show, shared=READS_TIERED,
                 help="render one run: transitions, text or its extract, tools, verifier, grades") as parser:
        parser.add_argument("run", help="run id")
        parser.add_argument("--full", action="store_true", help="do not shorten long texts")
        view = parser.add_argument_group("the judge's view")
        view.add_argument("--judge-view", action="store_true",
                          help="print exactly the view of the run the judge would be given (markers included)")
        view.add_argument("--allowance", type=int, metavar="N",
                          help="with --judge-view: fit the view into N tokens (default: half the room of the largest "
                               "window the judge may open, as beside a run as long as itself)")
        view.add_argument("--beside", metavar="RUN",
                          help="with --judge-view: the view as judged beside RUN (run A, RUN B), with the block of "
                               "text both share")
        view.add_argument("--model", metavar="PATH", help="judge model GGUF (default: [judge] model, else the "
                                                          "default judge model)")
        view.add_argument("--server", metavar="URL", action="append",
                          help="the judge is this OpenAI-compatible server (default: [judge] servers or server)")
        view.add_argument("--tokenizer-model", metavar="PATH", help="with --server: a local copy of the served GGUF")
        view.add_argument("--template", choices=("auto", "chat", "raw"), default=None,
                          help="prompt framing (default: [judge] template, else auto)")
        view.add_argument("--n-ctx", type=int, metavar="N", help="the judge window (default: the largest the judge "
                                                               "may open: the certified safe_context, else the "
                                                               "analytic max_context_tokens)")
        view.add_argument("--show-verifier", action="store_true",
                          help="show verifier results, as judge --show-verifier")
        records_settings(parser, "model", "server", "tokenizer_model", "template")


def _text_entry(blobs: BlobStore, state: RunState, ref: str | None) -> dict[str, Any] | None:
    """What a reader sees for ``ref``: the text, the extract standing in for it (its summary blob), or why it
    is gone."""
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
        text = blobs.text(seen)
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


def render_run(blobs: BlobStore, state: RunState) -> dict[str, Any]:
    """The run as a reader sees it now (JSON-ready): every transition, its text or what stands in its place."""
    branches = []
    for branch in state.branches:
        transitions = []
        for t in branch.transitions:
            item: dict[str, Any] = {"seq": t.seq, "role": t.role, "text": _text_entry(blobs, state, t.text_ref),
                                    "usage": t.usage, "context": t.context}
            if t.tool_call:
                item["tool_call"] = {"name": t.tool_call.get("name"),
                                     "arguments": _text_entry(blobs, state, t.tool_call.get("arguments_ref"))}
            if t.tool_output:
                item["tool_output"] = {"name": t.tool_output.get("name"), "exit_code": t.tool_output.get("exit_code"),
                                       "output": _text_entry(blobs, state, t.tool_output.get("output_ref"))}
            transitions.append(item)
        branches.append({"id": branch.id, "status": branch.status, "parent": branch.parent, "fork_at": branch.fork_at,
                         "summary": _text_entry(blobs, state, branch.summary_ref), "transitions": transitions})
    return {"id": state.id, "tenant": state.tenant, "agent": state.agent, "metadata": state.metadata,
            "state": state.state, "lifecycle": list(state.lifecycle), "reduced": state.reduced,
            "task": {"id": state.task_id, "prompt": _text_entry(blobs, state, state.task_prompt_ref)},
            "branches": branches, "verifier": list(state.verifier), "grades": list(state.grades), "tier": state.tier,
            "text_repairs": [dict(note) for note in state.text_repairs]}


def _shown(entry: dict[str, Any] | None, full: bool) -> str:
    if entry is None:
        return ""
    text = entry.get("text")
    if text is None:
        return entry.get("note", "")
    prefix = f"(extract {short(entry['summary_ref'])} of {short(entry['ref'])}) " if "summary_ref" in entry else ""
    if not full and len(text) > _SHOW_CHARS:
        text = text[:_SHOW_CHARS] + f"\n[… {len(text) - _SHOW_CHARS} more characters; --full shows them]"
    return prefix + text


def _judge_view(args: argparse.Namespace) -> int:
    """``show RUN --judge-view``: the view the judge would be given, through the judge's own functions."""
    if args.allowance is not None and (args.allowance <= 0 or args.beside):
        raise UsageError("--allowance must be a positive number of tokens, and cannot go with --beside (the pair's "
                         "window decides the allowances)")
    target = target_from(args)
    with target.open_store() as store:
        store.runs.run(args.run)  # an unknown run is an error before any model loads
        if args.beside:
            store.runs.run(args.beside)
        # Nothing is judged here: no certification, no cached judgments.
        info("loading the judge backend…")
        judge = target.open_judge(n_ctx=args.n_ctx, certify=False, show_verifier=args.show_verifier, use_cache=False)
        try:
            if args.beside:
                needed = judge.needed_tokens(judge.base(store, args.run), judge.base(store, args.beside))
                n_ctx = args.n_ctx or judge.planner.plan(needed).n_ctx
                view, _ = judge.pack_pair(store, args.run, args.beside, n_ctx)
                allowance = None
            else:
                n_ctx = args.n_ctx or judge.planner.plan(10**9).n_ctx
                allowance = args.allowance or judge.room_at(n_ctx) // 2
                view = judge.pack(store, args.run, allowance=allowance)
            payload = {"run": args.run, "beside": args.beside, "n_ctx": n_ctx, "allowance": allowance,
                       "template": judge.framing.name, "text": view.text, "tokens": view.tokens.view,
                       "further_reduced": view.tokens.further_reduced, "common": view.common or None,
                       "common_tokens": view.common_tokens, "notes": list(view.notes),
                       "evidence": None if view.evidence is None else view.evidence.to_json(),
                       "evidence_full": None if view.evidence_full is None else view.evidence_full.to_json(),
                       "model": judge.manifest().get("model")}
        finally:
            judge.backend.close()
    if view.text is None:
        raise UsageError(f"run {args.run} cannot be judged in a {n_ctx}-token window: {'; '.join(view.notes)}")

    def human() -> None:
        if view.common:
            print(COMMON_OPENING + view.common + COMMON_CLOSING, end="")
        print(view.text)
        where = f"beside {args.beside}" if args.beside else f"within {allowance} tokens"
        info(f"the judge's view of {args.run} {where} (n_ctx {n_ctx}, {judge.framing.name} framing): "
             f"{view.tokens.view} tokens{', further reduced' if view.tokens.further_reduced else ''}; evidence "
             f"{describe(view.evidence)} (full view: {describe(view.evidence_full)})")
        for note in view.notes:
            info(f"note: {note}")

    emit(args, payload, human)
    return 0


def _show(args: argparse.Namespace) -> int:
    if args.judge_view:
        return _judge_view(args)
    if args.allowance is not None or args.beside:
        raise UsageError("--allowance and --beside go with --judge-view")
    target = target_from(args)
    with target.open_store() as store:
        state = store.runs.run(args.run)
        rendered = render_run(store.blobs, state)

    def human() -> None:
        # Lines of kvjudge's own wrap at the terminal's width (an id is never broken); run text prints as stored.
        print_wrapped(f"run {state.id}  tenant {state.tenant}  state {state.state}  lifecycle "
                      f"{' → '.join(state.lifecycle)}  reduced {'yes' if state.reduced else 'no'}")
        if state.agent or state.metadata:
            facts = [f"agent {state.agent}"] if state.agent else []
            facts += [f"{key} {value}" for key, value in (state.metadata or {}).items()]
            print_wrapped("  ".join(facts))
        for note in state.text_repairs:
            print_wrapped(f"text repaired at ingest (LSN {note['lsn']}): {describe_repair(note)}")
        if state.task_id or state.task_prompt_ref:
            print(f"task {state.task_id or '-'}: {_shown(rendered['task']['prompt'], args.full)}")
        for branch in rendered["branches"]:
            fork = f" (from {branch['parent']} at {branch['fork_at']})" if branch["parent"] else ""
            print()
            print_wrapped(f"== branch {branch['id']} [{branch['status']}]{fork}")
            if branch["summary"] is not None:
                summary = branch["summary"]
                label = "branch text dropped" if summary.get("text") is None else "branch read as one extract"
                print(f"   {label}: {_shown(summary, args.full)}")
            for t in branch["transitions"]:
                line = f"-- #{t['seq']} {t['role']}"
                if t["usage"]:
                    line += "  usage " + ", ".join(f"{k}={v}" for k, v in sorted(t["usage"].items()))
                if t["context"]:
                    line += "  context " + ", ".join(f"{k}={v}" for k, v in sorted(t["context"].items()))
                print_wrapped(line)
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
            print_wrapped(f"grade by {grade.get('grader')}: {grade.get('score')}"
                          f"{' (' + str(grade['label']) + ')' if grade.get('label') else ''}")

    emit(args, rendered, human)
    return 0
