"""One job shared by 1, 2 and 4 processes: ``kvjudge score --protocol pointwise`` started N times at once on one
store, each claiming a run before sending its readings, against one simulated pool replica whose calls take
``--latency`` seconds (50 ms: a GPU's time per call; calls in flight overlap, as a batching server's do).

For each N, on a fresh copy of the ingested store (nothing cached): the job's throughput in calls per second, two
ways — end to end (from starting the processes to the last one's exit: start-up included) and while the calls flow
(the replica's calls counted every 20 ms, from its first call of the job to its last) — and its ratio to one
process's (target: ≥ 3.5× at 4); the pool's call count against the job's calls (target: equal); the workers' CPU
per call (start-up included) and the simulated pool's (its replica answers from this process's threads, under one
interpreter lock: on a machine of few cores it, not the claims, bounds the calls per second first). Then 4 processes
again with one killed with SIGKILL once it has finished a run and holds others: the calls the pool answered again
(at most the killed worker's claimed runs' readings) and the seconds lost against the 4 processes undisturbed
(a killed worker's runs wait for its leases to expire: ``--lease``).

One JSON line; a PNG of throughput against processes (``--out``). ``--smoke``: the smallest job (a test runs it).

    python -m benchmarks.shared_work [--runs 96] [--latency 0.05] [--lease 2] [--out DIR] [--smoke]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from kvjudge.testing.graded_runs import swe_run, write_graded
from kvjudge.testing.sim_judge import AnswerKey, Settings
from kvjudge.testing.sim_replica import ReplicaSettings, SimReplica

TARGET_SPEEDUP_AT_4 = 3.5
CRITERIA = 3  # the default rubric's: a run's readings at K = 1
PROCESSES = (1, 2, 4)


def _kvjudge(*args: str, env: dict[str, str], out: Path) -> subprocess.Popen[bytes]:
    """``kvjudge ARGS`` in a child writing to files (``out``.stdout, .stderr): a worker waiting for others while
    its own output fills a pipe no one reads yet would never finish."""
    with open(out.with_suffix(".stdout"), "wb") as stdout, open(out.with_suffix(".stderr"), "wb") as stderr:
        return subprocess.Popen([sys.executable, "-m", "kvjudge", *args], env=env, stdout=stdout, stderr=stderr)


class _CallClock:
    """The replica's answered calls sampled every 20 ms: when the job's first and last calls were answered."""

    def __init__(self, replica: SimReplica) -> None:
        self.replica, self.samples = replica, [(time.perf_counter(), replica.usage["calls"])]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.wait(0.02):
            self.samples.append((time.perf_counter(), self.replica.usage["calls"]))

    def stop(self) -> tuple[int, float]:
        """(calls answered, seconds from the first to the last)."""
        self._stop.set()
        self._thread.join()
        self.samples.append((time.perf_counter(), self.replica.usage["calls"]))
        start = self.samples[0][1]
        moved = [(t, n) for t, n in self.samples if n > start]
        if not moved:
            return 0, 0.0
        first = max(t for t, n in self.samples if n == start)  # the last sample before the first answer
        return moved[-1][1] - start, moved[-1][0] - first


def _held_by(store: Path, pid: int) -> tuple[int, int]:
    try:
        with sqlite3.connect(f"file:{store}?mode=ro", uri=True) as conn:
            rows = conn.execute("SELECT worker, done, finished_by FROM claims").fetchall()
    except sqlite3.OperationalError:
        return 0, 0
    mark = f":{pid}:"
    return (sum(1 for _, _, by in rows if by and mark in by),
            sum(1 for worker, done, _ in rows if not done and worker and mark in worker))


def _job(template: Path, work: Path, replica: SimReplica, processes: int, args: argparse.Namespace,
         env: dict[str, str], *, kill: bool = False) -> dict[str, Any]:
    store = work / f"store-{processes}{'-kill' if kill else ''}.sqlite"
    shutil.copyfile(template, store)
    command = ["score", "--protocol", "pointwise", "--server", replica.url, "--store", str(store), "--parallel",
               str(args.parallel), "--lease", str(args.lease), "--timeout", str(args.lease), "--json"]
    clock = _CallClock(replica)
    cpu_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    pool_before = resource.getrusage(resource.RUSAGE_SELF)
    started = time.perf_counter()
    logs = [store.with_name(f"{store.stem}-{index}") for index in range(processes)]
    workers = [_kvjudge(*command, env=env, out=log) for log in logs]
    killed, claimed = None, 0
    while kill and killed is None:
        for worker in workers:
            done, held = _held_by(store, worker.pid)
            if done and held and worker.poll() is None:
                os.kill(worker.pid, signal.SIGKILL)
                worker.wait()
                killed, claimed = worker, _held_by(store, worker.pid)[1]
                break
        else:
            if all(w.poll() is not None for w in workers):
                raise SystemExit("every worker finished before one could be killed: raise --runs")
            time.sleep(0.01)
    for worker in workers:
        worker.wait()
    wall = time.perf_counter() - started
    cpu_after = resource.getrusage(resource.RUSAGE_CHILDREN)
    pool_after = resource.getrusage(resource.RUSAGE_SELF)  # the replica serves from this process's threads
    pool_cpu = (pool_after.ru_utime - pool_before.ru_utime) + (pool_after.ru_stime - pool_before.ru_stime)
    cpu = (cpu_after.ru_utime - cpu_before.ru_utime) + (cpu_after.ru_stime - cpu_before.ru_stime)
    outputs = [(log.with_suffix(".stdout").read_text(), log.with_suffix(".stderr").read_text()) for log in logs]
    calls, flowing = clock.stop()
    for worker, (_out, err) in zip(workers, outputs):
        if worker is not killed and worker.returncode != 0:
            raise SystemExit(f"a worker failed: {err.strip()[-400:]}")
    jobs = [json.loads(out.splitlines()[-1])["summary"]["job"] for w, (out, _) in zip(workers, outputs)
            if w is not killed]
    job_calls = jobs[0]["cost"]["calls"]
    return {"processes": processes, "wall_seconds": round(wall, 3), "calls": calls, "job_calls": job_calls,
            "calls_equal_job": calls == job_calls, "calls_per_second": round(calls / wall, 2),
            "flowing_seconds": round(flowing, 3), "flowing_calls_per_second": round(calls / flowing, 2),
            "done_here": sorted(job["done_here"] for job in jobs),
            "workers_cpu_seconds": round(cpu, 2), "cpu_ms_per_call": round(1000 * cpu / max(1, calls), 1),
            "pool_cpu_ms_per_call": round(1000 * pool_cpu / max(1, calls), 1),
            **({"killed_claimed_runs": claimed, "taken_over": sum(job["taken_over"] for job in jobs)}
               if kill else {})}


def _plot(rows: list[dict[str, Any]], png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = [row["processes"] for row in rows]
    fig, ax = plt.subplots(figsize=(5, 3.6))
    for key, label in (("flowing_calls_per_second", "while calls flow"), ("calls_per_second", "end to end")):
        ax.plot(xs, [row[key] for row in rows], marker="o", label=label)
    base = rows[0]["flowing_calls_per_second"]
    ax.plot(xs, [base * x for x in xs], linestyle=":", color="grey", label="linear")
    ax.set_xlabel("kvjudge processes sharing the job")
    ax.set_ylabel("judge calls per second")
    ax.set_xticks(xs)
    ax.legend()
    ax.set_title("One score job shared by N processes (50 ms calls)")
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=96)
    parser.add_argument("--latency", type=float, default=0.05, help="seconds each judge call takes")
    parser.add_argument("--parallel", type=int, default=2, help="requests in flight per process")
    parser.add_argument("--lease", type=float, default=2.0, help="the workers' lease (and call time-out)")
    parser.add_argument("--out", default="bench-out/shared_work")
    parser.add_argument("--smoke", action="store_true", help="the smallest job (a test runs it)")
    args = parser.parse_args(argv)
    if args.smoke:
        args.runs = 12
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    load = round(os.getloadavg()[0], 1)
    with tempfile.TemporaryDirectory(prefix="kvjudge-shared-") as tmp:
        work = Path(tmp)
        env = {**os.environ, "KVJUDGE_CACHE_DIR": str(work / "cache"), "KVJUDGE_DATA_DIR": str(work / "data")}
        env.pop("KVJUDGE_CONFIG", None)
        env.pop("KVJUDGE_STORE", None)
        runs = [swe_run(f"t{n // 2}/{'pass' if n % 2 else 'fail'}", task=f"t{n // 2}", passed=bool(n % 2), seed=n,
                        explore=2, file_lines=30) for n in range(args.runs)]
        runs_file, key = write_graded(work, runs)
        template = work / "template.sqlite"
        subprocess.run([sys.executable, "-m", "kvjudge", "ingest", str(runs_file), "--store", str(template)],
                       env=env, check=True, capture_output=True)
        replica = SimReplica(AnswerKey.load(key), Settings(seed=3),
                             replica=ReplicaSettings(latency_s=args.latency)).start()
        try:
            subprocess.run([sys.executable, "-m", "kvjudge", "probe", "--server", replica.url], env=env, check=True,
                           capture_output=True)
            rows = [_job(template, work, replica, n, args, env) for n in PROCESSES]
            killed = _job(template, work, replica, 4, args, env, kill=True)
        finally:
            replica.stop()
    one = rows[0]
    for row in rows:
        row["speedup"] = round(row["flowing_calls_per_second"] / one["flowing_calls_per_second"], 2)
        row["speedup_end_to_end"] = round(row["calls_per_second"] / one["calls_per_second"], 2)
    four = rows[-1]
    killed["calls_sent_again"] = killed["calls"] - killed["job_calls"]
    killed["calls_sent_again_bound"] = killed["killed_claimed_runs"] * CRITERIA
    killed["seconds_lost"] = round(killed["wall_seconds"] - four["wall_seconds"], 3)
    png = out / "shared_work.png"
    _plot(rows, png)
    print(json.dumps({"benchmark": "shared_work", "cpus": os.cpu_count(), "load_at_start": load, "runs": args.runs,
                      "latency_s": args.latency,
                      "parallel": args.parallel, "lease_s": args.lease, "jobs": rows, "killed_one_of_4": killed,
                      "speedup_at_4": four["speedup"], "target_speedup_at_4": TARGET_SPEEDUP_AT_4,
                      "meets_target": four["speedup"] >= TARGET_SPEEDUP_AT_4,
                      "calls_equal_job_calls": all(row["calls_equal_job"] for row in rows),
                      "png": str(png)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
