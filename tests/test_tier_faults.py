"""Kill a real `kvjudge tier` / `kvjudge rehydrate` process (SIGKILL via KVJUDGE_FAULTS) at every fault point,
then run it again: exactly one remote copy, no body lost at any moment, the move converges, verify passes. The kills
at each point (of a move to a directory, and of a rehydrate) run on both stores (``store_at``)."""

from __future__ import annotations

import json
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helpers import event_kinds, kvjudge, local_cold_url
from seaweed import s3_bucket, seaweed  # noqa: F401 (fixtures)
from tier_support import cold_for, make_store, moved, read_remote, remote_keys, texts, tier_the_old_way, tiered_refs

from kvjudge.retention import Store
from kvjudge.retention.tiering import ColdStores, fallback_reader, verify_checks
from kvjudge.retention.tiering.move import TIER_POINTS
from kvjudge.retention.tiering.rehydrate import REHYDRATE_POINTS
from kvjudge.retention.tiering.manifest import LOOSE_FORMAT
from kvjudge.retention.verify import verify

#: The S3 variant runs the points where the remote matters most (keeps the SeaweedFS part short).
S3_POINTS = ("tier.blob_response_lost", "tier.manifest_response_lost", "tier.after_tiered")


def assert_converged(path: Path | str, target: str, before: dict[str, str | None]) -> None:
    """One move in the log, its objects remotely — the packs its manifest names, or for a move logged before packs
    one blob per ref — and nothing else (no partial files), bodies gone here, verify clean."""
    cold = cold_for(target)
    with Store.open(path) as store:
        kinds = event_kinds(store, "run-a")
        assert kinds.count("TierStarted") == 1 and kinds.count("Tiered") == 1 and kinds[-1] == "Tiered"
        refs = tiered_refs(store, "run-a")
        assert refs == sorted(before)
        keys = remote_keys(cold)
        manifest = moved(store, "run-a")
        assert [k for k in keys if not k.startswith("manifests/")] == sorted(o.key for o in manifest.objects)
        assert len([k for k in keys if k.startswith("manifests/")]) == 1
        for remote in manifest.objects:  # each object is its bodies end to end, nothing torn
            assert read_remote(cold, remote.key) == b"".join((before[e.ref] or "").encode() for e in remote.entries)
        shared = set(refs) & set(store.runs.run("run-b").refs())
        assert [r for r in refs if store.blobs.has_body(r)] == sorted(shared)
        checks = verify_checks(store, ColdStores(), rehash=True)
        report = verify(store, extra_checks=checks)
        assert report.ok, report.violations
        assert report.notes == []  # no stray bodies: the manifest is rebuilt from the log, never stored locally
        store.blobs.fallback = fallback_reader(None, store)
        assert texts(store, "run-a") == before


def assert_nothing_lost(path: Path | str, before: dict[str, str | None]) -> None:
    """Right after a crash: every body is still readable — locally, or from the cold store the log names."""
    with Store.open(path) as store:
        store.blobs.fallback = fallback_reader(None, store)
        assert texts(store, "run-a") == before


def tier(path: Path | str, target: str, ceiling_args: list[str], *extra: str, **kwargs: Any) -> Any:
    """`kvjudge tier run-a` into ``target`` (a child process; ``faults=`` arms a fault point)."""
    return kvjudge("tier", "run-a", "--to", target, "--store", str(path), *ceiling_args, *extra, **kwargs)


def crash_a_move(tmp_path: Path, target: str, point: str, ceiling_args: list[str],
                 location: str | None = None) -> tuple[Path | str, dict[str, str | None]]:
    """Kill `kvjudge tier run-a` to ``target`` at ``point``: the store (at ``location``, default a file in
    ``tmp_path``), and run-a's texts before the move."""
    path = make_store(location or tmp_path / "store.sqlite")
    with Store.open(path) as store:
        before = texts(store, "run-a")
    crashed = tier(path, target, ceiling_args, faults=point)
    assert crashed.returncode == -signal.SIGKILL, (crashed.returncode, crashed.stderr)
    return path, before


