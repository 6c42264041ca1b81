"""Output on a terminal, for every command: ``--json`` or text for people, tables that fit 80 columns (a record
per row when they do not, never a cut cell), wrapped sentences, status lines on stderr and progress on a TTY."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import textwrap
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from kvjudge.display import visible


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


def print_table(columns: Sequence[str], rows: Sequence[Sequence[Any]], title: str | None = None) -> None:
    """A short table on stdout, as wide as the terminal (80 columns when stdout is not one, or ``COLUMNS``).

    A table wider than that is never cut: it is printed as one record per row instead (the first cell on its own
    line, then ``column  value`` lines), so a run id a user must copy is always whole and every header readable.
    Cells are shown visibly (:func:`visible`) unless the command runs with ``--raw``.
    """
    out = sys.stdout
    # rich's own styling must reach the terminal as it is, so the table renders its cells visibly itself
    # and writes past the human-output wrapper.
    raw = isinstance(out, _HumanStdout) and out.raw
    stream = out.stream if isinstance(out, _HumanStdout) else out
    shown: Callable[[str], str] = (lambda text: text) if raw else visible
    cells = [[shown("" if cell is None else str(cell)) for cell in row] for row in rows]
    # rich is imported where it draws (here, print_wrapped, progress): `--json` output never loads it.
    from rich.console import Console
    from rich.measure import Measurement
    from rich.table import Table
    from rich.text import Text

    console = Console(file=stream, soft_wrap=False)
    table = Table(title=None if title is None else Text(shown(title)), show_edge=False, header_style="bold")
    for column in columns:
        table.add_column(column, overflow="fold")
    for row in cells:
        # Text(), not str: cells hold run text and refs, whose square brackets are not rich markup.
        table.add_row(*[Text(cell) for cell in row])
    natural = Measurement.get(console, console.options.update(width=10**6), table).maximum
    if natural <= console.width:
        console.print(table, width=console.width)
        return
    _print_records([shown(column) for column in columns], cells, None if title is None else shown(title), stream,
                   console.width)


def print_wrapped(text: str, indent: str = "") -> None:
    """A sentence on stdout, wrapped at the terminal's width (80 columns when stdout is not a terminal), every
    line after ``indent``; a word longer than a line is never broken."""
    from rich.console import Console

    width = Console(file=sys.stdout).width
    print(textwrap.fill(text, width=width, initial_indent=indent, subsequent_indent=indent + "  ",
                        break_long_words=False, break_on_hyphens=False))


def _print_records(columns: Sequence[str], rows: Sequence[Sequence[str]], title: str | None, stream: Any,
                   width: int) -> None:
    """The vertical layout of :func:`print_table`: one block per row, labels aligned, nothing cut."""
    if title:
        print(textwrap.fill(title, width=width, break_long_words=False, break_on_hyphens=False), file=stream)
    labels = [column or f"column {index + 1}" for index, column in enumerate(columns)]
    pad = max((len(label) for label in labels[1:]), default=0)
    for row in rows:
        first, *rest = row or [""]
        print(f"{labels[0]}: {first}" if columns[0] else first, file=stream)
        indent = " " * (pad + 4)
        for label, cell in zip(labels[1:], rest):
            # Long values wrap at spaces under their label (a word longer than the line is never broken).
            lines = [wrapped for line in cell.split("\n")
                     for wrapped in textwrap.wrap(line, width=max(20, width - len(indent)), break_long_words=False,
                                                  break_on_hyphens=False) or [""]]
            print(f"  {label.ljust(pad)}  {lines[0]}", file=stream)
            for line in lines[1:]:
                print(f"{indent}{line}", file=stream)
    stream.flush()


def info(message: str) -> None:
    """A status line on stderr (keeps stdout clean for --json); run text in it is shown visibly."""
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
