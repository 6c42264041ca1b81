"""The OpenAI-compatible server backend against a real llama-cpp-python server on 127.0.0.1.

The server runs the default model in a child process (`python -m llama_cpp.server`, n_ctx 2048); it needs
the server extras (fastapi, uvicorn, sse-starlette, starlette-context, pydantic-settings: the `test` extra).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import free_ports

from kvjudge.cli import main
from kvjudge.errors import JudgeError
from kvjudge.judge import SCORED, Judge, ServerBackend
from kvjudge.retention import Store
from kvjudge.retention.synthetic import make_run, write_jsonl

pytestmark = pytest.mark.model
N_CTX = 1024  # what the judge may use of the server's 2048


@pytest.fixture(scope="module")
def server(default_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, subprocess.Popen]]:
    try:
        import fastapi  # noqa: F401  (llama_cpp.server needs it; a missing extra fails loudly, never skips)
    except ImportError:
        pytest.fail("llama-cpp-python's server extras are missing: pip install fastapi uvicorn sse-starlette "
                    "starlette-context pydantic-settings (the `test` extra)")
    port = free_ports(1)[0]
    log_path = tmp_path_factory.mktemp("server") / "server.log"
    log = log_path.open("wb")
    process = subprocess.Popen([sys.executable, "-m", "llama_cpp.server", "--model", str(default_model),
                                "--host", "127.0.0.1", "--port", str(port), "--n_ctx", "2048"],
                               stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    try:
        while True:
            if process.poll() is not None:
                pytest.fail(f"the llama-cpp-python server exited ({process.returncode}): "
                            f"{log_path.read_text(errors='replace')[-2000:]}")
            try:
                with urllib.request.urlopen(url + "/v1/models", timeout=5) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"the llama-cpp-python server did not come up: {log_path.read_text(errors='replace')[-2000:]}")
            time.sleep(0.5)
        yield url, process
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        log.close()


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    source = tmp_path / "runs.jsonl"
    good = make_run("good", ["collected 12 items\n12 passed"], passed=True)
    bad = make_run("bad", ["collected 12 items\nFAILED test_quote"], passed=False, final="1 failed, 11 passed")
    for run in (good, bad):
        run["task"]["id"] = "fix-csv"
    write_jsonl(source, [good, bad])
    opened = Store.open(tmp_path / "store.sqlite")
    opened.ingest_file(source)
    yield opened
    opened.close()


def test_the_server_backend_judges_a_pair_from_label_logprobs(server: tuple[str, subprocess.Popen],
                                                              store: Store) -> None:
    url, _ = server
    backend = ServerBackend(url=url, n_ctx=N_CTX)
    assert backend.count("collected 12 items") > 0  # the server's own tokenizer endpoint
    verdict = Judge(backend).judge_pair(store, "good", "bad")
    assert verdict.outcome in SCORED, verdict.error
    assert backend.calls == 2
    assert all(0.0 < p < 1.0 for p in verdict.p_a_by_order.values())
    assert verdict.manifest["backend"] == "openai-server" and verdict.manifest["server"] == url
    assert verdict.manifest["n_ctx"] == N_CTX and verdict.manifest["backend_version"]["id"]
    # Same pair again: read from the store's judgment cache, no request to the server.
    again = Judge(backend).judge_pair(store, "good", "bad")
    assert backend.calls == 2 and again.cached and again.p_a == verdict.p_a


def test_judge_server_through_the_cli(server: tuple[str, subprocess.Popen], store: Store,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    url, _ = server
    code = main(["judge", "good", "bad", "--server", url, "--n-ctx", str(N_CTX), "--store", str(store.path),
                 "--json"])
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert code == 0 and len(lines) == 2
    pair, summary = lines[0], lines[1]["summary"]
    assert (pair["a"], pair["b"]) == ("good", "bad") and pair["outcome"] in SCORED, pair["error"]
    assert all(0.0 < p < 1.0 for p in pair["p_a_by_order"].values())
    assert pair["manifest"]["backend"] == "openai-server" and pair["manifest"]["server"] == url
    assert pair["manifest"]["n_ctx"] == N_CTX
    assert (summary["pairs"], summary["coverage"], summary["outcomes"][pair["outcome"]]) == (1, 1.0, 1)
    # The verdict is in the store's judgment cache: the same pair again is answered from it.
    assert main(["judge", "good", "bad", "--server", url, "--n-ctx", str(N_CTX), "--store", str(store.path),
                 "--json"]) == 0
    again = json.loads(capsys.readouterr().out.splitlines()[0])
    assert again["cached"] is True and again["p_a"] == pair["p_a"]


def test_a_server_that_does_not_report_its_context_needs_n_ctx(server: tuple[str, subprocess.Popen]) -> None:
    with pytest.raises(JudgeError, match="--n-ctx"):
        ServerBackend(url=server[0])


def test_labels_missing_from_the_top_logprobs_are_an_error_not_a_guess(server: tuple[str, subprocess.Popen],
                                                                       store: Store) -> None:
    # With only the single most likely token returned, at most one label can be among them.
    backend = ServerBackend(url=server[0], n_ctx=N_CTX, top_logprobs=1)
    verdict = Judge(backend, use_cache=False).judge_pair(store, "good", "bad")
    assert verdict.outcome == "error" and verdict.p_a is None
    assert "not among the server's top 1" in (verdict.error or "")


def test_a_server_that_dies_gives_error(server: tuple[str, subprocess.Popen], store: Store,
                                        default_model: Path) -> None:
    url, process = server
    # Count tokens locally (the served GGUF), so the failure happens at the completion request itself.
    backend = ServerBackend(url=url, n_ctx=N_CTX, model_path=default_model)
    process.terminate()
    process.wait(timeout=30)
    verdict = Judge(backend, use_cache=False).judge_pair(store, "good", "bad")
    assert verdict.outcome == "error" and verdict.p_a is None and not verdict.scored
    assert "cannot reach the judge server" in (verdict.error or "")
