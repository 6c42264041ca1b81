"""Helpers shared by the tiering tests: small real runs, both kinds of cold target, and remote inspection."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from helpers import local_cold_url, store_from_runs
from seaweed import SeaweedServer

from kvjudge.retention import Store
from kvjudge.retention.cold import ColdStore, LocalDirColdStore, S3ColdStore, open_cold_store
from kvjudge.retention import events as ev
from kvjudge.retention.blobs import ref_of
from kvjudge.retention.events import canonical_json
from kvjudge.retention.state import LOCAL, TIERED
from kvjudge.retention.tiering.manifest import Manifest, ManifestEntry, logged_manifest

GRADED = ["running", "grading", "graded"]


def tiering_run(run_id: str, lifecycle: list[str], *, shared: str = "shared task prompt",
                big: int = 20_000) -> dict[str, Any]:
    """One native run: a task prompt shared with other runs, a live and a dead branch, a large tool output."""
    return {
        "id": run_id, "tenant": "acme", "lifecycle": lifecycle,
        "task": {"id": "t1", "prompt": shared},
        "branches": [
            {"id": "main", "status": "live", "parent": None, "fork_at": None, "transitions": [
                {"role": "user", "text": f"please fix it ({run_id})"},
                {"role": "assistant", "text": f"running the tests for {run_id}",
                 "tool_call": {"name": "bash", "arguments": "pytest -q"}},
                {"role": "tool", "tool_output": {"name": "bash", "output": (f"{run_id} line\n" * big)[:big],
                                                 "exit_code": 1}},
            ]},
            {"id": "attempt-1", "status": "dead", "parent": "main", "fork_at": 1, "transitions": [
                {"role": "assistant", "text": f"a dead end of {run_id} ✗"},
            ]},
        ],
        "grades": [{"grader": "human", "score": 1.0, "label": "pass"}] if "graded" in lifecycle else [],
    }


def big_output(run_id: str) -> str:
    """The large tool output of ``run_id``'s :func:`tiering_run`, as ingested."""
    return tiering_run(run_id, GRADED)["branches"][0]["transitions"][2]["tool_output"]["output"]


def make_store(path: Path | str, runs: dict[str, list[str]] | None = None) -> Path | str:
    """A store at ``path`` (a file, or a PostgreSQL URL) holding ``runs`` (id → lifecycle); default: two graded
    runs and a running one."""
    runs = runs or {"run-a": GRADED, "run-b": GRADED, "run-live": ["running"]}
    store_from_runs(path, [tiering_run(run_id, lifecycle) for run_id, lifecycle in runs.items()]).close()
    return path


def texts(store: Store, run_id: str) -> dict[str, str | None]:
    """Every ref the run names → its text as a reader sees it (local, or through the fallback)."""
    return {ref: store.blobs.text(ref) for ref in store.runs.run(run_id).refs()}


def tiered_refs(store: Store, run_id: str) -> list[str]:
    return sorted(ref for ref, loc in store.runs.run(run_id).bodies.items() if loc.status == TIERED)


def remote_keys(cold: ColdStore) -> list[str]:
    """Every object key the cold store holds (relative to its root/prefix), temp files included."""
    if isinstance(cold, LocalDirColdStore):
        return sorted(str(p.relative_to(cold.root)) for p in cold.root.rglob("*") if p.is_file())
    assert isinstance(cold, S3ColdStore)
    keys: list[str] = []
    for page in cold._client.get_paginator("list_objects_v2").paginate(Bucket=cold.bucket, Prefix=cold.prefix):
        keys.extend(item["Key"].removeprefix(cold.prefix + "/") for item in page.get("Contents", []))
    return sorted(keys)


def tamper(cold: ColdStore, key: str, data: bytes) -> None:
    """Overwrite an object behind kvjudge's back (a bit flip on disk, a stray upload without checksum)."""
    if isinstance(cold, LocalDirColdStore):
        (cold.root / key).write_bytes(data)
    else:
        assert isinstance(cold, S3ColdStore)
        cold._client.put_object(Bucket=cold.bucket, Key=cold._key(key), Body=data)


