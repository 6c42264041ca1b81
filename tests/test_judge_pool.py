"""A judge served by a pool of replicas, directly (several ``--server``) or behind a real router (``vllm-router``):
what judging cost is measured from the replicas' own figures, every call of a pair meets one replica, a key is
sent and never written, and a pool's faults (a replica killed mid-run, a replica whose window is smaller, a 503
while replicas restart, a wrong key) end as outcomes or one line, never as a score or a call counted twice.

The replicas are :class:`~kvjudge.testing.sim_replica.SimReplica`: the simulated judge with a prefix cache of its
own, reporting ``cached_tokens`` as vLLM does, and adding up what it answered (the figures a ledger must equal).
"""

from __future__ import annotations

import json
import os
import threading
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import ExitStack
from pathlib import Path

import pytest
from helpers import kvjudge, kvjudge_json
from router import VllmRouter

from kvjudge.judge import Judge, judge_batch, open_servers
from kvjudge.judge.pointwise import score_runs
from kvjudge.judge.protocols import make_protocol
from kvjudge.retention import Store
from kvjudge.server_client import RetryPolicy
from kvjudge.testing.graded_runs import GradedRun, swe_run, write_graded
from kvjudge.testing.sim_judge import AnswerKey, Settings
from kvjudge.testing.sim_replica import ReplicaSettings, SimReplica

PAIRS = 12
KEY_VALUE = "sk-kvjudge-test-5f1d0c9e-never-written"


def _runs(pairs: int = PAIRS) -> list[GradedRun]:
    return [run for n in range(pairs) for run in (
        swe_run(f"t{n}/pass", task=f"t{n}", passed=True, seed=n, explore=2, file_lines=30),
        swe_run(f"t{n}/fail", task=f"t{n}", passed=False, seed=n, explore=2, file_lines=30))]


@pytest.fixture
def graded(tmp_path: Path) -> tuple[Path, Path]:
    """A store of PAIRS same-task pairs (ingested with the CLI) and the answer key."""
    runs_file, key = write_graded(tmp_path, _runs())
    store = tmp_path / "store.sqlite"
    assert kvjudge_json("ingest", str(runs_file), "--store", str(store))["imported"] == 2 * PAIRS
    return store, key


@pytest.fixture
def start() -> Iterator[ExitStack]:
    with ExitStack() as stack:
        yield stack


def _replicas(stack: ExitStack, key: Path, count: int = 2, *, windows: Sequence[int] | None = None,
              **replica: object) -> list[SimReplica]:
    settings = [Settings(seed=3, max_model_len=w) for w in (windows or [32_768] * count)]
    return [stack.enter_context(SimReplica(AnswerKey.load(key), s, replica=ReplicaSettings(**replica)))
            for s in settings]


def _total(replicas: Sequence[SimReplica], before: Sequence[Counter[str]] | None = None) -> dict[str, int]:
    total: Counter[str] = Counter()
    for index, replica in enumerate(replicas):
        total.update(replica.usage)
        if before is not None:
            total.subtract(before[index])
    return {name: total[name] for name in ("calls", "prompt_tokens", "cached_tokens", "completion_tokens")}


def _ledger(cost: dict) -> dict[str, int]:
    return {"calls": cost["calls"], "prompt_tokens": cost["prompt_tokens"],
            "cached_tokens": cost["cached_prompt_tokens"], "completion_tokens": cost["completion_tokens"]}


