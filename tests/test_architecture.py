"""kvjudge's layer rule (ARCHITECTURE.md explains the layers), checked on the source: a package imports only from
packages before it.

``tokens, server_client ← probe ← budget ← retention ← judge ← target ← report ← demo / commands ← cli ← testing``,
with the foundation modules (errors, settings, file writes, the bundled models, terminal display, the llama-cpp-python
adapter) usable by all. Every import counts, including the ones inside functions. Module by module, inside every
subpackage too: no import cycle, and no module takes a name from a package that holds it. SQL stays in the store.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "kvjudge"
LAYERS = [
    {"errors", "settings", "atomic", "plugins", "models", "display", "_llama", "__init__"},
    {"tokens", "server_client"},
    {"probe"},
    {"budget"},
    {"retention"},
    {"judge"},
    {"target"},  # the judge target: where probe figures become the numbers budget and retention take
    {"report"},
    {"demo", "commands"},
    {"cli", "__main__"},
    {"testing"},  # test material (harness-shaped files, simulated servers): uses anything, used by nothing
]
LAYER_OF = {name: index for index, names in enumerate(LAYERS) for name in names}
STORE_PACKAGE = PACKAGE / "retention" / "store"
_SQL_TEXT = re.compile(r"\bSELECT\s.{0,300}?\bFROM\b|\bINSERT\s+(OR\s+\w+\s+)?INTO\b|\bUPDATE\s+\w+\s+SET\b|\bDELETE\s+FROM\b"
                       r"|\b(CREATE|DROP|ALTER)\s+(TABLE|INDEX|TRIGGER)\b|\bPRAGMA\s+\w+", re.DOTALL)
_SQL_CALLS = {"execute", "executemany", "executescript", "blobopen"}


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
    # budget never imports probe types (the caller injects), retention takes the ceiling as a number.
    for part in ("budget", "retention"):
        for path in (PACKAGE / part).rglob("*.py"):
            assert "probe" not in _kvjudge_imports(path), path


def test_settings_have_one_reader_and_the_judge_target_one_home() -> None:
    # Every setting is read through kvjudge.settings (no module parses kvjudge.toml itself), and the rules of the
    # judge target are decided in kvjudge/target.py: no command, the demo or the report opens capability entries.
    readers, lookups = [], []
    for path in sorted(PACKAGE.rglob("*.py")):
        source = path.read_text()
        if "tomllib" in source and path.name != "settings.py":
            readers.append(str(path.relative_to(PACKAGE)))
        if _part(path) in ("commands", "demo", "report") and any(
                name in source for name in ("lookup_served", "effective_ceiling(", "open_servers(", "LlamaBackend(")):
            lookups.append(str(path.relative_to(PACKAGE)))
    assert readers == [] and lookups == []
    assert "target" in _kvjudge_imports(PACKAGE / "demo.py")


def _module_graph() -> dict[str, set[str]]:
    """kvjudge's modules (``judge.verdict``; a package by its folder) → the modules they import, every import that
    runs counted (including the ones inside functions, not those only a type checker reads; importing ``a.b.c``
    also runs the packages ``a`` and ``a.b``)."""
    def name(path: Path) -> str:
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)

    modules = {name(path): path for path in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        imported: set[str] = set()
        tree = ast.parse(path.read_text(), str(path))
        # Imports only a type checker runs (``if TYPE_CHECKING:``) make no cycle when kvjudge runs.
        typing_only = {id(inner) for node in ast.walk(tree) if isinstance(node, ast.If)
                       and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING")
                       for statement in node.body for inner in ast.walk(statement)}
        for node in ast.walk(tree):
            if id(node) in typing_only:
                continue
            if isinstance(node, ast.Import):
                imported |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                imported |= {f"{node.module}.{alias.name}" for alias in node.names} | {node.module}
        targets = {name.removeprefix("kvjudge.") for name in imported if name.startswith("kvjudge.")}
        # Every package on the way to a module runs too (except the importer's own, already running).
        targets |= {".".join(t.split(".")[:i]) for t in targets for i in range(1, t.count(".") + 1)}
        graph[module] = {t for t in targets if t in modules and t != module and not module.startswith(t + ".")}
    return graph


def _import_cycles(graph: dict[str, set[str]]) -> set[frozenset[str]]:
    """The strongly connected components of ``graph`` with more than one module: each an import cycle."""
    reach = {}
    for start in graph:
        seen, todo = set(), [start]
        while todo:
            for following in graph[todo.pop()] - seen:
                seen.add(following)
                todo.append(following)
        reach[start] = seen
    return {frozenset(other for other in reach[module] if module in reach[other]) for module in graph
            if module in reach[module]}


# Import cycles allowed while their fix is under way: none today (the last, ingest/openhands.py <-> ingest/results.py,
# went with ingest/swebench.py). A new cycle fails, and so does an entry whose cycle is gone.
KNOWN_REMAINING_CYCLES: set[frozenset[str]] = set()


def test_the_module_graph_reads_every_subpackage() -> None:
    graph = _module_graph()
    assert {"judge.verdict", "retention", "retention.ingest.results", "retention.store.log"} <= set(graph)
    # judge/render.py imports kvjudge.retention.reduce and .state: those modules, and the package that runs first.
    assert graph["judge.render"] >= {"retention", "retention.reduce", "retention.state", "display"}
    assert _import_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == {frozenset("abc")}


def test_no_import_cycle_among_modules() -> None:
    # Module by module, inside every subpackage too: a cycle is a pair of jobs that cannot be read (or loaded)
    # one without the other.
    cycles = _import_cycles(_module_graph())
    assert cycles - KNOWN_REMAINING_CYCLES == set()
    assert KNOWN_REMAINING_CYCLES - cycles == set(), "a listed cycle is gone: remove it from KNOWN_REMAINING_CYCLES"


def test_no_module_takes_a_name_from_a_package_that_holds_it() -> None:
    # Upward, inside a subpackage: a module of retention/tiering/ asking kvjudge.retention (the package's front,
    # which imports the modules under it) for a name. It may import a sibling module by its path.
    def name(path: Path) -> str:
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)

    modules = {name(path) for path in PACKAGE.rglob("*.py")}
    upward = []
    for path in sorted(PACKAGE.rglob("*.py")):
        here = name(path)
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("kvjudge."):
                package = node.module.removeprefix("kvjudge.")  # type: ignore[union-attr]
                if here.startswith(package + ".") or (path.name != "__init__.py" and here == package):
                    upward += [f"{here} takes {alias.name} from kvjudge.{package}" for alias in node.names
                               if f"{package}.{alias.name}" not in modules]
    assert upward == []


def test_the_store_does_not_know_ingest() -> None:
    # The importer takes a store; the store names nothing of ingest, not even for a type checker.
    assert "retention.store" not in _module_graph()["retention.ingest.importer"]
    for path in STORE_PACKAGE.rglob("*.py"):
        assert "ingest" not in _kvjudge_imports_anywhere(path), path


def _kvjudge_imports_anywhere(path: Path) -> set[str]:
    """Every kvjudge module ``path`` names in an import, type-checking ones included (``retention.ingest``)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else \
            [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else []
        found |= {part for name in names if name.startswith("kvjudge.") for part in name.split(".")[1:]}
    return found


def _sql_in(path: Path) -> list[str]:
    """Where ``path`` talks to SQLite: imports sqlite3, calls execute/executemany/executescript/blobopen, or holds
    SQL text in a string."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import | ast.ImportFrom):
            names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            found += [f"{path.name}:{node.lineno} imports sqlite3" for name in names if name.split(".")[0] == "sqlite3"]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _SQL_CALLS:
            found.append(f"{path.name}:{node.lineno} calls {node.func.attr}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and _SQL_TEXT.search(node.value):
            found.append(f"{path.name}:{node.lineno} holds SQL {_SQL_TEXT.search(node.value).group(0)[:40]!r}")
    return found


def test_no_sql_outside_the_store_package() -> None:
    # The store's tables are its own business: every other module asks it a named question (Store, BlobStore,
    # BodyReaders), so a schema change stays inside kvjudge/retention/store/.
    outside = [hit for path in sorted(PACKAGE.rglob("*.py")) if STORE_PACKAGE not in path.parents
               for hit in _sql_in(path)]
    assert outside == []
    # The scan sees SQL where there is some: each kind of hit, in the package that may hold it.
    inside = [hit for path in sorted(STORE_PACKAGE.rglob("*.py")) for hit in _sql_in(path)]
    assert any("imports sqlite3" in hit for hit in inside)
    assert any("calls execute" in hit for hit in inside) and any("calls blobopen" in hit for hit in inside)
    assert any("holds SQL 'SELECT" in hit for hit in inside) and any("holds SQL 'CREATE TABLE" in hit for hit in inside)
