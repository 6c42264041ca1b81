"""Judge servers against real llama-cpp-python servers on 127.0.0.1 (`python -m llama_cpp.server`, the default model).

Two servers run for the module (n_ctx 1024: servers on two shared cores are slow); the crash test starts a third
and kills it with SIGKILL mid-batch. The judge's window is given with --n-ctx here (certifying a served model is
tests/test_probe_server.py's business).
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import free_ports, store_from_runs
from llama_server import LlamaServer, server_extras_missing

from kvjudge.errors import ContextRefused, JudgeError, ServerUnavailable
from kvjudge.judge import SCORED, Judge, ServerBackend, ServerPool, judge_batch
from kvjudge.judge.prompt import RAW, TemplateText
from kvjudge.judge.server_logprobs import top_logprobs
from kvjudge.judge.runfacts import RUN_FACTS_KEY_PREFIX
from kvjudge.judge.verdict import VERDICT_KEY_PREFIX
from kvjudge.retention import Store
from kvjudge.server_client import RetryPolicy, ServerClient
from kvjudge.testing.native_runs import make_run
from kvjudge.tokens import ModelTokenizer

pytestmark = pytest.mark.model
N_CTX = 1024       # each server's context
JUDGE_N_CTX = 768  # the judge's window on them
# Two runs of the same pair on a llama-cpp-python server differ slightly: it reuses the KV of whatever prompt
# it evaluated last, so batches split differently. Measured here: |Δp| ≤ 0.005 per order.
LOGPROB_TOLERANCE = 0.02
FAST_RETRY = RetryPolicy(attempts=3, backoff_s=0.01, max_backoff_s=0.05)


@pytest.fixture(scope="module")
def servers(default_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[LlamaServer]]:
    missing = server_extras_missing()
    if missing:
        pytest.fail(missing)  # a missing extra fails loudly, never skips
    started: list[LlamaServer] = []
    try:
        for number in range(2):
            started.append(LlamaServer(default_model, N_CTX, tmp_path_factory.mktemp(f"server{number}")).start())
        yield started
    finally:
        for server in started:
            server.stop()


def _runs() -> list[dict]:
    good = make_run("good", ["collected 12 items\n12 passed"], passed=True)
    bad = make_run("bad", ["collected 12 items\nFAILED test_quote"], passed=False, final="1 failed, 11 passed")
    skipped = make_run("skipped", ["collected 12 items\n11 passed, 1 skipped"], passed=True)
    for run in (good, bad, skipped):
        run["task"]["id"] = "fix-csv"
    return [good, bad, skipped]


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    opened = store_from_runs(tmp_path / "store.sqlite", _runs())
    yield opened
    opened.close()


def _dead_url() -> str:
    return f"http://127.0.0.1:{free_ports(1)[0]}"  # nothing listens there: connections are refused


def test_the_server_backend_judges_a_pair_from_label_logprobs(servers: list[LlamaServer], store: Store,
                                                              default_model: Path) -> None:
    url = servers[0].url
    backend = ServerBackend(url=url, n_ctx=JUDGE_N_CTX)
    text = "collected 12 items"
    # The server's own tokenizer endpoint, without the BOS it adds to every tokenization.
    assert backend.count(text) == ModelTokenizer(default_model).count(text) > 0
    verdict = Judge(backend).judge_pair(store, "good", "bad")
    assert verdict.outcome in SCORED, verdict.error
    assert backend.calls == 2
    assert all(0.0 < p < 1.0 for p in verdict.p_a_by_order.values())
    manifest = verdict.manifest
    assert manifest["backend"] == "openai-server" and manifest["n_ctx"] == JUDGE_N_CTX
    assert manifest["backend_version"] == {"kind": "llama-cpp-python",
                                           "version": manifest["backend_version"]["version"]}
    assert url not in json.dumps(manifest)  # what judged, never where: a pool keys its cache like one server
    assert {o.server for o in verdict.orders} == {url}
    # Same pair again: read from the store's judgment cache, no request to the server.
    again = Judge(backend).judge_pair(store, "good", "bad")
    assert backend.calls == 2 and again.cached and again.p_a == verdict.p_a


def test_the_chat_framing_goes_to_the_chat_completions_api(servers: list[LlamaServer]) -> None:
    # Template text (TemplateText segments) stays out of the request: the server applies its own template to the
    # user message, and the answer comes back in the chat shape (logprobs.content[0].top_logprobs). The base
    # model answers the forced choice only after an "Answer:" cue, so the raw question is what is wrapped here.
    backend = ServerBackend(url=servers[1].url, n_ctx=JUDGE_N_CTX)
    segments = [TemplateText("<start_of_turn>user\n"), *RAW.segments("Task t: the tests pass.", "Task t: they fail."),
                TemplateText("<end_of_turn>\n<start_of_turn>model\n")]
    score = backend.score(segments)
    assert 0.0 < score.probs["A"] < 1.0 and score.label_mass > 0 and score.prompt_tokens > 0
    assert score.server == backend.url
    assert servers[1].log(tail=None).count('"POST /v1/chat/completions HTTP/1.1" 200') == 1
    # The chat shape as the server wrote it: a list of {token, logprob} for the first generated token.
    answer = backend.client.chat([{"role": "user", "content": "".join(RAW.segments("x", "y"))}], top_logprobs=20)
    entries = answer["choices"][0]["logprobs"]["content"][0]["top_logprobs"]
    assert top_logprobs(answer) == {e["token"]: e["logprob"] for e in entries} and len(entries) == 20


def test_a_server_that_does_not_report_its_context_needs_a_probe_or_n_ctx(servers: list[LlamaServer]) -> None:
    with pytest.raises(JudgeError, match=r"kvjudge probe --server .* or pass --n-ctx"):
        ServerBackend(url=servers[0].url)


def test_labels_missing_from_the_top_logprobs_are_an_error_not_a_guess(servers: list[LlamaServer],
                                                                       store: Store) -> None:
    # With only the single most likely token returned, at most one label can be among them.
    backend = ServerBackend(url=servers[0].url, n_ctx=JUDGE_N_CTX, top_logprobs=1)
    verdict = Judge(backend, use_cache=False).judge_pair(store, "good", "bad")
    assert verdict.outcome == "error" and verdict.p_a is None
    assert "not among the server's top 1" in (verdict.error or "")


def test_a_batch_sends_each_distinct_call_once_and_decides_as_the_sequential_path(
        servers: list[LlamaServer], store: Store, default_model: Path) -> None:
    pool = ServerPool([ServerBackend(url=s.url, n_ctx=JUDGE_N_CTX) for s in servers], parallel=2,
                      tokenizer=ModelTokenizer(default_model))
    judge = Judge(pool)
    # The same pair twice in one batch: one request per order; the second reads it as from the cache.
    first, second = judge_batch(judge, store, [("good", "bad"), ("good", "bad")])
    assert pool.calls == 2 and first.outcome in SCORED and not first.cached
    assert second.cached and second.p_a_by_order == first.p_a_by_order
    assert set(first.to_json()["answered_by"].values()) <= {s.url for s in servers}
    # The sequential path over the same store reads the batch's cache entries: the same keys.
    again = judge.judge_pair(store, "good", "bad")
    assert again.cached and again.p_a == first.p_a and pool.calls == 2


def test_transient_failures_are_retried_and_refusals_are_not(servers: list[LlamaServer]) -> None:
    url = servers[0].url
    refused = ServerClient(_dead_url(), retry=FAST_RETRY)
    with pytest.raises(ServerUnavailable) as dead:
        refused.identify()
    assert dead.value.reason == "connection" and refused.requests_sent == FAST_RETRY.attempts
    # A real 5xx: llama-cpp-python fails inside on a logit bias that is not a token id.
    failing = ServerClient(url, retry=FAST_RETRY)
    with pytest.raises(ServerUnavailable) as five:
        failing.request("POST", "/v1/completions", {"prompt": "x", "max_tokens": 1, "logit_bias": {"abc": 1.0}})
    assert five.value.reason == "http 500" and failing.requests_sent == FAST_RETRY.attempts
    # A context refusal is an answer (a measured overflow), not a failure: asked once.
    too_long = ServerClient(url, retry=FAST_RETRY)
    with pytest.raises(ContextRefused) as over:
        too_long.complete("word " * 1500, max_tokens=1)
    assert over.value.n_ctx == N_CTX and over.value.prompt_tokens > N_CTX and too_long.requests_sent == 1
    # A time-out is not retried on the same server (the same prompt would take as long again).
    slow = ServerClient(url, retry=FAST_RETRY, timeout_s=0.01)
    with pytest.raises(ServerUnavailable) as late:
        slow.complete("word " * 200, max_tokens=1)
    assert late.value.reason == "timeout" and slow.requests_sent == 1


def test_a_pool_sends_a_call_to_another_server_when_one_refuses_connections(servers: list[LlamaServer],
                                                                           store: Store, default_model: Path) -> None:
    live = ServerBackend(url=servers[0].url, n_ctx=JUDGE_N_CTX)
    dead = ServerBackend(url=_dead_url(), n_ctx=JUDGE_N_CTX, info=live.info, retry=FAST_RETRY)
    # Count locally, so the dead server is first met by the judge call itself (it is first in line).
    pool = ServerPool([dead, live], parallel=1, tokenizer=ModelTokenizer(default_model))
    verdict = Judge(pool, use_cache=False).judge_pair(store, "good", "bad")
    assert verdict.outcome in SCORED, verdict.error
    assert set(pool.dropped) == {dead.url} and pool.resent == 1
    assert {o.server for o in verdict.orders} == {live.url} and dead.calls == 0


def test_a_server_whose_calls_keep_failing_is_dropped_and_its_calls_go_elsewhere(
        servers: list[LlamaServer], tmp_path: Path, default_model: Path) -> None:
    fine = ServerBackend(url=servers[1].url, n_ctx=JUDGE_N_CTX)
    # Alive, but no answer ever comes within its time-out: each call fails (a time-out is not retried there).
    hopeless = ServerBackend(url=servers[0].url, n_ctx=JUDGE_N_CTX, info=fine.info, timeout_s=0.01)
    pool = ServerPool([hopeless, fine], parallel=1, tokenizer=ModelTokenizer(default_model))
    # A pair's second order goes where its first was answered, so the failing server is offered first orders only:
    # four pairs (no two the same pair in either order) give it three to fail while the other answers the fourth.
    other = make_run("other", ["collected 12 items\n10 passed, 2 failed"], passed=False, final="2 failed")
    other["task"]["id"] = "fix-csv"
    pairs = [("good", "bad"), ("good", "skipped"), ("bad", "skipped"), ("other", "good")]
    with store_from_runs(tmp_path / "four.sqlite", [*_runs(), other]) as store:
        verdicts = judge_batch(Judge(pool, use_cache=False), store, pairs)
    assert all(v.outcome in SCORED for v in verdicts), [v.error for v in verdicts]
    assert all(o.server == fine.url for v in verdicts for o in v.orders)
    assert list(pool.dropped) == [hopeless.url] and "3 calls in a row failed" in pool.dropped[hopeless.url]
    assert pool.resent == 3 and hopeless.calls == 0 and fine.calls == 8


def test_when_every_server_fails_the_pair_is_an_error_never_a_score(servers: list[LlamaServer], store: Store,
                                                                    default_model: Path) -> None:
    live = ServerBackend(url=servers[0].url, n_ctx=JUDGE_N_CTX)
    dead = [ServerBackend(url=_dead_url(), n_ctx=JUDGE_N_CTX, info=live.info, retry=FAST_RETRY) for _ in range(2)]
    live.close()
    pool = ServerPool(dead, parallel=2, tokenizer=ModelTokenizer(default_model))
    verdicts = judge_batch(Judge(pool, use_cache=False), store, [("good", "bad"), ("good", "skipped")])
    assert [v.outcome for v in verdicts] == ["error", "error"]
    assert all(v.p_a is None and not v.scored for v in verdicts)
    assert "every judge server failed" in (verdicts[0].error or "")
    assert set(pool.dropped) == {b.url for b in dead}


def _judgment_keys(path: Path) -> set[str]:
    """The order and verdict caches' keys (not the facts kept of the runs: what their views derive from)."""
    with sqlite3.connect(path) as db:
        return {key for (key,) in db.execute("SELECT key FROM judgments") if not key.startswith(RUN_FACTS_KEY_PREFIX)}


