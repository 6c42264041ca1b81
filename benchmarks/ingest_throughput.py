"""Ingest throughput on realistic runs of each harness, against a bare import of the same files measured in the
same run.

Cases (``--cases``; each writer below makes one, so a harness is added with one more writer in ``CASES``):

- ``trajectories``: N files of about ``--size-mb`` MB (sizes vary 0.3×–2×): mini-swe-agent v2 (tool calls) for
  most, v1 and SWE-agent for the rest, over three model names on shared instances — each with the harness's own
  system prompt and instance template (the same text in every run, stored once), and varied tool output
  (listings, source files, grep hits, pytest logs, long outputs cut by the harness's warning);
- ``mini-swe-agent``: N mini-swe-agent v1 trajectories of about ``--small-kb`` KB (the size of a short SWE-bench
  run; two models on shared instances), one file each — where per-file costs, not bytes, decide the rate;
- ``harbor``: a Harbor job of N trials (two agents, ATIF trajectories of about ``--run-mb`` MB, ``result.json``
  and the other files of each trial), from :mod:`kvjudge.testing.harbor`;
- ``inspect-eval`` / ``inspect-json``: one inspect log of N samples (zstd ``.eval``; ``.json``), from
  :mod:`kvjudge.testing.inspect_logs`;
- ``openhands``: OpenHands' SWE-bench ``output.jsonl`` of N instances (two models' evaluation folders, half each,
  on shared instances; lines of about ``--run-mb`` MB, each event with its model response), from
  :mod:`kvjudge.testing.openhands`.

For each set, in fresh child processes (each reports its own peak RSS, VmHWM, as it exits):

- **baseline**: ``json.load`` of each JSON document (each file; each line of a ``.jsonl``; each member of an
  ``.eval`` archive, inflated),
  SHA-256 of every string value of 32 bytes or more (the bodies; roles, ids and timestamps are not) and one
  SQLite ``INSERT OR IGNORE`` per body into a content-addressed table, one commit per document (WAL,
  ``synchronous=FULL``, like the store) — the least an importer can do;
- **kvjudge**: ``kvjudge ingest DIR`` — each file read and parsed once, events, projections, committed in batches
  of whole files.

Each set also reports CPU seconds (user + system: the baseline's over its timed loop, kvjudge's over the whole
command) and kvjudge's MB per CPU second: on a machine shared with other work, wall time measures the load as much
as the import, while CPU time compares two versions of kvjudge run at different moments. (The two CPU figures do
not make a ratio: the baseline waits on a commit per document, kvjudge computes more.) MB are the bytes on disk
(compressed for ``.eval``). Targets, on wall time: kvjudge MB/s ≥ 0.8 × the baseline's for trajectories, ≥ 20 MB/s
on the ``mini-swe-agent`` case, ≥ 0.6 × for each harness case; kvjudge's peak RSS at the largest N within 10 % of
the smallest; dedup savings reported. Writes ``ingest_throughput.json`` to ``--out``
and prints it as one line.

    python benchmarks/ingest_throughput.py --out /tmp/bench
        [--cases trajectories mini-swe-agent harbor inspect-eval inspect-json openhands]
        [--n 100 1000] [--small-n 1000] [--harness-n 100 500] [--size-mb 1.0] [--small-kb 40] [--run-mb 0.2]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import resource
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from kvjudge.retention.ingest.archive import Archive
from kvjudge.testing import openhands
from kvjudge.testing.harbor import TrialSpec, write_job
from kvjudge.testing.inspect_logs import eval_spec, sample, write_eval, write_json_log
from kvjudge.testing.jsonl import write_jsonl
from kvjudge.testing.trajectories import make_episode, mini_swe_agent_v1, mini_swe_agent_v2, swe_agent

MODELS = ("anthropic/claude-sonnet-4-5-20250929", "openai/gpt-5-mini", "hosted_vllm/qwen3-coder-30b")
# Bytes of tool output per byte of a written file, measured on make_episode's output (so files average
# --size-mb): v2 stores each output twice (the observation and extra.raw_output), SWE-agent too (trajectory and
# history); v1 cuts long outputs to their head and tail.
_OUTPUT_SHARE = {"v2": 0.66, "v1": 1.4, "swe": 0.63}


def generate(directory: Path, n: int, size_mb: float, seed: int) -> list[int]:
    """``n`` trajectories under ``directory/<model>/<instance>/``; their sizes."""
    rng = random.Random(seed)
    sizes = []
    for index in range(n):
        model = MODELS[index % len(MODELS)]
        instance = f"repo{index // len(MODELS) % 97}__proj-{index // len(MODELS)}"
        style = rng.choices(("v2", "v1", "swe"), weights=(6, 2, 2))[0]
        target = size_mb * 1e6 * rng.uniform(0.3, 1.7) * _OUTPUT_SHARE[style]
        episode = make_episode(instance, seed * 100_003 + index, target_bytes=int(target), model=model)
        folder = directory / model.replace("/", "__") / instance
        folder.mkdir(parents=True, exist_ok=True)
        if style == "swe":
            path, data = folder / f"{instance}.traj", swe_agent(episode)
        else:
            path = folder / f"{instance}.traj.json"
            data = mini_swe_agent_v2(episode) if style == "v2" else mini_swe_agent_v1(episode)
        path.write_text(json.dumps(data, indent=2))
        sizes.append(path.stat().st_size)
    return sizes


# A v1 trajectory of a short run is mostly fixed text (the system prompt, the instance template, the task):
# about 12.6 KB of it, and 1.12 bytes of file per byte of tool output (measured on make_episode's output).
_V1_FIXED_KB, _V1_OUTPUT_SHARE = 12.6, 1.12


def small_trajectories(directory: Path, n: int, size_kb: float, seed: int) -> list[int]:
    """``n`` mini-swe-agent v1 trajectories of about ``size_kb`` KB (two models on shared instances); their sizes."""
    rng = random.Random(seed)
    sizes = []
    for index in range(n):
        model = MODELS[index % 2]
        instance = f"repo{index // 2 % 97}__proj-{index // 2}"
        output_kb = max(1.0, (size_kb - _V1_FIXED_KB) / _V1_OUTPUT_SHARE * rng.uniform(0.6, 1.4))
        episode = make_episode(instance, seed * 100_003 + index, target_bytes=int(output_kb * 1000), model=model)
        folder = directory / model.replace("/", "__") / instance
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{instance}.traj.json"
        path.write_text(json.dumps(mini_swe_agent_v1(episode), indent=2))
        sizes.append(path.stat().st_size)
    return sizes


# Bytes of tool output per byte of a run, measured on the writers' output: a Harbor trial holds each output
# once (its observation); an inspect sample twice (the tool message, the tool event's attachment); an OpenHands
# line once (the observation), beside the instruction, the metrics and each action's model response.
_HARNESS_OUTPUT_SHARE = {"harbor": 0.8, "inspect": 0.45, "openhands": 0.48}


def harbor_job(directory: Path, n: int, run_mb: float, seed: int) -> list[int]:
    """A Harbor job of ``n`` trials (two agents on shared tasks, two trials each); each trial's size."""
    rng = random.Random(seed)
    job = write_job(directory, "job", [
        TrialSpec(f"task-{index // 4}", agent=("terminus-2", "claude-code")[index % 2],
                  model=MODELS[index % 2], suffix=f"{index:07d}", seed=seed * 100_003 + index,
                  reward=float(rng.random() < 0.5),
                  target_bytes=int(run_mb * 1e6 * rng.uniform(0.3, 1.7) * _HARNESS_OUTPUT_SHARE["harbor"]))
        for index in range(n)])
    return [sum(p.stat().st_size for p in trial.rglob("*") if p.is_file()) for trial in job.iterdir() if trial.is_dir()]


