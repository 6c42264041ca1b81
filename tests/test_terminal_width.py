"""Human output at 80, 100 and 200 columns and in a pipe, as `kubectl get` and `git` print: plain columns, no box
rules, no placeholder headers, every value whole, a row a line where the values allow it (#38).

A run id is what a user copies into the next command, and a header that reads "accura…" says nothing, so the
check is on what reaches the terminal: every line within the width (unless it is one word longer by itself), no
ellipsis, no box-drawing characters, no "column 2", and each value whole — on one line, or wrapped at its spaces
with every piece starting in the same column on the lines that follow.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import kvjudge, store_from_runs

from kvjudge import models
from kvjudge.cli import build_parser, main
from kvjudge.commands._table import Column, plan, render
from kvjudge.testing.native_runs import make_run

WIDTHS = (80, 100, 200)
PIPE = None  # a pipe without COLUMNS: tables as wide as their values
LONG_IDS = ["mini-swe-agent__claude-sonnet-4-20250514/django__django-11099",
            "openhands__CodeActAgent__gpt-4o-2024-08-06/django__django-11099",
            "terminus-2__gpt-5/hello-world/hello-world__AbCdEfG"]
BOX = re.compile(r"[\u2500-\u257f]")  # box drawing: │ ┃ ─ ━ ┏ ╇ …
PLACEHOLDER = re.compile(r"\bcolumn \d+\b")


# ------------------------------------------------------------------------------------------- the checks
def _continues(lines: list[str], row: int, col: int, words: list[str]) -> bool:
    """``words`` read from column ``col`` of line ``row`` on: each line's piece starts at ``col`` and runs to the
    next gap of two spaces (the next column)."""
    rest = list(words)
    while rest and row < len(lines):
        line = lines[row]
        if col > 0 and line[col - 1:col] != " ":
            return False
        piece = line[col:].split("  ")[0].split()
        if not piece or piece != rest[:len(piece)]:
            return False
        rest = rest[len(piece):]
        row += 1
    return not rest


def shown_whole(text: str, value: str) -> bool:
    """``value`` is on one line, or wrapped in its cell, or (a sentence) wrapped across lines."""
    lines = text.splitlines()
    if any(value in line for line in lines):
        return True
    words = value.split()
    for row, line in enumerate(lines):
        col = line.find(words[0])
        while col >= 0:
            if _continues(lines, row, col, words):
                return True
            col = line.find(words[0], col + 1)
    return " ".join(words) in " ".join(text.split())


def assert_fits(text: str, width: int | None, *whole: str) -> None:
    assert "…" not in text and "..." not in text, text
    assert not BOX.search(text), f"box rules in:\n{text}"
    assert not PLACEHOLDER.search(text), f"a placeholder header in:\n{text}"
    assert "\x1b" not in text, "colour in a pipe"
    for line in text.splitlines():
        if width is not None and len(line) > width:  # only a word longer than the line by itself may overflow it
            assert len(line.split()) == 1, f"{len(line)} > {width}: {line!r}"
    for item in whole:
        assert shown_whole(text, str(item)), f"{item!r} is not whole in:\n{text}"


def test_the_checks_fail_on_what_they_are_for() -> None:
    table = "name  a value that\n      wraps here\nnext  x\n"
    assert shown_whole(table, "a value that wraps here")
    assert not shown_whole("name  a value th…\nnext  x\n", "a value that")  # a cut value
    assert not shown_whole("run   state\nabc   graded\n  def\n", "abc def")  # a piece out of its column
    with pytest.raises(AssertionError):
        assert_fits("x" * 81 + " y\n", 80)
    with pytest.raises(AssertionError):
        assert_fits("column 2  value\n", 80)
    with pytest.raises(AssertionError):
        assert_fits("┃ run ┃\n", 80)


# ------------------------------------------------------------------------------------------- running them
def run_human(width: int | None, *argv: str, capsys: pytest.CaptureFixture[str],
              monkeypatch: pytest.MonkeyPatch, code: int = 0) -> tuple[str, str]:
    """``kvjudge ARGV`` in this process (stdout is not a terminal) at ``COLUMNS=width`` (None: unset, as a pipe)."""
    if width is None:
        monkeypatch.delenv("COLUMNS", raising=False)
    else:
        monkeypatch.setenv("COLUMNS", str(width))
    monkeypatch.delenv("FORCE_COLOR", raising=False)
    capsys.readouterr()
    assert main(list(argv)) == code, capsys.readouterr().err
    captured = capsys.readouterr()
    return captured.out, captured.err


def run_json(*argv: str, capsys: pytest.CaptureFixture[str]) -> Any:
    capsys.readouterr()
    assert main([*argv, "--json"]) in (0, 1)
    return json.loads(capsys.readouterr().out.splitlines()[-1])


def piped(*argv: str, columns: int | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``kvjudge ARGV`` in a child whose stdout is a pipe (``COLUMNS`` unset unless given)."""
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "FORCE_COLOR")}
    if columns is not None:
        env["COLUMNS"] = str(columns)
    return kvjudge(*argv, env=env, cwd=cwd)


