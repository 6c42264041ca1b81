"""Certification: run the model for real at candidate context sizes, each trial in a child process.

Search: the first trial runs at the analytic ``max_context_tokens``. When it runs, the next size up
(+256) is tried to show that the boundary is real; when it does not, the next candidate comes from the
measured footprint (interpolated between measured points), and the search bisects on the 256-token grid
between the largest size that ran and the smallest that did not. A right prediction costs two trials: one
full prompt at the prediction, and one at +256 that stops as soon as llama.cpp's allocations exceed the
usable memory (before any prompt runs).

Results: ``max_ok_input`` is the largest prompt (tokens) that really ran; ``safe_context`` is the largest
certified ``n_ctx`` (per sequence, with ``n_seq`` > 1) less a headroom of 10%, rounded down to a multiple of 64:
a conservative size for planning.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kvjudge._llama import require_local_inference
from kvjudge.probe.gguf_shape import ModelShape
from kvjudge.probe.kv_math import (
    CTX_PAD,
    GPU_RUNTIME_MARGIN,
    HOST_RUNTIME_MARGIN,
    ggml_type,
    kv_bytes_per_token,
    kv_layout,
)

SAFE_HEADROOM = 0.10
PROMPT_RESERVE = 16      # tokens left free at the end of the context: room for the decoded tokens
DECODE_TOKENS = 4
MAX_TRIALS = 8
OUTCOMES = ("ok", "oom", "over_budget", "crashed", "timed_out")


@dataclass(frozen=True)
class Trial:
    """One child-process run at one ``n_ctx``."""

    n_ctx: int
    prompt_tokens: int
    outcome: str                       # one of OUTCOMES
    kv_bytes_measured: int | None      # what llama.cpp reported for its KV cache
    compute_bytes_measured: int | None
    model_bytes_measured: int | None
    peak_rss_bytes: int | None
    footprint_bytes: int | None        # max(peak RSS, llama.cpp's buffers + runtime margin)
    seconds: float
    detail: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Certification:
    trials: tuple[Trial, ...]
    certified: bool
    certified_n_ctx: int | None
    max_ok_input: int | None
    safe_context: int | None
    notes: tuple[str, ...] = field(default_factory=tuple)


def default_timeout(n_ctx: int) -> float:
    """Generous: load time plus the prompt at 10 tokens/s (this host does ~66–200)."""
    return 120.0 + n_ctx / 10.0


def run_trial(model_path: str | os.PathLike[str], n_ctx: int, *, settings: Any, usable_bytes: int | None,
              margin_bytes: int, on_gpu: bool = False, timeout_s: float | None = None,
              reserve: int = PROMPT_RESERVE, n_decode: int = DECODE_TOKENS,
              hard_limit_bytes: int | None = None) -> Trial:
    """Run one trial in a child process (``python -m kvjudge.probe.trial``) and read its outcome.

    ``hard_limit_bytes`` caps the child's private memory (RLIMIT_DATA), so allocations beyond it really fail.
    """
    require_local_inference("certifying a local GGUF (`kvjudge probe --no-certify`: the analytic figure alone)")
    spec = trial_spec(settings, n_ctx) | {
        "model_path": str(model_path), "usable_bytes": usable_bytes, "margin_bytes": margin_bytes,
        "on_gpu": on_gpu, "reserve": reserve, "n_decode": n_decode, "rlimit_data_bytes": hard_limit_bytes,
    }
    timeout = timeout_s if timeout_s is not None else default_timeout(n_ctx)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="kvjudge-trial-") as scratch:
        result_path = Path(scratch) / "result.json"
        command = [sys.executable, "-m", "kvjudge.probe.trial", json.dumps(spec), str(result_path)]
        try:
            proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return Trial(n_ctx, 0, "timed_out", None, None, None, None, None,
                         round(time.monotonic() - started, 3), f"no result within {timeout:.0f} s")
        seconds = round(time.monotonic() - started, 3)
        result: dict[str, Any] | None = None
        if result_path.exists():
            try:
                result = json.loads(result_path.read_text())
            except ValueError:
                result = None
    if result is None:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1][:200]
        # SIGKILL without a word is the kernel's OOM killer; other deaths are crashes.
        outcome = "oom" if proc.returncode in (-9, 137) or "out of memory" in proc.stderr.lower() else "crashed"
        return Trial(n_ctx, 0, outcome, None, None, None, None, None, seconds,
                     f"child exited with {proc.returncode}: {tail}")
    footprint = result.get("footprint_bytes") or result.get("allocated_footprint_bytes")
    return Trial(n_ctx=n_ctx, prompt_tokens=int(result.get("prompt_tokens") or 0), outcome=result["outcome"],
                 kv_bytes_measured=result.get("kv_bytes"), compute_bytes_measured=result.get("compute_bytes"),
                 model_bytes_measured=result.get("model_bytes"), peak_rss_bytes=result.get("peak_rss_bytes"),
                 footprint_bytes=footprint, seconds=seconds, detail=str(result.get("detail", "")))


def trial_spec(settings: Any, n_ctx: int) -> dict[str, Any]:
    """The child's view of one context: size and runtime settings, with ggml type ids."""
    return {"n_ctx": n_ctx, "n_ubatch": settings.n_ubatch, "n_seq": settings.n_seq,
            "type_k_id": ggml_type(settings.type_k)[0], "type_v_id": ggml_type(settings.type_v)[0],
            "swa_full": settings.swa_full, "flash_attn": settings.flash_attn, "gpu_layers": settings.gpu_layers}


