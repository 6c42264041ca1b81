"""KV-cache and compute-buffer sizes, the way llama.cpp (as vendored by llama-cpp-python 0.3.36) allocates them.

What llama.cpp does, learned from its source (llama-context.cpp, llama-kv-cache.cpp, llama-kv-cache-iswa.cpp)
and checked against its log on this machine:

- the requested ``n_ctx`` is padded up to a multiple of 256; with ``n_seq`` sequences and a non-unified cache
  (llama-cpp-python's default) there are ``n_seq`` streams of ``n_ctx_seq = pad256(n_ctx / n_seq)`` cells;
- ``n_batch`` and ``n_ubatch`` are clamped to the requested ``n_ctx``;
- models with sliding-window layers get two caches: the global layers get every cell, the windowed layers
  ``pad256(min(n_ctx_seq, n_swa + n_ubatch))`` cells per stream, or every cell with ``swa_full``;
- one layer's K row holds ``head_dim_k * n_head_kv(layer)`` values of ``type_k``, stored in blocks:
  ``bytes = type_size * n / block_size`` (``ggml_row_size``); V likewise with ``type_v`` — except that without
  flash attention V is stored transposed and every layer's V row is as wide as the widest layer's;
- a quantized V cache needs flash attention, and a quantized type's block must divide the head size.

Type sizes come from ``gguf.GGML_QUANT_SIZES`` (block size, bytes per block).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvjudge.errors import UsageError
from kvjudge.probe.gguf_shape import ModelShape
from kvjudge.probe.settings import KV_TYPE_NAMES, RuntimeSettings

CTX_PAD = 256
MIB = 1024 * 1024

# Memory outside llama.cpp's own buffers that a process running the model needs: the interpreter, the
# libraries, the tokenizer and its token lists. A child with llama_cpp imported measures ~50 MiB RSS here;
# 128 MiB is the stated allowance. On a GPU the CUDA context and cuBLAS workspace take a few hundred MiB.
HOST_RUNTIME_MARGIN = 128 * MIB
GPU_RUNTIME_MARGIN = 512 * MIB


def ggml_type(name: str) -> tuple[int, int, int]:
    """``(ggml type id, block size, bytes per block)`` of a KV type name such as ``q8_0``."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    if name not in KV_TYPE_NAMES:
        raise UsageError(f"unknown KV cache type {name!r}; use one of {', '.join(KV_TYPE_NAMES)}")
    qtype = GGMLQuantizationType[name.upper()]
    block, type_size = GGML_QUANT_SIZES[qtype]
    return int(qtype), int(block), int(type_size)


def row_bytes(name: str, n_values: int) -> int:
    """Bytes of ``n_values`` values of type ``name`` (ggml_row_size)."""
    _, block, type_size = ggml_type(name)
    return type_size * n_values // block


