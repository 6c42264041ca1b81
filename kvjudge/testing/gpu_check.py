"""The probe on a real GPU: the driver `scripts/gpu-check` runs once llama-cpp-python is built there with CUDA.

``python -m kvjudge.testing.gpu_check --out DIR [--dry-run] [--models KEY,…] [--deadline-s S]``

For each model of a real geometry (written here with random weights: :mod:`kvjudge.testing.gguf_geometry`) and
each KV type (f16; q8_0 with flash attention, which a quantized V cache needs), with every layer offloaded:

1. a ballast leaves free only what a context of :data:`TARGET_CTX` tokens needs by the probe's own arithmetic,
   plus half of the next 256-token step, so the boundary is real (an allocation past it fails on the card) and a
   full prompt at it takes seconds;
2. the probe predicts ``max_context_tokens`` from NVML's free memory, and certifies it by real loads in child
   processes (kvjudge's certify path), while NVML's used memory is sampled per trial;
3. one child loads the model once more and creates a context at each certified size: llama.cpp's own log lines
   (KV, compute, output and model buffers, per device) against the probe's prediction.

Then one `kvjudge judge` of two sample pairs through the in-process backend (mechanics only: random weights judge
nothing). One JSON line on stdout (also ``DIR/gpu-check.json``) and ``DIR/gpu-check.png``.

``--dry-run`` does the same on this CPU with small variants of the geometries and a memory budget in place of the
ballast: how the suite tests everything but CUDA.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from kvjudge.errors import KvjudgeError
from kvjudge.testing.gguf_geometry import GEOMETRIES, Geometry, block_pool, write_geometry

TARGET_CTX = 16384        # where the ballast puts the boundary on a GPU
DRY_TARGET_CTX = 1536     # on the CPU, for the small geometries (trained context 4096)
# The small geometries keep a vocabulary large enough that the logits dominate the compute buffer, as in the real
# ones (with a few hundred tokens the feed-forward temporaries do, which the probe's estimate leaves out).
DRY_VOCAB = 16384
KV_CHOICES = (("f16", False), ("q8_0", True))
JUDGE_PAIRS = (("slug-1", "slug-2"), ("clamp-1", "clamp-2"))  # the two shortest sample pairs
SAMPLE_RUNS = Path(__file__).resolve().parent.parent / "data" / "sample_runs.jsonl"
RESULT_NAME, FIGURE_NAME = "gpu-check.json", "gpu-check.png"


def say(message: str) -> None:
    print(f"gpu-check: {message}", file=sys.stderr, flush=True)


def settings_for(kv_type: str, flash_attn: bool, on_gpu: bool) -> Any:
    from kvjudge.probe.settings import RuntimeSettings

    return RuntimeSettings(type_k=kv_type, type_v=kv_type, flash_attn=flash_attn, gpu_layers=-1 if on_gpu else 0)


def geometries_for(keys: list[str] | None, dry_run: bool) -> list[Geometry]:
    chosen = [GEOMETRIES[k] for k in keys] if keys else list(GEOMETRIES.values())
    return [g.scaled(n_vocab=DRY_VOCAB) for g in chosen] if dry_run else chosen


def write_model(geometry: Geometry, folder: Path, pool: Any) -> dict[str, Any]:
    started = time.monotonic()
    path = write_geometry(folder / f"{geometry.key}.gguf", geometry, pool=pool)
    seconds = round(time.monotonic() - started, 2)
    say(f"wrote {path.name}: {path.stat().st_size / 2**30:.2f} GiB in {seconds} s")
    return {"path": path, "file_bytes": path.stat().st_size, "write_seconds": seconds}


def _largest_ok(trials: list[dict[str, Any]]) -> int | None:
    ok = [int(t["n_ctx"]) for t in trials if t.get("outcome") == "ok"]
    return max(ok) if ok else None


def verdict_of(predicted: int, certified: int | None) -> str:
    """``exact``, ``over_promise`` (the prediction did not run: the bug the check exists to find) or
    ``under_promise`` (more ran than predicted)."""
    if certified is None or certified < predicted:
        return "over_promise"
    return "exact" if certified == predicted else "under_promise"


def boundary_bytes(shape: Any, settings: Any, placement: Any, n_ctx: int) -> int:
    """Usable memory under which ``n_ctx`` (a multiple of 256) is the probe's ``max_context_tokens``: halfway
    between what it and the next step need."""
    from kvjudge.probe.core import footprint
    from kvjudge.probe.kv_math import CTX_PAD

    need = footprint(shape, n_ctx, settings, placement).device_bytes
    return (need + footprint(shape, n_ctx + CTX_PAD, settings, placement).device_bytes) // 2


def certify_one(path: Path, settings: Any, *, target_ctx: int, on_gpu: bool, ballast: Any,
                cache_path: Path) -> dict[str, Any]:
    """Predict and certify one model under one KV type; with a GPU, NVML's used memory per trial."""
    from kvjudge.probe.core import footprint, max_context_tokens, place, probe
    from kvjudge.probe.devices import discover_devices
    from kvjudge.probe.gguf_shape import read_model_shape
    from kvjudge.testing.gpu_memory import UsedSampler, peak_delta

    shape = read_model_shape(path)
    placement = place(shape, discover_devices(), settings, None)
    whole_card = max_context_tokens(shape, settings, placement)  # what a user of the whole card is promised
    usable_target = boundary_bytes(shape, settings, placement, target_ctx)
    budget, held, sampler = None, 0, None
    if on_gpu:
        held = ballast.hold(placement.usable_bytes - usable_target)
        sampler = UsedSampler().start()
    else:
        budget = usable_target
    def progress(message: str) -> None:
        say(message)
        if sampler is not None:
            sampler.mark(message)  # each trial's NVML peak is its own segment's

    try:
        report = probe(path, settings=settings, memory_budget=budget, cache_path=cache_path, refresh=True,
                       progress=progress)
    finally:
        segments = sampler.stop() if sampler else []
        if on_gpu:
            ballast.release()
    trials = [dict(t) for t in report.entry.trials]
    for trial in trials:
        trial["nvml_peak_delta_bytes"] = peak_delta(segments, sampler.baseline_bytes if sampler else None,
                                                    int(trial["n_ctx"]))
    certified = _largest_ok(trials)
    predicted_at_certified = (footprint(shape, certified, settings, report.placement).device_bytes
                              if certified else None)
    nvml_at_certified = next((t["nvml_peak_delta_bytes"] for t in reversed(trials)
                              if certified and int(t["n_ctx"]) == certified and t.get("outcome") == "ok"), None)
    return {
        "kv_type": settings.type_k, "flash_attn": settings.flash_attn, "gpu_layers": settings.gpu_layers,
        "ballast_bytes": held, "memory_budget": budget, "usable_bytes": report.placement.usable_bytes,
        "placement": report.placement.device.kind, "free_bytes_whole": placement.usable_bytes,
        "predicted_max_context_whole": whole_card,
        "predicted_max_context": report.max_context_tokens, "certified_n_ctx": certified,
        "verdict": verdict_of(report.max_context_tokens, certified),
        "max_ok_input": report.entry.max_ok_input, "safe_context": report.entry.safe_context,
        "certified": report.entry.certified, "trials": trials, "notes": list(report.notes),
        "predicted_device_bytes_at_certified": predicted_at_certified,
        "nvml_used_delta_at_certified": nvml_at_certified,
        "nvml_minus_predicted_bytes": (nvml_at_certified - predicted_at_certified
                                       if nvml_at_certified is not None and predicted_at_certified else None),
        # What the card still had free at the certified size: how much more a bolder probe could have promised.
        "nvml_headroom_bytes": (report.placement.usable_bytes - nvml_at_certified
                                if nvml_at_certified is not None else None),
    }


