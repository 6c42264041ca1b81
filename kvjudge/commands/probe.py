"""`kvjudge probe`: how much context a model really holds on this device."""

from __future__ import annotations

import argparse
from typing import Any

from kvjudge.commands._args import command, records_settings, settings_from
from kvjudge.commands._output import emit, format_mib, info, print_fields, print_table, print_wrapped, progress
from kvjudge.errors import UsageError
from kvjudge.probe import RuntimeSettings, parse_size, probe, probe_server
from kvjudge.probe.settings import KV_TYPE_NAMES
from kvjudge.settings import Settings


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {value}")
    return value


def register(subparsers: argparse._SubParsersAction) -> None:
    with command(subparsers, "probe", _probe,
                 help="how much context a model really holds on this device (devices, KV math, certified "
                      "run)") as parser:
        target = parser.add_mutually_exclusive_group()
        target.add_argument("--model", metavar="PATH",
                            help="GGUF file (default: the judge the settings name: [judge] servers / server, else "
                                 "[judge] model; else the bundled default model)")
        target.add_argument("--server", metavar="URL", help="an OpenAI-compatible server (llama.cpp, "
                                                            "llama-cpp-python, vLLM): probe what it serves")
        parser.add_argument("--n-ctx", type=_positive_int, metavar="N", help="also report the KV bytes for this n_ctx")
        parser.add_argument("--type-k", choices=KV_TYPE_NAMES, default="f16", help="K cache type (default f16)")
        parser.add_argument("--type-v", choices=KV_TYPE_NAMES, default="f16", help="V cache type (default f16)")
        parser.add_argument("--flash-attn", action="store_true", help="flash attention (needed for a quantized V)")
        parser.add_argument("--swa-full", dest="swa_full", action="store_true", default=True,
                            help="full-size cache for sliding-window layers (llama-cpp-python's default)")
        parser.add_argument("--no-swa-full", dest="swa_full", action="store_false",
                            help="windowed cache for sliding-window layers")
        parser.add_argument("--n-seq", type=_positive_int, default=1, metavar="N",
                            help="parallel sequences (default 1)")
        parser.add_argument("--gpu-layers", type=int, default=0, metavar="N",
                            help="layers offloaded to the GPU (-1: all)")
        parser.add_argument("--n-ubatch", type=_positive_int, default=512, metavar="N",
                            help="micro-batch (default 512)")
        parser.add_argument("--memory-budget", metavar="SIZE",
                            help="cap the usable memory, e.g. 6GiB, 512MiB, 1.5GB (default: [probe] memory_budget)")
        parser.add_argument("--no-certify", action="store_true", help="analytic figure only; do not run the model")
        parser.add_argument("--refresh", action="store_true",
                            help="certify again even if the cache holds a fresh result")
        parser.add_argument("--timeout", type=float, metavar="S", help="seconds per certification trial (or request)")
        parser.add_argument("--cache", metavar="PATH", help="capability cache file (default: in the cache dir)")
        records_settings(parser, "memory_budget")


def _runtime(args: argparse.Namespace) -> RuntimeSettings:
    if args.gpu_layers < -1:
        raise UsageError(f"--gpu-layers must be -1 (all), 0 or a positive count, got {args.gpu_layers}")
    return RuntimeSettings(type_k=args.type_k, type_v=args.type_v, flash_attn=args.flash_attn,
                           swa_full=args.swa_full, n_seq=args.n_seq, gpu_layers=args.gpu_layers,
                           n_ubatch=args.n_ubatch)


# Options that describe a local runtime; a server's runtime is its own business.
_LOCAL_ONLY = {"n_ctx": None, "type_k": "f16", "type_v": "f16", "flash_attn": False, "swa_full": True, "n_seq": 1,
               "gpu_layers": 0, "n_ubatch": 512, "memory_budget": None}


def _probe(args: argparse.Namespace) -> int:
    """Probe a model: device memory, the GGUF shape, the KV-cache math → max_context_tokens; then certify by running
    it in child processes → max_ok_input and safe_context. Results go to the capability cache. With --server:
    identify the model an OpenAI-compatible server serves and certify it with real requests instead. Without
    --model or --server it probes the judge the settings name (each of [judge] servers / server, else [judge]
    model), else the bundled default model; a line on stderr says which (--json: a pool's servers as
    {"servers": [...]})."""
    if args.timeout is not None and args.timeout <= 0:
        raise UsageError(f"--timeout must be positive, got {args.timeout}")
    settings = settings_from(args)
    if args.server:
        return _probe_server(args, settings, [args.server])
    if not args.model and settings.judge.server_urls:
        info(f"probing the judge servers the settings name ([judge] servers / server): "
             f"{', '.join(settings.judge.server_urls)}")
        return _probe_server(args, settings, list(settings.judge.server_urls))
    model = args.model or settings.judge.model
    if not args.model:
        info(f"probing the judge model the settings name ([judge] model): {model}" if model else
             "probing the bundled default model (no --model, and the settings name no judge)")
    runtime = _runtime(args)
    budget = settings.probe.memory_budget
    with progress("certifying", total=None) as advance:
        report = probe(model, settings=runtime, memory_budget=None if budget is None else parse_size(budget),
                       n_ctx=args.n_ctx, certify=not args.no_certify, cache_path=args.cache, refresh=args.refresh,
                       progress=lambda message: advance(1, description=message), trial_timeout_s=args.timeout,
                       staleness_days=settings.probe.staleness_days)
    payload = report.as_dict()
    emit(args, payload, lambda: _print_report(payload))
    return 0


