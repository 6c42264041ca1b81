"""A store for a lab: the run store on PostgreSQL against the SQLite file, step by step, in one run (#44).

Each step is one child ``python -m kvjudge …`` process, the same command on each store, timed whole (start-up
included):

- **ingest**: two agents × N SWE-bench-shaped trajectories (mini-swe-agent v1 files of about 40 KB, from
  :mod:`kvjudge.testing.trajectories`, with each agent's SWE-bench report as grades) into a fresh store;
  ``ingest_ratio`` is PostgreSQL's MB/s over SQLite's (target ≥ 0.5);
- **runs**: ``kvjudge runs --json`` over a store of ``--listing-runs`` runs (10,000: small native runs, ingested
  into SQLite, then moved to PostgreSQL with ``kvjudge store copy``); ``runs_ratio`` is PostgreSQL's time over
  SQLite's (target ≤ 2);
- **eval_cached**: ``kvjudge eval --server URL`` over the N same-task pairs with every verdict cached (a first
  ``eval`` against the simulated judge, :mod:`kvjudge.testing.sim_judge`, fills the cache, untimed);
  ``eval_cached_ratio`` is PostgreSQL's time over SQLite's (target ≤ 2);
- **copy**: ``kvjudge store copy`` of the ingested store, SQLite → PostgreSQL and back, in body MB/s (its own
  ``--json``), and of the listing store into PostgreSQL;
- **bodies**: where bodies live (item 4 of the issue). The bodies of ``--bodies-runs`` ingested runs (200), as the
  runs hold them (sizes reported), written one run at a time and read back: in the database (the PostgreSQL store's
  blob store: ``bytea`` rows, one transaction a run) against beside it (each body a content-addressed object of a
  cold store directory, written and fsynced as tiering writes loose objects, the run's made durable before its
  body-less rows commit in the database, which a store needs either way). ``bytea_write_ratio`` and
  ``bytea_read_ratio`` are the database's MB/s over the directory's.

PostgreSQL: ``--store-url`` names a server where the benchmark may create databases (one per step, dropped after;
e.g. ``postgresql://postgres@db:5432/postgres``); without it the benchmark starts its own with the system's
PostgreSQL (:mod:`kvjudge.testing.postgres_server`, as the tests do), durable as a lab's would be (fsync on), since
SQLite commits with ``synchronous=FULL``.

Writes ``lab_store.json`` to ``--out`` and prints it as one line.

    python benchmarks/lab_store.py --out /tmp/bench [--n 500] [--listing-runs 10000] [--bodies-runs 200] [--small]
        [--store-url postgresql://USER@HOST:PORT/DB] [--work DIR]

``--small`` is N = 1 and 20 listed runs unless ``--listing-runs`` says otherwise (seconds: the suite's smoke
test; every step still runs once on each store). The latest figures are in
docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from scale import AGENTS, Child, generate

from kvjudge.retention import Store
from kvjudge.retention.cold import LocalDirColdStore
from kvjudge.testing.jsonl import write_jsonl
from kvjudge.testing.native_runs import make_run
from kvjudge.testing.sim_judge import Settings as SimSettings
from kvjudge.testing.sim_judge import SimJudgeServer, write_key

ROOT = Path(__file__).resolve().parent.parent
TARGETS = {"ingest_ratio_min": 0.5, "runs_ratio_max": 2.0, "eval_cached_ratio_max": 2.0}
KINDS = ("sqlite", "postgresql")

#: A store location for a step: ``fresh(name)`` gives a new, empty one of its kind.
Fresh = Callable[[str], str]


def _listing_runs(path: Path, count: int) -> None:
    """``count`` small native runs (a listing's cost is per run, not per byte), two agents on shared tasks."""
    def run(index: int) -> dict[str, Any]:
        made = make_run(f"listed-{index:06d}", [f"output {index} " * 20, "done"])
        made["task"] = {"id": f"task-{index // 2}", "prompt": "Fix the bug."}
        made["agent"] = AGENTS[index % 2]
        return made

    write_jsonl(path, (run(index) for index in range(count)))


@contextlib.contextmanager
def _postgres(store_url: str | None) -> Iterator[Fresh]:
    """``fresh(name)``: the URL of a new database on the server (``--store-url``'s, else one started here), each
    dropped at the end on a server of someone else's (one started here goes whole, its data directory with it)."""
    from kvjudge.testing.postgres_server import PostgresServer, ServerAt

    server = ServerAt(store_url) if store_url else PostgresServer(durable=True).start()
    made: list[str] = []

    def fresh(_name: str) -> str:
        made.append(server.new_database())
        return server.url(made[-1])

    try:
        yield fresh
    finally:
        if store_url:  # a dropdb is a client process each (~1.5 s): none for a server about to be removed
            for name in made:
                server.drop_database(name)
        server.stop()


def _sqlite(scratch: Path) -> Fresh:
    return lambda name: str(scratch / f"{name}.sqlite")


def _kvjudge(child: Child, name: str, *argv: str) -> tuple[float, Any]:
    figures = child.run(name, ["-m", "kvjudge", *argv, "--json"])
    return figures["wall_s"], json.loads(figures.pop("stdout").read_text())


def _bodies(store_location: str, count: int) -> list[list[tuple[str, bytes]]]:
    """The bodies of the first ``count`` runs of the store at ``store_location``, run by run (a body shared by runs:
    with the first)."""
    seen: set[str] = set()
    runs: list[list[tuple[str, bytes]]] = []
    with Store.open(store_location) as store:
        for run_id in store.runs.run_ids()[:count]:
            refs = [ref for ref in store.runs.run(run_id).refs() if ref not in seen]
            seen.update(refs)
            runs.append([(ref, body) for ref in refs if (body := store.blobs.get(ref)) is not None])
    return runs


def _where_bodies_live(runs: list[list[tuple[str, bytes]]], fresh: Fresh, directory: Path) -> dict[str, Any]:
    """The bodies written run by run and read back: in a database (bytea) against beside another (files + rows)."""
    sizes = sorted(len(body) for run in runs for _, body in run)
    total = sum(sizes)
    figures: dict[str, Any] = {"bodies": len(sizes), "mb": round(total / 1e6, 2),
                               "size_median": int(statistics.median(sizes)) if sizes else 0,
                               "size_p90": sizes[int(0.9 * (len(sizes) - 1))] if sizes else 0,
                               "size_max": sizes[-1] if sizes else 0}
    with Store.open(fresh("bytea")) as store:
        started = time.perf_counter()
        for run in runs:
            with store.transaction("bench_bytea"):
                store.blobs.put_hashed(run)
        figures["bytea_write_s"] = time.perf_counter() - started
        started = time.perf_counter()
        read = sum(len(store.blobs.get(ref) or b"") for run in runs for ref, _ in run)
        figures["bytea_read_s"] = time.perf_counter() - started
    assert read == total, (read, total)
    directory.mkdir(parents=True, exist_ok=True)
    cold = LocalDirColdStore(directory)
    with Store.open(fresh("beside")) as store:
        started = time.perf_counter()
        for run in runs:
            for ref, body in run:
                cold.put_blob(ref, body)
            cold.flush()  # the run's bodies durable before the rows that name them commit
            with store.transaction("bench_beside"):
                store.blobs.put_absent((ref, len(body)) for ref, body in run)
        figures["beside_write_s"] = time.perf_counter() - started
        started = time.perf_counter()
        read = sum(len(cold.get_blob(ref) or b"") for run in runs for ref, _ in run)
        figures["beside_read_s"] = time.perf_counter() - started
    assert read == total, (read, total)
    for step in ("bytea_write", "bytea_read", "beside_write", "beside_read"):
        seconds = figures.pop(f"{step}_s")
        figures[f"{step}_mb_per_s"] = round(total / 1e6 / seconds, 1) if seconds > 0 else None
    for step in ("write", "read"):
        ours, theirs = figures[f"bytea_{step}_mb_per_s"], figures[f"beside_{step}_mb_per_s"]
        figures[f"bytea_{step}_ratio"] = round(ours / theirs, 2) if ours and theirs else None
    return figures


def measure(args: argparse.Namespace, work: Path, fresh: dict[str, Fresh]) -> dict[str, Any]:
    """Every step on each kind of store."""
    trajectories = work / f"trajectories-{args.n}"
    if not trajectories.exists():
        generate(trajectories, args.n)
    size = sum(path.stat().st_size for path in (trajectories / "runs").rglob("*.traj.json"))
    listing = work / f"listing-{args.listing_runs}.jsonl"
    if not listing.exists():
        _listing_runs(listing, args.listing_runs)
    here = work / "steps"
    shutil.rmtree(here, ignore_errors=True)
    here.mkdir()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH")))),
           "KVJUDGE_CACHE_DIR": str(work / "cache"), "KVJUDGE_DATA_DIR": str(here / "data")}
    child = Child(here, env)
    results = [f"--results={agent}={trajectories / 'results' / (agent.replace('/', '__') + '.json')}"
               for agent in AGENTS]
    key = write_key(work / "key.json", [])
    steps: dict[str, dict[str, Any]] = {kind: {} for kind in KINDS}
    stores: dict[str, str] = {}
    with SimJudgeServer(key, SimSettings(max_model_len=32_768)) as judge:
        child.run("probe", ["-m", "kvjudge", "probe", "--server", judge.url, "--json"])
        for kind in KINDS:
            stores[kind] = fresh[kind]("ingested")
            seconds, ingested = _kvjudge(child, f"ingest_{kind}", "ingest", str(trajectories / "runs"), *results,
                                         "--store", stores[kind])
            steps[kind]["ingest"] = {"s": seconds, "runs": ingested["imported"],
                                     "mb_per_s": round(size / 1e6 / seconds, 2)}
            _kvjudge(child, f"eval_cold_{kind}", "eval", "--server", judge.url, "--store", stores[kind])
            seconds, evaluated = _kvjudge(child, f"eval_cached_{kind}", "eval", "--server", judge.url,
                                          "--store", stores[kind])
            steps[kind]["eval_cached"] = {"s": seconds, "pairs": args.n}
    listed = {"sqlite": fresh["sqlite"]("listing")}
    _kvjudge(child, "listing_ingest", "ingest", str(listing), "--store", listed["sqlite"])
    listed["postgresql"] = fresh["postgresql"]("listing")
    _, copied = _kvjudge(child, "copy_listing", "store", "copy", listed["sqlite"], listed["postgresql"])
    copies = {"listing_to_postgresql": _copy_figures(copied)}
    for kind in KINDS:
        seconds, rows = _kvjudge(child, f"runs_{kind}", "runs", "--store", listed[kind])
        steps[kind]["runs"] = {"s": seconds, "runs": len(rows)}
    to_pg, back = fresh["postgresql"]("copied"), fresh["sqlite"]("back")
    _, copied = _kvjudge(child, "copy_to_postgresql", "store", "copy", stores["sqlite"], to_pg)
    copies["sqlite_to_postgresql"] = _copy_figures(copied)
    _, copied = _kvjudge(child, "copy_to_sqlite", "store", "copy", to_pg, back)
    copies["postgresql_to_sqlite"] = _copy_figures(copied)
    bodies = _where_bodies_live(_bodies(stores["sqlite"], args.bodies_runs), fresh["postgresql"], here / "beside")
    sq, pg = steps["sqlite"], steps["postgresql"]
    ratios = {"ingest_ratio": round(pg["ingest"]["mb_per_s"] / sq["ingest"]["mb_per_s"], 2),
              "runs_ratio": round(pg["runs"]["s"] / sq["runs"]["s"], 2),
              "eval_cached_ratio": round(pg["eval_cached"]["s"] / sq["eval_cached"]["s"], 2)}
    met = {"ingest_ratio": ratios["ingest_ratio"] >= TARGETS["ingest_ratio_min"],
           "runs_ratio": ratios["runs_ratio"] <= TARGETS["runs_ratio_max"],
           "eval_cached_ratio": ratios["eval_cached_ratio"] <= TARGETS["eval_cached_ratio_max"]}
    return {"benchmark": "lab_store", "n": args.n, "runs_ingested": 2 * args.n, "mb": round(size / 1e6, 1),
            "listing_runs": args.listing_runs, **ratios, "copy_mb_per_s": copies, "bodies": bodies,
            "steps": steps, "targets": TARGETS, "met": met,
            "postgresql": "--store-url" if args.store_url else "started here (system PostgreSQL, fsync on)"}


