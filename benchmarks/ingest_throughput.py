"""Ingest throughput on realistic trajectories, against a bare import of the same files measured in the same run.

``--n`` sets of trajectories (default 100 and 1000) are generated from ``--seed`` into a temp dir, about
``--size-mb`` MB each on average (sizes vary 0.3×–2×): mini-swe-agent v2 (tool calls) for most, v1 and SWE-agent
for the rest, over three model names on shared instances — each with the harness's own system prompt and
instance template (the same text in every run, stored once), and varied tool output (listings, source files,
grep hits, pytest logs, long outputs cut by the harness's warning).

For each set, in fresh child processes (each reports its own peak RSS, VmHWM, as it exits):

- **baseline**: ``json.load`` of each file, SHA-256 of every string value of 32 bytes or more (the bodies;
  roles, ids and timestamps are not) and one SQLite ``INSERT OR IGNORE`` per body into a content-addressed
  table, one commit per file (WAL, ``synchronous=FULL``, like the store) — the least an importer can do;
- **kvjudge**: ``kvjudge ingest DIR`` — both passes (check, then write in batches), events, projections.

Targets: kvjudge MB/s ≥ 0.5 × the baseline's; kvjudge's peak RSS at the largest N within 10 % of the smallest;
dedup savings reported. Writes ``ingest_throughput.json`` to ``--out`` and prints it as one line.

    python benchmarks/ingest_throughput.py --out /tmp/bench [--n 100 1000] [--size-mb 1.0]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from kvjudge.retention.ingest.synthetic import make_episode, mini_swe_agent_v1, mini_swe_agent_v2, swe_agent

MODELS = ("anthropic/claude-sonnet-4-5-20250929", "openai/gpt-5-mini", "hosted_vllm/qwen3-coder-30b")
# Bytes of tool output per byte of a written file, measured on make_episode's output (so files average
# --size-mb): v2 stores each output twice (the observation and extra.raw_output), SWE-agent too (trajectory and
# history); v1 cuts long outputs to their head and tail.
_OUTPUT_SHARE = {"v2": 0.66, "v1": 1.4, "swe": 0.63}


def generate(directory: Path, n: int, size_mb: float, seed: int) -> dict[str, Any]:
    """``n`` trajectories under ``directory/<model>/<instance>/``; their sizes."""
    rng = random.Random(seed)
    sizes = []
    for index in range(n):
        model = MODELS[index % len(MODELS)]
        instance = f"repo{index // len(MODELS) % 97}__proj-{index // len(MODELS)}"
        style = rng.choices(("v2", "v1", "swe"), weights=(6, 2, 2))[0]
        target = size_mb * 1e6 * rng.uniform(0.3, 1.7) * _OUTPUT_SHARE[style]
        episode = make_episode(instance, seed * 100_003 + index, target_bytes=int(target), model=model)
        folder = directory / model.replace("/", "__") / instance
        folder.mkdir(parents=True, exist_ok=True)
        if style == "swe":
            path, data = folder / f"{instance}.traj", swe_agent(episode)
        else:
            path = folder / f"{instance}.traj.json"
            data = mini_swe_agent_v2(episode) if style == "v2" else mini_swe_agent_v1(episode)
        path.write_text(json.dumps(data, indent=2))
        sizes.append(path.stat().st_size)
    return {"files": n, "bytes": sum(sizes), "mean_mb": round(sum(sizes) / n / 1e6, 3),
            "min_mb": round(min(sizes) / 1e6, 3), "max_mb": round(max(sizes) / 1e6, 3)}


def baseline(directory: Path, store: Path) -> dict[str, Any]:
    """json.load + SHA-256 + one INSERT per body, one commit per file (run in a child process)."""
    conn = sqlite3.connect(store, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("CREATE TABLE IF NOT EXISTS blobs (ref TEXT PRIMARY KEY, size INTEGER NOT NULL, body BLOB)")
    files = sorted(p for p in directory.rglob("*") if p.is_file())
    bodies = 0
    started = time.perf_counter()
    for path in files:
        with path.open("rb") as handle:
            data = json.load(handle)
        conn.execute("BEGIN IMMEDIATE")
        for text in _strings(data):
            body = text.encode("utf-8")
            if len(body) >= 32:
                ref = "sha256:" + hashlib.sha256(body).hexdigest()
                conn.execute("INSERT OR IGNORE INTO blobs(ref, size, body) VALUES (?, ?, ?)", (ref, len(body), body))
                bodies += 1
        conn.execute("COMMIT")
    seconds = time.perf_counter() - started
    conn.close()
    return {"seconds": seconds, "bodies": bodies}


def _strings(value: Any):
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            yield item
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


# Runs a Python child and reports its own peak RSS (VmHWM) on exit. Not wait4's ru_maxrss: Linux carries the
# parent's peak across fork and exec into it, so that figure would be this benchmark's own when it is larger.
_PEAK_WRAPPER = """
import atexit, runpy, sys
def report_peak():
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                sys.stderr.write("\\n" + _MARK + " " + line.split()[1] + "\\n")
atexit.register(report_peak)
if sys.argv[1] == "-m":
    sys.argv = sys.argv[2:]
    runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
