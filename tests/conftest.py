"""Shared fixtures: the real bundled models, an isolated cache/data dir for every test, an empty store,
simulated judge servers."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from kvjudge import models
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
