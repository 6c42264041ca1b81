"""A real router in front of judge replicas for tests and benchmarks: ``vllm-router`` (the `test` extra installs it
from PyPI: a Rust router, run as ``vllm-router --worker-urls URL... --policy POLICY``) on 127.0.0.1.

``VllmRouter(urls, policy)`` starts it on a free port (its Prometheus port too), health-checking its workers every
second, and waits until ``/health`` says every worker is healthy; ``stop()`` sends SIGTERM (then SIGKILL). Its log
is kept beside the test's files. ``api_key``: the key it asks of its clients and sends to its workers (its own
``--api-key``).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from helpers import free_ports

_START_TIMEOUT_S = 120.0


def router_executable() -> str:
    """The ``vllm-router`` that the `test` extra installs next to this Python (else on PATH)."""
    candidate = Path(sys.executable).parent / "vllm-router"
    found = str(candidate) if candidate.exists() else shutil.which("vllm-router")
    if found is None:
        raise RuntimeError("vllm-router not found: pip install vllm-router (the `test` extra)")
    return found


class VllmRouter:
    """One ``vllm-router`` over ``urls`` with ``policy`` (cache_aware, consistent_hash, round_robin, …)."""

    def __init__(self, urls: Sequence[str], policy: str = "consistent_hash", *, api_key: str | None = None,
                 log_dir: Path | None = None) -> None:
        self.urls = list(urls)
        self.policy = policy
        self.api_key = api_key
        self.log_path = Path(log_dir or tempfile.mkdtemp(prefix="kvjudge-router-")) / "router.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.url = ""

    def start(self) -> VllmRouter:
        port, metrics = free_ports(2)
        command = [router_executable(), "--worker-urls", *self.urls, "--policy", self.policy, "--host", "127.0.0.1",
                   "--port", str(port), "--prometheus-port", str(metrics), "--log-level", "warning",
                   "--health-check-interval-secs", "1", "--health-failure-threshold", "1",
                   "--worker-startup-check-interval", "1", "--cb-timeout-duration-secs", "1"]
        if self.api_key is not None:
            command += ["--api-key", self.api_key]
        self.url = f"http://127.0.0.1:{port}"
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + _START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"vllm-router exited with {self.process.returncode}: "
                                   f"{self.log_path.read_text(errors='replace')[-2000:]}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as answer:
                    if answer.status == 200:
                        return self
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"vllm-router did not become healthy in {_START_TIMEOUT_S:.0f} s (log: {self.log_path})")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        self.process = None

    def __enter__(self) -> VllmRouter:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
