"""An import killed at random moments, or at its named crash points, is finished by running the same command
again (#16).

Real child processes, real SIGKILL — at moments drawn from a seeded generator over the time a clean import
takes, and at the fault points ``ingest.txn`` (before a batch's COMMIT) and ``ingest.committed`` (right after
the first one) —; then the same command to completion: exactly the runs of the input, each re-folded state
byte-identical to a clean import of the same input, each run's content hash recomputed from its log equal to
the one it recorded, verify green — and a third run writes nothing. A kill leaves whole files: every run of a
JSONL file, or none. Each on both stores (a SQLite file, a PostgreSQL database: ``store_at``).
"""

from __future__ import annotations

import gzip
import json
import random
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers import comparable_fold, kvjudge, kvjudge_json, sql, start_kvjudge

from kvjudge.errors import StoreError
from kvjudge.retention import Store
from kvjudge.retention import events as ev
from kvjudge.retention.verify import verify
from kvjudge.testing.jsonl import write_jsonl
from kvjudge.testing.native_runs import make_run
from kvjudge.testing.trajectories import make_episode, mini_swe_agent_v1, mini_swe_agent_v2, swe_agent

RUNS = 300


def write_input(root: Path) -> None:
    """300 runs in every format: trajectory files (plain and .gz) in folders, a native and an OpenAI JSONL."""
    for index in range(200):
        instance = f"proj{index % 7}__proj-{index}"
        episode = make_episode(instance, index, target_bytes=6_000, model=f"model-{index % 3}")
        folder = root / f"model-{index % 3}" / instance
        folder.mkdir(parents=True)
        if index % 4 == 0:
            (folder / f"{instance}.traj").write_text(json.dumps(swe_agent(episode), indent=2))
        elif index % 4 == 1:
            data = json.dumps(mini_swe_agent_v1(episode), indent=2).encode()
            (folder / f"{instance}.traj.json.gz").write_bytes(gzip.compress(data, compresslevel=1))
        else:
            (folder / f"{instance}.traj.json").write_text(json.dumps(mini_swe_agent_v2(episode), indent=2))
    write_jsonl(root / "native.jsonl", [make_run(f"native-{i}", [f"output {i} " * 200, "done"]) for i in range(50)])
    write_jsonl(root / "chat.jsonl", [{"id": f"chat-{i}", "messages": [
        {"role": "user", "content": f"question {i} " * 50}, {"role": "assistant", "content": f"answer {i} " * 80}]}
        for i in range(50)])


def run_ids(location: str) -> list[str]:
    """The runs stored at ``location`` (none where no store was made yet)."""
    try:
        with Store.open(location, create=False) as store:
            return store.runs.run_ids()
    except StoreError:
        return []


def check_finished(store_path: str, clean_path: str, command: tuple[str, ...]) -> None:
    """The same command run to completion after a kill: the store matches a clean import, and a third run
    writes nothing."""
    finished = kvjudge(*command)
    assert finished.returncode == 0, finished.stderr
    report = json.loads(finished.stdout)
    assert report["imported"] + report["already_present"] == RUNS and report["skipped"] == 0

    with Store.open(clean_path) as reference, Store.open(store_path) as store:
        assert store.runs.run_ids() == reference.runs.run_ids() and len(store.runs.run_ids()) == RUNS
        for run_id in store.runs.run_ids():
            assert comparable_fold(store, run_id) == comparable_fold(reference, run_id), run_id
            logged = [event for _, event in store.events.iter_events(run_id)]
            assert isinstance(logged[0], ev.RunStarted) and logged[0].content_hash == ev.content_hash(logged), run_id
        assert verify(store).ok
        events = sql(store).execute("SELECT COUNT(*) FROM events").fetchone()[0]

    third = kvjudge_json(*command[:-1])
    assert (third["imported"], third["already_present"]) == (0, RUNS)
    with Store.open(store_path) as store:
        assert sql(store).execute("SELECT COUNT(*) FROM events").fetchone()[0] == events


@pytest.mark.parametrize("point", ["ingest.txn", "ingest.committed"])
def test_an_import_killed_at_a_named_point_finishes_on_the_same_command(tmp_path: Path, point: str,
                                                                        store_at: Callable[[str], str]) -> None:
    root = tmp_path / "runs"
    write_input(root)
    clean_path, killed_path = store_at("clean"), store_at("killed")
    assert kvjudge_json("ingest", str(root), "--store", clean_path)["imported"] == RUNS

    command = ("ingest", str(root), "--store", killed_path, "--json")
    killed = kvjudge(*command, faults=point)
    assert killed.returncode == -9, killed.stderr
    kept = run_ids(killed_path)
    if point == "ingest.txn":  # killed before the first COMMIT: nothing of the import is stored
        assert kept == []
    else:  # killed after the first COMMIT: that batch is stored, the rest is not
        assert 0 < len(kept) < RUNS
    for prefix, count in (("native-", 50), ("chat-", 50)):  # a JSONL file is stored whole, or not at all
        assert sum(run_id.startswith(prefix) for run_id in kept) in (0, count), prefix

    check_finished(killed_path, clean_path, command)


def test_killed_imports_finish_on_the_same_command(tmp_path: Path, store_at: Callable[[str], str]) -> None:
    root = tmp_path / "runs"
    write_input(root)
    clean_path, killed_path = store_at("clean"), store_at("killed")

    started = time.monotonic()
    clean = kvjudge_json("ingest", str(root), "--store", clean_path)
    clean_seconds = time.monotonic() - started
    assert clean["imported"] == RUNS

    command = ("ingest", str(root), "--store", killed_path, "--json")
    rng = random.Random(16)
    partial_kills = 0
    for _ in range(12):
        child = start_kvjudge(*command)
        time.sleep(rng.uniform(0.15, 1.0) * clean_seconds)
        child.kill()
        child.communicate()
        count = len(run_ids(killed_path))
        partial_kills += child.returncode == -9 and 0 < count < RUNS
        if partial_kills >= 3 or count == RUNS:
            break
    assert partial_kills >= 1, "no kill landed while runs were being written; the test exercised nothing"

    check_finished(killed_path, clean_path, command)
