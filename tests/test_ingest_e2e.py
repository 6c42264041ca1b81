"""End to end on real agent runs: a directory of two agents' trajectories on the same SWE-bench instances plus
their summary reports → graded runs → ``reduce --all`` to a small ceiling → ``verify`` clean → ``judge --task``
pairs the two agents' runs, and the grades never reach the judge's prompt. The small default model (Gemma 3
270M, n_ctx 1024) runs the judge: this checks mechanics, not judgment quality."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import kvjudge, kvjudge_json

from kvjudge.judge import SCORED, Judge, LlamaBackend
from kvjudge.retention import Store
from kvjudge.testing.trajectories import make_episode, mini_swe_agent_v2, swe_agent

pytestmark = pytest.mark.model
N_CTX = 1024
INSTANCES = ("csvkit__csvkit-101", "csvkit__csvkit-202")
AGENTS = {"openai/gpt-4o": "mini-swe-agent", "anthropic/claude-3-5-sonnet": "swe-agent"}


def write_runs(root: Path) -> list[Path]:
    """Both agents' trajectories under their harness's folder layout, and one summary report per agent."""
    reports = []
    for number, (model, harness) in enumerate(AGENTS.items()):
        tag = model.replace("/", "__")
        for index, instance in enumerate(INSTANCES):
            episode = make_episode(instance, 10 * number + index, target_bytes=2_500, model=model)
            episode.steps = episode.steps[:3]  # short runs: the judge's skeleton must fit n_ctx 1024
            folder = root / tag / instance
            folder.mkdir(parents=True)
            if harness == "swe-agent":
                (folder / f"{instance}.traj").write_text(json.dumps(swe_agent(episode), indent=2))
            else:
                (folder / f"{instance}.traj.json").write_text(json.dumps(mini_swe_agent_v2(episode), indent=2))
        resolved = [INSTANCES[number]]  # each agent resolved a different instance
        report = root / f"{tag}.eval-1.json"
        report.write_text(json.dumps({"resolved_ids": resolved,
                                      "unresolved_ids": [i for i in INSTANCES if i not in resolved],
                                      "error_ids": [], "empty_patch_ids": [], "schema_version": 2}, indent=4))
        reports.append(report)
    return reports


def test_two_agents_graded_reduced_verified_and_judged(tmp_path: Path, default_model: Path,
                                                        capabilities: dict[int, Path]) -> None:
    reports = write_runs(tmp_path / "runs")
    store = str(tmp_path / "store.sqlite")
    config = tmp_path / "kvjudge.toml"
    config.write_text('[retention]\ncounter = "chars"\n')
    common = ["--store", store, "--config", str(config)]

    ingested = kvjudge_json("ingest", str(tmp_path / "runs"), *[a for r in reports for a in ("--results", str(r))],
                            *common)
    assert ingested["imported"] == 4 and ingested["states"] == {"graded": 4} and ingested["ignored_files"] == 2
    with Store.open(store) as opened:
        labels = {run_id: opened.runs.run(run_id).grades[0]["label"] for run_id in opened.runs.run_ids()}
    assert labels == {"anthropic/claude-3-5-sonnet/csvkit__csvkit-101": "unresolved",
                      "anthropic/claude-3-5-sonnet/csvkit__csvkit-202": "resolved",
                      "openai/gpt-4o/csvkit__csvkit-101": "resolved",
                      "openai/gpt-4o/csvkit__csvkit-202": "unresolved"}

    reduced = kvjudge_json("reduce", "--all", "--ceiling", "600", "--capabilities", str(capabilities[160_000]),
                           *common)
    assert len(reduced["runs"]) == 4 and reduced["refused"] == []
    assert all(run["tokens_before"] > 600 and run["appended"] > 0 and run["fits"] for run in reduced["runs"])
    assert kvjudge_json("verify", *common)["ok"]

    judged = kvjudge("judge", "--task", INSTANCES[0], "--model", str(default_model), "--n-ctx", str(N_CTX), "--json",
                     *common, timeout=900)
    assert judged.returncode == 0, judged.stderr
    *rows, tail = [json.loads(line) for line in judged.stdout.splitlines()]
    assert [(r["a"], r["b"]) for r in rows] == [("anthropic/claude-3-5-sonnet/csvkit__csvkit-101",
                                                 "openai/gpt-4o/csvkit__csvkit-101")]
    assert tail["summary"]["pairs"] == 1 and rows[0]["outcome"] in SCORED and "swe-bench" not in judged.stdout

    # What the judge reads of each run (the view it puts in the prompt): the run, never its grades.
    backend = LlamaBackend(model_path=default_model, n_ctx=N_CTX)
    try:
        with Store.open(store) as opened:
            for run_id in (rows[0]["a"], rows[0]["b"]):
                view = Judge(backend).pack(opened, run_id)
                assert view.text is not None and INSTANCES[0] in view.text and "Branch main" in view.text
                assert "swe-bench" not in view.text and "resolved" not in view.text and "Grades" not in view.text
    finally:
        backend.close()
