"""kvjudge at scale, step by step, against a simulated judge that answers at once: only kvjudge is timed.

Two agents × N SWE-bench-shaped trajectories (mini-swe-agent v1 files of about 40 KB, from
:mod:`kvjudge.testing.trajectories`; each agent's grades in a SWE-bench summary report) and a simulated
vLLM-shaped judge (:mod:`kvjudge.testing.sim_judge`: zero latency, a cheap tokenizer, no local copy of its vocabulary,
so kvjudge counts through ``/tokenize``) served from a thread of this process and probed once (untimed). Then, for
each N, every step is one child ``python -m kvjudge …`` process on a fresh store, in the order a user runs them:

- **ingest** the 2N files with their grades (``--results``);
- **runs**: the first listing (``runs --json``);
- **reduce**: ``reduce --all --server URL --ceiling C`` (every body counted with the served tokenizer, extracts
  searched for);
- **eval_cold**: ``eval --server URL`` over the N same-task pairs, nothing cached;
- **eval_cached**: the same again, every verdict cached;
- **rank**: ``rank --server URL`` over the same pairs (every verdict cached).

Per step: the wall time, kvjudge's CPU (user + system) and peak RSS (``os.wait4`` of the child), and the requests
the judge received, by path (the simulated judge counts them). Beside ``reduce``, **reduce_local** is the same
reduction of a copy of the store taken just before it, in one child process calling the same library call
(:func:`kvjudge.retention.reduce_runs`) with the simulated judge's tokenizer run locally: the same counts and
extracts, no round trip — ``reduce`` should stay within 2× of it.

Targets (2-core machine, shared): every step linear in N (``slopes``: the log-log slope of wall time between
successive N; 1.0 is linear, start-up makes it smaller at small N); eval_cold ≥ 20 pairs/s at N = 1,000; eval or
rank with every verdict cached ≤ 5 ms a pair; reduce ≤ 2× reduce_local. Measured, not targets of this benchmark:
the first ``runs`` over 5,000 runs (≤ 2 s) and ingest MB/s (``benchmarks/runs_listing.py`` and
``benchmarks/ingest_throughput.py`` hold those).

Writes ``scale.json`` and ``scale.png`` (wall time against N, log-log, one line per step) to ``--out`` and prints
one JSON line (the figures per N and whether each target was met).

    python benchmarks/scale.py --out /tmp/bench [--n 100,1000,5000 | --quick] [--work DIR] [--ceiling 6000]

``--quick`` is N = 50, 200 (a minute or two). ``--work DIR`` keeps the generated trajectories there between runs
(stores are always made afresh). N = 5,000 takes about 30 minutes here (1.8 GB of stores).

The latest figures are in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from kvjudge.testing.trajectories import make_episode, mini_swe_agent_v1
from kvjudge.testing.sim_judge import Settings as SimSettings
from kvjudge.testing.sim_judge import SimJudgeServer, write_key

AGENTS = ("anthropic/claude-sonnet-4-5-20250929", "openai/gpt-5-mini")
STEPS = ("ingest", "runs", "reduce", "eval_cold", "eval_cached", "rank")
DEFAULT_N = (100, 1000, 5000)
QUICK_N = (50, 200)
# make_episode's tool output for a mini-swe-agent v1 file of about 40 KB (≈ 13k tokens of the simulated tokenizer).
_TARGET_BYTES = 28_000
TARGETS = {"eval_pairs_per_s_at_1000": 20.0, "cached_ms_per_pair": 5.0, "reduce_to_local": 2.0,
           "first_runs_s_at_5000": 2.0}
ROOT = Path(__file__).resolve().parent.parent

# The same reduction as `kvjudge reduce --all`, counted with the simulated judge's tokenizer in this process.
_LOCAL_REDUCE = """
import json, sys
from kvjudge.retention import Store
from kvjudge.retention.reduce_runs import reduce_runs
from kvjudge.testing.sim_judge import SimJudge

class LocalSimTokenizer:
    name = "local:sim-judge"

    @staticmethod
    def count(text):
        return len(SimJudge.tokens(text))

with Store.open(sys.argv[1]) as store:
    done = reduce_runs(store, None, lambda tenant: int(sys.argv[2]), LocalSimTokenizer())