def _graded(run_id: str, task: str, passed: bool, agent: str, trial: str | None = None) -> dict:
    run = make_run(run_id, ["collected 3 items\n" + "x" * 300], passed=passed)
    run["task"]["id"] = task
    run["agent"] = agent
    if trial is not None:
        run["trial"] = trial
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


# ------------------------------------------------------------------------------------------- `kvjudge runs`
AGENTS = ["mini-swe-agent-gpt4o", "openhands-codeact-4o", "swe-agent-claude-4s1", "terminus-2-gpt-5-min"]
TASKS = [f"django__django-{1100 + n}" for n in range(30)]


@pytest.fixture(scope="module")
def many_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, list[str]]:
    """120 runs (4 agents × 30 tasks) whose ids are 40 characters long, and a config counting chars."""
    root = tmp_path_factory.mktemp("many")
    runs = [_graded(f"{agent}/{task}", task, n % 3 == 0, agent)
            for n, (agent, task) in enumerate((a, t) for a in AGENTS for t in TASKS)]
    ids = [run["id"] for run in runs]
    assert len(ids) == 120 and {len(run_id) for run_id in ids} == {40}
    store_from_runs(root / "store.sqlite", runs).close()
    config = root / "chars.toml"
    config.write_text('[retention]\ncounter = "chars"\n')
    return root / "store.sqlite", config, ids


@pytest.mark.parametrize("width", [*WIDTHS, PIPE])
def test_runs_lists_a_run_a_line(many_runs: tuple[Path, Path, list[str]], width: int | None) -> None:
    store, config, ids = many_runs
    done = piped("runs", "--store", str(store), "--config", str(config), columns=width)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 2 + len(ids), done.stdout  # the title, the header, then one line a run
    assert lines[0].startswith("120 run(s)") and lines[1].split()[0] == "run"
    assert sorted(line.split()[0] for line in lines[2:]) == sorted(ids)
    assert_fits(done.stdout, width, *ids)
    header = lines[1].split()
    if width is None or width >= 200:  # room for every column: nothing left out
        assert header == ["run", "agent", "task", "state", "grade", "tokens", "reduced"]
        assert "left out" not in done.stderr
        for agent, task in zip(AGENTS, TASKS):
            assert_fits(done.stdout, width, agent, task)
    else:
        # The lowest-priority columns go first (agent: the id spells it) and a note on stderr names them.
        assert "agent" not in header and {"run", "state", "grade", "tokens"} <= set(header)
        left_out = re.search(r"note: left out to fit (\d+) columns: ([^(]*)", " ".join(done.stderr.split()))
        assert left_out and int(left_out.group(1)) == width, done.stderr
        assert {name.strip() for name in left_out.group(2).split(",")} == \
            {"run", "agent", "task", "state", "grade", "tokens", "reduced"} - set(header)


