"""`kvjudge runs` on a large store never waits for a tokenizer, nor decodes a run: its first listing against the
least a listing does.

Two agents × N/2 SWE-bench-shaped trajectories (mini-swe-agent v1 files of about 40 KB, from
:mod:`kvjudge.testing.trajectories`) are ingested into a fresh store; nothing has counted their tokens yet.
Then, each in a fresh child process:

- **kvjudge**: ``kvjudge runs --json`` — the whole command, start-up included: it lists every run from the
  projection's listing columns (one query, no run decoded) with the token counts the store already holds (none
  yet: ``-``) and says how many runs are not counted;
- **baseline**: ``Store.open`` and ``store.runs.listing()`` in a bare Python process — the one query any listing must
  make, without the command around it (so the ratio is what the command adds: start-up, the judge's counter, JSON);
- **fold**: ``Store.open`` and one pass over every folded run (``store.runs.iter_runs()``) in a bare Python process —
  what a listing read before the listing columns (3.67 s for ``runs`` against 1.83 s for this at N = 5,000);
- **counted**: ``kvjudge runs --json`` again after ``kvjudge runs --count`` with the chars/4 counter (every run
  counted: each run's tokens are one sum over stored counts, in the same query).

Before listing columns the first listing decoded every run, and before that it counted every body with the judge
model's tokenizer (161 s on 2,000 such runs on this 2-core machine). Target: the first ``runs`` over 5,000 runs in
≤ 2 s. Writes ``runs_listing.json`` to ``--out`` and prints it as one line.

    python benchmarks/runs_listing.py --out /tmp/bench [--n 5000] [--size-kb 40]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kvjudge.testing.trajectories import make_episode, mini_swe_agent_v1

_BARE = """
import sys, time
from kvjudge.retention import Store
started = time.perf_counter()
with Store.open(sys.argv[1]) as store:
    rows = store.runs.listing()
print(len(rows), time.perf_counter() - started)
"""

_FOLD = """
import sys, time
from kvjudge.retention import Store
started = time.perf_counter()
with Store.open(sys.argv[1]) as store:
    rows = [(s.id, s.agent, s.task_id, s.state, len(s.bodies)) for s in store.runs.iter_runs()]
print(len(rows), time.perf_counter() - started)
"""


def _write_runs(root: Path, n: int, size_kb: int) -> int:
    models = ("openai/gpt-4o", "anthropic/claude-sonnet-4-5")
    written = 0
    for index in range(n):
        episode = make_episode(f"repo__issue-{index // 2}", seed=index, target_bytes=size_kb * 1000,
                               model=models[index % 2])
        path = root / f"{index:05d}.traj.json"
        path.write_text(json.dumps(mini_swe_agent_v1(episode)))
        written += path.stat().st_size
    return written


# As installed: Python keeps its compiled modules (an environment that forbids that would time the compiler too).
_ENV = {key: value for key, value in os.environ.items() if key != "PYTHONDONTWRITEBYTECODE"}


def _timed(command: list[str]) -> tuple[float, subprocess.CompletedProcess[str]]:
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, check=False, env=_ENV)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command[:4])} failed: {done.stderr[-400:]}")
    return time.perf_counter() - started, done


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--n", type=int, default=5000)
    parser.add_argument("--size-kb", type=int, default=40)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch:
        root, store = Path(scratch) / "runs", Path(scratch) / "store.sqlite"
        root.mkdir()
        size = _write_runs(root, args.n, args.size_kb)
        _timed([sys.executable, "-m", "kvjudge", "--version"])  # compiles kvjudge's modules once, untimed
        ingest_s, _ = _timed([sys.executable, "-m", "kvjudge", "ingest", str(root), "--store", str(store), "--json"])
        listing_s, listed = _timed([sys.executable, "-m", "kvjudge", "runs", "--store", str(store), "--json"])
        bare_s, bare = _timed([sys.executable, "-c", _BARE, str(store)])
        fold_s, _ = _timed([sys.executable, "-c", _FOLD, str(store)])
        again_s, _ = _timed([sys.executable, "-m", "kvjudge", "runs", "--store", str(store), "--json"])
        chars = Path(scratch) / "chars.toml"
        chars.write_text('[retention]\ncounter = "chars"\n')
        counting = [sys.executable, "-m", "kvjudge", "runs", "--store", str(store), "--config", str(chars), "--json"]
        _timed([*counting, "--count"])
        counted_s, counted = _timed(counting)
    rows = json.loads(listed.stdout)
    result = {"benchmark": "runs_listing", "runs": len(rows), "mb": round(size / 1e6, 1),
              "ingest_s": round(ingest_s, 2), "runs_first_s": round(listing_s, 2), "runs_again_s": round(again_s, 2),
              "baseline_s": round(bare_s, 2), "baseline_listing_s": round(float(bare.stdout.split()[1]), 2),
              "fold_s": round(fold_s, 2), "runs_counted_s": round(counted_s, 2),
              "counted": sum(row["tokens"] is not None for row in json.loads(counted.stdout)),
              "ratio": round(listing_s / bare_s, 2), "uncounted": sum(row["tokens"] is None for row in rows),
              "said": listed.stderr.strip().splitlines()[-1:], "target_s": 2.0}
    (args.out / "runs_listing.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
