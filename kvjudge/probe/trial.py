"""One certification trial, run in a child process: ``python -m kvjudge.probe.trial SPEC_JSON RESULT_PATH``.

The child loads the model at the candidate ``n_ctx``, reads what llama.cpp itself reports about its buffers
(through ``llama_log_set``), stops early when those allocations already exceed the usable memory, evaluates a
prompt of real text filling the context minus a small reserve, decodes a few tokens, and writes a JSON result.
A watchdog thread ends the trial as over budget the moment the process's RSS exceeds the usable memory.
An out-of-memory abort kills only the child; the parent reads the missing result as such.
"""

from __future__ import annotations

import json
import os
import re
import resource
import sys
import sysconfig
import threading
import time
from pathlib import Path
from typing import Any

from kvjudge._llama import (
    Decoder,
    capture_native_log,
    context_params,
    flash_attention_type,
    last_logits,
    n_vocab,
    open_context,
    open_model,
    tokenize,
)

MIB = 1024 * 1024
# Real text for the prompt: the standard library's own top-level modules, in sorted order (deterministic on
# one Python version; the count of tokens that ran is what is recorded, not the text).
FILL_MIN_BYTES = 512

_KV_RE = re.compile(r"llama_kv_cache: size =\s*([\d.]+) MiB \(\s*(\d+) cells,\s*(\d+) layers,\s*(\d+)/(\d+) seqs\),"
                    r"\s*K \((\w+)\):\s*([\d.]+) MiB,\s*V \((\w+)\):\s*([\d.]+) MiB")
_BUF_RE = re.compile(r"(\S+)\s+(model|KV|compute|output) buffer size =\s*([\d.]+) MiB")
# Buffers that live in accelerator memory (CUDA0, ROCm0, Vulkan0, Metal, SYCL0); CUDA_Host and CPU* are host RAM.
_DEVICE_BUFFER_RE = re.compile(r"^(CUDA|ROCm|Vulkan|SYCL|MUSA|CANN)\d+$|^Metal$")
_OOM_RE = re.compile(r"out of memory|failed to allocate|cannot allocate|bad_alloc|cudaMalloc failed", re.I)