def test_colour_only_on_a_terminal(many_runs: tuple[Path, Path, list[str]]) -> None:
    store, config, ids = many_runs
    master, slave = os.openpty()
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR")}
    env.update(COLUMNS="100", TERM="xterm-256color")
    child = subprocess.Popen([sys.executable, "-m", "kvjudge", "runs", "--store", str(store), "--config",
                              str(config)], stdout=slave, stderr=slave, stdin=subprocess.DEVNULL, env=env)
    os.close(slave)
    chunks = []
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    assert child.wait(timeout=60) == 0
    os.close(master)
    shown = b"".join(chunks).decode()
    assert "\x1b[1m" in shown  # the header in bold, on a terminal
    plain = re.sub(r"\x1b\[[0-9;]*m", "", shown).replace("\r\n", "\n")
    assert all(len(line) <= 100 for line in plain.splitlines())
    assert sum(line.split()[:1] == [run_id] for line in plain.splitlines() for run_id in ids) == len(ids)
    assert "\x1b" not in piped("runs", "--store", str(store), "--config", str(config)).stdout


# ------------------------------------------------------------------------------------------- store commands
@pytest.mark.parametrize("width", [*WIDTHS, PIPE])
def test_store_commands_fit(store_path: Path, ceiling_args: list[str], tmp_path: Path, width: int | None,
                            capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    store = ["--store", str(store_path)]
    # runs takes the config (chars counting), not --capabilities.
    out, _ = run_human(width, "runs", *store, *ceiling_args[2:], capsys=capsys, monkeypatch=monkeypatch)
    assert_fits(out, width, *LONG_IDS)
    assert len(out.splitlines()) == 2 + len(LONG_IDS)
    out, _ = run_human(width, "reduce", "--all", "--dry-run", "--ceiling", "5000", *store, *ceiling_args,
                       capsys=capsys, monkeypatch=monkeypatch)
    assert_fits(out, width, *LONG_IDS)
    out, _ = run_human(width, "verify", *store, capsys=capsys, monkeypatch=monkeypatch)
    assert_fits(out, width, "OK: 3 run(s)")
    out, _ = run_human(width, "show", LONG_IDS[0], *store, capsys=capsys, monkeypatch=monkeypatch)
    assert_fits(out, width, f"run {LONG_IDS[0]}", "lifecycle running → grading → graded", "usage input_tokens=100")
    cold = tmp_path / "a-cold-directory-whose-name-takes-up-much-of-a-line"
    cold.mkdir()
    out, _ = run_human(width, "tier", "--all", "--to", cold.as_uri(), *store, *ceiling_args, capsys=capsys,
                       monkeypatch=monkeypatch)
    assert_fits(out, width, *LONG_IDS, cold.as_uri(), "status", "bodies")
    out, _ = run_human(width, "rehydrate", LONG_IDS[2], *store, capsys=capsys, monkeypatch=monkeypatch)
    assert_fits(out, width, LONG_IDS[2], "rehydrated")


@pytest.mark.parametrize("width", [*WIDTHS, PIPE])
def test_key_values_fit_with_no_placeholder_headers(capabilities: dict[int, Path], ceiling_args: list[str],
                                                    default_model: Path, width: int | None, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    cache = str(capabilities[160_000])
    shown = run_json("cache", "show", "--cache", cache, capsys=capsys)
    out, _ = run_human(width, "cache", "show", "--cache", cache, capsys=capsys, monkeypatch=monkeypatch)
    [entry] = shown["entries"]
    assert_fits(out, width, cache, Path(entry["model_path"]).name, entry["fingerprint"][:12], "fresh",
                entry["max_context_tokens"], "max_ok_input")
    assert re.search(rf"^status +{entry['status']}$", out, flags=re.M)  # name and value side by side
    budget = run_json("budget", capsys=capsys)
    out, _ = run_human(width, "budget", capsys=capsys, monkeypatch=monkeypatch)
    assert_fits(out, width, budget["model"], budget["source"], budget["tokens"])
    assert re.search(rf"^budget \(tokens\) +{budget['tokens']}$", out, flags=re.M)
    ceiling = run_json("budget", "--ceiling", *ceiling_args, capsys=capsys)
    out, _ = run_human(width, "budget", "--ceiling", *ceiling_args, capsys=capsys, monkeypatch=monkeypatch)
    assert_fits(out, width, "hardware bound", "effective", ceiling["effective"], ceiling["hardware_bound"],
                f"max_context_tokens {ceiling['max_context_tokens']} // 2")
    probed = run_json("probe", "--no-certify", "--memory-budget", "1GiB", capsys=capsys)
    out, _ = run_human(width, "probe", "--no-certify", "--memory-budget", "1GiB", capsys=capsys,
                       monkeypatch=monkeypatch)
    figures = re.search(r"^max_context_tokens +(\d+) \(analytic", out, flags=re.M)
    assert figures and int(figures.group(1)) == probed["max_context_tokens"], out
    assert_fits(out, width, probed["model"]["sha256"][:16], "- (not certified)",
                *(device["name"] for device in probed["devices"]),
                f"weights {probed['footprint_at_max']['weights'] / 2**20:.2f} MiB")
    refreshed = run_json("cache", "refresh", capsys=capsys)["refreshed"]  # the probe's entry, just written
    out, _ = run_human(width, "cache", "refresh", capsys=capsys, monkeypatch=monkeypatch)
    assert refreshed and all(entry["result"] == "estimated" for entry in refreshed)
    assert_fits(out, width, *(entry["fingerprint"][:12] for entry in refreshed), "estimated", "fingerprint")
    # A path too long to sit beside its name goes whole onto the next line.
    where = Path("m" * (72 - len(models.JUDGE_MODEL_FILENAME) - 1))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KVJUDGE_MODELS_DIR", str(where))
    out, _ = run_human(width, "models", "path", capsys=capsys, monkeypatch=monkeypatch)
    assert_fits(out, width, str(where), str(where / models.JUDGE_MODEL_FILENAME))


def test_key_values_in_a_pipe_are_the_same_columns(capabilities: dict[int, Path], default_model: Path) -> None:
    done = piped("probe", "--no-certify", "--memory-budget", "1GiB")
    assert done.returncode == 0, done.stderr
    assert_fits(done.stdout, None, "max_context_tokens", "KV bytes per token")
    fields = [line for line in done.stdout.splitlines() if line.startswith(("max_ok_input", "safe_context"))]
    assert [line.split("  ")[0] for line in fields] == ["max_ok_input", "safe_context"]
    assert len({line.index("- (not") for line in fields}) == 1  # values aligned in one column
    cached = piped("cache", "show")
    assert cached.returncode == 0 and re.search(r"^status +fresh$|^status +mismatch$", cached.stdout, flags=re.M), \
        cached.stdout


# ------------------------------------------------------------------------------------------- judging commands
@pytest.fixture(scope="module")
def served_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, list[str], Path]]:
    from kvjudge.testing.graded_runs import swe_run, write_graded
    from kvjudge.testing.sim_judge import Settings, SimJudgeServer

    root = tmp_path_factory.mktemp("served")
    runs = [swe_run(f"{agent}/django__django-{n}", task=f"django__django-{n}", passed=(agent == "mini-swe-agent__x"),
                    seed=n, explore=1, file_lines=10)
            for n in range(3) for agent in ("mini-swe-agent__claude-sonnet-4-20250514", "mini-swe-agent__x")]
    runs_file, key = write_graded(root, runs)
    store = str(root / "store.sqlite")
    env = {**os.environ, "KVJUDGE_CACHE_DIR": str(root / "cache")}
    assert kvjudge("ingest", str(runs_file), "--store", store, env=env).returncode == 0
    with SimJudgeServer(key, Settings(accuracy=1.0)) as server:
        yield server.url, store, [run.run["id"] for run in runs], root / "cache"


