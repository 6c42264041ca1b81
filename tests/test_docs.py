"""The repository's documents agree with its code: ARCHITECTURE.md's layers are the ones the layer test enforces,
every path it names exists and every part of kvjudge is named; the README's architecture statement states the same
layers; links resolve; tables stay readable; no document refers to one the repository does not contain."""

from __future__ import annotations

import re
from pathlib import Path

from test_architecture import LAYERS, PACKAGE

ROOT = PACKAGE.parent
ARCHITECTURE = ROOT / "ARCHITECTURE.md"
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
BENCHMARKS = sorted((ROOT / "benchmarks").glob("*.py"))
PACKAGE_FILES = ("__init__", "__main__")  # a package's own files: no layer of their own worth naming in prose

MAX_CELL = 200  # characters: a longer cell belongs in prose


def _section(text: str, heading: str) -> str:
    """The body of the ``## heading`` section (up to the next heading of level 2 or above)."""
    match = re.search(rf"^## {re.escape(heading)}\n(.*?)(?=^#{{1,2}} |\Z)", text, flags=re.S | re.M)
    assert match, f"no '## {heading}' section"
    return match.group(1)


def _table_rows(text: str) -> list[list[str]]:
    """The body rows of every Markdown table in ``text``, each as its cells (``\\|`` kept inside a cell)."""
    rows = []
    for line in text.splitlines():
        if line.startswith("|") and not re.fullmatch(r"\|(\s*:?-+:?\s*\|)+", line):
            rows.append([cell.strip() for cell in re.split(r"(?<!\\)\|", line.strip())[1:-1]])
    return rows


def _names(cell: str) -> set[str]:
    return set(re.findall(r"`([^`]+)`", cell))


def test_architecture_lists_the_layers_the_layer_test_enforces() -> None:
    rows = _table_rows(_section(ARCHITECTURE.read_text(), "Layers"))[1:]  # the header row is first
    assert [int(row[0]) for row in rows] == list(range(len(LAYERS)))
    assert [_names(row[1]) for row in rows] == LAYERS


def test_every_kvjudge_path_architecture_names_exists() -> None:
    paths = set(re.findall(r"`(kvjudge/[^`\s]*)`", ARCHITECTURE.read_text()))
    assert len(paths) > 30  # the parts, the data flow and the rules' homes
    # `kvjudge/retention/store` names the storage module or package, whichever form it has.
    missing = [p for p in sorted(paths) if not (ROOT / p).exists() and not (ROOT / f"{p}.py").exists()]
    assert missing == []


def test_architecture_names_every_top_level_part_of_kvjudge() -> None:
    named = {p.rstrip("/") for p in re.findall(r"`(kvjudge/[^`/\s]+/?)`", ARCHITECTURE.read_text())}
    parts = {f"kvjudge/{entry.name}" for entry in PACKAGE.iterdir()
             if entry.name != "__pycache__" and (entry.suffix == ".py" or entry.is_dir())}
    assert parts - named == set()


def test_readme_architecture_statement_states_the_layers_and_points_to_architecture_md() -> None:
    statement = _section(README.read_text(), "Architecture").strip()
    assert "\n\n" not in statement and len(statement.splitlines()) <= 8, "a short paragraph"
    assert "[ARCHITECTURE.md](ARCHITECTURE.md)" in statement
    chain = [_names(segment) for segment in statement.split("←")]
    assert chain == [layer - set(PACKAGE_FILES) for layer in LAYERS]


def test_relative_links_in_documents_resolve() -> None:
    broken = []
    for document in (README, ARCHITECTURE, *DOCS):
        for target in re.findall(r"\]\(([^)\s]+)\)", document.read_text()):
            path = target.split("#")[0]
            if path and not re.match(r"[a-z]+:", path) and not (document.parent / path).exists():
                broken.append(f"{document.relative_to(ROOT)} → {target}")
    assert broken == []


def test_table_cells_are_short() -> None:
    long_cells = [f"{document.relative_to(ROOT)}: {cell[:60]}… ({len(cell)} characters)"
                  for document in (README, ARCHITECTURE, *DOCS)
                  for row in _table_rows(document.read_text()) for cell in row if len(cell) > MAX_CELL]
    assert long_cells == []


def test_benchmarks_md_has_a_section_per_benchmark() -> None:
    text = (ROOT / "docs" / "benchmarks.md").read_text()
    sections = set(re.findall(r"^## `([^`]+\.py)`", text, flags=re.M))
    assert sections == {path.name for path in BENCHMARKS}
    headlines = _section(README.read_text(), "Benchmarks")
    assert "[docs/benchmarks.md](docs/benchmarks.md)" in headlines
    assert {path.name for path in BENCHMARKS} <= set(re.findall(r"`([a-z_]+\.py)`", headlines))


def test_no_benchmark_shadows_a_standard_module() -> None:
    # A script's own folder is first on sys.path: benchmarks/select.py once replaced the standard library's select
    # (and with it every socket server) in every other benchmark.
    import sys

    assert [path.name for path in BENCHMARKS if path.stem in sys.stdlib_module_names] == []


def test_no_document_refers_to_one_the_repository_does_not_contain() -> None:
    outside = re.compile(r"DESIGN\.md|seeds/|\bthe seed\b|\bseed's\b|contracts\.md", flags=re.I)
    sources = [README, ARCHITECTURE, *DOCS, ROOT / "Makefile", ROOT / "pyproject.toml",
               *PACKAGE.rglob("*.py"), *BENCHMARKS, *(ROOT / "scripts").iterdir(),
               *(path for path in (ROOT / "tests").rglob("*.py") if path.name != "test_docs.py")]
    found = [f"{path.relative_to(ROOT)}:{number}" for path in sources if path.is_file()
             for number, line in enumerate(path.read_text().splitlines(), 1) if outside.search(line)]
    assert found == []
