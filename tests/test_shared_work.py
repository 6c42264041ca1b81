"""Several kvjudge processes share one job on one store: each claims a unit (a run's scores, a pair's verdict)
before its calls, a killed one's units are taken over once its leases expire, every unit is done once, and the
results are those of one process alone. The processes are real subprocesses, the judge a pool replica of the
simulated judge that counts what it answered, one worker is killed with SIGKILL mid-job.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import pytest
from helpers import kvjudge, kvjudge_json

from kvjudge.errors import StoreError
from kvjudge.judge.verdict import VERDICT_KEY_PREFIX
from kvjudge.retention import Store
from kvjudge.retention.shared_job import Sharing
from kvjudge.testing.graded_runs import GradedRun, swe_run, write_graded
from kvjudge.testing.sim_judge import AnswerKey, Settings
from kvjudge.testing.sim_replica import ReplicaSettings, SimReplica

ROOT = Path(__file__).resolve().parents[1]
CRITERIA = 3  # the default rubric's criteria: a run's pointwise readings at K = 1
LEASE = ["--lease", "2", "--timeout", "2"]


def _runs(tasks: int) -> list[GradedRun]:
    return [run for n in range(tasks) for run in (
        swe_run(f"t{n}/pass", task=f"t{n}", passed=True, seed=n, explore=2, file_lines=30),
        swe_run(f"t{n}/fail", task=f"t{n}", passed=False, seed=n, explore=2, file_lines=30))]


def _graded(directory: Path, tasks: int, *stores: str) -> Path:
    """``stores`` (paths or URLs) each given the same ``2 * tasks`` runs, ingested with the CLI; the answer key."""
    runs_file, key = write_graded(directory, _runs(tasks))
    for store in stores:
        assert kvjudge_json("ingest", str(runs_file), "--store", store)["imported"] == 2 * tasks
    return key


@pytest.fixture(params=["sqlite", "postgresql"])
def shared(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The store the workers share: an SQLite file (processes on one host), or a database on the suite's PostgreSQL
    server (processes on many hosts)."""
    if request.param == "sqlite":
        return str(tmp_path / "shared.sqlite")
    return request.getfixturevalue("postgres_url")


class _Worker:
    """``kvjudge ARGS`` in a child process writing to files: a worker waiting for others while its own output fills
    a pipe no one reads yet would never finish."""

    def __init__(self, directory: Path, *args: str) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self._out, self._err = (directory / f"{id(self)}.{name}" for name in ("stdout", "stderr"))
        with self._out.open("wb") as out, self._err.open("wb") as err:
            self.process = subprocess.Popen([sys.executable, "-m", "kvjudge", *args], stdout=out, stderr=err)
        self.pid = self.process.pid

    def poll(self) -> int | None:
        return self.process.poll()

    def wait(self) -> int:
        return self.process.wait()

    @property
    def returncode(self) -> int | None:
        return self.process.returncode

    def communicate(self, timeout: float) -> tuple[str, str]:
        self.process.wait(timeout=timeout)
        return self._out.read_text(), self._err.read_text()


def _start(key: Path, latency: float) -> SimReplica:
    """A replica whose calls take ``latency`` seconds (so a worker is caught mid-job), probed before any worker."""
    started = SimReplica(AnswerKey.load(key), Settings(seed=3), replica=ReplicaSettings(latency_s=latency)).start()
    assert kvjudge_json("probe", "--server", started.url)["certified"]  # the probe's calls are its own
    return started


def _claims(store: Store) -> list[tuple[str, str | None, int, str | None, list[dict]]]:
    """(unit, worker, done, finished_by, costs) of every claim, read as another process would."""
    return [(unit, worker, done, by, json.loads(cost) if cost else []) for unit, worker, done, by, cost in
            store._conn.execute("SELECT unit, worker, done, finished_by, cost FROM claims ORDER BY unit")]


def _lines(out: str) -> tuple[list[dict], dict]:
    *items, last = [json.loads(line) for line in out.splitlines()]
    return items, last


def _held_by(store: Store, pid: int) -> tuple[int, int]:
    """(units finished, units claimed and not finished) by the worker of process ``pid``."""
    done = held = 0
    for _unit, worker, finished, by, _costs in _claims(store):
        done += by is not None and f":{pid}:" in by
        held += not finished and worker is not None and f":{pid}:" in worker
    return done, held


