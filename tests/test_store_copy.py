"""`kvjudge store copy SRC DST` (#44, item 5): the log in LSN order, bodies, reductions, tiered locations and the
device-independent caches move; `verify` passes on the destination; a copy killed at its fault points and run again
completes without duplicates; a destination's own runs stay; bad input is one line and writes nothing.

Each case copies a SQLite store into a destination of each kind (``dst``: a SQLite file, a database on the suite's
real PostgreSQL server); the first copies that destination back into a SQLite file as well."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import cli_json_ok, ingest_runs, kvjudge, local_cold_url
from tier_support import GRADED, tiering_run

from postgres import PostgresServer

from kvjudge.cli import main
from kvjudge.errors import KvjudgeError
from kvjudge.retention import Store
from kvjudge.retention.blobs import ref_of
from kvjudge.retention.cold import open_cold_store
from kvjudge.retention.ingest import ingest_paths
from kvjudge.retention.reduce_apply import reduce_run
from kvjudge.retention.state import REDUCED, TIERED
from kvjudge.retention.tiering import ColdReader, ColdStores, tier_run, verify_checks
from kvjudge.retention.verify import verify
from kvjudge.testing.jsonl import write_jsonl
from kvjudge.tokens import make_counter

RUNS = ("run-a", "run-b", "run-c", "run-d")

#: ``new(name)``: the location of a new, empty store of the case's destination kind.
NewStore = Callable[[str], str]


@pytest.fixture(params=["sqlite", "postgresql"])
def dst(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[NewStore]:
    if request.param == "sqlite":
        yield lambda name: str(tmp_path / f"{name}.sqlite")
        return
    server: PostgresServer = request.getfixturevalue("postgres_server")
    made: list[str] = []

    def new(_name: str) -> str:
        made.append(server.new_database())
        return server.url(made[-1])

    yield new
    for name in made:
        server.drop_database(name)


def make_source(tmp_path: Path) -> tuple[Path, str]:
    """A store of four graded runs (one reduced twice, one tiered to a local cold directory, one reduced then tiered),
    with cached judgments and token counts; the events of different runs interleave in its log."""
    path, cold_url = tmp_path / "source.sqlite", local_cold_url(tmp_path)
    cold = open_cold_store(cold_url, create=True)
    with Store.open(path) as store:
        ingest_runs(store, [tiering_run(run_id, GRADED) for run_id in RUNS])
        counter = make_counter("chars")
        assert reduce_run(store, "run-b", 3_000, counter).plan.fits
        reduce_run(store, "run-b", 600, counter)  # its extracts cut again: a summary reduced in its turn
        assert tier_run(store, "run-c", cold).status == "tiered"
        assert reduce_run(store, "run-d", 3_000, counter).plan.fits
        assert tier_run(store, "run-d", cold).status == "tiered"
        store.caches.put_judgment("verdict:a-b", {"outcome": "a", "p_a": 0.8})
        store.caches.put_judgment("score:run-a", {"score": 0.25})
        store.caches.put_counts("tiktoken", {ref_of(b"shared task prompt"): 4})
    return path, cold_url


def ingest_into(location: str, runs: list[dict[str, Any]], folder: Path) -> None:
    """Ingest native ``runs`` into the store at ``location`` (of either kind) from a file in ``folder``."""
    write_jsonl(folder / "more-runs.jsonl", runs)
    with Store.open(location) as store:
        ingest_paths(store, [folder / "more-runs.jsonl"])


def logged(store: Store, run_id: str) -> list[str]:
    return [event.to_json() for _, event in store.events.iter_events(run_id)]


def where(store: Store, run_id: str) -> dict[str, tuple[Any, ...]]:
    """Where the log says each body of the run is (no LSN: a destination's differ)."""
    return {ref: (loc.status, loc.summary_ref, loc.target, loc.manifest_ref)
            for ref, loc in store.runs.run(run_id).bodies.items()}


def refused(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """``kvjudge ARGS --json`` in this process, which must fail with one line on stderr and nothing on stdout."""
    code = main([*argv, "--json"])
    captured = capsys.readouterr()
    assert code != 0 and captured.out == "" and captured.err.count("\n") == 1, captured
    return captured.err


def readable(store: Store) -> Store:
    store.blobs.fallback = ColdReader(store, ColdStores())
    return store


def check_copied(source_path: Path | str, destination_path: Path | str, run_ids: tuple[str, ...] = RUNS) -> None:
    """The destination holds each run with the source's events, bodies (read through the cold store where tiered)
    and body locations, its caches, and `verify` (the tier check included) passes there."""
    with readable(Store.open(source_path)) as source, readable(Store.open(destination_path)) as destination:
        for run_id in run_ids:
            assert logged(destination, run_id) == logged(source, run_id), run_id
            assert where(destination, run_id) == where(source, run_id), run_id
            refs = source.runs.run(run_id).refs()
            assert {ref: destination.blobs.text(ref) for ref in refs} == {ref: source.blobs.text(ref) for ref in refs}
            assert destination.runs.local_body_bytes(run_id) == source.runs.local_body_bytes(run_id)
        assert dict(source.caches.iter_judgments()).items() <= dict(destination.caches.iter_judgments()).items()
        assert set(source.caches.iter_counts()) <= set(destination.caches.iter_counts())
        report = verify(destination, extra_checks=verify_checks(destination, ColdStores()))
        assert report.ok and not report.notes, report.to_dict()
        # Re-folded from LSN 0 on the destination: the states it keeps, byte for byte.
        for run_id in destination.runs.run_ids():
            assert destination.runs.refold(run_id).canonical_bytes() == destination.runs.projected_bytes(run_id)


def test_copy_moves_log_bodies_reductions_tiered_locations_and_caches(tmp_path: Path, dst: NewStore,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    source, _ = make_source(tmp_path)
    with Store.open(source) as store:
        bodies = store.runs.run("run-b").bodies
        assert any(bodies[loc.summary_ref].status == REDUCED for loc in bodies.values() if loc.summary_ref)
        assert {loc[0] for loc in where(store, "run-d").values()} >= {REDUCED, TIERED}
    destination = dst("destination")
    report = cli_json_ok(capsys, "store", "copy", str(source), destination)
    assert (report["runs_copied"], report["runs_skipped"], report["runs_extended"]) == (4, 0, 0)
    assert report["caches"] == {"judgments": 2, "counts": report["caches"]["counts"]} and report["caches"]["counts"] > 1
    assert report["bytes"] > 20_000 and report["mb_per_s"] > 0 and report["absent_bodies"] > 0
    # Runs interleave in the source's log (reductions and moves came after every import), so the destination's
    # LSNs differ: each move's manifest is kept there, under its ref.
    assert report["manifests"] == 2
    check_copied(source, destination)

    again = cli_json_ok(capsys, "store", "copy", str(source), destination)
    assert (again["runs_copied"], again["runs_skipped"], again["events"], again["bytes"]) == (0, 4, 0, 0)
    assert again["caches"] == {"judgments": 0, "counts": 0}
    check_copied(source, destination)
    back = tmp_path / "back.sqlite"  # and back: a copy of a copy reads the same
    cli_json_ok(capsys, "store", "copy", destination, str(back))
    check_copied(source, back)


def test_copy_into_a_store_with_other_runs_keeps_both(tmp_path: Path, dst: NewStore,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    source, _ = make_source(tmp_path)
    destination = dst("lab")
    own = [tiering_run(run_id, GRADED, shared="the lab's own prompt") for run_id in ("lab-1", "lab-2")]
    ingest_into(destination, own, tmp_path)
    with Store.open(destination) as store:
        theirs = {run_id: logged(store, run_id) for run_id in ("lab-1", "lab-2")}
    cli_json_ok(capsys, "store", "copy", str(source), destination)
    check_copied(source, destination)
    with Store.open(destination) as store:
        assert store.runs.run_ids() == sorted([*RUNS, "lab-1", "lab-2"])
        assert {run_id: logged(store, run_id) for run_id in theirs} == theirs


def test_a_run_grown_at_the_source_since_gets_the_rest(tmp_path: Path, dst: NewStore,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    source, _ = make_source(tmp_path)
    destination = dst("destination")
    cli_json_ok(capsys, "store", "copy", str(source), destination)
    with Store.open(source) as store:
        assert reduce_run(store, "run-a", 3_000, make_counter("chars")).plan.fits
    report = cli_json_ok(capsys, "store", "copy", str(source), destination)
    assert (report["runs_copied"], report["runs_extended"], report["runs_skipped"]) == (0, 1, 3)
    check_copied(source, destination)  # the bodies run-a's reduction took away are gone there too (no note)


def test_a_copy_killed_at_each_fault_point_and_run_again_completes_without_duplicates(tmp_path: Path,
                                                                                       dst: NewStore) -> None:
    source, _ = make_source(tmp_path)
    destination = dst("destination")
    command = ("store", "copy", str(source), destination, "--json")
    # Killed before a run's commit, then after each run in turn (each rerun copies one more run), then in the caches.
    killed = kvjudge(*command, faults="copy_run.txn")
    assert killed.returncode != 0
    with Store.open(destination) as store:
        assert store.runs.run_ids() == []
    for copied in range(1, len(RUNS) + 1):
        killed = kvjudge(*command, faults="after_copy_run")
        assert killed.returncode != 0
        with Store.open(destination) as store:
            assert len(store.runs.run_ids()) == copied
    assert kvjudge(*command, faults="copy_caches.txn").returncode != 0
    finished = kvjudge(*command)
    assert finished.returncode == 0, finished.stderr
    report = json.loads(finished.stdout)
    assert (report["runs_copied"], report["runs_skipped"]) == (0, len(RUNS)) and report["caches"]["judgments"] == 2
    check_copied(source, destination)
    with Store.open(source) as src, Store.open(destination) as dst:
        assert sum(1 for _ in dst.events.iter_events()) == sum(1 for _ in src.events.iter_events())


def test_a_run_held_with_other_events_is_refused_in_one_line_before_anything_is_written(
        tmp_path: Path, dst: NewStore, capsys: pytest.CaptureFixture[str]) -> None:
    source, _ = make_source(tmp_path)
    destination = dst("destination")
    ingest_into(destination, [tiering_run("run-c", ["running"])], tmp_path)
    with Store.open(destination) as store:
        before = logged(store, "run-c")
    error = refused(capsys, "store", "copy", str(source), destination)
    assert "run run-c is in the destination with other events" in error
    with Store.open(destination) as store:
        assert store.runs.run_ids() == ["run-c"] and logged(store, "run-c") == before
        assert list(store.caches.iter_judgments()) == []


def test_bad_input_is_one_line_and_writes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source, _ = make_source(tmp_path)
    missing, destination = tmp_path / "missing.sqlite", tmp_path / "destination.sqlite"
    cases = {
        (str(source), str(tmp_path / "." / "source.sqlite")): "SRC and DST are the same store",
        ("ftp://host/store", str(destination)): "ftp://… is not a store location kvjudge knows",
        (str(source), "s3://bucket/store"): "s3://… is not a store location kvjudge knows",
        (str(source), str(tmp_path)): "is a directory",
        (str(missing), str(destination)): f"no store at {missing}",
        ("postgresql://lab:hunter2@db.example/kv", "postgresql://lab:other@db.example/kv"):
            "SRC and DST are the same store (postgresql://lab@db.example/kv)",
    }
    for (src, dest), message in cases.items():
        error = refused(capsys, "store", "copy", src, dest)
        assert message in error and "hunter2" not in error, (src, dest, error)
    assert not missing.exists() and not destination.exists()


def test_an_empty_database_is_no_source_and_stays_empty(tmp_path: Path, postgres_url: str,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    destination = tmp_path / "destination.sqlite"
    error = refused(capsys, "store", "copy", postgres_url, str(destination))
    assert "kvjudge" in error and not destination.exists()
    # Still no store there: opening it without creating one is refused the same way.
    with pytest.raises(KvjudgeError):
        Store.open(postgres_url, create=False)
