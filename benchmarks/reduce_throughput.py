"""Reduction throughput against the bare tokenizer on the same text, RSS as the store grows, and the no-op.

A store is filled with ``--tokens`` tokens (estimated at 4 characters each while building) of real text:
the Python standard library's sources, one file per tool output, over graded runs of ``--run-tokens``
each (every run also has a dead branch). Then, with the judge model's tokenizer (``--counter model``,
the default; or ``tiktoken``):

- **bare**: the counter alone over every body of a run (the floor: reduction must count each body once);
- **reduce**: ``reduce_run`` on that run to the effective ceiling (``--target``; default: the judge
  model's real bound on this device, ``min(200k, max_context_tokens // 2)``), RSS sampled after each run.
  Bare and reduce alternate run by run so both see the same load on a shared machine;
- **no-op**: the same reduction again — it must append nothing and count nothing (counts are stored
  per (blob, counter)).

Ratio = reduce tokens/s ÷ bare tokens/s, same text, same run (target ≥ 0.9: reduction counts each body once and
each extract it keeps once, and the extracts are a small part of the text). RSS must stay flat as the store
grows (runs are streamed, never the whole store). Writes ``reduce_throughput.json`` and
``reduce_rss.png`` to ``--out`` and prints the JSON as one line.

    python benchmarks/reduce_throughput.py --out /tmp/bench [--tokens 10000000] [--counter model]
"""

from __future__ import annotations

import argparse
import json
import sysconfig
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil

from kvjudge.budget import DEFAULT_CEILING, effective_ceiling
from kvjudge.models import judge_model_path
from kvjudge.retention import Store
from kvjudge.retention.ingest import parse_native
from kvjudge.retention.ingest.importer import write_parsed
from kvjudge.retention.reduce_apply import reduce_run
from kvjudge.retention.verify import verify
from kvjudge.tokens import SplicingCounter, TokenCounter, TokenEnds, make_counter

MIB = 1024 * 1024


class Tally:
    """Wraps a counter and counts the tokenizer calls (the no-op must make none); it passes the counter's token
    ends on, as reduction asks a local tokenizer for them."""

    def __init__(self, inner: TokenCounter) -> None:
        self.inner = inner
        self.calls = 0

    @property
    def name(self) -> str:
        return self.inner.name

    def count(self, text: str) -> int:
        self.calls += 1
        return self.inner.count(text)

    def token_ends(self, text: str) -> TokenEnds | None:
        """The inner counter's token ends (one tokenizer call), when it can say where its tokens end."""
        if not isinstance(self.inner, SplicingCounter):
            return None
        self.calls += 1
        return self.inner.token_ends(text)


