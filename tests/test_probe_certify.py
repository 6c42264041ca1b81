"""Certification with the real model in child processes, under a small memory budget."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gguf_factory import write_llama_gqa
from helpers import memory_budget_for
from kvjudge.errors import ProbeError
from kvjudge.probe import RuntimeSettings, ensure_capability, kv_cache_bytes, lookup_capability, probe, read_model_shape
from kvjudge.probe.certify import certify, run_trial, safe_context_for
from kvjudge.probe.core import place
from kvjudge.probe.kv_math import HOST_RUNTIME_MARGIN
from kvjudge.probe.devices import discover_devices

MIB = 1024 * 1024


@pytest.mark.model
def test_certification_under_a_small_budget(default_model: Path, tmp_path: Path) -> None:
    cache = tmp_path / "caps.json"
    budget = memory_budget_for(default_model, 1024)
    report = probe(default_model, memory_budget=budget, cache_path=cache)
    data = report.as_dict()
    assert data["max_context_tokens"] == 1024
    assert data["certified"] is True and data["method"] == "measured" and data["cached"] is False
    trials = data["trials"]
    assert 2 <= len(trials) <= 3
    ok = [t for t in trials if t["outcome"] == "ok"]
    # The prediction was right: it ran, and the next size up did not fit.
    assert [t["n_ctx"] for t in ok] == [1024]
    assert any(t["n_ctx"] == 1280 and t["outcome"] == "over_budget" for t in trials)
    # max_ok_input is a prompt that really ran: the context less the 16 tokens kept free for decoding.
    assert data["max_ok_input"] == ok[0]["prompt_tokens"] == 1008
    # safe_context: 1024 less the 10 % headroom is 921.6, rounded down to a multiple of 64.
    assert data["safe_context"] == 896
    assert ok[0]["kv_bytes_measured"] == kv_cache_bytes(read_model_shape(default_model), 1024)
    assert ok[0]["footprint_bytes"] <= budget
    for trial in trials:
        assert {"n_ctx", "prompt_tokens", "outcome", "kv_bytes_measured", "seconds"} <= trial.keys()
    # The cache holds it; a lookup finds it and ensure_capability does not run the model again.
    entry = lookup_capability(default_model, cache_path=cache, memory_budget=budget)
    assert entry is not None and entry.certified and entry.max_ok_input == 1008
    again = ensure_capability(default_model, cache_path=cache, memory_budget=budget)
    assert again.certified_at == entry.certified_at and again.trials == entry.trials
    cached = probe(default_model, memory_budget=budget, cache_path=cache)
    assert cached.cached and cached.entry.certified_at == entry.certified_at


@pytest.mark.model
def test_a_wrong_prediction_is_corrected_from_the_measured_footprint(default_model: Path) -> None:
    shape = read_model_shape(default_model)
    settings = RuntimeSettings()
    budget = memory_budget_for(default_model, 768)
    placement = place(shape, discover_devices(), settings, memory_budget=budget)
    result = certify(default_model, shape, settings, placement, start_n_ctx=1536)
    outcomes = [(t.n_ctx, t.outcome) for t in result.trials]
    assert outcomes[0] == (1536, "over_budget") and outcomes[0][1] != "ok"
    assert result.certified and result.certified_n_ctx == 768
    assert (768, "ok") in outcomes and (1024, "over_budget") in outcomes
    assert len(result.trials) <= 3
    # Over-budget trials stop before the prompt: only the trial that ran filled its context.
    assert [t.prompt_tokens for t in result.trials if t.outcome == "over_budget"] == [0] * (len(outcomes) - 1)


@pytest.mark.model
def test_an_allocation_beyond_a_hard_limit_is_out_of_memory(default_model: Path) -> None:
    trial = run_trial(default_model, 1024, settings=RuntimeSettings(), usable_bytes=None,
                      margin_bytes=HOST_RUNTIME_MARGIN, hard_limit_bytes=300 * MIB)
    assert trial.outcome == "oom" and trial.prompt_tokens == 0


@pytest.mark.model
def test_a_trial_started_from_a_large_process_measures_only_itself(default_model: Path) -> None:
    """Linux carries a parent's peak RSS across fork and exec (``ru_maxrss``): a trial started by a process that
    once held more than the budget (the judge, the demo, a long test session) must still measure only its own."""
    budget = memory_budget_for(default_model, 1024)
    script = f"""
