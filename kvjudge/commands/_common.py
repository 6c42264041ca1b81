"""What every subcommand shares: common options, JSON or table output, progress on a TTY."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvjudge import models
from kvjudge.config import Config, load_config
from kvjudge.display import visible

if TYPE_CHECKING:
    from kvjudge.probe import CapabilityEntry
    from kvjudge.tokens import TokenCounter

# The figures of a capability entry worth showing (trials are the probe's business).
_ENTRY_FIELDS = ("fingerprint", "model_sha256", "device", "max_context_tokens", "max_ok_input", "safe_context",
                 "certified", "certified_at", "method", "stale")


def add_output_args(parser: argparse.ArgumentParser) -> None:
    """``--json``, ``--raw`` and ``--config`` (every subcommand has all three)."""
    parser.add_argument("--json", action="store_true", help="print one JSON object for scripts")
    parser.add_argument("--raw", action="store_true",
                        help="print run text as stored, terminal escape sequences included (default: control "
                             "characters shown visibly, e.g. ␛[31m)")
    parser.add_argument("--config", metavar="PATH", help="config file (default: ./kvjudge.toml)")


def add_store_args(parser: argparse.ArgumentParser) -> None:
    """``--store PATH`` (every command that reads or writes the run store)."""
    parser.add_argument("--store", metavar="PATH", help="store file (default: [retention] store, else "
                                                        "<data dir>/store.sqlite)")


def add_endpoint_args(parser: argparse.ArgumentParser) -> None:
    """``--endpoint-url URL`` (commands that reach an S3 cold store)."""
    parser.add_argument("--endpoint-url", metavar="URL",
                        help="S3 endpoint (default: [retention] endpoint_url, else AWS_ENDPOINT_URL / AWS config)")


def staleness_days(args: argparse.Namespace) -> float | None:
    """``[probe] staleness_days`` of the command's config (None: the probe's default)."""
    value = config_from(args).get("probe.staleness_days", (int, float), None)
    return None if value is None else float(value)


def format_mib(value: int | None) -> str:
    """Bytes for a table, in the probe's units."""
    from kvjudge.probe import format_size

    return format_size(value)


def megabytes(n_bytes: int) -> str:
    """Bytes as decimal megabytes with one decimal (tables)."""
    return f"{n_bytes / 1e6:.1f}"


def config_from(args: argparse.Namespace) -> Config:
    return load_config(getattr(args, "config", None))


def judge_model(args: argparse.Namespace, config: Config) -> Path:
    """``--model``, else ``[judge] model``, else the default judge model."""
    chosen = getattr(args, "model", None) or config.get("judge.model", str, None)
    return models.resolve_model(chosen) if chosen else models.judge_model_path()


def counter_for(args: argparse.Namespace, config: Config) -> TokenCounter:
    """``[retention] counter``: ``model`` (the judge model's tokenizer, default), ``tiktoken`` or ``chars``."""
    from kvjudge.tokens import make_counter

    spec = config.get("retention.counter", str, "model")
    if spec.partition(":")[0] == "model":
        return make_counter(spec, judge_model(args, config))
    return make_counter(spec)


def lookup_entry(model_path: Path, cache_path: str | os.PathLike[str] | None = None,
                 memory_budget: int | str | None = None) -> CapabilityEntry | None:
    """The capability cache entry for ``model_path`` on this device, or None (never probes)."""
    from kvjudge.probe import lookup_capability

    return lookup_capability(model_path, cache_path=cache_path, memory_budget=memory_budget)


def entry_summary(entry: CapabilityEntry | None) -> dict[str, Any] | None:
    """The displayable figures of a capability entry (None stays None)."""
    if entry is None:
        return None
    return {name: getattr(entry, name, None) for name in _ENTRY_FIELDS}


def warn_if_stale(entry: CapabilityEntry | None, model_path: Path) -> None:
    """One line on stderr when the capability entry is past its staleness limit."""
    if entry is not None and getattr(entry, "stale", False):
        info(f"the capability entry for {model_path} is stale; rerun `kvjudge probe --model {model_path}`")


class _HumanStdout:
    """stdout while a command prints for people: run text goes through :func:`visible` unless ``--raw``."""

    def __init__(self, stream: Any, raw: bool) -> None:
        self.stream = stream
        self.raw = raw

    def write(self, text: str) -> int:
        return self.stream.write(text if self.raw else visible(text))

    def __getattr__(self, name: str) -> Any:  # flush, isatty, encoding, … of the real stream
        return getattr(self.stream, name)


def emit(args: argparse.Namespace, payload: Any, human: Callable[[], None] | None = None) -> None:
    """Print ``payload`` as JSON with ``--json``, else call ``human`` (or pretty-print the payload).

    JSON escapes control characters itself; what ``human`` prints is shown visibly (:func:`visible`)
    unless ``--raw``.
    """
    if getattr(args, "json", False):
        json.dump(payload, sys.stdout, indent=None, sort_keys=False, default=str)
        sys.stdout.write("\n")
        sys.stdout.flush()
    elif human is not None:
        with contextlib.redirect_stdout(_HumanStdout(sys.stdout, getattr(args, "raw", False))):
            human()
    else:
        print(json.dumps(payload, indent=2, default=str))


def print_table(columns: Sequence[str], rows: Sequence[Sequence[Any]], title: str | None = None) -> None:
    """A short table on stdout (rich, plain text when stdout is not a terminal); cells shown visibly unless
    the command runs with ``--raw``."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    out = sys.stdout
    # rich's own styling must reach the terminal as it is, so the table renders its cells visibly itself
    # and writes past the human-output wrapper.
    raw = isinstance(out, _HumanStdout) and out.raw
    stream = out.stream if isinstance(out, _HumanStdout) else out
    shown: Callable[[str], str] = (lambda text: text) if raw else visible
    table = Table(title=None if title is None else Text(shown(title)), show_edge=False, header_style="bold")
    for column in columns:
        table.add_column(column)
    for row in rows:
        # Text(), not str: cells hold run text and refs, whose square brackets are not rich markup.
        table.add_row(*[Text(shown("" if cell is None else str(cell))) for cell in row])
    Console(file=stream, soft_wrap=False, width=max(100, Console(file=stream).width)).print(table)


def open_store(args: argparse.Namespace, config: Config, *, read_tiered: bool = True) -> Any:
    """The store named by ``--store``, ``[retention] store`` or the default path.

    With ``read_tiered`` the store reads tiered bodies from their cold store (``show``, the judge); tiering
    itself moves local bodies and opens the store without that reader.
    """
    from kvjudge.retention import Store
    from kvjudge.retention.tier import fallback_reader

    store = Store.open(getattr(args, "store", None) or config.get("retention.store", str, None))
    if read_tiered:  # the reader looks up where each tiered body went, so it needs the store
        store.fallback = fallback_reader(config, store, endpoint_url=getattr(args, "endpoint_url", None))
    return store


def info(message: str) -> None:
    """A status line on stderr (keeps stdout clean for --json); run text in it is shown visibly."""
    print(visible(message), file=sys.stderr, flush=True)


@contextlib.contextmanager
def progress(description: str, total: int | None) -> Iterator[Callable[..., None]]:
    """Yield ``advance(n=1, description=None)``; draws a progress bar on stderr when it is a TTY."""
    if not sys.stderr.isatty():
        yield lambda n=1, description=None: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   console=Console(stderr=True), transient=True)
    with bar:
        task = bar.add_task(description, total=total)

        def advance(n: int = 1, description: str | None = None) -> None:
            if description is not None:
                bar.update(task, description=description)
            bar.advance(task, n)

        yield advance
