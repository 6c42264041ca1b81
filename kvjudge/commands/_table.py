"""Tables, key-value lists and sentences fitted to the output's width, as ``kubectl get``, ``docker ps`` and
``git`` print them: plain columns two spaces apart, no box rules, every value whole.

The width is ``COLUMNS`` when set, else the terminal's; in a pipe without ``COLUMNS`` a table is as wide as its
values (one row a line, for ``grep``, ``awk`` and ``wc -l``) and sentences wrap at 80. A table wider than its
width first wraps cells at their spaces (a word is never broken, so an id, a path or a number stays on one line);
if that is still too wide it leaves out its lowest-priority columns, one at a time, and a note on stderr names them.
The first column (what a row is about) is never wrapped or left out. Headers are bold only where colour is wanted
(a terminal, or ``FORCE_COLOR``; never with ``NO_COLOR`` or ``TERM=dumb``).

Drawn by hand rather than with ``rich.table``: rich sizes a table to the console (80 columns in a pipe), folds a
too-long id inside the word, and cannot leave a column out; the layout here is small enough to own.
"""

from __future__ import annotations

import os
import sys
import textwrap
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TextIO

from kvjudge.display import visible

GAP = 2  # spaces between two columns
PIPE_TEXT_WIDTH = 80  # sentences in a pipe without COLUMNS
_BOLD, _RESET = "\x1b[1m", "\x1b[0m"


@dataclass(frozen=True)
class Column:
    """A table column: its header, and how long it is kept when the table is too wide (``priority``: the lower, the
    longer; by default a column's position, so the rightmost go first). The first column is always kept."""

    name: str
    priority: int | None = None


@dataclass(frozen=True)
class Layout:
    """Which columns a table shows (``kept``, by index), each one's width, and the headers of those it leaves out."""

    kept: tuple[int, ...]
    widths: tuple[int, ...]
    dropped: tuple[str, ...]


# ----------------------------------------------------------------------------------------------- the width
def _columns_env() -> int | None:
    try:
        value = int(os.environ.get("COLUMNS", ""))
    except ValueError:
        return None
    return value if value > 0 else None


def _real(stream: Any) -> Any:
    """The stream under kvjudge's human-output wrapper (it has ``stream`` and ``raw``), or ``stream`` itself."""
    return stream.stream if hasattr(stream, "raw") and hasattr(stream, "stream") else stream


def _is_tty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def table_width(stream: Any = None) -> int | None:
    """The columns a table may fill on ``stream`` (stdout by default): ``COLUMNS``, else the terminal's width;
    None in a pipe (no limit: one row a line)."""
    stream = _real(sys.stdout if stream is None else stream)
    if (columns := _columns_env()) is not None:
        return columns
    if not _is_tty(stream):
        return None
    try:
        return os.get_terminal_size(stream.fileno()).columns or PIPE_TEXT_WIDTH
    except (AttributeError, OSError, ValueError):
        return PIPE_TEXT_WIDTH


def text_width(stream: Any = None) -> int:
    """The columns a sentence may fill on ``stream``: as a table, and 80 in a pipe."""
    return table_width(stream) or PIPE_TEXT_WIDTH


def wants_colour(stream: Any) -> bool:
    """Colour on ``stream``: never with ``NO_COLOR`` or ``TERM=dumb``, always with ``FORCE_COLOR``, else on a
    terminal only."""
    if os.environ.get("NO_COLOR"):
        return False
    if os.environ.get("FORCE_COLOR"):
        return True
    return os.environ.get("TERM") != "dumb" and _is_tty(_real(stream))


# ----------------------------------------------------------------------------------------------- the layout
def cells(text: str) -> int:
    """The terminal cells ``text`` takes (East Asian wide characters two, combining marks none)."""
    if text.isascii():
        return len(text)
    return sum(0 if unicodedata.combining(char) else 2 if unicodedata.east_asian_width(char) in "WF" else 1
               for char in text)


def _longest_word(text: str) -> int:
    return max((cells(word) for word in text.split()), default=0)


def _widest_line(text: str) -> int:
    return max((cells(line) for line in text.split("\n")), default=0)


def plan(headers: Sequence[str], rows: Sequence[Sequence[str]], width: int | None,
         priorities: Sequence[int] | None = None) -> Layout:
    """How ``rows`` under ``headers`` fit ``width`` columns (None: no limit).

    Each column wants its widest value (``natural``) and needs at least its longest word (``minimum``; the first
    column needs its widest value: it never wraps). Columns are left out, highest ``priority`` first (ties: the
    rightmost), until the minimums fit; the room left makes whole the columns that need least to be, then widens
    the one that wants most.
    A first column wider than ``width`` by itself is shown whole all the same (the line is longer)."""
    count = len(headers)
    priorities = list(range(count)) if priorities is None else list(priorities)
    natural = [max([_widest_line(headers[i])] + [_widest_line(row[i]) for row in rows]) for i in range(count)]
    minimum = [natural[0]] + [max([_longest_word(headers[i])] + [_longest_word(row[i]) for row in rows])
                              for i in range(1, count)]
    kept = list(range(count))

    def needed(columns: list[int], sizes: list[int]) -> int:
        return sum(sizes[i] for i in columns) + GAP * (len(columns) - 1)

    if width is None:
        return Layout(tuple(kept), tuple(natural), ())
    while len(kept) > 1 and needed(kept, minimum) > width:
        kept.remove(max(kept[1:], key=lambda i: (priorities[i], i)))
    widths = {i: minimum[i] for i in kept}
    room = width - needed(kept, minimum)
    # The columns that need the least to be whole are made whole first; what is left widens the most wanting.
    for i in sorted(kept, key=lambda i: (natural[i] - widths[i], i)):
        if natural[i] - widths[i] <= room:
            room -= natural[i] - widths[i]
            widths[i] = natural[i]
    while room > 0 and (wanting := [i for i in kept if widths[i] < natural[i]]):
        widths[max(wanting, key=lambda i: (natural[i] - widths[i], -i))] += 1
        room -= 1
    dropped = tuple(headers[i] for i in range(count) if i not in kept)
    return Layout(tuple(kept), tuple(widths[i] for i in kept), dropped)


