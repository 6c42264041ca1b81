"""Cold stores, both real: a local directory and SeaweedFS over S3 (the same tests run against each)."""

from __future__ import annotations

import base64
import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import free_ports
from seaweed import SeaweedServer, s3_bucket, seaweed  # noqa: F401 (fixtures)
from tier_support import cold_for, tamper, target  # noqa: F401 (fixture)

from kvjudge.errors import ColdStoreError, IntegrityError, UsageError
from kvjudge.retention.cold import ColdStore, LocalDirColdStore, S3ColdStore, open_cold_store
from kvjudge.retention.cold.keys import blob_key, manifest_key, pack_key


def ref_of(body: bytes) -> str:
    return "sha256:" + hashlib.sha256(body).hexdigest()


@pytest.fixture
def cold(target: str) -> ColdStore:
    """Each kind of cold store: a local directory, and a prefix two levels deep in a SeaweedFS bucket."""
    return cold_for(target)


def test_blob_round_trip_and_idempotent_put(cold: ColdStore) -> None:
    body = "héllo cold world\n".encode() * 100
    ref = ref_of(body)
    cold.check()
    assert cold.stat_blob(ref) is None
    assert cold.get_blob(ref) is None
    cold.put_blob(ref, body)
    cold.put_blob(ref, body)  # a retry writes the same bytes under the same key
    info = cold.stat_blob(ref)
    assert info is not None and info.size == len(body) and info.key == blob_key(ref)
    if isinstance(cold, S3ColdStore):
        assert info.sha256 == ref.removeprefix("sha256:")  # the server kept the checksum it verified
    assert cold.get_blob(ref) == body


def test_tampered_blob_is_never_returned(cold: ColdStore) -> None:
    body = b"original body"
    ref = ref_of(body)
    cold.put_blob(ref, body)
    tamper(cold, blob_key(ref), b"original bodY")
    with pytest.raises(IntegrityError, match="does not hash to"):
        cold.get_blob(ref)


def test_pack_round_trip_and_ranged_reads(cold: ColdStore) -> None:
    """A pack is its bodies end to end; each is read back by its offset and length and checked against its ref."""
    bodies = [b"first body", b"", bytes(range(256)) * 1000, "héllo\n".encode()]
    key = pack_key("run/1", 7, 0)
    assert key == "packs/run%2F1/000000000007-0000.pack"
    assert cold.stat_object(key) is None and cold.get_range(ref_of(bodies[0]), key, 0, len(bodies[0])) is None
    # One body in chunks (streamed from the store), the others whole; a retry writes the same bytes.
    parts = [(ref_of(body), [body[start:start + 999] for start in range(0, len(body), 999)] if len(body) > 999
              else body) for body in bodies]
    cold.put_pack(key, parts)
    cold.put_pack(key, parts)
    info = cold.stat_object(key)
    assert info is not None and info.size == sum(map(len, bodies)) and info.key == key
    offset = 0
    for body in bodies:
        assert cold.get_range(ref_of(body), key, offset, len(body)) == body
        offset += len(body)
    with pytest.raises(IntegrityError, match="does not hash to"):  # the range of another body
        cold.get_range(ref_of(bodies[0]), key, 1, len(bodies[0]))
    with pytest.raises(IntegrityError, match="does not hash to"):  # past the end: a pack cut short
        cold.get_range(ref_of(bodies[3]), key, offset, len(bodies[3]))


def test_a_pack_with_a_body_that_is_not_its_ref_is_never_stored(cold: ColdStore) -> None:
    key = pack_key("run-1", 8, 0)
    good, bad = b"a good body", b"a bad body"
    with pytest.raises(IntegrityError, match="do not hash to it; nothing was stored"):
        cold.put_pack(key, [(ref_of(good), good), (ref_of(b"something else"), bad), (ref_of(good), good)])
    assert cold.stat_object(key) is None
    if isinstance(cold, LocalDirColdStore):
        assert list(cold.root.rglob(".tmp-*")) == []  # the refused write left nothing behind


