"""A real PostgreSQL server for the tests and the benchmarks: the system's (``/usr/lib/postgresql/*/bin``;
``scripts/ensure-postgres`` installs Debian's ``postgresql`` when it is missing) on a free port of 127.0.0.1.

:class:`PostgresServer` runs ``initdb`` in a scratch directory and starts ``postgres`` there: a test server has fsync
off; ``durable=True`` keeps PostgreSQL's defaults (a benchmark compares it with SQLite's ``synchronous=FULL``). Both
refuse to run as root, so under root they run as an unprivileged system user (``postgres`` when it exists, else
``kvjudge-pg``, created) through ``runuser``. The superuser ``kvjudge`` connects from 127.0.0.1 without a password;
every other role needs its password (scram-sha-256). :class:`ServerAt` is a server someone else runs, named by a URL
(``benchmarks/lab_store.py --store-url``).

Databases are made and dropped with PostgreSQL's own programs (``createdb``, ``dropdb``, ``psql``): the only SQL
kvjudge sends itself is the store's (:mod:`kvjudge.retention.store`).
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.parse
import uuid
from pathlib import Path

SUPERUSER = "kvjudge"
#: A role with a password (the credential tests): it owns nothing, so it is also the non-owner of the log.
PASSWORD_ROLE, PASSWORD = "kvjudge_lab", "lab-Secret-7f3a"


def postgres_bin(name: str) -> str:
    """A PostgreSQL program (``initdb``, ``postgres``, ``psql``, ``createdb``): the newest of the system's installed
    versions."""
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


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class ServerAt:
    """Databases on a running server, as the role a URL names (it may create databases): :meth:`url` names one."""

    def __init__(self, url: str) -> None:
        parts = urllib.parse.urlsplit(url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 5432
        self.user = urllib.parse.unquote(parts.username or SUPERUSER)
        self._password = urllib.parse.unquote(parts.password) if parts.password else None

    def url(self, database: str, user: str | None = None, password: str | None = None) -> str:
        user = user or self.user
        password = password if user != self.user or password else self._password
        auth = f"{user}:{urllib.parse.quote(password, safe='')}" if password else user
        return f"postgresql://{auth}@{self.host}:{self.port}/{database}"

    def _client(self, program: str, *argv: str) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, **({"PGPASSWORD": self._password} if self._password else {})}
        return subprocess.run([postgres_bin(program), "-h", self.host, "-p", str(self.port), "-U", self.user, *argv],
                              env=env, check=True, capture_output=True, text=True, timeout=60)

    def admin(self, *statements: str, database: str = "postgres") -> None:
        """Run ``statements`` as the URL's role, each on its own (CREATE DATABASE cannot be in a transaction)."""
        for statement in statements:
            try:
                self._client("psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", database, "-c", statement)
            except subprocess.CalledProcessError as exc:
                raise RuntimeError(f"psql failed: {exc.stderr.strip()}") from exc

    def new_database(self) -> str:
        """A fresh, empty database (template0); its name."""
        name = f"kvj_{uuid.uuid4().hex[:16]}"
        self._client("createdb", "-T", "template0", name)
        return name

    def drop_database(self, name: str) -> None:
        self._client("dropdb", "--if-exists", "--force", name)

    def stop(self) -> None:
        """Nothing to stop: the server is someone else's."""


class PostgresServer(ServerAt):
    """One ``postgres`` started here on 127.0.0.1 (:meth:`start`), stopped by :meth:`stop`."""

    def __init__(self, *, durable: bool = False) -> None:
        self.workdir = Path(tempfile.mkdtemp(prefix="kvjudge-pg-"))
        self.server_user = _server_user()
        self.durable = durable
        self.process: subprocess.Popen[bytes] | None = None
        super().__init__(f"postgresql://{SUPERUSER}@127.0.0.1:0/postgres")

    def _as_server_user(self, command: list[str]) -> list[str]:
        return ["runuser", "-u", self.server_user, "--", *command] if self.server_user else command

    def start(self, timeout: float = 60.0) -> PostgresServer:
        data = self.workdir / "data"
        if self.server_user:
            shutil.chown(self.workdir, self.server_user)
        subprocess.run(self._as_server_user([postgres_bin("initdb"), "-D", str(data), "-U", SUPERUSER,
                                             "--auth-local=trust", "--auth-host=scram-sha-256", "-E", "UTF8",
                                             "--locale=C.UTF-8", *(() if self.durable else ("--no-sync",))]),
                       check=True, capture_output=True, cwd=self.workdir)
        # The superuser (the admin connection) needs no password from this host; every other role does.
        hba = data / "pg_hba.conf"
        hba.write_text(f"host all {SUPERUSER} 127.0.0.1/32 trust\n" + hba.read_text())
        self.port = _free_port()
        fast = () if self.durable else ("-c", "fsync=off", "-c", "synchronous_commit=off",
                                        "-c", "full_page_writes=off")
        log = self.workdir / "postgres.log"
        command = [postgres_bin("postgres"), "-D", str(data), "-p", str(self.port), "-k", str(self.workdir),
                   "-c", "listen_addresses=127.0.0.1", *fast, "-c", "max_connections=200",
                   "-c", "shared_buffers=64MB"]
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
            except (RuntimeError, subprocess.SubprocessError):  # not ready yet
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"PostgreSQL not ready after {timeout:.0f}s: {log.read_text()[-2000:]}")
                time.sleep(0.2)

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
