"""`kvjudge cache show | refresh | clear`: the capability cache."""

from __future__ import annotations

import argparse
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from kvjudge.commands._args import command, settings_from
from kvjudge.commands._output import Column, emit, format_mib, info, print_fields, print_table, progress
from kvjudge.errors import KvjudgeError
from kvjudge.probe import CapabilityCache, RuntimeSettings, probe, probe_server, served_status
from kvjudge.probe.core import current_components


def register(subparsers: argparse._SubParsersAction) -> None:
    cache = subparsers.add_parser("cache", help="show, refresh or clear the capability cache")
    actions = cache.add_subparsers(dest="cache_action", metavar="ACTION", required=True)
    shared = (_add_cache_arg,)
    with command(actions, "show", _cache_show, shared=shared,
                 help="list the cached capabilities (fresh, stale or mismatched)"):
        pass  # no options but the shared ones
    with command(actions, "refresh", _cache_refresh, shared=shared,
                 help="probe again what is cached (all, or --stale-only)") as refresh:
        refresh.add_argument("--stale-only", action="store_true",
                             help="only entries past the staleness limit or whose fingerprint no longer matches")
    with command(actions, "clear", _cache_clear, shared=shared,
                 help="delete the cache file (also an unreadable one)"):
        pass  # no options but the shared ones


def _add_cache_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cache", metavar="PATH", help="capability cache file (default: in the cache dir)")


def _status(entry: Any) -> str:
    if entry.served:
        return served_status(entry)
    if entry.stale:
        return "stale"
    try:
        now = current_components(entry)
    except KvjudgeError:
        return "mismatch"
    return "fresh" if now == entry.components else "mismatch"


def _age(entry: Any) -> str:
    reference = entry.age_reference()
    if not reference:
        return "-"
    try:
        then = datetime.fromisoformat(reference)
    except ValueError:
        return "-"
    if then.tzinfo is None:
        then = then.replace(tzinfo=timezone.utc)
    days = (datetime.now(timezone.utc) - then).total_seconds() / 86400
    return f"{days:.1f} d" if days >= 1 else f"{days * 24:.1f} h"


def _model_label(entry: Any) -> str:
    """The file name of a local model; ``name @ URL`` for a served one."""
    if entry.served:
        return f"{Path(entry.server.get('model_id', '')).name} @ {entry.server.get('url')}"
    return Path(entry.model_path).name


def _or_dash(value: Any) -> Any:
    return "-" if value is None else value


def _cache(args: argparse.Namespace) -> CapabilityCache:
    return CapabilityCache(args.cache, staleness_days=settings_from(args).probe.staleness_days)


def _cache_show(args: argparse.Namespace) -> int:
    cache = _cache(args)
    entries = cache.entries()
    rows = []
    for entry in entries:
        rows.append(entry.to_json() | {"stale": entry.stale, "status": _status(entry)})
    payload = {"path": str(cache.path), "staleness_days": cache.staleness_days, "entries": rows}

    def human() -> None:
        # Each entry as `name  value` lines under its model (as `kubectl describe`): a served model's label and
        # the cache's path are too long to sit in a row of nine columns at 80.
        print_fields([("cache", cache.path), ("entries", len(rows)),
                      ("stale after", f"{cache.staleness_days:g} days")])
        for r, e in zip(rows, entries):
            print()
            print_fields([("fingerprint", r["fingerprint"][:12]), ("status", r["status"]),
                          ("max_context_tokens", r["max_context_tokens"]),
                          ("max_ok_input", _or_dash(r["max_ok_input"])), ("safe_context", _or_dash(r["safe_context"])),
                          ("method", r["method"]), ("memory budget", format_mib(r["memory_budget"])),
                          ("age", _age(e))], title=_model_label(e))

    emit(args, payload, human)
    return 0


def _cache_refresh(args: argparse.Namespace) -> int:
    cache = _cache(args)
    results = []
    for entry in cache.entries():
        status = _status(entry)
        if args.stale_only and status == "fresh":
            continue
        if entry.served:
            results.append(_refresh_served(cache, entry, status))
            continue
        if not Path(entry.model_path).is_file():
            results.append({"fingerprint": entry.fingerprint, "model_path": entry.model_path,
                            "label": _model_label(entry), "result": "skipped: the model file is gone"})
            continue
        info(f"refreshing {Path(entry.model_path).name} ({status})…")
        with progress("certifying", total=None) as advance:
            report = probe(entry.model_path, settings=RuntimeSettings(**entry.settings),
                           memory_budget=entry.memory_budget, certify=entry.certified or entry.method == "measured",
                           cache_path=cache.path, refresh=True,
                           progress=lambda message: advance(1, description=message),
                           staleness_days=cache.staleness_days)
        if report.entry.fingerprint != entry.fingerprint:
            cache.remove(entry.fingerprint)  # superseded: the file, device or runtime changed
        results.append({"fingerprint": entry.fingerprint, "model_path": entry.model_path, "label": _model_label(entry),
                        "was": status,
                        "new_fingerprint": report.entry.fingerprint, "result": report.entry.method,
                        "max_context_tokens": report.max_context_tokens, "max_ok_input": report.entry.max_ok_input,
                        "safe_context": report.entry.safe_context})
    payload = {"path": str(cache.path), "refreshed": results}

    def human() -> None:
        if not results:
            print("nothing to refresh")
            return
        print_table(["fingerprint", "model", Column("was", priority=4), "now", Column("max_context", priority=5),
                     Column("max_ok_input", priority=3), Column("safe_context", priority=2)],
                    [[r["fingerprint"][:12], r["label"], r.get("was", "-"), r["result"],
                      r.get("max_context_tokens"), r.get("max_ok_input"), r.get("safe_context")] for r in results])

    emit(args, payload, human)
    return 0


def _refresh_served(cache: Any, entry: Any, status: str) -> dict[str, Any]:
    """Probe a served entry again through its URL (an unreachable server is skipped, its entry kept)."""
    url = entry.server["url"]
    row = {"fingerprint": entry.fingerprint, "model_path": entry.model_path, "label": _model_label(entry),
           "was": status}
    if status == "unreachable":
        return row | {"result": "skipped: the server is unreachable"}
    info(f"refreshing the model served at {url} ({status})…")
    try:
        with progress("certifying the served model", total=None) as advance:
            report = probe_server(url, certify=entry.certified or entry.method == "measured", cache_path=cache.path,
                                  refresh=True, progress=lambda message: advance(1, description=message),
                                  staleness_days=cache.staleness_days)
    except KvjudgeError as exc:
        return row | {"result": f"failed: {exc}"}
    if report.entry.fingerprint != entry.fingerprint:
        cache.remove(entry.fingerprint)  # superseded: the server now serves another model, context or version
    return row | {"new_fingerprint": report.entry.fingerprint, "result": report.entry.method,
                  "max_context_tokens": report.entry.max_context_tokens, "max_ok_input": report.entry.max_ok_input,
                  "safe_context": report.entry.safe_context}


def _cache_clear(args: argparse.Namespace) -> int:
    cache = _cache(args)
    count = cache.clear()
    payload = {"path": str(cache.path), "removed_entries": count if count >= 0 else None,
               "was_unreadable": count < 0}
    emit(args, payload, lambda: print(f"removed {cache.path} ({'unreadable' if count < 0 else f'{count} entries'})"))
    return 0
