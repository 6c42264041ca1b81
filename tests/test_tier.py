"""Tiering against both real cold stores (a local directory, SeaweedFS over S3): the move, reading through,
rehydrating, idempotence, a store that is down, tampered remote bytes, and runs in the wrong state."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers import event_kinds, local_cold_url, sql, store_from_runs
from helpers import kvjudge as run_kvjudge
from seaweed import SeaweedServer, free_ports, s3_bucket, seaweed  # noqa: F401 (fixtures)
from tier_support import (
    GRADED,
    big_output,
    cold_for,
    make_store,
    moved,
    read_remote,
    remote_body,
    remote_keys,
    remove,
    tamper,
    tamper_body,
    target,  # noqa: F401 (fixture)
    texts,
    tier_the_old_way,
    tiered_refs,
    tiering_run,
)

from kvjudge.errors import ColdStoreError, IntegrityError, RunStateError, StoreError
from kvjudge.retention import Store
from kvjudge.retention.blobs import ref_of
from kvjudge.retention.blobs import short
from kvjudge.retention.cold import LocalDirColdStore
from kvjudge.retention.cold.keys import blob_key, pack_key
from kvjudge.retention.tiering import (
    ColdStores,
    Manifest,
    fallback_reader,
    rehydrate_run,
    tier_requested,
    tier_run,
    verify_checks,
)
from kvjudge.retention.tiering.move import local_body_bytes
from kvjudge.retention.tiering.manifest import LOOSE_FORMAT, MANIFEST_FORMAT, PACK_BYTES, ManifestEntry
from kvjudge.retention.verify import verify
from kvjudge.tokens import CharsPerToken


def verify_all(store: Store, *, rehash: bool = False) -> list[str]:
    checks = verify_checks(store, ColdStores(), rehash=rehash)
    return [v.message for v in verify(store, extra_checks=checks).violations]


def test_tier_read_through_rehydrate_and_idempotent(tmp_path: Path, target: str,
                                                    store_at: Callable[[str], str]) -> None:
    # From either store (a SQLite file, a PostgreSQL database) to either cold store (a directory, S3).
    path = make_store(store_at("store"))
    cold = cold_for(target)
    with Store.open(path) as store:
        before = texts(store, "run-a")
        local_refs = sorted(before)
        kinds_before = event_kinds(store, "run-a")

        result = tier_run(store, "run-a", cold)
        assert (result.status, result.refs, result.uploaded) == ("tiered", len(local_refs), len(local_refs))
        assert event_kinds(store, "run-a") == kinds_before + ["TierStarted", "Tiered"]
        assert tiered_refs(store, "run-a") == local_refs
        # Moved, not copied: run-a's own bodies are gone locally; those run-b still reads locally stay.
        shared = set(local_refs) & set(store.runs.run("run-b").refs())
        assert ref_of(b"shared task prompt") in shared
        gone = [ref for ref in local_refs if store.blobs.get(ref) is None]
        assert sorted(gone) == sorted(set(local_refs) - shared)
        assert all(store.blobs.get(ref) is not None for ref in shared)
        # The remote holds the move's packs, plus one manifest naming every body's pack and offset; each pack is
        # its bodies end to end, in the manifest's order.
        keys = remote_keys(cold)
        manifests = [k for k in keys if k.startswith("manifests/")]
        assert len(manifests) == 1
        manifest = Manifest.from_bytes(read_remote(cold, manifests[0]))
        assert manifest.refs == local_refs and manifest.run == "run-a"
        assert manifest.format == MANIFEST_FORMAT and manifest == moved(store, "run-a")
        packs = [k for k in keys if not k.startswith("manifests/")]
        assert packs == sorted({entry.pack for entry in manifest.entries})
        assert all(key.startswith("packs/run-a/") for key in packs)
        for remote in manifest.objects:
            assert read_remote(cold, remote.key) == b"".join(before[e.ref].encode() for e in remote.entries)
        assert store.runs.run("run-a").tier["manifest_ref"] == ref_of(read_remote(cold, manifests[0]))

        # Without the cold reader a tiered body is simply not here; with it, every text reads as before.
        assert store.blobs.text(gone[0]) is None
        store.blobs.fallback = fallback_reader(None, store)
        assert texts(store, "run-a") == before

        # Idempotent: a second tier is a no-op (no events, no uploads).
        again = tier_run(store, "run-a", cold)
        assert again.status == "already_tiered"
        assert event_kinds(store, "run-a") == kinds_before + ["TierStarted", "Tiered"]
        assert remote_keys(cold) == keys
        assert verify_all(store, rehash=True) == []

        # Rehydrate: bodies back as a new fact; the cold copies stay.
        back = rehydrate_run(store, "run-a", ColdStores())
        assert (back.status, back.refs) == ("rehydrated", len(local_refs))
        assert event_kinds(store, "run-a")[-1] == "Rehydrated"
        assert tiered_refs(store, "run-a") == []
        store.blobs.fallback = None
        assert texts(store, "run-a") == before
        assert remote_keys(cold) == keys
        assert verify_all(store) == []

        # Tier again after rehydrating: a second manifest (longer log) and packs of its own; the first move's stay.
        third = tier_run(store, "run-a", cold)
        assert third.status == "tiered"
        keys_after = remote_keys(cold)
        second = {entry.pack for entry in moved(store, "run-a").entries}
        assert second.isdisjoint(packs)
        assert [k for k in keys_after if not k.startswith("manifests/")] == sorted(second | set(packs))
        assert len([k for k in keys_after if k.startswith("manifests/")]) == 2
        assert verify_all(store) == []
        # The fold is still a pure function of the log.
        assert store.runs.refold("run-a").canonical_bytes() == store.runs.projected_bytes("run-a")


def test_a_move_made_before_packs_still_reads_verifies_and_rehydrates(tmp_path: Path, target: str) -> None:
    """A cold store tiered before packs (one content-addressed blob per body, a format-1 manifest) stays what it
    was: read through, verified and re-hashed (a flipped blob caught), left alone by `tier`, rehydrated; the run
    tiered again goes into packs."""
    path = make_store(tmp_path / "store.sqlite")
    cold = cold_for(target)
    with Store.open(path) as store:
        before = texts(store, "run-a")
        raw = tier_the_old_way(store, "run-a", cold)
        old = moved(store, "run-a")  # the log rebuilds the old manifest, byte for byte
        assert old.format == LOOSE_FORMAT and old.to_bytes() == raw and old.objects[0].key == blob_key(old.refs[0])
        keys = remote_keys(cold)
        assert [k for k in keys if not k.startswith("manifests/")] == sorted(blob_key(ref) for ref in before)
        assert verify_all(store, rehash=True) == []
        assert all(store.blobs.get(ref) is None for ref in before if ref not in store.runs.run("run-b").refs())
        store.blobs.fallback = fallback_reader(None, store)
        assert texts(store, "run-a") == before

        big = max(before, key=lambda ref: len(before[ref] or ""))
        original = read_remote(cold, blob_key(big))
        tamper(cold, blob_key(big), original[:-1] + bytes([original[-1] ^ 1]))
        assert any(f"{short(big)} in {blob_key(big)} does not re-hash" in m for m in verify_all(store, rehash=True))
        with pytest.raises(IntegrityError, match="does not hash to"):
            store.blobs.text(big)
        tamper(cold, blob_key(big), original)

        assert tier_run(store, "run-a", cold).status == "already_tiered" and remote_keys(cold) == keys
        assert rehydrate_run(store, "run-a", ColdStores()).status == "rehydrated"
        store.blobs.fallback = None
        assert texts(store, "run-a") == before and tiered_refs(store, "run-a") == []
        assert tier_run(store, "run-a", cold).status == "tiered"
        new = moved(store, "run-a")
        assert new.format == MANIFEST_FORMAT and all(k in remote_keys(cold) for k in (o.key for o in new.objects))
        assert verify_all(store, rehash=True) == []
        store.blobs.fallback = fallback_reader(None, store)
        assert texts(store, "run-a") == before


def test_packs_are_cut_by_size_and_the_manifest_says_where_each_body_is() -> None:
    """Format 2 cuts a move's bodies, in ref order, into packs of up to PACK_BYTES (a larger body alone); each body's
    pack and offset are in the manifest, which reads back as written; format 1 names no location."""
    mib = 1024 * 1024
    sizes = [5 * mib, 3 * mib, 1, 20 * mib, 0, 2 * mib]
    loose = Manifest(run="r", tenant="t", first_lsn=1, last_lsn=9, target="file:///c", format=LOOSE_FORMAT,
                     entries=tuple(ManifestEntry(f"sha256:{index:064x}", f"{index:064x}", size)
                                   for index, size in enumerate(sizes)))
    packed = loose.in_format(MANIFEST_FORMAT)
    assert [(e.pack, e.offset) for e in packed.entries] == [
        (pack_key("r", 9, 0), 0), (pack_key("r", 9, 0), 5 * mib), (pack_key("r", 9, 1), 0),
        (pack_key("r", 9, 2), 0), (pack_key("r", 9, 3), 0), (pack_key("r", 9, 3), 0)]
    assert PACK_BYTES == 8 * mib and [o.size for o in packed.objects] == [8 * mib, 1, 20 * mib, 2 * mib]
    assert Manifest.from_bytes(packed.to_bytes()) == packed
    assert Manifest.from_bytes(loose.to_bytes()) == loose and b'"pack"' not in loose.to_bytes()
    assert [o.key for o in loose.objects] == [blob_key(e.ref) for e in loose.entries]
    with pytest.raises(IntegrityError, match="not readable"):
        Manifest.from_bytes(packed.to_bytes().replace(b"manifest/2", b"manifest/9"))


def test_run_in_wrong_state_is_refused(tmp_path: Path, target: str) -> None:
    path = make_store(tmp_path / "store.sqlite")
    cold = cold_for(target)
    with Store.open(path) as store:
        kinds = event_kinds(store, "run-live")
        with pytest.raises(RunStateError, match="run-live is running; only archived, graded, ungraded"):
            tier_run(store, "run-live", cold)
        assert event_kinds(store, "run-live") == kinds
        assert all(store.blobs.get(ref) is not None for ref in store.runs.run("run-live").refs())
    assert remote_keys(cold) == []


def test_cold_store_down_deletes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = make_store(tmp_path / "store.sqlite")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "y")
    (port,) = free_ports(1)
    for url, endpoint, message in (
            (f"file://{tmp_path / 'unmounted'}", None, "does not exist; create it"),
            ("s3://bucket/p", f"http://127.0.0.1:{port}", "cannot reach the cold store")):
        stores = ColdStores(endpoint)
        with Store.open(path) as store:
            kinds = event_kinds(store, "run-a")
            with pytest.raises(ColdStoreError, match=message):
                tier_run(store, "run-a", stores.get(url), stores=stores)
            assert event_kinds(store, "run-a") == kinds  # not even TierStarted
            assert all(store.blobs.get(ref) is not None for ref in store.runs.run("run-a").refs())


def test_reading_a_tiered_run_while_the_cold_store_is_down(tmp_path: Path) -> None:
    path = make_store(tmp_path / "store.sqlite")
    target = local_cold_url(tmp_path)
    with Store.open(path) as store:
        tier_run(store, "run-a", cold_for(target))
    (tmp_path / "cold").rename(tmp_path / "unmounted")
    shown = subprocess.run([sys.executable, "-m", "kvjudge", "show", "run-a", "--store", str(path)],
                           capture_output=True, text=True, timeout=120)
    assert shown.returncode != 0
    assert shown.stderr.startswith("kvjudge: error: cold store directory") and shown.stderr.count("\n") == 1
    assert "does not exist" in shown.stderr
    (tmp_path / "unmounted").rename(tmp_path / "cold")
    with Store.open(path) as store:
        store.blobs.fallback = fallback_reader(None, store)
        assert all(text is not None for text in texts(store, "run-a").values())


def test_tampered_remote_bytes_are_caught(tmp_path: Path, target: str) -> None:
    path = make_store(tmp_path / "store.sqlite")
    cold = cold_for(target)
    with Store.open(path) as store:
        tier_run(store, "run-a", cold)
        entry = max(moved(store, "run-a").entries, key=lambda e: e.size)
        big = entry.ref
        original = remote_body(cold, entry)
        pack = read_remote(cold, entry.key)
        assert len(pack) > len(original)  # other bodies share its pack: it is read by its range
        assert verify_all(store, rehash=True) == []

        # Same size, one byte flipped: only a re-hash (--verify-remote) can see it.
        tamper_body(cold, entry, original[:-1] + bytes([original[-1] ^ 1]))
        assert any(f"{short(big)} in {entry.key} does not re-hash" in m for m in verify_all(store, rehash=True))
        store.blobs.fallback = fallback_reader(None, store)
        with pytest.raises(IntegrityError, match="does not hash to"):
            store.blobs.text(big)

        # Truncated: a plain verify (sizes) sees it too.
        tamper(cold, entry.key, pack[:100])
        assert any(f"{entry.key} has 100 bytes, not {len(pack)}" in m for m in verify_all(store))
        with pytest.raises(IntegrityError, match="does not hash to"):
            store.blobs.text(big)

        # Gone: named as missing.
        remove(cold, entry.key)
        assert any(f"{entry.key} is missing" in m for m in verify_all(store))

        # Put back as it was: clean again.
        tamper(cold, entry.key, pack)
        assert verify_all(store, rehash=True) == []
        assert store.blobs.text(big) == original.decode()


def test_tier_cli_json_and_usage(tmp_path: Path, target: str, ceiling_args: list[str]) -> None:
    path = make_store(tmp_path / "store.sqlite")

    def kvjudge(*args: str) -> subprocess.CompletedProcess[str]:
        return run_kvjudge(*args, "--store", str(path))

    done = kvjudge("tier", "--all", "--to", target, *ceiling_args, "--json")
    assert done.returncode == 0, done.stderr
    payload = json.loads(done.stdout)
    assert [r["run"] for r in payload["runs"]] == ["run-a", "run-b"]
    assert {r["status"] for r in payload["runs"]} == {"tiered"}
    assert payload["skipped"] == {"run-live": "running (not terminal)"}
    assert payload["left_behind"] == [] and payload["ceilings"] == {"acme": 80_000}
    assert all(r["tokens"] <= r["ceiling"] == 80_000 and r["unreduced"] is None for r in payload["runs"])
    # `kvjudge show` reads a tiered run through the cold store, transparently.
    shown = kvjudge("show", "run-a", "--json")
    assert shown.returncode == 0, shown.stderr
    output = json.loads(shown.stdout)["branches"][0]["transitions"][2]["tool_output"]["output"]
    assert output["status"] == "tiered"
    assert output["text"] == big_output("run-a")
    again = json.loads(kvjudge("tier", "run-a", "--to", target, *ceiling_args, "--json").stdout)
    assert again["runs"][0]["status"] == "already_tiered"
    wrong = kvjudge("tier", "run-live", "--to", target, *ceiling_args)
    assert wrong.returncode != 0 and wrong.stderr.count("\n") == 1 and "is running" in wrong.stderr
    usage = kvjudge("tier", "--to", target)
    assert usage.returncode == 2 and "name one RUN or pass --all" in usage.stderr
    back = json.loads(kvjudge("rehydrate", "run-b", "--json").stdout)
    assert back["status"] == "rehydrated" and back["refs"] > 0
    with Store.open(path) as store:
        assert tiered_refs(store, "run-b") == []
        assert len(tiered_refs(store, "run-a")) > 0


def test_hostile_run_ids_tier_inside_the_cold_store(tmp_path: Path) -> None:
    """Run ids are untrusted: ".." or a 300-character id must not put a manifest outside the store, nor fail."""
    hostile = ["..", ".", "x" * 300, "a/../../b"]
    path = make_store(tmp_path / "store.sqlite", {run_id: GRADED for run_id in hostile})
    cold_url = local_cold_url(tmp_path)
    done = run_kvjudge("tier", "--all", "--to", cold_url, "--unreduced", "--store", str(path), "--json")
    assert done.returncode == 0, done.stderr
    assert sorted(r["run"] for r in json.loads(done.stdout)["runs"]) == sorted(hostile)
    assert sorted(p.name for p in (tmp_path / "cold").iterdir()) == ["manifests", "packs"]
    assert sorted(p.parent.parent.name for p in (tmp_path / "cold" / "manifests").glob("*/*.json")) == \
        ["manifests"] * len(hostile)
    assert len({p.parent for p in (tmp_path / "cold" / "packs").glob("*/*.pack")}) == len(hostile)
    assert [p for p in (tmp_path / "cold").rglob("*") if p.is_file() and p.suffix not in (".json", ".pack")] == []
    checked = run_kvjudge("verify", "--verify-remote", "--store", str(path), "--json")
    assert checked.returncode == 0, checked.stderr
    assert json.loads(checked.stdout)["ok"] is True
    for run_id in hostile:
        shown = run_kvjudge("show", run_id, "--full", "--store", str(path), "--json")
        assert shown.returncode == 0, shown.stderr
        output = json.loads(shown.stdout)["branches"][0]["transitions"][2]["tool_output"]["output"]
        assert output["status"] == "tiered" and output["text"].startswith(f"{run_id} line\n")


def test_default_target_comes_from_config(tmp_path: Path, capabilities: dict[int, Path]) -> None:
    path = make_store(tmp_path / "store.sqlite", {"r1": GRADED})
    cold_dir = tmp_path / "configured-cold"
    cold_dir.mkdir()
    (tmp_path / "kvjudge.toml").write_text(f'[retention]\ncold = "file://{cold_dir}"\nstore = "{path}"\n'
                                           'counter = "chars"\n')
    done = run_kvjudge("tier", "r1", "--json", "--config", str(tmp_path / "kvjudge.toml"),
                       "--capabilities", str(capabilities[160_000]))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["target"] == f"file://{cold_dir}"
    assert (cold_dir / "manifests" / "r1").is_dir()


def test_a_reduced_run_tiers_with_its_summaries(tmp_path: Path) -> None:
    """Reduced, dropped and tiered bodies side by side: the log explains each, and the reduced view reads through."""
    from kvjudge.retention.reduce import view_refs
    from kvjudge.retention.reduce_apply import reduce_run
    from kvjudge.tokens import CharsPerToken

    path = make_store(tmp_path / "store.sqlite")
    cold = cold_for(local_cold_url(tmp_path))
    with Store.open(path) as store:
        reduce_run(store, "run-a", 500, CharsPerToken())
        reduced = store.runs.run("run-a")
        assert {loc.status for loc in reduced.bodies.values()} >= {"reduced", "local"}
        view = {ref: store.blobs.text(ref) for ref in view_refs(reduced)}
        assert all(text is not None for text in view.values())
        result = tier_run(store, "run-a", cold)
        state = store.runs.run("run-a")
        # Only what was local moved; reduced/dropped refs keep their explanation (they have no body to move).
        assert result.refs == sum(1 for loc in reduced.bodies.values() if loc.status == "local")
        assert {ref for ref, loc in state.bodies.items() if loc.status == "tiered"} == {
            ref for ref, loc in reduced.bodies.items() if loc.status == "local"}
        assert all(state.bodies[ref].status == loc.status
                   for ref, loc in reduced.bodies.items() if loc.status != "local")
        store.blobs.fallback = fallback_reader(None, store)
        assert {ref: store.blobs.text(ref) for ref in view_refs(state)} == view
        assert verify_all(store, rehash=True) == []


def test_a_corrupt_local_body_is_never_uploaded(tmp_path: Path) -> None:
    path = make_store(tmp_path / "store.sqlite")
    cold = cold_for(local_cold_url(tmp_path))
    with Store.open(path) as store:
        victim = max(store.runs.run("run-a").refs(), key=lambda r: len(store.blobs.get(r) or b""))
        size = len(store.blobs.get(victim) or b"")
        # Rewrite a body under its ref behind the store's back (the blobs table has no guard against it).
        sql(store).execute("UPDATE blobs SET body = ? WHERE ref = ?", (b"x" * size, victim))
        with pytest.raises(IntegrityError, match="does not hash to its ref; nothing was tiered"):
            tier_run(store, "run-a", cold)
        assert "Tiered" not in event_kinds(store, "run-a")
        assert remote_keys(cold) == []  # not its pack, nor any other object
        assert all(store.blobs.get(ref) is not None for ref in store.runs.run("run-a").refs())  # nothing deleted


def test_rehydrate_survives_a_concurrent_recovery(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A `tier` recovery running between rehydrate's puts and its event releases the bodies; the event still
    commits only with every body here."""
    import kvjudge.retention.tiering.rehydrate as rehydrate_module
    from kvjudge.retention.tiering import recover

    path = make_store(tmp_path / "store.sqlite")
    cold = cold_for(local_cold_url(tmp_path))
    with Store.open(path) as store:
        before = texts(store, "run-a")
        tier_run(store, "run-a", cold)
        real_fault_point = rehydrate_module.fault_point

        def interleave(name: str) -> None:
            if name == "rehydrate.after_bodies":
                with Store.open(path) as other:  # another process's view of the same store
                    assert recover(other, ColdStores())[0].recovered == "delete"
            real_fault_point(name)

        monkeypatch.setattr(rehydrate_module, "fault_point", interleave)
        assert rehydrate_run(store, "run-a", ColdStores()).status == "rehydrated"
        assert tiered_refs(store, "run-a") == []
        assert texts(store, "run-a") == before  # no fallback: every body is local
        assert verify_all(store) == []


