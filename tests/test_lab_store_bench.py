"""benchmarks/lab_store.py at its smallest size (``--small``): it starts its own real PostgreSQL server, runs every
step on both stores and prints one JSON line of ratios measured in that run, with what each step did."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_lab_store_benchmark_runs_small_and_reports_every_ratio(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "lab_store.py"), "--small", "--out",
                           str(tmp_path / "out"), "--work", str(tmp_path / "work")],
                          capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 1
    result = json.loads(lines[0])
    assert result == json.loads((tmp_path / "out" / "lab_store.json").read_text())
    steps = result["steps"]
    # Every step did its work on both stores: the runs ingested and listed, the pairs evaluated.
    for kind in ("sqlite", "postgresql"):
        assert steps[kind]["ingest"]["runs"] == result["runs_ingested"] == 2
        assert steps[kind]["runs"]["runs"] == result["listing_runs"] == 20
        assert steps[kind]["eval_cached"]["s"] > 0
    for ratio in ("ingest_ratio", "runs_ratio", "eval_cached_ratio"):
        assert result[ratio] > 0 and isinstance(result["met"][ratio], bool)
    copies = result["copy_mb_per_s"]
    assert copies["listing_to_postgresql"]["runs_copied"] == 20
    assert copies["sqlite_to_postgresql"]["runs_copied"] == copies["postgresql_to_sqlite"]["runs_copied"] == 2
    assert copies["sqlite_to_postgresql"]["bytes"] == copies["postgresql_to_sqlite"]["bytes"] > 0
    bodies = result["bodies"]
    assert bodies["bodies"] > 0 and bodies["size_median"] <= bodies["size_p90"] <= bodies["size_max"]
    assert bodies["bytea_write_ratio"] > 0 and bodies["bytea_read_ratio"] > 0
