"""`kvjudge probe --server` against a real llama-cpp-python server, and the commands that read its entry.

The server runs the default model with a 512-token context, so certification (one prompt of ~500 tokens) stays
short on two shared cores, and without logprobs: the probe asks for none, so the server computes the last prompt
token's logits only. llama-cpp-python's server does not report its context size: the probe learns it from the
server's refusal of a longer prompt.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import free_ports, kvjudge, kvjudge_json, local_cold_url, store_from_runs
from llama_server import LlamaServer, server_extras_missing

from kvjudge.models import file_sha256
from kvjudge.probe.certify import PROMPT_RESERVE
from kvjudge.testing.native_runs import make_run

pytestmark = pytest.mark.model
SERVED_N_CTX = 512


@pytest.fixture(scope="module")
def server(default_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    missing = server_extras_missing()
    if missing:
        pytest.fail(missing)
    with LlamaServer(default_model, SERVED_N_CTX, tmp_path_factory.mktemp("served"), logprobs=False) as started:
        yield started


def _long_runs() -> list[dict]:
    # Real-looking tool output well over the ceiling a 512-token judge context allows (512 // 2).
    log = "\n".join(f"tests/test_csv.py::test_quote_{i} PASSED  [{i}%]" for i in range(60))
    return [make_run("long", [log, log], passed=True), make_run("short", ["1 passed"], passed=True)]


def test_probe_server_certifies_within_the_served_context_and_reduce_reads_it(
        server: LlamaServer, default_model: Path, tmp_path: Path) -> None:
    probed = kvjudge_json("probe", "--server", server.url)
    assert probed["server"]["kind"] == "llama-cpp-python" and probed["server"]["url"] == server.url
    assert probed["model_sha256"] == file_sha256(default_model)  # the served file is readable here
    # The served context, named by the server itself when it refused a longer prompt (a measured overflow).
    assert probed["max_context_tokens"] == SERVED_N_CTX and "refusal" in probed["server"]["n_ctx_source"]
    assert probed["certified"] and probed["method"] == "measured"
    assert SERVED_N_CTX - PROMPT_RESERVE - 2 <= probed["max_ok_input"] < SERVED_N_CTX
    assert probed["safe_context"] <= probed["max_ok_input"]
    trials = probed["trials"]
    assert len(trials) <= 3
    assert [t["outcome"] for t in trials].count("ok") == 1
    ran = next(t for t in trials if t["outcome"] == "ok")
    assert ran["prompt_tokens"] == probed["max_ok_input"]  # the server's own count of what ran
    assert all(t["n_ctx_reported"] == SERVED_N_CTX and t["prompt_tokens"] >= SERVED_N_CTX
               for t in trials if t["outcome"] == "overflow")

    again = kvjudge_json("probe", "--server", server.url)
    assert again["cached"] and again["fingerprint"] == probed["fingerprint"] and again["trials"] == trials

    shown = kvjudge_json("cache", "show")
    [entry] = shown["entries"]
    assert entry["device"] == f"server:{server.url}" and entry["status"] == "fresh"

    store = tmp_path / "store.sqlite"
    store_from_runs(store, _long_runs()).close()
    reduced = kvjudge_json("reduce", "--all", "--server", server.url, "--store", str(store))
    bound = reduced["ceilings"]["default"]
    assert bound["max_context_tokens"] == SERVED_N_CTX
    assert bound["effective"] == SERVED_N_CTX // 2 and bound["winner"] == "hardware"
    assert reduced["capability"]["fingerprint"] == probed["fingerprint"]
    assert reduced["counter"] == f"model:{probed['model_sha256'][:16]}"  # the served model's own tokenizer
    long_run = next(r for r in reduced["runs"] if r["run"] == "long")
    assert long_run["tokens_before"] > SERVED_N_CTX // 2 >= long_run["tokens_after"] and long_run["fits"]
    # tier gates on the same served bound: both runs are within it now, so both move.
    tiered = kvjudge_json("tier", "--all", "--server", server.url, "--to", local_cold_url(tmp_path),
                          "--store", str(store))
    assert tiered["ceilings"] == {"default": SERVED_N_CTX // 2} and tiered["left_behind"] == []
    assert sorted((r["run"], r["status"]) for r in tiered["runs"]) == [("long", "tiered"), ("short", "tiered")]

    # [judge] server names the judge: budget --ceiling reads the same entry.
    (tmp_path / "kvjudge.toml").write_text(f'[judge]\nserver = "{server.url}"\n')
    ceiling = kvjudge_json("budget", "--ceiling", cwd=tmp_path)
    assert ceiling["effective"] == SERVED_N_CTX // 2
    assert ceiling["capability"]["fingerprint"] == probed["fingerprint"]
    budget = kvjudge_json("budget", "--server", server.url)
    assert budget["tokens"] == probed["max_ok_input"] and budget["source"] == "max_ok_input"


def test_a_missing_or_stale_server_entry_is_a_clear_error(server: LlamaServer, tmp_path: Path) -> None:
    store = tmp_path / "store.sqlite"
    store_from_runs(store, _long_runs()).close()
    nowhere = f"http://127.0.0.1:{free_ports(1)[0]}"
    cold = f"file://{tmp_path}"
    # A server nobody can reach has no figure and cannot be probed: a clear error, never the configured ceiling.
    for args in (("reduce", "--all", "--server", nowhere, "--store", str(store)),
                 ("tier", "--all", "--server", nowhere, "--to", cold, "--store", str(store))):
        done = kvjudge(*args)
        assert done.returncode != 0 and "Traceback" not in done.stderr
        assert "no probe figure for the model served at" in done.stderr, done.stderr
        assert "kvjudge probe --server" in done.stderr
    # A server that answers but has no entry is probed on first use (at most three requests), saying so.
    first_use = kvjudge("budget", "--ceiling", "--server", server.url, "--json")
    assert first_use.returncode == 0, first_use.stderr
    assert f"no capability entry for the model served at {server.url}" in first_use.stderr
    assert json.loads(first_use.stdout)["effective"] == SERVED_N_CTX // 2
    assert len(kvjudge_json("cache", "show")["entries"]) == 1
    assert kvjudge_json("cache", "clear")["removed_entries"] == 1  # the rest of this test starts without it
    # `tier --unreduced` moves runs whatever their size: no figure is needed for that.
    raw_store = tmp_path / "raw.sqlite"
    store_from_runs(raw_store, _long_runs()).close()
    moved = kvjudge_json("tier", "--all", "--unreduced", "--server", nowhere, "--to", cold, "--store", str(raw_store))
    assert [r["status"] for r in moved["runs"]] == ["tiered", "tiered"] and moved["ceilings"] == {"default": None}

    # Identification only: the refusal names the context, no prompt is evaluated, nothing is certified.
    quick = kvjudge_json("probe", "--server", server.url, "--no-certify")
    assert quick["max_context_tokens"] == SERVED_N_CTX and not quick["certified"] and quick["max_ok_input"] is None
    cache = Path(json.loads(kvjudge("cache", "show", "--json").stdout)["path"])
    data = json.loads(cache.read_text())
    [stored] = data["entries"].values()
    stored["probed_at"] = "2020-01-01T00:00:00+00:00"  # older than any staleness limit
    cache.write_text(json.dumps(data))

    stale = kvjudge("reduce", "--all", "--server", server.url, "--store", str(store), "--dry-run", "--json")
    assert stale.returncode == 0 and "is stale" in stale.stderr  # as for a local model: bounded, with a warning
    judged = kvjudge("judge", "long", "short", "--server", server.url, "--store", str(store))
    assert judged.returncode != 0 and "no fresh probe figure" in judged.stderr

    refreshed = kvjudge_json("cache", "refresh")
    [row] = refreshed["refreshed"]
    assert row["was"] == "stale" and row["result"] == "estimated" and row["max_context_tokens"] == SERVED_N_CTX
    assert kvjudge_json("cache", "show")["entries"][0]["status"] == "fresh"