@pytest.mark.s3
def test_endpoint_url_flag_reaches_s3_without_the_environment(tmp_path: Path, s3_bucket: str,  # noqa: F811
                                                              seaweed: SeaweedServer,  # noqa: F811
                                                              monkeypatch: pytest.MonkeyPatch,
                                                              ceiling_args: list[str]) -> None:
    monkeypatch.delenv("AWS_ENDPOINT_URL")  # only the flag says where the S3 server is
    path = make_store(tmp_path / "store.sqlite")
    with Store.open(path) as store:
        before = texts(store, "run-a")
    flags = ["--store", str(path), "--endpoint-url", seaweed.endpoint, "--json"]
    moved = run_kvjudge("tier", "run-a", "--to", f"s3://{s3_bucket}/t", *ceiling_args, *flags)
    assert moved.returncode == 0, moved.stderr
    assert json.loads(moved.stdout)["runs"][0]["status"] == "tiered"
    keys = [item["Key"] for item in seaweed.client().list_objects_v2(Bucket=s3_bucket).get("Contents", [])]
    assert any(key.startswith("t/manifests/run-a/") for key in keys)
    assert any(key.startswith("t/packs/run-a/") for key in keys)
    assert not any(key.startswith("t/objects/") for key in keys)
    checked = run_kvjudge("verify", "run-a", "--verify-remote", *flags)
    assert checked.returncode == 0 and json.loads(checked.stdout)["ok"] is True, checked.stdout + checked.stderr
    back = run_kvjudge("rehydrate", "run-a", *flags)
    assert back.returncode == 0 and json.loads(back.stdout)["status"] == "rehydrated", back.stderr
    with Store.open(path) as store:
        assert tiered_refs(store, "run-a") == [] and texts(store, "run-a") == before


