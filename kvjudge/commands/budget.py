"""`kvjudge budget`: the token budget a conversation gets, and `--ceiling`: the retention ceiling bound.

This module is the caller the seed speaks of: it reads the capability cache entry for the model on this
device and injects plain numbers into :mod:`kvjudge.budget`, which never imports probe types.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from kvjudge import models
from kvjudge.budget import budget_from_config, configured_ceiling, effective_ceiling
from kvjudge.commands._common import (
    add_output_args,
    config_from,
    emit,
    entry_summary,
    info,
    judge_model,
    lookup_entry,
    print_table,
    warn_if_stale,
)
from kvjudge.config import Config
from kvjudge.errors import CapabilityMissing, UsageError

if TYPE_CHECKING:
    from kvjudge.probe import CapabilityEntry


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "budget", help="the token budget a conversation gets (or, with --ceiling, the retention ceiling)",
        description="Resolve the TokenBudget from [memory] context_tokens, else the probe cache "
                    "(max_ok_input, else safe_context), else 8192. With --ceiling: the retention ceiling, "
                    "min(configured, max_context_tokens // 2) of the judge model.")
    parser.add_argument("--model", metavar="PATH",
                        help="GGUF model (default: the default model; with --ceiling: [judge] model or the "
                             "default judge model)")
    parser.add_argument("--ceiling", action="store_true", help="show the retention ceiling bound instead")
    parser.add_argument("--tenant", metavar="NAME", help="tenant whose configured ceiling to use (with --ceiling)")
    parser.add_argument("--capabilities", metavar="FILE", help="capability cache file (default: in the cache dir)")
    add_output_args(parser)
    parser.set_defaults(func=_run)


def _lookup(args: argparse.Namespace, config: Config, model_path: Path) -> CapabilityEntry | None:
    # The probe would read ./kvjudge.toml itself; pass the budget from the config this command was given.
    return lookup_entry(model_path, args.capabilities, config.get("probe.memory_budget", (str, int), None))


def _run(args: argparse.Namespace) -> int:
    config = config_from(args)
    if args.ceiling:
        return _ceiling(args, config)
    if args.tenant is not None:
        raise UsageError("--tenant only applies with --ceiling; add --ceiling or drop --tenant")
    return _budget(args, config)


def _budget(args: argparse.Namespace, config: Config) -> int:
    model_path = models.resolve_model(args.model)
    entry = _lookup(args, config, model_path)
    resolved = budget_from_config(
        config,
        max_ok_input=entry.max_ok_input if entry else None,
        safe_context=entry.safe_context if entry else None,
        model_path=model_path,
    )
    if entry is None:
        info(f"no capability entry for {model_path} on this device; run `kvjudge probe --model {model_path}` "
             f"to derive the budget from what really runs")
    warn_if_stale(entry, model_path)
    provider = resolved.provider()
    payload = {
        "model": str(model_path),
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
        print_table(("setting", "value"), rows, title="token budget")

    emit(args, payload, human)
    return 0


def _ceiling(args: argparse.Namespace, config: Config) -> int:
    model_path = judge_model(args, config)
    configured = configured_ceiling(config, args.tenant)
    entry = _lookup(args, config, model_path)
    if entry is None:
        # Never fall back to the configured value alone: it would promise more than the judge can read.
        raise CapabilityMissing(
            f"no probe figure for the judge model {model_path} on this device, so the ceiling cannot be "
            f"bounded; run `kvjudge probe --model {model_path}`")
    warn_if_stale(entry, model_path)
    bound = effective_ceiling(configured, entry.max_context_tokens)
    payload = {
        "model": str(model_path),
        "tenant": args.tenant,
        "configured": bound.configured,
        "max_context_tokens": entry.max_context_tokens,
        "hardware_bound": bound.hardware_bound,
        "effective": bound.effective,
        "winner": bound.winner,
        "capability": entry_summary(entry),
    }

    def human() -> None:
        # No square brackets: the table renders rich markup.
        source = f"retention.tenants.{args.tenant}.ceiling" if args.tenant else "retention.ceiling"
        rows = [("configured", bound.configured, f"config {source} (or its default)"),
                ("hardware bound", bound.hardware_bound, f"max_context_tokens {entry.max_context_tokens} // 2"),
                ("effective", bound.effective, f"{bound.winner} wins")]
        print_table(("ceiling", "tokens", "from"), rows, title=f"retention ceiling for {model_path.name}")

    emit(args, payload, human)
    return 0