else:
    sys.argv = sys.argv[1:]
    runpy.run_path(sys.argv[0], run_name="__main__")
"""
_PEAK_MARK = "benchmark-peak-rss-kb"


def child(argv: list[str]) -> tuple[dict[str, Any], float, float]:
    """Run ``argv`` (``python -m MODULE …`` or ``python SCRIPT …``) to completion: (its JSON output, wall
    seconds, its own peak RSS in MiB)."""
    started = time.perf_counter()
    wrapped = [argv[0], "-c", f"_MARK = {_PEAK_MARK!r}\n{_PEAK_WRAPPER}", *argv[1:]]
    process = subprocess.Popen(wrapped, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = process.communicate()
    seconds = time.perf_counter() - started
    if process.returncode != 0:
        raise SystemExit(f"{' '.join(argv[:4])} … failed ({process.returncode}): {err.strip()[-2000:]}")
    peaks = [line.split()[1] for line in err.splitlines() if line.startswith(_PEAK_MARK)]
    if not peaks:
        raise SystemExit(f"{' '.join(argv[:4])} … reported no peak RSS (this benchmark reads /proc: Linux only)")
    return json.loads(out.strip().splitlines()[-1]), seconds, int(peaks[-1]) / 1024


def measure(directory: Path, work: Path, gen: dict[str, Any]) -> dict[str, Any]:
    mb = gen["bytes"] / 1e6
    base, base_wall, base_rss = child([sys.executable, __file__, "--baseline-child", str(directory),
                                       str(work / "baseline.sqlite")])
    ours, wall, rss = child([sys.executable, "-m", "kvjudge", "ingest", str(directory), "--store",
                             str(work / "store.sqlite"), "--json"])
    return {
        **gen,
        "baseline": {"mb_per_s": round(mb / base["seconds"], 1), "seconds": round(base["seconds"], 2),
                     "bodies": base["bodies"], "peak_rss_mib": round(base_rss, 1)},
        # Wall time of the whole command (interpreter start and imports included: the user's wait).
        "kvjudge": {"mb_per_s": round(mb / wall, 1), "seconds": round(wall, 2), "peak_rss_mib": round(rss, 1),
                    "imported": ours["imported"], "dedup_saved_mb": round(ours["dedup"]["saved_bytes"] / 1e6, 1),
                    "body_mb": round(ours["dedup"]["body_bytes"] / 1e6, 1),
                    "stored_mb": round(ours["dedup"]["stored_bytes"] / 1e6, 1)},
        "ratio": round((mb / wall) / (mb / base["seconds"]), 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("bench-out"))
    parser.add_argument("--n", type=int, nargs="+", default=[100, 1000])
    parser.add_argument("--size-mb", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--baseline-child", nargs=2, metavar=("DIR", "DB"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.baseline_child:
        print(json.dumps(baseline(Path(args.baseline_child[0]), Path(args.baseline_child[1]))))
        return
    args.out.mkdir(parents=True, exist_ok=True)
    results = []
    for n in args.n:
        with tempfile.TemporaryDirectory(prefix="kvjudge-ingest-bench-") as temp:
            root = Path(temp)
            gen = generate(root / "runs", n, args.size_mb, args.seed)
            results.append(measure(root / "runs", root, gen))
    summary: dict[str, Any] = {"benchmark": "ingest_throughput", "size_mb": args.size_mb, "seed": args.seed,
                               "sets": results,
                               "min_ratio": min(r["ratio"] for r in results), "target_ratio": 0.5}
    if len(results) > 1:
        first, last = results[0]["kvjudge"]["peak_rss_mib"], results[-1]["kvjudge"]["peak_rss_mib"]
        summary["rss_growth"] = round(last / first - 1, 3)
        summary["target_rss_growth"] = 0.10
    (args.out / "ingest_throughput.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
