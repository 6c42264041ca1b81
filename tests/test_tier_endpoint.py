"""Tiered runs remember their S3 endpoint (issue #14), against real SeaweedFS servers with AWS_ENDPOINT_URL removed
from the environment: every later read goes where the move recorded, an --endpoint-url that points elsewhere is
checked against the run's manifest, and logs written before endpoints were recorded keep working with a notice."""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path

import pytest
from helpers import event_kinds, free_ports, kvjudge, sql
from seaweed import SeaweedServer, seaweed  # noqa: F401 (fixture)
from tier_support import GRADED, big_output, make_store, texts, tiered_refs

from kvjudge.retention import Store
from kvjudge.retention import events as ev
from kvjudge.retention.blobs import ref_of
from kvjudge.retention.cold import S3ColdStore, manifest_key
from kvjudge.retention.events import canonical_json
from kvjudge.retention.tiering.manifest import logged_manifest
from kvjudge.retention.tiering.transfer import fetch_body

pytestmark = pytest.mark.s3


def environment(server: SeaweedServer, **extra: str) -> dict[str, str]:
    """This process's environment with the server's credentials and no AWS_ENDPOINT_URL (unless in ``extra``)."""
    env = {k: v for k, v in os.environ.items() if k != "AWS_ENDPOINT_URL"}
    env.update({k: v for k, v in server.env().items() if k != "AWS_ENDPOINT_URL"})
    env.update(extra)
    return env


def tier_events(store: Store, run_id: str) -> list[ev.Event]:
    return [e for _, e in store.events.iter_events(run_id) if isinstance(e, (ev.TierStarted, ev.Tiered))]


def shown_output(stdout: str) -> dict:
    return json.loads(stdout)["branches"][0]["transitions"][2]["tool_output"]["output"]


def one_line_error(done, *needles: str) -> None:
    assert done.returncode != 0, done.stdout
    assert done.stderr.startswith("kvjudge: error: ") and done.stderr.count("\n") == 1, done.stderr
    for needle in needles:
        assert needle in done.stderr, (needle, done.stderr)


def copy_bucket(source: SeaweedServer, dest: SeaweedServer, bucket: str) -> int:
    """Copy every object of ``bucket`` from one server to the same bucket on another (a store that moved)."""
    src, dst = source.client(), dest.client()
    copied = 0
    for page in src.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        for item in page.get("Contents", []):
            body = src.get_object(Bucket=bucket, Key=item["Key"])["Body"].read()
            dst.put_object(Bucket=bucket, Key=item["Key"], Body=body)
            copied += 1
    return copied


def recorded_manifest_key(store: Store, run_id: str) -> str:
    """The key of the manifest of the run's (only) move: it covers the log up to the event before TierStarted."""
    return manifest_key(run_id, max(lsn for lsn, e in store.events.iter_events(run_id)
                                    if not isinstance(e, (ev.TierStarted, ev.Tiered))))


def empty_bucket(server: SeaweedServer, bucket: str) -> None:
    client = server.client()
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        for item in page.get("Contents", []):
            client.delete_object(Bucket=bucket, Key=item["Key"])