def _wrap(text: str, width: int) -> list[str]:
    lines = [piece for line in text.split("\n")
             for piece in textwrap.wrap(line, width=max(width, 1), break_long_words=False,
                                        break_on_hyphens=False) or [""]]
    return lines or [""]


def _pad(text: str, width: int) -> str:
    return text + " " * max(width - cells(text), 0)


def render(headers: Sequence[str] | None, rows: Sequence[Sequence[str]], layout: Layout,
           bold: Callable[[str], str] = lambda text: text) -> list[str]:
    """The lines of a table laid out by :func:`plan` (``headers`` None: no header line), each without trailing
    spaces; a wrapped cell continues on the next lines in its own column, header lines go through ``bold``."""
    def block(row: Sequence[str]) -> list[str]:
        wrapped = [_wrap(row[i], width) for i, width in zip(layout.kept, layout.widths)]
        height = max(len(lines) for lines in wrapped)
        return [(" " * GAP).join(_pad(lines[n] if n < len(lines) else "", width)
                                 for lines, width in zip(wrapped, layout.widths)).rstrip()
                for n in range(height)]

    lines = [bold(line) for line in block(headers)] if headers is not None else []
    for row in rows:
        lines += block(row)
    return lines


# ----------------------------------------------------------------------------------------------- printing
def _shown_cells(rows: Sequence[Sequence[Any]]) -> tuple[Callable[[str], str], list[list[str]], TextIO]:
    """How to show text (visibly unless ``--raw``), the rows as shown, and the stream to write them to (the real
    stdout: a bold header must reach the terminal as it is)."""
    out = sys.stdout
    raw = bool(getattr(out, "raw", False)) and hasattr(out, "stream")
    shown: Callable[[str], str] = (lambda text: text) if raw else visible
    return shown, [[shown("" if cell is None else str(cell)) for cell in row] for row in rows], _real(out)


def print_table(columns: Sequence[str | Column], rows: Sequence[Sequence[Any]], title: str | None = None) -> None:
    """A table on stdout under a header line (and ``title``, wrapped, above it), fitted to :func:`table_width`:
    cells wrapped at spaces, else the lowest-priority columns left out with a note on stderr. Never cut."""
    specs = [column if isinstance(column, Column) else Column(column) for column in columns]
    shown, table, stream = _shown_cells(rows)
    headers = [shown(spec.name) for spec in specs]
    width = table_width(stream)
    layout = plan(headers, table, width, [i if spec.priority is None else spec.priority
                                          for i, spec in enumerate(specs)])
    colour = wants_colour(stream)
    if title is not None:
        _write_wrapped(stream, shown(title), text_width(stream), bold=colour)
    for line in render(headers, table, layout, bold=(lambda text: _BOLD + text + _RESET) if colour else str):
        stream.write(line + "\n")
    stream.flush()
    if layout.dropped:
        left_out = ", ".join(layout.dropped)
        _write_wrapped(sys.stderr, f"note: left out to fit {width} columns: {left_out} (a wider terminal or "
                                   f"--json shows them)", text_width(sys.stderr))
        sys.stderr.flush()


def print_fields(fields: Sequence[Sequence[Any]], title: str | None = None) -> None:
    """``name  value`` lines on stdout, names aligned (and ``title`` above them): a value too long for its line
    wraps at spaces under itself, and one with a word too long to sit beside the names goes whole onto the lines
    after its name, indented. Nothing is left out."""
    shown, table, stream = _shown_cells(fields)
    width = table_width(stream)
    if title is not None:
        _write_wrapped(stream, shown(title), text_width(stream), bold=wants_colour(stream))
    names = max((cells(name) for name, _ in table), default=0)
    room = None if width is None else width - GAP - names
    for name, value in table:
        if room is None or _longest_word(value) <= room:
            lines = render(None, [(name, value)], Layout((0, 1), (names, room or max(_widest_line(value), 1)), ()))
        else:
            lines = [name] + [" " * 2 * GAP + line for line in _wrap(value, width - 2 * GAP)]  # type: ignore[operator]
        stream.write("".join(line.rstrip() + "\n" for line in lines))
    stream.flush()


def _write_wrapped(stream: Any, text: str, width: int, indent: str = "", bold: bool = False) -> None:
    wrapped = textwrap.fill(text, width=width, initial_indent=indent, subsequent_indent=indent + "  ",
                            break_long_words=False, break_on_hyphens=False)
    stream.write((_BOLD + wrapped + _RESET if bold else wrapped) + "\n")


def print_wrapped(text: str, indent: str = "", stream: Any = None) -> None:
    """A sentence on ``stream`` (stdout by default), wrapped at :func:`text_width` (80 in a pipe), every line after
    ``indent`` and the lines after the first two spaces further in; a word longer than a line is never broken."""
    stream = sys.stdout if stream is None else stream
    _write_wrapped(stream, text, text_width(stream), indent)
    stream.flush()
