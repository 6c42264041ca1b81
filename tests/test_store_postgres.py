"""The run store on a real PostgreSQL server (tests/postgres.py): what the database itself enforces (append-only
triggers, privileges, schema versions), the same fold as the SQLite file's, and each bad input as one line from the
real CLI with nothing written and no password shown."""

from __future__ import annotations

import json
from pathlib import Path

import psycopg
import pytest
from helpers import free_ports, kvjudge
from postgres import PASSWORD, PASSWORD_ROLE, PostgresServer
from store_cases import said, started

from kvjudge.demo import sample_runs_path
from kvjudge.errors import StoreError
from kvjudge.retention import events as ev
from kvjudge.retention.ingest import ingest_paths
from kvjudge.retention.store import Store
from kvjudge.retention.store.location import StoreLocation, without_password
from kvjudge.retention.store.postgres.schema import SCHEMA_VERSION
from kvjudge.retention.verify import verify


def _raw(url: str) -> psycopg.Connection:
    return psycopg.connect(url, autocommit=True)


def _store_with_a_run(url: str) -> None:
    with Store.open(url) as store:
        ref = store.blobs.put(b"the task")
        store.events.append_many("r1", [*started("r1"), said("r1", 0, ref)])


@pytest.mark.parametrize("statement", ["UPDATE events SET kind = 'x'", "DELETE FROM events", "TRUNCATE events"])
def test_the_database_refuses_to_edit_the_log_even_to_its_owner(postgres_url: str, statement: str) -> None:
    _store_with_a_run(postgres_url)
    with _raw(postgres_url) as conn:
        with pytest.raises(psycopg.errors.RaiseException, match="append-only"):
            conn.execute(statement)
        assert conn.execute("SELECT COUNT(*) FROM events").fetchone() == (3,)


