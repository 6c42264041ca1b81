"""The main job end to end: `kvjudge demo` in a real child process, on the real default model."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvjudge.demo import sample_runs_path
from kvjudge.retention import Store


def test_sample_runs_are_realistic_and_over_the_ceiling() -> None:
    runs = [json.loads(line) for line in sample_runs_path().read_text().splitlines()]
    assert 8 <= len(runs) <= 12
    tasks = {run["task"]["id"] for run in runs}
    assert 3 <= len(tasks) <= 4
    verdicts = {run["verifier"][0]["passed"] for run in runs}
    assert verdicts == {True, False}
    assert any(b["status"] == "dead" for run in runs for b in run["branches"])
    biggest = max(len(json.dumps(run)) for run in runs)
    assert biggest > 16_000  # a run far over a demo ceiling of ~1k tokens
    outputs = [t["tool_output"]["output"] for run in runs for b in run["branches"] for t in b["transitions"]
               if "tool_output" in t]
    assert any("passed" in o and "pytest" not in o.split("\n")[0] for o in outputs)  # real pytest logs


@pytest.mark.model
def test_demo_end_to_end_on_two_runs(tmp_path: Path, default_model: Path) -> None:
    # Two small runs of one task keep this to one judged pair; the full sample is `make demo`.
    lines = [line for line in sample_runs_path().read_text().splitlines()
             if json.loads(line)["id"] in ("slug-1", "slug-2")]
    runs_file = tmp_path / "two.jsonl"
    runs_file.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out"
    command = [sys.executable, "-m", "kvjudge", "demo", "--out", str(out), "--runs", str(runs_file),
               "--model", str(default_model), "--context-target", "1024", "--judge-n-ctx", "1024", "--json"]
    first = subprocess.run(command, capture_output=True, text=True)
    assert first.returncode == 0, first.stderr
    report = json.loads(first.stdout)
    assert json.loads((out / "report.json").read_text()) == report
    assert (out / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    probe = report["probe"]
    assert probe["certified"] and probe["max_ok_input"] <= probe["max_context_tokens"] + 256
    budget = report["budget"]
    assert budget["effective_ceiling"] == min(budget["configured_ceiling"], probe["max_context_tokens"] // 2)
    assert budget["winner"] == "hardware"
    assert {r["id"] for r in report["runs"]} == {"slug-1", "slug-2"}
    assert all(r["tokens_after"] <= budget["effective_ceiling"] for r in report["runs"])
    assert any(r["reduced"] for r in report["runs"])  # slug-2 is over a 512-token ceiling
    (pair,) = report["judge"]["pairs"]
    for side in ("full", "reduced"):
        assert pair[side]["outcome"] in ("a", "b", "tie", "inconsistent", "overflow", "error")
        assert set(pair[side]["p_a_by_order"]) == {"ab", "ba"}
    assert report["tier"]["read_back_identical"] and len(report["tier"]["runs"]) == 2
    assert report["verify"]["ok"] and report["verify"]["violations"] == []

    with Store.open(out / "store.sqlite") as store:
        assert sorted(store.run_ids()) == ["slug-1", "slug-2"]
        assert all(store.run(r).state == "graded" for r in store.run_ids())

    # Idempotent: a second run reuses the certified cache entry and tells the same story.
    second = subprocess.run(command, capture_output=True, text=True)
    assert second.returncode == 0, second.stderr
    again = json.loads(second.stdout)
    assert again["probe"]["reused_cache_entry"] is True
    assert "reusing a fresh certified cache entry" in second.stderr
    assert [r["tokens_after"] for r in again["runs"]] == [r["tokens_after"] for r in report["runs"]]
    assert again["judge"]["pairs"][0]["reduced"]["p_a"] == pair["reduced"]["p_a"]