def test_a_moves_packs_share_one_directory_sync_before_its_manifest(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A pack's writer syncs no directory itself: the packs of a move share ``packs/<run>/``, synced once by the
    flush every manifest write runs first (with the parents of the directories created), then the manifest's."""
    synced: list[Path] = []
    real_fsync_dir = LocalDirColdStore._fsync_dir
    monkeypatch.setattr(LocalDirColdStore, "_fsync_dir",
                        staticmethod(lambda directory: (synced.append(directory), real_fsync_dir(directory))))
    store = LocalDirColdStore(tmp_path)
    for index in range(3):
        body = f"body {index}".encode()
        store.put_pack(pack_key("r", 1, index), [(ref_of(body), body)])
    assert synced == []
    store.put_manifest(manifest_key("r", 1), b"{}")
    pack_dir, manifest_dir = tmp_path / "packs" / "r", tmp_path / "manifests" / "r"
    assert sorted(synced[:-1]) == sorted([pack_dir, tmp_path / "packs", tmp_path, tmp_path / "manifests"])
    assert synced[-1] == manifest_dir


def test_manifest_is_conditional(cold: ColdStore) -> None:
    key = manifest_key("run/1 ü", 42)
    assert key == "manifests/run%2F1%20%C3%BC/000000000042.json"
    assert cold.get_manifest(key) is None
    first = cold.put_manifest(key, b'{"run": "run/1"}')
    assert first.created
    again = cold.put_manifest(key, b'{"run": "run/1"}')
    assert not again.created  # identical bytes already there: fine, nothing rewritten
    with pytest.raises(ColdStoreError, match="already exists with different content"):
        cold.put_manifest(key, b'{"run": "other"}')
    assert cold.get_manifest(key) == b'{"run": "run/1"}'


def test_every_run_id_is_one_bounded_path_segment() -> None:
    # "." and ".." would name the manifests directory itself or the store root; a 300-character id would
    # exceed a file system's 255-byte name limit.
    assert manifest_key(".", 7) == "manifests/%2E/000000000007.json"
    assert manifest_key("..", 7) == "manifests/%2E%2E/000000000007.json"
    assert manifest_key("run-1.2", 7) == "manifests/run-1.2/000000000007.json"  # ordinary ids keep their key
    assert pack_key("..", 7, 3) == "packs/%2E%2E/000000000007-0003.pack"
    long_a, long_b = "x" * 300, "x" * 299 + "y"
    segments = {manifest_key(run, 7).split("/")[1] for run in (long_a, long_b)}
    assert len(segments) == 2 and all(len(segment) <= 160 and "/" not in segment for segment in segments)
    assert manifest_key("ü" * 200, 7) != manifest_key("ü" * 201, 7)


@pytest.mark.s3
def test_s3_upload_with_wrong_checksum_is_refused(s3_bucket: str, seaweed: SeaweedServer) -> None:
    """Behind put_blob's own check, the server's: it verifies the bytes against the SHA-256 sent with them."""
    from botocore.exceptions import ClientError

    store = open_cold_store(f"s3://{s3_bucket}", endpoint_url=seaweed.endpoint)
    assert isinstance(store, S3ColdStore)
    ref = ref_of(b"one body")
    checksum = base64.b64encode(bytes.fromhex(ref.removeprefix("sha256:"))).decode()
    with pytest.raises(ClientError):
        store._client.put_object(Bucket=s3_bucket, Key=blob_key(ref), Body=b"another body", ChecksumSHA256=checksum)
    assert store.stat_blob(ref) is None


def test_bytes_that_are_not_their_ref_are_never_stored(cold: ColdStore) -> None:
    ref = ref_of(b"one body")
    for body in (b"another body", [b"one ", b"bodY"], [b"one body", b"!"]):
        with pytest.raises(IntegrityError, match="do not hash to it; nothing was stored"):
            cold.put_blob(ref, body)
    assert cold.stat_blob(ref) is None
    if isinstance(cold, LocalDirColdStore):
        assert list(cold.root.rglob(".tmp-*")) == []  # the refused writes left nothing behind


def test_a_body_put_in_chunks_is_the_body(cold: ColdStore) -> None:
    body = bytes(range(256)) * 1000
    ref = ref_of(body)
    cold.put_blob(ref, (body[start:start + 999] for start in range(0, len(body), 999)))
    info = cold.stat_blob(ref)
    assert info is not None and info.size == len(body)
    assert cold.get_blob(ref) == body
    empty = ref_of(b"")
    cold.put_blob(empty, [])  # no chunk at all: the empty body
    assert cold.get_blob(empty) == b""


def test_local_layout_is_content_addressed_and_leaves_no_temp_files(tmp_path: Path) -> None:
    store = LocalDirColdStore(tmp_path)
    body = b"x" * 4096
    ref = ref_of(body)
    store.put_blob(ref, body)
    hexdigest = ref.removeprefix("sha256:")
    assert (tmp_path / "objects" / hexdigest[:2] / hexdigest[2:4] / hexdigest).read_bytes() == body
    store.put_manifest("manifests/r/000000000001.json", b"{}")
    names = [p.name for p in tmp_path.rglob("*")]
    assert not [n for n in names if n.startswith(".tmp-")]


def test_local_missing_directory_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ColdStoreError, match="does not exist; create it"):
        open_cold_store(str(tmp_path / "unmounted")).check()
    created = open_cold_store(str(tmp_path / "default-cold"), create=True)
    created.check()
    assert (tmp_path / "default-cold").is_dir()