def measure_allocations(model_path: str | os.PathLike[str], contexts: list[tuple[Any, int]], *,
                        timeout_s: float = 600.0) -> list[dict[str, Any]]:
    """What llama.cpp reports (KV caches, compute and output buffers) for each ``(settings, n_ctx)``.

    One child process loads the model once and creates each context in turn without running a prompt.
    Each result holds ``created`` and, from the log, ``kv_caches`` (MiB strings as printed), ``kv_bytes``,
    ``compute_bytes``, ``model_bytes``, ``output_bytes``.
    """
    require_local_inference("measuring llama.cpp's allocations")
    from kvjudge.errors import ProbeError

    specs = [trial_spec(settings, n_ctx) for settings, n_ctx in contexts]
    with tempfile.TemporaryDirectory(prefix="kvjudge-alloc-") as scratch:
        result_path = Path(scratch) / "result.json"
        command = [sys.executable, "-m", "kvjudge.probe.trial", "--allocations", str(model_path),
                   json.dumps(specs), str(result_path)]
        try:
            proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired as exc:
            raise ProbeError(f"measuring allocations of {model_path} took over {timeout_s:.0f} s") from exc
        if not result_path.exists():
            tail = (proc.stderr.strip().splitlines() or ["no output"])[-1][:200]
            raise ProbeError(f"measuring allocations of {model_path} failed (exit {proc.returncode}: {tail})")
        return json.loads(result_path.read_text())


def _interpolate(trials: list[Trial], usable: int, kv_per_token: float) -> int | None:
    """The n_ctx at which the measured footprint reaches ``usable``, from the nearest measured points."""
    points = sorted({(t.n_ctx, t.footprint_bytes) for t in trials if t.footprint_bytes})
    if not points:
        return None
    if len(points) >= 2:
        (n0, f0), (n1, f1) = points[-2], points[-1]
        slope = (f1 - f0) / (n1 - n0) if n1 != n0 and f1 > f0 else kv_per_token
    else:
        slope = kv_per_token
    anchor_n, anchor_f = min(points, key=lambda p: abs(p[1] - usable))
    if slope <= 0:
        return None
    return int(anchor_n + (usable - anchor_f) / slope)


