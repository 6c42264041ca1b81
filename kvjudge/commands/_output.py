"""Output for every command: ``--json`` or text for people, status lines on stderr and progress on a TTY.

Tables, key-value lists and sentences fitted to the terminal are drawn in :mod:`kvjudge.commands._table`; the
commands import them from here with the rest of their output."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from kvjudge.commands._table import Column, print_fields, print_table, print_wrapped
from kvjudge.display import visible

__all__ = ["Column", "emit", "format_mib", "info", "megabytes", "print_fields", "print_table", "print_wrapped",
           "progress", "unmatched_results_line"]


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
        # One write: json.dump would write a large payload (5,000 runs) in 100,000 small pieces.
        sys.stdout.write(json.dumps(payload, indent=None, sort_keys=False, default=str) + "\n")
        sys.stdout.flush()
    elif human is not None:
        with contextlib.redirect_stdout(_HumanStdout(sys.stdout, getattr(args, "raw", False))):
            human()
    else:
        print(json.dumps(payload, indent=2, default=str))


def info(message: str) -> None:
    """A status line on stderr (keeps stdout clean for --json); run text in it is shown visibly. On a terminal it
    wraps at the terminal's width; elsewhere (a log, a pipe) it stays one line, for grep."""
    if sys.stderr.isatty():
        print_wrapped(visible(message), stream=sys.stderr)
    else:
        print(visible(message), file=sys.stderr, flush=True)


@contextlib.contextmanager
def progress(description: str, total: int | None) -> Iterator[Callable[..., None]]:
    """Yield ``advance(n=1, description=None, total=None)`` (``total``: the bar's total, once it is known); draws a
    progress bar on stderr when it is a TTY."""
    if not sys.stderr.isatty():
        yield lambda n=1, description=None, total=None: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   console=Console(stderr=True), transient=True)
    with bar:
        task = bar.add_task(description, total=total)

        def advance(n: int = 1, description: str | None = None, total: int | None = None) -> None:
            if description is not None or total is not None:
                bar.update(task, description=description, total=total)
            bar.advance(task, n)

        yield advance


def unmatched_results_line(unmatched: Sequence[dict[str, str]], runs: str = "run of this import",
                           listed: int = 10) -> str:
    """The one warning line for results that named no run: the first ``listed`` by name, the rest counted."""
    names = [item["instance"] for item in unmatched[:listed]]
    more = len(unmatched) - len(names)
    files = sorted({item["results"] for item in unmatched})
    return (f"warning: {len(unmatched)} result(s) name no {runs}: {', '.join(names)}"
            f"{f' and {more} more' if more else ''} (from {', '.join(files)})")


def format_mib(value: int | None) -> str:
    """Bytes for a table, in the probe's units."""
    from kvjudge.probe import format_size  # here: a command that shows no sizes never loads the probe

    return format_size(value)


def megabytes(n_bytes: int) -> str:
    """Bytes as decimal megabytes with one decimal (tables)."""
    return f"{n_bytes / 1e6:.1f}"
