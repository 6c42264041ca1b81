"""Each benchmark's smallest run, shared by the two smoke files (tests/test_benchmarks_smoke.py: no model;
tests/test_benchmarks_smoke_model.py: the real model), so two test workers run them side by side.

A case is the script's arguments at its smallest size; "{out}" is a scratch directory of the test's own. Nothing
reads a figure: the child must exit 0 and print its one JSON line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"

SMOKE: dict[str, list[str]] = {
    "best_of_n": ["--tasks", "8", "--n", "4", "--repeats", "1", "--out", "{out}"],
    "evidence_retention": ["--runs", "2", "--counter", "tiktoken", "--out", "{out}"],
    "http_client": ["--pairs", "1", "--trials", "1", "--out", "{out}"],
    "ingest_throughput": ["--n", "3", "--small-n", "3", "--harness-n", "3", "--size-mb", "0.02", "--small-kb", "4",
                          "--run-mb", "0.02", "--out", "{out}"],
    "judge_pipeline": ["--n", "3", "--kb", "4", "--rounds", "1", "--parallel", "2", "--out", "{out}"],
    "judge_pool": ["--pairs", "1", "--smoke", "--out", "{out}"],
    "judge_protocols": ["--tasks", "4", "--no-model", "--out", "{out}"],
    "reduce_throughput": ["--tokens", "40000", "--run-tokens", "10000", "--counter", "tiktoken", "--target", "2000",
                          "--out", "{out}"],
    "runs_listing": ["--n", "10", "--size-kb", "4", "--out", "{out}"],
    "scale": ["--n", "1", "--ceiling", "2000", "--parallel", "2", "--out", "{out}"],
    "tier_throughput": ["--mb", "1", "--min-kb", "4", "--max-kb", "16", "--runs", "2", "--targets", "local",
                        "--rounds", "1", "--out", "{out}"],
}
# The real model, at the smallest sizes that still run it.
SMOKE_WITH_MODEL: dict[str, list[str]] = {
    "inflation": ["--turns", "2", "--max-reply-tokens", "4", "--n-ctx", "1024", "--out", "{out}"],
    "judge_servers": ["--smoke", "--out", "{out}"],
    "judge_throughput": ["--smoke", "--out", "{out}"],
    "judge_validity": ["--pairs", "1", "--context-target", "512", "--full-context", "1024", "--out", "{out}"],
    "probe_accuracy": ["--smoke", "--out", "{out}"],
}
# The system's headless Chromium loads the report.
SMOKE_WITH_BROWSER: dict[str, list[str]] = {
    "report_scale": ["--pairs", "2", "--agents", "2", "--words", "10", "--n-ctx", "1024", "--out", "{out}"],
}
# Benchmarks whose smoke runs live in their own test files.
SMOKED_ELSEWHERE = {"lab_store", "shared_work"}


def run_smoke(name: str, args: list[str], tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, str(BENCHMARKS / f"{name}.py"), *(a.format(out=out) for a in args)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    lines = done.stdout.strip().splitlines()
    assert lines, done.stderr[-2000:]
    assert isinstance(json.loads(lines[-1]), dict)
