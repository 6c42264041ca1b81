"""A judge-pool install: ``pip install kvjudge`` without the ``local`` extra, into a fresh virtual environment, with
no C compiler and binary wheels only — then the whole pool-only flow through a server (the simulated judge on
127.0.0.1): ingest, count through the server's ``/tokenize``, reduce, eval, score, select, report. Neither
llama-cpp-python nor the bundled default model's package is there, and a command that needs in-process inference
says in one line which extra to install.

The install resolves every dependency afresh against the package index (PyPI), as a user's would: kvjudge is built
into a wheel from this checkout, then installed with its dependencies, ``--only-binary :all:`` and a compiler that
always fails (``CC=false``) making any dependency that would build from source fail the install. The installer is uv
(``pip install uv`` into the test's scratch, from pip's cache): on the 2-core machine pip took 19 s quiet and 46 s
to 110 s loaded (a third of it resolving, most of the rest unpacking 330 MB of wheels); uv, its own install and the
wheel build included, 7 s quiet and 15 s to 26 s loaded (~/.cache/uv: the same wheels, linked into the venv).
uv reads no pip configuration: PyPI alone, no local wheel directory or constraints file.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvjudge.testing.graded_runs import GradedRun, swe_run, write_graded
from kvjudge.testing.sim_judge import Settings, SimJudgeServer

ROOT = Path(__file__).resolve().parents[1]
LOCAL_EXTRA = "pip install 'kvjudge[local]'"


def _tree_bytes(root: Path) -> int:
    return sum(path.stat().st_size for path in root.rglob("*") if path.is_file() and not path.is_symlink())


@pytest.fixture(scope="module")
def pool_python(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The Python of a fresh venv holding ``pip install kvjudge`` (this checkout, no extra)."""
    scratch = tmp_path_factory.mktemp("pool-install")
    venv = scratch / "venv"
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--target",
                    str(scratch / "uv"), "uv"], check=True, capture_output=True, timeout=600)
    uv = str(scratch / "uv" / "bin" / "uv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    # kvjudge's wheel, built from this checkout (the one sdist-to-wheel build; every dependency a binary wheel).
    built = subprocess.run([uv, "build", "--wheel", "--quiet", "--out-dir", str(scratch / "dist"), str(ROOT)],
                           capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stderr[-3000:]
    [wheel] = (scratch / "dist").glob("kvjudge-*.whl")
    install = subprocess.run([uv, "pip", "install", "--quiet", "--python", str(python), "--only-binary", ":all:",
                              str(wheel)],
                             env={**os.environ, "CC": "false", "CXX": "false"}, capture_output=True, text=True,
                             timeout=600)
    assert install.returncode == 0, install.stderr[-3000:]
    seconds = time.perf_counter() - started
    print(f"\npool install: {seconds:.0f} s, {_tree_bytes(venv) / 1e6:.0f} MB")
    yield python


def _kvjudge(python: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(python), "-m", "kvjudge", *args], capture_output=True, text=True, timeout=300)


def _kvjudge_json(python: Path, *args: str) -> object:
    done = _kvjudge(python, *args, "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _runs() -> list[GradedRun]:
    """Three tasks of two trials each, one resolved and one not."""
    return [swe_run(f"task-{task}/trial-{trial}", task=f"task-{task}", passed=trial == task % 2, seed=task,
                    explore=1, file_lines=12) for task in range(3) for trial in range(2)]


def test_a_pool_install_has_no_in_process_inference_and_says_which_extra_in_one_line(
        pool_python: Path, tmp_path: Path, default_model: Path) -> None:
    found = subprocess.run([str(pool_python), "-c", "import importlib.metadata as m, importlib.util as u; "
                            "print(u.find_spec('llama_cpp') is None, sorted(d.metadata['Name'].lower() for d in "
                            "m.distributions() if d.metadata['Name'].lower().startswith(('llama', 'gemma'))))"],
                           capture_output=True, text=True, check=True)
    assert found.stdout.split(None, 1) == ["True", "[]\n"]
    runs_file, _ = write_graded(tmp_path, _runs())
    store = tmp_path / "store.sqlite"
    _kvjudge_json(pool_python, "ingest", str(runs_file), "--store", str(store))
    before = store.read_bytes()
    stored = ["--store", str(store)]
    for command in (["judge", "--task", "task-0", *stored], ["eval", *stored], ["runs", "--count", *stored],
                    ["reduce", "--all", *stored], ["probe", "--model", str(default_model)], ["demo"]):
        done = _kvjudge(pool_python, *command)
        errors = [line for line in done.stderr.splitlines() if line.startswith("kvjudge: error:")]
        assert done.returncode != 0 and "Traceback" not in done.stderr and done.stdout == "", (command, done.stderr)
        assert len(errors) == 1 and LOCAL_EXTRA in errors[0], (command, done.stderr)
    assert store.read_bytes() == before  # nothing written


def test_a_pool_install_does_the_whole_job_through_a_server(pool_python: Path, tmp_path: Path) -> None:
    runs = _runs()
    runs_file, key = write_graded(tmp_path, runs)
    store = tmp_path / "store.sqlite"
    sent: list[str] = []
    with SimJudgeServer(key, Settings(accuracy=1.0, seed=3), prompts=sent) as server:
        assert _kvjudge_json(pool_python, "ingest", str(runs_file), "--store", str(store))["imported"] == 6
        assert _kvjudge_json(pool_python, "probe", "--server", server.url)["certified"]
        # Counting: `runs --count` with the judge server named in the settings, through its /tokenize.
        config = tmp_path / "pool.toml"
        config.write_text(f'[judge]\nserver = "{server.url}"\n')
        asked = len(sent)
        listed = _kvjudge_json(pool_python, "runs", "--count", "--config", str(config), "--store", str(store))
        assert len(listed) == 6 and all(isinstance(row["tokens"], int) and row["tokens"] > 0 for row in listed)
        assert len(sent) > asked  # the bodies went to the server's tokenizer
        ceiling = min(row["tokens"] for row in listed) - 100
        reduced = _kvjudge_json(pool_python, "reduce", "--all", "--server", server.url, "--store", str(store),
                                "--ceiling", str(ceiling))
        assert reduced["counter"].startswith("server:") and all(run["fits"] for run in reduced["runs"])
        assert sum(run["appended"] for run in reduced["runs"]) > 0
        common = ["--server", server.url, "--store", str(store)]
        evaluated = _kvjudge_json(pool_python, "eval", *common, "--png", str(tmp_path / "eval.png"))
        figures = evaluated["templates"]["raw"]["judge"]
        assert (figures["pairs"], figures["scored"]) == (3, 3)
        scored = _kvjudge(pool_python, "score", *common, "--json")  # one JSON line per run
        assert scored.returncode == 0, scored.stderr
        *per_run, summary = [json.loads(line) for line in scored.stdout.splitlines()]
        assert [score["outcome"] for score in per_run] == ["scored"] * 6 and "summary" in summary
        picked = _kvjudge_json(pool_python, "select", *common, "--picks", str(tmp_path / "picks.jsonl"))
        assert {pick["task"] for pick in picked["picks"]} == {"task-0", "task-1", "task-2"}
        report = _kvjudge_json(pool_python, "report", *common, "--out", str(tmp_path / "report.html"))
        assert report["pairs"] == 3 and (tmp_path / "report.html").stat().st_size > 0
