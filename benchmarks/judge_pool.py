"""A judge pool's figures: the share of prompt tokens served from the replicas' prefix caches through a real router
and through the direct pool, the ledger against the replicas' own usage, and the harness's own CPU per call.

Two simulated replicas (:class:`~kvjudge.testing.sim_replica.SimReplica`: a prefix cache each of one GPU's KV
cache, :data:`~kvjudge.testing.sim_replica.GPU_KV_TOKENS` tokens, ``cached_tokens`` reported as vLLM reports it) serve one simulated judge; ``vllm-router --policy consistent_hash`` stands in front of
them (tests/router.py, the launcher the tests use). The runs are SWE-bench-shaped graded runs of about 40 KB
(:mod:`kvjudge.testing.graded_runs`, 10 files of 120 lines read while exploring), ``--pairs`` same-task pairs, and
twice as many for the linearity check. For each way in (``router``, ``direct``) and each protocol, ``kvjudge eval``
runs in a child process on a fresh copy of the ingested store (nothing cached) and reports its cost ledger; the
replicas' usage is read before and after.

Reported per configuration: calls, prompt tokens, cached prompt tokens and their share, whether the ledger equals the
replicas' usage exactly, the child's CPU seconds (user + system) per call at N and 2N pairs and the marginal CPU per
call between them (start-up excluded: target ≤ 10 ms) — with the bodies counted through the servers' ``/tokenize``
on the way (a fresh store), and again with their counts kept (``--no-cache``: the same calls, the calls' own CPU) —
and wall seconds. One JSON line.

    python -m benchmarks.judge_pool [--pairs 40] [--out DIR] [--harness-only]

``--harness-only``: the harness's CPU per call measured in this process instead, around the judging alone
(``judge_batch`` / ``score_runs`` through a direct pool of two replicas served by a child process, so neither
start-up, imports nor eval's figures are in it), at N and 2N pairs, counting through ``/tokenize`` and with the
counts kept. (Run it with ``-m`` from the repository root: ``benchmarks/select.py`` would shadow the standard
library's ``select`` for a script run from its folder.)

The protocols: today's letter protocol (both orders of each pair) and the pointwise protocol with the default rubric's
3 criteria × 3 repeats (9 readings of each run, one group with one affinity key; issue 36's target: ≥ 75 % of
prompt tokens from the prefix cache through the router and through the direct pool). ``--protocol-args`` passes
extra eval flags for one more row.

``--smoke`` (the suite's smallest size): every step once — one size (N alone, no 2N: the marginal figures are
null), every protocol through both ways in, each eval and its counts-kept rerun.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from kvjudge.testing.graded_runs import swe_run, write_graded
from kvjudge.testing.sim_judge import AnswerKey, Settings
from kvjudge.testing.sim_replica import GPU_KV_TOKENS, ReplicaSettings, SimReplica

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from router import VllmRouter  # noqa: E402  (the same launcher the tests use)

TARGET_CPU_MS_PER_CALL = 10.0
TARGET_CACHED_SHARE = 0.75
#: Protocol name → extra `kvjudge eval` flags.
PROTOCOLS: dict[str, list[str]] = {"letter (today)": [],
                                   "pointwise 3 criteria x 3 repeats": ["--protocol", "pointwise", "--repeats", "3"]}


def _store(out: Path, pairs: int, name: str) -> tuple[Path, Path]:
    runs = [run for n in range(pairs) for run in (
        swe_run(f"t{n}/a", task=f"t{n}", passed=True, seed=n, explore=10, file_lines=120),
        swe_run(f"t{n}/b", task=f"t{n}", passed=False, seed=n, explore=10, file_lines=120))]
    runs_file, key = write_graded(out, runs, name=name)
    store = out / f"{name}.sqlite"
    subprocess.run([sys.executable, "-m", "kvjudge", "ingest", str(runs_file), "--store", str(store), "--json"],
                   check=True, capture_output=True)
    return store, key


def _fresh(store: Path, work: Path) -> Path:
    copy = work / "judged.sqlite"
    for suffix in ("", "-wal", "-shm"):
        Path(str(copy) + suffix).unlink(missing_ok=True)
    shutil.copy(store, copy)
    return copy


def _eval(servers: list[str], copy: Path, work: Path, extra: list[str]) -> tuple[dict[str, Any], float, float]:
    """``kvjudge eval`` on ``copy``: its cost ledger, its CPU seconds and its wall seconds."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "kvjudge", "eval", *(a for s in servers for a in ("--server", s)),
                           "--store", str(copy), "--parallel", "4", "--png", str(work / "eval.png"), "--json", *extra],
                          capture_output=True, text=True)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"eval failed: {done.stderr[-2000:]}")
    payload = json.loads(done.stdout)
    if "templates" in payload:  # a pairwise eval: one framing's figures
        [(_, payload)] = payload["templates"].items()
    figures = payload
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return figures["cost"], cpu, wall