def crash_then_rerun(tmp_path: Path, target: str, point: str, ceiling_args: list[str],
                     location: str | None = None) -> None:
    path, before = crash_a_move(tmp_path, target, point, ceiling_args, location)
    assert_nothing_lost(path, before)
    rerun = tier(path, target, ceiling_args, "--json")
    assert rerun.returncode == 0, rerun.stderr
    assert_converged(path, target, before)
    # And once more: nothing left to do.
    again = tier(path, target, ceiling_args, "--json")
    assert again.returncode == 0 and '"already_tiered"' in again.stdout
    assert_converged(path, target, before)


def crash_a_local_move(tmp_path: Path, point: str,
                       ceiling_args: list[str]) -> tuple[Path | str, str, dict[str, str | None]]:
    """:func:`crash_a_move` to a local cold directory: the store, the target, run-a's texts before the move."""
    target = local_cold_url(tmp_path)
    path, before = crash_a_move(tmp_path, target, point, ceiling_args)
    return path, target, before


@pytest.mark.parametrize("point", TIER_POINTS)
def test_kill_at_each_point_local(tmp_path: Path, point: str, ceiling_args: list[str],
                                  store_at: Callable[[str], str]) -> None:
    crash_then_rerun(tmp_path, local_cold_url(tmp_path), point, ceiling_args, store_at("store"))


@pytest.mark.s3
@pytest.mark.parametrize("point", S3_POINTS)
def test_kill_at_each_point_s3(tmp_path: Path, point: str, s3_bucket: str,  # noqa: F811
                               ceiling_args: list[str]) -> None:
    crash_then_rerun(tmp_path, f"s3://{s3_bucket}/t", point, ceiling_args)


def test_recovery_repairs_a_remote_that_lost_an_object(tmp_path: Path, ceiling_args: list[str]) -> None:
    """The manifest made it but a body was lost remotely before Tiered: recovery rewrites it, then commits."""
    path, target, before = crash_a_local_move(tmp_path, "tier.manifest_response_lost", ceiling_args)
    with Store.open(path) as store:
        lost = moved(store, "run-a").objects[0].key
    (tmp_path / "cold" / lost).unlink()
    rerun = tier(path, target, ceiling_args, "--json")
    assert rerun.returncode == 0, rerun.stderr
    assert json.loads(rerun.stdout)["runs"][0]["recovered"] == "upload"
    assert_converged(path, target, before)


def test_cold_store_down_during_recovery_deletes_nothing(tmp_path: Path, ceiling_args: list[str]) -> None:
    path, target, before = crash_a_local_move(tmp_path, "tier.after_blobs", ceiling_args)
    (tmp_path / "cold").rename(tmp_path / "unmounted")
    down = tier(path, target, ceiling_args)
    assert down.returncode != 0 and down.stderr.count("\n") == 1 and "does not exist" in down.stderr
    with Store.open(path) as store:
        assert store.runs.run("run-a").tier["status"] == "started"
        assert texts(store, "run-a") == before  # every body still local: no fallback attached
    (tmp_path / "unmounted").rename(tmp_path / "cold")
    assert tier(path, target, ceiling_args).returncode == 0
    assert_converged(path, target, before)


def test_verify_recovers_a_crashed_move(tmp_path: Path, ceiling_args: list[str]) -> None:
    """Recovery also runs at the start of verify: TierStarted without Tiered is finished there."""
    path, target, before = crash_a_local_move(tmp_path, "tier.after_blobs", ceiling_args)
    with Store.open(path) as store:
        assert store.runs.run("run-a").tier["status"] == "started"
    checked = kvjudge("verify", "--store", str(path), "--verify-remote", "--json")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert json.loads(checked.stdout)["ok"] is True
    assert_converged(path, target, before)


