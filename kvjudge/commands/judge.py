"""`kvjudge judge`: pairwise verdicts on runs in the store, and the still-grades check.

    kvjudge judge RUN_A RUN_B [--still-grades] [--model PATH | --server URL] [--n-ctx N] [--json]
    kvjudge judge --pairs FILE.jsonl        (lines {"a": RUN, "b": RUN})
    kvjudge judge --task TASK               (every pair of runs on one task)

With ``--json``: one JSON object per pair, then one ``{"summary": …}`` object.
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path
from typing import Any

from kvjudge.commands._common import (
    add_output_args,
    add_store_args,
    config_from,
    emit,
    info,
    open_store,
    print_table,
    progress,
)
from kvjudge.config import Config
from kvjudge.errors import UsageError
from kvjudge.judge import (
    DEFAULT_MARGIN,
    Judge,
    LlamaBackend,
    StillGrades,
    Verdict,
    open_backend,
    still_grades_summary,
    summarize_verdicts,
)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "judge", help="judge pairs of runs with a local model (both orders, forced choice), and check that "
                      "reduced runs still grade",
        description="Judge which of two runs is better from the model's own next-token probabilities, asked in "
                    "both orders. Outcomes: a, b, tie, inconsistent (the orders disagree), overflow, error.")
    parser.add_argument("runs", nargs="*", metavar="RUN", help="two run ids: RUN_A RUN_B")
    parser.add_argument("--pairs", metavar="FILE", help='JSONL file of pairs, one {"a": RUN, "b": RUN} per line')
    parser.add_argument("--task", metavar="TASK", help="judge every pair of runs on this task id")
    parser.add_argument("--still-grades", action="store_true",
                        help="judge each pair from the full runs and from the reduced runs; report agreement")
    parser.add_argument("--reduce-to", type=int, metavar="N",
                        help="with --still-grades: reduce views to N tokens (default: the effective ceiling, "
                             "min(configured, max_context_tokens // 2))")
    backend = parser.add_mutually_exclusive_group()
    backend.add_argument("--model", metavar="PATH", help="judge model GGUF (default: [judge] model, else the "
                                                         "default judge model)")
    backend.add_argument("--server", metavar="URL", help="OpenAI-compatible server (llama.cpp, vLLM) instead of "
                                                         "in-process llama-cpp-python")
    parser.add_argument("--tokenizer-model", metavar="PATH",
                        help="with --server: a local copy of the served GGUF, to count tokens without the server")
    parser.add_argument("--n-ctx", type=int, metavar="N", help="context size (may only lower the certified one)")
    parser.add_argument("--threads", type=int, metavar="N", help="CPU threads (default: [judge] threads or "
                                                                 "llama-cpp-python's default)")
    parser.add_argument("--margin", type=float, metavar="M",
                        help=f"tie margin on |p_a - 0.5| (default: [judge] margin or {DEFAULT_MARGIN})")
    parser.add_argument("--show-grades", action="store_true", help="show recorded grades to the judge "
                                                                   "(experiments only)")
    parser.add_argument("--no-cache", action="store_true", help="do not read or write cached judgments")
    add_store_args(parser)
    add_output_args(parser)
    parser.set_defaults(func=_judge)


def _pairs_from_file(path: str) -> list[tuple[str, str]]:
    file = Path(path)
    if not file.is_file():
        raise UsageError(f"pairs file {file} does not exist; pass a JSONL file of {{\"a\": RUN, \"b\": RUN}} lines")
    pairs: list[tuple[str, str]] = []
    for number, line in enumerate(file.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except ValueError as exc:
            raise UsageError(f"{file}:{number}: not JSON ({exc.args[0]}); each line is {{\"a\": RUN, \"b\": RUN}}") \
                from exc
        if not isinstance(item, dict) or not isinstance(item.get("a"), str) or not isinstance(item.get("b"), str):
            raise UsageError(f"{file}:{number}: needs string fields \"a\" and \"b\" (run ids)")
        pairs.append((item["a"], item["b"]))
    if not pairs:
        raise UsageError(f"pairs file {file} holds no pairs")
    return pairs


def _pairs(args: argparse.Namespace, store: Any) -> list[tuple[str, str]]:
    chosen = sum([bool(args.runs), args.pairs is not None, args.task is not None])
    if chosen != 1:
        raise UsageError("name the pairs one way: RUN_A RUN_B, --pairs FILE or --task TASK")
    if args.runs:
        if len(args.runs) != 2:
            raise UsageError(f"judge takes two run ids (RUN_A RUN_B), got {len(args.runs)}")
        pairs = [(args.runs[0], args.runs[1])]
    elif args.pairs is not None:
        pairs = _pairs_from_file(args.pairs)
    else:
        on_task = sorted(state.id for state in store.iter_runs() if state.task_id == args.task)
        if len(on_task) < 2:
            raise UsageError(f"task {args.task!r} has {len(on_task)} run(s) in the store; a pair needs two")
        pairs = list(itertools.combinations(on_task, 2))
    for a, b in pairs:
        if a == b:
            raise UsageError(f"pair ({a}, {b}) names one run twice; a judge compares two runs")
        for run_id in (a, b):
            store.run(run_id)  # an unknown run is an error before any model call (StoreError names it)
    return pairs


def _reduce_target(args: argparse.Namespace, config: Config, store: Any, pairs: list[tuple[str, str]],
                   backend: Any) -> dict[str, int]:
    """Per-tenant token target of the reduced side of --still-grades (the effective ceiling by default)."""
    tenants = {store.run(run_id).tenant for pair in pairs for run_id in pair}
    if args.reduce_to is not None:
        if args.reduce_to <= 0:
            raise UsageError(f"--reduce-to must be a positive number of tokens, got {args.reduce_to}")
        return {tenant: args.reduce_to for tenant in tenants}
    from kvjudge.budget import configured_ceiling, effective_ceiling
    from kvjudge.probe import lookup_capability

    if not isinstance(backend, LlamaBackend):
        raise UsageError("with --server, --still-grades needs --reduce-to N (the probe figures are per local model)")
    entry = lookup_capability(backend.model_path)
    max_context = None if entry is None else entry.max_context_tokens
    # Never the configured ceiling alone: without a probe figure effective_ceiling raises CapabilityMissing.
    return {tenant: effective_ceiling(configured_ceiling(config, tenant), max_context).effective
            for tenant in tenants}


def _judge(args: argparse.Namespace) -> int:

    config = config_from(args)
    margin = args.margin if args.margin is not None else config.get("judge.margin", (int, float), DEFAULT_MARGIN)
    if args.tokenizer_model and not args.server:
        raise UsageError("--tokenizer-model only applies with --server")
    with open_store(args, config) as store:
        pairs = _pairs(args, store)
        info("loading the judge backend…")
        with progress("probing the judge model", None) as advance:
            backend = open_backend(model=args.tokenizer_model if args.server else args.model,
                                   server=args.server, n_ctx=args.n_ctx, threads=args.threads, config=config,
                                   progress=lambda message: advance(0, description=message))
        try:
            judge = Judge(backend, margin=float(margin), show_grades=args.show_grades, use_cache=not args.no_cache)
            targets = _reduce_target(args, config, store, pairs, backend) if args.still_grades else {}
            calls = len(pairs) * 2 * (2 if args.still_grades else 1)
            verdicts: list[Verdict] = []
            results: list[StillGrades] = []
            with progress("judging", calls) as advance:
                for a, b in pairs:
                    if args.still_grades:
                        target = targets[store.run(a).tenant]
                        full = judge.judge_pair(store, a, b, full=True, on_call=advance)
                        reduced = judge.judge_pair(store, a, b, reduce_to=target, on_call=advance)
                        results.append(StillGrades(full, reduced))
                        _emit_pair(args, results[-1].reduced, results[-1])
                    else:
                        verdicts.append(judge.judge_pair(store, a, b, on_call=advance))
                        _emit_pair(args, verdicts[-1], None)
            summary = (still_grades_summary(results) if args.still_grades else summarize_verdicts(verdicts))
            summary["prefix_tokens_saved"] = getattr(backend, "tokens_saved", 0)
            summary["allowance"] = judge.allowance
            if args.still_grades:
                summary["reduce_to"] = targets
        finally:
            backend.close()
    emit(args, {"summary": summary}, lambda: _print_summary(summary, args.still_grades))
    return 0


def _emit_pair(args: argparse.Namespace, verdict: Verdict, still: StillGrades | None) -> None:
    payload = verdict.to_json()
    if still is not None:
        payload.update({"full": still.full.to_json(), "held": still.held, "flipped": still.flipped,
                        "delta_p_a": still.delta_p_a})
    emit(args, payload, lambda: _print_pair(verdict, still))


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _print_pair(verdict: Verdict, still: StillGrades | None) -> None:
    def row(label: str, v: Verdict) -> list[Any]:
        return [label, v.outcome, _fmt(v.p_a), _fmt(v.p_a_by_order.get("ab")), _fmt(v.p_a_by_order.get("ba")),
                f"{v.tokens['a'].view}/{v.tokens['b'].view}", "yes" if v.further_reduced else "no",
                "yes" if v.cached else "no", f"{v.seconds:.1f}"]

    columns = ["view", "outcome", "p_a", "a first", "b first", "tokens a/b", "further", "cached", "s"]
    rows = [row("full", still.full), row("reduced", still.reduced)] if still is not None else [row("as stored", verdict)]
    print_table(columns, rows, title=f"{verdict.a} vs {verdict.b}")
    if still is not None:
        held = {True: "yes", False: "no", None: "n/a (no score)"}[still.held]
        print(f"winner held: {held}   Δp_a: {_fmt(still.delta_p_a)}")
    for v in ([still.full, still.reduced] if still is not None else [verdict]):
        if v.error:
            print(f"  {v.outcome}: {v.error}")
        for note in v.notes:
            print(f"  note: {note}")


def _print_summary(summary: dict[str, Any], still: bool) -> None:
    if still:
        rows = [["pairs", summary["pairs"]], ["comparable", summary["comparable"]],
                ["agreement", _fmt(summary["agreement"])], ["flips", summary["flips"]],
                ["Cohen's kappa", _fmt(summary["kappa"])], ["mean |Δp_a|", _fmt(summary["mean_abs_delta_p_a"])],
                ["coverage full / reduced", f"{_fmt(summary['coverage']['full'])} / "
                                            f"{_fmt(summary['coverage']['reduced'])}"],
                ["position consistency full / reduced", f"{_fmt(summary['position_consistency']['full'])} / "
                                                        f"{_fmt(summary['position_consistency']['reduced'])}"]]
    else:
        outcomes = ", ".join(f"{k} {v}" for k, v in summary["outcomes"].items() if v)
        rows = [["pairs", summary["pairs"]], ["outcomes", outcomes], ["coverage", _fmt(summary["coverage"])],
                ["position consistency", _fmt(summary["position_consistency"])],
                ["cached", summary["cached"]], ["further reduced", summary["further_reduced"]]]
    rows.append(["prefix tokens saved", summary["prefix_tokens_saved"]])
    print_table(["", "value"], rows, title="summary")
