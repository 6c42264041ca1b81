"""Plain helpers the tests share (conftest.py exposes them as fixtures where a fixture reads better)."""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import sqlite3
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pytest

from kvjudge.cli import main
from kvjudge.judge import Verdict
from kvjudge.judge.pack import RunTokens
from kvjudge.judge.verdict import OrderScore
from kvjudge.retention import Store
from kvjudge.retention.ingest import ingest_paths
from kvjudge.retention.state import fold
from kvjudge.testing.jsonl import write_jsonl


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


class CallLog:
    """Notes kept in a file, one line each, so that a note made in a child this process forks (the child that
    parses an import ahead of its writes) is read here like one made here."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def note(self, text: str) -> None:
        with self.path.open("a") as handle:
            handle.write(text + "\n")

    def lines(self) -> list[str]:
        """The notes, in the order they were made."""
        return self.path.read_text().splitlines() if self.path.exists() else []

    def clear(self) -> None:
        self.path.unlink(missing_ok=True)


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


def ingest_runs(store: Store, runs: Iterable[dict[str, Any]]) -> list[str]:
    """Ingest ``runs`` (native dicts) into ``store`` from a JSONL file written beside it (a PostgreSQL store's: in a
    scratch directory); the ids it imported."""
    with tempfile.TemporaryDirectory(prefix="kvjudge-runs-") as scratch:
        beside = store.path or Path(scratch) / "store"
        number = 1
        while (source := beside.with_name(f"{beside.stem}-runs-{number}.jsonl")).exists():
            number += 1
        write_jsonl(source, runs)
        return ingest_paths(store, [source]).runs


def store_from_runs(path: Path | str, runs: Iterable[dict[str, Any]]) -> Store:
    """A store at ``path`` holding ``runs`` (native dicts), ingested from a JSONL file beside it."""
    store = Store.open(path)
    ingest_runs(store, runs)
    return store


def comparable_fold(store: Store, run_id: str) -> bytes:
    """``run_id`` folded from its log, as bytes to compare with another store's fold of the same events. On SQLite the
    fold itself (a killed transaction gives its LSNs back). On PostgreSQL a killed transaction leaves a gap in the
    LSNs (the sequence never gives a number back), so there each run's LSNs are numbered in their order first: the
    same events in the same order fold to the same bytes, whatever numbers the log gave them."""
    if store.path is not None:
        return store.runs.refold(run_id).canonical_bytes()
    numbered = ((rank, event) for rank, (_, event) in enumerate(store.events.iter_events(run_id), 1))
    return fold(numbered)[run_id].canonical_bytes()


def event_kinds(store: Store, run_id: str) -> list[str]:
    """The kinds of ``run_id``'s logged events, oldest first."""
    return [event.kind for _, event in store.events.iter_events(run_id)]


def local_cold_url(root: Path) -> str:
    """A local cold target: the empty directory ``root / "cold"``, made here, as a ``file://`` URL."""
    (root / "cold").mkdir()
    return f"file://{root / 'cold'}"


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


def store_snapshot(store: Store | Path) -> tuple[list[Any], ...]:
    """Everything a store (open, or its file) holds that a refused command must leave as it was: the log, the
    blobs, the projections."""
    conn = sqlite3.connect(store.path if isinstance(store, Store) else store)
    try:
        return tuple(conn.execute(query).fetchall() for query in (
            "SELECT lsn, run, kind, payload FROM events ORDER BY lsn", "SELECT ref, size, body FROM blobs ORDER BY ref",
            "SELECT id, state, last_lsn, state_json FROM runs ORDER BY id"))
    finally:
        conn.close()


def make_verdict(a: str, b: str, outcome: str, p_ab: float | None, p_ba: float | None = None, *,
                 views: tuple[str, str] = ("full-a", "full-b"), cut: bool = False) -> Verdict:
    """A verdict on the pair ``(a, b)`` with no model behind it: ``p_ab`` and ``p_ba`` the probability that run a
    is better as asked in each order (``p_ba`` defaults to ``p_ab``; None for an outcome without a score), ``views``
    the hashes of the two views judged (each view counts as many tokens as its hash has characters) and ``cut``
    whether they were reduced further to fit the window."""
    p_ba = p_ab if p_ba is None else p_ba
    tokens = RunTokens(full=10, reduced=10, view=len(views[0]), further_reduced=cut)
    orders = () if p_ab is None or p_ba is None else (OrderScore("ab", p_ab, 0.5, 10, 0, False),
                                                      OrderScore("ba", p_ba, 0.5, 10, 0, False))
    return Verdict(a=a, b=b, outcome=outcome, p_a=None if p_ab is None or p_ba is None else (p_ab + p_ba) / 2,
                   p_a_by_order={"ab": p_ab, "ba": p_ba}, tokens={"a": tokens, "b": tokens}, further_reduced=cut,
                   seconds=0.0, manifest={}, margin=0.05, orders=orders, view_sha256={"a": views[0], "b": views[1]})


def sql(store: Store) -> Any:
    """A second connection to ``store``'s database (its file, or its PostgreSQL database), as another process would
    open it: for tests that look into the tables or tamper with them behind the store's back (kvjudge itself asks
    the store's named queries). Both answer ``execute(query).fetchone()``; bound values are ``?`` on SQLite, ``%s``
    on PostgreSQL."""
    if store.path is None:
        import psycopg

        return psycopg.connect(store.location, autocommit=True)
    return sqlite3.connect(store.path, isolation_level=None, timeout=30.0)


# The demo's runs in the tests: two small runs of one task keep it to one judged pair (the full sample is
# `make demo`); a lowered ceiling reduces the longer run, so the reduced view is genuinely shorter than the full one.
DEMO_RUNS = ("clamp-1", "clamp-2")
DEMO_OPTIONS = ("--context-target", "2048", "--ceiling", "512")


def demo_command(out: Path, runs_file: Path, model: Path) -> list[str]:
    """`kvjudge demo --json` on ``runs_file`` with ``model``, writing to ``out``."""
    return [sys.executable, "-m", "kvjudge", "demo", "--out", str(out), "--runs", str(runs_file), "--model",
            str(model), *DEMO_OPTIONS, "--json"]


@dataclasses.dataclass(frozen=True)
class DemoRun:
    """One `kvjudge demo` in a child process: how it was run (its own cache and data dirs in ``env``), what it
    printed, and how long it took."""

    out: Path
    model: Path
    runs_file: Path
    env: dict[str, str]
    done: subprocess.CompletedProcess[str]
    seconds: float

    def command(self, out: Path) -> list[str]:
        """The same demo, writing to ``out``."""
        return demo_command(out, self.runs_file, self.model)

    def report(self) -> dict[str, Any]:
        """What the demo printed (``report.json``'s object); the demo must have succeeded."""
        assert self.done.returncode == 0, self.done.stderr
        return json.loads(self.done.stdout)
