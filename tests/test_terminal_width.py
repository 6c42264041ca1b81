"""Human output on an ordinary 80-column terminal: tables fit or switch to one record per row; nothing is cut.

A run id is what a user copies into the next command, and a header that reads "accura…" says nothing, so the
check is on what reaches the terminal: every line within 80 columns (unless one word is longer by itself), no
ellipsis anywhere, and every id and header whole.
"""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest
from helpers import kvjudge, make_verdict, store_from_runs

from kvjudge.commands import eval as eval_command
from kvjudge.commands import rank as rank_command
from kvjudge.commands._output import print_table
from kvjudge.judge.evaluate import evaluate
from kvjudge.judge.ranking import rank
from kvjudge.testing.native_runs import make_run

WIDTH = 80
LONG_IDS = ["mini-swe-agent__claude-sonnet-4-20250514/django__django-11099",
            "openhands__CodeActAgent__gpt-4o-2024-08-06/django__django-11099",
            "terminus-2__gpt-5/hello-world/hello-world__AbCdEfG"]


def assert_fits(text: str, *whole: str) -> None:
    assert "…" not in text and "..." not in text, text
    for line in text.splitlines():
        if len(line) > WIDTH:  # only a single word longer than the terminal may overflow it
            assert max(len(word) for word in re.split(r"[\s│┃]+", line)) > WIDTH - 4, line
    flat = re.sub(r"\s*\n\s*", "", text)
    for item in whole:
        assert item in text or item in flat, f"{item!r} is not whole in:\n{text}"


def _graded(run_id: str, task: str, passed: bool, agent: str) -> dict:
    run = make_run(run_id, ["collected 3 items\n" + "x" * 300], passed=passed)
    run["task"]["id"] = task
    run["agent"] = agent
    run["grades"] = [{"grader": "human", "score": 1.0 if passed else 0.0}]
    return run


@pytest.fixture
def store_path(tmp_path: Path) -> Path:
    path = tmp_path / "store.sqlite"
    runs = [_graded(LONG_IDS[0], "django__django-11099", True, "mini"),
            _graded(LONG_IDS[1], "django__django-11099", False, "openhands"),
            _graded(LONG_IDS[2], "hello-world", True, "terminus")]
    store_from_runs(path, runs).close()
    return path


def _env() -> dict[str, str]:
    import os

    return {**os.environ, "COLUMNS": str(WIDTH), "TERM": "xterm-256color"}


@pytest.mark.parametrize("argv", [
    ["runs"],
    ["reduce", "--all", "--dry-run", "--ceiling", "5000"],
    ["verify"],
])
def test_store_commands_fit_80_columns(store_path: Path, ceiling_args: list[str], argv: list[str]) -> None:
    extra = ceiling_args if argv[0] == "reduce" else []
    done = kvjudge(*argv, "--store", str(store_path), *extra, env=_env())
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert_fits(done.stdout, *(LONG_IDS if argv[0] in ("runs", "reduce") else []))


def test_budget_and_ceiling_fit_80_columns(ceiling_args: list[str]) -> None:
    done = kvjudge("budget", "--ceiling", *ceiling_args, env=_env())
    assert done.returncode == 0, done.stderr
    assert_fits(done.stdout, "hardware bound", "effective")


def _capture(print_fn, *args) -> str:
    import contextlib
    import os

    buffer = io.StringIO()
    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(WIDTH)
    try:
        with contextlib.redirect_stdout(buffer):
            print_fn(*args)
    finally:
        if old is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = old
    return buffer.getvalue()


def test_eval_and_rank_tables_fit_80_columns(store_path: Path) -> None:
    from kvjudge.retention import Store

    verdicts = [make_verdict(LONG_IDS[0], LONG_IDS[1], "a", 0.8, 0.7)]
    with Store.open(store_path) as store:
        result = evaluate(store, verdicts)
    result["manifest"] = {"model": "/models/qwen2.5-coder-0.5b-instruct-q4.gguf"}
    text = _capture(eval_command._print, {"chat": result})
    assert_fits(text, "accuracy, ties ½ [95 %]", "accuracy, decisive [95 %]", "pos. consistency", "coverage",
                "last-exit-zero", "label mass", result["conclusion"].split(":")[0])
    ranking = rank(verdicts, lambda run_id: run_id.split("/")[0], bootstrap=20)
    assert_fits(_capture(rank_command._print, ranking), "mini-swe-agent__claude-sonnet-4-20250514",
                "95 % interval")


def test_judging_commands_fit_80_columns_against_a_served_judge(tmp_path: Path) -> None:
    from kvjudge.testing.graded_runs import swe_run, write_graded
    from kvjudge.testing.sim_judge import Settings, SimJudgeServer

    runs = [swe_run(f"{agent}/django__django-{n}", task=f"django__django-{n}", passed=(agent == "mini-swe-agent__x"),
                    seed=n, explore=1, file_lines=10)
            for n in range(3) for agent in ("mini-swe-agent__claude-sonnet-4-20250514", "mini-swe-agent__x")]
    runs_file, key = write_graded(tmp_path, runs)
    store = str(tmp_path / "store.sqlite")
    assert kvjudge("ingest", str(runs_file), "--store", store).returncode == 0
    with SimJudgeServer(key, Settings(accuracy=1.0)) as server:
        assert kvjudge("probe", "--server", server.url).returncode == 0
        common = ["--server", server.url, "--store", store]
        a, b = runs[0].run["id"], runs[1].run["id"]
        for argv, whole in ((["eval", "--png", str(tmp_path / "e.png")], ("accuracy, ties ½ [95 %]", "last-exit-zero")),
                            (["rank", "--png", str(tmp_path / "r.png")], ("mini-swe-agent__claude-sonnet-4-20250514",)),
                            (["judge", a, b], (a, b)),
                            (["judge", "--task", "django__django-1", "--still-grades", "--reduce-to", "600"],
                             ("agreement",))):
            done = kvjudge(*argv, *common, env=_env())
            assert done.returncode == 0, done.stderr
            assert_fits(done.stdout, *whole)


def test_a_wide_table_becomes_records_and_a_narrow_one_stays_a_table() -> None:
    wide = _capture(print_table, ["run", "tenant", "state", "tokens", "reduced", "branches", "transitions"],
                    [[LONG_IDS[0], "default", "graded", 123456, "yes", 1, 57]], "1 run(s)")
    assert_fits(wide, LONG_IDS[0], "transitions")
    assert wide.splitlines()[1] == f"run: {LONG_IDS[0]}"
    narrow = _capture(print_table, ["run", "state"], [["a", "graded"]], "1 run(s)")
    assert "┃" in narrow and "run: a" not in narrow