def _probe_server(args: argparse.Namespace, settings: Settings, urls: list[str]) -> int:
    """Probe each server of ``urls``: one server's payload, or ``{"servers": [...]}`` for a pool the settings name
    (each of its servers in turn)."""
    local = [f"--{name.replace('_', '-')}" for name, default in _LOCAL_ONLY.items()
             if getattr(args, name) != default]
    if local:
        given = "--server" if args.server else "a judge server in the settings (pass --model PATH for a local file)"
        raise UsageError(f"{', '.join(local)} describe(s) a local runtime; with {given} the server's own settings "
                         f"apply (drop them)")
    payloads = []
    for url in urls:
        with progress("certifying the served model", total=None) as advance:
            report = probe_server(url, certify=not args.no_certify, cache_path=args.cache, refresh=args.refresh,
                                  progress=lambda message: advance(1, description=message), timeout_s=args.timeout,
                                  staleness_days=settings.probe.staleness_days)
        payloads.append(report.as_dict())

    def human() -> None:
        for number, payload in enumerate(payloads):
            if number:
                print()
            _print_served(payload)

    emit(args, payloads[0] if len(payloads) == 1 else {"servers": payloads}, human)
    return 0


def _print_served(data: dict[str, Any]) -> None:
    server = data["server"]
    print_fields([
        ["server", f"{server['url']} ({server['kind']}{' ' + server['version'] if server['version'] else ''})"],
        ["model", server["model_id"]],
        # The first 16 hex digits, as git abbreviates a hash (--json has all 64).
        ["sha256", data["model_sha256"][:16] if data["model_sha256"] else "- (the file is not here)"],
        ["served context", f"{data['max_context_tokens']} ({server['n_ctx_source']})"],
        ["max_ok_input", data["max_ok_input"] if data["max_ok_input"] is not None else "- (not certified)"],
        ["safe_context", data["safe_context"] if data["safe_context"] is not None else "- (not certified)"],
        ["method", data["method"] + (" (from cache)" if data["cached"] else "")],
    ], title="probe (served model)")
    if data["trials"]:
        print()
        print_table(["prompt tokens", "outcome", "context named", "seconds"],
                    [[t["prompt_tokens"] if t["prompt_tokens"] is not None else f"~{t['target_tokens']}", t["outcome"],
                      t["n_ctx_reported"] or "", f"{t['seconds']:.1f}"] for t in data["trials"]],
                    title="certification requests")
    _print_notes(data["notes"])


def _print_notes(notes: list[str]) -> None:
    for note in notes:
        print_wrapped(f"note: {note}", indent="  ")


def _print_report(data: dict[str, Any]) -> None:
    print_table(["device", "kind", "total", "free", "source"],
                [[d["name"], d["kind"], format_mib(d["total_bytes"]), format_mib(d["free_bytes"]), d["source"]]
                 for d in data["devices"]], title="devices")
    _print_notes(data["device_notes"])
    model = data["model"]
    fp = data["footprint_at_max"]
    fields = [
        ["model", f"{model['name'] or model['arch']} ({model['arch']}, {model['n_layer']} layers, "
                  f"n_ctx_train {model['n_ctx_train']})"],
        ["sha256", model["sha256"][:16]],
        ["placed on", f"{data['placement']['device']} (usable {format_mib(data['placement']['usable_bytes'])})"],
        ["KV bytes per token", f"{data['kv_bytes_per_token']:.0f}"],
        ["max_context_tokens", f"{data['max_context_tokens']} (analytic: weights {format_mib(fp['weights'])} + KV "
                               f"{format_mib(fp['kv'])} + compute {format_mib(fp['compute'])} (estimate) + margin "
                               f"{format_mib(fp['margin'])})"],
        ["max_ok_input", data["max_ok_input"] if data["max_ok_input"] is not None else "- (not certified)"],
        ["safe_context", data["safe_context"] if data["safe_context"] is not None else "- (not certified)"],
        ["method", data["method"] + (" (from cache)" if data["cached"] else "")],
    ]
    if "kv_cache_bytes" in data:
        fields.append([f"KV at n_ctx {data['n_ctx']}", format_mib(data["kv_cache_bytes"])])
    print()
    print_fields(fields, title="probe")
    if data["trials"]:
        print()
        print_table(["n_ctx", "prompt tokens", "outcome", "KV (llama.cpp)", "footprint", "seconds"],
                    [[t["n_ctx"], t["prompt_tokens"], t["outcome"], format_mib(t["kv_bytes_measured"]),
                      format_mib(t["footprint_bytes"]), f"{t['seconds']:.1f}"] for t in data["trials"]],
                    title="certification trials")
    _print_notes(data["notes"])