def test_a_direct_pool_reports_what_the_replicas_served_from_their_prefix_caches(graded, start, tmp_path) -> None:
    store, key = graded
    replicas = _replicas(start, key)
    for replica in replicas:
        assert kvjudge_json("probe", "--server", replica.url)["certified"]
    before = [Counter(r.usage) for r in replicas]
    args = [a for r in replicas for a in ("--server", r.url)]
    done = kvjudge("eval", *args, "--store", str(store), "--png", str(tmp_path / "e.png"), "--json")
    assert done.returncode == 0, done.stderr
    cost = json.loads(done.stdout)["templates"]["raw"]["cost"]
    # The ledger's totals are the replicas' own usage figures, exactly.
    assert _ledger(cost) == _total(replicas, before)
    assert cost["calls"] == 2 * PAIRS and cost["retries"] == 0 and cost["cached_reported_calls"] == 2 * PAIRS
    # The two orders of a pair share the instructions: the second reuses them from the replica that read the first.
    assert 0 < cost["cached_prompt_tokens"] < cost["prompt_tokens"]
    # Before the calls: one line saying what they may cost and the way out.
    assert f"about to send up to {2 * PAIRS} judge calls" in done.stderr and "Ctrl-C" in done.stderr
    # A second run reads every verdict from the cache: no call, nothing to announce.
    again = kvjudge_json("eval", *args, "--store", str(store), "--png", str(tmp_path / "e.png"))
    assert again["templates"]["raw"]["cost"]["calls"] == 0
    assert _total(replicas, before)["calls"] == 2 * PAIRS


def test_a_server_that_reports_no_cached_tokens_is_not_reported_never_zero(graded, start, tmp_path) -> None:
    store, key = graded
    [replica] = _replicas(start, key, 1, capacity_tokens=0)  # no prefix caching: prompt_tokens_details null
    result = kvjudge_json("eval", "--server", replica.url, "--n-ctx", "8192", "--store", str(store),
                          "--png", str(tmp_path / "e.png"))
    cost = result["templates"]["raw"]["cost"]
    assert cost["calls"] == 2 * PAIRS and cost["cached_prompt_tokens"] is None and cost["cached_share"] is None
    assert cost["prompt_tokens"] == replica.usage["prompt_tokens"]


def test_through_a_router_every_call_of_a_pair_meets_one_replica_and_the_ledger_is_exact(graded, start,
                                                                                         tmp_path) -> None:
    store, key = graded
    replicas = _replicas(start, key, 3)
    router = start.enter_context(VllmRouter([r.url for r in replicas], "consistent_hash", log_dir=tmp_path))
    probed = kvjudge_json("probe", "--server", router.url)  # probed through the router
    assert probed["certified"] and probed["max_context_tokens"] == 32_768
    before = [Counter(r.usage) for r in replicas]
    for replica in replicas:
        replica.sessions.clear()
    result = kvjudge_json("eval", "--server", router.url, "--store", str(store), "--png", str(tmp_path / "e.png"))
    figures = result["templates"]["raw"]
    assert figures["judge"]["coverage"] == 1.0
    assert _ledger(figures["cost"]) == _total(replicas, before)
    # Each pair's key, in the header and the user field alike, reached exactly one replica, both orders of it.
    seen: dict[str, int] = {}
    for index, replica in enumerate(replicas):
        for (header, user), calls in replica.sessions.items():
            assert header == user and header.startswith("kvjudge-") and calls == 2
            assert header not in seen
            seen[header] = index
    assert len(seen) == PAIRS and len(set(seen.values())) > 1  # spread over the replicas, never split
    assert figures["cost"]["cached_prompt_tokens"] > 0


def _pool_judge(url: str, store: Path, *, retry: RetryPolicy | None = None,
                protocol: str = "letter", repeats: int = 1) -> tuple[Judge, Store]:
    backend = open_servers([url], n_ctx=8192, parallel=2, retry=retry)
    return Judge(backend, protocol=make_protocol(protocol, repeats=repeats)), Store.open(store)


def _pairs() -> list[tuple[str, str]]:
    return [(f"t{n}/pass", f"t{n}/fail") for n in range(PAIRS)]


