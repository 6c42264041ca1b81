"""Shared fixtures: the real bundled models, an isolated cache/data dir for every test, an empty store,
simulated judge servers, and one run of `kvjudge demo` for the whole session.

`make test` runs the suite in pytest-xdist workers (a test file each at a time), and each worker is a session of
its own. A session fixture that builds a slow artefact tests only read (the demo) goes through
:func:`shared_build.build_once`, so that one worker builds it and the others wait and read it; a session fixture
that starts a server (SeaweedFS in tests/seaweed.py) stays per worker: a server costs seconds, and its process
belongs to the worker that stops it."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
from helpers import DEMO_RUNS, DemoRun, demo_command
from postgres import postgres_server, postgres_url  # noqa: F401 (fixtures: the suite's one PostgreSQL server)
from shared_build import build_once

from kvjudge import models
from kvjudge.demo import sample_runs_path
from kvjudge.retention import Store
from kvjudge.testing.sim_judge import Settings as SimSettings
from kvjudge.testing.sim_judge import SimJudgeServer

# Resolve the bundled models once, before any test isolates the cache dir.
_MODELS_DIR = models.models_dir()
os.environ.setdefault("KVJUDGE_MODELS_DIR", str(_MODELS_DIR))


@pytest.fixture(autouse=True)
def isolated_dirs(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Each test gets its own cache and data dir, so no test reads another's capability cache or store."""
    root = tmp_path_factory.mktemp("kvjudge-home")
    monkeypatch.setenv("KVJUDGE_CACHE_DIR", str(root / "cache"))
    monkeypatch.setenv("KVJUDGE_DATA_DIR", str(root / "data"))
    monkeypatch.setenv("KVJUDGE_MODELS_DIR", str(_MODELS_DIR))
    monkeypatch.delenv("KVJUDGE_CONFIG", raising=False)
    monkeypatch.delenv("KVJUDGE_FAULTS", raising=False)
    monkeypatch.chdir(root)
    return root


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    """An empty store at ``tmp_path / "store.sqlite"``, closed after the test."""
    with Store.open(tmp_path / "store.sqlite") as opened:
        yield opened


STORE_KINDS = ("sqlite", "postgres")


@pytest.fixture(params=STORE_KINDS)
def store_at(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[str], str]:
    """Where a test's stores live, once per implementation: ``store_at(name)`` is a SQLite file's path in
    ``tmp_path``, or the URL of a fresh database on the session's PostgreSQL server (started only by a test that
    asks for it; the databases dropped after). For the crash tests, which run on both."""
    if request.param == "sqlite":
        return lambda name: str(tmp_path / f"{name}.sqlite")
    server = request.getfixturevalue("postgres_server")
    made: list[str] = []
    request.addfinalizer(lambda: [server.drop_database(name) for name in made])

    def database(name: str) -> str:
        made.append(server.new_database())
        return server.url(made[-1])

    return database


@pytest.fixture
def start_sim() -> Iterator[Callable[[Path, SimSettings], SimJudgeServer]]:
    """``start_sim(key, settings)``: a simulated judge server answering from ``key``, started now and stopped
    after the test."""
    with ExitStack() as started:
        yield lambda key, settings: started.enter_context(SimJudgeServer(key, settings))


@pytest.fixture(scope="session")
def default_model() -> Path:
    """The verified default model GGUF (Gemma 3 270M)."""
    return models.default_model_path()


@pytest.fixture(scope="session")
def judge_model() -> Path:
    """The verified default judge model GGUF (Qwen2.5-Coder-0.5B-Instruct)."""
    return models.judge_model_path()


@pytest.fixture(scope="session")
def capabilities(tmp_path_factory: pytest.TempPathFactory, judge_model: Path) -> dict[int, Path]:
    """Real capability cache files (the probe's own format) for the judge model on this device, with
    max_context_tokens set to a chosen figure (160 000 or 4 000): what `--capabilities FILE` reads."""
    from kvjudge.probe import CapabilityCache, ensure_capability

    root = tmp_path_factory.mktemp("caps")
    real = ensure_capability(judge_model, cache_path=root / "real.json", certify=False)
    files = {}
    for figure in (160_000, 4_000):
        path = root / f"cap-{figure}.json"
        CapabilityCache(path).put(dataclasses.replace(real, max_context_tokens=figure))
        files[figure] = path
    return files


@pytest.fixture
def ceiling_args(tmp_path: Path, capabilities: dict[int, Path]) -> list[str]:
    """Options giving `kvjudge tier` and `reduce` a ceiling: a probe figure for the judge model (max_context_tokens
    160 000, so min(200 000 configured, 80 000) = 80 000 tokens) and chars/4 counting (no tokenizer to load)."""
    config = tmp_path / "ceiling.toml"
    config.write_text('[retention]\ncounter = "chars"\n')
    return ["--capabilities", str(capabilities[160_000]), "--config", str(config)]


@pytest.fixture(scope="session")
def demo_run(tmp_path_factory: pytest.TempPathFactory, default_model: Path) -> DemoRun:
    """`kvjudge demo` on :data:`DEMO_RUNS` with the default model, run once for the test run (it takes minutes;
    under pytest-xdist the workers share it, see tests/shared_build.py): tests/test_demo.py checks its story,
    tests/test_report_browser.py opens its report; none changes its output directory."""

    def env_in(root: Path) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in ("KVJUDGE_CONFIG", "KVJUDGE_FAULTS")}
        env.update(KVJUDGE_CACHE_DIR=str(root / "cache"), KVJUDGE_DATA_DIR=str(root / "data"),
                   KVJUDGE_MODELS_DIR=str(_MODELS_DIR))
        return env

    def run_demo(root: Path) -> dict[str, Any]:
        runs_file = root / "runs.jsonl"
        runs_file.write_text("".join(line + "\n" for line in sample_runs_path().read_text().splitlines()
                                     if json.loads(line)["id"] in DEMO_RUNS))
        started = time.perf_counter()
        done = subprocess.run(demo_command(root / "out", runs_file, default_model), capture_output=True, text=True,
                              env=env_in(root), cwd=root)
        return {"returncode": done.returncode, "stdout": done.stdout, "stderr": done.stderr,
                "seconds": time.perf_counter() - started}

    root, made = build_once(tmp_path_factory, "demo", run_demo)
    done = subprocess.CompletedProcess(demo_command(root / "out", root / "runs.jsonl", default_model),
                                       made["returncode"], made["stdout"], made["stderr"])
    return DemoRun(out=root / "out", model=default_model, runs_file=root / "runs.jsonl", env=env_in(root),
                   done=done, seconds=made["seconds"])


# The slowest test files as measured (a two-worker run of the suite, 2026-12-06), started first: `make test`'s
# workers take files in collection order (--no-loadscope-reorder), and the run ends when the last file ends, so a
# long file begun last would keep one worker busy while the other waits. test_demo.py is left out on purpose: begun
# late, it finds the demo that test_report_browser.py had built (shared_build.py) instead of waiting for it. The
# order changes no test's outcome: a stale list costs time only. `pytest --durations=0` says which files to name.
SLOW_FILES_FIRST = (
    "test_judge_model.py",
    "test_report_browser.py",
    "test_judge_server.py",
    "test_probe_certify.py",
    "test_ingest_harnesses.py",
    "test_tier_faults.py",
    "test_judge_pool.py",
    "test_shared_work.py",
    "test_benchmarks_smoke_model.py",
    "test_gpu_check.py",
    "test_ingest_s3.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: number for number, name in enumerate(SLOW_FILES_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the rest keep their order