def _usage(replicas: list[SimReplica]) -> Counter[str]:
    total: Counter[str] = Counter()
    for replica in replicas:
        total.update(replica.usage)
    return total


def run(pairs: int, out: Path, extra: list[str], protocols: dict[str, list[str]],
        smoke: bool = False) -> dict[str, Any]:
    os.environ["KVJUDGE_CACHE_DIR"] = str(out / "cache")  # the probe's entries for this run only
    sizes = (pairs,) if smoke else (pairs, 2 * pairs)
    stores = {n: _store(out, n, f"runs-{n}") for n in sizes}
    key = AnswerKey.load(stores[sizes[-1]][1])  # the larger set holds the smaller one's runs
    protocols = dict(protocols)
    if extra:
        protocols["--protocol-args " + shlex.join(extra)] = extra
    rows = []
    replicas = [SimReplica(key, Settings(seed=1), replica=ReplicaSettings(capacity_tokens=GPU_KV_TOKENS)).start()
                for _ in range(2)]
    try:
        with VllmRouter([r.url for r in replicas], "consistent_hash", log_dir=out) as router:
            ways = {"router": [router.url], "direct": [r.url for r in replicas]}
            for url in [router.url, *ways["direct"]]:
                subprocess.run([sys.executable, "-m", "kvjudge", "probe", "--server", url, "--json"], check=True,
                               capture_output=True)
            for protocol, flags in protocols.items():
                for way, servers in ways.items():
                    measured = {}
                    for n in sizes:
                        for replica in replicas:
                            replica.clear_cache()  # every configuration starts cold
                        before = _usage(replicas)
                        copy = _fresh(stores[n][0], out)
                        cost, cpu, wall = _eval(servers, copy, out, flags, )
                        usage = _usage(replicas) - before
                        # The same calls again, the bodies' token counts now kept in the store: the harness's CPU
                        # for the calls alone (counting through /tokenize is the first run's extra).
                        for replica in replicas:
                            replica.clear_cache()
                        _, calls_cpu, _ = _eval(servers, copy, out, [*flags, "--no-cache"])
                        exact = (cost["calls"], cost["prompt_tokens"], cost["cached_prompt_tokens"],
                                 cost["completion_tokens"]) == (usage["calls"], usage["prompt_tokens"],
                                                                usage["cached_tokens"], usage["completion_tokens"])
                        measured[n] = {"calls": cost["calls"], "prompt_tokens": cost["prompt_tokens"],
                                       "cached_prompt_tokens": cost["cached_prompt_tokens"],
                                       "cached_share": cost["cached_share"], "ledger_equals_usage": exact,
                                       "cpu_s": round(cpu, 3), "cpu_ms_per_call": round(1000 * cpu / cost["calls"], 2),
                                       "counts_kept_cpu_s": round(calls_cpu, 3), "wall_s": round(wall, 3)}
                    small, large = measured[pairs], measured.get(2 * pairs)
                    marginal = kept = None
                    if large is not None:
                        calls = max(1, large["calls"] - small["calls"])
                        marginal = round(1000 * (large["cpu_s"] - small["cpu_s"]) / calls, 2)
                        kept = round(1000 * (large["counts_kept_cpu_s"] - small["counts_kept_cpu_s"]) / calls, 2)
                    rows.append({"protocol": protocol, "way": way, "at_n": small, "at_2n": large,
                                 "marginal_cpu_ms_per_call": marginal,
                                 "marginal_cpu_ms_per_call_counts_kept": kept})
    finally:
        for replica in replicas:
            replica.stop()
    return {"benchmark": "judge_pool", "pairs": pairs, "replicas": 2, "router": "vllm-router consistent_hash",
            "replica_cache_tokens": GPU_KV_TOKENS,
            "run_kb": round(len(json.dumps(swe_run("x/1", task="t", passed=True, seed=1, explore=10,
                                                   file_lines=120).run)) / 1000, 1),
            "target_cpu_ms_per_call": TARGET_CPU_MS_PER_CALL, "target_cached_share": TARGET_CACHED_SHARE,
            "rows": rows}


