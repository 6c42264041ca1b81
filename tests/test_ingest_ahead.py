"""Parsing ahead (kvjudge/retention/ingest/ahead.py): a forked child parses an import's files while the importer
writes. It must change nothing an import does — the same rows in the log, the blobs and the projection, the same
one-line refusals at the same points —, and whatever ends the import ends the child: an error in it, its death,
the importer's."""

from __future__ import annotations

import gzip
import json
import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from helpers import sql

from kvjudge.errors import IngestError, KvjudgeError
from kvjudge.retention import Store
from kvjudge.retention.faults import FAULTS_ENV
from kvjudge.retention.ingest import ahead, importer, ingest_paths
from kvjudge.testing.jsonl import write_jsonl
from kvjudge.testing.native_runs import make_run
from kvjudge.testing.trajectories import make_episode, mini_swe_agent_v1, mini_swe_agent_v2, swe_agent

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the child is forked on Linux only")


def write_input(root: Path, trajectories: int = 12) -> None:
    """Trajectories of three harnesses (one gzipped) in folders, and a native JSONL file."""
    for index in range(trajectories):
        instance = f"proj{index % 3}__proj-{index}"
        episode = make_episode(instance, index, target_bytes=4_000, model=f"model-{index % 2}")
        folder = root / f"model-{index % 2}" / instance
        folder.mkdir(parents=True)
        if index % 3 == 0:
            (folder / f"{instance}.traj").write_text(json.dumps(swe_agent(episode), indent=2))
        elif index % 3 == 1:
            data = json.dumps(mini_swe_agent_v1(episode), indent=2).encode()
            (folder / f"{instance}.traj.json.gz").write_bytes(gzip.compress(data))
        else:
            (folder / f"{instance}.traj.json").write_text(json.dumps(mini_swe_agent_v2(episode), indent=2))
    write_jsonl(root / "native.jsonl", [make_run(f"native-{i}", [f"output {i} " * 20, "done"]) for i in range(5)])


def rows(store: Store) -> dict[str, list[tuple[Any, ...]]]:
    """Every row an import writes: the log, the blobs, the projection."""
    conn = sql(store)
    return {"events": conn.execute("SELECT lsn, run, kind, payload FROM events ORDER BY lsn").fetchall(),
            "blobs": conn.execute("SELECT ref, size, body FROM blobs ORDER BY ref").fetchall(),
            "runs": conn.execute("SELECT * FROM runs ORDER BY id").fetchall(),
            "run_bodies": conn.execute("SELECT * FROM run_bodies ORDER BY run, ref").fetchall()}