def _inspect_samples(n: int, run_mb: float, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    return [sample(make_episode(f"case-{index // 2}", seed * 100_003 + index, model=MODELS[0],
                                target_bytes=int(run_mb * 1e6 * rng.uniform(0.3, 1.7) * _HARNESS_OUTPUT_SHARE["inspect"])),
                   index // 2 + 1, index % 2 + 1, model=MODELS[0], score=rng.choice("CI")) for index in range(n)]


def inspect_eval(directory: Path, n: int, run_mb: float, seed: int) -> list[int]:
    """One zstd ``.eval`` log of ``n`` samples (two epochs each); its size as one entry."""
    directory.mkdir(parents=True)
    path = write_eval(directory / "log.eval", eval_spec("csv_quoting", MODELS[0], epochs=2, samples=n // 2),
                      _inspect_samples(n, run_mb, seed))
    return [path.stat().st_size]


def inspect_json(directory: Path, n: int, run_mb: float, seed: int) -> list[int]:
    """One ``.json`` log of ``n`` samples; its size as one entry."""
    directory.mkdir(parents=True)
    path = write_json_log(directory / "log.json", eval_spec("csv_quoting", MODELS[0], epochs=2, samples=n // 2),
                          _inspect_samples(n, run_mb, seed))
    return [path.stat().st_size]


def openhands_output(directory: Path, n: int, run_mb: float, seed: int) -> list[int]:
    """OpenHands ``output.jsonl`` files of ``n`` instances in all: two models' evaluation output folders, half the
    instances each, on shared instances; each file's size."""
    rng = random.Random(seed)
    sizes = []
    for number, model in enumerate(MODELS[:2]):
        lines = (openhands.output_line(make_episode(
            f"repo{index % 97}__proj-{index}", seed * 100_003 + 2 * index + number, model=model,
            target_bytes=int(run_mb * 1e6 * rng.uniform(0.3, 1.7) * _HARNESS_OUTPUT_SHARE["openhands"])), model)
            for index in range(number, n, 2))
        folder = directory / openhands.eval_metadata(model)["eval_output_dir"]
        sizes.append(write_jsonl(folder / "output.jsonl", lines).stat().st_size)
    return sizes


#: case → (writer(directory, n, size per run, seed) → sizes, target ratio, default N option, size option, target
#: MB/s or None). One writer per harness.
CASES: dict[str, tuple[Any, float, str, str, float | None]] = {
    "trajectories": (generate, 0.8, "n", "size_mb", None),
    "mini-swe-agent": (small_trajectories, 0.0, "small_n", "small_kb", 20.0),
    "harbor": (harbor_job, 0.6, "harness_n", "run_mb", None),
    "inspect-eval": (inspect_eval, 0.6, "harness_n", "run_mb", None),
    "inspect-json": (inspect_json, 0.6, "harness_n", "run_mb", None),
    "openhands": (openhands_output, 0.6, "harness_n", "run_mb", None),
}


def write_case(case: str, directory: Path, n: int, args: argparse.Namespace) -> dict[str, Any]:
    writer, _, _, size_option, _ = CASES[case]
    sizes = writer(directory, n, getattr(args, size_option), args.seed)
    return {"runs": n, "files": len(sizes), "bytes": sum(sizes), "mean_mb": round(sum(sizes) / len(sizes) / 1e6, 3),
            "min_mb": round(min(sizes) / 1e6, 3), "max_mb": round(max(sizes) / 1e6, 3)}


def baseline(directory: Path, store: Path) -> dict[str, Any]:
    """json.load + SHA-256 + one INSERT per body, one commit per file (run in a child process)."""
    conn = sqlite3.connect(store, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("CREATE TABLE IF NOT EXISTS blobs (ref TEXT PRIMARY KEY, size INTEGER NOT NULL, body BLOB)")
    files = sorted(p for p in directory.rglob("*") if p.is_file()
                   and p.suffix in (".json", ".jsonl", ".traj", ".eval"))
    bodies = 0
    started, cpu = time.perf_counter(), time.process_time()
    for data in _documents(files):
        conn.execute("BEGIN IMMEDIATE")
        for text in _strings(data):
            body = text.encode("utf-8")
            if len(body) >= 32:
                ref = "sha256:" + hashlib.sha256(body).hexdigest()
                conn.execute("INSERT OR IGNORE INTO blobs(ref, size, body) VALUES (?, ?, ?)", (ref, len(body), body))
                bodies += 1
        conn.execute("COMMIT")
    seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
    conn.close()
    return {"seconds": seconds, "cpu_seconds": cpu, "bodies": bodies}


def _documents(files: list[Path]):
    """Each file's JSON document; each line of a ``.jsonl``; each member of an ``.eval`` archive, inflated."""
    for path in files:
        if path.suffix == ".eval":
            with Archive(path) as archive:
                for name in archive.names():
                    yield json.loads(archive.read(name))
        elif path.suffix == ".jsonl":
            with path.open("rb") as handle:
                for line in handle:
                    yield json.loads(line)
        else:
            with path.open("rb") as handle:
                yield json.load(handle)


def _strings(value: Any):
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            yield item
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


# Runs a Python child and reports its own peak RSS (VmHWM) on exit. Not wait4's ru_maxrss: Linux carries the
# parent's peak across fork and exec into it, so that figure would be this benchmark's own when it is larger.
_PEAK_WRAPPER = """
import atexit, runpy, sys
def report_peak():
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                sys.stderr.write("\\n" + _MARK + " " + line.split()[1] + "\\n")
atexit.register(report_peak)
if sys.argv[1] == "-m":
    sys.argv = sys.argv[2:]
    runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
else:
    sys.argv = sys.argv[1:]
    runpy.run_path(sys.argv[0], run_name="__main__")
"""
_PEAK_MARK = "benchmark-peak-rss-kb"


def child(argv: list[str]) -> tuple[dict[str, Any], float, float, float]:
    """Run ``argv`` (``python -m MODULE …`` or ``python SCRIPT …``) to completion: (its JSON output, wall
    seconds, its CPU seconds (user + system), its own peak RSS in MiB)."""
    started = time.perf_counter()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    wrapped = [argv[0], "-c", f"_MARK = {_PEAK_MARK!r}\n{_PEAK_WRAPPER}", *argv[1:]]
    process = subprocess.Popen(wrapped, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = process.communicate()
    seconds = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    if process.returncode != 0:
        raise SystemExit(f"{' '.join(argv[:4])} … failed ({process.returncode}): {err.strip()[-2000:]}")
    peaks = [line.split()[1] for line in err.splitlines() if line.startswith(_PEAK_MARK)]
    if not peaks:
        raise SystemExit(f"{' '.join(argv[:4])} … reported no peak RSS (this benchmark reads /proc: Linux only)")
    return json.loads(out.strip().splitlines()[-1]), seconds, cpu, int(peaks[-1]) / 1024


def measure(directory: Path, work: Path, gen: dict[str, Any]) -> dict[str, Any]:
    """Both imports of ``directory`` in child processes: MB/s, CPU seconds, peak RSS, dedup."""
    mb = gen["bytes"] / 1e6
    base, base_wall, _, base_rss = child([sys.executable, __file__, "--baseline-child", str(directory),
                                          str(work / "baseline.sqlite")])
    ours, wall, cpu, rss = child([sys.executable, "-m", "kvjudge", "ingest", str(directory), "--store",
                                  str(work / "store.sqlite"), "--json"])
    return {
        **gen,
        "baseline": {"mb_per_s": round(mb / base["seconds"], 1), "seconds": round(base["seconds"], 2),
                     "cpu_seconds": round(base["cpu_seconds"], 2), "bodies": base["bodies"],
                     "peak_rss_mib": round(base_rss, 1)},
        # Wall time of the whole command (interpreter start and imports included: the user's wait).
        "kvjudge": {"mb_per_s": round(mb / wall, 1), "seconds": round(wall, 2), "cpu_seconds": round(cpu, 2),
                    "mb_per_cpu_s": round(mb / cpu, 1),
                    "peak_rss_mib": round(rss, 1),
                    "imported": ours["imported"], "dedup_saved_mb": round(ours["dedup"]["saved_bytes"] / 1e6, 1),
                    "body_mb": round(ours["dedup"]["body_bytes"] / 1e6, 1),
                    "stored_mb": round(ours["dedup"]["stored_bytes"] / 1e6, 1)},
        "ratio": round((mb / wall) / (mb / base["seconds"]), 3),
    }


def run_case(case: str, ns: list[int], args: argparse.Namespace) -> dict[str, Any]:
    results = []
    for n in ns:
        with tempfile.TemporaryDirectory(prefix="kvjudge-ingest-bench-") as temp:
            root = Path(temp)
            gen = write_case(case, root / "runs", n, args)
            results.append(measure(root / "runs", root, gen))
    outcome: dict[str, Any] = {"sets": results, "min_ratio": min(r["ratio"] for r in results),
                               "target_ratio": CASES[case][1]}
    if CASES[case][4] is not None:
        outcome["min_mb_per_s"] = min(r["kvjudge"]["mb_per_s"] for r in results)
        outcome["target_mb_per_s"] = CASES[case][4]
    if len(results) > 1:
        first, last = results[0]["kvjudge"]["peak_rss_mib"], results[-1]["kvjudge"]["peak_rss_mib"]
        outcome["rss_growth"] = round(last / first - 1, 3)
        outcome["target_rss_growth"] = 0.10
    return outcome


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("bench-out"))
    parser.add_argument("--cases", nargs="+", choices=list(CASES), default=list(CASES))
    parser.add_argument("--n", type=int, nargs="+", default=[100, 1000], help="trajectory files per set")
    parser.add_argument("--small-n", type=int, nargs="+", default=[1000], help="small trajectory files per set")
    parser.add_argument("--small-kb", type=float, default=40.0, help="mean size of a small trajectory file")
    parser.add_argument("--harness-n", type=int, nargs="+", default=[100, 500],
                        help="Harbor trials / inspect samples / OpenHands instances per set")
    parser.add_argument("--size-mb", type=float, default=1.0, help="mean size of a trajectory file")
    parser.add_argument("--run-mb", type=float, default=0.2,
                        help="mean size of a Harbor trial, an inspect sample or an OpenHands line")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--baseline-child", nargs=2, metavar=("DIR", "DB"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.baseline_child:
        print(json.dumps(baseline(Path(args.baseline_child[0]), Path(args.baseline_child[1]))))
        return
    args.out.mkdir(parents=True, exist_ok=True)
    cases = {case: run_case(case, getattr(args, CASES[case][2]), args) for case in args.cases}
    summary: dict[str, Any] = {"benchmark": "ingest_throughput", "size_mb": args.size_mb, "run_mb": args.run_mb,
                               "seed": args.seed, "cases": cases,
                               "min_ratio": min(c["min_ratio"] for c in cases.values()),
                               "targets_met": all(c["min_ratio"] >= c["target_ratio"]
                                                  and c.get("min_mb_per_s", 0) >= c.get("target_mb_per_s", 0)
                                                  and c.get("rss_growth", 0) <= 0.10 for c in cases.values())}
    (args.out / "ingest_throughput.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
