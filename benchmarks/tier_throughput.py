"""Tiering throughput: the whole move against a plain copy of the same bytes to the same target, same run.

A store is filled with ``--mb`` MiB of bodies (random text, sizes log-uniform between ``--min-kb`` and
``--max-kb``, spread over graded runs). For each target — a local directory and SeaweedFS over S3 (a real
``weed server`` started on 127.0.0.1) — it measures, ``--rounds`` times (each round: the plain copies, then the
tier of a fresh copy of the store):

- **plain copy**: the same bodies read from the same store and written to the same target by the simplest
  means — local: one ``open/write/close`` per body into one directory, single-threaded, like ``cp``
  (``plain``: no fsync, so the clock may stop with the bytes still in the page cache; ``plain_fsync``: each
  file fsynced, 8 writes in flight, then the directory synced once — the durability and parallelism of
  tiering's writes: the bytes and their names survive a crash); S3: ``put_object`` with the same number of
  threads tiering uses, no checksum;
- **tier**: every run moved as ``kvjudge tier --all`` moves them (``tier_runs``: one run's uploads overlap the
  finishing of the runs before, several at once) — each run's bodies written into packs of up to 8 MiB, each body
  streamed from the store in chunks and hashed as it is written (locally one temp file per pack + fsync + rename,
  the packs' directory and the parents of the directories the move created synced once before its manifest;
  one SHA-256 checksummed PUT per pack on S3), manifest, read-back check, ``Tiered`` event, local delete;
- **recovery**: a fresh copy of the store is tiered by a child ``kvjudge tier --all --unreduced`` that is
  SIGKILLed half way (a third of a run's move time into the move of the run after the first half); then the
  time to finish the crashed move (``recover``) and the time to converge (recover + tier the rest), checked
  with ``verify``.

Ratio = tier MB/s ÷ plain-copy MB/s of the same round (target ≥ 0.7; locally against the durable copy,
``ratio_vs_plain_fsync``, with the page-cache-only ratio ``ratio_vs_plain`` reported beside it); the figures
are the medians of the rounds, each round listed too, with the machine's load average (1 min) at its start.
Every timed step starts with the file system synced (``sync``, off the clock): no step pays for writing back
what the benchmark itself left unwritten — the no-fsync copy's bytes, the fresh copy of the store a tier
works on, the files of the step before (deleted, then discarded at the next journal commit). Writes
``tier_throughput.json`` to ``--out`` and prints it as one JSON line.

    python benchmarks/tier_throughput.py --out /tmp/bench [--mb 1024] [--rounds 3]
"""

from __future__ import annotations

import argparse
import base64
import concurrent.futures
import json
import math
import os
import random
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from kvjudge.retention import Store
from kvjudge.retention import events as ev
from kvjudge.retention.tiering import ColdStores, recover, tier_runs, verify_checks
from kvjudge.retention.verify import verify

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from seaweed import SeaweedServer  # noqa: E402  (the same launcher the tests use)

MIB = 1024 * 1024


