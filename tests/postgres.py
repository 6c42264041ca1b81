"""A real PostgreSQL server for tests: the system's (``/usr/lib/postgresql/*/bin``; ``scripts/ensure-postgres`` installs
Debian's ``postgresql`` when it is missing) on a free port of 127.0.0.1.

``PostgresServer`` runs ``initdb`` in a scratch directory and starts ``postgres`` there (fsync off: a test server).
Both refuse to run as root, so under root they run as an unprivileged system user (``postgres`` when it exists,
else ``kvjudge-pg``, created) through ``runuser``. The superuser ``kvjudge`` connects from 127.0.0.1 without a
password; every other role needs its password (scram-sha-256), which the credential tests rely on.

The pytest fixtures share one server per test session (kept in ``config.stash``, started by the first test that
asks) and give each test a fresh database (``CREATE DATABASE … TEMPLATE template0``, dropped after).
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import free_ports

SUPERUSER = "kvjudge"
#: A role with a password (the credential tests): it owns nothing, so it is also the non-owner of the log.
PASSWORD_ROLE, PASSWORD = "kvjudge_lab", "lab-Secret-7f3a"
_STASH_KEY: pytest.StashKey[PostgresServer] = pytest.StashKey()


def postgres_bin(name: str) -> str:
    """A PostgreSQL server program (``initdb``, ``postgres``): the newest of the system's installed versions."""
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), key=lambda p: int(p.split("/")[4]))
    candidate = found[-1] if found else shutil.which(name)
    if not candidate:
        raise RuntimeError(f"{name} not found: run scripts/ensure-postgres (installs Debian's postgresql)")
    return candidate


def _server_user() -> str | None:
    """The unprivileged user the server runs as when this process is root (None: run as this user)."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "kvjudge-pg"):
        try:
            pwd.getpwnam(name)
            return name
        except KeyError:
            continue
    subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", "kvjudge-pg"],
                   check=True)
    return "kvjudge-pg"


class PostgresServer:
    """One ``postgres`` on 127.0.0.1; :meth:`url` names a database on it once :meth:`start` returned."""

    def __init__(self) -> None:
        self.workdir = Path(tempfile.mkdtemp(prefix="kvjudge-pg-"))
        self.user = _server_user()
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None

    def _as_server_user(self, command: list[str]) -> list[str]:
        return ["runuser", "-u", self.user, "--", *command] if self.user else command

    def start(self, timeout: float = 60.0) -> PostgresServer:
        data = self.workdir / "data"
        if self.user:
            shutil.chown(self.workdir, self.user)
        subprocess.run(self._as_server_user([postgres_bin("initdb"), "-D", str(data), "-U", SUPERUSER,
                                             "--auth-local=trust", "--auth-host=scram-sha-256", "-E", "UTF8",
                                             "--locale=C.UTF-8", "--no-sync"]),
                       check=True, capture_output=True, cwd=self.workdir)
        # The superuser (the suite's admin connection) needs no password from this host; every other role does.
        hba = data / "pg_hba.conf"
        hba.write_text(f"host all {SUPERUSER} 127.0.0.1/32 trust\n" + hba.read_text())
        (self.port,) = free_ports(1)
        log = self.workdir / "postgres.log"
        command = [postgres_bin("postgres"), "-D", str(data), "-p", str(self.port), "-k", str(self.workdir),
                   "-c", "listen_addresses=127.0.0.1", "-c", "fsync=off", "-c", "synchronous_commit=off",
                   "-c", "full_page_writes=off", "-c", "max_connections=200", "-c", "shared_buffers=64MB"]
        with log.open("wb") as out:
            self.process = subprocess.Popen(self._as_server_user(command), stdout=out, stderr=subprocess.STDOUT,
                                            cwd=self.workdir, start_new_session=True)
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"postgres exited ({self.process.returncode}): {log.read_text()[-2000:]}")
            try:
                self.admin(f"CREATE ROLE {PASSWORD_ROLE} LOGIN PASSWORD '{PASSWORD}'")
                return self
            except Exception:  # noqa: BLE001 - any failure here means "not ready yet"
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"PostgreSQL not ready after {timeout:.0f}s: {log.read_text()[-2000:]}")
                time.sleep(0.2)

    def url(self, database: str, user: str = SUPERUSER, password: str | None = None) -> str:
        auth = f"{user}:{password}" if password else user
        return f"postgresql://{auth}@127.0.0.1:{self.port}/{database}"

    def admin(self, *statements: str, database: str = "postgres") -> None:
        """Run ``statements`` as the superuser, each on its own (CREATE DATABASE cannot be in a transaction)."""
        import psycopg

        with psycopg.connect(self.url(database), autocommit=True, connect_timeout=5) as conn:
            for statement in statements:
                conn.execute(statement)

    def new_database(self) -> str:
        name = f"kvj_{uuid.uuid4().hex[:16]}"
        self.admin(f"CREATE DATABASE {name} TEMPLATE template0")
        return name

    def drop_database(self, name: str) -> None:
        self.admin(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            os.killpg(process.pid, signal.SIGINT)  # fast shutdown
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=10)
        shutil.rmtree(self.workdir, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres_server(request: pytest.FixtureRequest) -> PostgresServer:
    """One PostgreSQL server for the whole session (started on first use, stopped at the end)."""
    server = request.config.stash.get(_STASH_KEY, None)
    if server is None:
        server = PostgresServer().start()
        request.config.stash[_STASH_KEY] = server
        request.config.add_cleanup(server.stop)
    return server


@pytest.fixture
def postgres_url(postgres_server: PostgresServer) -> Iterator[str]:
    """The URL of a fresh, empty database on the session's server (the superuser's, no password), dropped after."""
    name = postgres_server.new_database()
    yield postgres_server.url(name)
    postgres_server.drop_database(name)
