"""The README's Python API example runs as written (on the fast default model, two small runs and the memory
budget of a small context: what it does does not depend on their sizes)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from kvjudge.probe import memory_needed
from kvjudge.probe.cache import default_cache_path
from kvjudge.testing.jsonl import write_jsonl
from kvjudge.testing.native_runs import make_run

README = Path(__file__).resolve().parent.parent / "README.md"


def _python_example() -> str:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert len(blocks) == 1, "the README has one Python API example"
    return blocks[0]


# The example's memory budget, and the context the test gives the default model instead: the example's 960 MiB would
# have it certify a 3840-token context (the bundled judge model gets 3328 from it), its probe's longest step; the
# judged pair of two small runs needs a window of 512 tokens, well inside a 1024-token context's safe_context.
EXAMPLE_BUDGET = '"probe.memory_budget": "960MiB"'
TEST_CONTEXT = 1024


@pytest.mark.model
def test_readme_python_example_runs(tmp_path: Path, default_model: Path, monkeypatch: pytest.MonkeyPatch,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    # Finished, not yet graded (the example grades them), as the sample runs are.
    runs = [make_run("fixed", ["collected 12 items\n12 passed"], passed=True, lifecycle=("running",)),
            make_run("broken", ["collected 12 items\nFAILED test_quote"], passed=False, final="1 failed, 11 passed",
                     lifecycle=("running",))]
    for run in runs:
        run["task"]["id"] = "fix-csv"
    write_jsonl(tmp_path / "runs.jsonl", runs)
    monkeypatch.chdir(tmp_path)
    # The example uses the bundled judge model; the default model runs the same code faster, under the budget its
    # probe certifies TEST_CONTEXT tokens with.
    import kvjudge.models

    monkeypatch.setattr(kvjudge.models, "judge_model_path", lambda fetch=True: default_model)
    example = _python_example()
    assert example.count(EXAMPLE_BUDGET) == 1, "the example names its memory budget as this test expects"
    budget = memory_needed(default_model, TEST_CONTEXT)
    example = example.replace(EXAMPLE_BUDGET, f'"probe.memory_budget": {budget}')
    exec(compile(example, str(README), "exec"), {"__name__": "readme_example"})
    outcome, p_a = capsys.readouterr().out.split()
    assert outcome in ("a", "b", "tie", "inconsistent")
    assert 0.0 <= float(p_a) <= 1.0
    # The probe ran on the context chosen here: the example certified it and judged within its safe_context.
    [entry] = json.loads(default_cache_path().read_text())["entries"].values()
    assert entry["certified"] and entry["max_context_tokens"] == TEST_CONTEXT


def _section(heading: str) -> str:
    match = re.search(rf"^## {re.escape(heading)}\n(.*?)(?=^## |\Z)", README.read_text(), flags=re.S | re.M)
    assert match, f"the README has a '## {heading}' section"
    return match.group(1)


def test_quick_start_is_the_two_make_commands() -> None:
    blocks = re.findall(r"```\n(.*?)```", _section("Quick start"), flags=re.S)
    assert blocks and blocks[0].split("\n")[:-1] == ["make demo", "make test"]
    makefile = (README.parent / "Makefile").read_text()
    assert re.search(r"^demo:", makefile, flags=re.M) and re.search(r"^test:", makefile, flags=re.M)


def test_cli_table_has_one_line_per_command() -> None:
    from kvjudge.cli import COMMAND_MODULES

    rows = re.findall(r"^\| `kvjudge (\w+)", _section("CLI"), flags=re.M)
    assert rows == [module.rsplit(".", 1)[1] for module in COMMAND_MODULES]


def test_configuration_example_is_valid_and_names_every_setting() -> None:
    import dataclasses
    import tomllib

    from kvjudge.settings import Settings

    section = _section("Configuration")
    example = re.findall(r"```toml\n(.*?)```", section, flags=re.S)
    assert len(example) == 1
    Settings.from_mapping(tomllib.loads(example[0]))  # every key known, every value in range

    def fields(cls: type) -> set[str]:
        names = set()
        for field in dataclasses.fields(cls):
            names.add(field.name)
            if dataclasses.is_dataclass(field.default_factory if callable(field.default_factory) else None):
                names |= fields(field.default_factory)
        return names - {"source", "tenants"}

    assert {name for name in fields(Settings) if not re.search(rf"\b{name}\b", section)} == set()