def remove(cold: ColdStore, key: str) -> None:
    if isinstance(cold, LocalDirColdStore):
        (cold.root / key).unlink()
    else:
        assert isinstance(cold, S3ColdStore)
        cold._client.delete_object(Bucket=cold.bucket, Key=cold._key(key))


def moved(store: Store, run_id: str) -> Manifest:
    """The manifest of ``run_id``'s latest move, as the log rebuilds it (where each body went)."""
    return logged_manifest(store, run_id, store.runs.run(run_id).tier["manifest_ref"])


def tier_the_old_way(store: Store, run_id: str, cold: ColdStore, *, crash_after: int | None = None) -> bytes:
    """Move ``run_id`` as kvjudge did before packs, written out here as that code wrote it: ``TierStarted`` naming
    a ``kvjudge-tier-manifest/1`` (no locations), one content-addressed blob per body, the manifest, ``Tiered``, the
    local delete. ``crash_after`` stops after that many blobs (its process killed mid-move). Returns the manifest."""
    state = store.runs.run(run_id)
    first_lsn, last_lsn = store.events.event_range(run_id)
    refs = sorted(ref for ref, loc in state.bodies.items() if loc.status == LOCAL)
    bodies = {ref: store.blobs.get(ref) or b"" for ref in refs}
    raw = canonical_json({
        "format": "kvjudge-tier-manifest/1", "run": run_id, "tenant": state.tenant,
        "events": {"first_lsn": first_lsn, "last_lsn": last_lsn}, "target": cold.url,
        "blobs": [{"ref": ref, "sha256": ref.removeprefix("sha256:"), "size": len(bodies[ref])} for ref in refs],
    }).encode("utf-8")
    with store.transaction("tier_start"):
        store.events.append(run_id, ev.TierStarted(run=run_id, target=cold.url, manifest_ref=ref_of(raw),
                                            endpoint=cold.endpoint_url))
    for index, ref in enumerate(refs):
        if index == crash_after:
            return raw
        cold.put_blob(ref, bodies[ref])
    cold.put_manifest(Manifest.from_bytes(raw).key, raw)
    with store.transaction("tiered"):
        store.events.append(run_id, ev.Tiered(run=run_id, target=cold.url, manifest_ref=ref_of(raw), refs=refs,
                                       endpoint=cold.endpoint_url))
    store.blobs.release(store.runs.tiered_bodies_here(run_id), label="tier_delete", scrub=False, durable=False)
    return raw


def remote_body(cold: ColdStore, entry: ManifestEntry) -> bytes:
    """The bytes the cold store holds where ``entry`` says its body is (no check against the ref)."""
    data = read_remote(cold, entry.key)
    return data if entry.pack is None else data[entry.offset:entry.offset + entry.size]


def tamper_body(cold: ColdStore, entry: ManifestEntry, body: bytes) -> None:
    """Replace the bytes of ``entry``'s body in its object behind kvjudge's back (the object's size changes with
    ``body``'s)."""
    data = read_remote(cold, entry.key)
    end = entry.offset + entry.size
    tamper(cold, entry.key, body if entry.pack is None else data[:entry.offset] + body + data[end:])


def read_remote(cold: ColdStore, key: str) -> bytes:
    if isinstance(cold, LocalDirColdStore):
        return (cold.root / key).read_bytes()
    assert isinstance(cold, S3ColdStore)
    return cold._client.get_object(Bucket=cold.bucket, Key=cold._key(key))["Body"].read()


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.s3)])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A cold target URL of each kind: an existing local directory, or a prefix two levels deep in a fresh SeaweedFS
    bucket (AWS_* set)."""
    if request.param == "local":
        return local_cold_url(tmp_path)
    bucket = request.getfixturevalue("s3_bucket")
    return f"s3://{bucket}/tiers/cold"


def cold_for(target_url: str) -> ColdStore:
    """The cold store behind ``target_url`` (S3: the endpoint from AWS_ENDPOINT_URL, as the CLI would)."""
    return open_cold_store(target_url)


__all__ = ["GRADED", "SeaweedServer", "big_output", "cold_for", "make_store", "moved", "read_remote", "remote_body",
           "remote_keys", "remove", "tamper", "tamper_body", "target", "texts", "tier_the_old_way", "tiered_refs",
           "tiering_run"]