def test_a_replica_killed_mid_run_behind_the_router_leaves_every_verdict_scored_once(graded, start,
                                                                                    tmp_path) -> None:
    store_path, key = graded
    replicas = _replicas(start, key, 2)
    router = start.enter_context(VllmRouter([r.url for r in replicas], "consistent_hash", log_dir=tmp_path))
    judge, store = _pool_judge(router.url, store_path, retry=RetryPolicy(attempts=6, backoff_s=0.3))
    killed = threading.Event()

    def on_verdict(index: int, _verdict: object) -> None:
        if index == 3 and not killed.is_set():
            killed.set()
            replicas[0].kill()

    with store:
        verdicts = judge_batch(judge, store, _pairs(), on_verdict=on_verdict)
    judge.backend.close()
    assert killed.is_set() and not replicas[0].url.endswith(":0")
    assert [v.outcome in ("a", "b", "tie", "inconsistent") for v in verdicts] == [True] * PAIRS
    ledger = judge.backend.ledger
    # Every call counted once, when answered; a replica that answered a call whose answer the crash lost counted it.
    assert ledger.calls == 2 * PAIRS == sum(v.cost.calls for v in verdicts)
    assert _total(replicas)["calls"] >= ledger.calls
    assert replicas[1].usage["calls"] > 0


def test_a_503_while_the_replicas_restart_is_retried_within_the_policy(graded, start, tmp_path) -> None:
    store_path, key = graded
    replicas = _replicas(start, key, 2)
    router = start.enter_context(VllmRouter([r.url for r in replicas], "consistent_hash", log_dir=tmp_path))
    judge, store = _pool_judge(router.url, store_path, retry=RetryPolicy(attempts=8, backoff_s=0.3))
    restarted = threading.Timer(2.0, lambda: [r.refuse() for r in replicas])

    def restarting(_calls: int, _cached: int) -> None:  # from just before the first call, for two seconds
        for replica in replicas:
            replica.refuse("/v1/completions")
        restarted.start()

    with store:
        verdicts = judge_batch(judge, store, _pairs()[:4], on_plan=restarting)
    judge.backend.close()
    assert all(v.scored for v in verdicts)
    ledger = judge.backend.ledger
    assert ledger.calls == 8 and ledger.retries >= 1 and _ledger(ledger.to_json()) == _total(replicas)


def test_a_replica_whose_window_is_smaller_refuses_its_pairs_as_overflow_never_a_verdict(graded, start,
                                                                                        tmp_path) -> None:
    store_path, key = graded
    # The second holds less than one view but reports the first's window, as the pool was probed: whichever replica
    # the router sends the identification to, the window probed is 32,768 and the small one's pairs overflow.
    replicas = [start.enter_context(SimReplica(AnswerKey.load(key), Settings(seed=3, max_model_len=window),
                                               replica=ReplicaSettings(reported_window=32_768)))
                for window in (32_768, 1_024)]
    router = start.enter_context(VllmRouter([r.url for r in replicas], "consistent_hash", log_dir=tmp_path))
    judge, store = _pool_judge(router.url, store_path)
    with store:
        verdicts = judge_batch(judge, store, _pairs())
        judge.backend.close()
        outcomes = Counter(v.outcome if not v.scored else "scored" for v in verdicts)
        # Pairs routed to the small replica are overflows (its refusal measured), the rest scored; nothing else.
        assert set(outcomes) <= {"scored", "overflow"} and outcomes["scored"] + outcomes["overflow"] == PAIRS
        assert outcomes["overflow"] > 0 and replicas[1].usage["calls"] == 0
        ledger = judge.backend.ledger
        assert ledger.calls == 2 * outcomes["scored"] == replicas[0].usage["calls"]
        # An overflow is not cached as a verdict: a run after the replica is fixed judges those pairs again.
        again = judge_batch(Judge(open_servers([replicas[0].url], n_ctx=8192)), store, _pairs())
    assert sum(v.cached for v in again) == outcomes["scored"] and all(v.scored for v in again)