def build_store(path: Path, total_mb: int, min_kb: int, max_kb: int, runs: int, seed: int) -> dict[str, Any]:
    """Fill a store with ``total_mb`` MiB of unique random-text bodies over ``runs`` graded runs."""
    rng = random.Random(seed)
    target = total_mb * MIB
    written = count = 0
    with Store.open(path) as store:
        for index in range(runs):
            run_id = f"bench-{index:03d}"
            share = (target - written) // (runs - index)
            with store.transaction("bench_ingest"):
                prompt = store.blobs.put(f"task {run_id}".encode())
                events: list[ev.Event] = [
                    ev.RunStarted(run=run_id, tenant="bench", task_id="t", task_prompt_ref=prompt),
                    ev.BranchOpened(run=run_id, branch="main", status="live", parent=None, fork_at=None)]
                run_bytes = seq = 0
                while run_bytes < share:
                    size = int(math.exp(rng.uniform(math.log(min_kb * 1024), math.log(max_kb * 1024))))
                    size = min(size, share - run_bytes) if share - run_bytes > min_kb * 1024 else size
                    # Random bytes as base64 text: unique per body and incompressible, like real tool output is not
                    # (no store or server can make this faster by compressing).
                    body = base64.b64encode(rng.randbytes(size * 3 // 4 + 3))[:size]
                    ref = store.blobs.put(body)
                    events.append(ev.TransitionRecorded(run=run_id, branch="main", seq=seq, role="tool",
                                                        text_ref=ref, tool_call=None, tool_output=None,
                                                        usage=None, context=None))
                    run_bytes += len(body)
                    seq += 1
                events += [ev.StateChanged(run=run_id, state="grading"), ev.StateChanged(run=run_id, state="graded")]
                store.events.append_many(run_id, events)
            written += run_bytes
            count += seq
    with sqlite3.connect(path) as conn:  # the file as a copy would see it: every page in place, no WAL
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return {"bytes": written, "bodies": count, "runs": runs}


def _in_parallel(store: Store, write: Any, workers: int = 8, in_flight: int = 16) -> int:
    """Call ``write(index, body)`` for every body on ``workers`` threads, at most ``in_flight`` queued; bytes."""
    total = 0
    with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
        futures: set[concurrent.futures.Future[Any]] = set()
        for index, (_, body) in enumerate(store.blobs.iter_bodies()):
            futures.add(pool.submit(write, index, body))
            total += len(body)
            if len(futures) >= in_flight:
                done, futures = concurrent.futures.wait(futures, return_when=concurrent.futures.FIRST_COMPLETED)
                for future in done:
                    future.result()
        for future in futures:
            future.result()
    return total


def plain_copy(store_path: Path, target: Any, *, fsync: bool = False) -> tuple[int, float]:
    """Read every body from the store and write it to ``target`` the simplest way; (bytes, seconds).

    Local: one file per body; without ``fsync`` single-threaded like ``cp`` (the bytes may still be only in the
    page cache when the clock stops), with it each file fsynced by 8 threads and the directory synced at the
    end (tiering's durability and parallelism).
    """
    os.sync()  # off the clock: nothing left over from an earlier step to write back
    with Store.open(store_path) as store:
        start = time.perf_counter()
        total = 0
        if isinstance(target, Path) and not fsync:
            target.mkdir(parents=True, exist_ok=True)
            for index, (_, body) in enumerate(store.blobs.iter_bodies()):
                with open(target / f"{index:08d}", "wb") as handle:
                    handle.write(body)
                total += len(body)
        elif isinstance(target, Path):
            target.mkdir(parents=True, exist_ok=True)

            def write_synced(index: int, body: bytes) -> None:
                with open(target / f"{index:08d}", "wb") as handle:
                    handle.write(body)
                    handle.flush()
                    os.fsync(handle.fileno())

            # As many writes in flight as tiering uses: same durability, same parallelism.
            total = _in_parallel(store, write_synced)
            directory = os.open(target, os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(directory)  # the names too: one sync for the whole batch (tiering: one per run)
            finally:
                os.close(directory)
        else:
            client, bucket, prefix = target
            total = _in_parallel(store, lambda index, body: client.put_object(
                Bucket=bucket, Key=f"{prefix}/{index:08d}", Body=body))
        return total, time.perf_counter() - start


def tier_all(store_path: Path, target_url: str, endpoint: str | None) -> tuple[int, float]:
    """Every run moved as `kvjudge tier --all` moves them (one call, moves overlapping); (bytes, seconds)."""
    stores = ColdStores(endpoint)
    cold = stores.get(target_url)
    os.sync()  # off the clock: the fresh copy of the store, and the files of the step before
    with Store.open(store_path) as store:
        start = time.perf_counter()
        total = sum(result.bytes for result in tier_runs(store, store.runs.run_ids(), cold, stores=stores))
        return total, time.perf_counter() - start


def kill_and_recover(store_path: Path, target_url: str, endpoint: str | None, run_s: float,
                     env: dict[str, str]) -> dict[str, Any]:
    """SIGKILL a child `kvjudge tier --all` a third of a run's move time after it started moving the run
    after the first half (so it dies mid-upload), then time `recover` (finish the crashed move) and the full
    convergence."""
    # --unreduced: these synthetic runs are far above any ceiling, and no probe figure is at hand here; their
    # tokens (recorded with the choice) are counted as chars/4, not by tokenizing a GiB with the judge model.
    config = store_path.with_name("tier-child.toml")
    config.write_text('[retention]\ncounter = "chars"\n')
    child = subprocess.Popen([sys.executable, "-m", "kvjudge", "tier", "--all", "--unreduced", "--to", target_url,
                              "--store", str(store_path), "--config", str(config)]
                             + (["--endpoint-url", endpoint] if endpoint else []),
                             env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with Store.open(store_path) as watcher:
        half = len(watcher.runs.run_ids()) // 2
        while child.poll() is None:
            started = sum(len(watcher.runs.run_ids_with_tier_status(status)) for status in ("started", "tiered"))
            if started > half:  # the move of the run after the first half has begun
                break
            time.sleep(0.01)
    time.sleep(run_s / 3)
    killed = child.poll() is None
    if killed:
        child.send_signal(signal.SIGKILL)
    child.wait()
    stores = ColdStores(endpoint)
    with Store.open(store_path) as store:
        before = {run_id: (store.runs.run(run_id).tier or {}).get("status") for run_id in store.runs.run_ids()}
        start = time.perf_counter()
        recovered = recover(store, stores)
        recover_s = time.perf_counter() - start
        tier_runs(store, store.runs.run_ids(), stores.get(target_url), stores=stores)
        converge_s = time.perf_counter() - start
        report = verify(store, extra_checks=verify_checks(store, ColdStores(endpoint)))
        all_tiered = all((store.runs.run(r).tier or {}).get("status") == "tiered" for r in store.runs.run_ids())
    return {"killed": killed, "runs_tiered_before_kill": sum(1 for s in before.values() if s == "tiered"),
            "runs_mid_move_at_kill": sum(1 for s in before.values() if s == "started"),
            "recovered": [{k: r.to_dict()[k] for k in ("run", "recovered", "refs", "uploaded", "deleted")}
                          for r in recovered],
            "recover_s": round(recover_s, 3), "converge_s": round(converge_s, 3), "all_tiered": all_tiered,
            "verify_ok": report.ok, "violations": [v.message for v in report.violations][:5]}


def measure(name: str, store_path: Path, work: Path, plain_target: Any, fresh_target: Any,
            endpoint: str | None, env: dict[str, str], rounds: int) -> dict[str, Any]:
    """``rounds`` rounds of plain copies then a tier of a fresh copy of the store (each round's ratio against
    its own plain copy: load on a shared machine drifts between rounds); medians; then kill + recover."""
    pristine = work / f"{name}-pristine.sqlite"
    shutil.copyfile(store_path, pristine)  # the untiered store: every plain copy, every round's tier, the kill test
    kinds = {"plain": False, "plain_fsync": True} if name == "local" else {"plain": False}
    with Store.open(pristine) as store:
        runs = len(store.runs.run_ids())
    per_round: list[dict[str, Any]] = []
    for round_ in range(1, rounds + 1):
        measured: dict[str, Any] = {"load": os.getloadavg()[0]}
        for kind, fsync in kinds.items():
            copied, seconds = plain_copy(pristine, plain_target(f"{kind}-{round_}"), fsync=fsync)
            measured[f"{kind}_copy_mb_s"] = copied / MIB / seconds
        shutil.copyfile(pristine, store_path)
        tier_bytes, tier_s = tier_all(store_path, fresh_target(f"tier-{round_}"), endpoint)
        measured["tier_s"] = tier_s
        measured["tier_mb_s"] = tier_bytes / MIB / tier_s
        for kind in kinds:
            measured[f"ratio_vs_{kind}"] = measured["tier_mb_s"] / measured[f"{kind}_copy_mb_s"]
        per_round.append(measured)
    result: dict[str, Any] = {"target": name, "bytes": tier_bytes, "rounds": [
        {key: round(value, 3) for key, value in measured.items()} for measured in per_round]}
    for key in per_round[0]:
        if key == "load":
            continue
        result[key] = round(statistics.median(measured[key] for measured in per_round), 3)
    result["recovery"] = kill_and_recover(pristine, fresh_target("kill"), endpoint, result["tier_s"] / runs, env)
    pristine.unlink()
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="directory for tier_throughput.json")
    parser.add_argument("--mb", type=int, default=1024, help="MiB of bodies to tier (default 1024)")
    parser.add_argument("--min-kb", type=int, default=64)
    parser.add_argument("--max-kb", type=int, default=4096)
    parser.add_argument("--runs", type=int, default=16)
    parser.add_argument("--targets", default="local,s3", help="comma-separated: local, s3")
    parser.add_argument("--rounds", type=int, default=3, help="plain copies + tier, this many times (median)")
    parser.add_argument("--workdir", help="scratch directory (default: a temp dir; needs ~4x --mb free)")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(args.workdir or tempfile.mkdtemp(prefix="kvjudge-tierbench-"))
    work.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {"benchmark": "tier_throughput", "mb": args.mb,
                               "body_kb": [args.min_kb, args.max_kb], "targets": []}
    try:
        start = time.perf_counter()
        results["store"] = build_store(work / "store.sqlite", args.mb, args.min_kb, args.max_kb, args.runs, seed=5)
        results["store"]["build_s"] = round(time.perf_counter() - start, 1)
        wanted = args.targets.split(",")
        pristine = work / "pristine.sqlite"
        if len(wanted) > 1:
            shutil.copyfile(work / "store.sqlite", pristine)
        for name in wanted:
            if pristine.exists() and name != wanted[0]:
                shutil.copyfile(pristine, work / "store.sqlite")
            if name == "local":
                def local_dir(tag: str) -> Path:
                    # One directory per stage, the previous stage's removed first (disk stays ~2x --mb).
                    for old in work.glob("local-*"):
                        shutil.rmtree(old, ignore_errors=True)
                    (work / f"local-{tag}").mkdir()
                    return work / f"local-{tag}"

                results["targets"].append(measure(
                    "local", work / "store.sqlite", work, local_dir, lambda tag: f"file://{local_dir(tag)}",
                    None, dict(os.environ), args.rounds))
                for old in work.glob("local-*"):
                    shutil.rmtree(old, ignore_errors=True)
            elif name == "s3":
                with SeaweedServer(work / "weed") as server:
                    os.environ.update(server.env())
                    client = server.client()
                    bucket = server.new_bucket()
                    results["targets"].append(measure(
                        "s3", work / "store.sqlite", work, lambda tag: (client, bucket, tag),
                        lambda tag: f"s3://{server.new_bucket()}/{tag}",  # a bucket of its own for each move
                        server.endpoint, dict(os.environ), args.rounds))
                shutil.rmtree(work / "weed", ignore_errors=True)
            else:
                parser.error(f"unknown target {name!r}")
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
    line = json.dumps(results)
    (out / "tier_throughput.json").write_text(line + "\n")
    print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
