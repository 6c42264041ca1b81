"""The main job end to end: `kvjudge demo` in a real child process, on the real default model."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
from helpers import DemoRun

from kvjudge.demo import sample_runs_path
from kvjudge.retention import Store


def test_sample_runs_are_realistic_and_over_the_ceiling() -> None:
    runs = [json.loads(line) for line in sample_runs_path().read_text().splitlines()]
    assert 8 <= len(runs) <= 12
    tasks = {run["task"]["id"] for run in runs}
    assert 3 <= len(tasks) <= 5
    verdicts = {run["verifier"][0]["passed"] for run in runs}
    assert verdicts == {True, False}
    assert any(b["status"] == "dead" for run in runs for b in run["branches"])
    biggest = max(len(json.dumps(run)) for run in runs)
    assert biggest > 16_000  # a run far over a demo ceiling of ~1k tokens
    outputs = [t["tool_output"]["output"] for run in runs for b in run["branches"] for t in b["transitions"]
               if "tool_output" in t]
    assert any("passed" in o and "pytest" not in o.split("\n")[0] for o in outputs)  # real pytest logs


@pytest.mark.model
def test_demo_end_to_end_on_two_runs(tmp_path: Path, demo_run: DemoRun) -> None:
    # The session's demo (conftest.py): two small runs of one task, one judged pair; --ceiling 512 reduces one.
    report = demo_run.report()
    out = demo_run.out
    assert json.loads((out / "report.json").read_text()) == report
    assert (out / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    probe = report["probe"]
    assert probe["certified"] and probe["max_ok_input"] <= probe["max_context_tokens"] + 256
    budget = report["budget"]
    assert budget["effective_ceiling"] == min(budget["configured_ceiling"], probe["max_context_tokens"] // 2) == 512
    assert budget["winner"] == "configured"  # --ceiling 512 is under max_context_tokens // 2 = 1024
    assert {r["id"] for r in report["runs"]} == {"clamp-1", "clamp-2"}
    assert all(r["tokens_after"] <= budget["effective_ceiling"] for r in report["runs"])
    assert [r["reduced"] for r in report["runs"]] == [False, True]  # only clamp-2 is over a 512-token ceiling

    judged = report["judge"]
    assert judged["full_cut_unjudged"] == []  # the full pair fits a window up to max_context_tokens
    (pair,) = judged["pairs"]
    for side in ("full", "reduced"):
        # A demo whose judge failed must fail: both sides scored, a real probability from each order.
        assert pair[side]["outcome"] in ("a", "b", "tie", "inconsistent"), pair[side]["error"]
        assert set(pair[side]["p_a_by_order"]) == {"ab", "ba"}
        assert all(0.0 < p < 1.0 for p in pair[side]["p_a_by_order"].values())
        assert 0.0 < pair[side]["p_a"] < 1.0 and pair[side]["manifest"]["show_verifier"] is False
    # The full side read the full runs uncut in a window sized to them; the reduced side read shorter views.
    assert not pair["full_cut"] and pair["views_differ"] and pair["compared"]
    tokens = pair["view_tokens"]
    assert tokens["reduced"]["a"] == tokens["full"]["a"] and tokens["reduced"]["b"] < tokens["full"]["b"]
    full_window, reduced_window = judged["full_window"], judged["reduced_window"]
    assert full_window["n_ctx"] <= probe["max_context_tokens"] and not full_window["cut"]
    assert reduced_window["n_ctx"] <= probe["safe_context"] and reduced_window["n_ctx"] < full_window["n_ctx"]
    assert judged["summary"]["compared"] == 1
    assert set(judged["versus_grades"]["reduced"]["baselines"]) == {"always_first", "longer_run", "last_exit_zero"}
    assert report["tier"]["read_back_identical"] and len(report["tier"]["runs"]) == 2
    assert report["verify"]["ok"] and report["verify"]["violations"] == []
    # The HTML report of the reduced side: its figures are the demo's own (its verdicts came from the cache).
    html = report["html"]
    assert html["index"] == str(out / "report.html") and html["pair_pages"] == 1
    assert 'id="views-differ"' not in (out / "report-pairs" / "0001.html").read_text()  # the views judged
    index = (out / "report.html").read_text()
    assert index.count("<td>tiered</td>") == 2  # the runs as they stand now: moved to the cold directory
    block = re.search(r'<script type="application/json" id="kvjudge-figures">(.*?)</script>', index, flags=re.S)
    page = json.loads(block.group(1))["eval"]
    assert {k: v for k, v in page.items() if k not in ("manifest", "window")} == judged["versus_grades"]["reduced"]

    with Store.open(out / "store.sqlite") as store:
        assert sorted(store.runs.run_ids()) == ["clamp-1", "clamp-2"]
        assert all(store.runs.run(r).state == "graded" for r in store.runs.run_ids())

    # Idempotent: a second run (into its own directory: the session's demo output stays as the first run left it)
    # reuses the certified cache entry and tells the same story.
    second = subprocess.run(demo_run.command(tmp_path / "again"), capture_output=True, text=True, env=demo_run.env)
    assert second.returncode == 0, second.stderr
    again = json.loads(second.stdout)
    assert again["probe"]["reused_cache_entry"] is True
    assert "reusing a fresh certified cache entry" in second.stderr and "certifying" not in second.stderr
    assert [r["tokens_after"] for r in again["runs"]] == [r["tokens_after"] for r in report["runs"]]
    assert again["judge"]["pairs"][0]["reduced"]["p_a"] == pair["reduced"]["p_a"]
