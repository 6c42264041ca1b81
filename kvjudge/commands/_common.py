"""What every subcommand shares: common options, JSON or table output, progress on a TTY."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from kvjudge.config import Config, load_config


def add_output_args(parser: argparse.ArgumentParser) -> None:
    """``--json`` and ``--config`` (every subcommand has both)."""
    parser.add_argument("--json", action="store_true", help="print one JSON object for scripts")
    parser.add_argument("--config", metavar="PATH", help="config file (default: ./kvjudge.toml)")


def config_from(args: argparse.Namespace) -> Config:
    return load_config(getattr(args, "config", None))


def emit(args: argparse.Namespace, payload: Any, human: Callable[[], None] | None = None) -> None:
    """Print ``payload`` as JSON with ``--json``, else call ``human`` (or pretty-print the payload)."""
    if getattr(args, "json", False):
        json.dump(payload, sys.stdout, indent=None, sort_keys=False, default=str)
        sys.stdout.write("\n")
        sys.stdout.flush()
    elif human is not None:
        human()
    else:
        print(json.dumps(payload, indent=2, default=str))


def print_table(columns: Sequence[str], rows: Sequence[Sequence[Any]], title: str | None = None) -> None:
    """A short table on stdout (rich, plain text when stdout is not a terminal)."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    table = Table(title=title, show_edge=False, header_style="bold")
    for column in columns:
        table.add_column(column)
    for row in rows:
        # Text(), not str: cells hold run text and refs, whose square brackets are not rich markup.
        table.add_row(*[Text("" if cell is None else str(cell)) for cell in row])
    Console(soft_wrap=False, width=max(100, Console().width)).print(table)


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
    """A status line on stderr (keeps stdout clean for --json)."""
    print(message, file=sys.stderr, flush=True)


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