def _kill_mid_job(store: Store, workers: Sequence[_Worker]) -> tuple[_Worker, int]:
    """SIGKILL the first worker seen with a unit finished and others claimed; (it, its claimed units)."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        for worker in workers:
            if worker.poll() is not None:
                continue
            done, held = _held_by(store, worker.pid)
            if done and held:
                os.kill(worker.pid, signal.SIGKILL)
                worker.wait()
                return worker, _held_by(store, worker.pid)[1]  # read after the kill: nothing changes them now
        time.sleep(0.02)
    raise AssertionError("no worker was ever seen mid-job")


def test_four_scorers_share_one_job_and_a_killed_one_costs_at_most_its_claimed_units(shared: str,
                                                                                      tmp_path: Path) -> None:
    tasks = 12
    alone = str(tmp_path / "alone.sqlite")
    key = _graded(tmp_path, tasks, shared, alone)
    replica = _start(key, 0.3)
    watch = Store.open(shared)
    try:
        before = replica.usage["calls"]
        score = ["score", "--protocol", "pointwise", "--server", replica.url, *LEASE, "--json"]
        workers = [_Worker(tmp_path / "out", *score, "--store", shared) for _ in range(4)]
        victim, claimed = _kill_mid_job(watch, workers)
        survivors = [w for w in workers if w is not victim]
        outputs = [w.communicate(timeout=240) for w in survivors]
        shared_calls = replica.usage["calls"] - before
        single = kvjudge("score", "--protocol", "pointwise", "--server", replica.url, "--store", alone, "--json")
        rows = _claims(watch)
    finally:
        replica.stop()
        watch.close()
    assert victim.returncode == -signal.SIGKILL and claimed >= 1
    units = 2 * tasks
    for worker, (out, err) in zip(survivors, outputs):
        assert worker.returncode == 0, err
    # The job is done, each unit once: one try recorded per run (the killed worker's unfinished tries cost
    # nothing recorded), its three readings.
    assert len(rows) == units and all(done == 1 and worker is None for _, worker, done, _, _ in rows)
    assert all(len(costs) == 1 and costs[0]["calls"] == CRITERIA for *_, costs in rows)
    # The pool answered each unit's calls once, plus at most the killed worker's claimed units again.
    assert units * CRITERIA <= shared_calls <= (units + claimed) * CRITERIA
    # Each survivor shows every run's score and the whole job: done, by whom, and its cost counted once.
    scores = []
    for out, _err in outputs:
        items, last = _lines(out)
        job = last["summary"]["job"]
        assert sorted(item["run"] for item in items) == sorted(r.id for r in _runs(tasks))
        assert job["units"] == job["done"] == units and job["claimed"] == job["free"] == 0
        assert job["cost"]["calls"] == units * CRITERIA
        scores.append({item["run"]: (item["p_success"], item["criteria"]) for item in items})
    by_worker = Counter(by.rsplit(":", 2)[1] for _, _, _, by, _ in rows)
    assert str(victim.pid) in by_worker and sum(by_worker.values()) == units
    here = [_lines(out)[1]["summary"] for out, _ in outputs]
    assert sum(s["job"]["done_here"] for s in here) + by_worker[str(victim.pid)] == units
    assert sum(s["cost"]["calls"] for s in here) + CRITERIA * by_worker[str(victim.pid)] == units * CRITERIA
    assert sum(s["job"]["taken_over"] for s in here) == claimed
    # The scores are those of one process scoring the runs alone, figure for figure.
    assert single.returncode == 0, single.stderr
    items, _ = _lines(single.stdout)
    alone_scores = {item["run"]: (item["p_success"], item["criteria"]) for item in items}
    assert all(found == alone_scores for found in scores)


def test_evaluators_on_postgresql_judge_each_pair_once_and_agree_with_one_process_on_sqlite(
        postgres_url: str, tmp_path: Path) -> None:
    tasks = 6
    shared, alone = postgres_url, str(tmp_path / "alone.sqlite")
    key = _graded(tmp_path, tasks, shared, alone)
    replica = _start(key, 0.2)
    try:
        before = replica.usage["calls"]
        evaluate = ["eval", "--server", replica.url, *LEASE, "--png", str(tmp_path / "e.png"), "--json"]
        workers = [_Worker(tmp_path / "out", *evaluate, "--store", shared) for _ in range(3)]
        outputs = [w.communicate(timeout=240) for w in workers]
        shared_calls = replica.usage["calls"] - before
        single = kvjudge_json(*evaluate, "--store", alone)
    finally:
        replica.stop()
    assert [w.returncode for w in workers] == [0, 0, 0], [err for _, err in outputs]
    assert shared_calls == 2 * tasks  # each pair's two orders, sent once between the three
    figures = [json.loads(out)["templates"]["raw"] for out, _ in outputs]
    assert sum(f["job"]["done_here"] for f in figures) == tasks
    assert sum(f["cost"]["calls"] for f in figures) == 2 * tasks
    alone_figures = single["templates"]["raw"]
    for found in figures:
        assert found["judge"] == alone_figures["judge"] and found["manifest"] == alone_figures["manifest"]
        assert found["job"]["cost"]["calls"] == 2 * tasks
    with Store.open(shared) as one, Store.open(alone) as other:  # the same cache keys, the same records
        assert _judgments(one) == _judgments(other)


def _judgments(store: Store) -> tuple[set[str], dict[str, dict]]:
    """Every cache key, and each verdict record without what a clock or the server's prefix cache decided (the
    seconds it took, the prompt tokens the server reused from its cache)."""
    rows = store._conn.execute("SELECT key, payload FROM judgments").fetchall()
    return {key for key, _ in rows}, {key: _stable(json.loads(payload)) for key, payload in rows
                                      if key.startswith(VERDICT_KEY_PREFIX)}


def _stable(record: object) -> object:
    if isinstance(record, dict):
        return {k: _stable(v) for k, v in record.items()
                if not any(word in k for word in ("seconds", "cached", "reused", "cost"))}
    if isinstance(record, list):
        return [_stable(v) for v in record]
    return record


def test_a_lease_shorter_than_a_call_time_out_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    store = tmp_path / "never.sqlite"
    done = kvjudge("score", "--protocol", "pointwise", "--server", "http://127.0.0.1:9", "--timeout", "30",
                   "--lease", "10", "--store", str(store))
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1
    assert "lease of 10 s is shorter than a call's time-out (30 s)" in done.stderr and not store.exists()
    zero = kvjudge("eval", "--lease", "0", "--store", str(store))
    assert zero.returncode != 0 and "lease_seconds" in zero.stderr and not store.exists()


def test_a_store_without_claims_is_refused_in_one_line_and_left_as_it_was(tmp_path: Path) -> None:
    path = tmp_path / "store.sqlite"
    _graded(tmp_path, 2, str(path))
    with sqlite3.connect(path) as conn:
        conn.execute("DROP TABLE claims")
    before = _dump(path)
    done = kvjudge("score", "--protocol", "pointwise", "--server", "http://127.0.0.1:9", "--store", str(path))
    assert done.returncode != 0 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "no claims table" in done.stderr and _dump(path) == before
    with Store.open(path) as store, pytest.raises(StoreError, match="no claims table"):
        Sharing(store.claims)


def _dump(path: Path) -> list[str]:
    with sqlite3.connect(path) as conn:
        return list(conn.iterdump())


# ------------------------------------------------------------------------------ the claims, one step at a time
def test_a_live_claim_is_skipped_an_expired_one_taken_and_a_finished_one_never_again(shared: str) -> None:
    with Store.open(shared) as one, Store.open(shared) as other:
        assert one.claims.claim(["u1", "u2", "u3"], "score", "w1", 60, limit=2) == ["u1", "u2"]
        assert other.claims.claim(["u1", "u2", "u3"], "score", "w2", 60, limit=3) == ["u3"]  # live: skipped
        with one.transaction("put_judgments"):
            one.caches.put_judgment("u1", {"score": 1})
            assert one.claims.finish("u1", "w1", {"calls": 3}, done=True)
        # u2's lease runs out (w1 killed): w2 takes it; w1's finish then says the claim was no longer its own.
        one._conn.execute("UPDATE claims SET expires = 0 WHERE unit = 'u2'")
        assert other.claims.claim(["u1", "u2"], "score", "w2", 60) == ["u2"]
        assert not one.claims.finish("u2", "w1", None, done=True)
        view = other.claims.view(["u1", "u2", "u3", "u4"], "w2")
        assert (view.done, view.done_here, view.claimed, view.claimed_here, view.free, view.workers) == \
            (1, 0, 2, 2, 1, 1)
        # A failed unit is free again for another worker; its cost stays with it.
        with other.transaction("put_judgments"):
            assert other.claims.finish("u3", "w2", {"calls": 1}, done=False)
        assert one.claims.claim(["u3"], "score", "w1", 60) == ["u3"]
        assert other.claims.finished(["u1", "u2", "u3"]) == {"u1"}
        assert other.claims.costs(["u1", "u3"]) == [{"calls": 3}, {"calls": 1}]
        assert other.claims.release(["u2", "u3"], "w2") == 1 and other.claims.claim(["u2"], "score", "w1", 60)


def test_a_worker_renews_its_leases_from_its_keeper_thread(shared: str) -> None:
    with Store.open(shared) as store:
        sharing = Sharing(store.claims, lease_seconds=0.6)
        with sharing.job("score", ["u1", "u2"]) as job:
            assert job.take("u1")
            time.sleep(1.5)  # past the lease: only the keeper's renewals keep it live
            assert store.claims.claim(["u1"], "score", "other", 60) == []
        # Left unfinished: given back on the way out, free for the next worker at once.
        assert store.claims.claim(["u1"], "score", "other", 60) == ["u1"]


def test_the_shared_work_benchmark_runs_at_its_smallest_size(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "benchmarks.shared_work", "--smoke", "--out", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    [line] = done.stdout.splitlines()
    figures = json.loads(line)
    assert figures["calls_equal_job_calls"] and [row["processes"] for row in figures["jobs"]] == [1, 2, 4]
    killed = figures["killed_one_of_4"]
    assert 0 <= killed["calls_sent_again"] <= killed["calls_sent_again_bound"]
    assert (tmp_path / "shared_work.png").stat().st_size > 0


def test_reducers_started_at_once_reduce_each_run_once_as_one_process_does(tmp_path: Path,
                                                                           capabilities: dict[int, Path]) -> None:
    shared, alone = str(tmp_path / "shared.sqlite"), str(tmp_path / "alone.sqlite")
    _graded(tmp_path, 6, shared, alone)
    config = tmp_path / "kvjudge.toml"
    config.write_text('[retention]\ncounter = "chars"\n')
    reduce = ["reduce", "--all", "--ceiling", "600", "--capabilities", str(capabilities[160_000]),
              "--config", str(config), "--json"]
    workers = [_Worker(tmp_path / "out", *reduce, "--store", shared) for _ in range(3)]
    outputs = [w.communicate(timeout=240) for w in workers]
    single = kvjudge(*reduce, "--store", alone)
    assert [w.returncode for w in workers] == [single.returncode] * 3, [err for _, err in outputs]
    reports = [json.loads(out) for out, _ in outputs]
    assert all(r["job"]["units"] == r["job"]["done"] == 12 for r in reports)
    assert sum(r["job"]["done_here"] for r in reports) == 12  # each run reduced by one worker
    expected = json.loads(single.stdout)["runs"]
    for report in reports:  # every worker reports every run as it ends up: reduced, and to the same size
        assert [(r["run"], r["tokens_after"], r["fits"]) for r in report["runs"]] == \
            [(r["run"], r["tokens_after"], r["fits"]) for r in expected]
    with Store.open(shared) as one, Store.open(alone) as other:  # each run's log the same, LSNs aside
        ids = one.runs.run_ids()
        logs = [{run_id: [event for _lsn, event in store.events.iter_events(run_id)] for run_id in ids}
                for store in (one, other)]
        assert logs[0] == logs[1] and sum(1 for _ in one.events.iter_events(kind="Reduced")) > 0


def test_tierers_started_at_once_move_each_run_once(tmp_path: Path) -> None:
    shared = str(tmp_path / "shared.sqlite")
    _graded(tmp_path, 6, shared)
    (tmp_path / "cold").mkdir()
    tier = ["tier", "--all", "--unreduced", "--to", (tmp_path / "cold").as_uri(), "--store", shared, "--json"]
    workers = [_Worker(tmp_path / "out", *tier) for _ in range(3)]
    outputs = [w.communicate(timeout=240) for w in workers]
    assert [w.returncode for w in workers] == [0, 0, 0], [err for _, err in outputs]
    reports = [json.loads(out) for out, _ in outputs]
    assert sum(r["job"]["done_here"] for r in reports) == 12 and all(r["job"]["done"] == 12 for r in reports)
    for report in reports:  # every worker reports every run: moved here, or already moved by another
        assert sorted(r["run"] for r in report["runs"]) == sorted(run.id for run in _runs(6))
        assert {r["status"] for r in report["runs"]} <= {"tiered", "already_tiered"}
    with Store.open(shared) as store:  # each run moved once: one TierStarted and one Tiered in its log
        ids = store.runs.run_ids()
        assert [sum(1 for _ in store.events.iter_events(run_id, kind="TierStarted")) for run_id in ids] == [1] * 12
        assert all(store.runs.run(run_id).tier["status"] == "tiered" for run_id in store.runs.run_ids())


def test_a_rerun_after_a_crash_takes_the_dead_workers_units_without_waiting_out_its_lease(shared: str) -> None:
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = f"{socket.gethostname()}:{gone.stdout.strip()}:0badc0de"  # a worker of this host whose process is gone
    elsewhere = "another-host:1:0badc0de"  # a worker of another host: never presumed dead
    with Store.open(shared) as store:
        assert store.claims.claim(["u1"], "score", dead, 900) == ["u1"]
        assert store.claims.claim(["u2"], "score", elsewhere, 900) == ["u2"]
        sharing = Sharing(store.claims, lease_seconds=900)
        with sharing.job("score", ["u1", "u2"]) as job:
            assert not job.take("u1")  # its lease is live…
            started = time.monotonic()
            taken, done = job.wait(["u1"])  # …but its worker is gone: taken at once
            assert taken == ["u1"] and done == set() and time.monotonic() - started < 5
        assert store.claims.holders(["u1", "u2"]) == {elsewhere}