def test_bodies_larger_than_a_chunk_arrive_whole(tmp_path: Path, target: str, store_at: Callable[[str], str]) -> None:
    """A body is streamed from the store in chunks (hashed and written chunk by chunk): a body several chunks
    long, and one ending exactly on a chunk's end, arrive byte-identical (read from either store)."""
    from kvjudge.retention.tiering.transfer import CHUNK_BYTES

    runs = [tiering_run("run-a", GRADED, big=3 * CHUNK_BYTES + 17), tiering_run("run-b", GRADED, big=2 * CHUNK_BYTES)]
    cold = cold_for(target)
    with store_from_runs(store_at("store"), runs) as store:
        before = {run: texts(store, run) for run in ("run-a", "run-b")}
        sizes = {run: max(len(text or "") for text in before[run].values()) for run in before}
        assert sizes == {"run-a": 3 * CHUNK_BYTES + 17, "run-b": 2 * CHUNK_BYTES}
        for run in before:
            assert tier_run(store, run, cold).status == "tiered"
            assert all(remote_body(cold, moved(store, run).entry(ref)) == text.encode()
                       for ref, text in before[run].items() if text is not None)
        store.blobs.fallback = fallback_reader(None, store)
        assert {run: texts(store, run) for run in before} == before
        assert verify_all(store, rehash=True) == []


