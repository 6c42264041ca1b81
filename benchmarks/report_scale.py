"""The HTML report of a store of 500 pairs: file sizes, the time to write it, and how fast Chromium opens it.

A fresh store holds ``--agents`` agents' runs on enough tasks for ``--pairs`` same-task pairs (every run two tool
outputs of ``--words`` words). Their verdicts are written into the judgment cache through the judge's own packing
and keys (:mod:`kvjudge.testing.judgments`, the default model, window ``--n-ctx``), so ``kvjudge report`` reads
every verdict from the cache: what is timed is the report, not the model.

Measured: ``kvjudge report`` wall seconds (a child process, start-up and loading the model's weights for the window
included); the index's bytes, the pair pages' count, total, median and largest bytes; in the system's headless
Chromium (kvjudge.testing.browser), the index's load time (navigation start to the end of the load event) and the
time the "wrong only" filter takes over every row. Baseline, in the same run: the same report as one file — the
index with every pair page's body appended — loaded the same way; the ratio of the two load times is why the pair
pages are files of their own. Writes ``report_scale.json`` to ``--out`` and prints it as one JSON line.

    python benchmarks/report_scale.py --out /tmp/bench [--pairs 500] [--words 300] [--n-ctx 4096]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from kvjudge.judge import Judge, LlamaBackend, WindowPlanner
from kvjudge.models import default_model_path
from kvjudge.retention import Store, ingest_paths
from kvjudge.testing.browser import chromium, open_page
from kvjudge.testing.filler import filler
from kvjudge.testing.jsonl import write_jsonl
from kvjudge.testing.judgments import seed_judgments
from kvjudge.testing.native_runs import make_run

TARGET_LOAD_S = 2.0        # the index of 500 pairs opens within this
TARGET_RATIO = 1.0         # and faster than the one-file report (index / one file below this)
LOADS = 3                  # loads of each page; the median is reported


def _store(directory: Path, pairs: int, agents: int, words: int) -> tuple[Store, list[tuple[str, str]]]:
    per_task = agents * (agents - 1) // 2
    runs = []
    for task in range(math.ceil(pairs / per_task)):
        for agent in range(agents):
            seed = task * agents + agent
            passed = (seed * 7) % 3 != 0
            run = make_run(f"agent-{agent}/task-{task:03d}", [filler(2 * seed + 1, words), filler(2 * seed + 2, words)],
                           passed=passed, final="12 passed" if passed else "3 failed, 9 passed")
            run["task"]["id"] = f"task-{task:03d}"
            run["agent"] = f"agent-{agent}"
            runs.append(run)
    write_jsonl(directory / "runs.jsonl", runs)
    store = Store.open(directory / "store.sqlite")
    ingest_paths(store, [directory / "runs.jsonl"])
    ids = sorted(store.runs.run_ids())
    by_task: dict[str, list[str]] = {}
    for run_id in ids:
        by_task.setdefault(run_id.split("/")[1], []).append(run_id)
    chosen = [(a, b) for task in sorted(by_task) for i, a in enumerate(by_task[task]) for b in by_task[task][i + 1:]]
    return store, chosen


def _load_seconds(session: Any, page: Path) -> float:
    times = []
    for _ in range(LOADS):
        open_page(session, page)
        times.append(session.execute_script(
            "const t = performance.getEntriesByType('navigation')[0]; return (t.loadEventEnd - t.startTime) / 1000"))
    return statistics.median(times)


def _one_file(index: Path, pair_dir: Path, target: Path) -> int:
    """The whole report in one file: the index with every pair page's body appended (the baseline)."""
    bodies = []
    for page in sorted(pair_dir.iterdir()):
        html = page.read_text()
        bodies.append(html[html.index("<body>") + len("<body>"):html.rindex("</body>")])
    index_html = index.read_text()
    cut = index_html.rindex("</body>")
    target.write_text(index_html[:cut] + "\n".join(bodies) + index_html[cut:])
    return target.stat().st_size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--pairs", type=int, default=500)
    parser.add_argument("--agents", type=int, default=4)
    parser.add_argument("--words", type=int, default=300)
    parser.add_argument("--n-ctx", type=int, default=4096)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    model = default_model_path()
    with tempfile.TemporaryDirectory(prefix="kvjudge-report-bench-") as tmp:
        work = Path(tmp)
        store, pairs = _store(work, args.pairs, args.agents, args.words)
        with store:
            backend = LlamaBackend(model_path=model)
            try:
                judge = Judge(backend, planner=WindowPlanner(backend, requested=args.n_ctx, certify=False))
                started = time.perf_counter()
                seed_judgments(judge, store, {pair: (0.3 + 0.4 * ((i * 37) % 11) / 10, 0.35 + 0.3 * ((i * 13) % 7) / 6)
                                              for i, pair in enumerate(pairs)})
                seeded_s = time.perf_counter() - started
            finally:
                backend.close()
        index = args.out / "report_scale.html"
        started = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "kvjudge", "report", "--store", str(work / "store.sqlite"),
                               "--model", str(model), "--n-ctx", str(args.n_ctx), "--no-certify", "--out", str(index),
                               "--json"], capture_output=True, text=True)
        report_s = time.perf_counter() - started
        if done.returncode != 0:
            raise SystemExit(done.stderr)
        written = json.loads(done.stdout)
    pair_dir = Path(written["pair_dir"])
    sizes = [p.stat().st_size for p in pair_dir.iterdir()]
    one_file = args.out / "report_scale_one_file.html"
    one_file_bytes = _one_file(index, pair_dir, one_file)
    with chromium() as session:
        index_load = _load_seconds(session, index)
        rows = session.execute_script("return document.querySelectorAll('#pairs tbody tr').length")
        filter_s = session.execute_script(
            "const t0 = performance.now(); document.getElementById('only-wrong').click(); "
            "return (performance.now() - t0) / 1000")
        one_file_load = _load_seconds(session, one_file)
    ratio = index_load / one_file_load if one_file_load else None
    result = {
        "pairs": written["pairs"], "cached": written["cached"], "seed_seconds": round(seeded_s, 1),
        "report_seconds": round(report_s, 1), "index_bytes": written["index_bytes"],
        "pair_pages": len(sizes), "pair_bytes_total": sum(sizes), "pair_bytes_median": int(statistics.median(sizes)),
        "pair_bytes_max": max(sizes), "rows": rows, "index_load_seconds": round(index_load, 3),
        "filter_seconds": round(filter_s, 4), "one_file_bytes": one_file_bytes,
        "one_file_load_seconds": round(one_file_load, 3), "load_ratio": None if ratio is None else round(ratio, 3),
        "target": {"index_load_seconds": TARGET_LOAD_S, "load_ratio_below": TARGET_RATIO},
        "ok": index_load <= TARGET_LOAD_S and ratio is not None and ratio < TARGET_RATIO,
    }
    one_file.unlink()
    (args.out / "report_scale.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