@pytest.mark.parametrize("point", ["tier.blob_response_lost", "tier.after_blobs", "tier.manifest_response_lost",
                                   "tiered.txn", "tier.after_tiered"])
def test_a_move_made_before_packs_recovers_in_its_own_layout(tmp_path: Path, point: str,
                                                             ceiling_args: list[str]) -> None:
    """A move logged before packs whose process died after some of its blobs: `tier` finishes it as its manifest
    says (one content-addressed blob per body, the format-1 manifest) — killed again at a fault point, then run
    once more — and it converges, read back, verified."""
    target = local_cold_url(tmp_path)
    path = make_store(tmp_path / "store.sqlite")
    with Store.open(path) as store:
        before = texts(store, "run-a")
        tier_the_old_way(store, "run-a", cold_for(target), crash_after=2)
    assert_nothing_lost(path, before)
    crashed = tier(path, target, ceiling_args, faults=point)
    assert crashed.returncode == -signal.SIGKILL, (crashed.returncode, crashed.stderr)
    assert_nothing_lost(path, before)
    rerun = tier(path, target, ceiling_args, "--json")
    assert rerun.returncode == 0, rerun.stderr
    assert_converged(path, target, before)
    with Store.open(path) as store:
        manifest = moved(store, "run-a")
        assert manifest.format == LOOSE_FORMAT
        assert not any(key.startswith("packs/") for key in remote_keys(cold_for(target)))


@pytest.mark.parametrize("point", REHYDRATE_POINTS)
def test_kill_rehydrate_then_rerun(tmp_path: Path, point: str, ceiling_args: list[str],
                                   store_at: Callable[[str], str]) -> None:
    target = local_cold_url(tmp_path)
    path = make_store(store_at("store"))
    with Store.open(path) as store:
        before = texts(store, "run-a")
    assert tier(path, target, ceiling_args).returncode == 0
    crashed = kvjudge("rehydrate", "run-a", "--store", str(path), faults=point)
    assert crashed.returncode == -signal.SIGKILL
    assert_nothing_lost(path, before)
    done = kvjudge("rehydrate", "run-a", "--store", str(path), "--json")
    assert done.returncode == 0, done.stderr
    with Store.open(path) as store:
        assert event_kinds(store, "run-a").count("Rehydrated") == 1
        assert tiered_refs(store, "run-a") == []
        assert texts(store, "run-a") == before  # no fallback attached: every body is local again
        checks = verify_checks(store, ColdStores())
        assert verify(store, extra_checks=checks).ok


@pytest.mark.parametrize("command", [["tier", "run-a"], ["verify"]])
def test_verify_remote_re_hashes_what_a_crashed_move_left_before_it_commits(tmp_path: Path, command: list[str],
                                                                            ceiling_args: list[str]) -> None:
    """A body flipped remotely (same size) after a crash: `--verify-remote` makes the recovery download and
    re-hash every body, so the bad copy is rewritten before Tiered and the local delete; a size check alone
    would have let the only good copy go."""
    path, target, before = crash_a_local_move(tmp_path, "tier.after_verify", ceiling_args)
    flipped = max(before, key=lambda ref: len(before[ref] or ""))
    with Store.open(path) as store:
        entry = moved(store, "run-a").entry(flipped)
    assert entry is not None
    remote = tmp_path / "cold" / entry.key
    body = remote.read_bytes()
    remote.write_bytes(body[:entry.offset] + bytes([body[entry.offset] ^ 1]) + body[entry.offset + 1:])
    extra = ["--to", target, *ceiling_args] if command[0] == "tier" else []
    rerun = kvjudge(*command, *extra, "--store", str(path), "--verify-remote", "--json")
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    if command[0] == "tier":
        result = json.loads(rerun.stdout)["runs"][0]
        assert (result["recovered"], result["status"]) == ("upload", "tiered") and result["uploaded"] >= 1, rerun.stdout
    else:
        assert json.loads(rerun.stdout)["ok"] is True
    assert remote.read_bytes() == body
    assert_converged(path, target, before)