def log_against_prediction(path: Path, runs: list[tuple[Any, int]]) -> list[dict[str, Any]]:
    """llama.cpp's logged buffers at each ``(settings, n_ctx)`` (one child, one load) beside the probe's figures."""
    from kvjudge.probe.certify import measure_allocations
    from kvjudge.probe.gguf_shape import read_model_shape
    from kvjudge.probe.kv_math import compute_buffer_bytes, kv_breakdown, output_buffer_bytes
    from kvjudge.probe.trial import is_device_buffer

    shape = read_model_shape(path)
    measured = measure_allocations(path, runs)
    rows = []
    for (settings, n_ctx), result in zip(runs, measured):
        buffers = {**result.get("buffers_mib", {}), "model": result.get("model_buffers_mib", {})}

        def split(kind: str, buffers: dict[str, Any] = buffers) -> tuple[int, int]:
            names = buffers.get(kind, {})
            device = sum(mib for name, mib in names.items() if is_device_buffer(name))
            host = sum(mib for name, mib in names.items() if not is_device_buffer(name))
            return int(round(device * 2**20)), int(round(host * 2**20))

        kv = kv_breakdown(shape, n_ctx, type_k=settings.type_k, type_v=settings.type_v, n_seq=settings.n_seq,
                          swa_full=settings.swa_full, n_ubatch=settings.n_ubatch, flash_attn=settings.flash_attn)
        (kv_dev, kv_host), (compute_dev, compute_host) = split("KV"), split("compute")
        (model_dev, model_host), (output_dev, output_host) = split("model"), split("output")
        rows.append({
            "kv_type": settings.type_k, "flash_attn": settings.flash_attn, "n_ctx": n_ctx,
            "created": result.get("created"), "error": result.get("error"),
            "kv_log_bytes": result.get("kv_bytes"), "kv_device_bytes": kv_dev, "kv_host_bytes": kv_host,
            "kv_predicted_bytes": kv.total, "kv_caches": result.get("kv_caches"),
            "compute_device_bytes": compute_dev, "compute_host_bytes": compute_host,
            "compute_predicted_bytes": compute_buffer_bytes(shape, n_ctx, settings), "compute_is_estimate": True,
            "output_device_bytes": output_dev, "output_host_bytes": output_host,
            "output_predicted_bytes": output_buffer_bytes(shape, settings),
            "model_device_bytes": model_dev, "model_host_bytes": model_host, "weight_bytes": shape.weight_bytes,
            "buffers_mib": buffers,
        })
    return rows


