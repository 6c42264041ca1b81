"""The run store: SQLite set-up, the append-only log, blobs, projections, explain, judgments, bad stores."""

from __future__ import annotations

import json
import sqlite3
import threading
from pathlib import Path

import pytest
from helpers import ingest_runs, sql

from kvjudge.errors import IntegrityError, RunStateError, StoreError
from kvjudge.retention import Store, fold
from kvjudge.retention.blobs import ref_of
from kvjudge.retention.events import EVENT_TYPES, Dropped, Reduced, Rehydrated, Tiered, TierStarted
from kvjudge.retention import events as ev
from kvjudge.retention.reduce_apply import reduce_run
from kvjudge.retention.stored_tokens import count_ahead, run_tokens, stored_tokens
from kvjudge.retention.state import RunState, agent_of
from kvjudge.retention.store import RunListing, default_store_path
from kvjudge.retention.store.schema import SCHEMA_VERSION
from kvjudge.testing.filler import filler
from kvjudge.testing.native_runs import make_run
from kvjudge.tokens import CharsPerToken


def test_default_path_is_in_the_data_dir(isolated_dirs: Path) -> None:
    with Store.open() as store:
        assert store.path == default_store_path() == isolated_dirs / "data" / "store.sqlite"
        assert store.path.exists()


def test_pragmas_wal_full_sync_and_schema_version(store: Store) -> None:
    conn = sql(store)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    # synchronous is a setting of each connection: the store's own is the one that counts.
    assert store._conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    assert conn.execute("PRAGMA auto_vacuum").fetchone()[0] == 2  # INCREMENTAL: freeing a body reads none of it
    assert store.schema_version() == SCHEMA_VERSION
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert {"events", "blobs", "blob_tokens", "runs", "run_bodies", "judgments"} <= tables


