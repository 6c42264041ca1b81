"""What other packages add to kvjudge through entry points (run formats, judge backends): each entry point of a group
loaded, checked to be the kind of thing the group holds and to bring a name of its own; one that is not is one line,
never a traceback (a plugin's import error is its own, and must not stop kvjudge)."""

from __future__ import annotations

from importlib import metadata
from typing import Any, TypeVar

T = TypeVar("T")


def load_group(group: str, noun: str, kind: type[T], taken: set[str]) -> tuple[list[T], list[str]]:
    """The objects ``group``'s entry points name, in entry-point name order, and one problem line per entry point
    left out: it did not load, it is not a ``kind`` (each has a ``name``), or its name is in ``taken`` (which the
    loaded ones' names join). ``noun`` names the thing in those lines ("format", "judge backend")."""
    loaded: list[T] = []
    problems: list[str] = []
    for entry in sorted(metadata.entry_points(group=group), key=lambda e: e.name):
        said = f"{noun} {entry.name!r} ({entry.value})"
        try:
            found: Any = entry.load()
        except Exception as exc:  # a plugin's import error is its own: said in one line, never a traceback
            first = str(exc).splitlines()[0] if str(exc) else ""
            problems.append(f"{said} cannot be loaded: {type(exc).__name__}: {first}".rstrip(": "))
            continue
        if not isinstance(found, kind):
            problems.append(f"{said} is not a kvjudge {kind.__name__}")
        elif found.name in taken:
            problems.append(f"{said} reuses the name {found.name!r}: left out")
        else:
            taken.add(found.name)
            loaded.append(found)
    return loaded, problems