def fill_text(min_chars: int) -> str:
    """At least ``min_chars`` characters of Python standard library source, in a fixed order."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    parts: list[str] = []
    total = 0
    for source in sorted(stdlib.glob("*.py")):
        try:
            text = source.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        parts.append(text)
        total += len(text)
        if total >= min_chars:
            break
    return "\n".join(parts)


def parse_log(text: str) -> dict[str, Any]:
    """The buffer sizes llama.cpp reported, in bytes (from its "… buffer size = X MiB" lines)."""
    # MiB figures stay the strings llama.cpp printed (two decimals) so they can be compared exactly.
    kv_caches = [{"mib": m.group(1), "cells": int(m.group(2)), "layers": int(m.group(3)), "seqs": int(m.group(5)),
                  "type_k": m.group(6), "k_mib": m.group(7), "type_v": m.group(8), "v_mib": m.group(9)}
                 for m in _KV_RE.finditer(text)]
    buffers: dict[str, dict[str, float]] = {}
    for match in _BUF_RE.finditer(text):
        name, kind, mib = match.group(1), match.group(2), float(match.group(3))
        buffers.setdefault(kind, {})
        buffers[kind][name] = buffers[kind].get(name, 0.0) + mib

    def total(kind: str) -> int | None:
        return int(round(sum(buffers[kind].values()) * MIB)) if kind in buffers else None

    device = sum(mib for names in buffers.values() for name, mib in names.items() if is_device_buffer(name))
    return {
        "device_bytes": int(round(device * MIB)),
        "kv_caches": kv_caches,
        "kv_bytes": int(round(sum(float(c["mib"]) for c in kv_caches) * MIB)) if kv_caches else None,
        "model_bytes": total("model"),
        "compute_bytes": total("compute"),
        "output_bytes": total("output"),
        "buffers_mib": buffers,
        "oom_in_log": bool(_OOM_RE.search(text)),
    }


def is_device_buffer(name: str) -> bool:
    """Does a buffer of this name (as llama.cpp logs it: ``CUDA0``, ``CUDA_Host``, ``CPU_Mapped``) live in
    accelerator memory?"""
    return bool(_DEVICE_BUFFER_RE.match(name))


def _rss() -> int:
    import psutil

    return int(psutil.Process().memory_info().rss)


def _peak_rss() -> int:
    """This process's own peak resident memory since it started.

    Not ``getrusage().ru_maxrss`` on Linux: the kernel carries the parent's peak across fork and exec into it,
    so a trial started from a large process (the judge, the demo, a test session) would read its parent's peak
    as its own and be ruled over budget. ``VmHWM`` is the high-water mark of this program's own memory map.
    """
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024  # kB
    except OSError:
        pass
    peak = int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
    return peak if sys.platform == "darwin" else peak * 1024  # bytes on macOS, KiB elsewhere


def run(spec: dict[str, Any], result_path: Path) -> int:
    started = time.monotonic()
    log: list[str] = []

    def write(outcome: str, **extra: Any) -> None:
        parsed = parse_log("".join(log))
        result = {"outcome": outcome, "n_ctx": spec["n_ctx"], "seconds": round(time.monotonic() - started, 3),
                  "peak_rss_bytes": _peak_rss(), **parsed, **extra}
        tmp = result_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(result))
        os.replace(tmp, result_path)

    if spec.get("rlimit_data_bytes"):
        # A hard cap on private memory (heap and anonymous maps; the mapped model file is not counted): an
        # allocation beyond it fails inside llama.cpp as it would on a host that is really out of memory.
        limit = int(spec["rlimit_data_bytes"])
        resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))

    capture_native_log(log)
    baseline_rss = _rss()
    usable = spec.get("usable_bytes")
    margin = int(spec["margin_bytes"])

    try:
        model = open_model(spec["model_path"], gpu_layers=int(spec["gpu_layers"]))
    except ValueError as exc:
        write("oom" if parse_log("".join(log))["oom_in_log"] else "crashed", detail=f"model load failed: {exc}")
        return 0
    n_ctx = int(spec["n_ctx"])
    ubatch = int(spec["n_ubatch"])
    try:
        ctx = open_context(model, _context_params(spec))
    except ValueError as exc:
        write("oom" if parse_log("".join(log))["oom_in_log"] else "crashed",
              detail=f"context creation failed: {exc}")
        return 0

    parsed = parse_log("".join(log))
    if spec.get("on_gpu"):
        # On a GPU the budget is the device's: what llama.cpp placed in accelerator buffers, plus the margin.
        allocated = parsed["device_bytes"]
    else:
        allocated = sum(parsed[k] or 0 for k in ("model_bytes", "kv_bytes", "compute_bytes", "output_bytes"))
    allocated_footprint = allocated + margin
    if usable is not None and allocated_footprint > usable:
        # What llama.cpp has committed to already exceeds the budget: no need to run the prompt.
        write("over_budget", prompt_tokens=0, allocated_footprint_bytes=allocated_footprint,
              baseline_rss_bytes=baseline_rss, detail="llama.cpp's buffers exceed the usable memory")
        return 0

    over = threading.Event()
    done = threading.Event()

    def watchdog() -> None:
        while not done.wait(0.05):
            if usable is not None and not spec.get("on_gpu") and _rss() > usable:
                over.set()
                write("over_budget", prompt_tokens=int(spec.get("_ran", 0)),
                      allocated_footprint_bytes=allocated_footprint, baseline_rss_bytes=baseline_rss,
                      detail="resident memory exceeded the usable memory during the prompt")
                os._exit(0)

    threading.Thread(target=watchdog, daemon=True).start()

    n_ctx_seq = n_ctx // int(spec["n_seq"])
    n_decode = int(spec["n_decode"])
    target = max(1, n_ctx_seq - int(spec["reserve"]))
    from kvjudge.tokens import split_for_tokenizer

    text = fill_text(max(FILL_MIN_BYTES, target * 6))
    tokens: list[int] = []
    for index, piece in enumerate(split_for_tokenizer(text)):
        tokens.extend(tokenize(model, piece, add_bos=index == 0))
        if len(tokens) >= target:
            break
    tokens = tokens[:target]
    decoder = Decoder(ctx, ubatch)
    ran = 0
    try:
        for start in range(0, len(tokens), ubatch):
            chunk = tokens[start:start + ubatch]
            decoder.decode(chunk, n_past=start)
            ran = start + len(chunk)
            spec["_ran"] = ran
        vocabulary = n_vocab(model)
        decoded: list[int] = []
        for step in range(n_decode):
            token = int(last_logits(ctx, vocabulary).argmax())
            decoded.append(token)
            decoder.decode([token], n_past=ran + step)
    except RuntimeError as exc:
        done.set()
        outcome = "oom" if parse_log("".join(log))["oom_in_log"] else "crashed"
        write(outcome, prompt_tokens=ran, allocated_footprint_bytes=allocated_footprint, detail=str(exc))
        return 0
    done.set()
    if over.is_set():
        return 0
    peak = _peak_rss()
    # Host: resident memory counts too; GPU: the device buffers are the footprint (RSS is host memory).
    measured = allocated_footprint if spec.get("on_gpu") else max(peak, allocated_footprint)
    outcome = "ok" if usable is None or measured <= usable else "over_budget"
    write(outcome, prompt_tokens=ran, decoded_tokens=len(decoded), allocated_footprint_bytes=allocated_footprint,
          baseline_rss_bytes=baseline_rss, footprint_bytes=measured)
    return 0


def _context_params(spec: dict[str, Any]) -> Any:
    params = context_params()
    ubatch = int(spec["n_ubatch"])
    params.n_ctx = int(spec["n_ctx"])
    params.n_batch = ubatch
    params.n_ubatch = ubatch
    params.n_seq_max = int(spec["n_seq"])
    params.type_k = int(spec["type_k_id"])
    params.type_v = int(spec["type_v_id"])
    params.swa_full = bool(spec["swa_full"])
    # Explicit: the library default is "auto", which would turn flash attention on behind our back.
    params.flash_attn_type = flash_attention_type(bool(spec["flash_attn"]))
    threads = int(spec.get("n_threads") or max(1, os.cpu_count() or 1))
    params.n_threads = threads
    params.n_threads_batch = threads
    params.no_perf = True
    return params


def allocations(model_path: str, specs: list[dict[str, Any]], result_path: Path) -> int:
    """Create (and free) one context per spec on one loaded model; record what llama.cpp reports for each.

    No prompt runs: this measures allocations only (the KV-math check and the benchmark use it).
    """
    log: list[str] = []
    capture_native_log(log)
    # One model for every spec: it is placed as the first spec says (on a GPU host, offloaded).
    model = open_model(model_path, gpu_layers=int(specs[0].get("gpu_layers", 0)) if specs else 0)
    # The model's buffers are logged once, at load: each result carries them beside its context's own.
    loaded = {"model_buffers_mib": parse_log("".join(log))["buffers_mib"].get("model", {})}
    results = []
    for spec in specs:
        log.clear()
        try:
            ctx = open_context(model, _context_params(spec))
        except ValueError as exc:
            results.append({"spec": spec, "created": False, "error": str(exc), **parse_log("".join(log)), **loaded})
            continue
        results.append({"spec": spec, "created": True, **parse_log("".join(log)), **loaded})
        ctx.close()
    result_path.write_text(json.dumps(results))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) == 4 and args[0] == "--allocations":
        return allocations(args[1], json.loads(args[2]), Path(args[3]))
    if len(args) != 2:
        print("usage: python -m kvjudge.probe.trial SPEC_JSON RESULT_PATH\n"
              "       python -m kvjudge.probe.trial --allocations MODEL SPECS_JSON RESULT_PATH", file=sys.stderr)
        return 2
    return run(json.loads(args[0]), Path(args[1]))


if __name__ == "__main__":
    raise SystemExit(main())
