"""`kvjudge show RUN`: one run as a reader sees it now (text, or what stands in its place, and why)."""

from __future__ import annotations

import argparse
from typing import Any

from kvjudge.commands._common import add_endpoint_args, add_output_args, add_store_args, config_from, emit, open_store
from kvjudge.retention.blobs import short
from kvjudge.retention.reduce import resolve
from kvjudge.retention.state import REDUCED, TIERED, RunState
from kvjudge.retention.store import Store
from kvjudge.retention.text_check import describe_repair

# Human output cuts each text here (``--json`` always carries the whole text).
_SHOW_CHARS = 1200


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("show", help="render one run: transitions, text or summary, tools, verifier, "
                                                "grades")
    parser.add_argument("run", help="run id")
    parser.add_argument("--full", action="store_true", help="do not shorten long texts")
    add_store_args(parser)
    add_endpoint_args(parser)
    add_output_args(parser)
    parser.set_defaults(func=_show)


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
    return {"id": state.id, "tenant": state.tenant, "agent": state.agent, "metadata": state.metadata,
            "state": state.state, "lifecycle": list(state.lifecycle), "reduced": state.reduced,
            "task": {"id": state.task_id, "prompt": _text_entry(store, state, state.task_prompt_ref)},
            "branches": branches, "verifier": list(state.verifier), "grades": list(state.grades), "tier": state.tier,
            "text_repairs": [dict(note) for note in state.text_repairs]}


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
        if state.agent or state.metadata:
            facts = [f"agent {state.agent}"] if state.agent else []
            facts += [f"{key} {value}" for key, value in (state.metadata or {}).items()]
            print("  ".join(facts))
        for note in state.text_repairs:
            print(f"text repaired at ingest (LSN {note['lsn']}): {describe_repair(note)}")
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