def test_a_pool_survives_a_server_killed_mid_batch(servers: list[LlamaServer], default_model: Path,
                                                  tmp_path: Path) -> None:
    survivor = servers[0]
    pool_store, seq_store = tmp_path / "pool.sqlite", tmp_path / "sequential.sqlite"
    store_from_runs(pool_store, _runs()).close()
    shutil.copy(pool_store, seq_store)
    with LlamaServer(default_model, N_CTX, tmp_path / "doomed") as doomed:
        command = [sys.executable, "-m", "kvjudge", "judge", "--task", "fix-csv", "--server", survivor.url,
                   "--server", doomed.url, "--n-ctx", str(JUDGE_N_CTX), "--store", str(pool_store), "--json"]
        # stderr to a file: a pipe nobody reads could fill and stall the child.
        with (tmp_path / "stderr.txt").open("w") as stderr:
            child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=stderr, text=True)
            assert child.stdout is not None
            # Killed as soon as it has answered one call: a pair's two orders go to one server back to back, so the
            # other order is then in flight (or about to be sent), however fast this machine is.
            deadline = time.monotonic() + 600
            while doomed.answered() == 0:
                assert child.poll() is None and time.monotonic() < deadline, "the doomed server answered no call"
                time.sleep(0.005)
            doomed.kill()
            output = child.stdout.read()
            child.wait(timeout=900)
        errors = (tmp_path / "stderr.txt").read_text()
        assert doomed.process is not None and doomed.process.returncode == -9
    assert child.returncode == 0, errors
    lines = [json.loads(line) for line in output.splitlines()]
    pairs, summary = lines[:-1], lines[-1]["summary"]
    assert len(pairs) == 3
    # The two orders of a pair went to one server, one after the other (its prompt cache can reuse their prefix);
    # the second pair went to the other server meanwhile.
    assert len(set(pairs[0]["answered_by"].values())) == 1
    # Every pair still has a verdict. The calls in flight on the killed server were sent to the survivor: every
    # order attributed to the killed server is one its own access log shows it answered (200), none a failed call.
    assert all(p["outcome"] in SCORED and p["error"] is None for p in pairs)
    answered_by_doomed = sum(url == doomed.url for p in pairs for url in p["answered_by"].values())
    assert answered_by_doomed == doomed.answered() >= 1
    assert summary["servers"]["calls"][doomed.url] == answered_by_doomed
    assert list(summary["servers"]["dropped"]) == [doomed.url] and summary["servers"]["resent"] >= 1

    sequential = subprocess.run([sys.executable, "-m", "kvjudge", "judge", "--task", "fix-csv", "--server",
                                 survivor.url, "--n-ctx", str(JUDGE_N_CTX), "--store", str(seq_store), "--json"],
                                capture_output=True, text=True, timeout=900)
    assert sequential.returncode == 0, sequential.stderr
    alone = [json.loads(line) for line in sequential.stdout.splitlines()][:-1]
    # The same pairs, the same cache keys (an order's per order, a verdict's per pair), the same manifests, the same
    # verdicts within logprob rounding.
    keys = _judgment_keys(seq_store)
    assert _judgment_keys(pool_store) == keys and len(keys) == 6 + 3
    assert sum(key.startswith(VERDICT_KEY_PREFIX) for key in keys) == 3
    for pooled, single in zip(pairs, alone, strict=True):
        assert (pooled["a"], pooled["b"]) == (single["a"], single["b"])
        assert pooled["manifest"] == single["manifest"]
        assert pooled["outcome"] == single["outcome"]
        for order in ("ab", "ba"):
            assert pooled["p_a_by_order"][order] == pytest.approx(single["p_a_by_order"][order],
                                                                  abs=LOGPROB_TOLERANCE)
