"""Runs read straight from object storage (issue 45, item 4): ``kvjudge ingest s3://bucket/prefix/`` against the
real SeaweedFS S3 server — harness-shaped runs (inspect_ai logs, a Harbor job, a SWE-agent run directory and
mini-swe-agent trajectories graded by a SWE-bench report) uploaded as a lab's agents upload them, imported as the
same files are from disk (same run ids, same folded states), one object's key read with its companions, an import
killed with SIGKILL finished by the same command, three processes ingesting one prefix into one store at once (a
SQLite file, and the PostgreSQL server), and bad input refused in one line with nothing written."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
from helpers import free_ports, kvjudge, start_kvjudge
from seaweed import SeaweedServer, seaweed  # noqa: F401 (fixture)

from kvjudge.retention import Store
from kvjudge.retention import events as ev
from kvjudge.retention.ingest import ingest_paths
from kvjudge.retention.verify import verify
from kvjudge.testing.agent_logs import swe_agent_run_directory
from kvjudge.testing.harbor import TrialSpec, write_job
from kvjudge.testing.inspect_logs import eval_spec, sample, write_eval, write_json_log
from kvjudge.testing.jsonl import write_jsonl
from kvjudge.testing.native_runs import make_run
from kvjudge.testing.trajectories import make_episode, mini_swe_agent_v1

pytestmark = pytest.mark.s3

MODEL = "openai/gpt-4o"
SWE_RUN = "gpt4__SWE-bench_Lite__default__t-0.00__p-0.95__c-2.00__install-1"
INSTANCES = ("a__a-1", "b__b-2", "c__c-3")
RESULTS = "results/openai__gpt-4o.eval1.json"  # a SWE-bench summary report, bound to its agent by its file name
#: Enough runs for more than one batch of the importer (64 runs): a kill after the first COMMIT leaves some.
MANY = 150


def write_lab(root: Path) -> Path:
    """What a lab's agents leave: an inspect_ai log directory, a Harbor job, a SWE-agent run directory,
    mini-swe-agent trajectories and the SWE-bench report that grades them."""
    logs = root / "inspect"
    logs.mkdir(parents=True)
    for task, name, epochs, write in (("csv_quoting", "2025-11-03T09-12-44_csv-quoting_abc.eval", 2, write_eval),
                                      ("csv_escaping", "2025-11-04T10-00-00_csv-escaping_def.json", 1,
                                       write_json_log)):
        spec = eval_spec(task, MODEL, epochs=epochs, samples=2)
        samples = []
        for index, score in enumerate(("C", "I")):
            episode = make_episode(f"case-{index}", 300 + index, target_bytes=3_000)
            episode.steps = episode.steps[:4]
            samples += [sample(episode, index + 1, epoch, model=MODEL, score=score) for epoch in range(1, epochs + 1)]
        write(logs / name, spec, samples)
    write_job(root / "harbor", "2025-11-02__10-00-00", [
        TrialSpec("fix-csv-quoting", suffix="T00aaaa", seed=1, continuations=1),
        TrialSpec("build-cython-ext", agent="claude-code", model="openai/gpt-5", suffix="C01bbbb", seed=2,
                  reward=0.0)])
    swe_agent_run_directory(root / "swe" / "trajectories" / SWE_RUN, "dev__greeter-1", run_name=SWE_RUN)
    for index, instance in enumerate(INSTANCES):
        episode = make_episode(instance, 100 + index, target_bytes=2_000, model=MODEL)
        path = root / "mini" / MODEL.replace("/", "__") / instance / f"{instance}.traj.json"
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps(mini_swe_agent_v1(episode)))
    (root / "results").mkdir()
    (root / RESULTS).write_text(json.dumps({"resolved_ids": ["a__a-1"], "unresolved_ids": ["b__b-2"],
                                            "error_ids": ["c__c-3"], "schema_version": 2}))
    return root


def upload(client: Any, bucket: str, root: Path, prefix: str) -> int:
    """Every file under ``root`` as an object under ``prefix`` (its path, ``/``-separated, is the key's rest)."""
    count = 0
    for path in sorted(root.rglob("*")):
        if path.is_file():
            client.put_object(Bucket=bucket, Key=prefix + path.relative_to(root).as_posix(), Body=path.read_bytes())
            count += 1
    return count


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory, seaweed: SeaweedServer) -> tuple[Path, str]:  # noqa: F811
    """The lab's files on disk, and the bucket they were uploaded to under ``lab/`` (one upload per module)."""
    root = write_lab(tmp_path_factory.mktemp("lab") / "lab")
    bucket = seaweed.new_bucket()
    upload(seaweed.client(), bucket, root, "lab/")
    return root, bucket