def test_tier_requested_is_the_whole_command(tmp_path: Path) -> None:
    """`kvjudge tier` as one call: runs above their tenant's ceiling are left behind and nothing moves; within it
    they move, with progress against the bytes they upload; the counter is not asked for when nothing is left to
    move; an unknown run is a StoreError before anything moves."""
    path = make_store(tmp_path / "store.sqlite")
    (tmp_path / "cold").mkdir()
    cold = LocalDirColdStore(tmp_path / "cold")
    stores = ColdStores()

    def no_counter() -> CharsPerToken:
        raise AssertionError("nothing to move: no counter needed")

    with Store.open(path) as store:
        total = local_body_bytes(store, "run-a") + local_body_bytes(store, "run-b")
        held = tier_requested(store, cold, stores, run_id=None, ceiling=lambda tenant: 1,
                              counter=lambda: CharsPerToken(4))
        assert [(r.run, r.status) for r in held.results] == [("run-a", "above_ceiling"), ("run-b", "above_ceiling")]
        assert held.to_dict()["left_behind"] == ["run-a", "run-b"] and held.ceilings == {"acme": 1}
        assert held.skipped == {"run-live": "running (not terminal)"} and remote_keys(cold) == []

        landed: list[tuple[int, int]] = []
        moved = tier_requested(store, cold, stores, run_id=None, ceiling=lambda tenant: 80_000,
                               counter=lambda: CharsPerToken(4), progress=lambda n, of: landed.append((n, of)))
        assert [(r.run, r.status) for r in moved.results] == [("run-a", "tiered"), ("run-b", "tiered")]
        assert moved.left_behind == [] and moved.to_dict()["target"] == cold.url == moved.target
        assert landed[0] == (0, total) and sum(n for n, _ in landed) == total and {of for _, of in landed} == {total}

        again = tier_requested(store, cold, stores, run_id=None, ceiling=lambda tenant: 80_000, counter=no_counter)
        assert again.results == [] and set(again.skipped) == {"run-a", "run-b", "run-live"}
        with pytest.raises(StoreError):
            tier_requested(store, cold, stores, run_id="no-such-run", ceiling=lambda tenant: 80_000,
                           counter=no_counter)