def stdlib_texts() -> Iterator[tuple[str, str]]:
    """(name, text) of every stdlib .py file, in a fixed order, cycling with a marker when exhausted."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.rglob("*.py") if "site-packages" not in p.parts)
    cycle = 0
    while True:
        for path in files:
            try:
                text = path.read_text(encoding="utf-8")
            except (UnicodeDecodeError, OSError):
                continue
            if len(text) < 200:
                continue
            name = str(path.relative_to(root))
            # Later cycles get a distinct first line, so every body is unique (no accidental sharing).
            yield name, (f"# pass {cycle}\n" + text) if cycle else text
        cycle += 1


def build_store(path: Path, total_tokens: int, run_tokens: int) -> dict[str, Any]:
    texts = stdlib_texts()
    chars_goal = total_tokens * 4
    written = runs = bodies = 0
    rss = []
    with Store.open(path) as store:
        while written < chars_goal:
            run_id = f"bench-{runs:04d}"
            live, dead, size = [], [], 0
            while size < run_tokens * 4 and written + size < chars_goal:
                name, text = next(texts)
                entry = ({"role": "assistant", "text": f"Reading {name}.", "tool_call": {"name": "bash",
                                                                                      "arguments": f"cat {name}"},
                          "usage": {"input_tokens": size // 4, "output_tokens": 12}},
                         {"role": "tool", "tool_output": {"name": "bash", "output": text, "exit_code": 0}})
                # Every fifth file goes to the dead branch (an abandoned attempt).
                (dead if bodies % 5 == 4 else live).extend(entry)
                size += len(text)
                bodies += 1
            run = {"id": run_id, "tenant": "bench", "task": {"id": "read-stdlib", "prompt": "Read the sources."},
                   "lifecycle": ["running", "grading", "graded"],
                   "branches": [{"id": "main", "status": "live", "transitions": live},
                                {"id": "attempt-1", "status": "dead", "parent": "main", "fork_at": 1,
                                 "transitions": dead}],
                   "verifier": [{"name": "pytest", "passed": True}], "grades": [{"grader": "bench", "score": 1.0}]}
            write_parsed(store, parse_native(run, None))
            written += size
            runs += 1
            rss.append(psutil.Process().memory_info().rss)
    return {"runs": runs, "bodies": bodies, "chars": written, "build_rss_mb": [round(r / MIB, 1) for r in rss]}


def bare_count(store: Store, run_id: str, counter: TokenCounter) -> tuple[int, float]:
    """Tokens of every body of one run and the seconds the counter alone took (reading excluded)."""
    tokens = 0
    seconds = 0.0
    for ref in store.runs.run(run_id).refs():
        body = store.blobs.get(ref)
        if body is None:
            continue
        text = body.decode("utf-8")
        start = time.perf_counter()
        tokens += counter.count(text)
        seconds += time.perf_counter() - start
    return tokens, seconds


def target_tokens(args: argparse.Namespace) -> tuple[int, dict[str, Any]]:
    if args.target:
        return args.target, {"source": "--target"}
    from kvjudge.probe import ensure_capability

    entry = ensure_capability(judge_model_path(), certify=False)
    bound = effective_ceiling(DEFAULT_CEILING, entry.max_context_tokens)
    return bound.effective, {"source": "probe", "max_context_tokens": entry.max_context_tokens,
                             "configured": bound.configured, "winner": bound.winner, "method": entry.method}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--tokens", type=int, default=10_000_000)
    parser.add_argument("--run-tokens", type=int, default=200_000)
    parser.add_argument("--counter", default="model", help="model (the judge model's tokenizer) or tiktoken")
    parser.add_argument("--target", type=int, default=0, help="reduction target (default: the real ceiling)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    counter = make_counter(args.counter, judge_model_path() if args.counter == "model" else None)
    target, target_info = target_tokens(args)

    with tempfile.TemporaryDirectory(prefix="kvjudge-bench-") as scratch:
        path = Path(scratch) / "store.sqlite"
        start = time.perf_counter()
        built = build_store(path, args.tokens, args.run_tokens)
        build_s = time.perf_counter() - start
        counter.count("warm up the tokenizer")  # model load is not throughput

        tally = Tally(counter)
        rss_after_run: list[float] = []
        tokens_before = tokens_after = events = deleted = bare_tokens = 0
        bare_s = reduce_s = 0.0
        with Store.open(path) as store:
            run_ids = store.runs.run_ids()
            for run_id in run_ids:
                # Baseline and reduction alternate run by run, so both see the same load on a shared machine.
                tokens, seconds = bare_count(store, run_id, counter)
                bare_tokens += tokens
                bare_s += seconds
                start = time.perf_counter()
                result = reduce_run(store, run_id, target, tally)
                reduce_s += time.perf_counter() - start
                tokens_before += result.plan.tokens_before
                tokens_after += result.plan.tokens_after
                events += result.appended
                deleted += result.bodies_deleted
                rss_after_run.append(psutil.Process().memory_info().rss / MIB)
            first_calls = tally.calls

            tally.calls = 0
            start = time.perf_counter()
            noop_events = sum(reduce_run(store, run_id, target, tally).appended for run_id in run_ids)
            noop_s = time.perf_counter() - start
            noop_calls = tally.calls
            report = verify(store)
            db_mb = path.stat().st_size / MIB

    bare_tps = bare_tokens / bare_s
    reduce_tps = tokens_before / reduce_s
    quarter = max(1, len(rss_after_run) // 4)
    result_json = {
        "benchmark": "reduce_throughput", "counter": counter.name, "target_tokens": target, "target": target_info,
        "requested_tokens": args.tokens, "runs": built["runs"], "bodies": built["bodies"],
        "tokens_bare": bare_tokens, "tokens_before": tokens_before, "tokens_after": tokens_after,
        "build_s": round(build_s, 2), "bare_s": round(bare_s, 2), "reduce_s": round(reduce_s, 2),
        "bare_tokens_per_s": round(bare_tps), "reduce_tokens_per_s": round(reduce_tps),
        "ratio": round(reduce_tps / bare_tps, 3), "ratio_target": 0.9,
        "count_calls_first_pass": first_calls, "events_appended": events, "bodies_deleted": deleted,
        "noop_s": round(noop_s, 3), "noop_events": noop_events, "noop_count_calls": noop_calls,
        "rss_mb_first_quarter": round(max(rss_after_run[:quarter]), 1),
        "rss_mb_last_quarter": round(max(rss_after_run[-quarter:]), 1),
        "rss_mb_peak_reduce": round(max(rss_after_run), 1),
        "build_rss_mb_first_last": [built["build_rss_mb"][0], built["build_rss_mb"][-1]],
        "store_mb_after": round(db_mb, 1), "verify_ok": report.ok,
    }
    (args.out / "reduce_throughput.json").write_text(json.dumps(result_json, indent=2) + "\n")
    _plot(args.out / "reduce_rss.png", built["build_rss_mb"], rss_after_run)
    print(json.dumps(result_json))


def _plot(path: Path, build_rss: list[float], reduce_rss: list[float]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 3.5))
    axis.plot(range(1, len(build_rss) + 1), build_rss, label="building (after each run ingested)")
    axis.plot(range(1, len(reduce_rss) + 1), reduce_rss, label="reducing (after each run reduced)")
    axis.set_xlabel("runs")
    axis.set_ylabel("RSS (MiB)")
    axis.set_ylim(bottom=0)
    axis.legend()
    axis.set_title("kvjudge reduce: memory as the store grows")
    figure.tight_layout()
    figure.savefig(path, dpi=100)


if __name__ == "__main__":
    main()
