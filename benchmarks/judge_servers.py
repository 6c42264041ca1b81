"""Judge servers: the same pairs in-process, on one server and on two; and a server killed halfway.

A fresh store holds ``--pairs`` pairs of synthetic graded runs that fit the judge's window (no further reduction,
so every backend reads the same views). Two llama-cpp-python servers (``python -m llama_cpp.server``, the default
model, n_ctx ``--server-n-ctx``) run on 127.0.0.1 with the in-process judge's thread count. Judgments are not
cached; each configuration judges a warm-up pair first, not counted.

1. **in-process** (``LlamaBackend``, prefix KV reuse), **one server** (a pool of one) and **two servers** (pairs
   in flight across both, each pair's two orders on one server), ``--parallel`` requests per server, judge the same pairs in rounds of
   ``--round`` pairs, taking turns at going first: on a shared machine they then share the same load, and the
   ratios between them are what to read;
2. **killed halfway**: the two servers judge all the pairs again and one is SIGKILLed once half of them are
   decided.

Reported: pairs/min of each and their ratios; p_a of the two-server run against in-process, pair by pair (target
≤ 0.01 on every pair), and against in-process evaluation of each prompt whole (no prefix reuse: what a server
does, so this isolates the server path from llama.cpp's batch-split numerics); the cost of the kill — seconds against the two-server rounds, pairs lost (error outcomes,
target 0), requests sent to the other server. Writes ``judge_servers.json`` to ``--out`` and prints it as one
JSON line.

    python benchmarks/judge_servers.py --out /tmp/bench [--pairs 8] [--round 2] [--n-ctx 768]

``--smoke`` (the suite's smallest size): one pair, one round, the judge's window at 512, no warm-up pairs; every
step still runs once — the server that pair went to is killed before it is sent again (half of one pair is
none), so its requests go to the other.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from kvjudge.judge import SCORED, Judge, LlamaBackend, Verdict, judge_batch, open_servers
from kvjudge.models import default_model_path
from kvjudge.retention import Store, ingest_paths
from kvjudge.testing.filler import filler
from kvjudge.testing.jsonl import write_jsonl
from kvjudge.testing.native_runs import make_run

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from llama_server import LlamaServer  # noqa: E402  (the same launcher the tests use)

TARGET_P_A_DIFF = 0.01
TARGET_PAIRS_LOST = 0


def _store(directory: Path, pairs: int, words: int) -> Store:
    runs = []
    for index in range(2 * pairs + 2):  # + one warm-up pair
        run = make_run(f"run-{index}", [filler(10 * index + 1, words)], passed=index % 2 == 0,
                       final="12 passed" if index % 2 == 0 else "3 failed, 9 passed")
        run["task"]["id"] = "bench-task"
        runs.append(run)
    source = directory / "runs.jsonl"
    write_jsonl(source, runs)
    store = Store.open(directory / "store.sqlite")
    ingest_paths(store, [source])
    return store


def _timed(judge: Judge, store: Store, requests: list[tuple[str, str]],
           on_verdict: Any = None) -> tuple[list[Verdict], float]:
    started = time.perf_counter()
    verdicts = judge_batch(judge, store, requests, on_verdict=on_verdict)
    return verdicts, time.perf_counter() - started


def _row(verdicts: list[Verdict], seconds: float) -> dict[str, Any]:
    outcomes: dict[str, int] = {}
    for verdict in verdicts:
        outcomes[verdict.outcome] = outcomes.get(verdict.outcome, 0) + 1
    return {"seconds": round(seconds, 2), "pairs_per_min": round(60.0 * len(verdicts) / seconds, 2),
            "outcomes": outcomes}


def run(model: Path, pairs: int, per_round: int, n_ctx: int, server_n_ctx: int, parallel: int, words: int,
        directory: Path, warm_up: bool = True) -> dict[str, Any]:
    warm = (f"run-{2 * pairs}", f"run-{2 * pairs + 1}")
    requests = [(f"run-{2 * i}", f"run-{2 * i + 1}") for i in range(pairs)]
    names = ("in_process", "one_server", "two_servers")
    with _store(directory, pairs, words) as store:
        local = LlamaBackend(model_path=model, n_ctx=n_ctx)
        threads = local.n_threads
        servers = [LlamaServer(model, server_n_ctx, directory / f"server-{i}", threads=threads) for i in range(2)]
        pools: list[Any] = []
        try:
            for server in servers:
                server.start()
            pools = [open_servers([servers[0].url], n_ctx=n_ctx, parallel=parallel),
                     open_servers([s.url for s in servers], n_ctx=n_ctx, parallel=parallel)]
            judges = dict(zip(names, (Judge(local, use_cache=False), Judge(pools[0], use_cache=False),
                                      Judge(pools[1], use_cache=False))))
            if warm_up:  # timing only: the smoke run skips it
                for judge in judges.values():
                    judge_batch(judge, store, [warm])  # its two orders go to one server, one after the other
            seconds = dict.fromkeys(names, 0.0)
            verdicts: dict[str, list[Verdict]] = {name: [] for name in names}
            for number, first in enumerate(range(0, pairs, per_round)):
                chunk = requests[first:first + per_round]
                turn = number % len(names)
                for name in names[turn:] + names[:turn]:
                    got, took = _timed(judges[name], store, chunk)
                    verdicts[name] += got
                    seconds[name] += took
            rows = {name: _row(verdicts[name], seconds[name]) for name in names}
            for name, pool in zip(names[1:], pools):
                rows[name]["calls"] = pool.stats()["calls"]
            pools.append(open_servers([s.url for s in servers], n_ctx=n_ctx, parallel=parallel))
            killer = Judge(pools[-1], use_cache=False)
            if warm_up:
                judge_batch(killer, store, [warm])
            if pairs // 2 == 0:  # one pair: the server it went to in the two-server rounds, killed before it is sent
                took = rows["two_servers"]["calls"]
                busiest = max(took, key=took.get).rstrip("/")
                next(s for s in servers if s.url.rstrip("/") == busiest).kill()

            def kill_halfway(index: int, _verdict: Verdict) -> None:
                if index + 1 == pairs // 2:
                    servers[1].kill()

            killed, killed_s = _timed(killer, store, requests, on_verdict=kill_halfway)
            stats = pools[-1].stats()
            # The reference a server should match: each prompt evaluated whole (a server evaluates the prompt it
            # is sent; the in-process judge evaluates the shared prefix on its own, then the rest).
            whole = LlamaBackend(model_path=model, n_ctx=n_ctx, reuse_prefix=False)
            reference = judge_batch(Judge(whole, use_cache=False), store, requests)
            whole.close()
        finally:
            for pool in pools:
                pool.close()
            local.close()
            for server in servers:
                server.stop()
    diffs = []
    for mine, theirs, whole_view in zip(verdicts["two_servers"], verdicts["in_process"], reference, strict=True):
        if mine.p_a is not None and theirs.p_a is not None and whole_view.p_a is not None:
            diffs.append({"pair": f"{mine.a}/{mine.b}", "server_p_a": round(mine.p_a, 5),
                          "in_process_p_a": round(theirs.p_a, 5), "diff": round(abs(mine.p_a - theirs.p_a), 5),
                          "same_outcome": mine.outcome == theirs.outcome,
                          "diff_vs_whole_prompt": round(abs(mine.p_a - whole_view.p_a), 5)})
    lost = sum(1 for v in killed if v.outcome not in SCORED)
    max_diff = max((d["diff"] for d in diffs), default=None)
    max_whole = max((d["diff_vs_whole_prompt"] for d in diffs), default=None)
    return {
        "pairs": pairs, "round": per_round, "n_ctx": n_ctx, "server_n_ctx": server_n_ctx, "parallel": parallel,
        "threads": threads, **rows,
        "two_vs_one_server": round(seconds["one_server"] / seconds["two_servers"], 2),
        "one_server_vs_in_process": round(seconds["in_process"] / seconds["one_server"], 2),
        "two_servers_vs_in_process": round(seconds["in_process"] / seconds["two_servers"], 2),
        "p_a_diff_server_vs_in_process": {"max": max_diff, "max_vs_whole_prompt": max_whole,
                                          "scored_pairs": len(diffs), "per_pair": diffs},
        "meets_p_a_target": max_diff is not None and max_diff <= TARGET_P_A_DIFF and len(diffs) == pairs,
        "killed_halfway": _row(killed, killed_s) | {
            "extra_seconds": round(killed_s - seconds["two_servers"], 2), "pairs_lost": lost,
            "resent": stats["resent"], "dropped": list(stats["dropped"]), "calls": stats["calls"]},
        "meets_pairs_lost_target": lost <= TARGET_PAIRS_LOST,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="directory for judge_servers.json")
    parser.add_argument("--pairs", type=int, default=8, help="timed pairs (after warm-up)")
    parser.add_argument("--round", type=int, default=2, help="pairs per round (the configurations take turns)")
    parser.add_argument("--n-ctx", type=int, default=768, help="the judge's window")
    parser.add_argument("--server-n-ctx", type=int, default=1024, help="each server's context")
    parser.add_argument("--parallel", type=int, default=2, help="requests in flight per server")
    parser.add_argument("--words", type=int, default=60, help="words of tool output per run")
    parser.add_argument("--model", help="GGUF (default: the default model)")
    parser.add_argument("--smoke", action="store_true",
                        help="the smallest run (the suite's): 1 pair, 1 round, n_ctx 512, 10 words, no warm-up")
    args = parser.parse_args()
    if args.smoke:
        args.pairs, args.round, args.n_ctx, args.server_n_ctx, args.words = 1, 1, 512, 640, 10
    model = Path(args.model) if args.model else default_model_path()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="kvjudge-servers-bench-") as scratch:
        result = run(model, args.pairs, args.round, args.n_ctx, args.server_n_ctx, args.parallel, args.words,
                     Path(scratch), warm_up=not args.smoke)
    payload = {"benchmark": "judge_servers", "model": model.name, **result,
               "targets": {"p_a_diff": TARGET_P_A_DIFF, "pairs_lost": TARGET_PAIRS_LOST}}
    (out / "judge_servers.json").write_text(json.dumps(payload, indent=2) + "\n")
    print(json.dumps(payload))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
