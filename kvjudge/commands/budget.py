"""`kvjudge budget`: the token budget a conversation gets, and `--ceiling`: the retention ceiling bound.

The budget of a conversation model comes from its capability entry on this device (or a served model's), as plain
numbers injected into :mod:`kvjudge.budget`; the ceiling is the judge target's (:mod:`kvjudge.target`), as
``reduce`` and ``tier`` use it: for a pool of judge servers, bounded by the smallest served context.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from kvjudge import models
from kvjudge.budget import budget_from_settings
from kvjudge.commands._args import command, settings_from, target_from
from kvjudge.commands._output import emit, info, print_fields, print_table
from kvjudge.errors import UsageError
from kvjudge.settings import Settings
from kvjudge.target import JudgeTarget, entry_summary


def register(subparsers: argparse._SubParsersAction) -> None:
    with command(subparsers, "budget", _run,
                 help="the token budget a conversation gets (or, with --ceiling, the retention ceiling)") as parser:
        parser.add_argument("--model", metavar="PATH",
                            help="GGUF model (default: the default model; with --ceiling: [judge] model or the "
                                 "default judge model)")
        parser.add_argument("--server", metavar="URL",
                            help="the model is this OpenAI-compatible server: use its `kvjudge probe --server` "
                                 "entry, probed on first use (default with --ceiling: [judge] servers / server, a "
                                 "pool bounded by its smallest served context)")
        parser.add_argument("--ceiling", action="store_true", help="show the retention ceiling bound instead")
        parser.add_argument("--tenant", metavar="NAME", help="tenant whose configured ceiling to use (with "
                                                             "--ceiling)")
        parser.add_argument("--capabilities", metavar="FILE",
                            help="capability cache file (default: in the cache dir)")


def _run(args: argparse.Namespace) -> int:
    """Resolve the TokenBudget from [memory] context_tokens, else the probe cache (max_ok_input, else safe_context),
    else 8192. With --ceiling: the retention ceiling, min(configured, max_context_tokens // 2) of the judge model."""
    if args.server and args.model:
        raise UsageError("--server and --model name two judges; pass one")
    if args.tenant is not None and not args.ceiling:
        raise UsageError("--tenant only applies with --ceiling; add --ceiling or drop --tenant")
    settings = settings_from(args)
    # --model / --server name the model: the conversation's (the default model unless named), or with --ceiling
    # the judge ([judge] model / servers unless named).
    if args.server:
        settings = settings.with_overrides({"judge.servers": (args.server,)}, {"judge.servers": "--server"},
                                           unset=("judge.server",))
    elif args.model and args.ceiling:
        settings = settings.with_overrides({"judge.model": args.model}, {"judge.model": "--model"},
                                           unset=("judge.server", "judge.servers"))
    target = target_from(args, settings=settings)
    return _ceiling(args, target) if args.ceiling else _budget(args, settings, target)


def _budget(args: argparse.Namespace, settings: Settings, target: JudgeTarget) -> int:
    if args.server:
        entry = target.entry
        model_label = target.label
        model_path = Path(entry.model_path) if entry and Path(entry.model_path).is_file() else None
    else:
        model_path = models.resolve_model(args.model)
        entry = target.local_entry(model_path)
        model_label = str(model_path)
        if entry is None:
            info(f"no capability entry for {model_path} on this device; run `kvjudge probe --model {model_path}` "
                 f"to derive the budget from what really runs")
    resolved = budget_from_settings(settings, max_ok_input=entry.max_ok_input if entry else None,
                                    safe_context=entry.safe_context if entry else None, model_path=model_path)
    provider = resolved.provider()
    payload = {
        "model": model_label,
        "provider": provider.name(),
        "tokens": resolved.tokens,
        "source": resolved.source.value,
        "threshold_pct": provider.threshold_pct,
        "prune_above": provider.prune_above,
        "estimation": resolved.estimation.name,
        "capability": entry_summary(entry),
    }

    def human() -> None:
        rows = [("model", payload["model"]), ("budget (tokens)", payload["tokens"]), ("source", payload["source"]),
                ("threshold_pct", payload["threshold_pct"]), ("prunes above", payload["prune_above"]),
                ("estimation", payload["estimation"])]
        summary = payload["capability"]
        rows += [(f"cache: {k}", v) for k, v in summary.items()] if summary else [("cache entry", "none")]
        print_fields(rows, title="token budget")

    emit(args, payload, human)
    return 0


def _ceiling(args: argparse.Namespace, target: JudgeTarget) -> int:
    bound = target.ceiling(args.tenant)  # CapabilityMissing without a probe figure: never the configured value
    entry = target.entry
    assert entry is not None
    payload = {
        "model": target.label,
        "servers": list(target.servers),
        "tenant": args.tenant,
        "configured": bound.configured,
        "max_context_tokens": target.max_context_tokens,
        "hardware_bound": bound.hardware_bound,
        "effective": bound.effective,
        "winner": bound.winner,
        "capability": entry_summary(entry),
    }
    title = (f"{Path(entry.server['model_id']).name} @ {entry.server['url']}" if target.served
             else target.model_path.name)

    def human() -> None:
        source = f"retention.tenants.{args.tenant}.ceiling" if args.tenant else "retention.ceiling"
        pool = f" (the smallest of {len(target.servers)} servers)" if len(target.servers) > 1 else ""
        rows = [("configured", bound.configured, f"config {source} (or its default)"),
                ("hardware bound", bound.hardware_bound, f"max_context_tokens {payload['max_context_tokens']} // "
                                                         f"2{pool}"),
                ("effective", bound.effective, f"{bound.winner} wins")]
        print_table(("ceiling", "tokens", "from"), rows, title=f"retention ceiling for {title}")

    emit(args, payload, human)
    return 0
