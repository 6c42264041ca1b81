"""The judging pipeline at scale, against a simulated judge that answers at once: only kvjudge is timed.

Two agents × ``--n`` trajectories (mini-swe-agent v1, about 40 KB and 12.5k tokens each, from
:mod:`kvjudge.testing.trajectories`) are ingested into a fresh store, and every body is counted once with the
served model's tokenizer (what ``kvjudge runs`` or ingest leaves behind). The simulated judge
(:mod:`kvjudge.testing.sim_judge`, vLLM's API, a cheap tokenizer, no local copy of its vocabulary: kvjudge counts
through ``/tokenize``) runs in a child process with a large enough context that every pair is read whole. Then, with
the judge's own ``judge_batch`` on a pool of that one server (``--parallel`` requests in flight):

- **views**: every pair's views fitted, without a model call (the judge's own ``base``, ``pair_bases`` and
  ``pack_pair``), on the bodies counted already: ms and ``/tokenize`` calls per pair;
- **cold**: every pair judged with an empty judgment cache — pairs/s (target ≥ 20 at N = 1,000) and ``/tokenize``
  calls per pair (the markup a fresh judge has not counted yet) — against the baseline measured in the same run,
  the pool alone sending the same prompts built beforehand (what the harness would reach if preparing a pair cost
  nothing): ``ratio_to_bare_requests``. The two take turns at going first in ``--rounds`` rounds, so they share
  the machine's load;
- **cached**: the same pairs again, every verdict cached — ms a pair (target ≤ 5) and the requests sent (none
  expected), against the floor of reading both runs' folded states and one cache row a pair (``ratio_to_floor``).

Writes ``judge_pipeline.json`` to ``--out`` and prints it as one JSON line.

    python benchmarks/judge_pipeline.py --out /tmp/bench [--n 1000] [--parallel 4] [--rounds 4] [--work DIR]

``--work DIR`` keeps the trajectories and the ingested store there between runs (every run starts with no judgment
cached and no count but the bodies' own).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from kvjudge.judge import Judge, PackedView, judge_batch, open_servers, pack_pair, pair_bases
from kvjudge.retention import Store, ingest_paths
from kvjudge.server_client import ServerClient
from kvjudge.testing.sim_judge import SimJudge
from kvjudge.testing.trajectories import make_episode, mini_swe_agent_v1

AGENTS = ("anthropic/claude-sonnet-4-5-20250929", "openai/gpt-5-mini")
TARGET_PAIRS_PER_S = 20.0
TARGET_CACHED_MS = 5.0
# make_episode's tool output per byte of a v1 file (v1 keeps the head and tail of long outputs).
_OUTPUT_SHARE = 1.4


def generate(directory: Path, n: int, kb: float) -> None:
    """``n`` tasks, one trajectory of each agent on each, under ``directory/<agent>/<instance>/``."""
    for index in range(n):
        instance = f"repo{index % 97}__proj-{index}"
        for number, agent in enumerate(AGENTS):
            episode = make_episode(instance, 1_000 * index + number, target_bytes=int(kb * 1e3 * _OUTPUT_SHARE),
                                   model=agent)
            folder = directory / agent.replace("/", "__") / instance
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"{instance}.traj.json").write_text(json.dumps(mini_swe_agent_v1(episode)))


def start_sim(key: Path, max_model_len: int) -> tuple[subprocess.Popen[str], str]:
    process = subprocess.Popen([sys.executable, "-m", "kvjudge.testing.sim_judge", "--key", str(key), "--json",
                                "--max-model-len", str(max_model_len)], stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    return process, json.loads(process.stdout.readline())["url"]


class Requests:
    """Counts the HTTP requests kvjudge sends, by path (wrapping ServerClient.request)."""

    def __init__(self) -> None:
        self.by_path: dict[str, int] = {}
        self._original = ServerClient.request
        counts = self.by_path
        original = self._original

        def request(client: ServerClient, method: str, path: str, *args: Any, **kwargs: Any) -> Any:
            counts[path] = counts.get(path, 0) + 1
            return original(client, method, path, *args, **kwargs)

        ServerClient.request = request  # type: ignore[method-assign]

    def take(self) -> dict[str, int]:
        taken = dict(self.by_path)
        self.by_path.clear()
        return taken

    def close(self) -> None:
        ServerClient.request = self._original  # type: ignore[method-assign]


def _pairs(store: Store) -> list[tuple[str, str]]:
    by_task: dict[str, list[str]] = {}
    for state in store.runs.iter_runs():
        by_task.setdefault(str(state.task_id), []).append(state.id)
    return [tuple(sorted(ids)) for _, ids in sorted(by_task.items()) if len(ids) == 2]  # type: ignore[misc]


def _count_bodies(store: Store, counter: str) -> int:
    """Every body counted once under ``counter`` with the simulated judge's own tokenizer (as ingest would)."""
    refs = sorted({ref for state in store.runs.iter_runs() for ref in state.bodies})
    known = store.caches.cached_counts(refs, counter)
    fresh = {ref: len(SimJudge.tokens(store.blobs.text(ref) or "")) for ref in refs if ref not in known}
    store.caches.put_counts(counter, fresh)
    return len(refs)


def _views(judge: Judge, store: Store, a: str, b: str) -> tuple[PackedView, PackedView]:
    """The pair's views as the judge packs them (its own functions, no model call)."""
    pair = pair_bases(judge.base(store, a), judge.base(store, b), judge.counter)
    return pack_pair(pair.a, pair.b, judge.counter, judge.room, pair)


