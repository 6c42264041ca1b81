"""The best-of-N page: the selection table and, per task, its candidates, the run picked and why, and whether it
passed — rendered from what ``kvjudge select`` computed (:func:`kvjudge.judge.selection_table.selection_table` and
:func:`~kvjudge.judge.selection_table.pick_record`), never recomputed here.

The page is written as the report's pages are (:mod:`kvjudge.report.pages`): autoescaped templates, a
Content-Security-Policy that loads nothing and runs no script, one atomic write. The section itself is a template
macro (``selection.html``), so another page can show it too.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kvjudge.atomic import atomic_write
from kvjudge.errors import UsageError
from kvjudge.report.pages import csp, environment


def render_selection(result: Mapping[str, Any]) -> str:
    """The page of one selection: ``result`` is ``kvjudge select --json``'s object."""
    return environment().get_template("best_of_n.html").render(csp=csp(script=False), selection=result)


def check_selection_path(path: Path) -> Path:
    """Refuse a path that cannot take the page, before anything is judged."""
    path = Path(path)
    if path.is_dir() or path.suffix.lower() not in (".html", ".htm"):
        raise UsageError(f"--html {path} is not an .html file name; name the page's file (e.g. best-of-n.html)")
    return path


def write_selection(result: Mapping[str, Any], path: Path) -> Path:
    """Write the page to ``path`` (an .html file), atomically."""
    path = check_selection_path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, render_selection(result).encode("utf-8"))
    path.chmod(0o644)  # a page to read and share, not a private file
    return path