def judge_pairs(model: Path, work: Path, on_gpu: bool, n_pairs: int = len(JUDGE_PAIRS)) -> dict[str, Any]:
    """One `kvjudge judge` of the first ``n_pairs`` of :data:`JUDGE_PAIRS` from the sample runs, in-process;
    NVML's used memory around it."""
    from kvjudge.testing.gpu_memory import UsedSampler

    store = work / "judge-store.sqlite"
    pairs = work / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"a": a, "b": b}) + "\n" for a, b in JUDGE_PAIRS[:n_pairs]))
    env = os.environ | {"KVJUDGE_CACHE_DIR": str(work / "cache"), "KVJUDGE_DATA_DIR": str(work / "data")}
    kvjudge = [sys.executable, "-m", "kvjudge"]
    ingest = subprocess.run([*kvjudge, "ingest", str(SAMPLE_RUNS), "--store", str(store), "--json"],
                            capture_output=True, text=True, env=env)
    if ingest.returncode:
        return {"ran": False, "detail": f"ingest failed: {ingest.stderr.strip()[-300:]}"}
    sampler = UsedSampler().start() if on_gpu else None
    started = time.monotonic()
    judged = subprocess.run([*kvjudge, "judge", "--pairs", str(pairs), "--model", str(model), "--store", str(store),
                             "--no-cache", "--json"], capture_output=True, text=True, env=env)
    seconds = round(time.monotonic() - started, 2)
    segments = sampler.stop() if sampler else []
    peak = max((s["peak_used_bytes"] for s in segments), default=None)
    delta = (peak - sampler.baseline_bytes if sampler and peak is not None and sampler.baseline_bytes is not None
             else None)
    result: dict[str, Any] = {
        "ran": judged.returncode == 0, "exit_code": judged.returncode, "seconds": seconds, "model": model.name,
        # The in-process backend loads with llama-cpp-python's default of no GPU layers: this says whether it did.
        "nvml_peak_delta_bytes": delta, "used_gpu": None if delta is None else delta > 64 * 2**20,
    }
    if judged.returncode:
        result["detail"] = judged.stderr.strip()[-300:]
        return result
    # --json: one object per pair, then {"summary": …}.
    objects = [json.loads(line) for line in judged.stdout.splitlines() if line.strip()]
    verdicts = [o for o in objects if "summary" not in o]
    summary = next((o["summary"] for o in objects if "summary" in o), {})
    result.update(verdicts=len(verdicts), outcomes=sorted(str(v.get("outcome")) for v in verdicts),
                  window=summary.get("window"), cost=summary.get("cost"))
    return result