def test_a_role_that_does_not_own_the_log_is_refused_by_privileges(postgres_server: PostgresServer,
                                                                   postgres_url: str) -> None:
    _store_with_a_run(postgres_url)
    database = postgres_url.rsplit("/", 1)[1]
    # The lab's application role: it reads and appends to the log, writes the rest, owns nothing.
    postgres_server.admin(f"GRANT SELECT, INSERT ON events TO {PASSWORD_ROLE}",
                          f"GRANT SELECT, INSERT, UPDATE, DELETE ON blobs, blob_tokens, judgments, claims, runs, "
                          f"run_bodies, run_tokens TO {PASSWORD_ROLE}", f"GRANT SELECT ON kvjudge_schema TO {PASSWORD_ROLE}",
                          f"GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO {PASSWORD_ROLE}", database=database)
    lab_url = postgres_server.url(database, PASSWORD_ROLE, PASSWORD)
    with Store.open(lab_url) as store:  # kvjudge itself works as that role: it appends, reduces, releases
        ref = store.blobs.put(b"written by the lab's role")
        store.events.append("r1", said("r1", 1, ref))
        store.events.mark("r1", "grading")
        assert verify(store).ok
    with _raw(lab_url) as conn:
        assert conn.execute("SELECT COUNT(*) FROM events").fetchone() == (5,)
        for statement in ("UPDATE events SET kind = 'x'", "DELETE FROM events", "TRUNCATE events",
                          "DROP TRIGGER events_no_update ON events"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(statement)


def test_a_dropped_trigger_is_reported_by_verify(postgres_url: str) -> None:
    _store_with_a_run(postgres_url)
    with _raw(postgres_url) as conn:
        conn.execute("DROP TRIGGER events_no_truncate ON events")
    with Store.open(postgres_url) as store:
        assert store.events.missing_log_triggers() == ["events_no_truncate"]
        report = verify(store)
        assert [v.check for v in report.violations] == ["log"] and "events_no_truncate" in report.violations[0].message


def test_dropped_projection_tables_fold_back_byte_identical(postgres_url: str) -> None:
    with Store.open(postgres_url) as store:
        ingest_paths(store, [sample_runs_path()])
        before = {run: store.runs.projected_bytes(run) for run in store.runs.run_ids()}
        listing = store.runs.listing()
    assert len(before) >= 5
    with _raw(postgres_url) as conn:
        conn.execute("DROP TABLE runs, run_bodies, run_tokens")
    with Store.open(postgres_url) as store:
        assert {run: store.runs.projected_bytes(run) for run in store.runs.run_ids()} == before
        assert store.runs.listing() == listing and verify(store).ok


def test_sqlite_and_postgres_fold_the_same_runs_to_the_same_bytes(tmp_path: Path, postgres_url: str) -> None:
    with Store.open(tmp_path / "store.sqlite") as lite, Store.open(postgres_url) as pg:
        for store in (lite, pg):
            ingest_paths(store, [sample_runs_path()])
        runs = lite.runs.run_ids()
        assert runs == pg.runs.run_ids() and len(runs) >= 5
        for run in runs:
            assert lite.runs.projected_bytes(run) == pg.runs.projected_bytes(run), run
            assert list(lite.events.iter_events(run)) == list(pg.events.iter_events(run)), run
        assert lite.runs.listing() == pg.runs.listing()
        assert list(lite.blobs.iter_bodies()) == list(pg.blobs.iter_bodies())


def test_a_rolled_back_append_leaves_a_gap_nobody_trips_on(postgres_url: str) -> None:
    with Store.open(postgres_url) as store:
        first = store.events.append_many("r1", started("r1"))
        with pytest.raises(RuntimeError), store.transaction("abandoned"):
            store.events.append_many("r2", started("r2"))
            raise RuntimeError("roll back")
        last = store.events.append("r1", ev.StateChanged(run="r1", state="grading"))
        assert last > first[-1] + 1  # the sequence does not give numbers back
        assert [lsn for lsn, _, _ in store.events.events_after(first[-1])] == [last]
        assert verify(store).ok and store.runs.run_ids() == ["r1"]


def test_a_name_holding_a_nul_is_refused_in_one_line_and_writes_nothing(postgres_url: str) -> None:
    # SQLite keeps such a name; PostgreSQL's text cannot, so it is said (not a driver's traceback).
    with Store.open(postgres_url) as store:
        with pytest.raises(StoreError, match=r"its id holds a NUL character, which a PostgreSQL store cannot keep"):
            store.events.append_many("a\x00b", started("a\x00b"))
        with pytest.raises(StoreError, match=r"its tenant holds a NUL"):
            store.events.append_many("r1", started("r1", tenant="t\x00"))
        assert store.events.logged_runs() == [] and not store.runs.has_run("a\x00b")
        assert store.runs.run_ids(task="\x00") == [] and store.runs.projected_bytes("a\x00b") is None


def test_a_store_reopened_on_the_pool_shares_the_database(postgres_url: str) -> None:
    with Store.open(postgres_url) as store:
        store.events.append_many("r1", started("r1"))
        with store.open_another() as other:
            assert other.runs.run_ids() == ["r1"] and other.location == store.location
            other.events.mark("r1", "grading")
        readers = store.body_readers()
        try:
            ref = store.blobs.put(b"read in chunks")
            with readers.open(ref) as body:
                assert body.read(4) + body.read() == b"read in chunks"
            assert readers.open("0" * 64) is None
        finally:
            readers.close()
        assert store.runs.run("r1").state == "grading" and store.path is None


def test_a_database_of_a_newer_schema_or_another_application_is_refused(postgres_server: PostgresServer,
                                                                        postgres_url: str) -> None:
    _store_with_a_run(postgres_url)
    with _raw(postgres_url) as conn:
        conn.execute("INSERT INTO kvjudge_schema(version, name) VALUES (99, 'from the future')")
    with pytest.raises(StoreError, match=f"schema version 99; this kvjudge reads up to {SCHEMA_VERSION} — upgrade "
                                         f"kvjudge"):
        Store.open(postgres_url)
    other = postgres_server.new_database()
    try:
        postgres_server.admin("CREATE TABLE accounts (id int)", database=other)
        with pytest.raises(StoreError, match="holds tables but is not a kvjudge store"):
            Store.open(postgres_server.url(other))
        with _raw(postgres_server.url(other)) as conn:  # nothing written
            assert conn.execute("SELECT COUNT(*) FROM pg_tables WHERE schemaname = 'public'").fetchone() == (1,)
    finally:
        postgres_server.drop_database(other)


def test_the_password_is_never_shown(postgres_server: PostgresServer, postgres_url: str) -> None:
    database = postgres_url.rsplit("/", 1)[1]
    postgres_server.admin(f"GRANT CREATE ON SCHEMA public TO {PASSWORD_ROLE}", database=database)
    url = postgres_server.url(database, PASSWORD_ROLE, PASSWORD)
    assert PASSWORD not in without_password(url) and PASSWORD not in repr(StoreLocation.parse(url))
    with Store.open(url) as store:
        assert PASSWORD not in store.location + repr(store)
    done = kvjudge("ingest", str(sample_runs_path()), "--store", url, "--json")
    listed = kvjudge("runs", "--store", url, "--json")
    assert done.returncode == 0 and listed.returncode == 0, done.stderr + listed.stderr
    assert json.loads(done.stdout)["store"] == postgres_server.url(database, PASSWORD_ROLE)
    for text in (done.stdout, done.stderr, listed.stdout, listed.stderr):
        assert PASSWORD not in text


def _one_line_error(args: list[str], *, env: dict[str, str] | None = None) -> str:
    done = kvjudge(*args, env=env, timeout=60)
    assert done.returncode != 0 and done.stdout == "" and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    return done.stderr


def test_bad_store_locations_are_one_line_each_and_write_nothing(postgres_server: PostgresServer, postgres_url: str,
                                                                 tmp_path: Path) -> None:
    import os
    import time

    (closed,) = free_ports(1)
    started_at = time.monotonic()
    unreachable = _one_line_error(["runs", "--store", f"postgresql://kvjudge@127.0.0.1:{closed}/db"])
    assert "cannot reach PostgreSQL at postgresql://kvjudge@127.0.0.1" in unreachable
    assert time.monotonic() - started_at < 30
    database = postgres_url.rsplit("/", 1)[1]
    wrong = postgres_server.url(database, PASSWORD_ROLE, "not-the-Password")
    said_wrong = _one_line_error(["runs", "--store", wrong])
    assert "refused the password" in said_wrong and "not-the-Password" not in said_wrong
    env = {**os.environ, "PGPASSWORD": "also-Wrong-9"}
    said_env = _one_line_error(["runs", "--store", postgres_server.url(database, PASSWORD_ROLE)], env=env)
    assert "refused the password" in said_env and "also-Wrong-9" not in said_env
    missing = _one_line_error(["runs", "--store", postgres_server.url("no_such_db")])
    assert "'no_such_db' does not exist" in missing and "createdb no_such_db" in missing
    empty = _one_line_error(["runs", "--store", postgres_url])
    assert "no store at" in empty and "kvjudge ingest" in empty
    scheme = _one_line_error(["runs", "--store", "mysql://root@localhost/db"])
    assert "mysql://… is not a store location" in scheme
    directory = _one_line_error(["runs", "--store", str(tmp_path)])
    assert "is a directory" in directory
    with _raw(postgres_url) as conn:  # nothing written: not even kvjudge's schema
        assert conn.execute("SELECT COUNT(*) FROM pg_tables WHERE schemaname = 'public'").fetchone() == (0,)
    _store_with_a_run(postgres_url)
    with _raw(postgres_url) as conn:
        conn.execute("INSERT INTO kvjudge_schema(version, name) VALUES (7, 'newer')")
    newer = _one_line_error(["runs", "--store", postgres_url])
    assert "schema version 7" in newer and "upgrade kvjudge" in newer


def test_the_store_is_chosen_by_setting_environment_or_flag(postgres_url: str, tmp_path: Path) -> None:
    import os

    _store_with_a_run(postgres_url)
    config = tmp_path / "kvjudge.toml"
    config.write_text(f'[store]\nurl = "{postgres_url}"\n')
    assert json.loads(kvjudge("runs", "--config", str(config), "--json").stdout)[0]["id"] == "r1"
    env = {**os.environ, "KVJUDGE_STORE": postgres_url}
    assert json.loads(kvjudge("runs", "--json", env=env).stdout)[0]["id"] == "r1"
    lite = tmp_path / "lite.sqlite"
    Store.open(lite).close()
    assert json.loads(kvjudge("runs", "--store", str(lite), "--json", env=env).stdout) == []  # the flag wins
    both = tmp_path / "both.toml"
    both.write_text(f'[store]\nurl = "{postgres_url}"\n[retention]\nstore = "{lite}"\n')
    refused = _one_line_error(["runs", "--config", str(both)])
    assert "[store] url and [retention] store name different stores" in refused
    named = tmp_path / "named.toml"
    named.write_text('[store]\npassword_env = "KVJUDGE_TEST_NO_SUCH_VAR"\n')
    assert "KVJUDGE_TEST_NO_SUCH_VAR, which is not set" in _one_line_error(["runs", "--config", str(named)])


# A writer process: ``count`` runs of its own, each appended in two transactions; every fifth run also has an append
# rolled back on purpose (its LSN is drawn, then given up: a gap).
_WRITER = """
import sys
from kvjudge.retention import events as ev
from kvjudge.retention.store import Store

url, name, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
with Store.open(url) as store:
    for n in range(count):
        run = f"{name}-{n}"
        store.events.append_many(run, [
            ev.RunStarted(run=run, tenant="t", task_id="task", task_prompt_ref=None, agent=name),
            ev.BranchOpened(run=run, branch="main", status="live", parent=None, fork_at=None)])
        if n % 5 == 0:
            try:
                with store.transaction("abandoned"):
                    store.events.mark(run, "grading")
                    raise RuntimeError("rolled back on purpose")
            except RuntimeError:
                pass
        store.events.mark(run, "grading")
"""


def test_writers_racing_commit_in_lsn_order_and_a_follower_skips_nothing(postgres_url: str) -> None:
    import subprocess
    import sys

    writers, runs_each = 4, 25
    Store.open(postgres_url).close()  # the schema first: the writers race on appends, not on migrating
    processes = [subprocess.Popen([sys.executable, "-c", _WRITER, postgres_url, f"w{index}", str(runs_each)],
                                  stderr=subprocess.PIPE, text=True) for index in range(writers)]
    seen: list[int] = []
    with Store.open(postgres_url) as follower:
        # Follow the log as a reader on another host would: "what came after the last LSN I saw", over and over.
        while True:
            running = any(process.poll() is None for process in processes)
            batch = follower.events.events_after(seen[-1] if seen else 0, limit=50)
            seen += [lsn for lsn, _, _ in batch]
            if not batch and not running:
                break
        for process in processes:
            assert process.wait() == 0, process.stderr.read() if process.stderr else ""
        logged = follower.events.events_after(0, limit=10 ** 6)
        assert seen == [lsn for lsn, _, _ in logged]  # nothing committed behind the follower's back
        assert len(logged) == writers * runs_each * 3
        assert any(later - earlier > 1 for earlier, later in zip(seen, seen[1:]))  # the rolled-back appends' gaps
        assert len({run for _, run, _ in logged}) == writers * runs_each
        assert {follower.runs.run(run).state for run in follower.runs.run_ids()} == {"grading"}
        assert verify(follower).ok


def test_the_password_comes_from_libpq_conventions_or_password_env(postgres_server: PostgresServer,
                                                                   postgres_url: str, tmp_path: Path) -> None:
    import os

    _store_with_a_run(postgres_url)
    database = postgres_url.rsplit("/", 1)[1]
    postgres_server.admin(f"GRANT SELECT ON ALL TABLES IN SCHEMA public TO {PASSWORD_ROLE}", database=database)
    url = postgres_server.url(database, PASSWORD_ROLE)  # no password in it
    base = {key: value for key, value in os.environ.items() if not key.startswith("PG")}
    passfile = tmp_path / "pgpass"
    passfile.write_text(f"127.0.0.1:*:{database}:{PASSWORD_ROLE}:{PASSWORD}\n")
    passfile.chmod(0o600)
    config = tmp_path / "kvjudge.toml"
    config.write_text(f'[store]\nurl = "{url}"\npassword_env = "LAB_DB_PASSWORD"\n')
    for how, args, env in (("PGPASSWORD", ["--store", url], {"PGPASSWORD": PASSWORD}),
                           ("PGPASSFILE", ["--store", url], {"PGPASSFILE": str(passfile)}),
                           ("password_env", ["--config", str(config)], {"LAB_DB_PASSWORD": PASSWORD})):
        done = kvjudge("runs", *args, "--json", env={**base, **env})
        assert done.returncode == 0, (how, done.stderr)
        assert [run["id"] for run in json.loads(done.stdout)] == ["r1"], how
        assert PASSWORD not in done.stdout + done.stderr, how
    refused = _one_line_error(["runs", "--store", url], env=base)  # none given at all
    assert "asks a password" in refused and "none was given" in refused


def test_a_location_is_a_path_or_a_url_shown_without_its_password(tmp_path: Path) -> None:
    from kvjudge.retention.store.location import scrub, url_password

    url = "postgresql://lab:s%40cret@db.example:5432/runs?sslmode=require&password=other"
    parsed = StoreLocation.parse(url)
    assert parsed.is_postgres and parsed.url == url and parsed.path is None
    assert parsed.display == str(parsed) == "postgresql://lab@db.example:5432/runs?sslmode=require"
    assert "s%40cret" not in repr(parsed) and "other" not in repr(parsed)
    assert url_password(url) == "s@cret" and url_password("postgres://lab@h/db?password=p%26q") == "p&q"
    assert scrub("failed for s@cret and s%40cret", "s@cret") == "failed for *** and ***"
    assert StoreLocation.parse("postgres://h/db").display == "postgres://h/db"
    lite = StoreLocation.parse(tmp_path / "store.sqlite")
    assert not lite.is_postgres and lite.path == tmp_path / "store.sqlite" and lite.display == str(lite.path)
    for bad, said_ in (("sqlite:///x.db", "sqlite://… is not a store location"), (str(tmp_path), "is a directory")):
        with pytest.raises(StoreError, match=said_):
            StoreLocation.parse(bad)