import json, resource, sys
held = bytearray({budget} + 256 * 2**20)
for i in range(0, len(held), 4096):
    held[i] = 1
del held
from kvjudge.probe import RuntimeSettings
from kvjudge.probe.certify import run_trial
from kvjudge.probe.kv_math import HOST_RUNTIME_MARGIN
trial = run_trial(sys.argv[1], 1024, settings=RuntimeSettings(), usable_bytes={budget},
                  margin_bytes=HOST_RUNTIME_MARGIN)
print(json.dumps({{"parent_peak": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                  "outcome": trial.outcome, "trial_peak": trial.peak_rss_bytes}}))
"""
    proc = subprocess.run([sys.executable, "-c", script, str(default_model)], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["parent_peak"] > budget  # the parent really held more than the trial may use
    assert result["outcome"] == "ok" and 0 < result["trial_peak"] < budget


@pytest.mark.parametrize(("certified", "safe"), [
    (1024, 896),     # 921.6 → 896
    (768, 640),      # 691.2 → 640
    (2048, 1792),    # 1843.2 → 1792
    (32768, 29440),  # 29491.2 → 29440
    (100, 64),       # 90 → 64
    (64, 64),        # 57.6 → 0, and never below 64
])
def test_safe_context_is_the_certified_context_less_ten_percent_in_steps_of_64(certified: int, safe: int) -> None:
    assert safe_context_for(certified) == safe


def test_a_trial_that_takes_too_long_is_timed_out(default_model: Path) -> None:
    trial = run_trial(default_model, 1024, settings=RuntimeSettings(), usable_bytes=None,
                      margin_bytes=HOST_RUNTIME_MARGIN, timeout_s=0.3)
    assert trial.outcome == "timed_out" and "0 s" in trial.detail


def test_a_model_llama_cpp_cannot_load_ends_uncertified(tmp_path: Path) -> None:
    broken = write_llama_gqa(tmp_path / "broken.gguf", omit=("output_norm.weight",))
    read_model_shape(broken)  # the header is fine
    report = probe(broken, memory_budget="1GiB", cache_path=tmp_path / "caps.json")
    assert not report.certified and report.entry.method == "estimated"
    assert [t["outcome"] for t in report.entry.trials] == ["crashed"]
    assert any("certification stopped" in note for note in report.notes)
    assert report.entry.max_ok_input is None and report.entry.safe_context is None


def test_a_model_that_does_not_fit_is_a_probe_error(default_model: Path, tmp_path: Path) -> None:
    with pytest.raises(ProbeError, match="does not fit.*--memory-budget"):
        probe(default_model, memory_budget="600MiB", certify=False, cache_path=tmp_path / "caps.json")


def test_the_log_reader_splits_device_and_host_buffers() -> None:
    from kvjudge.probe.trial import parse_log

    log = "\n".join([
        "load_tensors: offloaded 19/19 layers to GPU",
        "load_tensors:        CUDA0 model buffer size =   235.16 MiB",
        "load_tensors:   CPU_Mapped model buffer size =   160.00 MiB",
        "llama_context:  CUDA_Host  output buffer size =     1.00 MiB",
        "llama_kv_cache:      CUDA0 KV buffer size =    24.00 MiB",
        "llama_kv_cache: size =   24.00 MiB (  8192 cells,   3 layers,  1/1 seqs), K (f16):   12.00 MiB, "
        "V (f16):   12.00 MiB",
        "sched_reserve:      CUDA0 compute buffer size =   514.50 MiB",
        "sched_reserve:  CUDA_Host compute buffer size =    17.01 MiB",
        "ggml_backend_cuda_buffer_type_alloc_buffer: allocating 120.00 MiB on device 0: cudaMalloc failed: "
        "out of memory",
    ])
    parsed = parse_log(log)
    assert parsed["device_bytes"] == round((235.16 + 24 + 514.5) * MIB)
    assert parsed["model_bytes"] == round((235.16 + 160) * MIB)
    assert parsed["compute_bytes"] == round((514.5 + 17.01) * MIB)
    assert parsed["kv_caches"] == [{"mib": "24.00", "cells": 8192, "layers": 3, "seqs": 1, "type_k": "f16",
                                    "k_mib": "12.00", "type_v": "f16", "v_mib": "12.00"}]
    assert parsed["oom_in_log"] is True
    assert parse_log("llama_kv_cache: size = 1.00 MiB")["oom_in_log"] is False
