"""Does the lean HTTP/1.1 transport earn its place beside httpx? A full ``kvjudge eval`` against the simulated judge,
end to end, with it and without it.

The workload: ``--pairs`` same-task pairs of SWE-bench-shaped graded runs (:mod:`kvjudge.testing.graded_runs`),
ingested once; a simulated judge (:mod:`kvjudge.testing.sim_judge`) on 127.0.0.1, certified with
``kvjudge probe --server``. Each trial copies the ingested store afresh (no cached count, no cached verdict) and runs
``python -m kvjudge eval --server URL`` in a child process: the tokens counted through the server's ``/tokenize``
(one request per body), both orders of every pair judged, the figures computed — then the same command again, every
verdict from the cache (what a re-run costs: identification, the cache look-up). The two transports take turns:

- **lean**: kvjudge as shipped: identification and tokenize requests over the lean keep-alive connection
  (:mod:`kvjudge.server_client.lean`), completions over httpx;
- **httpx**: every request over httpx (the lean transport switched off in the child).

Reported (one JSON line): the median wall seconds of each, the share of the httpx run's wall time the lean transport
saves, and the decision by the rule of issue 38: keep it only if it saves at least a tenth of the full eval.

    python benchmarks/http_client.py [--pairs 150] [--trials 3] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from kvjudge.testing.graded_runs import swe_run, write_graded
from kvjudge.testing.sim_judge import AnswerKey, Settings, SimJudgeServer

RULE_SHARE = 0.10  # issue 38: the hand-written path stays only if it saves at least this share of the command
_CHILD = ("import sys\n"
          "if sys.argv[1] == 'httpx':\n"
          "    import kvjudge.server_client.client as client\n"
          "    client.direct = lambda url: False  # every request over httpx\n"
          "from kvjudge.cli import main\n"
          "sys.exit(main(sys.argv[2:]))\n")


def _eval(transport: str, url: str, store: Path, png: Path) -> float:
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", _CHILD, transport, "eval", "--server", url, "--store", str(store),
                           "--png", str(png), "--json"], capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"eval failed ({transport}): {done.stderr[-2000:]}")
    return seconds


def run(pairs: int, trials: int, out: Path) -> dict[str, Any]:
    runs = [run for n in range(pairs) for run in (
        swe_run(f"t{n}/a", task=f"t{n}", passed=True, seed=n, explore=3, file_lines=40),
        swe_run(f"t{n}/b", task=f"t{n}", passed=False, seed=n, explore=3, file_lines=40))]
    runs_file, key = write_graded(out, runs)
    ingested = out / "ingested.sqlite"
    subprocess.run([sys.executable, "-m", "kvjudge", "ingest", str(runs_file), "--store", str(ingested), "--json"],
                   check=True, capture_output=True)
    times: dict[str, dict[str, list[float]]] = {t: {"full": [], "cached": []} for t in ("lean", "httpx")}
    with SimJudgeServer(AnswerKey.load(key), Settings()) as server:
        subprocess.run([sys.executable, "-m", "kvjudge", "probe", "--server", server.url, "--json"], check=True,
                       capture_output=True)
        for trial in range(trials):
            order = ("lean", "httpx") if trial % 2 == 0 else ("httpx", "lean")
            for transport in order:
                store = out / f"store-{transport}.sqlite"
                for suffix in ("", "-wal", "-shm"):
                    Path(str(store) + suffix).unlink(missing_ok=True)
                shutil.copy(ingested, store)
                times[transport]["full"].append(_eval(transport, server.url, store, out / "eval.png"))
                times[transport]["cached"].append(_eval(transport, server.url, store, out / "eval.png"))
    median = {t: {kind: round(statistics.median(values), 3) for kind, values in kinds.items()}
              for t, kinds in times.items()}
    saving_full = (median["httpx"]["full"] - median["lean"]["full"]) / median["httpx"]["full"]
    saving_cached = (median["httpx"]["cached"] - median["lean"]["cached"]) / median["httpx"]["cached"]
    return {"benchmark": "http_client", "pairs": pairs, "trials": trials, "calls": 2 * pairs,
            "lean_s": median["lean"], "httpx_s": median["httpx"],
            "saving_share_full_eval": round(saving_full, 4), "saving_share_cached_eval": round(saving_cached, 4),
            "rule_share": RULE_SHARE, "keep_lean": saving_full >= RULE_SHARE, "samples_s": times}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, default=150)
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="kvjudge-http-client-"))
    out.mkdir(parents=True, exist_ok=True)
    print(json.dumps(run(args.pairs, args.trials, out)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