@pytest.fixture(autouse=True)
def credentials_only(seaweed: SeaweedServer, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    """This test process: the servers' credentials, and no AWS_ENDPOINT_URL (so nothing can lean on it)."""
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    for key, value in environment(seaweed).items():
        if key.startswith("AWS_"):
            monkeypatch.setenv(key, value)


@pytest.fixture
def second_seaweed() -> SeaweedServer:
    """Another SeaweedFS server (its own data, its own ports), stopped after the test."""
    server = SeaweedServer().start()
    yield server
    server.stop()


def test_every_read_goes_to_the_recorded_endpoint(tmp_path: Path, seaweed: SeaweedServer,  # noqa: F811
                                                  default_model: Path, ceiling_args: list[str]) -> None:
    bucket = seaweed.new_bucket()
    target = f"s3://{bucket}/cold"
    path = make_store(tmp_path / "store.sqlite")
    store_args = ("--store", str(path))
    env = environment(seaweed)

    done = kvjudge("tier", "--all", "--to", target, "--endpoint-url", seaweed.endpoint, *store_args, *ceiling_args,
                   "--json",
                   env=env)
    assert done.returncode == 0, done.stderr
    payload = json.loads(done.stdout)
    assert payload["endpoint"] == seaweed.endpoint
    assert [(r["run"], r["status"], r["endpoint"]) for r in payload["runs"]] == [
        ("run-a", "tiered", seaweed.endpoint), ("run-b", "tiered", seaweed.endpoint)]
    with Store.open(path) as store:
        for run_id in ("run-a", "run-b"):
            assert [(e.kind, e.target, e.endpoint) for e in tier_events(store, run_id)] == [
                ("TierStarted", target, seaweed.endpoint), ("Tiered", target, seaweed.endpoint)]
            assert store.runs.run(run_id).tier["endpoint"] == seaweed.endpoint
            assert store.runs.refold(run_id).canonical_bytes() == store.runs.projected_bytes(run_id)
        moved = tiered_refs(store, "run-a")

    # Fresh processes, no endpoint anywhere in their environment or config: each reads from the server above.
    checked = kvjudge("verify", "--verify-remote", *store_args, "--json", env=env)
    assert checked.returncode == 0, checked.stderr
    report = json.loads(checked.stdout)
    assert report["ok"] and report["violations"] == [] and report["runs"] == 3
    shown = kvjudge("show", "run-a", "--full", *store_args, "--json", env=env)
    assert shown.returncode == 0, shown.stderr
    output = shown_output(shown.stdout)
    assert (output["status"], output["text"]) == ("tiered", big_output("run-a"))
    # An endpoint in the environment that points elsewhere (nothing listens there) is not where a run went.
    (dead,) = free_ports(1)
    elsewhere = kvjudge("show", "run-b", "--full", *store_args, "--json",
                        env=environment(seaweed, AWS_ENDPOINT_URL=f"http://127.0.0.1:{dead}"))
    assert elsewhere.returncode == 0, elsewhere.stderr
    assert shown_output(elsewhere.stdout)["text"] == big_output("run-b")
    judged = kvjudge("judge", "run-a", "run-b", "--model", str(default_model), "--n-ctx", "512", "--no-certify",
                     "--no-cache", *store_args, "--json", env=env, timeout=900)
    assert judged.returncode == 0, judged.stderr
    verdict = json.loads(judged.stdout.splitlines()[0])
    assert (verdict["a"], verdict["b"]) == ("run-a", "run-b") and verdict["outcome"] not in ("error", "overflow")
    back = kvjudge("rehydrate", "run-a", *store_args, "--json", env=env)
    assert back.returncode == 0, back.stderr
    result = json.loads(back.stdout)
    assert (result["status"], result["refs"], result["endpoint"]) == ("rehydrated", len(moved), seaweed.endpoint)
    with Store.open(path) as store:
        assert tiered_refs(store, "run-a") == []
        assert all(store.blobs.get(ref) is not None for ref in moved)  # every body local again, from the server
        assert texts(store, "run-a")[ref_of(big_output("run-a").encode())] == big_output("run-a")


def test_an_endpoint_override_must_hold_the_recorded_manifest(tmp_path: Path, seaweed: SeaweedServer,  # noqa: F811
                                                              second_seaweed: SeaweedServer,
                                                              ceiling_args: list[str]) -> None:
    bucket = seaweed.new_bucket()
    target = f"s3://{bucket}/cold"
    path = make_store(tmp_path / "store.sqlite", {"run-a": GRADED, "run-b": GRADED})
    store_args = ("--store", str(path))
    env = environment(seaweed)
    done = kvjudge("tier", "run-a", "--to", target, "--endpoint-url", seaweed.endpoint, *store_args, *ceiling_args,
                   env=env)
    assert done.returncode == 0, done.stderr
    second_seaweed.client().create_bucket(Bucket=bucket)  # the same bucket name on another server
    with Store.open(path) as store:
        key = f"cold/{recorded_manifest_key(store, 'run-a')}"
        manifest_ref = store.runs.run("run-a").tier["manifest_ref"]
        moved = tiered_refs(store, "run-a")
        objects = [remote.key for remote in logged_manifest(store, "run-a", manifest_ref).objects]
    recorded = seaweed.client().get_object(Bucket=bucket, Key=key)["Body"].read()
    assert ref_of(recorded) == manifest_ref

    def snapshot() -> tuple:
        with Store.open(path) as store:
            bodies = sql(store).execute("SELECT ref, typeof(body) FROM blobs ORDER BY ref").fetchall()
            return [e.to_json() for _, e in store.events.iter_events()], bodies

    before = snapshot()
    # 1. The other server holds no manifest for the run; 2. it holds a different one under the same key.
    other_manifest = recorded.replace(b'"tenant":"acme"', b'"tenant":"other"')
    assert other_manifest != recorded
    for contents in (None, other_manifest):
        if contents is not None:
            second_seaweed.client().put_object(Bucket=bucket, Key=key, Body=contents)
            for key_ in objects:  # and objects under the run's keys, which must never be read
                second_seaweed.client().put_object(Bucket=bucket, Key=f"cold/{key_}", Body=b"not the body")
        override = ("--endpoint-url", second_seaweed.endpoint)
        for command in (("show", "run-a"), ("rehydrate", "run-a"), ("verify",), ("verify", "--verify-remote")):
            refused = kvjudge(*command, *override, *store_args, env=env)
            one_line_error(refused, seaweed.endpoint, second_seaweed.endpoint, "not the same store")
        assert snapshot() == before  # nothing read from it into the store, nothing appended
    # A run never tiered there is not affected by the override.
    other = kvjudge("show", "run-b", "--endpoint-url", second_seaweed.endpoint, *store_args, env=env)
    assert other.returncode == 0, other.stderr

    # The store really moved: the same objects on the second server, gone from the first.
    empty_bucket(second_seaweed, bucket)
    assert copy_bucket(seaweed, second_seaweed, bucket) > 0
    empty_bucket(seaweed, bucket)
    stale = kvjudge("show", "run-a", *store_args, env=env)  # the recorded endpoint no longer has it: no fallback
    one_line_error(stale, "is tiered to", "does not have it")
    moved = kvjudge("show", "run-a", "--full", "--endpoint-url", second_seaweed.endpoint, *store_args, "--json",
                    env=env)
    assert moved.returncode == 0, moved.stderr
    assert shown_output(moved.stdout)["text"] == big_output("run-a")
    checked = kvjudge("verify", "--verify-remote", "--endpoint-url", second_seaweed.endpoint, *store_args, "--json",
                      env=env)
    assert checked.returncode == 0 and json.loads(checked.stdout)["ok"], checked.stdout + checked.stderr


def test_recovery_finishes_at_the_recorded_endpoint(tmp_path: Path, seaweed: SeaweedServer,  # noqa: F811
                                                    ceiling_args: list[str]) -> None:
    bucket = seaweed.new_bucket()
    target = f"s3://{bucket}/cold"
    path = make_store(tmp_path / "store.sqlite")
    env = environment(seaweed)
    with Store.open(path) as store:
        before = texts(store, "run-a")
    crashed = kvjudge("tier", "run-a", "--to", target, "--endpoint-url", seaweed.endpoint, "--store", str(path),
                      *ceiling_args, faults="tier.after_blobs", env=env)
    assert crashed.returncode == -9, crashed.stderr
    with Store.open(path) as store:
        tier = store.runs.run("run-a").tier
        assert (tier["status"], tier["target"], tier["endpoint"]) == ("started", target, seaweed.endpoint)
        key = recorded_manifest_key(store, "run-a")
    cold = S3ColdStore(bucket, "cold", endpoint_url=seaweed.endpoint)
    assert cold.get_manifest(key) is None  # killed before the manifest: the remote has not committed
    # No --endpoint-url, no AWS_ENDPOINT_URL, no config: the move is finished where it started.
    rerun = kvjudge("tier", "run-a", "--to", target, "--store", str(path), *ceiling_args, "--json", env=env)
    assert rerun.returncode == 0, rerun.stderr
    (result,) = json.loads(rerun.stdout)["runs"]
    assert (result["status"], result["recovered"], result["endpoint"]) == ("tiered", "upload", seaweed.endpoint)
    with Store.open(path) as store:
        assert event_kinds(store, "run-a")[-2:] == ["TierStarted", "Tiered"]
        manifest = logged_manifest(store, "run-a", store.runs.run("run-a").tier["manifest_ref"])
        assert all(fetch_body(cold, entry) is not None for entry in manifest.entries)
        assert manifest.refs == tiered_refs(store, "run-a")
        assert ref_of(cold.get_manifest(key) or b"") == store.runs.run("run-a").tier["manifest_ref"]
    checked = kvjudge("verify", "--verify-remote", "--store", str(path), "--json", env=env)
    assert checked.returncode == 0 and json.loads(checked.stdout)["ok"], checked.stdout + checked.stderr
    shown = kvjudge("show", "run-a", "--full", "--store", str(path), "--json", env=env)
    assert shown.returncode == 0 and shown_output(shown.stdout)["text"] == before[shown_output(shown.stdout)["ref"]]


def without_endpoints(source: Path, dest: Path) -> None:
    """``source`` as kvjudge wrote it before endpoints were recorded: the same log with ``endpoint`` left out of
    TierStarted / Tiered, the same blob rows and counts, projections folded by this kvjudge."""
    with sqlite3.connect(source) as old:
        events = old.execute("SELECT lsn, run, kind, payload FROM events ORDER BY lsn").fetchall()
        blobs = old.execute("SELECT ref, size, body FROM blobs").fetchall()
    Store.open(dest).close()
    with sqlite3.connect(dest) as new:  # one transaction
        for lsn, run, kind, payload in events:
            data = json.loads(payload)
            if kind in ("TierStarted", "Tiered"):
                data = {k: v for k, v in data.items() if k not in ("endpoint", "unreduced")}
            new.execute("INSERT INTO events(lsn, run, kind, payload) VALUES (?, ?, ?, ?)",
                        (lsn, run, kind, canonical_json(data)))
        new.executemany("INSERT INTO blobs(ref, size, body) VALUES (?, ?, ?)", blobs)
    with Store.open(dest) as store:
        store.rebuild_projection()


def test_a_log_without_endpoints_reads_as_before_with_one_notice(tmp_path: Path, seaweed: SeaweedServer,  # noqa: F811
                                                                 ceiling_args: list[str]) -> None:
    bucket = seaweed.new_bucket()
    path = make_store(tmp_path / "new.sqlite")
    env = environment(seaweed)
    done = kvjudge("tier", "--all", "--to", f"s3://{bucket}/cold", "--endpoint-url", seaweed.endpoint,
                   "--store", str(path), *ceiling_args, env=env)
    assert done.returncode == 0, done.stderr
    old = tmp_path / "old.sqlite"
    without_endpoints(path, old)
    with Store.open(old) as store:
        for run_id in ("run-a", "run-b"):
            assert "endpoint" not in store.runs.run(run_id).tier  # folds as it did before endpoints existed
            assert all(e.endpoint is None for e in tier_events(store, run_id))
    # Today's resolution (AWS_ENDPOINT_URL here), one notice however many bodies are read.
    with_env = environment(seaweed, AWS_ENDPOINT_URL=seaweed.endpoint)
    shown = kvjudge("show", "run-a", "--full", "--store", str(old), "--json", env=with_env)
    assert shown.returncode == 0, shown.stderr
    assert shown_output(shown.stdout)["text"] == big_output("run-a")
    notes = [line for line in shown.stderr.splitlines() if "before kvjudge recorded S3 endpoints" in line]
    assert len(notes) == 1 and seaweed.endpoint in notes[0] and "AWS_ENDPOINT_URL" in notes[0], shown.stderr
    # --endpoint-url works for it too, and verify's re-fold of the old log matches its projection.
    checked = kvjudge("verify", "--verify-remote", "--endpoint-url", seaweed.endpoint, "--store", str(old), "--json",
                      env=env)
    assert checked.returncode == 0 and json.loads(checked.stdout)["ok"], checked.stdout + checked.stderr
    assert checked.stderr.count("before kvjudge recorded S3 endpoints") == 1