@pytest.mark.parametrize("width", [*WIDTHS, PIPE])
def test_judging_commands_fit_against_a_served_judge(served_store: tuple[str, str, list[str], Path], tmp_path: Path,
                                                     width: int | None, capsys: pytest.CaptureFixture[str],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    url, store, ids, cache = served_store
    monkeypatch.setenv("KVJUDGE_CACHE_DIR", str(cache))
    probed = run_json("probe", "--server", url, capsys=capsys)
    out, _ = run_human(width, "probe", "--server", url, capsys=capsys, monkeypatch=monkeypatch)
    assert_fits(out, width, url, probed["server"]["model_id"], probed["max_context_tokens"], "served context")
    common = ["--server", url, "--store", store]
    a, b = ids[0], ids[1]
    out, _ = run_human(width, "eval", "--png", str(tmp_path / "e.png"), *common, capsys=capsys,
                       monkeypatch=monkeypatch)
    assert_fits(out, width, "always-first", "longer-run", "last-exit-zero", "pairs", "coverage",
                "accuracy, ties ½ [95 %]")
    assert re.search(r"^judge \((chat|raw)\) +3 +1\.00", out, flags=re.M), out
    if width is None or width >= 200:
        assert_fits(out, width, "accuracy, decisive [95 %]", "pos. consistency", "label mass", "inconsistent")
    ranking = run_json("rank", "--png", str(tmp_path / "r.png"), "--bootstrap", "20", *common, capsys=capsys)
    out, _ = run_human(width, "rank", "--png", str(tmp_path / "r.png"), "--bootstrap", "20", *common, capsys=capsys,
                       monkeypatch=monkeypatch)
    assert_fits(out, width, "95 % interval", *(agent["agent"] for agent in ranking["agents"]))
    out, _ = run_human(width, "judge", a, b, *common, capsys=capsys, monkeypatch=monkeypatch)
    assert_fits(out, width, f"{a} vs {b}", "summary", "position consistency", "prefix tokens saved")
    assert re.search(r"^pairs +1$", out, flags=re.M), out  # the summary: names and values, no header
    out, _ = run_human(width, "judge", "--task", "django__django-1", "--still-grades", "--reduce-to", "600",
                       *common, capsys=capsys, monkeypatch=monkeypatch)
    assert_fits(out, width, "agreement", "decisions lost (a winner became a tie or inconsistent)")


# ------------------------------------------------------------------------------------------- the renderer
def test_a_long_value_wraps_in_its_cell_and_a_column_is_left_out_only_when_wrapping_is_not_enough(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from kvjudge.commands._output import print_table

    problem = "the body's bytes do not hash to its ref: re-ingest the run or restore the body from a backup"
    monkeypatch.setenv("COLUMNS", "80")
    print_table(["check", "run", "problem"], [["rehash", LONG_IDS[0], problem]])
    out, err = capsys.readouterr()
    assert_fits(out, 80, LONG_IDS[0], problem)
    assert len(out.splitlines()) > 2 and err == ""  # wrapped, nothing left out
    print_table(["run", Column("tenant", priority=9), "state"], [[LONG_IDS[1], "a-tenant-of-a-long-name", "graded"]])
    out, err = capsys.readouterr()
    assert out.splitlines() == ["run" + " " * (len(LONG_IDS[1]) - 1) + "state", f"{LONG_IDS[1]}  graded"]
    assert "left out to fit 80 columns: tenant" in " ".join(err.split())


def test_plan_leaves_out_by_priority_and_never_the_first_column() -> None:
    headers = ["id", "a", "b"]
    rows = [["x" * 50, "y" * 20, "z" * 20]]
    assert plan(headers, rows, 80).dropped == ("b",)
    assert plan(headers, rows, 80, [0, 2, 1]).dropped == ("a",)
    assert plan(headers, rows, 30).kept == (0,)  # the first column stays, whole, even wider than the line
    assert render(headers, rows, plan(headers, rows, 30)) == ["id", "x" * 50]
    assert plan(headers, rows, PIPE).widths == (50, 20, 20)


# ------------------------------------------------------------------------------------------- --json everywhere
def _leaf_parsers(parser: Any) -> Iterator[tuple[str, Any]]:
    import argparse

    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                children = list(_leaf_parsers(sub))
                yield from ((f"{name} {child}".strip(), leaf) for child, leaf in children) if children else \
                    [(name, sub)]


def test_every_command_has_json() -> None:
    leaves = dict(_leaf_parsers(build_parser()))
    assert {"probe", "runs", "budget", "cache show", "cache refresh", "models path", "judge", "eval"} <= set(leaves)
    missing = [name for name, parser in leaves.items()
               if not any("--json" in action.option_strings for action in parser._actions)]
    assert missing == []
