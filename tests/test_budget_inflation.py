"""The inflation benchmark's bookkeeping on a real two-turn session (a smoke run, not a measurement)."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest

BENCHMARK = Path(__file__).resolve().parents[1] / "benchmarks" / "inflation.py"


@pytest.mark.model
def test_inflation_benchmark_figures_follow_their_definitions(tmp_path: Path, default_model: Path,
                                                             capsys: pytest.CaptureFixture[str],
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    spec = importlib.util.spec_from_file_location("inflation_benchmark", BENCHMARK)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # dataclasses look their module up there
    spec.loader.exec_module(module)
    out = tmp_path / "out"
    assert module.main(["--out", str(out), "--turns", "3", "--max-reply-tokens", "6", "--n-ctx", "2048",
                        "--model", str(default_model)]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    data = json.loads((out / "inflation.json").read_text())
    assert data["summary"] == summary
    turns, texts = data["turns"], data["texts"]
    assert [t["turn"] for t in turns] == [1, 2, 3]
    # The default model has no chat template: the session renders ChatML, whose markup (not special tokens in
    # Gemma's vocabulary) the estimate counts per message with the model's own tokenizer.
    template = data["settings"]["template"]
    assert template["template"] == "chatml" and template["user"] > 5 and template["assistant"] > 5
    assert summary["estimation"] == f"chars/4+template:chatml(user {template['user']}, assistant " \
                                    f"{template['assistant']})"
    legacy = 0
    for turn, text in zip(turns, texts):
        assert turn["real"] == turn["prompt_tokens"] + turn["completion_tokens"]
        legacy += turn["prompt_tokens"] + turn["completion_tokens"]
        assert turn["legacy"] == legacy  # no pruning at this budget: the sum over every turn so far
        # anchored: the backend's report plus the reply as it counted it and the reply's markup, no earlier turn
        assert turn["anchored"] == turn["prompt_tokens"] + turn["completion_tokens"] + template["assistant"]
    for before, turn, text in zip(turns, turns[1:], texts[1:]):
        # the next prompt predicted: the figure after the last turn plus the new user message and its markup
        user = math.ceil(len(text["user"].encode()) / 4) + template["user"]
        assert turn["predicted_prompt"] == before["anchored"] + user
    assert turns[1]["prompt_tokens"] > turns[0]["real"] - turns[0]["completion_tokens"]  # history really sent
    assert summary["legacy_over_real_last"] > 1.5
    assert summary["prunes"] == 0 and summary["spurious_prunes"] == 0
    # The prune check rebuilds each prompt with the chat template: it must count what the backend counted.
    assert summary["rebuilt_prompt_matches_backend"] is True
    assert all(turn["prune_needed"] == 0 and turn["prune_needed_by_real"] == 0 for turn in turns)
    # The exact context of the kept history holds the prompt sent and the reply with its markup.
    assert all(turn["context"] > turn["real"] for turn in turns)
    assert (out / "inflation.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = (out / "inflation.md").read_text()
    assert "| 3 |" in table and "chars/4" in table and "model tokenizer" in table


def test_replaying_an_imported_run_follows_its_definitions(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from kvjudge.retention import Store, ingest_paths
    from kvjudge.testing.harbor import TrialSpec, write_job

    spec = importlib.util.spec_from_file_location("inflation_benchmark", BENCHMARK)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
    job = write_job(tmp_path / "jobs", "j", [TrialSpec("hello-world", seed=2, steps=4)])
    with Store.open(tmp_path / "s.sqlite") as store:
        [run_id] = ingest_paths(store, [job]).imported
        calls = [t.usage for t in store.runs.run(run_id).branches[0].transitions if t.usage]
    assert module.main(["--out", str(tmp_path / "out"), "--run", run_id, "--store", str(tmp_path / "s.sqlite")]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    rows = json.loads((tmp_path / "out" / "inflation-run.json").read_text())["turns"]
    # One turn per model call (the trial's four steps and its completion), the backend's counts as recorded.
    assert [(r["prompt_tokens"], r["completion_tokens"]) for r in rows] == [
        (u["input_tokens"], u["output_tokens"]) for u in calls] and len(rows) == 5
    assert rows[0]["predicted_prompt"] is None and all(r["predicted_prompt"] > 0 for r in rows[1:])
    # No template: after each call the anchored fullness is exactly its prompt plus its reply.
    assert all(r["anchored_after"] == r["prompt_tokens"] + r["completion_tokens"] for r in rows)
    assert summary["legacy_last"] == sum(r["prompt_tokens"] + r["completion_tokens"] for r in rows)
    assert summary["turns"] == 5 and summary["missing_bodies"] == 0