def test_a_key_is_sent_from_the_named_variable_and_written_nowhere(graded, start, tmp_path) -> None:
    store, key = graded
    replicas = _replicas(start, key, 2, api_key=KEY_VALUE)
    router = start.enter_context(VllmRouter([r.url for r in replicas], "consistent_hash", api_key=KEY_VALUE,
                                            log_dir=tmp_path))
    env = {**os.environ, "KVJ_POOL_KEY": KEY_VALUE}
    outputs = []
    for args in (("probe", "--server", router.url), ("eval", "--server", router.url, "--store", str(store),
                                                     "--png", str(tmp_path / "e.png")),
                 ("judge", "t0/pass", "t0/fail", "--server", router.url, "--store", str(store))):
        done = kvjudge(*args, "--api-key-env", "KVJ_POOL_KEY", "--json", env=env)
        assert done.returncode == 0, done.stderr
        outputs += [done.stdout, done.stderr]
    assert sum(r.usage["calls"] for r in replicas) >= 2 * PAIRS
    cache_dir = Path(os.environ["KVJUDGE_CACHE_DIR"])
    written = [store.read_bytes(), *(p.read_bytes() for p in cache_dir.rglob("*") if p.is_file())]
    assert written and all(KEY_VALUE.encode() not in blob for blob in written)
    assert all(KEY_VALUE not in text for text in outputs)

    # A wrong key, or none: one line naming the variable (never the key), no retry loop.
    for variable, value in (("KVJ_POOL_KEY", "sk-wrong"), (None, None)):
        flags = ("--api-key-env", variable) if variable else ()
        done = kvjudge("probe", "--server", router.url, *flags, env={**os.environ, **({variable: value} if variable
                                                                                      else {})})
        lines = done.stderr.strip().splitlines()
        assert done.returncode != 0 and len(lines) == 1, done.stderr
        assert ("KVJ_POOL_KEY" in lines[0]) if variable else ("api_key_env" in lines[0])
        assert "sk-wrong" not in done.stderr + done.stdout and "HTTP 401" in lines[0]


def test_ctrl_c_mid_run_leaves_every_finished_verdict_cached(graded, start) -> None:
    store_path, key = graded
    replicas = _replicas(start, key, 2)
    judge, store = _pool_judge(replicas[0].url, store_path)
    finished: list[int] = []

    def interrupt(index: int, _verdict: object) -> None:
        finished.append(index)
        if index == 4:
            raise KeyboardInterrupt

    with store:
        with pytest.raises(KeyboardInterrupt):
            judge_batch(judge, store, _pairs(), on_verdict=interrupt)
        judge.backend.close()
        rerun = Judge(open_servers([replicas[0].url], n_ctx=8192))
        verdicts = judge_batch(rerun, store, _pairs())
        rerun.backend.close()
    assert finished == [0, 1, 2, 3, 4]
    assert all(verdicts[i].cached for i in finished)  # the five reported before Ctrl-C, and any decided after
    assert rerun.backend.ledger.calls == 2 * sum(not v.cached for v in verdicts) < 2 * PAIRS


#: Pointwise 3 criteria (the default rubric) × 3 repeats: nine readings of each run.
READINGS = 3 * 3
SCORED = [f"t{n}/{side}" for n in range(3) for side in ("pass", "fail")]


