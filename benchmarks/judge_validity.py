"""Is the judge right? Judge vs baselines against held-out grades, framing and held-out verifier, still-grades.

On the demo's sample runs (default) or any labelled store (``--store PATH``: runs with grades), every
same-task pair is judged with the judge model at the certified context of this device, and scored with
:func:`kvjudge.judge.evaluate.evaluate` against the grades the judge never saw, beside the baselines
(always-first, longer-run-wins, last-exit-code-0-wins) computed on the same pairs:

1. **framing**: the model's chat template vs the raw framing (verifier results hidden);
2. **held out vs shown**: the chat framing with verifier results shown to the judge (the answer key, when
   grades derive from the verifier: the gap is how much a judge could "win" by reading it);
3. **still grades**: pairs whose full views fit a window up to the analytic bound of a larger memory budget
   (``--full-context``, default 2048: that window alone is certified), judged from the full runs and from views
   reduced to the retention ceiling (``max_context_tokens // 2`` of the certified entry) at the certified
   context; agreement over the pairs whose views really differ.

The bundled 0.5B judge is not expected to beat the baselines; the figures are reported as measured.
Writes ``judge_validity.json`` and ``judge_validity.png`` (reliability per setting) to ``--out``; prints the
JSON as one line.

    python benchmarks/judge_validity.py --out /tmp/bench [--store PATH] [--model PATH] [--context-target 1024]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from kvjudge.judge import Judge, LlamaBackend, WindowPlanner, still_grades
from kvjudge.judge.window import window_tokens
from kvjudge.judge.evaluate import evaluate, plot_reliability
from kvjudge.models import judge_model_path
from kvjudge.probe import CapabilityLookup, RuntimeSettings, memory_needed, probe
from kvjudge.retention import Store, ingest_paths

# (template, verifier shown): the model's own framing, the raw one, and its own with the answer key shown.
SETTINGS = (("auto", False), ("raw", False), ("auto", True))


def _sample_store(directory: Path) -> Path:
    from kvjudge.demo import sample_runs_path

    path = directory / "sample.sqlite"
    with Store.open(path) as store:
        for run_id in ingest_paths(store, [sample_runs_path()]).runs:
            store.events.mark(run_id, "grading")
            store.events.mark(run_id, "graded")
    return path


def _pairs(store: Store) -> list[tuple[str, str]]:
    from kvjudge.judge.pairing import same_task_pairs

    return same_task_pairs(store.runs.iter_runs()).pairs


def _planner(backend: LlamaBackend, memory_budget: int) -> WindowPlanner:
    """The window planner of ``backend`` reading (and recording) its capability entry under ``memory_budget``."""
    return WindowPlanner(backend, capabilities=CapabilityLookup(memory_budget=memory_budget))


def _summary(result: dict[str, Any]) -> dict[str, Any]:
    def pick(m: dict[str, Any]) -> dict[str, Any]:
        keys = ("pairs", "coverage", "accuracy_ties_half", "accuracy_ties_half_ci95", "accuracy_decisive",
                "accuracy_decisive_ci95", "kappa", "position_consistency", "position_bias", "tie_rate",
                "inconsistent_rate", "mean_label_mass")
        return {k: m[k] for k in keys}

    return {"judge": pick(result["judge"]), "baselines": {k: pick(v) for k, v in result["baselines"].items()},
            "conclusion": result["conclusion"], "graded_pairs": result["graded_pairs"]}


def _progress(label: str, pairs: int) -> Any:
    """A per-call progress line on stderr (both orders of every pair: two model calls per pair)."""
    started, done = time.perf_counter(), [0]
    print(f"{label}: {pairs} pair(s), {2 * pairs} model calls…", file=sys.stderr, flush=True)

    def tick() -> None:
        done[0] += 1
        print(f"  {label}: {done[0]}/{2 * pairs} calls, {time.perf_counter() - started:.0f} s", file=sys.stderr,
              flush=True)

    return tick


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("bench-out"))
    parser.add_argument("--store", type=Path, help="a labelled store (default: the demo's sample runs)")
    parser.add_argument("--model", type=Path, help="judge model GGUF (default: the bundled judge model)")
    parser.add_argument("--context-target", type=int, default=1024,
                        help="certify the judge at the memory a context of N tokens needs (default 1024)")
    parser.add_argument("--pairs", type=int, default=0, help="judge only the first N same-task pairs (default: all)")
    parser.add_argument("--full-context", type=int, default=2048,
                        help="still grades: the full side may use a window up to N tokens (default 2048)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    model = args.model or judge_model_path()
    budget = memory_needed(model, args.context_target, settings=RuntimeSettings())
    entry = probe(model, memory_budget=budget, certify=True).entry
    results: dict[str, Any] = {"model": model.name, "context_target": args.context_target,
                               "max_context_tokens": entry.max_context_tokens, "safe_context": entry.safe_context}
    with tempfile.TemporaryDirectory(prefix="kvjudge-validity-") as scratch:
        store_path = args.store or _sample_store(Path(scratch))
        with Store.open(store_path) as store:
            pairs = _pairs(store)[:args.pairs] if args.pairs else _pairs(store)
            results["store"] = str(args.store) if args.store else "demo sample runs"
            results["pairs"] = len(pairs)
            evaluations: dict[str, dict[str, Any]] = {}
            backend = LlamaBackend(model_path=model)
            try:
                for template, shown in SETTINGS:
                    judge = Judge(backend, template=template, show_verifier=shown, use_cache=False,
                                  planner=_planner(backend, budget))
                    label = f"{judge.framing.name}, verifier {'shown' if shown else 'hidden'}"
                    if label in evaluations:
                        continue  # a model without a chat template: auto is raw
                    started = time.perf_counter()
                    verdicts = judge.judge_pairs(store, pairs, on_call=_progress(label, len(pairs)))
                    evaluations[label] = {**evaluate(store, verdicts), "seconds": time.perf_counter() - started,
                                          "n_ctx": judge.window.n_ctx if judge.window else None}
                # Still grades on views that really differ: pairs whose full views fit the larger analytic window.
                full_budget = memory_needed(model, args.full_context, settings=RuntimeSettings())
                judge = Judge(backend, use_cache=False, planner=_planner(backend, full_budget))
                ceiling = entry.max_context_tokens // 2
                uncut = [(a, b) for a, b in pairs
                         if window_tokens(judge.needed_tokens(judge.base(store, a, full=True),
                                                              judge.base(store, b, full=True)))
                         <= args.full_context]
                full = judge.judge_pairs(store, uncut, full=True, bound="analytic",
                                         on_call=_progress("still grades, full views", len(uncut)))
                full_n_ctx = judge.window.n_ctx if judge.window else None
                judge.planner = _planner(backend, budget)  # the reduced side: certified context
                reduced = judge.judge_pairs(store, uncut, reduce_to=ceiling,
                                            on_call=_progress("still grades, reduced views", len(uncut)))
                comparisons, summary = still_grades(full, reduced)
                results["still_grades"] = {
                    "reduce_to": ceiling, "pairs_uncut": len(uncut), "pairs_full_cut": len(pairs) - len(uncut),
                    "full_n_ctx": full_n_ctx, "reduced_n_ctx": judge.window.n_ctx if judge.window else None,
                    "summary": {k: summary[k] for k in ("pairs", "compared", "full_cut", "same_views", "agreement",
                                                        "flips", "kappa", "mean_abs_delta_p_a", "max_abs_delta_p_a")},
                    "per_pair": [{"a": c.full.a, "b": c.full.b, "view_tokens": c.view_tokens(),
                                  "full": c.full.outcome, "reduced": c.reduced.outcome,
                                  "p_a": [c.full.p_a, c.reduced.p_a], "compared": c.compared}
                                 for c in comparisons]}
            finally:
                backend.close()
    results["settings"] = {label: {**_summary(e), "seconds": round(e["seconds"], 1), "n_ctx": e["n_ctx"]}
                           for label, e in evaluations.items()}
    plot_reliability(evaluations, args.out / "judge_validity.png")
    (args.out / "judge_validity.json").write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
