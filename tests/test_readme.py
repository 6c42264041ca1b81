"""The README's Python API example runs as written (on the fast default model, and the memory budget of a small
context: what it does does not depend on their sizes)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from kvjudge.budget.resolve import resolve_budget
from kvjudge.judge.verdict import OUTCOMES
from kvjudge.probe import memory_needed
from kvjudge.probe.cache import default_cache_path
from kvjudge.retention import Store
from kvjudge.retention.stored_tokens import run_tokens
from kvjudge.tokens import make_counter

README = Path(__file__).resolve().parent.parent / "README.md"


def _python_example() -> str:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert len(blocks) == 1, "the README has one Python API example"
    return blocks[0]


# The example's memory budget, and the context the test gives the default model instead: the example's 960 MiB gives
# the bundled judge model 3328 tokens; TEST_CONTEXT tokens of the default model hold a pair of the sample runs
# reduced to half of it (further reduced in the window, as the judge does), and judge in seconds.
EXAMPLE_BUDGET = '"probe.memory_budget": "960MiB"'
TEST_CONTEXT = 1024


@pytest.mark.model
def test_readme_python_example_runs(tmp_path: Path, default_model: Path, monkeypatch: pytest.MonkeyPatch,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    # The example uses the bundled judge model; the default model runs the same code faster, under the budget its
    # analytic probe gives TEST_CONTEXT tokens.
    import kvjudge.models

    monkeypatch.setattr(kvjudge.models, "judge_model_path", lambda fetch=True: default_model)
    example = _python_example()
    assert example.count(EXAMPLE_BUDGET) == 1, "the example names its memory budget as this test expects"
    example = example.replace(EXAMPLE_BUDGET, f'"probe.memory_budget": {memory_needed(default_model, TEST_CONTEXT)}')
    exec(compile(example, str(README), "exec"), {"__name__": "readme_example"})
    max_context, budget, outcome, pairs = capsys.readouterr().out.split()
    # The probe ran on the context chosen here and was cached as an estimate; the budget is what its figures give.
    [entry] = json.loads(default_cache_path().read_text())["entries"].values()
    assert int(max_context) == entry["max_context_tokens"] == TEST_CONTEXT and not entry["certified"]
    assert int(budget) == resolve_budget(None, entry["max_ok_input"], entry["safe_context"])[0]
    assert outcome in OUTCOMES and int(pairs) == 1  # clamp-range holds two runs: one pair
    # Every sample run is graded and reduced to its ceiling, half the context, as the chars counter counts it.
    with Store.open(tmp_path / "runs.sqlite") as store:
        states = list(store.runs.iter_runs())
        assert len(states) == 11 and {state.state for state in states} == {"graded"}
        assert max(run_tokens(store, state, make_counter("chars")) for state in states) <= TEST_CONTEXT // 2


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