def test_urls_parse_and_bad_ones_are_usage_errors(tmp_path: Path) -> None:
    local = open_cold_store(f"file://{tmp_path}")
    assert isinstance(local, LocalDirColdStore) and local.root == tmp_path.resolve()
    assert local.url == f"file://{tmp_path.resolve()}"
    s3 = open_cold_store("s3://bucket/a/b/", endpoint_url="http://127.0.0.1:1")
    assert isinstance(s3, S3ColdStore) and (s3.bucket, s3.prefix, s3.url) == ("bucket", "a/b", "s3://bucket/a/b")
    for bad in ("ftp://x/y", "file://remotehost/x", "s3:///nobucket"):
        with pytest.raises(UsageError):
            open_cold_store(bad)
    with pytest.raises(UsageError, match="not a blob ref"):
        blob_key("md5:abc")


def test_s3_server_down_is_one_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "y")
    (port,) = free_ports(1)  # nothing listens there
    store = open_cold_store("s3://bucket/p", endpoint_url=f"http://127.0.0.1:{port}")
    with pytest.raises(ColdStoreError, match="cannot reach the cold store") as caught:
        store.check()
    assert "\n" not in str(caught.value)
    with pytest.raises(ColdStoreError, match="cannot reach the cold store"):
        store.put_blob(ref_of(b"a"), b"a")