def safe_context_for(n_ctx: int) -> int:
    """``n_ctx`` less the 10% headroom, rounded down to a multiple of 64."""
    return max(64, int(n_ctx * (1 - SAFE_HEADROOM)) // 64 * 64)


def certify_size(model_path: str | os.PathLike[str], settings: Any, placement: Any, n_ctx: int, *,
                 progress: Callable[[str], None] | None = None, timeout_s: float | None = None) -> Trial:
    """One trial at exactly ``n_ctx`` (no search): does a context of that size, filled with a prompt, run here?

    What a caller that needs one window (the judge) certifies instead of the model's whole trained context.
    """
    if progress:
        progress(f"trial: n_ctx {n_ctx} (this size only)")
    margin = GPU_RUNTIME_MARGIN if placement.on_gpu else HOST_RUNTIME_MARGIN
    return run_trial(model_path, n_ctx, settings=settings, usable_bytes=placement.usable_bytes, margin_bytes=margin,
                     on_gpu=placement.on_gpu, timeout_s=timeout_s)


def certify(model_path: str | os.PathLike[str], shape: ModelShape, settings: Any, placement: Any, *,
            start_n_ctx: int, progress: Callable[[str], None] | None = None, timeout_s: float | None = None,
            max_trials: int = MAX_TRIALS) -> Certification:
    """Find the largest ``n_ctx`` that really runs within the usable memory, starting at ``start_n_ctx``."""

    usable = placement.usable_bytes
    margin = GPU_RUNTIME_MARGIN if placement.on_gpu else HOST_RUNTIME_MARGIN
    per_token = kv_bytes_per_token(shape, settings) or 1.0
    ceiling = shape.n_ctx_train // CTX_PAD * CTX_PAD
    trials: list[Trial] = []
    notes: list[str] = []
    best_ok: int | None = None          # largest n_ctx that ran
    lowest_fail: int | None = None      # smallest n_ctx that did not fit
    candidate = max(CTX_PAD, min(start_n_ctx, ceiling))
    while len(trials) < max_trials:
        if progress:
            progress(f"trial {len(trials) + 1}: n_ctx {candidate}")
        trial = run_trial(model_path, candidate, settings=settings, usable_bytes=usable, margin_bytes=margin,
                          on_gpu=placement.on_gpu, timeout_s=timeout_s)
        trials.append(trial)
        if trial.outcome in ("crashed", "timed_out"):
            notes.append(f"certification stopped: the trial at n_ctx {candidate} {trial.outcome.replace('_', ' ')}"
                         f" ({trial.detail})")
            break
        if trial.outcome == "ok":
            best_ok = max(best_ok or 0, candidate)
        else:
            lowest_fail = candidate if lowest_fail is None else min(lowest_fail, candidate)
        upper = (lowest_fail - CTX_PAD) if lowest_fail is not None else ceiling
        lower = (best_ok + CTX_PAD) if best_ok is not None else CTX_PAD
        if lower > upper:
            break  # the boundary is pinned to the 256-token grid
        if trial.outcome == "ok" and lowest_fail is None and candidate + CTX_PAD <= ceiling and len(trials) == 1:
            candidate += CTX_PAD  # a right prediction: show the next size up does not fit
            continue
        guess = _interpolate(trials, usable, per_token)
        guess = (guess // CTX_PAD * CTX_PAD) if guess is not None else (lower + upper) // 2 // CTX_PAD * CTX_PAD
        if best_ok is not None and lowest_fail is None and guess <= best_ok:
            guess = best_ok + CTX_PAD  # ran, so the limit lies higher than the interpolation says
        midpoint = (lower + upper) // 2 // CTX_PAD * CTX_PAD
        # Trust the interpolation, but never let it stall the bisection at either edge.
        candidate = min(max(guess, lower), upper)
        if len(trials) >= 3 and candidate in (lower, upper) and upper - lower > 2 * CTX_PAD:
            candidate = max(lower, midpoint)
    else:
        notes.append(f"certification used its {max_trials} trials without pinning the boundary")
    ok_trials = [t for t in trials if t.outcome == "ok"]
    if not ok_trials:
        if not any("stopped" in n for n in notes):
            notes.append("no trial ran within the usable memory; the model does not fit as configured")
        return Certification(tuple(trials), False, None, None, None, tuple(notes))
    largest = max(t.n_ctx for t in ok_trials)
    # With several sequences one conversation holds one stream's cells, so plan with that.
    per_sequence = kv_layout(shape, largest, n_seq=settings.n_seq, swa_full=settings.swa_full,
                             n_ubatch=settings.n_ubatch).n_ctx_seq
    return Certification(tuple(trials), True, largest, max(t.prompt_tokens for t in ok_trials),
                         safe_context_for(min(largest, per_sequence)), tuple(notes))