_SERVE = """
import sys, time
from kvjudge.testing.sim_judge import AnswerKey, Settings
from kvjudge.testing.sim_replica import SimReplica
replicas = [SimReplica(AnswerKey.load(sys.argv[1]), Settings(seed=1)).start() for _ in range(2)]
print(" ".join(r.url for r in replicas), flush=True)
sys.stdin.read()  # until the benchmark closes the pipe
"""


def harness_cpu(pairs: int, out: Path) -> dict[str, Any]:
    """This process's CPU seconds per call around the judging alone (the replicas in a child process)."""
    from kvjudge.judge import Judge, judge_batch, open_servers
    from kvjudge.judge.pointwise import score_runs
    from kvjudge.judge.protocols import make_protocol
    from kvjudge.retention import Store

    os.environ["KVJUDGE_CACHE_DIR"] = str(out / "cache")
    store, key = _store(out, 2 * pairs, "harness")
    server = subprocess.Popen([sys.executable, "-c", _SERVE, str(key)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    rows = []
    try:
        assert server.stdout is not None
        urls = server.stdout.readline().split()
        for url in urls:
            subprocess.run([sys.executable, "-m", "kvjudge", "probe", "--server", url, "--json"], check=True,
                           capture_output=True)
        protocols = {"letter (today)": make_protocol("letter"),
                     "pointwise 3 criteria x 3 repeats": make_protocol("pointwise", repeats=3)}
        warm = open_servers(urls, parallel=4)  # first-use costs (regexes compiled, modules loaded) left out
        with Store.open(_fresh(store, out)) as opened:
            judge_batch(Judge(warm, use_cache=False), opened, [("t0/a", "t0/b")])
        warm.close()
        for name, protocol in protocols.items():
            for n in (pairs, 2 * pairs):
                copy = _fresh(store, out)
                for kept in (False, True):
                    backend = open_servers(urls, parallel=4)
                    judge = Judge(backend, protocol=protocol, use_cache=False)
                    chosen = [(f"t{i}/a", f"t{i}/b") for i in range(n)]
                    with Store.open(copy) as opened:
                        started = time.process_time()
                        if protocol.kind == "pointwise":
                            score_runs(judge, opened, [run for pair in chosen for run in pair])
                        else:
                            judge_batch(judge, opened, chosen)
                        cpu = time.process_time() - started
                    calls = backend.ledger.calls
                    backend.close()
                    rows.append({"protocol": name, "pairs": n, "counts_kept": kept, "calls": calls,
                                 "cpu_s": round(cpu, 3), "cpu_ms_per_call": round(1000 * cpu / calls, 2)})
    finally:
        if server.stdin is not None:
            server.stdin.close()
        server.wait(timeout=30)
    marginal = {}
    for name in protocols:
        for kept in (False, True):
            small, large = (next(r for r in rows if (r["protocol"], r["pairs"], r["counts_kept"]) == (name, n, kept))
                            for n in (pairs, 2 * pairs))
            marginal[f"{name}{', counts kept' if kept else ''}"] = round(
                1000 * (large["cpu_s"] - small["cpu_s"]) / max(1, large["calls"] - small["calls"]), 2)
    return {"benchmark": "judge_pool --harness-only", "pairs": pairs,
            "target_cpu_ms_per_call": TARGET_CPU_MS_PER_CALL, "rows": rows, "marginal_cpu_ms_per_call": marginal}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, default=40)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--protocol-args", default="", help="extra `kvjudge eval` flags for one more protocol row")
    parser.add_argument("--letter-only", action="store_true",
                        help="the letter protocol alone (the smallest run: the suite's smoke test)")
    parser.add_argument("--smoke", action="store_true",
                        help="the smallest run (the suite's): N alone, every protocol and way once")
    parser.add_argument("--harness-only", action="store_true",
                        help="measure the harness's CPU per call in this process, around the judging alone")
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="kvjudge-judge-pool-"))
    out.mkdir(parents=True, exist_ok=True)
    if args.harness_only:
        print(json.dumps(harness_cpu(args.pairs, out)))
        return 0
    protocols = {name: flags for name, flags in PROTOCOLS.items() if not args.letter_only or not flags}
    print(json.dumps(run(args.pairs, out, shlex.split(args.protocol_args), protocols, smoke=args.smoke)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
