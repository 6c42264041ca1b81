"""Best of N at scale: pass@pick and judge readings per strategy, and the selection harness's own time, linear in the
readings it makes.

``--tasks`` synthetic tasks of ``--n`` runs each (every run passes with ``--base-rate``: latent quality 1 for a pass,
0 for a fail) are picked from by each strategy of :mod:`kvjudge.judge.select` against a judge of known quality that
answers at once (:class:`kvjudge.testing.latent_judge.LatentJudge`: every reading sees the quality through fresh
N(0, σ²) noise). What is timed is the harness: :func:`~kvjudge.judge.select.select` and the selection table, less
the judge's own time inside its calls (measured around each call). Per strategy: pass@pick with its Wilson interval
beside random, first run and oracle, the gap closed, readings per task against the documented bound, seconds, and
microseconds per reading; then the same at a quarter and at four times the tasks, and the ratios of microseconds
per reading between neighbouring sizes (``ratio_up``: 4× over 1×, ``ratio_down``: 1× over ¼×; 1.0 is time linear
in the readings made). Each size is measured ``--repeats`` times and the fastest kept (milliseconds on a shared
machine are noisy; the minimum is the harness's own cost).

Prints one JSON line (and writes ``select.json`` to ``--out`` when given).

    python benchmarks/best_of_n.py [--tasks 500] [--n 16] [--sigma 0.8] [--base-rate 0.3] [--seed 0] [--repeats 5]
                                [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import random
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kvjudge.judge.candidates import Candidate
from kvjudge.judge.select import STRATEGIES, comparisons_bound, select
from kvjudge.judge.selection_table import selection_table
from kvjudge.testing.latent_judge import LatentJudge


class TimedJudge:
    """The latent judge with the seconds spent inside its calls (the judge's time, not the harness's)."""

    def __init__(self, judge: LatentJudge) -> None:
        self.judge = judge
        self.seconds = 0.0

    def score_runs(self, run_ids: Sequence[str]) -> dict[str, float | None]:
        started = time.perf_counter()
        try:
            return self.judge.score_runs(run_ids)
        finally:
            self.seconds += time.perf_counter() - started

    def compare(self, pairs: Sequence[tuple[str, str]]) -> list[float | None]:
        started = time.perf_counter()
        try:
            return self.judge.compare(pairs)
        finally:
            self.seconds += time.perf_counter() - started


def synthetic(tasks: int, n: int, base_rate: float, seed: int) -> tuple[dict[str, list[str]], dict[str, float]]:
    rng = random.Random(seed)
    runs = {f"task-{t:04d}": [f"task-{t:04d}/trial-{i}" for i in range(n)] for t in range(tasks)}
    quality = {run: float(rng.random() < base_rate) for ids in runs.values() for run in ids}
    return runs, quality


def measure(strategy: str, tasks: int, n: int, sigma: float, base_rate: float, seed: int) -> dict[str, Any]:
    runs, quality = synthetic(tasks, n, base_rate, seed)
    candidates = {task: [Candidate(run, task, "agent", None, quality[run], bool(quality[run]), 0, None)
                         for run in ids] for task, ids in runs.items()}
    judge = TimedJudge(LatentJudge(quality, sigma, seed=seed + 1))
    started = time.perf_counter()
    picks = select(runs, strategy, scorer=judge, comparator=judge)
    table = selection_table(picks, candidates)
    seconds = time.perf_counter() - started
    harness = seconds - judge.seconds
    rows = {row["name"]: row for row in table["rows"]}
    readings = table["spent"]["comparisons"]
    return {"tasks": tasks, "n": n, "pass_at_pick": rows["pick"]["rate"], "ci95": rows["pick"]["ci95"],
            "random": rows["random"]["rate"], "first_run": rows["first run"]["rate"],
            "oracle": rows["oracle"]["rate"], "gap_closed": table["gap_closed"],
            "readings": readings, "readings_per_task": table["spent"]["per_task_mean"],
            "bound_per_task": comparisons_bound(strategy, n), "judge_calls": judge.judge.calls,
            "harness_s": round(harness, 4), "judge_s": round(judge.seconds, 4),
            "us_per_reading": round(harness / readings * 1e6, 2)}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=500)
    parser.add_argument("--n", type=int, default=16, help="runs per task")
    parser.add_argument("--sigma", type=float, default=0.8, help="the judge's noise (quality gap of a pass: 1)")
    parser.add_argument("--base-rate", type=float, default=0.3, help="each run's chance of passing")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=5, help="measurements per size; the fastest is kept")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    result: dict[str, Any] = {"tasks": args.tasks, "n": args.n, "sigma": args.sigma, "base_rate": args.base_rate,
                              "repeats": args.repeats, "strategies": {}, "linearity": {}}
    sizes = (max(1, args.tasks // 4), args.tasks, args.tasks * 4)
    for strategy in STRATEGIES:
        runs = {size: min((measure(strategy, size, args.n, args.sigma, args.base_rate, args.seed + size)
                           for _ in range(args.repeats)), key=lambda m: m["harness_s"]) for size in sizes}
        result["strategies"][strategy] = runs[args.tasks]
        result["linearity"][strategy] = {
            "sizes": [{"tasks": size, "readings": m["readings"], "harness_s": m["harness_s"],
                       "us_per_reading": m["us_per_reading"]} for size, m in runs.items()],
            "ratio_up": round(runs[sizes[2]]["us_per_reading"] / runs[sizes[1]]["us_per_reading"], 3),
            "ratio_down": round(runs[sizes[1]]["us_per_reading"] / runs[sizes[0]]["us_per_reading"], 3)}
    line = json.dumps(result)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "select.json").write_text(line + "\n")
    print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