def _measure(store: Store, url: str, args: argparse.Namespace, requests: Requests) -> dict[str, Any]:
    pairs = _pairs(store)
    pool = open_servers([url], n_ctx=args.max_model_len, parallel=args.parallel)
    result: dict[str, Any] = {"bodies": _count_bodies(store, pool.counter_name)}
    requests.take()
    # The views alone (a judge of its own, so the judge timed below starts with nothing memoised).
    viewer = Judge(pool)
    started = time.perf_counter()
    packed = [_views(viewer, store, a, b) for a, b in pairs]
    seconds = time.perf_counter() - started
    sent = requests.take()
    result["views"] = {"ms_per_pair": round(1e3 * seconds / len(pairs), 2),
                       "tokenize_per_pair": round(sent.get("/tokenize", 0) / len(pairs), 3)}
    prompts = [viewer.order_prompts(*views) for views in packed]
    del packed
    # Cold judging and the bare requests, in rounds that take turns at going first (they share the load).
    judge = Judge(pool)
    timed = {"cold": 0.0, "bare": 0.0}
    cold: list[Any] = []
    tokenize = 0
    size = -(-len(pairs) // args.rounds)
    for number, start in enumerate(range(0, len(pairs), size)):
        chunk = slice(start, start + size)
        for step in (("bare", "cold") if number % 2 == 0 else ("cold", "bare")):
            began = time.perf_counter()
            if step == "bare":
                pool.score_many(prompts[chunk], lambda *_: None)
            else:
                cold += judge_batch(judge, store, pairs[chunk])
            timed[step] += time.perf_counter() - began
            sent = requests.take()
            tokenize += sent.get("/tokenize", 0) if step == "cold" else 0
    result["cold"] = {"pairs": len(cold), "seconds": round(timed["cold"], 2),
                      "pairs_per_s": round(len(cold) / timed["cold"], 2),
                      "outcomes": dict(Counter(v.outcome for v in cold)),
                      "tokenize_per_pair": round(tokenize / len(cold), 3)}
    result["bare_requests"] = {"pairs_per_s": round(len(pairs) / timed["bare"], 2), "seconds": round(timed["bare"], 2)}
    result["ratio_to_bare_requests"] = round(timed["bare"] / timed["cold"], 3)
    # Every verdict cached, against the least a lookup can do: read both runs' folded states and one cache row.
    started = time.perf_counter()
    cached = judge_batch(judge, store, pairs)
    seconds = time.perf_counter() - started
    sent = requests.take()
    started = time.perf_counter()
    for a, b in pairs:
        store.runs.run(a), store.runs.run(b), store.caches.get_judgment(a + b)
    floor = time.perf_counter() - started
    result["cached"] = {"ms_per_pair": round(1e3 * seconds / len(cached), 3),
                        "all_cached": all(v.cached for v in cached), "requests": sent,
                        "floor_ms_per_pair": round(1e3 * floor / len(pairs), 3),
                        "ratio_to_floor": round(seconds / floor, 2)}
    pool.close()
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--n", type=int, default=1000, help="trajectories per agent (= pairs)")
    parser.add_argument("--kb", type=float, default=40.0, help="about how large each trajectory file is")
    parser.add_argument("--parallel", type=int, default=4, help="requests in flight")
    parser.add_argument("--max-model-len", type=int, default=65_536)
    parser.add_argument("--rounds", type=int, default=4, help="rounds of cold judging and bare requests")
    parser.add_argument("--work", type=Path, help="keep trajectories and store here between runs")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    work = args.work or Path(tempfile.mkdtemp(prefix="kvjudge-pipeline-"))
    work.mkdir(parents=True, exist_ok=True)
    runs = work / f"runs-{args.n}"
    if not runs.exists():
        generate(runs.with_suffix(".tmp"), args.n, args.kb)
        runs.with_suffix(".tmp").rename(runs)
    store_path = work / f"store-{args.n}.sqlite"
    if not store_path.exists():
        with Store.open(store_path.with_suffix(".tmp")) as fresh:
            ingest_paths(fresh, [str(runs)])
        for suffix in ("", "-wal", "-shm"):
            source = Path(f"{store_path.with_suffix('.tmp')}{suffix}")
            if source.exists():
                source.rename(Path(f"{store_path}{suffix}"))
    with sqlite3.connect(store_path) as conn:  # a fresh start: no judgment, no count but the bodies' own
        conn.execute("DELETE FROM judgments")
        conn.execute("DELETE FROM blob_tokens WHERE ref NOT IN (SELECT ref FROM blobs)")
    key = work / "key.json"
    key.write_text(json.dumps({"runs": []}))
    process, url = start_sim(key, args.max_model_len)
    requests = Requests()
    result: dict[str, Any] = {"n": args.n, "parallel": args.parallel, "rounds": args.rounds}
    try:
        with Store.open(store_path) as store:
            result.update(_measure(store, url, args, requests))
    finally:
        requests.close()
        process.terminate()
        process.wait(timeout=10)
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    result["targets"] = {"pairs_per_s": TARGET_PAIRS_PER_S, "cached_ms_per_pair": TARGET_CACHED_MS}
    result["met"] = {"pairs_per_s": result["cold"]["pairs_per_s"] >= TARGET_PAIRS_PER_S,
                     "cached_ms_per_pair": result["cached"]["ms_per_pair"] <= TARGET_CACHED_MS}
    (args.out / "judge_pipeline.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