def run_check(out: Path, *, dry_run: bool, keys: list[str] | None, deadline_s: float, work: Path,
              judge_pair_count: int = len(JUDGE_PAIRS)) -> dict[str, Any]:
    from kvjudge.probe.core import llama_cpp_version
    from kvjudge.testing.gpu_memory import Ballast, nvml_memory

    started = time.monotonic()
    device = None if dry_run else nvml_memory()
    on_gpu = device is not None
    if not dry_run and not on_gpu:
        raise SystemExit("gpu-check: NVML sees no GPU here; run with --dry-run on a machine without one")
    ballast = Ballast()
    if on_gpu:
        ballast.hold(2 << 20)  # PyTorch's CUDA context exists before any free figure is read
        ballast.release()
    result: dict[str, Any] = {
        "check": "probe-on-gpu", "mode": "dry-run" if dry_run else "gpu",
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"), "device": device,
        "nvml_with_driver_context": nvml_memory() if on_gpu else None, "llama_cpp_python": llama_cpp_version(),
        "build_seconds": float(os.environ["GPU_CHECK_BUILD_SECONDS"]) if "GPU_CHECK_BUILD_SECONDS" in os.environ
        else None, "target_ctx": DRY_TARGET_CTX if dry_run else TARGET_CTX, "models": [], "skipped": [],
    }
    out.mkdir(parents=True, exist_ok=True)
    try:
        measure_all(result, out, dry_run=dry_run, keys=keys, deadline_s=deadline_s, work=work, ballast=ballast,
                    started=started, judge_pair_count=judge_pair_count)
    except KeyboardInterrupt:  # SIGTERM from the script's time limit: keep what was measured
        result["skipped"].append("interrupted: the script's time limit ended the check")
    finally:
        result["seconds"] = round(time.monotonic() - started, 1)
        save(result, out)
        draw(result, out / FIGURE_NAME)
    return result


def save(result: dict[str, Any], out: Path) -> None:
    (out / RESULT_NAME).write_text(json.dumps(result, indent=1) + "\n")


def measure_all(result: dict[str, Any], out: Path, *, dry_run: bool, keys: list[str] | None, deadline_s: float,
                work: Path, ballast: Any, started: float, judge_pair_count: int) -> None:
    """Every measurement in turn, the results saved after each; none is started past ``deadline_s``."""
    on_gpu = result["mode"] == "gpu"

    def in_time() -> bool:
        return time.monotonic() - started <= deadline_s

    pool = block_pool()
    for geometry in geometries_for(keys, dry_run):
        if not in_time():
            result["skipped"].append(f"{geometry.key}: out of time")
            continue
        model = write_model(geometry, work, pool)
        entry: dict[str, Any] = {"key": geometry.key, "like": geometry.like, "arch": geometry.arch,
                                 "file_bytes": model["file_bytes"], "write_seconds": model["write_seconds"],
                                 "kv": [], "log": [], "errors": []}
        result["models"].append(entry)
        for kv_type, flash in KV_CHOICES:
            if not in_time():
                result["skipped"].append(f"{geometry.key}/{kv_type}: out of time")
                continue
            say(f"{geometry.key} ({geometry.like}), KV {kv_type}: predicting and certifying")
            try:
                entry["kv"].append(certify_one(model["path"], settings_for(kv_type, flash, on_gpu),
                                               target_ctx=result["target_ctx"], on_gpu=on_gpu, ballast=ballast,
                                               cache_path=work / "capabilities.json"))
            except (KvjudgeError, RuntimeError) as exc:  # one failed measurement must not lose the others
                entry["errors"].append(f"{kv_type}: {type(exc).__name__}: {exc}")
            save(result, out)
        runs = [(settings_for(k["kv_type"], k["flash_attn"], on_gpu), k["certified_n_ctx"])
                for k in entry["kv"] if k["certified_n_ctx"]]
        if runs and in_time():
            say(f"{geometry.key}: llama.cpp's buffers at the certified contexts")
            try:
                entry["log"] = log_against_prediction(model["path"], runs)
            except KvjudgeError as exc:
                entry["errors"].append(f"log: {exc}")
            save(result, out)
        model["path"].unlink()  # the disk holds one large model at a time
    if not judge_pair_count:
        return
    if not in_time():
        result["skipped"].append("judge: out of time")
        return
    say("kvjudge judge: two sample pairs, in-process")
    judge_model = write_geometry(work / "judge.gguf", GEOMETRIES["llama32-1b"].scaled(n_vocab=1024,
                                                                                       n_ctx_train=32768))
    result["judge"] = judge_pairs(judge_model, work, on_gpu, judge_pair_count)