def test_pointwise_3x3_through_the_router_meets_one_replica_per_run_and_the_ledger_is_exact(graded, start,
                                                                                          tmp_path) -> None:
    store, key = graded
    replicas = _replicas(start, key, 2)
    router = start.enter_context(VllmRouter([r.url for r in replicas], "consistent_hash", log_dir=tmp_path))
    assert kvjudge_json("probe", "--server", router.url)["certified"]  # the probe's calls are its own, not scoring's
    before = [Counter(r.usage) for r in replicas]
    for replica in replicas:
        replica.sessions.clear()
    done = kvjudge("score", *SCORED, "--server", router.url, "--protocol", "pointwise", "--repeats", "3",
                   "--store", str(store), "--json")
    assert done.returncode == 0, done.stderr
    *runs, last = [json.loads(line) for line in done.stdout.splitlines()]
    cost = last["summary"]["cost"]
    assert [r["outcome"] for r in runs] == ["scored"] * len(SCORED)
    # The command's ledger is the replicas' own usage, exactly, and the sum of the scores' own costs.
    assert _ledger(cost) == _total(replicas, before)
    assert cost["calls"] == READINGS * len(SCORED) == sum(r["cost"]["calls"] for r in runs)
    assert cost["prompt_tokens"] == sum(r["cost"]["prompt_tokens"] for r in runs)
    assert f"about to send up to {READINGS * len(SCORED)} judge calls" in done.stderr
    # One run's nine readings: one key, all on one replica, so each after the first reuses the run's prefix.
    keys = [k for r in replicas for k in r.sessions]
    assert len(keys) == len(set(keys)) == len(SCORED)
    assert all(calls == READINGS for r in replicas for calls in r.sessions.values())
    for run in runs:
        # The first reading of a run is cold but for the instructions; the eight after it share all but the
        # criterion and question at the end (one block of 16 tokens or a few), so well over 3/4 is cached.
        assert run["cost"]["cached_prompt_tokens"] >= 0.75 * run["cost"]["prompt_tokens"]
    # Scored again: every score from the cache, each costing nothing, the replicas asked nothing.
    again = [json.loads(line) for line in kvjudge(
        "score", *SCORED, "--server", router.url, "--protocol", "pointwise", "--repeats", "3",
        "--store", str(store), "--json").stdout.splitlines()]
    assert all(r["cached"] and r["cost"]["calls"] == 0 for r in again[:-1]) and again[-1]["summary"]["cost"]["calls"] == 0
    shown = kvjudge("score", *SCORED, "--server", router.url, "--protocol", "pointwise", "--repeats", "3",
                    "--store", str(store)).stdout
    assert "(cached)" in shown and "cost: 0 calls, 0 prompt tokens" in shown
    assert _total(replicas, before)["calls"] == cost["calls"]


def test_a_replica_killed_mid_run_under_pointwise_leaves_every_run_scored_once(graded, start, tmp_path) -> None:
    store_path, key = graded
    replicas = _replicas(start, key, 2)
    router = start.enter_context(VllmRouter([r.url for r in replicas], "consistent_hash", log_dir=tmp_path))
    judge, store = _pool_judge(router.url, store_path, retry=RetryPolicy(attempts=6, backoff_s=0.3),
                               protocol="pointwise", repeats=3)
    killed = threading.Event()

    def on_score(_index: int, _score: object) -> None:
        if not killed.is_set():
            killed.set()
            replicas[0].kill()

    with store:
        scores = score_runs(judge, store, SCORED, on_score=on_score)
    judge.backend.close()
    assert killed.is_set()
    assert sorted(s.run_id for s in scores) == sorted(SCORED) and all(s.scored for s in scores)
    ledger = judge.backend.ledger
    # Every reading counted once, when answered; an answer the crash lost was counted by its replica only.
    assert ledger.calls == READINGS * len(SCORED) == sum(s.cost.calls for s in scores)
    assert ledger.prompt_tokens == sum(s.cost.prompt_tokens for s in scores)
    assert _total(replicas)["calls"] >= ledger.calls and replicas[1].usage["calls"] > 0


def test_counting_locally_with_a_tokenizer_model_sends_no_tokenize_through_the_router(graded, start, tmp_path,
                                                                                       judge_model) -> None:
    store, key = graded
    replicas = _replicas(start, key, 2)
    router = start.enter_context(VllmRouter([r.url for r in replicas], "consistent_hash", log_dir=tmp_path))
    assert kvjudge_json("probe", "--server", router.url)["certified"]
    asked = sum(r.requests["/tokenize"] for r in replicas)
    before = [Counter(r.usage) for r in replicas]
    done = kvjudge("score", *SCORED[:2], "--server", router.url, "--tokenizer-model", str(judge_model),
                   "--protocol", "pointwise", "--store", str(store), "--json")
    assert done.returncode == 0, done.stderr
    *runs, last = [json.loads(line) for line in done.stdout.splitlines()]
    assert [r["outcome"] for r in runs] == ["scored"] * 2
    # Every count was made here, with the served model's own tokenizer file: not one /tokenize reached a replica.
    assert sum(r.requests["/tokenize"] for r in replicas) == asked
    # The tokens spent are still the replicas' own figures.
    assert _ledger(last["summary"]["cost"]) == _total(replicas, before)