@pytest.mark.s3
def test_s3_missing_bucket_is_named(seaweed: SeaweedServer, monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in seaweed.env().items():
        monkeypatch.setenv(key, value)
    store = open_cold_store("s3://no-such-bucket-kvj/p", endpoint_url=seaweed.endpoint)
    with pytest.raises(ColdStoreError, match="bucket 'no-such-bucket-kvj' does not exist"):
        store.check()


def test_local_put_failure_is_cold_store_error(tmp_path: Path) -> None:
    # A file where the objects directory belongs: every write fails, as on a broken mount (works as root too).
    (tmp_path / "objects").write_bytes(b"not a directory")
    store = LocalDirColdStore(tmp_path)
    with pytest.raises(ColdStoreError, match="cannot create"):
        store.put_blob(ref_of(b"z"), b"z")


def test_local_discard_partial_removes_only_dead_writers_temps(tmp_path: Path) -> None:
    store = LocalDirColdStore(tmp_path)
    body = b"partial"
    ref = ref_of(body)
    store.put_blob(ref, body)
    directory = (tmp_path / blob_key(ref)).parent
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # its pid is no longer alive
    host = store._host
    dead_temp = directory / f".tmp-x-{host}-{dead.pid}-abc"
    live_temp = directory / f".tmp-y-{host}-{os.getpid()}-abc"
    other_host = directory / f".tmp-z-elsewhere-{dead.pid}-abc"
    for temp in (dead_temp, live_temp, other_host):
        temp.write_bytes(b"half")
    assert store.discard_partial([blob_key(ref)]) == 1
    assert not dead_temp.exists() and live_temp.exists() and other_host.exists()
    assert store.get_blob(ref) == body


def _body_in_the_directory_of(ref: str) -> bytes:
    """A body whose blob lands in the same directory as ``ref``'s (same first four hex digits)."""
    return next(body for n in range(10**6) if ref_of(body := f"neighbour {n}".encode())[:11] == ref[:11])


def test_a_manifest_is_durable_only_after_every_blob_it_names(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A blob's writer syncs the directory its rename changed; the parents of the directories it created are
    synced by the next flush, which every manifest write runs first, once each however many blobs created entries
    there. What the store cannot vouch for — a blob found by stat_blob, a directory found already there (another
    writer, killed before its flush, may have left them unsynced) — is synced then too: only directories the
    writes changed, never the whole file system, and nothing a flush synced already."""
    synced: list[Path] = []
    real_fsync_dir = LocalDirColdStore._fsync_dir
    monkeypatch.setattr(LocalDirColdStore, "_fsync_dir",
                        staticmethod(lambda directory: (synced.append(directory), real_fsync_dir(directory))))
    found = b"written by a writer that was killed before its flush"
    neighbour = _body_in_the_directory_of(ref_of(found))
    elsewhere = b"written by this store, in a directory of its own"

    def leaf(body: bytes) -> Path:
        return (tmp_path / blob_key(ref_of(body))).parent

    assert leaf(neighbour) == leaf(found) and leaf(elsewhere) != leaf(found)
    LocalDirColdStore(tmp_path).put_blob(ref_of(found), found)  # a writer killed before its flush
    assert synced == [leaf(found)]  # the rename's directory only: objects/ab/cd's entries wait for a flush

    synced.clear()
    store = LocalDirColdStore(tmp_path)  # another process: it cannot know whether that writer flushed
    assert store.stat_blob(ref_of(found)) is not None and synced == []
    store.put_blob(ref_of(neighbour), neighbour)  # into a directory found already there
    store.put_blob(ref_of(elsewhere), elsewhere)  # into a new directory
    assert synced == [leaf(found), leaf(elsewhere)]
    synced.clear()
    store.put_manifest("manifests/r/000000000001.json", b"{}")
    manifest_dir = tmp_path / "manifests" / "r"
    # Before the manifest, each once: found's directory (found by stat_blob), the parents of every directory
    # found on the way (objects/ab, objects, the root) and of every directory created (elsewhere's objects/ab —
    # and objects when that is new too —, manifests/ and manifests/r); the manifest's directory last.
    expected = {leaf(found), leaf(found).parent, tmp_path / "objects", tmp_path, tmp_path / "manifests",
                leaf(elsewhere).parent}
    assert set(synced[:-1]) == expected and len(synced[:-1]) == len(expected)
    assert synced[-1] == manifest_dir

    synced.clear()
    assert store.stat_blob(ref_of(elsewhere)) is not None  # found, but written and flushed by this store
    store.put_manifest("manifests/r/000000000002.json", b"{}")
    assert synced == [manifest_dir]  # nothing left to sync but the manifest's own