def environment(server: SeaweedServer, tmp_path: Path, **extra: str) -> dict[str, str]:
    """A child's environment: the server's credentials, no AWS_ENDPOINT_URL (``--endpoint-url`` names it), and a
    scratch folder of the test's own (``TMPDIR``) to see the download's folder go."""
    scratch = tmp_path / "scratch"
    scratch.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update({k: v for k, v in server.env().items() if k != "AWS_ENDPOINT_URL"})
    env.update({"TMPDIR": str(scratch), **extra})
    return env


def ingest(server: SeaweedServer, tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> Any:
    done = kvjudge("ingest", *args, "--endpoint-url", server.endpoint, "--json",
                   env=env or environment(server, tmp_path))
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def states(path: Path | str) -> dict[str, bytes]:
    """Each run's folded state, in canonical bytes (what its state digest is of)."""
    with Store.open(path) as store:
        return {run_id: store.runs.refold(run_id).canonical_bytes() for run_id in store.runs.run_ids()}


def comparable(found: dict[str, bytes]) -> dict[str, Any]:
    """Folded states by run, without their log positions."""
    return {run_id: without_lsns(json.loads(state)) for run_id, state in found.items()}


def without_lsns(value: Any) -> Any:
    """A decoded state without the log positions it names (runs written in another order sit elsewhere in the
    log; nothing else of them may differ)."""
    if isinstance(value, dict):
        return {key: without_lsns(item) for key, item in value.items() if key != "lsn"}
    if isinstance(value, list):
        return [without_lsns(item) for item in value]
    return value


def test_a_prefix_imports_as_the_same_files_do_from_disk(seaweed: SeaweedServer, lab: tuple[Path, str],  # noqa: F811
                                                          tmp_path: Path) -> None:
    root, bucket = lab
    disk = kvjudge("ingest", str(root), "--results", str(root / RESULTS), "--store", str(tmp_path / "disk.sqlite"),
                   "--json")
    assert disk.returncode == 0, disk.stderr
    from_disk = json.loads(disk.stdout)
    url = f"s3://{bucket}/lab/"
    out = ingest(seaweed, tmp_path, url, "--results", f"s3://{bucket}/lab/{RESULTS}",
                 "--store", str(tmp_path / "s3.sqlite"))

    assert out["ingested"] == from_disk["ingested"] and len(out["ingested"]) == 2 * 2 + 2 + 2 + 1 + 3
    assert states(tmp_path / "s3.sqlite") == states(tmp_path / "disk.sqlite")
    assert out["states"] == from_disk["states"] and out["files"] == from_disk["files"]
    # Every path the report names is the object's URL: companions, passed-over files, the results file.
    local = f"{root}/"
    assert out["companions"]["read"] == [p.replace(local, url) for p in from_disk["companions"]["read"]] != []
    assert out["companions"]["passed_over"] == [p.replace(local, url) for p in from_disk["companions"]["passed_over"]]
    assert out["notes"] == [note.replace(local, url) for note in from_disk["notes"]]
    assert [r["results"] for r in out["results"]] == [f"s3://{bucket}/lab/{RESULTS}"]
    assert [r["graded"] for r in out["results"]] == [r["graded"] for r in from_disk["results"]] == [2]
    assert list((tmp_path / "scratch").iterdir()) == []  # the downloaded copies are gone

    again = ingest(seaweed, tmp_path, url, "--results", f"s3://{bucket}/lab/{RESULTS}",
                   "--store", str(tmp_path / "s3.sqlite"))
    assert (again["imported"], again["already_present"]) == (0, len(out["ingested"]))


def test_one_key_is_read_with_its_companions(seaweed: SeaweedServer, lab: tuple[Path, str], tmp_path: Path,  # noqa: F811
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    root, bucket = lab
    for key, value in seaweed.env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    trajectory = f"swe/trajectories/{SWE_RUN}/dev__greeter-1.traj"
    trial = next((root / "harbor").glob("*/fix-csv-quoting__*/agent/trajectory.json")).relative_to(root).as_posix()
    for key in (trajectory, trial):
        with Store.open(tmp_path / "s3.sqlite") as s3_store, Store.open(tmp_path / "disk.sqlite") as disk_store:
            from_bucket = ingest_paths(s3_store, [f"s3://{bucket}/lab/{key}"], endpoint_url=seaweed.endpoint)
            from_disk = ingest_paths(disk_store, [root / key])
        assert from_bucket.imported == from_disk.imported and len(from_bucket.imported) == 1
        assert from_bucket.companion_files == [p.replace(f"{root}/", f"s3://{bucket}/lab/")
                                               for p in from_disk.companion_files]
    assert states(tmp_path / "s3.sqlite") == states(tmp_path / "disk.sqlite")
    with Store.open(tmp_path / "s3.sqlite") as store:
        swe = store.runs.run(f"{SWE_RUN}/dev__greeter-1")
        assert swe.metadata["submission_from"] == "all_preds.jsonl"  # the companion beside the key was read
        harbor_run = [r for r in store.runs.run_ids() if "fix-csv-quoting" in r]
        assert store.runs.run(harbor_run[0]).state == "graded"  # the trial's result.json, two folders up
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("kvjudge-s3-")] == []


def write_many(root: Path) -> None:
    """:data:`MANY` runs: three native JSONL files and mini-swe-agent trajectories, in folders."""
    for part in range(3):
        write_jsonl(root / f"batch-{part}" / "runs.jsonl",
                    [make_run(f"native-{part}-{i}", [f"output {part} {i} " * 40, "done"]) for i in range(30)])
    for index in range(MANY - 90):
        instance = f"proj{index % 5}__proj-{index}"
        episode = make_episode(instance, index, target_bytes=1_500, model=f"model-{index % 2}")
        path = root / f"model-{index % 2}" / instance / f"{instance}.traj.json"
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps(mini_swe_agent_v1(episode)))


