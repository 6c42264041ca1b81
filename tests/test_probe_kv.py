"""KV math against what llama.cpp itself reports, and the checks that come before any loading."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings as hsettings
from hypothesis import strategies as st

from gguf_factory import write_deci_per_layer, write_llama_gqa
from kvjudge.errors import UsageError
from kvjudge.probe import RuntimeSettings, kv_breakdown, kv_cache_bytes, read_model_shape
from kvjudge.probe.certify import measure_allocations
from kvjudge.probe.kv_math import MIB, check_kv_types, compute_buffer_bytes

S = RuntimeSettings


def _mib(n_bytes: int) -> str:
    return f"{n_bytes / MIB:.2f}"  # llama.cpp prints "%.2f MiB"


def _assert_matches(shape, cases: list[tuple[RuntimeSettings, int]], measured: list[dict]) -> None:
    for (settings, n_ctx), report in zip(cases, measured, strict=True):
        assert report["created"], (settings, n_ctx, report.get("error"))
        kv = kv_breakdown(shape, n_ctx, type_k=settings.type_k, type_v=settings.type_v, n_seq=settings.n_seq,
                          swa_full=settings.swa_full, n_ubatch=settings.n_ubatch, flash_attn=settings.flash_attn)
        expected = [(kv.global_bytes, kv.k_bytes_global, kv.v_bytes_global, kv.layout.n_ctx_seq)]
        if shape.uses_swa:
            expected.append((kv.swa_bytes, kv.k_bytes_swa, kv.v_bytes_swa, kv.layout.swa_cells))
        got = [(c["mib"], c["k_mib"], c["v_mib"], c["cells"]) for c in report["kv_caches"]]
        want = [(_mib(t), _mib(k), _mib(v), cells) for t, k, v, cells in expected]
        assert got == want, (settings, n_ctx)
        assert all(c["seqs"] == settings.n_seq for c in report["kv_caches"])


DEFAULT_CASES = [
    (S(), 1024),                                                      # full-size SWA cache (the default)
    (S(swa_full=False), 8192),                                        # windowed SWA: 512 + 512 cells
    (S(swa_full=False), 1000),                                        # n_ctx padded to 1024
    (S(swa_full=False, n_ubatch=128), 2048),                          # window + smaller ubatch → 768 cells
    (S(type_k="q8_0", type_v="q8_0", flash_attn=True, swa_full=False), 4096),
    (S(type_k="q4_0"), 1536),                                         # quantized K alone needs no flash attention
    (S(type_k="bf16", type_v="bf16", n_seq=2, swa_full=False), 3000),  # two streams of pad256(1536)
    (S(type_k="f32", type_v="f32", n_seq=2), 768),                     # n_ctx_seq pad256(384) = 512
    (S(type_k="iq4_nl", type_v="q5_1", flash_attn=True), 2048),
    (S(type_k="q5_0", type_v="q4_1", flash_attn=True, n_seq=3, swa_full=False), 3072),
]


@pytest.mark.model
def test_kv_math_equals_llama_cpp_on_the_default_model(default_model: Path) -> None:
    shape = read_model_shape(default_model)
    measured = measure_allocations(default_model, DEFAULT_CASES)
    _assert_matches(shape, DEFAULT_CASES, measured)
    # The compute buffer is an estimate; for this model it is dominated by the logits and lands exactly.
    for (settings, n_ctx), report in zip(DEFAULT_CASES, measured):
        estimate = compute_buffer_bytes(shape, n_ctx, settings)
        assert abs(estimate - report["compute_bytes"]) <= 0.01 * report["compute_bytes"], (settings, n_ctx)


@pytest.mark.model
def test_kv_math_equals_llama_cpp_on_tiny_models_of_other_shapes(tmp_path: Path) -> None:
    llama = write_llama_gqa(tmp_path / "llama-gqa.gguf", n_layer=4, n_embd=64, n_head=4, n_head_kv=2, head_dim=32)
    deci = write_deci_per_layer(tmp_path / "deci.gguf", heads_kv=(1, 2, 4, 2))
    llama_cases = [(S(), 1024), (S(n_seq=2), 2000), (S(type_k="q8_0", type_v="q8_0", flash_attn=True), 512),
                   (S(type_k="q4_1", type_v="f32"), 1280)]
    # Per-layer KV heads: without flash attention llama.cpp pads every V row to the widest layer's.
    deci_cases = [(S(), 1024), (S(flash_attn=True), 1024), (S(type_k="bf16", n_seq=2), 1536)]
    _assert_matches(read_model_shape(llama), llama_cases, measure_allocations(llama, llama_cases))
    _assert_matches(read_model_shape(deci), deci_cases, measure_allocations(deci, deci_cases))


@pytest.mark.model
def test_what_the_probe_refuses_llama_cpp_refuses_too(tmp_path: Path) -> None:
    deci = write_deci_per_layer(tmp_path / "deci.gguf")  # head size 16
    llama = write_llama_gqa(tmp_path / "llama.gguf", head_dim=32)
    with pytest.raises(UsageError, match="block size 32, which does not divide the head size 16"):
        check_kv_types(read_model_shape(deci), "q8_0", "f16", True)
    with pytest.raises(UsageError, match="needs flash attention"):
        check_kv_types(read_model_shape(llama), "f16", "q8_0", False)
    assert [r["created"] for r in measure_allocations(deci, [(S(type_k="q8_0", flash_attn=True), 512)])] == [False]
    refused, accepted = measure_allocations(llama, [(S(type_v="q8_0"), 512), (S(type_v="q8_0", flash_attn=True), 512)])
    assert (refused["created"], accepted["created"]) == (False, True)


def test_quantized_v_without_flash_attention_is_an_error(default_model: Path) -> None:
    shape = read_model_shape(default_model)
    with pytest.raises(UsageError, match="--flash-attn"):
        kv_cache_bytes(shape, 4096, "f16", "q4_0")
    assert kv_cache_bytes(shape, 4096, "f16", "q4_0", flash_attn=True) > 0


@pytest.mark.parametrize("name", ["q3_k", "f64", "Q8_0", "int8", ""])
def test_unknown_kv_type(default_model: Path, name: str) -> None:
    with pytest.raises(UsageError, match="unknown KV cache type"):
        kv_cache_bytes(read_model_shape(default_model), 1024, name, "f16")
    with pytest.raises(UsageError, match="unknown KV cache type"):
        RuntimeSettings(type_k=name)


@pytest.mark.parametrize("n_ctx", [0, -256])
def test_non_positive_context(default_model: Path, n_ctx: int) -> None:
    with pytest.raises(UsageError, match="positive"):
        kv_cache_bytes(read_model_shape(default_model), n_ctx)


def test_default_model_kv_figures(default_model: Path) -> None:
    # Gemma 3 270M at n_ctx 8192, f16: 24 MiB global + 120 MiB full-size SWA, or 15 MiB windowed.
    shape = read_model_shape(default_model)
    full = kv_breakdown(shape, 8192)
    windowed = kv_breakdown(shape, 8192, swa_full=False)
    assert (full.global_bytes, full.swa_bytes) == (24 * MIB, 120 * MIB)
    assert (windowed.global_bytes, windowed.swa_bytes) == (24 * MIB, 15 * MIB)


@hsettings(max_examples=60, deadline=None)
@given(n_ctx=st.integers(1, 40000), n_seq=st.integers(1, 4), swa_full=st.booleans())
def test_kv_grows_with_context_and_windowed_never_exceeds_full(n_ctx: int, n_seq: int, swa_full: bool) -> None:
    from kvjudge.models import default_model_path

    shape = _shape_cache(str(default_model_path()))
    here = kv_breakdown(shape, n_ctx, n_seq=n_seq, swa_full=swa_full)
    more = kv_breakdown(shape, n_ctx + 256, n_seq=n_seq, swa_full=swa_full)
    assert more.total >= here.total
    assert here.layout.n_ctx >= n_ctx and here.layout.n_ctx_seq % 256 == 0
    assert kv_breakdown(shape, n_ctx, n_seq=n_seq, swa_full=False).total <= \
        kv_breakdown(shape, n_ctx, n_seq=n_seq, swa_full=True).total


_SHAPES: dict = {}


def _shape_cache(path: str):
    if path not in _SHAPES:
        _SHAPES[path] = read_model_shape(path)
    return _SHAPES[path]


@pytest.mark.parametrize("n_ctx", [1024, 2048])
def test_memory_needed_as_budget_makes_that_context_the_maximum(default_model: Path, n_ctx: int) -> None:
    from kvjudge.probe import memory_needed, probe

    budget = memory_needed(default_model, n_ctx)
    assert probe(default_model, memory_budget=budget, certify=False).max_context_tokens == n_ctx
    assert probe(default_model, memory_budget=budget - 1, certify=False).max_context_tokens < n_ctx
    with pytest.raises(UsageError, match="positive"):
        memory_needed(default_model, 0)
