"""`kvjudge probe` and `kvjudge cache show | refresh | clear`: what fits on this device, and the cache of it."""

from __future__ import annotations

import argparse
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from kvjudge.commands._common import add_output_args, config_from, emit, info, print_table, progress
from kvjudge.errors import KvjudgeError, UsageError


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {value}")
    return value


def register(subparsers: argparse._SubParsersAction) -> None:
    from kvjudge.probe.settings import KV_TYPE_NAMES

    parser = subparsers.add_parser(
        "probe", help="how much context a model really holds on this device (devices, KV math, certified run)",
        description="Probe the model (default: the bundled default model): device memory, the GGUF shape, the "
                    "KV-cache math → max_context_tokens; then certify by running it in child processes → "
                    "max_ok_input and safe_context. Results go to the capability cache.")
    parser.add_argument("--model", metavar="PATH", help="GGUF file (default: the bundled default model)")
    parser.add_argument("--n-ctx", type=_positive_int, metavar="N", help="also report the KV bytes for this n_ctx")
    parser.add_argument("--type-k", choices=KV_TYPE_NAMES, default="f16", help="K cache type (default f16)")
    parser.add_argument("--type-v", choices=KV_TYPE_NAMES, default="f16", help="V cache type (default f16)")
    parser.add_argument("--flash-attn", action="store_true", help="flash attention (needed for a quantized V)")
    parser.add_argument("--swa-full", dest="swa_full", action="store_true", default=True,
                        help="full-size cache for sliding-window layers (llama-cpp-python's default)")
    parser.add_argument("--no-swa-full", dest="swa_full", action="store_false",
                        help="windowed cache for sliding-window layers")
    parser.add_argument("--n-seq", type=_positive_int, default=1, metavar="N", help="parallel sequences (default 1)")
    parser.add_argument("--gpu-layers", type=int, default=0, metavar="N", help="layers offloaded to the GPU (-1: all)")
    parser.add_argument("--n-ubatch", type=_positive_int, default=512, metavar="N", help="micro-batch (default 512)")
    parser.add_argument("--memory-budget", metavar="SIZE",
                        help="cap the usable memory, e.g. 6GiB, 512MiB, 1.5GB (default: [probe] memory_budget)")
    parser.add_argument("--no-certify", action="store_true", help="analytic figure only; do not run the model")
    parser.add_argument("--refresh", action="store_true", help="certify again even if the cache holds a fresh result")
    parser.add_argument("--timeout", type=float, metavar="S", help="seconds per certification trial")
    parser.add_argument("--cache", metavar="PATH", help="capability cache file (default: in the cache dir)")
    add_output_args(parser)
    parser.set_defaults(func=_probe)

    cache = subparsers.add_parser("cache", help="show, refresh or clear the capability cache")
    actions = cache.add_subparsers(dest="cache_action", metavar="ACTION", required=True)
    show = actions.add_parser("show", help="list the cached capabilities (fresh, stale or mismatched)")
    refresh = actions.add_parser("refresh", help="probe again what is cached (all, or --stale-only)")
    refresh.add_argument("--stale-only", action="store_true",
                         help="only entries past the staleness limit or whose fingerprint no longer matches")
    clear = actions.add_parser("clear", help="delete the cache file (also an unreadable one)")
    for sub, func in ((show, _cache_show), (refresh, _cache_refresh), (clear, _cache_clear)):
        sub.add_argument("--cache", metavar="PATH", help="capability cache file (default: in the cache dir)")
        add_output_args(sub)
        sub.set_defaults(func=func)


def _settings(args: argparse.Namespace) -> Any:
    from kvjudge.probe import RuntimeSettings

    if args.gpu_layers < -1:
        raise UsageError(f"--gpu-layers must be -1 (all), 0 or a positive count, got {args.gpu_layers}")
    return RuntimeSettings(type_k=args.type_k, type_v=args.type_v, flash_attn=args.flash_attn,
                           swa_full=args.swa_full, n_seq=args.n_seq, gpu_layers=args.gpu_layers,
                           n_ubatch=args.n_ubatch)


def _staleness(args: argparse.Namespace) -> float | None:
    value = config_from(args).get("probe.staleness_days", (int, float), None)
    return None if value is None else float(value)


def _probe(args: argparse.Namespace) -> int:
    from kvjudge.probe import probe
    from kvjudge.probe.settings import parse_size

    settings = _settings(args)
    config = config_from(args)
    budget = args.memory_budget if args.memory_budget is not None else config.get("probe.memory_budget", (str, int))
    if budget is not None:
        budget = parse_size(budget)
    if args.timeout is not None and args.timeout <= 0:
        raise UsageError(f"--timeout must be positive, got {args.timeout}")
    with progress("certifying", total=None) as advance:
        report = probe(args.model, settings=settings, memory_budget=budget, n_ctx=args.n_ctx,
                       certify=not args.no_certify, cache_path=args.cache, refresh=args.refresh,
                       progress=lambda message: advance(1, description=message), trial_timeout_s=args.timeout,
                       staleness_days=_staleness(args))
    payload = report.as_dict()
    emit(args, payload, lambda: _print_report(payload))
    return 0


