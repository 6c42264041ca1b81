"""The dependency rule of DESIGN.md, checked on the source: a package imports only from packages before it.

``tokens, server_client ← probe ← budget ← retention ← judge ← report ← demo / commands ← cli``, with the foundation modules (errors,
config, file writes, the bundled models, terminal display, the llama-cpp-python adapter) usable by all. Every import counts,
including the ones inside functions.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "kvjudge"
LAYERS = [
    {"errors", "config", "settings", "atomic", "models", "display", "_llama", "__init__"},
    {"tokens", "server_client"},
    {"probe"},
    {"budget"},
    {"retention"},
    {"judge"},
    {"report"},
    {"demo", "commands"},
    {"cli", "__main__"},
    {"testing"},  # test material (harness-shaped files, simulated servers): uses anything, used by nothing
]
LAYER_OF = {name: index for index, names in enumerate(LAYERS) for name in names}


def _part(path: Path) -> str:
    """The top-level part of kvjudge a source file belongs to (``probe`` for ``probe/kv_math.py``)."""
    relative = path.relative_to(PACKAGE)
    return relative.parts[0] if len(relative.parts) > 1 else relative.stem


def _kvjudge_imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else \
            [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else []
        found |= {name.split(".")[1] for name in names if name.startswith("kvjudge.")}
    return found


def test_every_part_of_kvjudge_has_a_layer() -> None:
    parts = {_part(path) for path in PACKAGE.rglob("*.py")}
    assert parts - set(LAYER_OF) == set()


def test_no_package_imports_one_after_it() -> None:
    upward = []
    for path in sorted(PACKAGE.rglob("*.py")):
        here = _part(path)
        for imported in _kvjudge_imports(path):
            if LAYER_OF[imported] > LAYER_OF[here] and LAYER_OF[here] > 0:
                upward.append(f"{path.relative_to(PACKAGE)} imports kvjudge.{imported}")
            if LAYER_OF[here] == 0 and imported not in LAYERS[0]:
                upward.append(f"{path.relative_to(PACKAGE)} (foundation) imports kvjudge.{imported}")
    assert upward == []


def test_budget_and_retention_take_plain_numbers_from_the_probe() -> None:
    # DESIGN: budget never imports probe types (the caller injects), retention takes the ceiling as a number.
    for part in ("budget", "retention"):
        for path in (PACKAGE / part).rglob("*.py"):
            assert "probe" not in _kvjudge_imports(path), path
