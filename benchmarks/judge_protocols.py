"""The judge protocols side by side: what each costs a verdict and what it reads back.

1. **The simulated judge** (:mod:`kvjudge.testing.sim_judge`, in a thread of this process, vLLM's API): ``--tasks``
   SWE-bench-shaped tasks, each with a resolved and an unresolved run (:mod:`kvjudge.testing.graded_runs`), each run
   a latent quality ``0.6 / 0.4 ± N(0, 0.05)`` by grade; scale readings with noise σ = 0.15, letter answers right with
   probability 0.8. Per protocol (the default rubric's three criteria, K = 1): calls and prompt tokens per verdict
   (a pair's, or a run's for pointwise: the server's own ``usage.prompt_tokens``), and what it reads back —
   pairwise accuracy (p_a on the better run's side) and the AUC of p_a, or for pointwise the ROC AUC of P(success)
   and its ECE.
2. **The bundled judge** (Qwen2.5-Coder-0.5B-Instruct, in-process llama-cpp-python) on the demo's sample runs (every
   same-task pair, and every run for pointwise), each protocol as it is — no prompt or threshold tuned to these
   runs: coverage, accuracy against the held-out grades or AUC, mean label mass, calls and seconds.

Prints one JSON line (and writes ``judge_protocols.json`` to ``--out``)::

    python benchmarks/judge_protocols.py [--tasks 100] [--no-model] [--out DIR]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from kvjudge.judge import Judge, judge_batch, open_servers
from kvjudge.judge.critic_eval import score_figures
from kvjudge.judge.evaluate import evaluate, grade_score
from kvjudge.judge.pairing import ALL, same_task_pairs
from kvjudge.judge.pointwise import score_runs, summarize_scores
from kvjudge.judge.protocols import PROTOCOLS, make_protocol
from kvjudge.judge.metrics import roc_auc
from kvjudge.retention import Store, ingest_paths
from kvjudge.testing.graded_runs import swe_run
from kvjudge.testing.sim_judge import AnswerKey, Settings, SimJudgeServer


def _sim_world(root: Path, tasks: int) -> tuple[Path, AnswerKey, list[Any]]:
    rng = random.Random(7)
    runs = [swe_run(f"{side}/t{n}", task=f"t{n}", passed=side == "pass", seed=n, explore=1, file_lines=20)
            for n in range(tasks) for side in ("pass", "fail")]
    key = AnswerKey([dataclasses.replace(r.key, quality=(0.6 if r.key.grade else 0.4) + rng.gauss(0, 0.05))
                     for r in runs])
    path = root / "sim.sqlite"
    source = root / "sim.jsonl"
    source.write_text("".join(json.dumps(r.run) + "\n" for r in runs))
    with Store.open(path) as store:
        ingest_paths(store, [source])
    return path, key, runs


def _pairwise_figures(verdicts: list[Any], better_first: dict[tuple[str, str], bool]) -> dict[str, Any]:
    scored = [v for v in verdicts if v.p_a is not None]
    right = [(v.p_a > 0.5) == better_first[(v.a, v.b)] for v in scored]
    return {"verdicts": len(verdicts), "scored": len(scored),
            "accuracy": sum(right) / len(right) if right else None,
            "auc_p_a": roc_auc([v.p_a for v in scored], [int(better_first[(v.a, v.b)]) for v in scored])}


def simulated(root: Path, tasks: int) -> dict[str, Any]:
    path, key, runs = _sim_world(root, tasks)
    pairs = [(runs[i].id, runs[i + 1].id) if (i // 2) % 2 == 0 else (runs[i + 1].id, runs[i].id)
             for i in range(0, len(runs), 2)]
    better_first = {pair: pair[0].startswith("pass") for pair in pairs}
    out: dict[str, Any] = {"tasks": tasks, "runs": len(runs), "sigma": 0.15, "letter_accuracy_set": 0.8}
    with SimJudgeServer(key, Settings(sigma=0.15, accuracy=0.8, seed=3)) as server, Store.open(path) as store:
        for name, cls in PROTOCOLS.items():
            judge = Judge(open_servers([server.url], n_ctx=32768, parallel=4), protocol=make_protocol(name))
            started = time.perf_counter()
            try:
                if cls.kind == "pointwise":
                    scores = score_runs(judge, store, [r.id for r in runs])
                    tokens = sum(r.prompt_tokens for s in scores for r in s.readings)
                    figures = score_figures(scores, {r.id: r.key.grade for r in runs})
                    read = {"auc": figures["auc"], "auc_ci95": figures["auc_ci95"], "ece": figures["ece"],
                            "brier": figures["brier"]}
                    units = len(scores)
                else:
                    verdicts = judge_batch(judge, store, pairs)
                    tokens = sum(o.prompt_tokens for v in verdicts for o in v.orders)
                    read = _pairwise_figures(verdicts, better_first)
                    units = len(verdicts)
            finally:
                judge.backend.close()
            out[name] = {"unit": "run" if cls.kind == "pointwise" else "pair", "calls_per_verdict": judge.protocol.calls,
                         "prompt_tokens_per_verdict": round(tokens / units, 1),
                         "seconds": round(time.perf_counter() - started, 2), **read}
    return out


def bundled(root: Path) -> dict[str, Any]:
    """The bundled judge on the demo's sample runs, each protocol as it is."""
    from kvjudge.demo import sample_runs_path
    from kvjudge.settings import Settings as KvSettings
    from kvjudge.target import JudgeTarget

    path = root / "demo.sqlite"
    with Store.open(path) as store:
        run_ids = ingest_paths(store, [sample_runs_path()]).runs
        for run_id in run_ids:
            store.events.mark(run_id, "grading")
            store.events.mark(run_id, "graded")
    out: dict[str, Any] = {}
    with Store.open(path) as store:
        states = {run_id: store.runs.run(run_id) for run_id in run_ids}
        pairs = same_task_pairs(states.values(), policy=ALL).pairs
        out["runs"], out["pairs"] = len(run_ids), len(pairs)
        target = JudgeTarget.resolve(KvSettings())
        for name, cls in PROTOCOLS.items():
            print(f"bundled judge: {name} on {len(pairs)} pairs / {len(run_ids)} runs…", file=sys.stderr, flush=True)
            judge = target.open_judge(protocol=name, certify=False)  # each window size certified: minutes on CPU
            started = time.perf_counter()
            try:
                if cls.kind == "pointwise":
                    scores = score_runs(judge, store, run_ids, states=dict(states))
                    figures = score_figures(scores, {r: grade_score(states[r]) for r in run_ids})
                    summary = summarize_scores(scores)
                    out[name] = {"coverage": summary["coverage"], "auc": figures["auc"], "ece": figures["ece"],
                                 "mean_label_mass": summary["mean_label_mass"], "outcomes": summary["outcomes"],
                                 "errors": sorted({s.error for s in scores if s.error})[:3]}
                else:
                    verdicts = judge_batch(judge, store, pairs, states=dict(states))
                    result = evaluate(store, verdicts, states)
                    figures = result["judge"]
                    out[name] = {"graded_pairs": result["graded_pairs"], "coverage": figures["coverage"],
                                 "accuracy_ties_half": figures["accuracy_ties_half"],
                                 "accuracy_ties_half_ci95": figures["accuracy_ties_half_ci95"],
                                 "auc_p_a": result["score"]["auc"], "mean_label_mass": figures["mean_label_mass"],
                                 "outcomes": dict(Counter(v.outcome for v in verdicts)),
                                 "errors": sorted({v.error for v in verdicts if v.error})[:3]}
                out[name].update(calls=judge.backend.calls, seconds=round(time.perf_counter() - started, 1))
            finally:
                judge.backend.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=100)
    parser.add_argument("--no-model", action="store_true", help="skip the bundled judge")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        root = Path(work)
        result = {"benchmark": "judge_protocols", "simulated": simulated(root, args.tasks)}
        if not args.no_model:
            result["bundled_judge"] = bundled(root)
    line = json.dumps(result)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "judge_protocols.json").write_text(line + "\n")
    print(line)


if __name__ == "__main__":
    main()
