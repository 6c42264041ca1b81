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
    judge_servers,
    lookup_entry,
    print_table,
    served_entry,
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
    parser.add_argument("--server", metavar="URL",
                        help="the judge is this OpenAI-compatible server: use its `kvjudge probe --server` entry "
                             "(default with --ceiling: [judge] server)")
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


def _served_judge(args: argparse.Namespace, config: Config) -> str | None:
    """The judge server whose entry bounds the figures: ``--server``, else (for the ceiling) ``[judge] server``
    or the first of ``[judge] servers``."""
    if args.server and args.model:
        raise UsageError("--server and --model name two judges; pass one")
    if args.server:
        return args.server
    servers = judge_servers(args, config) if args.ceiling else []
    return servers[0] if servers else None


def _budget(args: argparse.Namespace, config: Config) -> int:
    server = _served_judge(args, config)
    if server is not None:
        entry = served_entry(args, server, args.capabilities, required=False)
        model_label = f"{entry.server['model_id']} @ {entry.server['url']}" if entry else server
        model_path = Path(entry.model_path) if entry and Path(entry.model_path).is_file() else None
    else:
        model_path = models.resolve_model(args.model)
        entry = _lookup(args, config, model_path)
        model_label = str(model_path)
    resolved = budget_from_config(
        config,
        max_ok_input=entry.max_ok_input if entry else None,
        safe_context=entry.safe_context if entry else None,
        model_path=model_path,
    )
    if server is None:
        if entry is None:
            info(f"no capability entry for {model_path} on this device; run `kvjudge probe --model {model_path}` "
                 f"to derive the budget from what really runs")
        warn_if_stale(entry, model_path)
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
        print_table(("setting", "value"), rows, title="token budget")

    emit(args, payload, human)
    return 0


def _ceiling(args: argparse.Namespace, config: Config) -> int:
    configured = configured_ceiling(config, args.tenant)
    server = _served_judge(args, config)
    if server is not None:
        # Never fall back to the configured value alone: served_entry raises CapabilityMissing without a figure.
        entry = served_entry(args, server, args.capabilities)
        assert entry is not None
        model_label = f"{entry.server['model_id']} @ {entry.server['url']}"
        title = f"{Path(entry.server['model_id']).name} @ {entry.server['url']}"
    else:
        model_path = judge_model(args, config)
        entry = _lookup(args, config, model_path)
        if entry is None:
            # Never fall back to the configured value alone: it would promise more than the judge can read.
            raise CapabilityMissing(
                f"no probe figure for the judge model {model_path} on this device, so the ceiling cannot be "
                f"bounded; run `kvjudge probe --model {model_path}`")
        warn_if_stale(entry, model_path)
        model_label, title = str(model_path), model_path.name
    bound = effective_ceiling(configured, entry.max_context_tokens)
    payload = {
        "model": model_label,
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
        print_table(("ceiling", "tokens", "from"), rows, title=f"retention ceiling for {title}")

    emit(args, payload, human)
    return 0