@pytest.fixture(scope="module")
def many(tmp_path_factory: pytest.TempPathFactory, seaweed: SeaweedServer) -> tuple[Path, str, Path]:  # noqa: F811
    """:data:`MANY` runs on disk, uploaded under ``many/``, and a clean import of them from disk."""
    root = tmp_path_factory.mktemp("many") / "runs"
    write_many(root)
    bucket = seaweed.new_bucket()
    upload(seaweed.client(), bucket, root, "many/")
    clean = root.parent / "clean.sqlite"
    done = kvjudge("ingest", str(root), "--store", str(clean), "--json")
    assert done.returncode == 0 and json.loads(done.stdout)["imported"] == MANY, done.stderr
    return root, bucket, clean


def event_count(path: Path | str) -> int:
    with Store.open(path) as store:
        return sum(1 for _ in store.events.iter_events())


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_an_import_killed_mid_way_is_finished_by_the_same_command(seaweed: SeaweedServer,  # noqa: F811
                                                                   many: tuple[Path, str, Path], tmp_path: Path,
                                                                   backend: str, request: pytest.FixtureRequest) -> None:
    _, bucket, clean = many
    store = str(tmp_path / "killed.sqlite") if backend == "sqlite" else request.getfixturevalue("postgres_url")
    command = ("ingest", f"s3://{bucket}/many/", "--store", store, "--endpoint-url", seaweed.endpoint, "--json")
    env = environment(seaweed, tmp_path)
    killed = kvjudge(*command, faults="ingest.committed", env=env)  # SIGKILL right after the first COMMIT
    assert killed.returncode == -9, killed.stderr
    with Store.open(store) as opened:
        assert 0 < len(opened.runs.run_ids()) < MANY
    assert len(list((tmp_path / "scratch").iterdir())) == 1  # the killed import's downloads, left behind

    finished = kvjudge(*command, env=env)
    assert finished.returncode == 0, finished.stderr
    report = json.loads(finished.stdout)
    assert report["imported"] + report["already_present"] == MANY and report["imported"] > 0
    # On PostgreSQL the killed transaction's LSNs are a gap in the log: the states are compared without them.
    assert comparable(states(store)) == comparable(states(clean)) and event_count(store) == event_count(clean)
    with Store.open(store) as opened:
        assert verify(opened).ok
        for run_id in opened.runs.run_ids():
            logged = [event for _, event in opened.events.iter_events(run_id)]
            assert isinstance(logged[0], ev.RunStarted) and logged[0].content_hash == ev.content_hash(logged)
    assert list((tmp_path / "scratch").iterdir()) == []  # the next import swept the killed one's folder

    third = json.loads(kvjudge(*command, env=env).stdout)
    assert (third["imported"], third["already_present"]) == (0, MANY) and event_count(store) == event_count(clean)


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_processes_ingesting_one_prefix_at_once_import_each_run_once(seaweed: SeaweedServer,  # noqa: F811
                                                                      many: tuple[Path, str, Path],
                                                                      tmp_path: Path, backend: str,
                                                                      request: pytest.FixtureRequest) -> None:
    _, bucket, clean = many
    store = str(tmp_path / "shared.sqlite") if backend == "sqlite" else request.getfixturevalue("postgres_url")
    assert kvjudge("ingest", str(write_jsonl(tmp_path / "seed.jsonl", [make_run("seed", ["x"])])),
                   "--store", store).returncode == 0  # the store exists: the three race over runs, not its schema
    env = environment(seaweed, tmp_path)
    children = [start_kvjudge("ingest", f"s3://{bucket}/many/", "--store", store,
                              "--endpoint-url", seaweed.endpoint, "--json", env=env) for _ in range(3)]
    reports = []
    for child in children:
        out, err = child.communicate(timeout=300)
        assert child.returncode == 0, err
        reports.append(json.loads(out))
    imported = [run_id for report in reports for run_id in report["ingested"]]
    assert sorted(imported) == sorted(set(imported)) and len(imported) == MANY  # each run by one process
    for report in reports:
        assert report["imported"] + report["already_present"] == MANY
    imported_states = comparable(states(store))
    del imported_states["seed"]
    assert imported_states == comparable(states(clean))
    with Store.open(store) as opened:
        seed_events = len(list(opened.events.iter_events("seed")))
    assert event_count(store) == event_count(clean) + seed_events  # no run's events written twice