def _mib(value: int | None) -> str:
    from kvjudge.probe import format_size

    return format_size(value)


def _print_report(data: dict[str, Any]) -> None:
    print_table(["device", "kind", "total", "free", "source"],
                [[d["name"], d["kind"], _mib(d["total_bytes"]), _mib(d["free_bytes"]), d["source"]]
                 for d in data["devices"]], title="devices")
    for note in data["device_notes"]:
        print(f"  note: {note}")
    model = data["model"]
    fp = data["footprint_at_max"]
    rows = [
        ["model", f"{model['name'] or model['arch']} ({model['arch']}, {model['n_layer']} layers, "
                  f"n_ctx_train {model['n_ctx_train']})"],
        ["sha256", model["sha256"][:16] + "…"],
        ["placed on", f"{data['placement']['device']} (usable {_mib(data['placement']['usable_bytes'])})"],
        ["KV bytes per token", f"{data['kv_bytes_per_token']:.0f}"],
        ["max_context_tokens", f"{data['max_context_tokens']} (analytic: weights {_mib(fp['weights'])} + KV "
                               f"{_mib(fp['kv'])} + compute {_mib(fp['compute'])} (estimate) + margin "
                               f"{_mib(fp['margin'])})"],
        ["max_ok_input", data["max_ok_input"] if data["max_ok_input"] is not None else "- (not certified)"],
        ["safe_context", data["safe_context"] if data["safe_context"] is not None else "- (not certified)"],
        ["method", data["method"] + (" (from cache)" if data["cached"] else "")],
    ]
    if "kv_cache_bytes" in data:
        rows.append([f"KV at n_ctx {data['n_ctx']}", _mib(data["kv_cache_bytes"])])
    print_table(["", ""], rows, title="probe")
    if data["trials"]:
        print_table(["n_ctx", "prompt tokens", "outcome", "KV (llama.cpp)", "footprint", "seconds"],
                    [[t["n_ctx"], t["prompt_tokens"], t["outcome"], _mib(t["kv_bytes_measured"]),
                      _mib(t["footprint_bytes"]), f"{t['seconds']:.1f}"] for t in data["trials"]],
                    title="certification trials")
    for note in data["notes"]:
        print(f"  note: {note}")


def _status(entry: Any) -> str:
    from kvjudge.probe.core import current_components

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


def _cache(args: argparse.Namespace) -> Any:
    from kvjudge.probe import CapabilityCache

    return CapabilityCache(args.cache, staleness_days=_staleness(args))


def _cache_show(args: argparse.Namespace) -> int:
    cache = _cache(args)
    entries = cache.entries()
    rows = []
    for entry in entries:
        rows.append(entry.to_json() | {"stale": entry.stale, "status": _status(entry)})
    payload = {"path": str(cache.path), "staleness_days": cache.staleness_days, "entries": rows}

    def human() -> None:
        print_table(["fingerprint", "model", "budget", "max_context", "max_ok_input", "safe_context", "method",
                     "age", "status"],
                    [[r["fingerprint"][:12], Path(r["model_path"]).name, _mib(r["memory_budget"]),
                      r["max_context_tokens"], r["max_ok_input"], r["safe_context"], r["method"],
                      _age(e), r["status"]] for r, e in zip(rows, entries)],
                    title=f"capability cache {cache.path}")

    emit(args, payload, human)
    return 0


def _cache_refresh(args: argparse.Namespace) -> int:
    from kvjudge.probe import RuntimeSettings, probe

    cache = _cache(args)
    results = []
    for entry in cache.entries():
        status = _status(entry)
        if args.stale_only and status == "fresh":
            continue
        if not Path(entry.model_path).is_file():
            results.append({"fingerprint": entry.fingerprint, "model_path": entry.model_path,
                            "result": "skipped: the model file is gone"})
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
        results.append({"fingerprint": entry.fingerprint, "model_path": entry.model_path, "was": status,
                        "new_fingerprint": report.entry.fingerprint, "result": report.entry.method,
                        "max_context_tokens": report.max_context_tokens, "max_ok_input": report.entry.max_ok_input,
                        "safe_context": report.entry.safe_context})
    payload = {"path": str(cache.path), "refreshed": results}

    def human() -> None:
        if not results:
            print("nothing to refresh")
            return
        print_table(["fingerprint", "model", "was", "now", "max_context", "max_ok_input", "safe_context"],
                    [[r["fingerprint"][:12], Path(r["model_path"]).name, r.get("was", "-"), r["result"],
                      r.get("max_context_tokens"), r.get("max_ok_input"), r.get("safe_context")] for r in results])

    emit(args, payload, human)
    return 0


def _cache_clear(args: argparse.Namespace) -> int:
    cache = _cache(args)
    count = cache.clear()
    payload = {"path": str(cache.path), "removed_entries": count if count >= 0 else None,
               "was_unreadable": count < 0}
    emit(args, payload, lambda: print(f"removed {cache.path} ({'unreadable' if count < 0 else f'{count} entries'})"))
    return 0