def pad(value: int, multiple: int = CTX_PAD) -> int:
    return -(-value // multiple) * multiple


@dataclass(frozen=True)
class KvLayout:
    """How llama.cpp lays out the cache for one context."""

    n_ctx: int          # after padding
    n_ctx_seq: int      # cells per stream for global layers
    n_stream: int
    n_ubatch: int       # after clamping
    swa_cells: int      # cells per stream for windowed layers (== n_ctx_seq when there are none or swa_full)


@dataclass(frozen=True)
class KvBreakdown:
    """KV bytes per cache (global / windowed) and per layer, for one context size and settings."""

    layout: KvLayout
    k_bytes_global: int
    v_bytes_global: int
    k_bytes_swa: int
    v_bytes_swa: int
    layer_bytes: tuple[int, ...]

    @property
    def global_bytes(self) -> int:
        return self.k_bytes_global + self.v_bytes_global

    @property
    def swa_bytes(self) -> int:
        return self.k_bytes_swa + self.v_bytes_swa

    @property
    def total(self) -> int:
        return self.global_bytes + self.swa_bytes

    def as_dict(self) -> dict[str, int]:
        return {"n_ctx": self.layout.n_ctx, "cells_global": self.layout.n_ctx_seq, "cells_swa": self.layout.swa_cells,
                "n_stream": self.layout.n_stream, "global_bytes": self.global_bytes, "swa_bytes": self.swa_bytes,
                "total_bytes": self.total}


def check_kv_types(shape: ModelShape, type_k: str, type_v: str, flash_attn: bool) -> None:
    """Refuse what llama.cpp would refuse at context creation, before anything is loaded."""
    for label, name, head in (("K", type_k, shape.head_dim_k), ("V", type_v, shape.head_dim_v)):
        _, block, _ = ggml_type(name)
        if head % block:
            raise UsageError(f"{label} cache type {name} has block size {block}, which does not divide the head "
                             f"size {head} of {shape.arch}; choose f16, bf16 or f32 for --type-{label.lower()}")
    _, v_block, _ = ggml_type(type_v)
    if v_block > 1 and not flash_attn:
        raise UsageError(f"a quantized V cache ({type_v}) needs flash attention in llama.cpp; "
                         f"add --flash-attn or use --type-v f16")


def kv_layout(shape: ModelShape, n_ctx: int, *, n_seq: int = 1, swa_full: bool = True,
              n_ubatch: int = 512) -> KvLayout:
    if n_ctx <= 0:
        raise UsageError(f"n_ctx must be a positive number of tokens, got {n_ctx}")
    if n_seq < 1:
        raise UsageError(f"n_seq must be at least 1, got {n_seq}")
    n_ctx_seq = pad(pad(n_ctx) // n_seq)
    ubatch = min(n_ubatch, n_ctx)  # llama.cpp clamps n_batch (and so n_ubatch) to the requested n_ctx
    if shape.uses_swa and not swa_full:
        swa_cells = pad(min(n_ctx_seq, shape.n_swa + ubatch))
    else:
        swa_cells = n_ctx_seq
    return KvLayout(n_ctx=n_ctx_seq * n_seq, n_ctx_seq=n_ctx_seq, n_stream=n_seq, n_ubatch=ubatch,
                    swa_cells=swa_cells)


def kv_breakdown(shape: ModelShape, n_ctx: int, *, type_k: str = "f16", type_v: str = "f16", n_seq: int = 1,
                 swa_full: bool = True, n_ubatch: int = 512, flash_attn: bool = False) -> KvBreakdown:
    """KV bytes for ``n_ctx`` split into the global and windowed caches and per layer."""
    check_kv_types(shape, type_k, type_v, flash_attn)
    layout = kv_layout(shape, n_ctx, n_seq=n_seq, swa_full=swa_full, n_ubatch=n_ubatch)
    sums = {"kg": 0, "vg": 0, "ks": 0, "vs": 0}
    per_layer: list[int] = []
    # Transposed V (no flash attention) is padded to the widest layer when layers differ.
    v_widest = max(shape.n_embd_v_gqa(il) for il in range(shape.n_layer))
    for il in range(shape.n_layer):
        windowed = shape.uses_swa and shape.swa_layers[il]
        cells = (layout.swa_cells if windowed else layout.n_ctx_seq) * layout.n_stream
        k = row_bytes(type_k, shape.n_embd_k_gqa(il)) * cells
        v = row_bytes(type_v, shape.n_embd_v_gqa(il) if flash_attn else v_widest) * cells
        sums["ks" if windowed else "kg"] += k
        sums["vs" if windowed else "vg"] += v
        per_layer.append(k + v)
    return KvBreakdown(layout, sums["kg"], sums["vg"], sums["ks"], sums["vs"], tuple(per_layer))


def kv_cache_bytes(shape: ModelShape, n_ctx: int, type_k: str = "f16", type_v: str = "f16", *, n_seq: int = 1,
                   swa_full: bool = True, n_ubatch: int = 512, flash_attn: bool = False) -> int:
    """Bytes llama.cpp allocates for the KV cache of a context of ``n_ctx`` tokens (all layers, all streams)."""
    return kv_breakdown(shape, n_ctx, type_k=type_k, type_v=type_v, n_seq=n_seq, swa_full=swa_full,
                        n_ubatch=n_ubatch, flash_attn=flash_attn).total


def kv_bytes_per_token(shape: ModelShape, settings: RuntimeSettings) -> float:
    """Marginal KV bytes per extra token of context (windowed layers add nothing once their window is full)."""
    low = kv_breakdown(shape, 1 << 15, type_k=settings.type_k, type_v=settings.type_v, n_seq=settings.n_seq,
                       swa_full=settings.swa_full, n_ubatch=settings.n_ubatch, flash_attn=settings.flash_attn)
    high = kv_breakdown(shape, 1 << 16, type_k=settings.type_k, type_v=settings.type_v, n_seq=settings.n_seq,
                        swa_full=settings.swa_full, n_ubatch=settings.n_ubatch, flash_attn=settings.flash_attn)
    return (high.total - low.total) / float((1 << 16) - (1 << 15))


def compute_buffer_bytes(shape: ModelShape, n_ctx: int, settings: RuntimeSettings = RuntimeSettings()) -> int:
    """An **estimate** of llama.cpp's compute buffer (the scheduler's worst-case graph reservation).

    Derivation: the graph allocator reuses memory between nodes, so the buffer is the largest set of tensors
    alive at once. Two stages compete:

    - the output stage: logits for a full micro-batch, ``n_vocab * n_ubatch * 4`` bytes (f32), plus the
      hidden states going in and out, ``2 * n_embd * n_ubatch * 4``;
    - without flash attention, one layer's attention scores: ``n_head * n_kv * n_ubatch * 4`` (f32) plus
      the mask ``n_kv * n_ubatch * 4``, plus about ``5 * n_embd * n_ubatch * 4`` of activations around them
      (``n_kv`` = the largest per-stream cache of any layer). Flash attention never materialises the scores.

    Checked against llama.cpp's log on this machine: Gemma 3 270M 514.50 MiB at every n_ctx (estimate
    514.50), Qwen2.5 0.5B 300.25 MiB with flash attention and at short contexts (estimate 300.25), 489.26 MiB
    at 16384 without (estimate 488.75). The estimate is labelled as one wherever it is reported.
    """
    layout = kv_layout(shape, n_ctx, n_seq=settings.n_seq, swa_full=settings.swa_full, n_ubatch=settings.n_ubatch)
    ub = layout.n_ubatch
    output_stage = shape.n_vocab * ub * 4 + 2 * shape.n_embd * ub * 4
    if settings.flash_attn:
        return output_stage
    n_kv = layout.n_ctx_seq
    n_head = max(shape.n_head) if shape.n_head else 0
    attention_stage = n_head * n_kv * ub * 4 + n_kv * ub * 4 + 5 * shape.n_embd * ub * 4
    return max(output_stage, attention_stage)


def output_buffer_bytes(shape: ModelShape, settings: RuntimeSettings = RuntimeSettings()) -> int:
    """The host buffer for one row of logits per sequence (``n_vocab * 4 * n_seq``)."""
    return shape.n_vocab * 4 * settings.n_seq