print(json.dumps({"runs": [{"run": r["run"], "tokens_before": r["tokens_before"], "tokens_after": r["tokens_after"],
                            "events": r["events"]} for r in done.runs]}))
"""


def generate(folder: Path, n: int) -> int:
    """``n`` tasks, one trajectory of each agent on each (``runs/<agent>/<instance>/``), and each agent's SWE-bench
    summary report (``results/<agent>.json``); the bytes written."""
    written = 0
    (folder / "results").mkdir(parents=True, exist_ok=True)
    for number, agent in enumerate(AGENTS):
        resolved, unresolved = [], []
        for index in range(n):
            instance = f"repo{index % 97}__proj-{index}"
            good = (index * 7 + number * 3) % 5 < 2 + number  # the agents differ a little
            episode = make_episode(instance, 1_000 * index + number, target_bytes=_TARGET_BYTES, model=agent,
                                   resolved_style=good, patch_lines=4 + index % 9)
            path = folder / "runs" / agent.replace("/", "__") / instance / f"{instance}.traj.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(mini_swe_agent_v1(episode)))
            written += path.stat().st_size
            (resolved if good else unresolved).append(instance)
        (folder / "results" / f"{agent.replace('/', '__')}.json").write_text(json.dumps(
            {"resolved_ids": resolved, "unresolved_ids": unresolved, "error_ids": [], "empty_patch_ids": []}))
    return written


def _trajectories(work: Path, n: int) -> tuple[Path, int]:
    folder = work / f"trajectories-{n}"
    if not folder.exists():
        partial = work / f"trajectories-{n}.tmp"
        shutil.rmtree(partial, ignore_errors=True)
        generate(partial, n)
        partial.rename(folder)
    size = sum(path.stat().st_size for path in (folder / "runs").rglob("*.traj.json"))
    return folder, size


class Child:
    """Runs ``python -m kvjudge …`` (or a script) as a child process and measures it with ``os.wait4``."""

    def __init__(self, cwd: Path, env: dict[str, str]) -> None:
        self.cwd, self.env = cwd, env

    def run(self, name: str, argv: list[str], ok: tuple[int, ...] = (0,)) -> dict[str, Any]:
        out, err = self.cwd / f"{name}.out", self.cwd / f"{name}.err"
        with out.open("w") as stdout, err.open("w") as stderr:
            started = time.perf_counter()
            process = subprocess.Popen([sys.executable, *argv], cwd=self.cwd, env=self.env, stdout=stdout,
                                       stderr=stderr)
            _, status, usage = os.wait4(process.pid, 0)
            wall = time.perf_counter() - started
        process.returncode = code = os.waitstatus_to_exitcode(status)
        if code not in ok:
            raise SystemExit(f"{name} exited {code}: {err.read_text()[-2000:]}")
        return {"wall_s": round(wall, 3), "cpu_s": round(usage.ru_utime + usage.ru_stime, 3),
                "peak_rss_mib": round(usage.ru_maxrss / 1024, 1), "exit": code, "stdout": out}


def _copy_store(source: Path, destination: Path) -> None:
    with sqlite3.connect(source) as original, sqlite3.connect(destination) as copy:
        original.backup(copy)


def measure(n: int, work: Path, server: SimJudgeServer, args: argparse.Namespace) -> dict[str, Any]:
    """Every step on a fresh store of 2 × ``n`` runs."""
    trajectories, size = _trajectories(work, n)
    here = work / f"n{n}"
    shutil.rmtree(here, ignore_errors=True)
    here.mkdir()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH")))),
           "KVJUDGE_CACHE_DIR": str(work / "cache"), "KVJUDGE_DATA_DIR": str(here / "data")}
    child = Child(here, env)
    store = str(here / "store.sqlite")
    served = ["--server", server.url]
    (here / "kvjudge.toml").write_text(f"[judge]\nparallel = {args.parallel}\n")  # reduce counts with it too
    results = [f"{agent}={trajectories / 'results' / (agent.replace('/', '__') + '.json')}" for agent in AGENTS]
    argv = {
        "ingest": ["ingest", str(trajectories / "runs"), *(f"--results={item}" for item in results)],
        "runs": ["runs"],
        "reduce": ["reduce", "--all", *served, "--ceiling", str(args.ceiling)],
        "eval_cold": ["eval", *served, "--png", str(here / "eval.png")],
        "eval_cached": ["eval", *served, "--png", str(here / "eval.png")],
        "rank": ["rank", *served, "--png", str(here / "rank.png")],
    }
    steps: dict[str, dict[str, Any]] = {}
    payloads: dict[str, Any] = {}
    for step in STEPS:
        if step == "reduce":
            _copy_store(Path(store), here / "store-local.sqlite")
        before = Counter(server.requests)
        # reduce exits 1 when a run stays above its ceiling: a figure, not a failure here.
        figures = child.run(step, ["-m", "kvjudge", *argv[step], "--store", store, "--json"],
                            ok=(0, 1) if step == "reduce" else (0,))
        sent = Counter(server.requests)
        sent.subtract(before)
        figures["requests"] = {path: count for path, count in sorted(sent.items()) if count}
        payloads[step] = json.loads(figures.pop("stdout").read_text())
        steps[step] = figures
    result = _figures(n, size, steps, payloads)
    # The same reduction with the served tokenizer run locally: same counts, no round trip.
    target = next(iter(payloads["reduce"]["ceilings"].values()))["effective"]
    local = child.run("reduce_local", ["-c", _LOCAL_REDUCE, str(here / "store-local.sqlite"), str(target)])
    local_runs = json.loads(local.pop("stdout").read_text())["runs"]
    served_runs = [{key: r[key] for key in ("run", "tokens_before", "tokens_after", "events")}
                   for r in payloads["reduce"]["runs"]]
    local["same_reduction"] = local_runs == served_runs
    result["steps"]["reduce_local"] = local
    result["reduce_to_local"] = round(steps["reduce"]["wall_s"] / local["wall_s"], 2)
    # kvjudge's own share, apart from the simulated judge's CPU, which shares this machine's cores with it.
    result["reduce_cpu_to_local"] = round(steps["reduce"]["cpu_s"] / local["cpu_s"], 2)
    if not args.keep:
        shutil.rmtree(here, ignore_errors=True)
    return result


def _figures(n: int, size: int, steps: dict[str, dict[str, Any]], payload: dict[str, Any]) -> dict[str, Any]:
    """What each step did, per item, with its output reduced to a few checks."""
    cold, ranked = payload["eval_cold"], payload["rank"]
    pairs = next(iter(cold["templates"].values()))["pairs"] if cold.get("templates") else None
    per_item = {
        "ingest_mb_per_s": round(size / 1e6 / steps["ingest"]["wall_s"], 2),
        "runs_ms_per_run": round(1e3 * steps["runs"]["wall_s"] / (2 * n), 3),
        "reduce_ms_per_run": round(1e3 * steps["reduce"]["wall_s"] / (2 * n), 2),
        "eval_cold_pairs_per_s": round(n / steps["eval_cold"]["wall_s"], 2),
        "eval_cached_ms_per_pair": round(1e3 * steps["eval_cached"]["wall_s"] / n, 3),
        "rank_ms_per_pair": round(1e3 * steps["rank"]["wall_s"] / n, 3),
    }
    checks = {"ingested": payload["ingest"].get("imported"), "bytes": size,
              "runs_listed": len(payload["runs"]),
              "reduced_runs": len(payload["reduce"]["runs"]),
              "reduce_above_ceiling": len(payload["reduce"]["above_ceiling"]),
              "eval_pairs": pairs, "rank_games": ranked.get("games"),
              "cached_requests": {step: steps[step]["requests"] for step in ("eval_cached", "rank")}}
    return {"n": n, "runs": 2 * n, "steps": steps, "per_item": per_item, "checks": checks}


def _slopes(results: list[dict[str, Any]]) -> dict[str, list[float]]:
    """The log-log slope of each step's wall time between successive N (1.0: linear)."""
    slopes: dict[str, list[float]] = {}
    for low, high in zip(results, results[1:]):
        for step in high["steps"]:
            ratio = high["steps"][step]["wall_s"] / max(1e-9, low["steps"][step]["wall_s"])
            slopes.setdefault(step, []).append(round(math.log(ratio) / math.log(high["n"] / low["n"]), 2))
    return slopes


