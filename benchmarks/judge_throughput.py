"""Judge throughput with the default model at a few context sizes, against plain llama-cpp-python.

For each ``n_ctx`` (default 512, 1024, 2048) a fresh store holds synthetic graded runs a little larger
than the judge's per-run allowance, so every pair goes through the whole harness: rendering, packing
(further-reduced views via ``plan_reduction``), both orders, forced-choice label probabilities. Pair by
pair, three things run back to back, taking turns at going first, so they share the same load on a
shared machine:

- **judge**: ``Judge.judge_pair`` with prefix KV reuse (the default), wall time of the whole pair;
- **plain**: a bare ``llama_cpp.Llama`` (same model, n_ctx, threads, batch) doing ``reset(); eval(tokens)``
  on exactly the token sequences the judge evaluated for that pair (the floor: no harness at all);
- **judge, no reuse**: the same pair with prefix reuse off (the harness's own overhead, undiluted).

Prompt tokens/s = prompt tokens ÷ seconds; ratio = judge ÷ plain on the same sequences (target ≥ 0.9).
Also: pairs per minute, and prompt tokens saved by prefix reuse. Judgments are not cached here.
Writes ``judge_throughput.json`` to ``--out`` and prints it as one JSON line.

    python benchmarks/judge_throughput.py --out /tmp/bench [--contexts 512,1024,2048] [--pairs 3]

``--smoke`` (the suite's smallest size): n_ctx 512, one pair, no warm-up pair; the three still run once each.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from kvjudge.judge import Judge, LlamaBackend
from kvjudge.judge.pack import pack_pair
from kvjudge.models import default_model_path
from kvjudge.retention import Store, ingest_paths
from kvjudge.testing.filler import filler
from kvjudge.testing.jsonl import write_jsonl
from kvjudge.testing.native_runs import make_run

TARGET_RATIO = 0.9


class Recording(LlamaBackend):
    """The judge's backend, also keeping the exact token sequences it evaluated (for the plain baseline)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.sequences: list[list[int]] = []

    def score(self, parts, shared: int = 0, scale=None):  # type: ignore[no-untyped-def]
        self.sequences.append(self.prompt_tokens(parts))
        return super().score(parts, shared, scale)


