"""Probe accuracy: the KV math against llama.cpp's own figures, and the analytic ``max_context_tokens``
against the certified maximum, under a few memory budgets.

1. **KV bytes**: for each case (bundled default model, default judge model, tiny models of other shapes
   written with the gguf writer; several n_ctx / KV types / swa_full / n_seq), one child process creates the
   context and llama.cpp reports its KV caches. Target: predicted == reported on every case (compared as
   llama.cpp prints them, "%.2f MiB", per cache and per K/V). The compute-buffer estimate is reported beside.
2. **max_context_tokens**: for each (model, budget), the analytic figure and the certified maximum found by
   real runs (each trial a child process). Target: within 3%; ≤ 3 trials when the prediction is right.

Same-run baseline: the common rule of thumb ``KV = 2 · n_layer · n_ctx · n_embd · 2 bytes`` (f16, every layer
full, head size n_embd/n_head), and the context it predicts for the same budget (weights + that KV, no compute
buffer). Ratios are reported against llama.cpp's figures of the same run.

Writes ``probe_accuracy.json`` and ``probe_accuracy.md`` (every case, as Markdown tables) to ``--out`` and
prints one JSON line (the summary).

    python benchmarks/probe_accuracy.py --out /tmp/probe-bench [--quick | --smoke]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from kvjudge.models import default_model_path, judge_model_path
from kvjudge.probe import RuntimeSettings, kv_breakdown, read_model_shape
from kvjudge.probe.certify import certify, measure_allocations
from kvjudge.probe.core import footprint, max_context_tokens, place
from kvjudge.probe.devices import discover_devices
from kvjudge.probe.kv_math import CTX_PAD, MIB, compute_buffer_bytes
from kvjudge.probe.settings import parse_size

S = RuntimeSettings

KV_CASES_GEMMA = [
    (S(), 1024), (S(), 8192), (S(swa_full=False), 8192), (S(swa_full=False), 3000),
    (S(swa_full=False, n_ubatch=128), 2048), (S(type_k="q8_0", type_v="q8_0", flash_attn=True), 4096),
    (S(type_k="q4_0", type_v="q4_0", flash_attn=True, swa_full=False), 2000),
    (S(type_k="bf16", type_v="bf16", n_seq=2, swa_full=False), 3000), (S(type_k="f32", type_v="f32"), 2048),
    (S(type_k="iq4_nl", type_v="q5_1", flash_attn=True), 2048),
    (S(type_k="q5_0", type_v="q4_1", flash_attn=True, n_seq=3, swa_full=False), 3072),
]
KV_CASES_JUDGE = [
    (S(), 1024), (S(), 4096), (S(), 16384), (S(flash_attn=True), 16384), (S(type_k="q8_0"), 8192),
    (S(type_k="q4_0", type_v="q4_0", flash_attn=True), 4096), (S(n_seq=2), 6000),
]
KV_CASES_TINY = [(S(), 1024), (S(flash_attn=True), 1024), (S(type_k="bf16", n_seq=2), 1536),
                 (S(type_k="q8_0", type_v="q8_0", flash_attn=True), 2048)]

BUDGETS = [("default", "950MiB"), ("default", "980MiB"), ("default", "1000MiB"), ("judge", "960MiB")]
QUICK_BUDGETS = [("default", "930MiB"), ("judge", "940MiB")]
# The smoke run's one certification: the budget whose analytic context is the smallest that loads (256 tokens, so
# each trial fills 256-512 tokens, not 2,048-2,304: seconds, not minutes).
SMOKE_BUDGETS = [("default", "900MiB")]


def naive_kv(shape: Any, n_ctx: int) -> int:
    """The rule of thumb: every layer keeps K and V of n_embd f16 values per token."""
    return 2 * shape.n_layer * n_ctx * shape.n_embd * 2


def kv_rows(label: str, model: Path, cases: list[tuple[RuntimeSettings, int]]) -> list[dict[str, Any]]:
    shape = read_model_shape(model)
    rows = []
    for (settings, n_ctx), report in zip(cases, measure_allocations(model, cases), strict=True):
        kv = kv_breakdown(shape, n_ctx, type_k=settings.type_k, type_v=settings.type_v, n_seq=settings.n_seq,
                          swa_full=settings.swa_full, n_ubatch=settings.n_ubatch, flash_attn=settings.flash_attn)
        predicted = [f"{kv.global_bytes / MIB:.2f}"] + ([f"{kv.swa_bytes / MIB:.2f}"] if shape.uses_swa else [])
        reported = [c["mib"] for c in report["kv_caches"]]
        compute = compute_buffer_bytes(shape, n_ctx, settings)
        rows.append({
            "model": label, "n_ctx": n_ctx, "settings": settings.as_dict(),
            "predicted_kv_bytes": kv.total, "reported_kv_mib": reported, "predicted_kv_mib": predicted,
            "equal": reported == predicted and report["created"],
            "naive_kv_bytes": naive_kv(shape, n_ctx),
            "naive_ratio": naive_kv(shape, n_ctx) / max(1, report["kv_bytes"] or 1),
            "compute_estimate_bytes": compute, "compute_reported_bytes": report["compute_bytes"],
            "compute_ratio": compute / report["compute_bytes"] if report["compute_bytes"] else None,
        })
    return rows


def naive_max_context(shape: Any, usable: int) -> int:
    per_token = 2 * shape.n_layer * shape.n_embd * 2
    return max(0, min(shape.n_ctx_train, (usable - shape.weight_bytes) // per_token) // CTX_PAD * CTX_PAD)


def certification_rows(models: dict[str, Path], budgets: list[tuple[str, str]]) -> list[dict[str, Any]]:
    devices = discover_devices()
    rows = []
    for label, budget_text in budgets:
        model = models[label]
        shape = read_model_shape(model)
        settings = RuntimeSettings()
        placement = place(shape, devices, settings, memory_budget=parse_size(budget_text))
        predicted = max_context_tokens(shape, settings, placement)
        started = time.monotonic()
        result = certify(model, shape, settings, placement, start_n_ctx=predicted,
                         progress=lambda message: print(f"  {label} {budget_text}: {message}", file=sys.stderr))
        seconds = time.monotonic() - started
        certified = result.certified_n_ctx
        naive = naive_max_context(shape, placement.usable_bytes)
        rows.append({
            "model": label, "budget": budget_text, "usable_bytes": placement.usable_bytes,
            "predicted_max_context": predicted, "certified_max_context": certified,
            "ratio": predicted / certified if certified else None,
            "within_3pct": bool(certified) and abs(predicted - certified) <= 0.03 * certified,
            "naive_max_context": naive, "naive_ratio": naive / certified if certified else None,
            "trials": len(result.trials), "trial_outcomes": [(t.n_ctx, t.outcome) for t in result.trials],
            "max_ok_input": result.max_ok_input, "safe_context": result.safe_context,
            "predicted_footprint_bytes": footprint(shape, predicted, settings, placement).device_bytes,
            "measured_footprint_bytes": max((t.footprint_bytes or 0) for t in result.trials
                                            if t.outcome == "ok") if certified else None,
            "seconds": round(seconds, 1), "prompt_seconds": round(sum(t.seconds for t in result.trials), 1),
        })
    return rows


def markdown(kv: list[dict[str, Any]], cert: list[dict[str, Any]]) -> str:
    lines = ["| model | n_ctx | settings | predicted KV (MiB) | llama.cpp KV (MiB) | equal | naive / real | "
             "compute est / real |", "|---|---|---|---|---|---|---|---|"]
    for r in kv:
        s = r["settings"]
        tag = f"{s['type_k']}/{s['type_v']}" + (" fa" if s["flash_attn"] else "") \
            + ("" if s["swa_full"] else " swa-win") + (f" seq{s['n_seq']}" if s["n_seq"] > 1 else "") \
            + (f" ub{s['n_ubatch']}" if s["n_ubatch"] != 512 else "")
        ratio = f"{r['compute_ratio']:.3f}" if r["compute_ratio"] else "-"
        lines.append(f"| {r['model']} | {r['n_ctx']} | {tag} | {' + '.join(r['predicted_kv_mib'])} | "
                     f"{' + '.join(r['reported_kv_mib'])} | {'yes' if r['equal'] else 'NO'} | "
                     f"{r['naive_ratio']:.2f} | {ratio} |")
    lines += ["", "| model | budget | predicted max_context | certified max | ratio | naive | trials | seconds |",
              "|---|---|---|---|---|---|---|---|"]
    for r in cert:
        ratio = f"{r['ratio']:.3f}" if r["ratio"] else "-"
        lines.append(f"| {r['model']} | {r['budget']} | {r['predicted_max_context']} | {r['certified_max_context']} "
                     f"| {ratio} | {r['naive_max_context']} | {r['trials']} | {r['seconds']} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, type=Path, help="directory for the JSON and the table")
    parser.add_argument("--quick", action="store_true", help="one small budget per model (CI-sized)")
    parser.add_argument("--smoke", action="store_true",
                        help="the smallest run (the suite's smoke test): one KV case per model, one certification at "
                             "the smallest context (256)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from gguf_factory import write_deci_per_layer, write_llama_gqa

    models = {"default": default_model_path(), "judge": judge_model_path()}
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="kvjudge-bench-") as scratch:
        llama = write_llama_gqa(Path(scratch) / "tiny-llama-gqa.gguf")
        deci = write_deci_per_layer(Path(scratch) / "tiny-deci.gguf")
        cases = 1 if args.smoke else None
        kv = (kv_rows("default (gemma3 270M)", models["default"], KV_CASES_GEMMA[:cases])
              + kv_rows("judge (qwen2.5 0.5B)", models["judge"], KV_CASES_JUDGE[:cases])
              + kv_rows("tiny llama GQA", llama, KV_CASES_TINY[:cases])
              + kv_rows("tiny deci per-layer", deci, KV_CASES_TINY[:cases or 3]))
    budgets = SMOKE_BUDGETS if args.smoke else QUICK_BUDGETS if args.quick else BUDGETS
    cert = certification_rows(models, budgets)
    compute_ratios = [r["compute_ratio"] for r in kv if r["compute_ratio"]]
    right = [r for r in cert if r["certified_max_context"] == r["predicted_max_context"]]
    summary = {
        "benchmark": "probe_accuracy",
        "kv_cases": len(kv), "kv_equal": sum(r["equal"] for r in kv),
        "kv_naive_ratio_range": [round(min(r["naive_ratio"] for r in kv), 3),
                                 round(max(r["naive_ratio"] for r in kv), 3)],
        "compute_ratio_range": [round(min(compute_ratios), 4), round(max(compute_ratios), 4)],
        "certifications": [{k: r[k] for k in ("model", "budget", "predicted_max_context", "certified_max_context",
                                              "ratio", "naive_ratio", "trials", "seconds")} for r in cert],
        "max_context_within_3pct": sum(r["within_3pct"] for r in cert), "certification_cases": len(cert),
        "max_trials_when_prediction_right": max((r["trials"] for r in right), default=None),
        "seconds": round(time.monotonic() - started, 1),
    }
    (args.out / "probe_accuracy.json").write_text(json.dumps({"summary": summary, "kv": kv, "certification": cert},
                                                            indent=1))
    (args.out / "probe_accuracy.md").write_text(markdown(kv, cert))
    print(json.dumps(summary))
    return 0 if summary["kv_equal"] == summary["kv_cases"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