def draw(result: dict[str, Any], path: Path) -> None:
    """Predicted against certified context per model and KV type; predicted device bytes against NVML's."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [(f"{m['key']}\n{k['kv_type']}", k) for m in result["models"] for k in m["kv"]]
    figure, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    positions = range(len(rows))
    left.bar([p - 0.2 for p in positions], [k["predicted_max_context"] for _, k in rows], 0.4, label="predicted")
    left.bar([p + 0.2 for p in positions], [k["certified_n_ctx"] or 0 for _, k in rows], 0.4, label="certified")
    left.set_title("max context (tokens)")
    measured_label = "NVML used" if result["mode"] == "gpu" else "not measured (no GPU)"
    right.bar([p - 0.2 for p in positions], [(k["predicted_device_bytes_at_certified"] or 0) / 2**30
                                              for _, k in rows], 0.4, label="predicted")
    right.bar([p + 0.2 for p in positions], [(k["nvml_used_delta_at_certified"] or 0) / 2**30 for _, k in rows],
              0.4, label=measured_label)
    right.set_title("device memory at the certified context (GiB)")
    for axes in (left, right):
        axes.set_xticks(list(positions), [label for label, _ in rows], fontsize=8)
        axes.legend(fontsize=8)
    name = (result.get("device") or {}).get("name") or "CPU (dry run)"
    figure.suptitle(f"kvjudge probe on {name}, {result['date']}")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvjudge.testing.gpu_check", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for gpu-check.json and gpu-check.png")
    parser.add_argument("--dry-run", action="store_true", help="on this CPU, small geometries, a memory budget")
    parser.add_argument("--models", help=f"comma-separated keys among {', '.join(GEOMETRIES)} (default: all)")
    parser.add_argument("--deadline-s", type=float, default=300.0,
                        help="start no new measurement after this many seconds (default 300)")
    parser.add_argument("--judge-pairs", type=int, choices=range(0, len(JUDGE_PAIRS) + 1), default=len(JUDGE_PAIRS),
                        help=f"sample pairs the judge step judges (default {len(JUDGE_PAIRS)}; 0: no judge step)")
    parser.add_argument("--work", type=Path, help="where models are written (default: a temporary folder)")
    args = parser.parse_args(argv)
    keys = [k.strip() for k in args.models.split(",")] if args.models else None
    unknown = [k for k in keys or [] if k not in GEOMETRIES]
    if unknown:
        print(f"gpu-check: unknown model {unknown[0]!r}; use one of {', '.join(GEOMETRIES)}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, _interrupt)
    with tempfile.TemporaryDirectory(prefix="kvjudge-gpu-check-", dir=args.work) as work:
        result = run_check(args.out, dry_run=args.dry_run, keys=keys, deadline_s=args.deadline_s, work=Path(work),
                           judge_pair_count=args.judge_pairs)
    print(json.dumps(result, separators=(",", ":")))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