def _store(directory: Path, n_ctx: int, pairs: int) -> Store:
    # Runs of about 1.5 allowances of text each, so packing has to further reduce every view.
    words = max(40, int(n_ctx * 0.75 * 0.75))
    runs = []
    for index in range(2 * pairs):
        run = make_run(f"run-{index}", [filler(10 * index + 1, words // 2), filler(10 * index + 2, words // 2)],
                       passed=index % 2 == 0, final="12 passed" if index % 2 == 0 else "3 failed, 9 passed")
        run["task"]["id"] = "bench-task"
        runs.append(run)
    source = directory / f"runs-{n_ctx}.jsonl"
    write_jsonl(source, runs)
    store = Store.open(directory / f"store-{n_ctx}.sqlite")
    ingest_paths(store, [source])
    return store


def _plain_eval(llama: Any, sequences: list[list[int]]) -> float:
    started = time.perf_counter()
    for tokens in sequences:
        llama.reset()
        llama.eval(tokens)
    return time.perf_counter() - started


def run_context(model: Path, n_ctx: int, pairs: int, directory: Path, warm_up: bool = True) -> dict[str, Any]:
    from llama_cpp import Llama

    judge_backend = Recording(model_path=model, n_ctx=n_ctx)
    plain_backend = LlamaBackend(model_path=model, n_ctx=n_ctx, reuse_prefix=False)
    plain = Llama(model_path=str(model), n_ctx=n_ctx, n_batch=judge_backend.n_batch,
                  n_threads=judge_backend.n_threads, logits_all=False, verbose=False)
    judge = Judge(judge_backend, use_cache=False)
    no_reuse = Judge(plain_backend, use_cache=False)
    totals = {"judge_s": 0.0, "plain_s": 0.0, "noreuse_s": 0.0, "tokens": 0, "noreuse_tokens": 0}
    outcomes: dict[str, int] = {}
    further = 0
    with _store(directory, n_ctx, pairs) as store:
        if warm_up:  # on a throwaway pair (first-call allocations), not counted
            judge.judge_pair(store, "run-0", "run-1")
            _plain_eval(plain, judge_backend.sequences[-2:])
        for index in range(pairs):
            a, b = f"run-{2 * index}", f"run-{2 * index + 1}"
            # The exact sequences the judge will evaluate (packing is deterministic), so the plain baseline
            # can run before or after the judge: the three take turns going first, since on a shared
            # machine whichever runs first in a round tends to be slower.
            view_a, view_b = pack_pair(judge.base(store, a), judge.base(store, b), judge_backend.count, judge.room)
            assert view_a.text is not None and view_b.text is not None
            # A prompt the same in both orders (views cut to the same text) is evaluated once: the judge reads its
            # answer for both.
            sequences = [list(tokens) for tokens in dict.fromkeys(
                tuple(judge_backend.prompt_tokens(prompt.segments)) for prompt in judge.order_prompts(view_a, view_b))]

            def timed_judge() -> None:
                first = len(judge_backend.sequences)
                verdict = judge.judge_pair(store, a, b)
                assert judge_backend.sequences[first:] == sequences
                totals["judge_s"] += verdict.seconds
                totals["tokens"] += sum(len(s) for s in sequences)
                outcomes[verdict.outcome] = outcomes.get(verdict.outcome, 0) + 1
                nonlocal further
                further += verdict.further_reduced

            def timed_plain() -> None:
                totals["plain_s"] += _plain_eval(plain, sequences)

            def timed_noreuse() -> None:
                again = no_reuse.judge_pair(store, a, b)
                totals["noreuse_s"] += again.seconds
                totals["noreuse_tokens"] += sum(o.prompt_tokens for o in again.orders)

            steps = [timed_judge, timed_plain, timed_noreuse]
            for step in steps[index % 3:] + steps[: index % 3]:
                step()
    judged_tokens = totals["tokens"]
    judge_tps = judged_tokens / totals["judge_s"]
    plain_tps = judged_tokens / totals["plain_s"]
    noreuse_tps = totals["noreuse_tokens"] / totals["noreuse_s"]
    saved = judge_backend.tokens_saved
    result = {
        "n_ctx": n_ctx, "pairs": pairs, "allowance": judge.allowance,
        "instruction_tokens": judge.framing_tokens,
        "shared_prefix_tokens": len(judge_backend.prompt_tokens(judge.framing.segments("", "")[:judge.framing.shared])),
        "pairs_per_min": round(60.0 * pairs / totals["judge_s"], 2),
        "prompt_tokens": judged_tokens,
        "judge_tokens_per_s": round(judge_tps, 1), "plain_tokens_per_s": round(plain_tps, 1),
        "ratio": round(judge_tps / plain_tps, 3),
        "noreuse_tokens_per_s": round(noreuse_tps, 1), "noreuse_ratio": round(noreuse_tps / plain_tps, 3),
        "tokens_saved_by_prefix_reuse": saved,
        "saved_fraction": round(saved / (saved + judge_backend.tokens_evaluated), 3),
        "further_reduced_pairs": further, "outcomes": outcomes,
    }
    judge_backend.close()
    plain_backend.close()
    plain.close()
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="directory for judge_throughput.json")
    parser.add_argument("--contexts", default="512,1024,2048", help="comma-separated n_ctx values")
    parser.add_argument("--pairs", type=int, default=3, help="timed pairs per context (after one warm-up pair)")
    parser.add_argument("--model", help="GGUF (default: the default model)")
    parser.add_argument("--smoke", action="store_true",
                        help="the smallest run (the suite's): n_ctx 512, 1 pair, no warm-up pair")
    args = parser.parse_args()
    if args.smoke:
        args.contexts, args.pairs = "512", 1
    model = Path(args.model) if args.model else default_model_path()
    contexts = [int(value) for value in args.contexts.split(",") if value.strip()]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="kvjudge-judge-bench-") as scratch:
        rows = [run_context(model, n_ctx, args.pairs, Path(scratch), warm_up=not args.smoke) for n_ctx in contexts]
    worst = min(row["ratio"] for row in rows)
    worst_noreuse = min(row["noreuse_ratio"] for row in rows)
    payload = {"benchmark": "judge_throughput", "model": model.name, "contexts": rows,
               "ratio_min": worst, "noreuse_ratio_min": worst_noreuse, "target_ratio": TARGET_RATIO,
               "meets_target": worst >= TARGET_RATIO, "noreuse_meets_target": worst_noreuse >= TARGET_RATIO}
    (out / "judge_throughput.json").write_text(json.dumps(payload, indent=2) + "\n")
    print(json.dumps(payload))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
