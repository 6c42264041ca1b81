"""Plain helpers the tests share (conftest.py exposes them as fixtures where a fixture reads better)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pytest

from kvjudge.cli import main
from kvjudge.retention import Store
from kvjudge.retention.synthetic import write_jsonl


def _child_env(faults: str | None, env: Mapping[str, str] | None) -> dict[str, str]:
    child_env = {k: v for k, v in (env if env is not None else os.environ).items() if k != "KVJUDGE_FAULTS"}
    if faults:
        child_env["KVJUDGE_FAULTS"] = faults
    return child_env


def kvjudge(*args: str, faults: str | None = None, cwd: Path | None = None, env: Mapping[str, str] | None = None,
            timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """``python -m kvjudge ARGS`` in a child process (a fault point armed with ``faults``)."""
    return subprocess.run([sys.executable, "-m", "kvjudge", *args], cwd=cwd, env=_child_env(faults, env),
                          capture_output=True, text=True, timeout=timeout)


def start_kvjudge(*args: str, faults: str | None = None, cwd: Path | None = None,
                  env: Mapping[str, str] | None = None) -> subprocess.Popen[str]:
    """``python -m kvjudge ARGS`` started in a child process and not waited for (to kill it mid-way)."""
    return subprocess.Popen([sys.executable, "-m", "kvjudge", *args], cwd=cwd, env=_child_env(faults, env),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def kvjudge_json(*args: str, **kwargs: Any) -> Any:
    """``kvjudge ARGS --json`` in a child process that must succeed; its JSON output."""
    done = kvjudge(*args, "--json", **kwargs)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def cli_json(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, Any]:
    """``kvjudge ARGS --json`` in this process: ``(exit code, parsed stdout or None)``."""
    code = main([*argv, "--json"])
    out = capsys.readouterr().out
    return code, json.loads(out) if out.strip() else None


def cli_json_ok(capsys: pytest.CaptureFixture[str], *argv: str) -> Any:
    """``kvjudge ARGS --json`` in this process, which must exit 0 with one JSON line; the parsed line."""
    code = main([*argv, "--json"])
    out = capsys.readouterr().out
    assert code == 0 and out.count("\n") == 1, out
    return json.loads(out)


def free_ports(count: int = 1) -> list[int]:
    """``count`` TCP ports free on 127.0.0.1 right now."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def store_from_runs(path: Path, runs: Iterable[dict[str, Any]]) -> Store:
    """A store at ``path`` holding ``runs`` (native dicts), ingested from a JSONL file beside it."""
    source = path.with_suffix(".jsonl")
    write_jsonl(source, runs)
    store = Store.open(path)
    store.ingest_file(source)
    return store


def memory_budget_for(model: Path, n_ctx: int) -> int:
    """A memory budget (bytes) under which exactly ``n_ctx`` (a multiple of 256) is the analytic maximum for
    ``model`` on this host: halfway between what ``n_ctx`` and ``n_ctx + 256`` need."""
    from kvjudge.probe import RuntimeSettings, read_model_shape
    from kvjudge.probe.core import footprint, place
    from kvjudge.probe.devices import discover_devices

    shape = read_model_shape(model)
    placement = place(shape, discover_devices(), RuntimeSettings(), memory_budget=None)
    need = footprint(shape, n_ctx, RuntimeSettings(), placement).device_bytes
    step = footprint(shape, n_ctx + 256, RuntimeSettings(), placement).device_bytes - need
    return need + step // 2


def store_snapshot(path: Path) -> tuple[list[Any], ...]:
    """Everything a store holds that a refused command must leave as it was: the log, the blobs, the projections."""
    import sqlite3

    conn = sqlite3.connect(path)
    try:
        return tuple(conn.execute(query).fetchall() for query in (
            "SELECT lsn, run, kind, payload FROM events ORDER BY lsn", "SELECT ref, size, body FROM blobs ORDER BY ref",
            "SELECT id, state, last_lsn, state_json FROM runs ORDER BY id"))
    finally:
        conn.close()


def sql(store: Store) -> Any:
    """A second connection to ``store``'s file, as another process would open it: for tests that look into the
    tables or tamper with them behind the store's back (kvjudge itself asks the store's named queries)."""
    import sqlite3

    return sqlite3.connect(store.path, isolation_level=None, timeout=30.0)
