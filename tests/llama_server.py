"""A real OpenAI-compatible judge server for tests and benchmarks: ``python -m llama_cpp.server`` on 127.0.0.1.

``LlamaServer(model, n_ctx)`` starts llama-cpp-python's server (the `test` extra installs its dependencies:
fastapi, uvicorn, sse-starlette, starlette-context, pydantic-settings) on a free port, waits until
``/v1/models`` answers, and stops it with SIGTERM (then SIGKILL). ``kill()`` is a SIGKILL mid-work: the crash a
judge pool must survive. Contexts stay small (≤ 2048): servers on two shared cores are slow.

``logprobs=False`` starts it with ``--logits_all false``: llama-cpp-python then computes the logits of the last
prompt token only, and refuses any request for logprobs. By default (what logprobs need) it computes a row of logits
over the whole vocabulary (262k for Gemma) for every prompt token. A server that only the probe asks (completions
without logprobs, the tokenizer) needs no more.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from helpers import free_ports

_START_TIMEOUT_S = 300.0


def server_extras_missing() -> str | None:
    """What is missing to run llama-cpp-python's server (None when nothing is)."""
    try:
        import fastapi  # noqa: F401
        import pydantic_settings  # noqa: F401
        import sse_starlette  # noqa: F401
        import starlette_context  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        return (f"llama-cpp-python's server extras are missing ({exc.name}): pip install fastapi uvicorn "
                f"sse-starlette starlette-context pydantic-settings (the `test` extra)")
    return None


class LlamaServer:
    """One ``python -m llama_cpp.server`` serving ``model`` with ``n_ctx``; ``url`` once :meth:`start` returned."""

    def __init__(self, model: Path, n_ctx: int, log_dir: Path | None = None, threads: int | None = None,
                 logprobs: bool = True) -> None:
        self.model = Path(model)
        self.n_ctx = n_ctx
        self.threads = threads
        self.logprobs = logprobs
        self.log_dir = Path(log_dir or tempfile.mkdtemp(prefix="kvjudge-llama-server-"))
        self.process: subprocess.Popen[bytes] | None = None
        self.url = ""
        self.log_path = self.log_dir / "server.log"

    def start(self) -> LlamaServer:
        missing = server_extras_missing()
        if missing:
            raise RuntimeError(missing)
        port = free_ports(1)[0]
        self.url = f"http://127.0.0.1:{port}"
        command = [sys.executable, "-m", "llama_cpp.server", "--model", str(self.model), "--host", "127.0.0.1",
                   "--port", str(port), "--n_ctx", str(self.n_ctx)]
        if self.threads is not None:
            command += ["--n_threads", str(self.threads), "--n_threads_batch", str(self.threads)]
        if not self.logprobs:
            command += ["--logits_all", "false"]
        self.log_dir.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            # Unbuffered: the access log reaches the file as each request is answered (see ``answered``).
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
        deadline = time.monotonic() + _START_TIMEOUT_S
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"the llama-cpp-python server exited ({self.process.returncode}): {self.log()}")
            try:
                with urllib.request.urlopen(self.url + "/v1/models", timeout=5) as response:
                    if response.status == 200:
                        return self
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the llama-cpp-python server did not come up: {self.log()}")
            time.sleep(0.5)

    def log(self, tail: int | None = 2000) -> str:
        """The server's output (its last ``tail`` characters; None: all of it, e.g. to count access-log lines)."""
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return text if tail is None else text[-tail:]

    def answered(self) -> int:
        """How many completion requests the server has answered so far (its access log's 200 lines)."""
        return self.log(tail=None).count('"POST /v1/completions HTTP/1.1" 200')

    def kill(self) -> None:
        """SIGKILL: the server dies mid-request, as a crashed or OOM-killed server does."""
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.kill()

    def __enter__(self) -> LlamaServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