# ------------------------------------------------------------------------------------------------ bad input
@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A second SeaweedFS that checks credentials: the test identity may do anything, ``outsider`` nothing."""
    server = SeaweedServer(identities=[{"name": "outsider", "actions": [],
                                        "credentials": [{"accessKey": "outsider", "secretKey": "outsider-secret"}]}])
    server.start()
    yield server
    server.stop(grace=0)  # its data is thrown away: no need to wait for weed to stop on SIGTERM


def refused(tmp_path: Path, *args: str, env: dict[str, str]) -> str:
    """``kvjudge ingest ARGS`` that must fail: its one line, with nothing written (no store)."""
    store = tmp_path / "refused.sqlite"
    started = time.monotonic()
    done = kvjudge("ingest", *args, "--store", str(store), "--json", env=env, timeout=120)
    assert time.monotonic() - started < 60  # no retries for minutes
    assert done.returncode != 0 and done.stdout == "", done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert not store.exists()
    assert list((tmp_path / "scratch").iterdir()) == []
    return lines[0]


def test_bad_input_is_one_line_and_writes_nothing(seaweed: SeaweedServer, lab: tuple[Path, str],  # noqa: F811
                                                  guarded: SeaweedServer, tmp_path: Path) -> None:
    _, bucket = lab
    env = environment(seaweed, tmp_path)
    here = ("--endpoint-url", seaweed.endpoint)
    (port,) = free_ports(1)
    line = refused(tmp_path, f"s3://{bucket}/lab/", "--endpoint-url", f"http://127.0.0.1:{port}", env=env)
    assert "cannot reach the S3 endpoint to list" in line and f"127.0.0.1:{port}" in line
    line = refused(tmp_path, "s3://kvj-no-such-bucket/lab/", *here, env=env)
    assert "bucket 'kvj-no-such-bucket' does not exist" in line
    assert "no objects under this prefix" in refused(tmp_path, f"s3://{bucket}/nothing-here/", *here, env=env)
    assert "no object has this key or prefix" in refused(tmp_path, f"s3://{bucket}/lab/missing.jsonl", *here, env=env)
    seaweed.client().put_object(Bucket=bucket, Key="docs/README.md", Body=b"# not a run")
    line = refused(tmp_path, f"s3://{bucket}/docs/", *here, env=env)
    assert line.startswith(f"kvjudge: error: s3://{bucket}/docs: no run files") and "scratch" not in line
    for url in ("s3://", "s3:///runs/", "s3://a/runs/", "s3://bad bucket/runs/"):
        assert "not an S3 URL kvjudge reads" in refused(tmp_path, url, *here, env=env)
    assert "'..' part" in refused(tmp_path, f"s3://{bucket}/lab/../x", *here, env=env)
    line = refused(tmp_path, f"s3://{bucket}/lab/", *here, "--results", f"s3://{bucket}/lab/results/none.json",
                   env=env)
    assert "no object has this key or prefix" in line

    guarded_bucket = guarded.new_bucket()
    guarded.client().put_object(Bucket=guarded_bucket, Key="runs/r.jsonl",
                                Body=json.dumps(make_run("r", ["x"])).encode() + b"\n")
    outsider = environment(guarded, tmp_path, AWS_ACCESS_KEY_ID="outsider", AWS_SECRET_ACCESS_KEY="outsider-secret")
    line = refused(tmp_path, f"s3://{guarded_bucket}/runs/", "--endpoint-url", guarded.endpoint, env=outsider)
    assert "S3 refused to" in line and "AccessDenied" in line
    wrong = environment(guarded, tmp_path, AWS_SECRET_ACCESS_KEY="not-the-secret")
    line = refused(tmp_path, f"s3://{guarded_bucket}/runs/", "--endpoint-url", guarded.endpoint, env=wrong)
    assert "S3 refused to" in line and "SignatureDoesNotMatch" in line
    # The same bucket with the right credentials: the refusals were the credentials', not the server's.
    assert ingest(guarded, tmp_path, f"s3://{guarded_bucket}/runs/", "--store",
                  str(tmp_path / "ok.sqlite"))["ingested"] == ["r"]
