"""The default locations, the models memo, and the CLI's error contract (one line, no traceback, non-zero exit)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvjudge.errors import ModelError
from kvjudge.models import file_sha256, resolve_model
from kvjudge.settings import cache_dir, data_dir


def test_dirs_follow_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVJUDGE_CACHE_DIR", str(tmp_path / "c"))
    monkeypatch.setenv("KVJUDGE_DATA_DIR", str(tmp_path / "d"))
    assert cache_dir() == tmp_path / "c"
    assert data_dir() == tmp_path / "d"


def test_file_sha256_is_memoised_and_follows_changes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVJUDGE_MODELS_DIR", str(tmp_path / "models"))
    path = tmp_path / "f.bin"
    path.write_bytes(b"abc")
    first = file_sha256(path)
    assert first == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    assert (tmp_path / "models" / "sha256.json").read_text().count(first) == 1
    path.write_bytes(b"abcd")
    os.utime(path, ns=(1, 2))
    assert file_sha256(path) != first
    with pytest.raises(ModelError, match="does not exist"):
        file_sha256(tmp_path / "missing")


def test_resolve_model_rejects_missing_and_directories(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="does not exist"):
        resolve_model(tmp_path / "x.gguf")
    with pytest.raises(ModelError, match="is a directory"):
        resolve_model(tmp_path)


def test_cli_prints_one_line_error_and_exits_non_zero() -> None:
    # Any KvjudgeError raised by a subcommand reaches the user as one line on stderr.
    result = subprocess.run(
        [sys.executable, "-c",
         "import sys; from kvjudge.cli import main; from kvjudge.errors import ConfigError\n"
         "import kvjudge.commands.models as m\n"
         "def boom(args): raise ConfigError('first line\\nsecond line')\n"
         "m._path = boom\n"
         "sys.exit(main(['models', 'path']))"],
        capture_output=True, text=True,
    )
    assert result.returncode == 1
    assert result.stderr == "kvjudge: error: first line second line\n"
    assert "Traceback" not in result.stderr


def test_cli_without_command_prints_help() -> None:
    result = subprocess.run([sys.executable, "-m", "kvjudge"], capture_output=True, text=True)
    assert result.returncode == 2
    assert "usage: kvjudge" in result.stdout


def test_a_listing_loads_no_judge_server_client_or_renderer(tmp_path: Path) -> None:
    # `kvjudge runs` reads the store and prints: the judge, the other commands, HTTP, rich and the report's
    # templates are not imported (start-up is most of a listing's time).
    from helpers import store_from_runs

    from kvjudge.testing.native_runs import make_run

    store_from_runs(tmp_path / "store.sqlite", [make_run("a/1", ["ok"]), make_run("b/1", ["fine"])]).close()
    heavy = ("kvjudge.judge", "kvjudge.report", "kvjudge.commands.eval", "httpx", "rich", "jinja2", "llama_cpp",
             "numpy")
    result = subprocess.run(
        [sys.executable, "-c",
         "import contextlib, io, sys; from kvjudge.cli import main\n"
         "with contextlib.redirect_stdout(io.StringIO()) as out:\n"
         f"    code = main(['runs', '--store', {str(tmp_path / 'store.sqlite')!r}, '--json'])\n"
         f"print(code, out.getvalue().count('\"id\"'), sorted(m for m in sys.modules if m.startswith({heavy!r})))"],
        capture_output=True, text=True, cwd=tmp_path)
    assert result.stdout.split(maxsplit=2) == ["0", "2", "[]\n"], result.stderr


def test_the_judging_commands_load_no_harness_parser() -> None:
    # eval and rank read runs already stored: getting runs in (every harness's parser) and grades after are not
    # imported with them.
    heavy = ("kvjudge.retention.ingest", "kvjudge.retention.late_grades")
    result = subprocess.run(
        [sys.executable, "-c", "import sys; from kvjudge.cli import build_parser\n"
         "build_parser('eval'); build_parser('rank')\n"
         f"print(sorted(m for m in sys.modules if m.startswith({heavy!r})))"], capture_output=True, text=True)
    assert result.stdout == "[]\n", result.stderr
    # Asked for by name, they are there.
    from kvjudge.retention import attach_grades, ingest_paths
    from kvjudge.retention.ingest import ingest_paths as ingest_paths_itself
    from kvjudge.retention.late_grades import attach_grades as attach_grades_itself

    assert ingest_paths is ingest_paths_itself and attach_grades is attach_grades_itself


def test_a_command_module_that_does_not_import_fails_the_cli_loudly(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    from kvjudge import cli

    package = tmp_path / "extra_commands"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "hello.py").write_text(
        "def register(subparsers):\n    subparsers.add_parser('hello', help='a command that imports fine')\n")
    (package / "broken.py").write_text("import kvjudge_missing_dependency\n\n"
                                       "def register(subparsers):\n    subparsers.add_parser('broken')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(cli, "COMMAND_MODULES", (*cli.COMMAND_MODULES, "extra_commands.hello"))
    with pytest.raises(SystemExit) as shown:
        cli.main(["--help"])
    assert shown.value.code == 0 and "a command that imports fine" in capsys.readouterr().out
    monkeypatch.setattr(cli, "COMMAND_MODULES", (*cli.COMMAND_MODULES, "extra_commands.broken"))
    with pytest.raises(ModuleNotFoundError, match="kvjudge_missing_dependency"):
        cli.main(["--help"])
    assert "broken" not in capsys.readouterr().out