def test_a_process_writers_to_one_store_take_turns_on_its_lock(store: Store, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Connections to one store file (named two ways) in other threads: a write transaction waits for this one on
    this process's lock of the file, not in SQLite (which polls a taken write lock with sleeps); a store in another
    file does not wait."""
    monkeypatch.chdir(tmp_path)
    order: list[str] = []

    def write(path: Path, name: str) -> None:
        with Store.open(path) as other:
            other._conn.execute("PRAGMA busy_timeout = 0")  # SQLite's own wait off: a taken write lock fails at once
            try:
                with other.transaction(name):
                    order.append(f"{name} began")
            except sqlite3.OperationalError as exc:
                order.append(f"{name}: {exc}")

    with store.transaction("first"):
        order.append("first began")
        elsewhere = threading.Thread(target=write, args=(tmp_path / "other.sqlite", "other store"))
        elsewhere.start()
        elsewhere.join(10)
        same = threading.Thread(target=write, args=(Path("store.sqlite"), "same store"))  # relative: the same file
        same.start()
        same.join(0.5)
        assert same.is_alive() and order == ["first began", "other store began"]  # waiting on the lock
        order.append("first commits")
    same.join(10)
    assert order == ["first began", "other store began", "first commits", "same store began"]


def test_events_refuse_update_and_delete(store: Store) -> None:
    ingest_runs(store, [make_run("r1", ["out"])])
    before = list(store.events.iter_events("r1"))
    with pytest.raises(sqlite3.IntegrityError, match="append-only"):
        sql(store).execute("UPDATE events SET payload = '{}' WHERE lsn = 1")
    with pytest.raises(sqlite3.IntegrityError, match="append-only"):
        sql(store).execute("DELETE FROM events WHERE run = 'r1'")
    assert list(store.events.iter_events("r1")) == before


def test_blob_put_is_idempotent_and_never_rewrites(store: Store) -> None:
    ref = store.blobs.put(b"hello")
    assert ref == ref_of(b"hello") and ref.startswith("sha256:") and len(ref) == 71
    assert store.blobs.put(b"hello") == ref
    assert sql(store).execute("SELECT COUNT(*) FROM blobs").fetchone()[0] == 1
    assert store.blobs.get(ref) == b"hello"
    with pytest.raises(IntegrityError, match="does not hash"):
        with store.transaction("t"):
            store.blobs.put(b"other bytes", expected_ref=ref)
    assert store.blobs.get(ref) == b"hello"
    assert store.blobs.get("sha256:" + "0" * 64) is None


def test_ingested_run_folds_from_refs_only(store: Store) -> None:
    run = make_run("r1", ["first output", "second output"], dead=[["dead output"]])
    ingest_runs(store, [run])
    state = store.runs.run("r1")
    assert state.state == "graded" and state.lifecycle == ("running", "grading", "graded")
    assert [b.id for b in state.branches] == ["main", "attempt-1"]
    assert state.branches[1].status == "dead"
    assert len(state.branches[0].transitions) == 5
    assert state.verifier[0]["passed"] is True and state.grades[0]["score"] == 1.0
    # Events carry refs, never text.
    for _lsn, event in store.events.iter_events("r1"):
        assert "first output" not in event.to_json()
    out_ref = state.branches[0].transitions[2].tool_output["output_ref"]
    assert store.blobs.text(out_ref) == "first output"
    assert all(loc.status == "local" for loc in state.bodies.values())


def test_projection_dropped_is_rebuilt_byte_identical(store: Store) -> None:
    ingest_runs(store, [make_run("r1", ["a", "b"]), make_run("r2", ["c"], lifecycle=["running"])])
    store.events.mark("r2", "grading")
    before = {run_id: store.runs.run(run_id).canonical_bytes() for run_id in store.runs.run_ids()}
    path = store.path
    sql(store).execute("DROP TABLE runs")
    sql(store).execute("DROP TABLE run_bodies")
    store.close()
    with Store.open(path) as reopened:
        after = {run_id: reopened.runs.run(run_id).canonical_bytes() for run_id in reopened.runs.run_ids()}
        assert after == before
        assert reopened.rebuild_projection() == 2
        assert {r: reopened.runs.run(r).canonical_bytes() for r in reopened.runs.run_ids()} == before


def test_canonical_bytes_round_trip(store: Store) -> None:
    ingest_runs(store, [make_run("r1", ["x"], dead=[["y"]])])
    state = store.runs.run("r1")
    assert RunState.from_bytes(state.canonical_bytes()) == state
    assert RunState.from_bytes(state.canonical_bytes()).canonical_bytes() == state.canonical_bytes()


# What canonical JSON was defined as: json.dumps with these arguments. The store's encoder must give its bytes.
_CANONICAL_VALUES = ["plain", "é\u2028\x00\"\\ \U0001f600", 0, -7, 2**70, 1.5, -0.0, 1e300, 2.5e-10, True, False, None,
                     [], {}, {"b": [1, {"z": None, "é": "ü", "a": [True, 0.1]}], "a": {"": ""}}, [[[["deep"]]]]]


@pytest.mark.parametrize("value", _CANONICAL_VALUES)
def test_canonical_json_is_json_dumps_sorted_compact(value: object, monkeypatch: pytest.MonkeyPatch) -> None:
    expected = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    assert ev.canonical_json(value) == expected
    monkeypatch.setattr(ev, "_C_ENCODE", None)  # Python without the json accelerator
    assert ev.canonical_json(value) == expected


@pytest.mark.parametrize("value", [float("nan"), float("inf"), {"a": [float("-inf")]}, {"a": object()}, {1: 2, "b": 3}])
def test_canonical_json_refuses_what_json_dumps_refuses(value: object) -> None:
    with pytest.raises((ValueError, TypeError)) as expected:
        json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    with pytest.raises(expected.type):
        ev.canonical_json(value)


def test_lifecycle_mark_legal_and_illegal(store: Store) -> None:
    ingest_runs(store, [make_run("r1", ["x"], lifecycle=["running"])])
    with pytest.raises(RunStateError, match="running; it cannot become graded"):
        store.events.mark("r1", "graded")
    store.events.mark("r1", "grading")
    assert store.runs.run("r1").state == "grading"
    store.events.mark("r1", "ungraded")
    assert store.runs.run("r1").state == "ungraded"
    store.events.mark("r1", "archived")
    assert store.runs.run("r1").state == "archived"
    with pytest.raises(RunStateError):
        store.events.mark("r1", "running")
    assert [e.state for _, e in store.events.iter_events("r1") if isinstance(e, ev.StateChanged)] == [
        "grading", "ungraded", "archived"]


def test_unknown_run_is_a_store_error(store: Store) -> None:
    with pytest.raises(StoreError, match="no run 'nope'"):
        store.runs.run("nope")
    with pytest.raises(StoreError, match="no run 'nope'"):
        store.events.mark("nope", "grading")


def test_reduced_needs_its_summary_stored_first(store: Store) -> None:
    ingest_runs(store, [make_run("r1", ["x" * 100])])
    original = store.runs.run("r1").branches[0].transitions[2].tool_output["output_ref"]
    missing_summary = ref_of(b"summary never put")
    with pytest.raises(IntegrityError, match="put it first"):
        store.events.append("r1", Reduced(run="r1", original=original, summary=missing_summary, counter="c",
                                   tokens_before=25, tokens_after=2))
    assert store.runs.run("r1").bodies[original].status == "local"
    summary = store.blobs.put(b"summary")
    store.events.append("r1", Reduced(run="r1", original=original, summary=summary, counter="c", tokens_before=25,
                               tokens_after=2))
    with pytest.raises(StoreError, match="it is reduced"):
        store.events.append("r1", Reduced(run="r1", original=original, summary=summary, counter="c", tokens_before=25,
                                   tokens_after=2))


def test_release_keeps_a_body_another_run_still_reads(store: Store) -> None:
    shared = filler(1, 200)
    ingest_runs(store, [make_run("a", [shared]), make_run("b", [shared])])
    ref = store.runs.run("a").branches[0].transitions[2].tool_output["output_ref"]
    assert ref == store.runs.run("b").branches[0].transitions[2].tool_output["output_ref"]
    store.events.append("a", Dropped(run="a", original=ref))
    assert store.blobs.release([ref]) == []  # run b still reads it here
    assert store.blobs.get(ref) is not None
    store.events.append("b", Dropped(run="b", original=ref))
    assert store.blobs.release([ref]) == [ref]
    assert store.blobs.get(ref) is None
    explanation = store.runs.explain(ref)
    assert explanation.status == "dropped" and explanation.event == "Dropped" and explanation.explained


def test_explain_unknown_and_local(store: Store) -> None:
    ingest_runs(store, [make_run("r1", ["body"])])
    ref = store.runs.run("r1").task_prompt_ref
    local = store.runs.explain(ref)
    assert local.status == "local" and local.body_present and local.event is None and local.run == "r1"
    unknown = store.runs.explain("sha256:" + "1" * 64)
    assert unknown.status == "unknown" and not unknown.explained


def test_fold_handles_every_event_kind_including_tiering(store: Store) -> None:
    ingest_runs(store, [make_run("r1", ["out"], dead=[["dead"]])])
    state = store.runs.run("r1")
    out = state.branches[0].transitions[2].tool_output["output_ref"]
    manifest = store.blobs.put(b"manifest")
    store.events.append("r1", TierStarted(run="r1", target="file:///cold", manifest_ref=manifest))
    assert store.runs.run("r1").tier["status"] == "started"
    store.events.append("r1", Tiered(run="r1", target="file:///cold", manifest_ref=manifest, refs=[out]))
    tiered = store.runs.run("r1")
    assert tiered.bodies[out].status == "tiered" and tiered.bodies[out].target == "file:///cold"
    assert tiered.bodies[out].manifest_ref == manifest
    pending = store.runs.explain(out)  # the log says tiered; the body stays until tiering releases it
    assert pending.status == "tiered" and pending.body_present
    assert store.blobs.release([out]) == [out]
    assert store.runs.explain(out).status == "tiered" and store.runs.explain(out).event == "Tiered"
    store.events.append("r1", Rehydrated(run="r1", refs=[out]))
    assert store.runs.run("r1").bodies[out].status == "local" and store.runs.run("r1").tier["status"] == "rehydrated"
    kinds = {event.kind for _, event in store.events.iter_events("r1")}
    assert {"TierStarted", "Tiered", "Rehydrated"} <= kinds
    # every kind the log can hold has a fold rule (a missing one raises TypeError)
    samples = {
        "RunStarted": ev.RunStarted(run="z", tenant="t", task_id=None, task_prompt_ref=None),
        "BranchOpened": ev.BranchOpened(run="z", branch="b", status="dead", parent=None, fork_at=None),
        "TransitionRecorded": ev.TransitionRecorded(run="z", branch="b", seq=0, role="user", text_ref=out,
                                                    tool_call=None, tool_output=None, usage=None, context=None),
        "VerifierRecorded": ev.VerifierRecorded(run="z", result={"name": "v", "passed": True}),
        "GradeRecorded": ev.GradeRecorded(run="z", grade={"grader": "g", "score": 0.5}),
        "StateChanged": ev.StateChanged(run="z", state="grading"),
        "Reduced": ev.Reduced(run="z", original=out, summary=manifest, counter="c", tokens_before=2, tokens_after=1),
        "BranchReduced": ev.BranchReduced(run="z", branch="b", summary=manifest, counter="c", tokens_before=2,
                                          tokens_after=1),
        "Dropped": ev.Dropped(run="z", original=manifest),
        "TierStarted": ev.TierStarted(run="z", target="t", manifest_ref=manifest),
        "Tiered": ev.Tiered(run="z", target="t", manifest_ref=manifest, refs=[out]),
        "Rehydrated": ev.Rehydrated(run="z", refs=[out]),
        "TextRepaired": ev.TextRepaired(run="z", paths=["$.task.prompt"], refs=[out], code_units=1),
    }
    assert set(samples) == set(EVENT_TYPES)
    folded = fold(enumerate(samples.values(), start=1))["z"]
    assert folded.bodies[out].status == "reduced" and folded.bodies[manifest].status == "dropped"
    assert folded.branches[0].summary_ref == manifest and folded.reduced
    assert folded.text_repairs == ({"lsn": 13, "paths": ["$.task.prompt"], "refs": [out], "code_units": 1},)


def test_judgments_cache(store: Store) -> None:
    assert store.caches.get_judgment("k") is None
    store.caches.put_judgment("k", {"verdict": "A", "p": 0.7})
    assert store.caches.get_judgment("k") == {"verdict": "A", "p": 0.7}
    store.caches.put_judgment("k", {"verdict": "B"})
    assert store.caches.get_judgment("k") == {"verdict": "B"}
    assert sql(store).execute("SELECT COUNT(*) FROM events").fetchone()[0] == 0


def test_not_a_sqlite_file_is_a_one_line_store_error(tmp_path: Path) -> None:
    bogus = tmp_path / "notes.txt"
    bogus.write_text("this is not a database, just some text that is long enough to have a header" * 10)
    with pytest.raises(StoreError, match="not a kvjudge store"):
        Store.open(bogus)
    assert bogus.read_text().startswith("this is not a database")


def test_foreign_sqlite_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "other.sqlite"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE people (name TEXT)")
    conn.commit()
    conn.close()
    with pytest.raises(StoreError, match="not a kvjudge store"):
        Store.open(path)


def test_newer_schema_version_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "store.sqlite"
    Store.open(path).close()
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.commit()
    conn.close()
    with pytest.raises(StoreError, match=f"schema version {SCHEMA_VERSION + 1}.*upgrade kvjudge"):
        Store.open(path)


def test_a_directory_is_not_a_store(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="is a directory"):
        Store.open(tmp_path)


def test_trial_is_folded_and_left_out_of_the_bytes_when_unset(store: Store) -> None:
    with_trial = {**make_run("r1", ["a"]), "agent": "agent-x", "trial": "2"}
    ingest_runs(store, [with_trial, make_run("r2", ["b"])])
    state = store.runs.run("r1")
    assert state.trial == "2" and state.agent == "agent-x"
    assert RunState.from_bytes(state.canonical_bytes()) == state
    assert store.runs.refold("r1").canonical_bytes() == state.canonical_bytes()
    # A run without a trial keeps the bytes it had before trials existed: no "trial" key at all.
    assert store.runs.run("r2").trial is None and b'"trial"' not in store.runs.run("r2").canonical_bytes()
    first = next(iter(store.events.iter_events("r2")))[1]
    assert '"trial"' not in first.to_json()


def _listed_from_states(store: Store, counter: str) -> list[RunListing]:
    """What a listing must show, worked out the long way: every run decoded, tokens summed over its view."""
    listed = []
    for state in store.runs.iter_runs():
        gone = sum(loc.status in ("reduced", "dropped") for loc in state.bodies.values())
        listed.append(RunListing(
            id=state.id, tenant=state.tenant, agent=agent_of(state), task_id=state.task_id, trial=state.trial,
            state=state.state, grades=state.grades, reduced=state.reduced, branches=len(state.branches),
            transitions=sum(len(b.transitions) for b in state.branches), bodies=len(state.bodies), bodies_gone=gone,
            bodies_tiered=sum(loc.status == "tiered" for loc in state.bodies.values()),
            tokens=stored_tokens(store.caches, state, counter)))
    return listed


def _listing_store(store: Store, tmp_path: Path) -> CharsPerToken:
    """Runs of three agents (one named, two by run-id prefix or tenant), one reduced, a dead branch, some counted."""
    repeated = filler(3, 900)
    runs = [dict(make_run("alpha/1", [filler(1, 700), repeated, repeated], dead=[[filler(2, 500)]]),
                 agent="alpha-agent", trial="t1"),
            make_run("alpha/2", [filler(4, 300)], lifecycle=["running"]),
            make_run("plain", [filler(5, 200)], tenant="acme", passed=False),
            make_run("beta/1", [filler(6, 2_000), filler(7, 2_000)])]
    ingest_runs(store, runs)
    counter = CharsPerToken()
    reduce_run(store, "beta/1", 600, counter)  # counts beta/1's bodies and reduces it
    count_ahead(store, store.runs.run("alpha/1"), counter)
    # alpha/2: one body counted, not all it shows.
    first = store.runs.run("alpha/2").branches[0].transitions[0].text_ref
    store.caches.put_counts(counter.name, {first: 3})
    return counter


def test_listing_reads_what_the_runs_fold_to(store: Store, tmp_path: Path) -> None:
    counter = _listing_store(store, tmp_path)
    listed = store.runs.listing(counter=counter.name)
    assert listed == _listed_from_states(store, counter.name)
    by_id = {run.id: run for run in listed}
    assert by_id["beta/1"].reduced and by_id["beta/1"].bodies_gone > 0 and by_id["beta/1"].tokens is not None
    assert by_id["alpha/1"].tokens == run_tokens(store, store.runs.run("alpha/1"), counter)  # repeats counted twice
    assert by_id["alpha/2"].tokens is None and by_id["plain"].tokens is None  # partly / never counted
    assert [run.agent for run in listed] == ["alpha-agent", "alpha", "beta", "acme"]
    assert [run.tokens for run in store.runs.listing()] == [None] * 4  # no counter asked: no tokens
    # Filters in SQL, each on what its column shows.
    assert [run.id for run in store.runs.listing(agent="alpha")] == ["alpha/2"]
    assert [run.id for run in store.runs.listing(agent="acme", tenant="acme")] == ["plain"]
    assert [run.id for run in store.runs.listing(task="task-beta/1", state="graded")] == ["beta/1"]
    assert [run.id for run in store.runs.listing(state="running")] == ["alpha/2"]
    assert store.runs.listing(agent="\udcff") == [] and store.runs.run_ids(agent="alpha") == ["alpha/2"]


def _shape(store_path: Path) -> dict[str, list[tuple]]:
    with sqlite3.connect(store_path) as conn:
        shape = {table: conn.execute(f"PRAGMA table_info({table})").fetchall()
                 for table in ("runs", "run_bodies", "run_tokens")}
        shape["indexes"] = conn.execute("SELECT name, tbl_name, sql FROM sqlite_master WHERE type = 'index' "
                                        "ORDER BY name").fetchall()
        return shape


def test_a_version_1_store_is_migrated_and_its_listing_filled(store: Store, tmp_path: Path) -> None:
    counter = _listing_store(store, tmp_path)
    before = store.runs.listing(counter=counter.name)
    fresh = _shape(store.path)
    # Back to version 1 as an older kvjudge left it: the projection without the listing's columns or their index.
    old = sql(store)
    old.execute("DROP INDEX runs_listing")
    for column in ("agent", "task", "trial", "grades", "branches", "transitions", "bodies", "bodies_gone",
                   "bodies_tiered"):
        old.execute(f"ALTER TABLE runs DROP COLUMN {column}")
    old.execute("ALTER TABLE run_bodies DROP COLUMN uses")
    old.execute("DROP TABLE run_tokens")
    old.execute("DROP TABLE claims")  # migration 4's
    old.execute("PRAGMA user_version = 1")
    old.close()
    path = store.path
    store.close()
    with Store.open(path) as migrated:
        assert migrated.schema_version() == SCHEMA_VERSION == 4
        assert migrated.runs.listing(counter=counter.name) == before
    assert _shape(path) == fresh
    # A version-1 store whose projection was dropped: migrated, and the projection folded afresh from the log.
    with sqlite3.connect(path) as old:
        old.execute("DROP TABLE run_bodies")
        old.execute("DROP TABLE claims")
        old.execute("PRAGMA user_version = 1")
    with Store.open(path) as rebuilt:
        assert rebuilt.schema_version() == SCHEMA_VERSION and rebuilt.runs.listing(counter=counter.name) == before
    assert _shape(path) == fresh


def test_a_rebuilt_projection_has_the_shape_of_a_migrated_one(store: Store, tmp_path: Path) -> None:
    counter = _listing_store(store, tmp_path)
    before, shape = store.runs.listing(counter=counter.name), _shape(store.path)
    assert store.rebuild_projection() == 4
    assert store.runs.listing(counter=counter.name) == before and _shape(store.path) == shape


def test_a_version_2_store_gets_the_listing_index(store: Store, tmp_path: Path) -> None:
    counter = _listing_store(store, tmp_path)
    before, fresh, path = store.runs.listing(counter=counter.name), _shape(store.path), store.path
    store.close()
    with sqlite3.connect(path) as old:  # as version 2 left it: the listing's columns without their index
        old.execute("DROP INDEX runs_listing")
        old.execute("DROP TABLE claims")
        old.execute("PRAGMA user_version = 2")
    with Store.open(path) as migrated:
        assert migrated.schema_version() == SCHEMA_VERSION and migrated.runs.listing(counter=counter.name) == before
    assert _shape(path) == fresh