def _copy_figures(report: dict[str, Any]) -> dict[str, Any]:
    """What a copy moved and how fast: body MB/s, and runs a second (a store of small runs copies at that rate)."""
    runs_per_s = round(report["runs_copied"] / report["seconds"], 1) if report["seconds"] else None
    return {**{key: report[key] for key in ("runs_copied", "events", "bytes", "seconds", "mb_per_s")},
            "runs_per_s": runs_per_s}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--n", type=int, default=500, help="trajectories per agent (default 500: 1,000 runs)")
    parser.add_argument("--listing-runs", type=int, default=None,
                        help="runs the listing step lists (default 10,000; 20 with --small)")
    parser.add_argument("--bodies-runs", type=int, default=200, help="runs whose bodies the bodies step writes")
    parser.add_argument("--small", action="store_true", help="N = 1 and 20 listed runs (a smoke run)")
    parser.add_argument("--store-url", help="a PostgreSQL server to create databases on (default: start one here)")
    parser.add_argument("--work", type=Path, help="keep generated runs here between runs")
    args = parser.parse_args()
    if args.small:
        args.n = 1
    if args.listing_runs is None:
        args.listing_runs = 20 if args.small else 10_000
    args.out.mkdir(parents=True, exist_ok=True)
    work = args.work or Path(tempfile.mkdtemp(prefix="kvjudge-lab-store-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        with _postgres(args.store_url) as postgres:
            result = measure(args, work, {"sqlite": _sqlite(work), "postgresql": postgres})
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    (args.out / "lab_store.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