@pytest.fixture
def children(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The pids of the children the imports of a test fork to parse ahead (a core is taken to be spare for them,
    whatever the load of the machine running the tests)."""
    monkeypatch.setattr(ahead, "spare_core", lambda: True)
    pids: list[int] = []
    real = importer.parse_ahead

    def recorded(*args: Any) -> ahead.ParseAhead | None:
        found = real(*args)
        if found is not None:
            pids.append(found._pid)
        return found

    monkeypatch.setattr(importer, "parse_ahead", recorded)
    return pids


def parse_here(monkeypatch: pytest.MonkeyPatch) -> None:
    """Imports from here on parse in the importer's own process."""
    monkeypatch.setattr(importer, "parse_ahead", lambda *args: None)


def reaped(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_parsing_ahead_writes_what_parsing_here_writes(tmp_path: Path, children: list[int],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    write_input(tmp_path / "runs")
    with Store.open(tmp_path / "ahead.sqlite") as store:
        report = ingest_paths(store, [tmp_path / "runs"])
        ahead_rows, ahead_report = rows(store), report.to_dict()
    assert len(children) == 1 and reaped(children[0])
    parse_here(monkeypatch)
    with Store.open(tmp_path / "here.sqlite") as store:
        report = ingest_paths(store, [tmp_path / "runs"])
        here_rows, here_report = rows(store), report.to_dict()
    assert len(here_rows["events"]) > 100 and here_report["imported"] == 17
    assert ahead_rows == here_rows
    assert {**ahead_report, "store": ""} == {**here_report, "store": ""}


def test_one_small_file_is_parsed_here(store: Store, tmp_path: Path, children: list[int]) -> None:
    write_jsonl(tmp_path / "one.jsonl", [make_run("a", ["x"])])
    assert ingest_paths(store, [tmp_path / "one.jsonl"]).imported == ["a"]
    assert children == []


def test_no_child_is_forked_where_no_core_is_spare(store: Store, tmp_path: Path, children: list[int],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ahead, "spare_core", lambda: False)
    write_input(tmp_path / "runs", trajectories=3)
    assert len(ingest_paths(store, [tmp_path / "runs"]).imported) == 8
    assert children == []


def stat_lines(ticks: dict[int, tuple[int, int]]) -> str:
    """A /proc/stat of these CPUs: for each, (busy ticks, idle ticks), busy split over user, system, irq, softirq
    and steal, idle over idle and iowait, and a guest count that the kernel includes in user (so it is not busy
    twice)."""
    lines = ["cpu  1 2 3 4 5 6 7 8 9 10"]  # the machine's total: not read (the process's affinity is per CPU)
    for cpu, (busy, idle) in sorted(ticks.items()):
        system, irq, softirq, steal = busy // 5, busy // 7, busy // 9, busy // 11
        user = busy - system - irq - softirq - steal
        lines.append(f"cpu{cpu} {user} 0 {system} {idle - idle // 4} {idle // 4} {irq} {softirq} {steal} "
                     f"{user // 2} 0")
    return "\n".join([*lines, "intr 1 2 3", "ctxt 99", ""])


def test_a_core_is_spare_when_one_and_a_half_of_the_process_cpus_were_idle_over_the_sample(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stat = tmp_path / "stat"
    monkeypatch.setattr(ahead, "PROC_STAT", str(stat))
    start = {0: (5_000, 9_000), 1: (7_000, 3_000), 2: (1_000, 1_000)}

    def spare(cpus: set[int], idle_of_20_ticks: dict[int, int]) -> bool:
        """spare_core() where, over the sample, each CPU counted 20 ticks, ``idle_of_20_ticks[cpu]`` of them idle."""
        after = {cpu: (busy + 20 - idle_of_20_ticks[cpu], idle + idle_of_20_ticks[cpu])
                 for cpu, (busy, idle) in start.items()}
        stat.write_text(stat_lines(start))
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid: cpus)
        # The sample's wait is when the CPUs' time moves on.
        monkeypatch.setattr(ahead, "time", type("Clock", (), {"sleep": staticmethod(
            lambda seconds: stat.write_text(stat_lines(after)))}))
        return ahead.spare_core()

    both = {0, 1}
    assert spare(both, {0: 20, 1: 20, 2: 0}) is True  # idle, and a busy CPU the process may not use counts not
    assert spare(both, {0: 20, 1: 10, 2: 20}) is True  # 1.5 idle: exactly enough
    assert spare(both, {0: 20, 1: 8, 2: 20}) is False  # 1.4 idle
    assert spare(both, {0: 20, 1: 0, 2: 20}) is False  # one core busy: the child would take the importer's time
    assert spare({0, 1, 2}, {0: 10, 1: 10, 2: 10}) is True  # 1.5 of 3
    assert spare({0}, {0: 20, 1: 20, 2: 20}) is False  # one CPU: the child would only take turns with the importer
    monkeypatch.setattr(ahead, "PROC_STAT", str(tmp_path / "missing"))
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: both)
    assert ahead.spare_core() is False  # nothing to measure: parse in this process


def test_no_core_is_spare_while_every_cpu_runs_a_busy_loop() -> None:
    """The real /proc/stat, on this machine: a busy loop on each CPU of this process leaves none idle."""
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in os.sched_getaffinity(0)]
    try:
        time.sleep(0.3)  # every loop running
        assert ahead.spare_core() is False
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()


def write_with_a_bad_line(root: Path) -> Path:
    """Three JSONL files; the second holds two good runs and then a line that is not JSON."""
    write_jsonl(root / "1.jsonl", [make_run("a1", ["x"])])
    bad = root / "2.jsonl"
    bad.write_text(json.dumps(make_run("b1", ["y"])) + "\n" + json.dumps(make_run("b2", ["z"])) + "\n"
                   + '{"id": "b3", "branches": [}\n')
    write_jsonl(root / "3.jsonl", [make_run("c1", ["w"])])
    return bad


def test_a_refused_document_is_refused_as_when_parsed_here(tmp_path: Path, children: list[int],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    bad = write_with_a_bad_line(tmp_path / "runs")
    messages, skipped = [], []
    for where in ("ahead", "here"):
        with Store.open(tmp_path / f"{where}.sqlite") as store:
            with pytest.raises(IngestError) as refused:
                ingest_paths(store, [tmp_path / "runs"])
            messages.append(str(refused.value))
            assert store.runs.run_ids() == []  # the runs before the bad line, in the open batch, were not kept
            report = ingest_paths(store, [tmp_path / "runs"], skip_bad=True)
            assert report.imported == ["a1", "c1"] and store.runs.run_ids() == ["a1", "c1"]
            skipped.append(report.skipped)
        parse_here(monkeypatch)
    assert len(children) == 2 and all(reaped(pid) for pid in children)
    assert messages[0] == messages[1] and f"{bad}:3: not valid JSON" in messages[0]
    assert "\n" not in messages[0] and "nothing was imported" in messages[0]
    assert skipped[0] == skipped[1] and [item["path"] for item in skipped[0]] == [str(bad)]


def test_an_error_in_the_child_is_raised_here_and_nothing_is_written(store: Store, tmp_path: Path,
                                                                     children: list[int],
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    write_with_a_bad_line(tmp_path / "runs")
    (tmp_path / "runs" / "2.jsonl").unlink()
    write_jsonl(tmp_path / "runs" / "2.jsonl", [make_run("b1", ["y"])])
    real = importer.parse_document

    def failing(document: Any, *args: Any) -> Any:
        if document.source.path.name == "2.jsonl":
            raise LookupError("a parser's own bug")
        return real(document, *args)

    monkeypatch.setattr(importer, "parse_document", failing)
    with pytest.raises(LookupError, match="a parser's own bug"):
        ingest_paths(store, [tmp_path / "runs"], skip_bad=True)  # not a refused file: --skip-bad does not pass over it
    assert store.runs.run_ids() == []
    assert len(children) == 1 and reaped(children[0])


def test_a_run_that_does_not_pickle_is_raised_here_and_nothing_is_written(store: Store, tmp_path: Path,
                                                                         children: list[int],
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("1", "2", "3"):
        write_jsonl(tmp_path / "runs" / f"{name}.jsonl", [make_run(f"r{name}", ["x"])])
    real = importer.parse_document

    def unpicklable(document: Any, *args: Any) -> Any:
        run = real(document, *args)
        if document.source.path.name == "2.jsonl":
            run.note = lambda: None  # a local function: pickle refuses it
        return run

    monkeypatch.setattr(importer, "parse_document", unpicklable)
    with pytest.raises((pickle.PicklingError, AttributeError), match="pickle"):
        ingest_paths(store, [tmp_path / "runs"])
    assert store.runs.run_ids() == []
    assert len(children) == 1 and reaped(children[0])


def test_a_child_killed_midway_stops_the_import_with_one_line(store: Store, tmp_path: Path, children: list[int],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("1", "2", "3"):
        write_jsonl(tmp_path / "runs" / f"{name}.jsonl", [make_run(f"r{name}", ["x"])])
    importer_pid = os.getpid()
    real = importer.parse_document

    def killed_in_the_child(document: Any, *args: Any) -> Any:
        if document.source.path.name == "2.jsonl" and os.getpid() != importer_pid:
            os.kill(os.getpid(), signal.SIGKILL)
        return real(document, *args)

    monkeypatch.setattr(importer, "parse_document", killed_in_the_child)
    with pytest.raises(KvjudgeError) as stopped:
        ingest_paths(store, [tmp_path / "runs"], skip_bad=True)
    assert not isinstance(stopped.value, IngestError)  # not a refused file: --skip-bad does not pass over it
    assert "ended unexpectedly (killed by signal 9)" in str(stopped.value) and "\n" not in str(stopped.value)
    assert store.runs.run_ids() == []  # r1, parsed and written before, was in the open batch
    assert len(children) == 1 and reaped(children[0])


# The importer in a process of its own, a core taken to be spare: its child notes its pid in a file first.
IMPORTER = """
import os, sys
from kvjudge.cli import main
from kvjudge.retention.ingest import ahead
ahead.spare_core = lambda: True
child = ahead._child
def noted(*args):
    with open(sys.argv[3], "w") as handle:
        handle.write(str(os.getpid()))
    child(*args)
ahead._child = noted
raise SystemExit(main(["ingest", sys.argv[1], "--store", sys.argv[2], "--json"]))
"""


def test_the_child_ends_when_the_import_is_killed(tmp_path: Path) -> None:
    # More than the pipe holds, so the child is still parsing (or waiting to hand over) when the importer dies at
    # its first COMMIT.
    root = tmp_path / "runs"
    for index in range(3 * importer.BATCH_RUNS):
        write_jsonl(root / f"{index:03d}.jsonl", [make_run(f"r{index:03d}", [f"output {index} " * 4_000])])
    store_path, pid_file = tmp_path / "killed.sqlite", tmp_path / "child.pid"
    process = subprocess.Popen([sys.executable, "-c", IMPORTER, str(root), str(store_path), str(pid_file)],
                               env={**os.environ, FAULTS_ENV: "ingest.txn"}, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE)
    process.communicate(timeout=300)  # returns once the importer is gone: the child holds none of its output
    assert process.returncode == -signal.SIGKILL
    child = int(pid_file.read_text())
    deadline = time.monotonic() + 60
    while _running(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _running(child)
    with Store.open(store_path) as store:
        assert store.runs.run_ids() == []


def _running(pid: int) -> bool:
    """``pid`` is a process that has not ended (its parent gone, init reaps it when it does)."""
    try:
        state = next(line for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                     if line.startswith("State:"))
    except (OSError, StopIteration):
        return False
    return "zombie" not in state
