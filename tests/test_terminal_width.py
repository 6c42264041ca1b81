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
from helpers import kvjudge, store_from_runs

from kvjudge import models
from kvjudge.commands._output import print_table
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


def test_show_and_tier_fit_80_columns(store_path: Path, ceiling_args: list[str], tmp_path: Path) -> None:
    shown = kvjudge("show", LONG_IDS[0], "--store", str(store_path), env=_env())
    assert shown.returncode == 0, shown.stderr
    assert_fits(shown.stdout, f"run {LONG_IDS[0]}", "lifecycle running → grading → graded", "usage input_tokens=100")
    cold = tmp_path / "a-cold-directory-whose-name-takes-up-much-of-a-line"
    cold.mkdir()
    tiered = kvjudge("tier", "--all", "--to", cold.as_uri(), "--store", str(store_path), *ceiling_args, env=_env())
    assert tiered.returncode == 0, tiered.stderr
    assert_fits(tiered.stdout, *LONG_IDS, cold.as_uri(), "uploaded", "recovered")


def test_cache_show_and_models_fit_80_columns(capabilities: dict[int, Path], tmp_path: Path) -> None:
    cached = kvjudge("cache", "show", "--cache", str(capabilities[160_000]), env=_env())
    assert cached.returncode == 0, cached.stderr
    assert_fits(cached.stdout, str(capabilities[160_000]), "qwen2.5-coder-0.5b-instruct-q4.gguf", "max_ok_input",
                "160000", "fresh")
    fetched = kvjudge("models", "fetch", env=_env())
    assert fetched.returncode == 0, fetched.stderr
    assert_fits(fetched.stdout, str(models.judge_model_path()), str(models.default_model_path()))
    # A models directory (relative: its length is the test's to choose) whose judge model path is shorter than a
    # line but longer than a line less its label: the path is still printed whole, on a line of its own.
    where = Path("m" * (72 - len(models.JUDGE_MODEL_FILENAME) - 1))
    listed = kvjudge("models", "path", cwd=tmp_path, env={**_env(), "KVJUDGE_MODELS_DIR": str(where)})
    assert listed.returncode == 0, listed.stderr
    assert_fits(listed.stdout, str(where), str(where / models.JUDGE_MODEL_FILENAME),
                str(where / models.DEFAULT_MODEL_FILENAME))


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
        for argv, whole in ((["eval", "--png", str(tmp_path / "e.png")],
                             ("accuracy, ties ½ [95 %]", "accuracy, decisive [95 %]", "pos. consistency", "coverage",
                              "last-exit-zero", "label mass")),
                            (["rank", "--png", str(tmp_path / "r.png")],
                             ("mini-swe-agent__claude-sonnet-4-20250514", "95 % interval")),
                            (["judge", a, b], (a, b)),
                            (["select", "--picks", str(tmp_path / "picks.jsonl")],
                             ("pass rate [95 %]", "last exit 0", "mini-swe-agent__x/django__django-2")),
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