def plot(results: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 5))
    ns = [result["n"] for result in results]
    for step in (*STEPS, "reduce_local"):
        axes.plot(ns, [result["steps"][step]["wall_s"] for result in results], marker="o",
                  linestyle="--" if step == "reduce_local" else "-", label=step)
    axes.set_xscale("log")
    axes.set_yscale("log")
    axes.set_xlabel("N (trajectories per agent = pairs)")
    axes.set_ylabel("wall time (s)")
    axes.set_title("kvjudge steps against a zero-latency simulated judge")
    axes.grid(True, which="both", alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def _marginal(results: list[dict[str, Any]]) -> dict[str, list[float]]:
    """Each judging step's ms a pair between successive N (the process's start-up, a second or so, left out)."""
    marginal: dict[str, list[float]] = {}
    for low, high in zip(results, results[1:]):
        for step in ("eval_cold", "eval_cached", "rank"):
            extra = high["steps"][step]["wall_s"] - low["steps"][step]["wall_s"]
            marginal.setdefault(step, []).append(round(1e3 * extra / (high["n"] - low["n"]), 3))
    return marginal


def _met(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Each target, where the runs measured say something of it: the cached figures at N ≥ 1,000 (below that the
    start-up of the process is most of a step)."""
    by_n = {result["n"]: result for result in results}
    large = [r for r in results if r["n"] >= 1000]
    met: dict[str, Any] = {"reduce_to_local": all(r["reduce_to_local"] <= TARGETS["reduce_to_local"] for r in results)}
    if large:
        met["cached_ms_per_pair"] = all(max(r["per_item"]["eval_cached_ms_per_pair"], r["per_item"]["rank_ms_per_pair"])
                                        <= TARGETS["cached_ms_per_pair"] for r in large)
    if 1000 in by_n:
        met["eval_pairs_per_s_at_1000"] = by_n[1000]["per_item"]["eval_cold_pairs_per_s"] >= \
            TARGETS["eval_pairs_per_s_at_1000"]
    if 5000 in by_n:
        met["first_runs_s_at_5000"] = by_n[5000]["steps"]["runs"]["wall_s"] <= TARGETS["first_runs_s_at_5000"]
    return met


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--n", default=",".join(map(str, DEFAULT_N)), help="trajectories per agent, comma-separated")
    parser.add_argument("--quick", action="store_true", help=f"N = {', '.join(map(str, QUICK_N))}")
    parser.add_argument("--ceiling", type=int, default=6000, help="reduce runs to this many tokens (default 6000)")
    parser.add_argument("--parallel", type=int, default=4, help="requests in flight per server (default 4)")
    parser.add_argument("--max-model-len", type=int, default=32_768)
    parser.add_argument("--work", type=Path, help="keep generated trajectories here between runs")
    parser.add_argument("--keep", action="store_true", help="keep each N's store and step outputs in the work dir")
    args = parser.parse_args()
    ns = list(QUICK_N) if args.quick else sorted({int(item) for item in args.n.split(",") if item.strip()})
    args.out.mkdir(parents=True, exist_ok=True)
    work = args.work or Path(tempfile.mkdtemp(prefix="kvjudge-scale-"))
    work.mkdir(parents=True, exist_ok=True)
    key = write_key(work / "key.json", [])
    results: list[dict[str, Any]] = []
    summary: dict[str, Any] = {}
    with SimJudgeServer(key, SimSettings(max_model_len=args.max_model_len)) as server:
        env = {**os.environ, "PYTHONPATH": str(ROOT), "KVJUDGE_CACHE_DIR": str(work / "cache")}
        subprocess.run([sys.executable, "-m", "kvjudge", "probe", "--server", server.url, "--json"], env=env,
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=work)
        try:
            for n in ns:
                result = measure(n, work, server, args)
                results.append(result)
                walls = {step: figures["wall_s"] for step, figures in result["steps"].items()}
                print(json.dumps({"n": n, "per_item": result["per_item"], "wall_s": walls}), file=sys.stderr,
                      flush=True)
                # Written after each N, so a long run stopped early still leaves what it measured.
                summary = {"ns": [r["n"] for r in results], "ceiling": args.ceiling, "parallel": args.parallel,
                           "results": results, "slopes": _slopes(results),
                           "marginal_ms_per_pair": _marginal(results), "targets": TARGETS, "met": _met(results)}
                (args.out / "scale.json").write_text(json.dumps(summary, indent=2) + "\n")
                plot(results, args.out / "scale.png")
        finally:
            if args.work is None:
                shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
